"""`bench compare`'s findings from what tune knows: over-drafting (the served K well past the fastest
K the acceptance profile and the measured round cost predict) and acceptance-drops-with-batch (the
same draft config measured at two concurrencies, the higher one's accept length lower beyond the
interval). Runs built from the engines' real output formats (tests/bench_runs.py); predictions
recorded through the test-drafter hook's conversion."""
from __future__ import annotations

from pathlib import Path

import pytest

from draftops.bench import compare as comparing
from draftops.bench import tuned
from draftops.bench.result import DraftInfo
from draftops.history import History
from tests.support import bench_runs as runs

DIGEST = "sha256:cccc000000000000"
# the fixed demo's acceptance per step as test-drafter measures it (verifier basis, 15 steps): high for
# the steps it was trained on (3), then falling off
COND = [0.85, 0.95, 0.96, 0.55, 0.6, 0.6, 0.55, 0.5, 0.5, 0.45, 0.45, 0.4, 0.4, 0.4, 0.4]


def _draft() -> DraftInfo:
    return DraftInfo(path="/m/draft", digest=DIGEST, format="speculators", layer_ids=[0, 2, 4],
                     layer_id_convention="vllm")


@pytest.fixture
def hist(tmp_path: Path) -> History:
    h = History(tmp_path / "runs" / "history.sqlite")
    for steps in (3, 15):
        cond = COND[:steps]
        predicted = tuned.accept_length(cond, steps)
        report = runs.drafter_report(status="MATCH", served=predicted, best=predicted, steps=steps,
                                     cond=(cond, cond))
        runs.record_prediction(h, f"td-{steps}", report, DIGEST)
    return h


def _compare(hist: History, a, b) -> comparing.Comparison:
    return comparing.compare(a, b, {r.run_id: comparing.find_prediction(hist, r) for r in (a, b)})


def _finding(cmp: comparing.Comparison, code: str) -> comparing.Finding | None:
    return next((f for f in cmp.findings if f.code == code), None)


def test_fifteen_steps_is_named_over_drafting_with_the_better_k(hist: History) -> None:
    # measured on this machine (issue 39): concurrency 4, K=15 713 tok/s at accept length 4.96
    base = runs.vllm_run("base", tok_s=[380.0, 385.0, 378.0])
    spec = runs.vllm_run("k15", tok_s=[713.0, 716.0, 709.0], accept=tuned.accept_length(COND, 15), steps=15,
                         draft=_draft())
    cmp = _compare(hist, base, spec)
    found = _finding(cmp, "over-drafting")
    assert found is not None, [f.code for f in cmp.findings]
    line = tuned.round_line(spec, base)
    assert line.measured and "measured" in line.source
    speeds = {k: 4 * tuned.accept_length(COND, k) / line.seconds(k) for k in range(1, 16)}
    best = max(speeds, key=lambda k: speeds[k])
    assert best < 15 and speeds[15] < 0.9 * speeds[best]
    assert f"K={best} is predicted {speeds[best]:.0f} tok/s against {speeds[15]:.0f} at K=15" in found.text
    assert f"`invoke serve --draft /m/draft --steps {best}`" in found.text
    assert "td-15" in found.text
    # the loss's interval: the loss at both ends of the throughput ratio's 95% interval
    speed = cmp.speed
    assert speed is not None and speed.lo is not None and speed.hi is not None
    acc = tuned.accept_length(COND, 15)
    ends = sorted(tuned.loss_at(COND, 15, (acc / r - 1) / 15) for r in (speed.hi, speed.lo))
    assert f"95% interval {ends[0]:.0%}–{ends[1]:.0%} from the throughput's" in found.text
    assert ends[0] <= 1 - speeds[15] / speeds[best] <= ends[1]


def test_served_at_the_fastest_k_is_not_over_drafting(hist: History) -> None:
    base = runs.vllm_run("base", tok_s=[380.0, 385.0, 378.0])
    spec = runs.vllm_run("k3", tok_s=[819.0, 820.0, 815.0], accept=tuned.accept_length(COND, 3), steps=3,
                         draft=_draft())
    cmp = _compare(hist, base, spec)
    assert _finding(cmp, "over-drafting") is None
    assert _finding(cmp, "spec-faster") is not None


def test_without_a_baseline_the_default_cost_model_says_so(hist: History) -> None:
    a = runs.vllm_run("k15a", tok_s=[700.0, 705.0, 702.0], accept=tuned.accept_length(COND, 15), steps=15,
                      draft=_draft(), time="2026-11-30T09:30:00Z")
    b = runs.vllm_run("k15b", tok_s=[713.0, 716.0, 709.0], accept=tuned.accept_length(COND, 15), steps=15,
                      draft=_draft())
    cmp = _compare(hist, a, b)
    found = [f for f in cmp.findings if f.code == "over-drafting"]
    assert len(found) == 2                           # each speculative run is judged
    assert all("default model" in f.text and "as fast as K=15" in f.text for f in found)


def test_acceptance_that_drops_with_the_batch_is_named(hist: History) -> None:
    one = runs.vllm_run("c1", tok_s=[359.0, 361.0, 358.0], accept=3.34, steps=3, draft=_draft(), concurrency=1,
                        time="2026-11-30T09:30:00Z")
    many = runs.vllm_run("c16", tok_s=[1024.0, 1020.0, 1030.0], accept=2.40, steps=3, draft=_draft(),
                         concurrency=16)
    cmp = _compare(hist, one, many)
    found = _finding(cmp, "acceptance-drops-with-batch")
    assert found is not None, [f.code for f in cmp.findings]
    assert "3.34 at concurrency 1 (c1) against 2.40 at 16 (c16)" in found.text
    assert "TRT-LLM #7363" in found.text
    # the same drop the other way round (the higher concurrency as run A) is the same finding
    assert _finding(_compare(hist, many, one), "acceptance-drops-with-batch") is not None


@pytest.mark.parametrize("accept_c1", [3.34, 2.40], ids=["the-same-at-both-batches", "higher-at-the-higher-batch"])
def test_an_acceptance_that_does_not_drop_at_the_higher_batch_is_no_finding(hist: History, accept_c1: float) -> None:
    one = runs.vllm_run("c1", tok_s=[359.0, 361.0, 358.0], accept=accept_c1, steps=3, draft=_draft(), concurrency=1,
                        time="2026-11-30T09:30:00Z")
    many = runs.vllm_run("c16", tok_s=[1024.0, 1020.0, 1030.0], accept=3.34, steps=3, draft=_draft(),
                         concurrency=16)
    assert _finding(_compare(hist, one, many), "acceptance-drops-with-batch") is None
