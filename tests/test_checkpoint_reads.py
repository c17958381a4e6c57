"""Every read in a draft checkpoint folder is bounded (issue 35 A, 9): a FIFO where config.json, the weights
or an index's shard belong hung draft-config, draft-flat and test-drafter forever; a config.json linked to
/dev/zero was read until MemoryError. Each tool now refuses it in one paragraph naming the file, at once,
under a memory cap, as the host runs it (``python -m remote.<tool>``); a folder that is no draft is told
what a draft folder holds, before any "loading" line.
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from remote import jsonread
from tests.conftest import REPO
from tests.support.drafter_support import demo

LIMIT_AS = 4 << 30        # torch's import maps ~1.5 GB; reading /dev/zero whole would pass this in seconds


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_AS, LIMIT_AS))


def tool(name: str, ckpt: Path, tmp: Path) -> subprocess.CompletedProcess:
    """One host tool on ``ckpt``, memory-capped, bounded in time (a hang is a TimeoutExpired failure)."""
    d = demo()
    args = {"draft_config": ["--ckpt", str(ckpt), "--layer-ids", "-1,1,3", "--dry-run"],
            "draft_flat": ["--ckpt", str(ckpt), "--dest", str(tmp / "flat")],
            "drafter": ["eval", "--ckpt", str(ckpt), "--data", str(d.data), "--verifier", str(d.target),
                        "--out", str(tmp / "out")]}[name]
    return subprocess.run([sys.executable, "-m", f"remote.{name}", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=90, preexec_fn=_capped, env={**os.environ, "PYTHONPATH": str(REPO)})


def _fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def _zero(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.symlink_to("/dev/zero")


def _sharded(folder: Path) -> Path:
    """The demo draft with its weights as the one shard an index names; the shard's path."""
    shard = folder / "model-00001-of-00001.safetensors"
    (folder / "model.safetensors").rename(shard)
    header = json.loads(shard.read_bytes()[8:8 + int.from_bytes(shard.read_bytes()[:8], "little")])
    index = {"metadata": {}, "weight_map": {k: shard.name for k in header if k != "__metadata__"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return shard


CASES: dict[str, tuple[Callable[[Path], Path], Callable[[Path], None]]] = {
    "config.json FIFO": (lambda f: f / "config.json", _fifo),
    "config.json -> /dev/zero": (lambda f: f / "config.json", _zero),
    "model.safetensors FIFO": (lambda f: f / "model.safetensors", _fifo),
    "model.safetensors -> /dev/zero": (lambda f: f / "model.safetensors", _zero),
    "index shard FIFO": (_sharded, _fifo),
}


@pytest.mark.parametrize("name", ["draft_flat", "drafter", "draft_config"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_special_file_in_the_checkpoint_is_refused_at_once_naming_it(tmp_path: Path, name: str, case: str) -> None:
    folder = shutil.copytree(demo().draft, tmp_path / "draft")
    where, make = CASES[case]
    path = where(folder)
    make(path)
    done = tool(name, folder, tmp_path)
    text = done.stdout + done.stderr
    assert "Traceback" not in text and "MemoryError" not in text, text[-3000:]
    if name == "draft_config" and "config.json" not in case:
        # draft-config reads only fc.weight's shape, to check the ids' count: an unreadable file is passed
        # over with a warning (what matters here: it answers, unhung, unbloated)
        assert done.returncode in (0, 3), text[-3000:]
        return
    assert done.returncode == 3, text[-3000:]
    assert str(path) in text, text[-3000:]
    assert "not a regular file" in text or ("/dev/zero" in case and "outside the checkpoint folder" in text), text


def test_a_config_json_larger_than_any_config_is_not_read_whole(tmp_path: Path) -> None:
    folder = shutil.copytree(demo().draft, tmp_path / "draft")
    with (folder / "config.json").open("r+b") as f:       # sparse: 65 MiB that cost no disk
        f.truncate(jsonread.MAX_JSON + 1024 * 1024)
    for name in ("draft_flat", "drafter"):
        done = tool(name, folder, tmp_path)
        assert done.returncode == 3 and "larger than 64 MiB" in done.stdout + done.stderr, done.stderr[-2000:]


def test_the_bounded_reader_refuses_without_blocking_and_reads_regular_files(tmp_path: Path) -> None:
    fifo, good = tmp_path / "fifo", tmp_path / "good.json"
    os.mkfifo(fifo)
    good.write_text('{"a": 1}')
    with pytest.raises(jsonread.NotRegular, match="FIFO"):
        jsonread.load(fifo)                                # no writer: an open without O_NONBLOCK never returns
    with pytest.raises(jsonread.NotRegular, match="folder"):
        jsonread.load(tmp_path)
    assert jsonread.load(good) == {"a": 1}
    with pytest.raises(jsonread.TooLarge):
        jsonread.read_bounded(good, limit=4)


def test_a_folder_that_is_no_draft_says_what_a_draft_folder_holds_before_loading(tmp_path: Path) -> None:
    """Was: "pass --config FILE (e.g. the config_speculators.json backup)", then a stray "drafter: loading" line."""
    folder = tmp_path / "not a draft"
    folder.mkdir()
    (folder / "tokenizer.json").write_text("{}")
    done = tool("drafter", folder, tmp_path)
    assert done.returncode == 3, done.stderr[-2000:]
    assert "drafter: loading" not in done.stdout
    assert "This is not a draft checkpoint folder: it has no config.json" in done.stderr
    assert "config.json (an EAGLE-3 draft config" in done.stderr and "found tokenizer.json" in done.stderr
    assert "config_speculators.json" not in done.stderr
