"""`invoke doctor` without a server: the real flow on the built-in `local` host with the demo (test-drafter,
draft-config, test-drafter again) under Ctrl-C, SIGTERM and a full disk, and `--resume` finishing the job
without redoing a finished step (held against the history's run ids); the state file's checks; the
baseline-reuse rule against a real history; the report's escaping and its three-run chart in headless
Chromium. The end-to-end run with real vLLM servers is tests/test_doctor_engine.py."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from draftops import history
from draftops.doctor import plan, report, state, steps
from draftops.errors import DoctorError
from tests.conftest import REPO, small_tmpfs
from tests.drafter_support import local_demo_project
from tests.test_serve_ssh import processes_of_runs_under

pytestmark = [pytest.mark.slow]
CHROMIUM = shutil.which("chromium-headless-shell") or shutil.which("chromium")
NO_BENCH = ("doctor", "--draft", "demo", "--fix", "--no-bench")


@pytest.fixture
def project(make_project, no_inventory_env) -> Path:
    """A project on the `local` host whose host root holds this session's demo (as generated)."""
    root = local_demo_project(make_project())
    return root


def env() -> dict[str, str]:
    full = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(REPO)}
    full.pop("DRAFTOPS_HOST", None)
    return full


def invoke(root: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=root, env=env(), capture_output=True,
                          text=True, timeout=timeout)


def _sigint_as_from_a_terminal() -> None:
    """A suite run as a background job of a script ignores SIGINT, and its children inherit that (then
    Python installs no KeyboardInterrupt handler and a Ctrl-C sent to the doctor does nothing)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(root: Path, *args: str, **kw: Any) -> subprocess.Popen:
    kw.setdefault("preexec_fn", _sigint_as_from_a_terminal)    # Ctrl-C as from a terminal
    return subprocess.Popen([sys.executable, "-m", "invoke", *args], cwd=root, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)


def doctor_doc(root: Path) -> dict[str, Any]:
    (folder,) = [p for p in (root / "runs").glob("*-doctor-*") if (p / "doctor.json").is_file()]
    doc: dict[str, Any] = json.loads((folder / "doctor.json").read_text())
    return doc


def wait_for_step(root: Path, name: str, proc: subprocess.Popen, timeout: float = 240) -> None:
    """Until doctor.json says step ``name`` is running (its job started: a run id was announced)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        try:
            doc = doctor_doc(root)
        except (ValueError, OSError):
            doc = {}
        step = next((s for s in doc.get("steps", []) if s["name"] == name), None)
        if step and step["state"] == "running" and step["runs"]:     # its job runs
            return
        time.sleep(0.2)
    raise AssertionError(f"step {name} never ran")


def runs_of(root: Path, kind: str) -> list[str]:
    return sorted(r.run_id for r in history.History(root / "runs" / "history.sqlite").query(kind=kind))


def states(doc: dict[str, Any]) -> dict[str, str]:
    return {s["name"]: s["state"] for s in doc["steps"]}


def step_runs(doc: dict[str, Any], name: str) -> list[str]:
    return next(s["runs"] for s in doc["steps"] if s["name"] == name)


# --- the real flow, interrupted and resumed ------------------------------------------------------------

def test_without_fix_it_names_the_one_command_and_exits_not_healthy(project):
    done = invoke(project, "doctor", "--draft", "demo")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "NOT HEALTHY" in done.stdout and "invoke doctor --draft demo --fix" in done.stdout
    doc = doctor_doc(project)
    assert doc["status"] == "unhealthy" and states(doc) == {"check": "done"}
    check = doc["steps"][0]["outcome"]
    assert check["status"] == "MISMATCH" and "layer-convention-shift" in check["bad_findings"]
    assert step_runs(doc, "check") == runs_of(project, "test-drafter")          # the step is a run in the history
    assert runs_of(project, "doctor") == [doc["doctor_id"]]
    written = (project / "runs" / doc["doctor_id"] / "doctor.md").read_text()
    assert "## Findings" in written and "layer-convention-shift" in written and "--fix" in written
    # the sequential verdict stops once decided: the story says of how many samples it scored
    assert check["samples_total"] == 256 and check["samples"] < 256
    assert f"({check['samples']} of 256 samples scored: the sequential verdict was decided there)" in written


@pytest.mark.parametrize(("sig", "at", "code"), [(signal.SIGTERM, "recheck", 143), (signal.SIGINT, "check", 130)])
def test_a_signal_ends_the_step_and_resume_finishes_without_redoing(project, sig, at, code):
    proc = start(project, *NO_BENCH)
    wait_for_step(project, at, proc)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == code, out
    doc = doctor_doc(project)
    assert doc["status"] == "stopped" and doc["stopped_at"] == at and states(doc)[at] == "stopped", doc
    assert doc["left_running"] == [] and processes_of_runs_under(project / ".draftops" / "runs") == []
    page = (project / "runs" / doc["doctor_id"] / "doctor.md").read_text()
    assert f"stopped at step '{at}'" in page and f"invoke doctor --resume {doc['doctor_id']}" in page
    before = {name: step_runs(doc, name) for name, st in states(doc).items() if st == "done"}

    resumed = invoke(project, "doctor", "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    doc = doctor_doc(project)
    assert doc["status"] == "fixed" and set(states(doc).values()) == {"done"} and doc["resumed"]
    for name, runs in before.items():               # a finished step is never run again
        assert step_runs(doc, name) == runs
    assert runs_of(project, "draft-config") == step_runs(doc, "fix")            # the fix applied once
    assert runs_of(project, "test-drafter") == sorted(step_runs(doc, "check") + step_runs(doc, "recheck"))
    config = json.loads((project / ".draftops" / "state" / "demo" / "draft" / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == [0, 2, 4]


def test_a_full_disk_ends_the_doctor_and_resume_finishes(project):
    with small_tmpfs(project / "runs", "3m") as runs:
        proc = start(project, *NO_BENCH)
        wait_for_step(project, "recheck", proc)
        filler = runs / "filler"
        _fill(runs)                             # the disk fills while the re-check runs: its pull cannot land
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 1, out
        flat = " ".join(out.split())
        assert "No space left on device" in flat and "recheck" in flat, out
        assert processes_of_runs_under(project / ".draftops" / "runs") == []
        doc = doctor_doc(project)                # the last state the disk took: check and fix done
        assert states(doc)["check"] == "done" and states(doc)["fix"] == "done" and states(doc)["recheck"] != "done"
        first_check, first_fix = step_runs(doc, "check"), step_runs(doc, "fix")
        filler.unlink()
        resumed = invoke(project, "doctor", "--resume")
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        doc = doctor_doc(project)
        assert doc["status"] == "fixed" and step_runs(doc, "check") == first_check
        assert step_runs(doc, "fix") == first_fix and "stopped at" not in (runs / doc["doctor_id"] / "doctor.md"
                                                                           ).read_text()


def test_a_fix_resumed_after_its_config_was_written_keeps_the_original_ids_and_backup(project):
    done = invoke(project, *NO_BENCH)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = doctor_doc(project)
    first = json.loads(json.dumps(next(s for s in doc["steps"] if s["name"] == "fix")))     # a copy
    assert first["outcome"]["changed"] and first["outcome"]["backup"]
    # as a doctor stopped just after draft-config wrote the config, before the step was recorded done
    for step in doc["steps"]:
        if step["name"] == "fix":
            step.update(state="stopped", earlier=step["runs"], runs=[], outcome={})
        elif step["name"] == "recheck":
            step.update(state="pending", runs=[], outcome={})
    doc.update(status="stopped", stopped_at="fix", why="stopped by SIGTERM during this step", why_signal=15)
    path = project / "runs" / doc["doctor_id"] / "doctor.json"
    path.write_text(json.dumps(doc))
    resumed = invoke(project, "doctor", "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    again = next(s for s in doctor_doc(project)["steps"] if s["name"] == "fix")["outcome"]
    assert again["run_id"] != first["outcome"]["run_id"]                 # the fix ran again: nothing to change
    assert again["old_ids"] == first["outcome"]["old_ids"] != again["written_ids"]
    assert again["backup"] == first["outcome"]["backup"] and again["changed_by"] == first["outcome"]["run_id"]
    page = (project / "runs" / doc["doctor_id"] / "doctor.md").read_text()
    assert f"backup {first['outcome']['backup']}" in " ".join(page.split()).replace("\\", "")


# --- the state file -------------------------------------------------------------------------------------

def test_resume_refuses_other_arguments_and_other_hosts(tmp_path):
    runs = tmp_path / "runs"
    made = state.new(runs, "local", plan.Args(draft="demo", fix=True, bench=False))
    assert (runs / made.doctor_id / "doctor.json").is_file()
    with pytest.raises(DoctorError) as refused:
        state.resume(state.find(runs, None), "local", {"fix": False})
    text = str(refused.value)
    assert "invoke doctor --draft demo --fix --no-bench" in text and "--fix: True then, False now" in text
    assert "\n" not in text
    with pytest.raises(DoctorError, match="ran on host 'local', not 'box'"):
        state.resume(state.find(runs, made.doctor_id), "box", {})
    # the port, how it ends and whether a baseline is reused may change on resume
    again = state.resume(made.folder, "local", {"draft": "demo", "fix": True, "bench": False, "keep_serving": True,
                                                "fresh": True, "port": 8123})
    assert [s.name for s in again.steps] == ["check", "fix", "recheck"]
    assert again.args.port == 8123 and again.args.keep_serving and again.args.fresh


@pytest.mark.parametrize("content", ["{not json", json.dumps({"schema": "other/1"}), "[" * 100_000, None])
def test_a_damaged_state_file_is_one_paragraph(tmp_path, content):
    folder = tmp_path / "runs" / "20261202-000000-doctor-abcd"
    folder.mkdir(parents=True)
    if content is None:
        (folder / "doctor.json").symlink_to("/dev/zero")
    else:
        (folder / "doctor.json").write_text(content)
    with pytest.raises(DoctorError) as refused:
        state.resume(state.find(tmp_path / "runs", folder.name), "local", {})
    assert "doctor.json" in str(refused.value) and "without --resume" in str(refused.value)
    with pytest.raises(DoctorError, match="is not a run id"):
        state.find(tmp_path / "runs", "../../etc")


def test_the_state_is_written_whole_or_kept(tmp_path):
    with small_tmpfs(tmp_path / "runs", "64k") as runs:
        made = state.new(runs, "local", plan.Args(draft="demo"))
        before = (made.folder / "doctor.json").read_bytes()
        _fill(runs)
        made.status, made.why = "fixed", "x" * 20_000
        with pytest.raises(DoctorError, match=f"--resume {made.doctor_id}") as refused:
            made.save()
        assert "No space left on device" in str(refused.value)
        assert (made.folder / "doctor.json").read_bytes() == before
        assert sorted(p.name for p in made.folder.iterdir()) == ["doctor.json"]     # no temporary left


def _fill(folder: Path) -> None:
    """Write into ``folder`` until its file system is full."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


# --- baseline reuse ----------------------------------------------------------------------------------

def _bench_row(hist: history.History, runs: Path, run_id: str, *, age_h: float, rev: str, mode: str = "baseline",
               prompts: int = plan.BENCH["prompts"], verdict: str = "succeeded") -> None:
    (runs / run_id).mkdir(parents=True, exist_ok=True)
    (runs / run_id / "bench-result.json").write_text("{}")
    when = datetime.now(timezone.utc) - timedelta(hours=age_h)
    hist.record(history.RunRecord(run_id=run_id, kind="bench", host="local", time=history.to_iso(when), git_rev=rev,
                                  engine="vllm", target="/t", settings={
                                      "mode": mode, "dataset_kind": "text", "prompts": prompts, "concurrency": 4,
                                      "output_len": 32, "repeats": plan.BENCH["repeats"], "seed": 0}, verdict=verdict))


def test_a_recent_baseline_of_the_same_code_and_settings_is_reused(tmp_path):
    runs = tmp_path / "runs"
    hist = history.History(runs / "history.sqlite")
    asked = dict(plan.BENCH)

    def found(rev: str = "abc") -> str | None:
        rec = steps.reusable_baseline(runs, hist, host="local", engine="vllm", target="/t", settings=asked,
                                      git_rev=rev)
        return rec.run_id if rec else None

    assert found() is None
    _bench_row(hist, runs, "old", age_h=30, rev="abc")                 # older than 24 h
    _bench_row(hist, runs, "other-code", age_h=1, rev="def")           # another code version
    _bench_row(hist, runs, "speculative", age_h=1, rev="abc", mode="speculative")
    _bench_row(hist, runs, "fewer-prompts", age_h=1, rev="abc", prompts=plan.BENCH["prompts"] - 4)
    _bench_row(hist, runs, "failed", age_h=1, rev="abc", verdict="failed")
    assert found() is None
    _bench_row(hist, runs, "good", age_h=2, rev="abc")
    assert found() == "good" and found("def") == "other-code"
    shutil.rmtree(runs / "good")                                       # its result is gone: not reusable
    assert found() is None
    assert steps.reusable_baseline(runs, hist, host="local", engine="vllm", target="/t", settings=asked,
                                   git_rev=None) is None               # no code version: never reused


# --- the report ----------------------------------------------------------------------------------------

HOSTILE = "<script>alert(1)</script> | `x` \x1b[31mred\x1b[0m ![img](http://evil/)"


def synthetic(tmp_path: Path) -> state.State:
    """A finished doctor's state with the figures a real one records (one hostile host text)."""
    made = state.new(tmp_path / "runs", "local", plan.Args(draft="demo", fix=True))
    predicted = {"steps": 3, "served": 1.07, "best": 3.48}
    outcomes = {
        "check": {"run_id": "r-check", "status": "MISMATCH", "fixable": True, "message": HOSTILE,
                  "predicted": predicted, "trained_slots": [{"slot": 0, "layer_id": -1, "role": "embedding"}],
                  "configured_layer_ids": [2, 4, 5], "served_slots": [1, 2, 3], "serving_convention": "vllm",
                  "findings": [{"id": "layer-convention-shift", "severity": "bad", "text": HOSTILE, "fix": "f"}]},
        "baseline": {"bench_run": "r-b", "throughput": {"median": 100.0, "min": 95.0, "max": 104.0},
                     "accept_length": None},
        "as-served": {"bench_run": "r-a", "throughput": {"median": 60.0, "min": 55.0, "max": 64.0},
                      "accept_length": 1.08, "serve_run": "s-a", "configured_ids": [2, 4, 5],
                      "effective_ids": [2, 4, 5], "engine": "vllm"},
        "fix": {"run_id": "r-fix", "old_ids": [2, 4, 5], "written_ids": [0, 2, 4], "backup": "b", "config": "c"},
        "recheck": {"run_id": "r-re", "status": "MATCH", "predicted": {"steps": 3, "served": 3.48, "best": 3.48}},
        "fixed": {"bench_run": "r-f", "throughput": {"median": 130.0, "min": 120.0, "max": 138.0},
                  "accept_length": 3.41},
        "compare": {"tolerance": 0.1,
                    "as-served": {"measured": 1.08, "predicted": 1.07, "within_tolerance": True,
                                  "speed_text": "×0.60", "findings": []},
                    "fixed": {"measured": 3.41, "predicted": 3.48, "within_tolerance": True, "speed_text": "×1.30",
                              "findings": [{"severity": "good", "code": "draft-limit", "text": HOSTILE}],
                              "per_position": [{"available": True, "rows": [
                                  {"step": 0, "predicted": 0.87, "measured": 0.86, "reached": 900, "verdict": "agree"}
                              ]}]}},
    }
    for step in made.steps:
        step.state, step.outcome, step.runs = "done", outcomes.get(step.name, {}), [f"run-{step.name}"]
        step.commands = [f"invoke {step.name}"]
    made.status = "fixed"
    made.save()
    return made


def test_the_report_tells_the_story_in_order_and_escapes_host_text(tmp_path):
    made = synthetic(tmp_path)
    paths = report.write(made, tmp_path / "runs")
    text = paths["markdown"].read_text()
    order = ["## Summary", "## What training fed", "## Findings", "## The fix", "## Predicted vs measured",
             "## Steps"]
    assert [text.index(h) for h in order] == sorted(text.index(h) for h in order)
    assert "fixed: measured 3.41 vs predicted 3.48 (within 10%)" in text
    assert "doctor.png" in text and paths["chart"].is_file()
    page = paths["html"].read_text()
    for written in (text, page):
        assert "<script>" not in written and "\x1b" not in written
    assert "&lt;script&gt;" in page and "&lt;script&gt;" in text and "\\|" in text and "\\`x\\`" in text
    assert page.count("data:image/png;base64,") == 1


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed here (scripts/setup.sh --test "
                                             "installs chromium-headless-shell; CI runs this test)")
def test_the_report_renders_its_three_run_chart_in_headless_chromium(tmp_path):
    from matplotlib.image import imread
    page = report.write(synthetic(tmp_path), tmp_path / "runs")["html"]
    shot = tmp_path / "shot.png"
    assert CHROMIUM is not None
    done = subprocess.run([CHROMIUM, "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--screenshot={shot}",
                           "--window-size=1200,2600", "--allow-file-access-from-files", page.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert shot.exists(), done.stdout + done.stderr
    pixels = imread(str(shot))[..., :3]

    def share(hex_colour: str) -> float:
        colour = np.array([int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)]) / 255
        return float((np.abs(pixels - colour).max(axis=-1) < 0.03).mean())

    from draftops.doctor.chart import COLOURS
    for role in ("baseline", "as-served", "fixed", "predicted"):     # the three runs' bars and the prediction
        assert share(COLOURS[role]) > 0.0005, f"the {role} bars did not render"
