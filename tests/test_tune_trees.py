"""SGLang trees: the evaluator's per-depth top-k profile, the tree prediction built on it, and the
prediction checked against a brute-force count of SGLang's own tree on the demo's dumps.

The count (remote/drafter/scoring/sglang_tree.py) runs the fixed demo draft on every branch SGLang would
draft (each branch fed its own tokens), keeps the nodes SGLang keeps and counts what the target
accepts; the prediction (draftops/tune/trees.py) only sees the report's per-depth figures."""
from __future__ import annotations

import json
import shlex
from typing import Any

import pytest
import torch

from draftops.documents.drafter_report import DrafterReport
from draftops.tune import trees
from draftops.tune.profile import AcceptanceProfile
from remote.drafter import load_checkpoint
from remote.drafter.data.batching import collate
from remote.drafter.data.dumps import DumpSet
from remote.drafter.scoring import sglang_tree
from tests.support.drafter_support import demo, run_eval

SAMPLES = 16      # the demo's first samples (36 rounds each): the report's and the count's


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_eval(tmp_path_factory.mktemp("fixed"), ckpt=demo().draft_fixed, steps=4, limit=SAMPLES, full=True)


@pytest.fixture(scope="module")
def profile(report: dict[str, Any]) -> AcceptanceProfile:
    found = AcceptanceProfile.from_report(DrafterReport.model_validate(report), basis="data")
    assert found is not None
    return found


# --- the evaluator's per-depth top-k ------------------------------------------------------------

def test_the_report_carries_top_k_per_depth_with_its_counts(report: dict[str, Any]) -> None:
    data = report["metrics"]["served"]["data"]
    topk = data["topk"]
    assert topk["k"] == 4 and len(topk["acc"]) == 4 == len(topk["total"])
    for row, correct, total in zip(topk["acc"], topk["correct"], topk["total"], strict=True):
        assert total > 0 and correct == sorted(correct)                 # top j+1 holds what top j holds
        assert row == pytest.approx([c / total for c in correct])
    # depth 1 has no prefix: its top-1 is step 0's accuracy, its top-4 at most the top-5 figure
    assert topk["correct"][0][0] == data["full_correct"][0] and topk["total"][0] == data["full_total"][0]
    assert topk["acc"][0][3] <= data["top5_acc_0"]
    # a prefix within the top 4 is a weaker condition than a right top-1 prefix: more rows count
    assert all(t >= c for t, c in zip(topk["total"][1:], data["cond_total"][1:], strict=True))


def test_the_profile_reads_the_served_layouts_top_k(report: dict[str, Any], profile: AcceptanceProfile) -> None:
    data = report["metrics"]["served"]["data"]
    assert profile.conditional == pytest.approx(data["cond_acc"])
    assert [x for r in profile.topk for x in r] == pytest.approx([x for r in data["topk"]["acc"] for x in r])
    assert profile.samples == data["cond_total"][0] and profile.source == "report:data"
    verifier = AcceptanceProfile.from_report(DrafterReport.model_validate(report))
    assert verifier is not None and verifier.source == "report:verifier"


def test_a_report_without_top_k_gives_a_profile_without_it(report: dict[str, Any]) -> None:
    older = json.loads(json.dumps(report))
    del older["metrics"]["served"]["data"]["topk"]
    found = AcceptanceProfile.from_report(DrafterReport.model_validate(older), basis="data")
    assert found is not None and found.topk == () and found.conditional
    # no served layout scored: no profile, rather than zeros
    older["metrics"]["served"] = None
    assert AcceptanceProfile.from_report(DrafterReport.model_validate(older), basis="data") is None


# --- the prediction ------------------------------------------------------------------------------

def test_topk_one_is_the_chain_and_sglang_adjusts_its_draft_tokens() -> None:
    prof = AcceptanceProfile(conditional=(0.8, 0.9, 0.5), topk=((0.8, 0.9), (0.9, 0.95), (0.5, 0.7)))
    chain = trees.TreeSetting(3, 1, 16)
    assert trees.accept_length(prof, chain) == pytest.approx(prof.accept_length(3))
    assert chain.effective_draft_tokens == 4
    assert chain.engine_args() == ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                                   "--speculative-num-draft-tokens", "4"]
    assert shlex.split(chain.engine_line()) == chain.engine_args()


def test_a_small_tree_by_hand() -> None:
    # depth 1: ranks worth 0.8 and 0.1; depth 2 (from each): 0.9 and 0.05
    prof = AcceptanceProfile(conditional=(0.8, 0.9), topk=((0.8, 0.9), (0.9, 0.95)))
    # candidates: 0.8, 0.1; then 0.72, 0.04, 0.09, 0.005; the 3 best: 0.8, 0.72, 0.1
    assert trees.accept_length(prof, trees.TreeSetting(2, 2, 4)) == pytest.approx(1 + 0.8 + 0.72 + 0.1)
    # a budget of every candidate
    assert trees.accept_length(prof, trees.TreeSetting(2, 2, 7)) == pytest.approx(
        1 + 0.8 + 0.1 + 0.72 + 0.04 + 0.09 + 0.005)
    # more draft tokens never predict fewer accepted ones
    lengths = [trees.accept_length(prof, trees.TreeSetting(2, 2, n)) for n in range(2, 8)]
    assert lengths == sorted(lengths)


@pytest.mark.parametrize(("steps", "topk", "tokens"), [(2, 2, 1), (2, 2, 8), (0, 1, 1), (3, 0, 4)])
def test_a_setting_sglang_cannot_build_is_refused(steps: int, topk: int, tokens: int) -> None:
    with pytest.raises(ValueError, match="SGLang tree"):
        trees.TreeSetting(steps, topk, tokens)


class _Cost:
    """A round that costs 10 ms plus 1 ms per draft token at every concurrency; the baseline 10 ms."""

    def round_seconds(self, concurrency: int, draft_tokens: int) -> float:
        return 0.010 + 0.001 * draft_tokens

    def baseline_step(self, concurrency: int) -> float:
        return 0.010


def test_throughput_and_the_best_setting() -> None:
    prof = AcceptanceProfile(conditional=(0.8, 0.9, 0.5), topk=((0.8, 0.9), (0.9, 0.95), (0.5, 0.7)))
    tree = trees.TreeSetting(3, 2, 6)
    assert trees.tok_s(prof, tree, _Cost(), 4) == pytest.approx(4 * trees.accept_length(prof, tree) / 0.015)
    grid = trees.settings(3, topks=(1, 2), draft_tokens=(4, 6))
    assert {(s.steps, s.topk, s.effective_draft_tokens) for s in grid} >= {(1, 1, 2), (3, 1, 4), (2, 2, 4),
                                                                          (3, 2, 6)}
    top = trees.best(prof, _Cost(), 4, grid)
    assert top.tok_s == max(trees.tok_s(prof, s, _Cost(), 4) for s in grid)
    assert top.speedup == pytest.approx(top.tok_s / 400.0)


# --- checked against SGLang's tree counted on the dumps ------------------------------------------

def _counted(slots: tuple[int, ...], steps: int, topk: int, tokens: int) -> tuple[float, float, float, int]:
    """Mean tokens per round over every start row of the first SAMPLES samples, with a 95% interval
    from a bootstrap over samples (rows of one sample are not independent)."""
    draft, _ = load_checkpoint(demo().draft_fixed)
    data = DumpSet.open(demo().data)
    rounds: list[tuple[int, int]] = []
    with torch.inference_mode():
        for first in range(0, SAMPLES, 8):
            batch = collate([data.load(i) for i in range(first, first + 8)])
            rounds += sglang_tree.count(draft, batch, slots, steps, topk, tokens)
    sums: dict[int, list[int]] = {}
    for sample, got in rounds:
        sums.setdefault(sample, []).append(got)
    per = torch.tensor([[sum(v), len(v)] for v in sums.values()], dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    pick = torch.randint(0, per.shape[0], (2000, per.shape[0]), generator=gen)
    boot = per[pick].sum(1)
    ratios = (boot[:, 0] / boot[:, 1]).sort().values
    return float(per[:, 0].sum() / per[:, 1].sum()), float(ratios[50]), float(ratios[1949]), len(rounds)


def test_the_prediction_falls_within_the_brute_force_count(report: dict[str, Any],
                                                          profile: AcceptanceProfile) -> None:
    slots = tuple(report["metrics"]["served"]["slots"])
    counted = {}
    for setting in (trees.TreeSetting(3, 1, 4), trees.TreeSetting(3, 2, 6)):
        mean, lo, hi, rounds = _counted(slots, setting.steps, setting.topk, setting.effective_draft_tokens)
        predicted = trees.accept_length(profile, setting)
        assert rounds > 500 and lo < mean < hi
        assert lo <= predicted <= hi, (setting, predicted, mean, lo, hi)
        counted[setting.topk] = (mean, predicted)
    # the tree reaches further than the chain of the same steps, in the count and in the prediction
    assert counted[2][0] > counted[1][0] and counted[2][1] > counted[1][1]
