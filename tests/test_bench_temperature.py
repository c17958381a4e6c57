"""A bench at a sampling temperature: the clients are sent it, the result records it, and
``bench compare`` holds the run against test-drafter's prediction at that temperature (the engines'
default greedy draft), names it beside the one at 0, and without one asks for it instead of calling
the wiring wrong against the greedy figure."""
from __future__ import annotations

from typing import Any

import pytest

from draftops.bench import compare as comparing
from draftops.bench.plan import BenchSettings, plan, sglang_argv, vllm_argv
from draftops.errors import BenchError
from draftops.history import History
from draftops.mlflowrun import split_metrics
from tests.support import bench_runs as runs
from tests.test_bench_compare import _draft
from tests.test_bench_plan import SGLANG_NEW, SGLANG_OLD, SPEC, VLLM, _opt

DIGEST = "sha256:bbbb000000000000"


def test_clients_are_sent_the_temperature() -> None:
    hot = BenchSettings(prompts=8, dataset="/d.jsonl", temperature=0.7)
    assert _opt(vllm_argv(VLLM, SPEC, hot, prompts=8, result_dir="/r", result_file="c.json"), "--temperature") == "0.7"
    assert _opt(sglang_argv(SGLANG_NEW, SPEC, hot, prompts=8, output_file="/o", sharegpt_path="/s"),
                "--temperature") == "0.7"
    assert _opt(vllm_argv(VLLM, SPEC, BenchSettings(), prompts=8, result_dir="/r", result_file="c.json"),
                "--temperature") == "0"
    with pytest.raises(BenchError, match="no --temperature"):   # it hard-codes 0.0: the run would be greedy
        plan(SGLANG_OLD, SPEC, hot, "/r")
    for bad in (float("nan"), -0.5, 1e9):
        with pytest.raises(BenchError, match="--temperature"):
            plan(VLLM, SPEC, BenchSettings(temperature=bad), "/r")


def _at(t: float, greedy: float, prob: float, role: str = "served") -> dict[str, Any]:
    return {"temperature": t, **{m: {"accept_length": v, "ci": [v - 0.05, v + 0.05], "cond_acc": [0.8, 0.6, 0.5],
                                     "rows": [900, 700, 400], "samples": 64}
                                 for m, v in (("greedy", greedy), ("probabilistic", prob))}}


def _predicted(hist: History, temps: list[dict[str, Any]] | None) -> None:
    report = runs.drafter_report(status="MATCH", served=3.40, best=3.40, configured=[0, 2, 4])
    if temps is not None:
        report["temperature"] = {"steps": 3, "role": "served", "level": 0.95, "greedy_at_zero": 3.42,
                                 "predictions": temps}
    runs.record_prediction(hist, "td-t", report, DIGEST)


def _spec(accept: float, temperature: float) -> Any:
    return runs.vllm_run("spec", tok_s=[95.0] * 3, accept=accept, draft=_draft(DIGEST, [0, 2, 4]),
                         temperature=temperature)


def _compare(hist: History, spec: Any) -> comparing.Comparison:
    base = runs.vllm_run("base", tok_s=[90.0] * 3, temperature=spec.settings.temperature)
    return comparing.compare(base, spec, {r.run_id: comparing.find_prediction(hist, r) for r in (base, spec)})


def test_bench_at_temperature_is_held_against_the_prediction_there(tmp_path) -> None:
    hist = History(tmp_path / "history.sqlite")
    _predicted(hist, [_at(0.7, 2.90, 2.80), _at(1.0, 2.60, 2.50)])
    cmp = _compare(hist, _spec(2.85, 0.7))      # 2 % from 2.90, 16 % below the greedy 3.40
    pred = cmp.predictions["spec"]
    assert pred is not None and pred.value == 2.90 and pred.temperature == 0.7 and pred.method == "greedy"
    assert pred.cond_served == [0.8, 0.6, 0.5] and pred.greedy_value == 3.40
    codes = {f.code: f for f in cmp.findings}
    assert "wiring-suspect" not in codes and "draft-limit" in codes
    said = codes["sampling-temperature"].text
    assert "2.90 (95% CI 2.85-2.95)" in said and "3.40 at temperature 0" in said
    # the history row sends each temperature's figures to MLflow as numbers
    numbers, _ = split_metrics(hist.query(kind="test-drafter")[0].metrics)
    assert ("predicted_at_temperature.0.7.greedy.accept_length", 2.90, 0) in numbers
    # the same run far below the prediction at its temperature is still a wiring suspect
    low = _compare(hist, _spec(2.20, 1.0))
    assert "wiring-suspect" in [f.code for f in low.findings] and low.predictions["spec"].value == 2.60


def test_bench_at_temperature_shows_the_rounds_at_that_temperature(tmp_path) -> None:
    """The greedy draft's tokens per round at T (what a server reports), not the greedy walk at 0."""
    hist = History(tmp_path / "history.sqlite")
    hot = _at(0.7, 2.90, 2.80)
    hot["greedy"]["per_round"] = {"accept_length": 2.42, "ci": [2.35, 2.49], "rounds": 4636, "samples": 256}
    _predicted(hist, [hot, _at(1.0, 2.60, 2.50)])
    held = _compare(hist, _spec(2.38, 0.7))
    assert held.predictions["spec"].walk == 2.42
    # judged against the rounds (2 % off), not the mean over positions (2.90: 18 % off, a wiring suspect)
    assert held.predictions["spec"].value == 2.42 and held.predictions["spec"].ci == [2.35, 2.49]
    assert "wiring-suspect" not in [f.code for f in held.findings]
    assert "draft-limit" in [f.code for f in held.findings]
    assert _compare(hist, _spec(1.95, 1.0)).predictions["spec"].walk is None     # none recorded there
    numbers, _ = split_metrics(hist.query(kind="test-drafter")[0].metrics)
    assert ("predicted_at_temperature.0.7.greedy.per_round.accept_length", 2.42, 0) in numbers


def test_bench_at_temperature_without_a_prediction_there_asks_for_one(tmp_path) -> None:
    hist = History(tmp_path / "history.sqlite")
    _predicted(hist, None)                      # a greedy prediction only
    cmp = _compare(hist, _spec(2.70, 0.7))      # 21 % below the greedy 3.40: not the wiring's fault
    codes = {f.code: f for f in cmp.findings}
    assert "wiring-suspect" not in codes and cmp.predictions["spec"] is None
    assert codes["sampling-temperature"].severity == "warn"
    assert "invoke test-drafter --ckpt /m/draft --steps 3 --temperature 0.7" in codes["sampling-temperature"].text
    greedy = _compare(hist, _spec(3.35, 0.0))   # at 0 nothing changes: no temperature finding
    assert "sampling-temperature" not in [f.code for f in greedy.findings]
    assert greedy.predictions["spec"] is not None and greedy.predictions["spec"].temperature == 0.0


def test_bench_flag_refuses_what_is_no_temperature() -> None:
    from invoke.exceptions import ParseError

    from draftops.cli.bench import TEMPERATURE
    assert TEMPERATURE.read("--temperature", "0.7") == 0.7
    for bad in ("nan", "-1", "inf", "1e999", "warm"):
        with pytest.raises(ParseError, match="--temperature"):
            TEMPERATURE.read("--temperature", bad)
