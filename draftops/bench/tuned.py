"""Findings from what tune knows, for ``bench compare`` (and the doctor, which compares the same way).

``over-drafting``: the draft's acceptance profile (test-drafter's conditional acceptance per step, the
served step count of them) says how many tokens a round yields at each K; the round's cost at K is a
line through the baseline's decode step and the speculative run's round, both measured by the runs
compared at one concurrency (round = c × accept length / throughput; the baseline's, accept length 1).
Without a baseline at that concurrency the cost is the documented default (:data:`DRAFT_COST`).
The served K is "well past the best" when the K the model predicts fastest is smaller and the served
K is predicted at least :data:`MARGIN` slower (docs/tune.md § Findings).

``acceptance-drops-with-batch``: two speculative runs of the same draft config and steps at two
concurrencies, the higher one's accept length lower beyond the comparison rule's interval
(TRT-LLM #7363 reports this: a batch's rounds are cut or drafted differently than one sequence's).
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

from draftops import comparison

if TYPE_CHECKING:
    from draftops.bench.result import BenchResult

#: a finding as compare.Finding takes it: (severity, code, text)
Said = tuple[str, str, str]

#: default model without a measured baseline: one draft token costs this share of a target decode step
#: and verifying K + 1 tokens costs one step (a GPU below compute-bound; EAGLE-3's one-layer head)
DRAFT_COST = 0.05
#: "well past the best": the served K predicted at least this much slower than the best K
MARGIN = 0.10


@dataclass(frozen=True)
class RoundLine:
    """Seconds per round at K drafted tokens: ``step + per_token × K`` (``step``: the baseline's decode step)."""

    step: float
    per_token: float
    source: str
    measured: bool = False

    def seconds(self, k: int) -> float:
        return self.step + self.per_token * k


def accept_length(cond: list[float], k: int) -> float:
    """1 + Σ_{d<k} Π_{i≤d} cond[i]; steps past the profile repeat its last rate."""
    total, alive = 1.0, 1.0
    for d in range(k):
        alive *= cond[min(d, len(cond) - 1)]
        total += alive
    return total


def _median(res: BenchResult) -> float | None:
    value = res.metrics.output_throughput.median
    return value if value is not None and value > 0 else None


def round_line(spec: BenchResult, base: BenchResult | None) -> RoundLine:
    """The round cost measured by the runs compared, else the default model."""
    c, k = spec.settings.concurrency or 1, spec.steps or 0
    acc = spec.accept_length.value if spec.accept_length else None
    ts, tb = _median(spec), _median(base) if base is not None else None
    if (base is not None and base.mode == "baseline" and tb and ts and acc and k >= 1
            and (base.settings.concurrency or 1) == c):
        step, spent = c / tb, c * acc / ts
        return RoundLine(step, max(spent - step, 0.0) / k,
                         f"measured: the baseline's step {step * 1e3:.1f} ms ({base.run_id}) and the round at "
                         f"K={k} {spent * 1e3:.1f} ms ({spec.run_id}), concurrency {c}", measured=True)
    return RoundLine(1.0, DRAFT_COST, f"the default model (no baseline at concurrency {c} in this comparison): "
                     f"a draft token costs {DRAFT_COST:.0%} of a decode step, verification is flat in K")


def over_drafting(label: str, spec: BenchResult, base: BenchResult | None,
                  cond_acc: list[float | None] | None, source: str,
                  speed_rule: comparison.Verdict | None = None) -> list[Said]:
    """``over-drafting`` when the served K is well past the fastest K the profile and cost predict
    (``cond_acc``: the prediction's conditional acceptance per step, from test-drafter run ``source``;
    ``speed_rule``: the rule's throughput verdict of ``spec`` against ``base``, whose interval gives
    the predicted loss its interval)."""
    k = spec.steps or 0
    cond = _leading(cond_acc or [])
    if spec.mode != "speculative" or k < 2 or not cond or (spec.speculative and (spec.speculative.topk or 1) > 1):
        return []
    line = round_line(spec, base)
    c = spec.settings.concurrency or 1
    speed = {n: c * accept_length(cond, n) / line.seconds(n) for n in range(1, k + 1)}
    best = max(speed, key=lambda n: speed[n])
    loss = 1 - speed[k] / speed[best]
    if best >= k or loss < MARGIN:
        return []
    ckpt = shlex.quote(spec.draft.path) if spec.draft else "CKPT"
    said = (f"predicted {speed[best]:.0f} tok/s against {speed[k]:.0f} at K={k}" if line.measured
            else f"predicted {1 / (1 - loss):.2f}× as fast as K={k}")
    return [("warn", "over-drafting",
             f"{label} drafts K={k} tokens per round, well past the fastest K: K={best} is {said} "
             f"({loss:.0%} lost at K={k}{_loss_interval(spec, cond, k, line, speed_rule)}); accept length "
             f"{accept_length(cond, best):.2f} against {accept_length(cond, k):.2f} from test-drafter run "
             f"{source}'s acceptance per step; round cost {line.source}. Serve with `invoke serve --draft {ckpt} "
             f"--steps {best}` and bench it to confirm.")]


def loss_at(cond: list[float], k: int, slope: float) -> float:
    """The share of the best K's speed lost at K when a draft token costs ``slope`` decode steps."""
    speed = [accept_length(cond, n) / (1 + slope * n) for n in range(1, k + 1)]
    return 1 - speed[-1] / max(speed)


def _loss_interval(spec: BenchResult, cond: list[float], k: int, line: RoundLine,
                   rule: comparison.Verdict | None) -> str:
    """``, 95% interval 21–40%``: the loss at both ends of the throughput ratio's interval (the round's
    cost per draft token in decode steps is (accept length / ratio − 1) / K), where it was measured."""
    acc = spec.accept_length.value if spec.accept_length else None
    if not line.measured or rule is None or rule.lo is None or rule.hi is None or rule.lo <= 0 or not acc:
        return ""
    ends = sorted(loss_at(cond, k, max(acc / r - 1, 0.0) / k) for r in (rule.hi, rule.lo))
    return f", {comparison.level(rule.alpha)} interval {ends[0]:.0%}–{ends[1]:.0%} from the throughput's"


def _leading(rates: list[float | None]) -> list[float]:
    out: list[float] = []
    for rate in rates:
        if rate is None:
            break
        out.append(rate)
    return out


def batch_drop(a: BenchResult, b: BenchResult, verdict: comparison.Verdict | None) -> list[Said]:
    """``acceptance-drops-with-batch``: same draft config and steps, the higher concurrency's accept
    length lower than the lower one's beyond the interval of the comparison rule."""
    if verdict is None or a.mode != "speculative" or b.mode != "speculative" or a.draft is None or b.draft is None:
        return []
    ca, cb = a.settings.concurrency or 1, b.settings.concurrency or 1
    same = (a.draft.path, a.draft.digest, a.steps) == (b.draft.path, b.draft.digest, b.steps)
    if not same or ca == cb:
        return []
    if verdict.decision != (comparison.SLOWER if cb > ca else comparison.FASTER):   # the rule's ratio is b / a
        return []
    low, high = (a, b) if cb > ca else (b, a)
    la = low.accept_length.value if low.accept_length else None
    lb = high.accept_length.value if high.accept_length else None
    return [("warn", "acceptance-drops-with-batch",
                    f"The accept length drops with the batch: {_num(la)} at concurrency "
                    f"{low.settings.concurrency or 1} ({low.run_id}) against {_num(lb)} at "
                    f"{high.settings.concurrency or 1} ({high.run_id}), {verdict.sentence()}. The draft and its "
                    "steps are the same, so the server drafts or verifies a batch differently than one "
                    "sequence (TRT-LLM #7363 reports this); predictions from one sequence's acceptance "
                    "overstate the gain at high concurrency: measure there, or turn speculation off above it.")]


def _num(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"
