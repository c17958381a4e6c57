"""Faults around the patcher's writes: concurrent runs, symlinked files, hand edits."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from remote import events, exitcodes
from remote.sglang_patch import actions, locate
from remote.sglang_patch.errors import Busy
from remote.sglang_patch.state import StateStore
from tests.support.sglang_wheels import REPO, extract, originals, run_patcher, tree_bytes


def test_a_second_apply_waits_for_the_first_instead_of_racing_it(tmp_path, monkeypatch):
    root = extract("0.5.10", tmp_path / "site")
    state = tmp_path / "state"
    monkeypatch.syspath_prepend(str(root))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTOPS_")}
    env.update(PYTHONPATH=str(root), PYTHONDONTWRITEBYTECODE="1")
    second: list[subprocess.Popen[str]] = []
    real = events.progress

    def start_second_mid_apply(*args: object, **kwargs: object) -> None:
        real(*args, **kwargs)  # type: ignore[arg-type]
        if not second:  # one file of several written: the install is half patched right now
            second.append(subprocess.Popen(
                [sys.executable, "-m", "remote.sglang_patch", "apply", "--state-dir", str(state)],
                cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            time.sleep(2.0)

    monkeypatch.setattr(events, "progress", start_second_mid_apply)
    install = locate.locate()
    outcome = actions.apply(install, StateStore(state, install.version))
    assert len(outcome.changed) > 1
    out, err = second[0].communicate(timeout=120)
    assert second[0].returncode == 0, err
    assert "changed: nothing" in out
    assert len(list((state / "0.5.10").glob("*.orig"))) == len(outcome.changed)
    assert run_patcher(root, "revert", state_dir=state).returncode == 0
    assert tree_bytes(root) == originals("0.5.10")


def test_apply_refuses_while_another_run_holds_the_install(tmp_path, monkeypatch):
    root = extract("0.5.10", tmp_path / "site")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setattr(actions, "LOCK_WAIT_S", 0.3)
    install = locate.locate()
    with actions.install_lock(install), pytest.raises(Busy, match="Another sglang-patch"):
        actions.apply(install, StateStore(tmp_path / "state", install.version))
    assert tree_bytes(root) == originals("0.5.10")
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize("link", ["file", "folder"])
def test_a_symlink_into_a_shared_install_is_refused(tmp_path, link):
    shared = extract("0.5.13", tmp_path / "shared")
    root = extract("0.5.13", tmp_path / "site")
    rel = Path("srt/models/deepseek_v2.py")
    linked = root / "sglang" / (rel if link == "file" else rel.parent)
    shutil.rmtree(linked) if linked.is_dir() else linked.unlink()
    linked.symlink_to(shared / "sglang" / (rel if link == "file" else rel.parent))
    before = tree_bytes(shared)
    proc = run_patcher(root, "apply", state_dir=tmp_path / "state", out=tmp_path / "out")
    assert proc.returncode == exitcodes.REFUSED, proc.stdout + proc.stderr
    assert "symlink" in proc.stderr and str(shared / "sglang" / rel) in proc.stderr
    assert linked.is_symlink()
    assert tree_bytes(shared) == before
    assert not (tmp_path / "state").exists()


def test_a_capture_guarded_by_hand_is_native_not_patched_by_draftops(tmp_path):
    root = extract("0.5.13", tmp_path / "site")
    llama = root / "sglang" / "srt/models/llama.py"
    bare = b"aux_hidden_states.append(hidden_states + residual)"
    guarded = b"aux_hidden_states.append(hidden_states if residual is None else hidden_states + residual)"
    assert llama.read_bytes().count(bare) == 1
    llama.write_bytes(llama.read_bytes().replace(bare, guarded))
    proc = run_patcher(root, "verify", "--models", "llama", state_dir=tmp_path / "state",
                       out=tmp_path / "out")
    payload = json.loads((tmp_path / "out" / "patch.json").read_text())
    [row] = [f for f in payload["files"] if f["model"] == "llama"]
    assert row["state"] == "native", row
    assert proc.returncode == 0, proc.stdout + proc.stderr


KILL_AFTER_FIRST_WRITE = """
import os, signal, sys
from remote.sglang_patch import __main__ as cli, actions
actions._byte_compile = lambda path: os.kill(os.getpid(), signal.SIGKILL)
sys.exit(cli.main(["apply", "--state-dir", sys.argv[1]]))
"""


def test_an_apply_killed_after_its_first_write_can_be_reverted_and_reapplied(tmp_path):
    root = extract("0.5.10", tmp_path / "site")
    state = tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTOPS_")}
    env.update(PYTHONPATH=str(root), PYTHONDONTWRITEBYTECODE="1")
    killed = subprocess.run([sys.executable, "-c", KILL_AFTER_FIRST_WRITE, str(state)], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9
    assert tree_bytes(root) != originals("0.5.10"), "the first file was written before the kill"
    revert = run_patcher(root, "revert", state_dir=state)
    assert revert.returncode == 0, revert.stderr
    assert tree_bytes(root) == originals("0.5.10")
    killed = subprocess.run([sys.executable, "-c", KILL_AFTER_FIRST_WRITE, str(state)], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9
    apply = run_patcher(root, "apply", state_dir=state)
    assert apply.returncode == 0, apply.stderr
    assert run_patcher(root, "verify", state_dir=state).returncode == 0


def test_a_write_that_runs_out_of_space_is_refused_and_rolled_back(tmp_path):
    """RLIMIT_FSIZE stands in for a full disk: the last (largest) patched file cannot be written."""
    root = extract("0.5.10", tmp_path / "site")
    largest = max(len(data) for data in originals("0.5.10").values())
    proc = run_patcher(root, "apply", state_dir=tmp_path / "state", out=tmp_path / "out",
                       prefix=("prlimit", f"--fsize={largest + 1}"))
    assert proc.returncode == exitcodes.REFUSED, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "model_runner.py" in proc.stderr and "put back" in proc.stderr
    assert tree_bytes(root) == originals("0.5.10")
    assert run_patcher(root, "apply", state_dir=tmp_path / "state").returncode == 0
    assert run_patcher(root, "revert", state_dir=tmp_path / "state").returncode == 0
    assert tree_bytes(root) == originals("0.5.10")


def test_a_record_that_cannot_be_written_is_a_refusal(tmp_path):
    """Backups kept from an earlier apply/revert, then a file-size limit below a record's size."""
    root = extract("0.5.10", tmp_path / "site")
    state = tmp_path / "state"
    assert run_patcher(root, "apply", state_dir=state).returncode == 0
    assert run_patcher(root, "revert", state_dir=state).returncode == 0
    proc = run_patcher(root, "apply", state_dir=state, prefix=("prlimit", "--fsize=64"))
    assert proc.returncode == exitcodes.REFUSED, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "record" in proc.stderr
    assert str(state / "0.5.10") in proc.stderr
    assert tree_bytes(root) == originals("0.5.10")


def test_the_version_of_another_sglang_copy_on_sys_path_is_not_borrowed(tmp_path):
    """The first sglang has no version of its own; the metadata found belongs to the second."""
    first = extract("0.5.10", tmp_path / "first", metadata=False)
    for name in ("version.py", "_version.py"):
        (first / "sglang" / name).unlink(missing_ok=True)
    second = extract("0.5.13", tmp_path / "second")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTOPS_")}
    env.update(PYTHONPATH=f"{first}{os.pathsep}{second}", PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run([sys.executable, "-m", "remote.sglang_patch", "status", "--state-dir",
                           str(tmp_path / "state")], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == exitcodes.REFUSED, proc.stdout + proc.stderr
    assert "0.5.13" in proc.stderr and str(second / "sglang") in proc.stderr
    assert str(first / "sglang") in proc.stderr


@pytest.mark.parametrize("rel", ["srt/models/deepseek_v2.py", "srt/model_executor/model_runner.py"])
@pytest.mark.parametrize("damage", ["syntax-error", "nul-byte", "folder"])
def test_a_file_that_does_not_parse_is_reported_not_a_traceback(tmp_path, rel, damage):
    root = extract("0.5.10", tmp_path / "site")
    path = root / "sglang" / rel
    if damage == "folder":
        path.unlink()
        path.mkdir()
    else:
        path.write_bytes(path.read_bytes() + (b"\ndef (\n" if damage == "syntax-error" else b"\0"))
    before = {p: p.read_bytes() for p in root.rglob("*.py") if p.is_file()}
    status = run_patcher(root, "status", state_dir=tmp_path / "state", out=tmp_path / "s")
    assert status.returncode == 0, status.stderr
    rows = json.loads((tmp_path / "s" / "patch.json").read_text())["files"]
    [row] = [r for r in rows if r["file"] == rel]
    assert row["known_shape"] is False and "reinstall" in row["detail"], row
    apply = run_patcher(root, "apply", state_dir=tmp_path / "state", out=tmp_path / "a")
    assert apply.returncode == exitcodes.REFUSED, apply.stdout + apply.stderr
    assert "Traceback" not in apply.stderr and str(path) in apply.stderr
    assert {p: p.read_bytes() for p in root.rglob("*.py") if p.is_file()} == before
