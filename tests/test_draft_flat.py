"""`invoke draft-flat`: a flat-format copy of a speculators draft, the one SGLang reads as trained.

The copy holds every tensor's bytes unchanged under SGLang's names, its ids in eagle_config; the
evaluator, asked what SGLang serves, finds the copy right where it finds the speculators checkpoint
with the same ids `ids-missing-engine-default`, and scores the copy on SGLang exactly as the
original on vLLM. Bad input and faults are one paragraph each, with nothing written and the source
untouched: a full disk (a real small tmpfs), a cut-off file, an existing destination, a forward
SGLang cannot run.
"""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file, save_file

from remote.draft_flat.tensors import renamed
from remote.eagle import formats
from tests.conftest import REPO, copy_remote_package, small_tmpfs
from tests.support.draft_flats import flat_copy
from tests.support.drafter_support import demo, run_eval
from tests.support.tasks import invoke

FIX_IDS = [-1, 1, 3]        # the demo's trained layers, SGLang ids (its draft_fixed holds them)


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def refusal(done: subprocess.CompletedProcess) -> str:
    """The one paragraph a refusal prints (exit 3, no traceback)."""
    assert done.returncode == 3, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("draft-flat refused: "), done.stderr
    return lines[0]


def test_the_copy_is_the_same_bytes_under_sglangs_names_and_sglang_serves_it_as_trained(tmp_path: Path) -> None:
    d = demo()
    source = d.root / "draft_fixed"
    before = digest(source)
    done = flat_copy(source, tmp_path / "flat", result=tmp_path / "result")
    assert done.returncode == 0, done.stdout + done.stderr
    assert digest(source) == before                                            # the source is never written
    result = json.loads((tmp_path / "result" / "draft_flat.json").read_text())
    assert result["ok"] and result["ids_from"] == "config" and result["layer_ids"] == FIX_IDS
    original, copied = load_file(source / "model.safetensors"), load_file(tmp_path / "flat" / "model.safetensors")
    assert set(copied) == {renamed(n) for n in original} and any(n.startswith("midlayer.") for n in copied)
    assert not any(n.startswith("layers.0.") for n in copied)
    for name, tensor in original.items():
        assert copied[renamed(name)].dtype == tensor.dtype and copied[renamed(name)].equal(tensor), name
    config = json.loads((tmp_path / "flat" / "config.json").read_text())
    layer = json.loads((source / "config.json").read_text())[formats.LAYER_CONFIG]
    assert formats.detect(config) == formats.FLAT and config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config[formats.EAGLE_CONFIG][formats.IDS_KEY] == FIX_IDS
    assert {k: config[k] for k in ("hidden_size", "num_attention_heads", "head_dim", "vocab_size")} == \
        {k: layer[k] for k in ("hidden_size", "num_attention_heads", "head_dim", "vocab_size")}
    # what SGLang serves: the copy as trained; the speculators original with the same ids, SGLang's defaults
    on_sglang = run_eval(tmp_path / "copy", ckpt=tmp_path / "flat", engine="sglang", engine_version="0.5.13",
                         full=True)
    spec_on_sglang = run_eval(tmp_path / "spec", ckpt=source, engine="sglang", engine_version="0.5.13", full=True)
    spec_on_vllm = run_eval(tmp_path / "vllm", ckpt=source, engine="vllm", full=True)
    assert on_sglang["verdict"]["status"] == "MATCH" and on_sglang["findings"] == []
    assert "ids-missing-engine-default" in [f["id"] for f in spec_on_sglang["findings"]]
    assert on_sglang["metrics"]["served"]["data"] == spec_on_vllm["metrics"]["served"]["data"]


def test_a_sharded_checkpoint_keeps_its_shards_and_its_index_names_the_new_names(tmp_path: Path) -> None:
    source = tmp_path / "sharded"
    source.mkdir()
    shutil.copy(demo().root / "draft_fixed" / "config.json", source)
    tensors = load_file(demo().root / "draft_fixed" / "model.safetensors")
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in shards.items():
        save_file({n: tensors[n] for n in part}, str(source / file))
    index = {"metadata": {"total_size": 1}, "weight_map": {n: f for f, part in shards.items() for n in part}}
    (source / "model.safetensors.index.json").write_text(json.dumps(index))
    (source / "tokenizer_config.json").write_text('{"x": 1}')                 # carried over byte for byte
    done = flat_copy(source, tmp_path / "flat")
    assert done.returncode == 0, done.stdout + done.stderr
    out = tmp_path / "flat"
    copied_index = json.loads((out / "model.safetensors.index.json").read_text())
    assert copied_index["metadata"] == index["metadata"]
    assert copied_index["weight_map"] == {renamed(n): f for n, f in index["weight_map"].items()}
    for file in shards:
        part = load_file(out / file)
        assert all(part[renamed(n)].equal(tensors[n]) for n in shards[file])
    assert (out / "tokenizer_config.json").read_text() == '{"x": 1}'


def _edit_config(folder: Path, change: dict[str, Any]) -> None:
    config = json.loads((folder / "config.json").read_text())
    for key, value in change.items():
        if key.startswith(formats.LAYER_CONFIG + "."):
            config[formats.LAYER_CONFIG][key.split(".", 1)[1]] = value
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))


def _cut(folder: Path) -> None:
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])


def _tamper(change: Any) -> Any:
    """A preparation that rewrites model.safetensors' header with ``change(entries)``, the data unchanged."""
    def prepare(folder: Path) -> None:
        path = folder / "model.safetensors"
        raw = path.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8:8 + n])
        entries = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
        change([header[k] for k in entries])
        body = json.dumps(header).encode()
        path.write_bytes(struct.pack("<Q", len(body)) + body + raw[8 + n:])
    return prepare


def _overlap(entries: list[dict[str, Any]]) -> None:
    begin, end = entries[1]["data_offsets"]
    entries[1]["data_offsets"] = [begin - 4, end - 4]       # its first bytes are the last of the one before


def _negative(entries: list[dict[str, Any]]) -> None:
    entries[0]["data_offsets"] = [-8, entries[0]["data_offsets"][1]]


def _wrong_dtype(entries: list[dict[str, Any]]) -> None:
    entry = next(e for e in entries if e["dtype"] == "F32")
    entry["dtype"] = "F16"                                  # half the bytes its offsets hold


def _nan_config(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    config[formats.LAYER_CONFIG]["rms_norm_eps"] = float("nan")
    (folder / "config.json").write_text(json.dumps(config))          # Python writes the bare token NaN


def _linked_outside(folder: Path) -> None:
    outside = folder.parent / "elsewhere.safetensors"
    (folder / "model.safetensors").rename(outside)
    (folder / "model.safetensors").symlink_to(outside)


@pytest.mark.parametrize(("name", "prepare", "args", "said"), [
    ("already flat", lambda f: shutil.copytree(demo().root / "draft_flat", f, dirs_exist_ok=True), [],
     "is already in the flat format, which SGLang reads"),
    ("norm before residual", lambda f: _edit_config(f, {"norm_before_residual": True}), [],
     "norm_before_residual is true"),
    ("no ids", lambda f: _edit_config(f, {formats.IDS_KEY: None}), [], "Pass --layer-ids"),
    ("qwen3 decoder", lambda f: _edit_config(f, {f"{formats.LAYER_CONFIG}.model_type": "qwen3"}), [],
     "SGLang serves EAGLE-3 drafts only as LlamaForCausalLMEagle3"),
    ("cut-off weights", _cut, [], "The file is truncated"),
    ("overlapping offsets", _tamper(_overlap), [], "data_offsets overlap the tensor before them"),
    ("negative offsets", _tamper(_negative), [], "is not a non-negative integer"),
    ("dtype against byte length", _tamper(_wrong_dtype), [], "byte length does not match its dtype and shape"),
    ("NaN in the config", _nan_config, [], "`transformer_layer_config.rms_norm_eps` is nan, which is not a JSON"),
    ("shard linked outside", _linked_outside, [], "outside the checkpoint folder"),
    ("two ids for three slots", lambda f: None, ["--layer-ids", "-1,1"], "2 ids but fc.weight takes 3"),
    ("ids not digits", lambda f: None, ["--layer-ids", "-1,1_0,3"], "is not an integer written with the digits"),
])
def test_bad_input_is_one_paragraph_and_nothing_is_written(tmp_path: Path, name: str, prepare: Any,
                                                           args: list[str], said: str) -> None:
    source = shutil.copytree(demo().root / "draft_fixed", tmp_path / "src 'x'")    # a quote in the path too
    prepare(source)
    before = digest(source)
    text = refusal(flat_copy(source, tmp_path / "flat", *args))
    assert said in text, text
    assert not (tmp_path / "flat").exists() and digest(source) == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "elsewhere.safetensors") == ["src 'x'"]


def test_the_destination_is_never_replaced_nor_inside_the_source(tmp_path: Path) -> None:
    source = demo().root / "draft_fixed"
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "mine.txt").write_text("keep")
    assert "already exists; draftops never replaces a folder" in refusal(flat_copy(source, taken))
    assert (taken / "mine.txt").read_text() == "keep" and sorted(p.name for p in taken.iterdir()) == ["mine.txt"]
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")                     # a dangling link is a name taken too
    assert "already exists" in refusal(flat_copy(source, link))
    assert not (tmp_path / "elsewhere").exists()
    inside = shutil.copytree(source, tmp_path / "src")
    assert "is inside the checkpoint" in refusal(flat_copy(inside, inside / "flat"))
    assert "its folder" in refusal(flat_copy(source, tmp_path / "no" / "such" / "flat"))


def test_a_full_disk_leaves_nothing_behind(tmp_path: Path) -> None:
    source = demo().root / "draft_fixed"
    size = (source / "model.safetensors").stat().st_size
    with small_tmpfs(tmp_path / "small", "64k") as small:
        assert size > 64 * 1024
        text = refusal(flat_copy(source, small / "flat"))
        assert "No room left on the disk" in text and "Nothing was left behind" in text, text
        assert list(small.iterdir()) == []


def test_the_header_keeps_the_data_aligned(tmp_path: Path) -> None:
    done = flat_copy(demo().root / "draft_fixed", tmp_path / "flat")
    assert done.returncode == 0, done.stderr
    with (tmp_path / "flat" / "model.safetensors").open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
    assert n % 8 == 0


@pytest.fixture
def project(make_project: Any, tmp_path: Path, no_inventory_env: None) -> Path:
    """A host that serves with SGLang (`engine: sglang`): where a speculators draft needs the copy."""
    root = make_project({"box": {"transport": "local", "root": str(tmp_path / "hostroot"), "engine": "sglang",
                                 "python": sys.executable}}, default="box")
    copy_remote_package(root)
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    shutil.copytree(demo().root, tmp_path / "hostroot" / "state" / "demo")
    return root


def _paste(stdout: str) -> list[str]:
    """The command after "fix it with:", as a user pastes it (minus the program: `python -m invoke`)."""
    lines = stdout.splitlines()
    words = shlex.split(lines[lines.index("fix it with:") + 1])
    return words[words.index("invoke") + 1:]


@pytest.mark.slow
def test_on_an_sglang_host_test_drafter_names_draft_flat_whose_copy_then_checks_right(project: Path,
                                                                                      tmp_path: Path) -> None:
    """test-drafter of the speculators demo on an SGLang host says `invoke draft-flat ... --from-report`;
    that command, pasted, writes the copy with the report's ids and says how to serve it; test-drafter
    of the copy on the same host finds nothing wrong. A second paste refuses: the copy is never replaced."""
    checked = invoke(project, "sync", "test-drafter")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    (run_id,) = [p.name for p in (project / "runs").glob("*-test-drafter-*")]
    pasted = _paste(checked.stdout)
    assert pasted == ["draft-flat", "--ckpt", "demo", "--from-report", run_id], checked.stdout
    dest = tmp_path / "hostroot" / "my 'flat' draft"
    done = invoke(project, *pasted, "--out", str(dest))
    out = " ".join(done.stdout.split())
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"draft-flat {dest}:" in out and "ids [-1, 1, 3] in eagle_config" in out and "from the report" in out
    # a line to paste: the program as this process was started (cmdline.command), then the task, the path quoted
    (serve_line,) = [line for line in done.stdout.splitlines() if "serve it with SGLang:" in line]
    serve_words = shlex.split(serve_line.split("serve it with SGLang:", 1)[1])
    assert serve_words[serve_words.index("invoke") + 1:] == ["serve", "--draft", str(dest)], serve_line
    config = json.loads((dest / "config.json").read_text())
    assert config[formats.EAGLE_CONFIG][formats.IDS_KEY] == FIX_IDS
    data = tmp_path / "hostroot" / "state" / "demo" / "data"
    again = invoke(project, "test-drafter", "--ckpt", str(dest), "--data", str(data))
    assert again.returncode == 0, again.stdout + again.stderr
    (copy_run,) = [p.name for p in (project / "runs").glob("*-test-drafter-*") if p.name != run_id]
    report = json.loads((project / "runs" / copy_run / "report.json").read_text())
    assert report["verdict"]["status"] == "MATCH" and not [f for f in report["findings"] if f["severity"] == "bad"]
    assert "fix it with:" not in again.stdout
    twice = invoke(project, *pasted, "--out", str(dest))
    assert twice.returncode == 1 and "already exists" in twice.stderr, twice.stdout + twice.stderr


_SLOW_COPY = """
import sys, time
from pathlib import Path
from remote.draft_flat import __main__ as tool, tensors
real = tensors.copy
def slow(src, dest, n, header):
    written = real(src, dest, n, header)
    Path(sys.argv[1]).write_text("copying")
    time.sleep(120)
    return written
tensors.copy = slow
sys.exit(tool.main(["--ckpt", sys.argv[2], "--dest", sys.argv[3]]))
"""


def test_a_copy_killed_midway_is_cleared_by_the_next_run_and_a_live_one_is_left_alone(tmp_path: Path) -> None:
    """SIGKILL during the copy left an empty --dest and a hidden partial folder, and every rerun was refused
    ("already exists"). The rerun clears what a dead copy left; a copy still running is never touched."""
    import signal
    import time

    source, dest, ready = demo().root / "draft_fixed", tmp_path / "flat", tmp_path / "ready"
    slow = subprocess.Popen([sys.executable, "-c", _SLOW_COPY, str(ready), str(source), str(dest)], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline and slow.poll() is None:
            time.sleep(0.05)
        assert ready.exists(), "the slow copy never started writing"
        partial = [p for p in tmp_path.iterdir() if p.name.startswith(".flat.")]
        assert len(partial) == 1 and list(dest.iterdir()) == []
        assert "already exists" in refusal(flat_copy(source, dest))        # a live copy: left alone
        assert partial[0].is_dir() and (partial[0] / "model.safetensors").exists()
    finally:
        slow.send_signal(signal.SIGKILL)
        slow.wait(timeout=30)
    assert list(dest.iterdir()) == [] and partial[0].is_dir()             # what a SIGKILL leaves
    done = flat_copy(source, dest)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (dest / "model.safetensors").is_file() and (dest / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["flat", "ready"]  # the partial folder is gone


def test_someone_elses_empty_folder_is_still_never_replaced(tmp_path: Path) -> None:
    """Clearing leftovers takes an empty --dest only beside a dead copy's own hidden folder."""
    (tmp_path / "flat").mkdir()
    (tmp_path / ".flat.notours").mkdir()                                   # not a name the copy makes
    assert "already exists" in refusal(flat_copy(demo().root / "draft_fixed", tmp_path / "flat"))
    assert sorted(p.name for p in tmp_path.iterdir()) == [".flat.notours", "flat"]


def test_the_copy_keeps_each_files_permission_bits(tmp_path: Path) -> None:
    """Weights kept 0600 (private) became 0644 in the copy; each file keeps its source's bits."""
    source = shutil.copytree(demo().root / "draft_fixed", tmp_path / "src")
    (source / "tokenizer_config.json").write_text("{}")
    for name, mode in (("model.safetensors", 0o600), ("config.json", 0o640), ("tokenizer_config.json", 0o600)):
        os.chmod(source / name, mode)
    done = flat_copy(source, tmp_path / "flat")
    assert done.returncode == 0, done.stdout + done.stderr
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "flat").iterdir()}
    assert modes == {"model.safetensors": 0o600, "config.json": 0o640, "tokenizer_config.json": 0o600}


def test_a_side_file_linked_outside_the_checkpoint_is_not_copied(tmp_path: Path) -> None:
    """A tokenizer file linked to a file elsewhere (e.g. a secret) was copied into the new folder."""
    source = shutil.copytree(demo().root / "draft_fixed", tmp_path / "src")
    (tmp_path / "secret.txt").write_text("not the draft's")
    (source / "tokenizer.json").symlink_to(tmp_path / "secret.txt")
    done = flat_copy(source, tmp_path / "flat")
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (tmp_path / "flat" / "tokenizer.json").exists()
    assert "outside the checkpoint folder: not copied" in done.stdout
