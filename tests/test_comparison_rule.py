"""The one comparison rule (draftops/comparison.py, issue 36): how often it is right over many simulated
benches, the two slowdowns the issue found called noise, per-request samples read from the engines'
result files, and the doctor's two looks."""
from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pytest

from draftops import comparison
from draftops.bench import compare as comparing
from draftops.bench import samples
from draftops.comparison import Blocks
from draftops.doctor import plan
from remote.bench import client_output
from tests.support import bench_runs as runs

SEEDS = 200
PROMPTS, REPEATS = plan.BENCH["prompts"], plan.BENCH["repeats"]
CONCURRENCY = plan.BENCH["concurrency"]


def _bench(rng: np.random.Generator, tok_s: float, repeats: int, slow_repeat: float | None) -> Blocks:
    """One simulated bench as real ones spread: each repeat drifts (3% log-normal), one repeat may run
    slow (another job on the machine), and per request the latency is heavy-tailed (log-normal, with
    3% Pareto stragglers); output lengths vary as EOS cuts them. Its throughput is what vLLM computes:
    tokens / duration, the duration set by the concurrency."""
    drift = np.exp(rng.normal(0, 0.03, repeats))
    if slow_repeat is not None:
        drift[rng.integers(repeats)] *= slow_repeat
    out = rng.integers(20, 33, (repeats, PROMPTS)).astype(float)
    tail = np.where(rng.random((repeats, PROMPTS)) < 0.03, rng.pareto(2.0, (repeats, PROMPTS)) + 2, 1.0)
    latency_ms = out / (tok_s * drift[:, None]) * rng.lognormal(0, 0.3, (repeats, PROMPTS)) * tail * CONCURRENCY * 1e3
    tput = CONCURRENCY * out.sum(axis=1) / latency_ms.sum(axis=1) * 1e3
    within = [samples._throughput_noise({"output_len": list(o), "latency_ms": list(t)})
              for o, t in zip(out, latency_ms, strict=True)]
    return Blocks(list(tput), [w for w in within if w is not None])


def _doctor(seed: int, truth: float) -> comparison.Verdict:
    """The doctor's default bench of a baseline and of run B (true speed ratio ``truth``), one of the two
    with a slow repeat (×0.7–0.9), and the doctor's second look with extra repeats when the first is undecided."""
    rng = np.random.default_rng(seed)
    slow = rng.uniform(0.7, 0.9)
    in_b = bool(rng.integers(2))
    a = _bench(rng, 400.0, REPEATS, None if in_b else slow)
    b = _bench(rng, 400.0 * truth, REPEATS, slow if in_b else None)
    first = comparison.compare("throughput", a, b, alpha=comparison.look_alpha())
    more = comparison.extra_repeats(first)
    if not more:
        return first
    return comparison.compare("throughput", a, comparison.merged(b, _bench(rng, 400.0 * truth, more, None)),
                              alpha=comparison.look_alpha())


def test_a_true_slowdown_is_called_slower_and_identical_runs_almost_never_differ():
    slower = Counter(_doctor(seed, 0.75).decision for seed in range(SEEDS))
    same = Counter(_doctor(10_000 + seed, 1.0).decision for seed in range(SEEDS))
    assert slower["slower"] >= 0.95 * SEEDS, slower
    assert same["faster"] + same["slower"] <= comparison.ALPHA * SEEDS, same


def test_without_samples_identical_runs_still_keep_the_error_rate():
    """An old result folder: repeat-level blocks only, 3 repeats (the old default), drift and heavy tails.
    (With a slow repeat in one of two 3-repeat runs it measured 4%, close to the bound: docs/bench.md.)"""
    wrong = 0
    for seed in range(SEEDS):
        rng = np.random.default_rng(20_000 + seed)
        a, b = (Blocks(_bench(rng, 400.0, 3, None).values) for _ in (0, 1))
        wrong += comparison.compare("throughput", a, b).decision in ("faster", "slower")
    assert wrong <= comparison.ALPHA * SEEDS


def test_repeats_that_agree_exactly_never_give_a_zero_width_interval():
    """The floor under the repeats' spread: measured from the requests where the run kept them, else
    the assumed 3%; the method says which."""
    rng = np.random.default_rng(5)
    a, b = _bench(rng, 400.0, 6, None), _bench(rng, 360.0, 6, None)
    flat_a = Blocks([400.0] * 6, a.within)
    flat_b = Blocks([360.0] * 6, b.within)
    with_samples = comparison.compare("throughput", flat_a, flat_b)
    repeats_only = comparison.compare("throughput", Blocks(flat_a.values), Blocks(flat_b.values))
    assert "per-request samples' within-repeat noise" in with_samples.method
    assert "no per-request samples" in repeats_only.method and "assumed 3%" in repeats_only.method
    for got in (with_samples, repeats_only):
        assert got.lo is not None and got.hi is not None and got.hi / got.lo > 1.02 and got.decision == "slower"


# --- the two cases of the issue, from their recorded numbers -----------------------------------------

def test_the_doctor_case_is_slower_not_noise(hist):
    """doctor: as served 312.1 tok/s (repeats 269.7–350.6) against the baseline's 417.0 (378.7–447.2),
    called "no measurable difference (×0.75, within the repeats' 26% spread)"."""
    base = runs.vllm_run("base", tok_s=[378.7, 417.0, 447.2])
    served = runs.vllm_run("served", tok_s=[269.7, 312.1, 350.6], accept=1.01, draft=_draft())
    cmp = comparing.compare(base, served, {})
    assert cmp.speed is not None and cmp.speed.decision == "slower"
    assert cmp.speed.hi is not None and cmp.speed.hi < 1
    assert "spec-slower" in [f.code for f in cmp.findings]
    text = cmp.speed_text()
    assert text.startswith("×0.75 (95% CI ×0.") and text.endswith(": slower")


@pytest.mark.parametrize("odd", [1.9, 158.1], ids=["a-stalled-repeat", "a-fast-repeat"])
def test_the_nightly_case_is_slower_not_noise(hist, odd):
    """nightly: "157.1 vs 78.9 output tok/s (×0.50) is within the spread of the repeats (104%)". The issue
    kept the medians and the spread, not the repeats: here the speculative run's are 78.9 (the median),
    one close to it and an odd one 82.1 tok/s from the other end ((max − min) / median = 104%), a stall
    or a fast repeat."""
    spec_repeats = [78.9, 84.0, odd] if odd < 78.9 else [76.0, 78.9, odd]
    spread = (max(spec_repeats) - min(spec_repeats)) / 78.9
    assert spread == pytest.approx(1.04, abs=0.01)
    base = runs.vllm_run("base", tok_s=[152.0, 157.1, 161.3])
    spec = runs.vllm_run("spec", tok_s=spec_repeats, accept=1.01, draft=_draft())
    cmp = comparing.compare(base, spec, {})
    assert cmp.speed is not None and cmp.speed.decision == "slower", cmp.speed
    assert cmp.speed.set_aside and "B repeat 3" in cmp.speed.set_aside[0]
    assert "set aside" in cmp.speed_text()


def _draft():
    from draftops.bench.result import DraftInfo
    return DraftInfo(path="/m/draft", digest="sha256:aaaa000000000000", format="speculators",
                     layer_ids=[1, 4, 7], layer_id_convention="vllm")


@pytest.fixture
def hist(tmp_path):
    from draftops.history import History
    return History(tmp_path / "history.sqlite")


# --- decisions, sentences, the t quantile -------------------------------------------------------------

def test_same_needs_the_whole_interval_inside_the_margin():
    steady = Blocks([100.0, 100.5, 99.5, 100.2, 99.8, 100.1])
    assert comparison.compare("m", steady, Blocks([v * 1.01 for v in steady.values])).decision == "same"
    wide = comparison.compare("m", Blocks([95.0, 100.0, 105.0]), Blocks([96.0, 99.0, 106.0]))
    assert wide.decision == "undecided" and wide.more_repeats is not None and wide.more_repeats > 3
    assert "repeats per run would likely decide it" in wide.sentence()


def test_latency_lower_is_faster_and_accept_length_exact_per_repeat():
    ttft = comparison.compare("ttft", Blocks([50.0, 51.0, 49.0]), Blocks([30.0, 31.0, 29.5]), higher_is_better=False)
    assert ttft.decision == "faster" and ttft.ratio is not None and ttft.ratio < 1
    acc = comparison.compare("accept_length", Blocks([1.011] * 3), Blocks([3.287] * 3), floor=0.0)
    assert acc.decision == "faster" and acc.lo == pytest.approx(acc.hi)


def test_nothing_to_compare_is_said_not_guessed():
    got = comparison.compare("m", Blocks([None, math.nan]), Blocks([1.0]))
    assert got.decision == "not compared" and got.ratio is None and "no value" in got.sentence()


def test_the_doctors_looks_say_their_own_level():
    got = comparison.compare("m", Blocks([100.0, 101.0, 99.0]), Blocks([80.0, 81.0, 79.0]),
                             alpha=comparison.look_alpha())
    assert got.interval_text().startswith("×0.80 (97.5% CI ×0.") and comparison.level(0.05) == "95%"


@pytest.mark.parametrize("df, q", [(1, 12.706), (4, 2.776), (10, 2.228), (30, 2.042), (1000, 1.962)])
def test_t_quantile_matches_the_tables(df, q):
    assert comparison.t_quantile(0.975, df) == pytest.approx(q, abs=2e-3)


def test_compare_json_carries_every_metric_both_runs_have(tmp_path, hist):
    base = runs.vllm_run("base", tok_s=[90.0, 91.0, 89.0])
    spec = runs.vllm_run("spec", tok_s=[130.0, 131.0, 129.0], accept=2.5, draft=_draft())
    doc = comparing.compare(base, spec, {}).to_dict()
    assert doc["throughput"]["decision"] == "faster" and len(doc["throughput"]["ci"]) == 2
    assert {"ratio", "ci", "decision", "margin", "alpha", "method"} <= set(doc["throughput"])
    assert doc["samples"] == {"a": {"per_request": False, "requests": [0, 0, 0]},
                              "b": {"per_request": False, "requests": [0, 0, 0]}}
    json.dumps(doc)


# --- per-request samples from the engines' files -------------------------------------------------------

def _vllm_detailed(n: int = 6) -> dict:
    return {"duration": 2.0, "completed": n, "failed": 0, "output_throughput": 96.0, "total_output_tokens": 192,
            "output_lens": [32] * n, "ttfts": [0.05 + 0.01 * i for i in range(n)],
            "latencies": [0.9 + 0.02 * i for i in range(n)], "itls": [[0.027] * 31 for _ in range(n)],
            "errors": [""] * (n - 1) + ["boom"], "generated_texts": ["w01 w02"] * n}


def test_vllm_save_detailed_gives_one_sample_per_succeeded_request():
    rec = client_output.parse_vllm(json.dumps(_vllm_detailed())).last
    assert rec is not None and rec.samples is not None
    assert rec.samples["output_len"] == [32.0] * 5                       # the failed request left out
    assert rec.samples["ttft_ms"][:2] == [50.0, 60.0] and rec.samples["latency_ms"][0] == 900.0


def test_sglang_output_details_latency_is_ttft_plus_the_gaps():
    raw = {"completed": 2, "output_throughput": 50.0, "output_lens": [3, 0], "ttfts": [0.1, 0.2],
           "itls": [[0.05, 0.05], []], "errors": ["", "timeout"]}
    rec = client_output.parse_sglang(json.dumps(raw)).last
    assert rec is not None and rec.samples == {"output_len": [3.0], "ttft_ms": [100.0], "latency_ms": [200.0]}


@pytest.mark.parametrize("bad", [{"output_lens": [1, 2], "ttfts": [0.1]},
                                 {"output_lens": [math.nan], "ttfts": [0.1], "latencies": [1.0]},
                                 {"output_lens": [5], "ttfts": [-1], "latencies": [1.0]},
                                 {"output_lens": [5], "ttfts": [2.0], "latencies": [1.0]},
                                 {"output_lens": "32", "ttfts": [0.1]}])
def test_broken_detailed_fields_give_no_samples_not_an_error(bad):
    rec = client_output.parse_vllm(json.dumps({"completed": 1, "output_throughput": 1.0, **bad})).last
    assert rec is not None and rec.samples is None


def test_the_plan_asks_both_clients_for_their_details():
    from draftops.bench import plan as planning
    client = planning.Client("vllm", ("vllm", "bench", "serve"), {"--save-detailed": True})
    server = planning.Server(base_url="http://127.0.0.1:8000", model="m")
    settings = planning.BenchSettings(prompts=4, repeats=1, concurrency=2, output_len=8)
    argv = planning.vllm_argv(client, server, settings, prompts=4, result_dir="/r", result_file="f.json")
    assert "--save-detailed" in argv
    older = planning.Client("vllm", ("vllm", "bench", "serve"), {"--save-result": True})
    assert "--save-detailed" not in planning.vllm_argv(older, server, settings, prompts=4, result_dir="/r",
                                                       result_file="f.json")
    sg = planning.Client("sglang", ("python", "-m", "sglang.bench_serving"), {"--output-details": True})
    assert "--output-details" in planning.sglang_argv(sg, server, settings, prompts=4, output_file="o.jsonl",
                                                      sharegpt_path=None)


def test_merged_runs_keep_every_repeat_and_sample():
    a = runs.vllm_run("a", tok_s=[100.0, 101.0, 99.0])
    extra = runs.vllm_run("x", tok_s=[98.0, 102.0])
    both = samples.merged(a, extra)
    assert both.metrics.output_throughput.values == [100.0, 101.0, 99.0, 98.0, 102.0]
    assert [r.index for r in both.repeats] == sorted({r.index for r in both.repeats})
    assert both.run_id == "a" and both.settings.repeats == 5
