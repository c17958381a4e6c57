"""`invoke doctor --fix` on a host reached over a real sshd: the check, the fix and the re-check run as
the host's jobs, the draft's config is rewritten on the host (with its backup there), a SIGTERM during
the re-check stops the host's job over the link, and `--resume` finishes without redoing a step.
(The servers and benches of a doctor over SSH are those of `invoke serve`/`bench`, tested over SSH in
tests/test_serve_ssh.py and tests/test_bench_run_ssh.py.)"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import ssh_entry
from tests.support.doctor import NO_BENCH, doctor_doc, invoke, runs_of, start, states, step_runs, wait_for_step
from tests.support.drafter_support import task_project
from tests.support.serving import processes_of_runs_under

pytestmark = [pytest.mark.ssh, pytest.mark.slow]
SGLANG = "0.5.13"


def _box(tmp_path: Path, entry: dict) -> tuple[Path, Path]:
    """A project whose default host `box` is ``entry``, and that host's root holding this session's demo."""
    hostroot = tmp_path / "hostroot"
    return task_project(tmp_path, {"box": entry}, "box", demo_roots=(hostroot,)), hostroot


@pytest.fixture
def box_project(tmp_path: Path, sshd) -> tuple[Path, Path]:
    """`box` is the sshd, serving with vLLM."""
    return _box(tmp_path, ssh_entry(sshd, tmp_path, python=sys.executable, engine="vllm"))


def test_doctor_over_ssh_fixes_the_hosts_draft_and_resumes_after_sigterm(box_project):
    project, hostroot = box_project
    proc = start(project, *NO_BENCH)
    wait_for_step(project, "recheck", proc)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, out
    doc = doctor_doc(project)
    assert doc["host"] == "box" and doc["stopped_at"] == "recheck" and doc["left_running"] == [], doc
    assert processes_of_runs_under(hostroot / "runs") == []      # the host's job was stopped over the link
    config = hostroot / "state" / "demo" / "draft" / "config.json"
    assert json.loads(config.read_text())["eagle_aux_hidden_state_layer_ids"] == [0, 2, 4]   # fixed on the host
    (backup,) = config.parent.glob("config.json.draftops-bak-*")                            # its backup beside it
    assert json.loads(backup.read_text())["eagle_aux_hidden_state_layer_ids"] != [0, 2, 4]
    before = {name: step_runs(doc, name) for name, st in states(doc).items() if st == "done"}

    resumed = invoke(project, "doctor", "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    doc = doctor_doc(project)
    assert doc["status"] == "fixed" and set(states(doc).values()) == {"done"}
    for name, runs in before.items():
        assert step_runs(doc, name) == runs
    assert runs_of(project, "test-drafter") == sorted(step_runs(doc, "check") + step_runs(doc, "recheck"))
    for run in step_runs(doc, "check") + step_runs(doc, "recheck"):     # each a run folder on the host
        assert (hostroot / "runs" / run / "status.json").is_file()
    assert "box" in (project / "runs" / doc["doctor_id"] / "doctor.md").read_text()


@pytest.fixture
def sglang_box(tmp_path: Path, sshd) -> tuple[Path, Path, Path]:
    """A project whose host `box` serves with SGLang: its python is a venv holding the real SGLang 0.5.13
    sources (from the PyPI wheel) and, through a .pth file, this test run's torch and safetensors."""
    from tests.support.sglang_wheels import extract
    venv = tmp_path / "ml-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    extract(SGLANG, site)
    (site / "draftops-test-parent.pth").write_text(sysconfig.get_path("purelib") + "\n")
    project, hostroot = _box(tmp_path, ssh_entry(sshd, tmp_path, python=str(venv / "bin" / "python")))
    return project, hostroot, site


def test_doctor_on_an_sglang_host_patches_the_capture_and_says_what_the_rewrite_cannot_fix(sglang_box):
    """The fix's SGLang branch: the demo's fix needs the embedding captured, so the doctor applies the
    capture patch to the host's real SGLang sources before it rewrites the config, then re-checks. The
    demo draft is a speculators config, whose own field SGLang never reads: the re-check still finds
    `ids-missing-engine-default`, so the doctor ends not fixed (exit 3) and says how to serve it."""
    project, hostroot, site = sglang_box
    done = invoke(project, *NO_BENCH)
    assert done.returncode == 3, done.stdout + done.stderr
    doc = doctor_doc(project)
    assert doc["status"] == "not-fixed" and set(states(doc).values()) == {"done"}, doc
    assert runs_of(project, "patch-sglang") and set(runs_of(project, "patch-sglang")) <= set(step_runs(doc, "fix"))
    assert any("draftops sglang-patch" in p.read_text() for p in (site / "sglang").rglob("*.py"))
    fix = next(s for s in doc["steps"] if s["name"] == "fix")
    assert any("patch-sglang.apply" in c for c in fix["commands"]), fix
    config = json.loads((hostroot / "state" / "demo" / "draft" / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == fix["outcome"]["written_ids"]
    recheck = next(s for s in doc["steps"] if s["name"] == "recheck")["outcome"]
    assert recheck["status"] == "MISMATCH" and recheck["bad_findings"] == ["ids-missing-engine-default"], recheck
    page = " ".join((project / "runs" / doc["doctor_id"] / "doctor.md").read_text().split())
    assert "still wrong after the fix, ids-missing-engine-default" in page and "flat-format copy" in page
