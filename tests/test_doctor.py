"""`invoke doctor` without a server: the real flow on the built-in `local` host with the demo (test-drafter,
draft-config, test-drafter again) under Ctrl-C, SIGTERM and a full disk, and `--resume` finishing the job
without redoing a finished step (held against the history's run ids); the state file's checks; the
baseline-reuse rule against a real history; the report's escaping and its three-run chart in headless
Chromium. The end-to-end run with real vLLM servers is tests/test_doctor_engine.py."""
from __future__ import annotations

import json
import shutil
import signal
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

from draftops import history
from draftops.doctor import plan, report, state, steps
from draftops.errors import DoctorError
from tests.conftest import small_tmpfs
from tests.support.chromium import CHROMIUM, screenshot
from tests.support.disks import fill as _fill
from tests.support.doctor import (  # noqa: F401  (fixtures)
    NO_BENCH,
    doctor_doc,
    invoke,
    project,
    runs_of,
    start,
    states,
    step_runs,
    synthetic,
    wait_for_step,
)
from tests.support.serving import processes_of_runs_under

pytestmark = [pytest.mark.slow]


# --- the real flow, interrupted and resumed ------------------------------------------------------------

def test_without_fix_it_names_the_one_command_and_exits_not_healthy(project):  # noqa: F811
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
def test_a_signal_ends_the_step_and_resume_finishes_without_redoing(project, sig, at, code):  # noqa: F811
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


def test_a_full_disk_ends_the_doctor_and_resume_finishes(project):  # noqa: F811
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


def test_a_fix_resumed_after_its_config_was_written_keeps_the_original_ids_and_backup(project):  # noqa: F811
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
    page = report.write(synthetic(tmp_path), tmp_path / "runs")["html"]
    pixels = screenshot(page, tmp_path / "shot.png", 2600)

    def share(hex_colour: str) -> float:
        colour = np.array([int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)]) / 255
        return float((np.abs(pixels - colour).max(axis=-1) < 0.03).mean())

    from draftops.doctor.chart import COLOURS
    for role in ("baseline", "as-served", "fixed", "predicted"):     # the three runs' bars and the prediction
        assert share(COLOURS[role]) > 0.0005, f"the {role} bars did not render"
