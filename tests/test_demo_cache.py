"""The test demo is cached between runs (tests/support/demo_cache.py): a second session reuses the entry, a
damaged entry is rebuilt, two sessions at once build it once, and the key follows the generator's
source.  A tiny demo (same generator, smaller knobs) keeps each build under a few seconds; its
fresh builds also check what the cache relies on: the generator is deterministic."""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from remote.bench import demo_prompts
from remote.drafter.demo.build import MARKER, DemoSpec, is_complete
from tests.support.demo_cache import MANIFEST, _prune, cache_key, cached_demo, demo_cache_dir, source_files, verify
from tests.support.import_graph import REPO

TINY = replace(DemoSpec(), samples=20, seq_len=12, train_iters=4, train_batch=4, max_target_draws=1)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DRAFTOPS_TEST_CACHE", str(tmp_path / "cache"))
    return demo_cache_dir()


def build_fingerprint(demo: Path) -> str:
    """DEMO.json as its build wrote it: its text and its time stamp to the nanosecond, which every
    copy keeps (copytree copies with copy2). Equal means the same build. The text alone (the phase
    timings, to the ms) once matched between two builds of the tiny demo."""
    marker = demo / MARKER
    return f"{marker.stat().st_mtime_ns} {marker.read_text()}"


def session(dest: Path, cache_env: Path) -> subprocess.Popen:
    """Another test session: a fresh python asking the cache for the tiny demo."""
    code = ("import sys; from dataclasses import replace; from pathlib import Path; "
            "from remote.drafter.demo_spec import DemoSpec; from tests.support.demo_cache import cached_demo; "
            f"cached_demo(Path(sys.argv[1]), replace(DemoSpec(), **{asdict(TINY)!r}))")
    env = {**os.environ, "DRAFTOPS_TEST_CACHE": str(cache_env), "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", code, str(dest)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> None:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out + err


def test_a_second_session_reuses_the_cached_demo(cache: Path, tmp_path: Path) -> None:
    first = cached_demo(tmp_path / "one", TINY)
    entry = cache / cache_key(TINY)
    assert is_complete(first, TINY) and verify(entry) is None
    inode = (entry / "draft" / "model.safetensors").stat().st_ino
    finish(session(tmp_path / "two", cache.parent))
    assert build_fingerprint(tmp_path / "two") == build_fingerprint(first)        # not built again
    assert (entry / "draft" / "model.safetensors").stat().st_ino == inode
    assert not (tmp_path / "two" / MANIFEST).exists()
    # each session gets its own copy: writing into it leaves the cache as it was
    (tmp_path / "two" / "draft" / "config.json").write_text("{}")
    assert verify(entry) is None


@pytest.mark.parametrize("damage", ["truncate", "flip a byte", "delete a file", "add a file", "no manifest"])
def test_a_damaged_entry_is_rebuilt_not_trusted(cache: Path, tmp_path: Path, damage: str) -> None:
    first = cached_demo(tmp_path / "one", TINY)
    entry = cache / cache_key(TINY)
    manifest = json.loads((entry / MANIFEST).read_text())
    weights = entry / "draft" / "model.safetensors"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:100])
    elif damage == "flip a byte":
        raw = bytearray(weights.read_bytes())
        raw[-1] ^= 0xFF
        weights.write_bytes(bytes(raw))
    elif damage == "delete a file":
        shutil.rmtree(entry / "data_pt")
    elif damage == "add a file":
        (entry / "data" / "hs_999.safetensors").write_bytes(b"stray")
    else:
        (entry / MANIFEST).unlink()
    assert verify(entry) is not None
    again = cached_demo(tmp_path / "two", TINY)
    assert build_fingerprint(again) != build_fingerprint(first)                  # rebuilt
    assert verify(entry) is None and is_complete(again, TINY)
    # the generator is deterministic (what makes a cache sound): a fresh build has the same bytes,
    # but for the marker's build stats and the prompts' key (its digest)
    rebuilt = json.loads((entry / MANIFEST).read_text())
    stamped = (MARKER, demo_prompts.IN_DEMO + ".key")
    assert {k: v for k, v in rebuilt.items() if k not in stamped} == \
        {k: v for k, v in manifest.items() if k not in stamped}
    assert not [p for p in cache.iterdir() if p.name.startswith((".build-", ".trash-"))]


def test_a_half_built_entry_left_by_a_killed_run_is_cleared(cache: Path, tmp_path: Path) -> None:
    cache.mkdir(parents=True)
    stale = cache / f".build-{cache_key(TINY)}-killed"
    (stale / "target").mkdir(parents=True)
    demo = cached_demo(tmp_path / "one", TINY)
    assert is_complete(demo, TINY) and not stale.exists()


def test_two_sessions_at_once_build_the_demo_once(cache: Path, tmp_path: Path) -> None:
    procs = [session(tmp_path / name, cache.parent) for name in ("a", "b")]
    for proc in procs:
        finish(proc)
    assert build_fingerprint(tmp_path / "a") == build_fingerprint(tmp_path / "b")
    assert [p.name for p in cache.iterdir() if not p.name.startswith(".")] == [cache_key(TINY)]


def test_entries_unused_for_two_weeks_are_pruned_unless_in_use(cache: Path) -> None:
    cache.mkdir(parents=True)

    def entry(name: str, unused_days: float) -> Path:
        (cache / name).mkdir()
        (cache / name / MANIFEST).write_text("{}")
        when = time.time() - unused_days * 86400
        os.utime(cache / name / MANIFEST, (when, when))
        return cache / name

    old, recent, busy, current = entry("old", 30), entry("recent", 1), entry("busy", 30), entry("current", 30)
    (cache / ".trash-killed" / "entry").mkdir(parents=True)
    with open(cache / ".busy.lock", "w") as lock:                 # another run is copying it right now
        fcntl.flock(lock, fcntl.LOCK_EX)
        _prune(cache, keep="current")
    assert not old.exists() and not (cache / ".trash-killed").exists()
    assert recent.exists() and busy.exists() and current.exists()


def test_the_key_follows_the_generators_source_and_knobs(tmp_path: Path) -> None:
    names = {p.relative_to(REPO).as_posix() for p in source_files()}
    # what the generator runs, found from its imports; not the evaluator it never calls
    assert {"remote/drafter/demo/build.py", "remote/drafter/model/tinyllama.py", "remote/drafter/demo/train.py",
            "remote/drafter/demo/wordtokenizer.py", "remote/events.py"} <= names
    assert "remote/drafter/evaluation.py" not in names
    root = tmp_path / "repo"
    shutil.copytree(REPO / "remote", root / "remote", ignore=shutil.ignore_patterns("__pycache__"))
    base = cache_key(TINY, root)
    assert cache_key(TINY, root) == base
    assert cache_key(replace(TINY, seed=1), root) != base
    (root / "remote" / "drafter" / "evaluation.py").write_text("# not run by the generator\n")
    assert cache_key(TINY, root) == base
    with (root / "remote" / "drafter" / "model" / "tinyllama.py").open("a") as fh:
        fh.write("\n# a change the demo's bytes may depend on\n")
    assert cache_key(TINY, root) != base
