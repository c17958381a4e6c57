"""SGLang's speculative trees predicted from a draft's per-depth top-k acceptance (docs/tune.md § SGLang trees).

SGLang drafts a tree each round (``python/sglang/srt/speculative/spec_utils.py`` ``select_top_k_tokens``,
``eagle_utils.py`` ``organize_draft_results``): the first of ``--speculative-num-steps`` S draft
passes gives the root's top ``--speculative-eagle-topk`` k children; each later pass expands the k
best nodes of the previous depth (by the product of the draft's probabilities along the path) into
k children each, k² candidates, of which the k best are expanded next. Of all k + (S-1)·k²
candidates the ``--speculative-num-draft-tokens`` N minus one best by that product are verified with
the root, and the target accepts the longest path of the tree that matches its own tokens (plus
its bonus token). With k = 1, SGLang sets N to S + 1 whatever was asked.

The prediction runs the same selection on expected values: a node reached by ranks (r_1..r_d) is
worth Π_i q_i(r_i), where q_i(r) = P(the target's token is the draft's r-th at depth i | the path to
it was accepted), read from the profile's top-k rows (depths past the profile repeat its last row).
The expected accept length is 1 + the sum of the selected nodes' worths, since a node is accepted
exactly when the path to it matches. Assumptions: the rank at each depth is independent of the ranks
above it given an accepted prefix, and the draft's own ordering by probability is what a static tree
of expected worths would choose; the brute-force count on dumps (``remote/drafter/scoring/sglang_tree.py``)
checks both (tests/test_tune_trees.py).
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Protocol

from draftops.tune.profile import AcceptanceProfile

#: the SGLang server flags of one tree setting, in the order SGLang documents them
FLAGS = ("--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens")


class RoundCostLike(Protocol):
    """What the throughput prediction needs of the measured round cost (draftops/tune/cost.py)."""

    def round_seconds(self, concurrency: int, draft_tokens: int) -> float: ...

    def baseline_step(self, concurrency: int) -> float: ...


@dataclass(frozen=True)
class TreeSetting:
    """``--speculative-num-steps`` / ``--speculative-eagle-topk`` / ``--speculative-num-draft-tokens``."""

    steps: int
    topk: int = 1
    draft_tokens: int = 0        # 0: SGLang's own choice for topk 1 (steps + 1)

    def __post_init__(self) -> None:
        if not (1 <= self.steps <= 64 and 1 <= self.topk <= 16):
            raise ValueError(f"SGLang tree: steps must be 1..64 and topk 1..16, not {self.steps} and {self.topk}")
        if self.topk > 1 and not (2 <= self.draft_tokens <= self.candidates + 1):
            raise ValueError(f"SGLang tree: with topk {self.topk} and {self.steps} steps, draft tokens must be "
                             f"2..{self.candidates + 1} (the root and the {self.candidates} candidates), "
                             f"not {self.draft_tokens}")

    @property
    def candidates(self) -> int:
        """Nodes the draft proposes per round: k at depth 1, k² at each later depth."""
        return self.topk + (self.steps - 1) * self.topk ** 2

    @property
    def effective_draft_tokens(self) -> int:
        """What SGLang verifies per sequence: N, or steps + 1 with topk 1 (SGLang's adjustment)."""
        return self.steps + 1 if self.topk == 1 else self.draft_tokens

    def engine_args(self) -> list[str]:
        """The three flags with their effective values, as SGLang's launch_server reads them."""
        values = (self.steps, self.topk, self.effective_draft_tokens)
        return [part for flag, value in zip(FLAGS, values, strict=True) for part in (flag, str(value))]

    def engine_line(self) -> str:
        """The flags as one pasteable line (every word shell-quoted)."""
        return shlex.join(self.engine_args())


def rank_rates(profile: AcceptanceProfile, depth: int, topk: int) -> list[float]:
    """q(r) for r = 1..topk at ``depth`` (1-based): P(the target's token is the draft's r-th | accepted
    prefix), from the top-k row (differences of the cumulative rates, made non-decreasing first);
    ranks past the profile's width get nothing; a profile without top-k rows has q(1) = conditional."""
    if profile.topk:
        row = profile.topk[min(depth, len(profile.topk)) - 1]
        cumulative: list[float] = []
        for rate in row[:topk]:
            cumulative.append(max(rate, cumulative[-1]) if cumulative else rate)
    elif profile.conditional:
        cumulative = [profile.conditional[min(depth, profile.max_depth) - 1]]
    else:
        cumulative = [0.0]
    cumulative += [cumulative[-1]] * (topk - len(cumulative))
    return [cumulative[0]] + [b - a for a, b in zip(cumulative, cumulative[1:], strict=False)]


def accept_length(profile: AcceptanceProfile, setting: TreeSetting) -> float:
    """Expected tokens per round (bonus included) of SGLang's tree for ``setting`` (see the module)."""
    if setting.topk == 1:
        return profile.accept_length(setting.steps)
    k = setting.topk
    worths = rank_rates(profile, 1, k)
    chosen = list(worths)
    beam = sorted(worths, reverse=True)[:k]
    for depth in range(2, setting.steps + 1):
        rates = rank_rates(profile, depth, k)
        expanded = [w * q for w in beam for q in rates]
        chosen += expanded
        beam = sorted(expanded, reverse=True)[:k]
    best = sorted(chosen, reverse=True)[: setting.draft_tokens - 1]
    return 1.0 + sum(best)


def tok_s(profile: AcceptanceProfile, setting: TreeSetting, cost: RoundCostLike, concurrency: int) -> float:
    """Predicted output tok/s: c × accept length / the round's seconds, the round verifying
    N - 1 drafted tokens per sequence besides the root (as vLLM's K drafted tokens beside its own)."""
    return concurrency * accept_length(profile, setting) / cost.round_seconds(concurrency,
                                                                               setting.effective_draft_tokens - 1)


def settings(max_steps: int, topks: tuple[int, ...] = (1, 2, 4),
             draft_tokens: tuple[int, ...] = (4, 8, 16, 32)) -> list[TreeSetting]:
    """The grid tune predicts for an SGLang host: every steps up to ``max_steps`` per topk; for topk > 1,
    each draft-token budget the tree can fill (SGLang's bench_speculative sweeps the same three)."""
    out: list[TreeSetting] = []
    for steps in range(1, max_steps + 1):
        for k in topks:
            if k == 1:
                out.append(TreeSetting(steps, 1, steps + 1))
                continue
            cap = k + (steps - 1) * k * k + 1
            out += [TreeSetting(steps, k, n) for n in draft_tokens if n <= cap]
    return out


@dataclass(frozen=True)
class Predicted:
    """One setting at one concurrency."""

    setting: TreeSetting
    concurrency: int
    accept_length: float
    tok_s: float
    speedup: float


def best(profile: AcceptanceProfile, cost: RoundCostLike, concurrency: int,
         grid: list[TreeSetting]) -> Predicted:
    """The fastest setting of ``grid`` at ``concurrency``, with its speed-up over the baseline."""
    base = concurrency / cost.baseline_step(concurrency)
    rows = [Predicted(s, concurrency, accept_length(profile, s), tok_s(profile, s, cost, concurrency), 0.0)
            for s in grid]
    top = max(rows, key=lambda p: p.tok_s)
    return Predicted(top.setting, concurrency, top.accept_length, top.tok_s, top.tok_s / base)
