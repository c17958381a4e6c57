"""The accept length predicted at a sampling temperature, from the logits the metrics pass computes.

A server at temperature T > 0 verifies each drafted token by rejection sampling against the target's
distribution p_T = softmax(z / T).  How often it accepts depends on how the draft proposes:

* ``greedy`` draft (vLLM's default, ``draft_sample_method="greedy"``; SGLang's chain EAGLE): the
  draft proposes its argmax d and the rejection sampler treats the draft's distribution as one-hot,
  so the token is accepted with probability p_T(d);
* ``probabilistic`` draft (vLLM's ``draft_sample_method="probabilistic"``): the draft samples from
  its own q_T = softmax(draft logits / T) and the token is accepted with probability
  Σ_v min(p_T(v), q_T(v)) (the standard speculative-sampling acceptance).

Per depth k the conditional acceptance is the mean of that probability over the rows whose draft
tokens at depths 0..k-1 equal the dump's next tokens: only there is the target state of row t+k the
one a server holds after accepting them (teacher forcing, as the greedy chain's ``cond_acc``).  The
accept length chains them: 1 + Σ_k Π_{j≤k} α_j.  Its 95% interval is a percentile bootstrap over
samples (the unit the dumps are drawn in); it covers the evaluation's sampling noise, not a bench
text unlike the dumps.  At T = 0 both methods are the greedy figure (acceptance = 1[d = argmax p]).

That chain is an average over *positions* (speculators' figure).  A server reports tokens per *round*,
and rounds skip through easy stretches and pile up in hard ones, so where acceptance varies along the
text the server's figure is lower (on the fixed demo at T = 0.7: 2.90 over positions, 2.40 per round).
``per_round`` (greedy draft) replays the rounds: a greedy-draft server's token is accepted exactly
when it equals the drafted one (a rejected draft token is resampled from p_T without it), so given
the text the rounds are fixed: a round from row t accepts the draft tokens that match the text's next
tokens and the next round starts after them (``metrics.walk``).  Each round is credited its expected
acceptance Σ_k Π_{j<k} 1[d_j = x_{t+j+1}] · p_T(d_k) (the last factor a probability, not a coin:
same mean, less noise).  On text the target sampled at T this is the served accept length without
bias; on text sampled otherwise it is the served figure for that text, like the chain.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..model.layers import rms_norm

ID = "temperature"          # the report's key and Results.extra's
GREEDY, PROBABILISTIC = "greedy", "probabilistic"
METHODS = (GREEDY, PROBABILISTIC)
MAX_TEMPERATURE = 100.0
BOOTSTRAP = 1000            # resamples of the interval
LEVEL = 0.95
CHUNK = 256                 # rows per full-vocabulary softmax (memory: CHUNK x V floats, 128 MB at V = 128k)
#: what each method means, as the report says it
DEFINITIONS = {
    GREEDY: "the draft proposes its argmax d; accepted with probability p_T(d) (vLLM's default "
            "draft_sample_method=greedy, SGLang's chain EAGLE)",
    PROBABILISTIC: "the draft samples from its own q_T; accepted with probability sum_v min(p_T(v), q_T(v)) "
                   "(vLLM's draft_sample_method=probabilistic)",
}

#: what ``greedy.per_round`` counts
PER_ROUND = ("tokens per verify round of a greedy-draft server whose text is the dumps' (the rounds replayed over "
             "the text, each credited its expected acceptance at T): what a server reports; the chain's "
             "accept_length averages over positions instead")

Observer = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], None]


@dataclass
class TargetHead:
    """The target's final norm and its whole lm_head [V, H]: p_T over every target token."""

    norm: torch.Tensor
    rows: torch.Tensor
    eps: float

    def logits(self, last_hidden: torch.Tensor) -> torch.Tensor:
        x = rms_norm(last_hidden.to(self.rows.dtype), self.norm, self.eps)
        return (x @ self.rows.T).float()


@dataclass
class _Counts:
    """Per batch: the samples' positions, valid rows [B, K] and each method's summed acceptance [B, K];
    for the rounds, per sample: rounds and greedy credit [B] (``pending``: the batch being scored,
    its rows' data chain lengths, scored rows and credit [B, N], settled when the next one starts)."""

    positions: list[torch.Tensor] = field(default_factory=list)
    rows: list[torch.Tensor] = field(default_factory=list)
    accepted: dict[str, list[torch.Tensor]] = field(default_factory=lambda: {m: [] for m in METHODS})
    rounds: list[torch.Tensor] = field(default_factory=list)
    credit: list[torch.Tensor] = field(default_factory=list)
    pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=list)


class TemperatureTally:
    """The per-depth acceptance at each temperature of ``temperatures``, for both draft methods."""

    def __init__(self, temperatures: Sequence[float], steps: int, head: TargetHead, emit: torch.Tensor) -> None:
        self.temperatures = tuple(float(t) for t in temperatures)
        self.steps = steps
        self.head = head
        self.emit = emit            # [Vd] target id of each draft id
        self.counts = {t: _Counts() for t in self.temperatures}

    def observer(self, batch: Any, final_slot: int) -> Observer:
        """What ``score_batch`` calls at each step with the rows it computed, their logits and the
        data chain's rows still right before this step."""
        self._settle()
        bsz, n = batch.input_ids.shape
        final = batch.final(final_slot).reshape(bsz * n, -1)
        has_next = (batch.scored & (batch.next_ids >= 0)).reshape(-1)
        next_ids = batch.next_ids.reshape(-1)
        chain = torch.zeros(bsz * n, dtype=torch.long)
        per = {t: (torch.zeros(bsz, self.steps, dtype=torch.float64),
                   {m: torch.zeros(bsz, self.steps, dtype=torch.float64) for m in METHODS},
                   torch.zeros(bsz * n, dtype=torch.float64))
               for t in self.temperatures}
        for t in self.temperatures:
            c = self.counts[t]
            c.positions.append(batch.positions.cpu())
            c.rows.append(per[t][0])
            for m in METHODS:
                c.accepted[m].append(per[t][1][m])
            c.pending.append((chain.view(bsz, n), has_next.view(bsz, n).cpu(), per[t][2].view(bsz, n)))

        def observe(k: int, rows: torch.Tensor, logits: torch.Tensor, alive: torch.Tensor) -> None:
            ok = alive.reshape(-1)[rows].to(rows.device) & has_next[(rows + k).clamp(max=bsz * n - 1)].to(rows.device)
            ok &= (rows % n) + k < n
            if not bool(ok.any()):
                return
            sel, draft_logits = rows[ok], logits[ok.to(logits.device)]
            sample, flat = (sel // n).cpu(), sel.cpu()
            drafted = self.emit.to(draft_logits.device)[draft_logits.argmax(-1)].cpu()
            chain[flat] += (drafted == next_ids[(flat + k).to(next_ids.device)].cpu()).long()
            for lo in range(0, sel.numel(), CHUNK):
                part = slice(lo, lo + CHUNK)
                target = self.head.logits(final[(sel[part] + k).to(final.device)])
                for t in self.temperatures:
                    got = acceptance(target, draft_logits[part].float(), self.emit, t)
                    rows_t, acc, credit = per[t]
                    rows_t[:, k].index_add_(0, sample[part], torch.ones(sample[part].numel(), dtype=torch.float64))
                    for m in METHODS:
                        acc[m][:, k].index_add_(0, sample[part], got[m].double().cpu())
                    credit[flat[part]] += got[GREEDY].double().cpu()
        return observe

    def merge(self, others: Sequence[dict[float, _Counts]]) -> None:
        """Take the other ranks' counts (``state()``, on rank 0 of a torchrun); ``to_dict`` puts the
        samples back in one process's order by their positions."""
        for other in others:
            for t, theirs in other.items():
                mine = self.counts[t]
                mine.positions += theirs.positions
                mine.rows += theirs.rows
                mine.rounds += theirs.rounds
                mine.credit += theirs.credit
                for m in METHODS:
                    mine.accepted[m] += theirs.accepted[m]

    def state(self) -> dict[float, _Counts]:
        self._settle()
        return self.counts

    def _settle(self) -> None:
        """Replace the scored batch's rows by its per-sample rounds and credit (bounded memory)."""
        for c in self.counts.values():
            for chain, scored, credit in c.pending:
                starts = round_starts(chain, scored, self.steps)
                c.rounds.append(starts.sum(1).double())
                c.credit.append((credit * starts).sum(1))
            c.pending.clear()

    def to_dict(self, role: str, greedy_accept: float | None = None) -> dict[str, Any]:
        """The report's ``temperature``: per temperature and method, the conditional acceptance per
        depth, the rows behind each, and the accept length with its interval."""
        self._settle()
        out = []
        for t in self.temperatures:
            c = self.counts[t]
            if not c.positions:
                continue
            order = torch.argsort(torch.cat(c.positions), stable=True)
            rows = torch.cat(c.rows)[order]
            methods = {m: _predict(rows, torch.cat(c.accepted[m])[order], t) for m in METHODS}
            methods[GREEDY]["per_round"] = per_round(torch.cat(c.rounds)[order], torch.cat(c.credit)[order], t)
            out.append({"temperature": t, **methods})
        return {"steps": self.steps, "role": role, "definitions": DEFINITIONS, "level": LEVEL, "bootstrap": BOOTSTRAP,
                "interval": "percentile bootstrap over samples", "per_round": PER_ROUND,
                "greedy_at_zero": greedy_accept, "predictions": out}


def acceptance(target_logits: torch.Tensor, draft_logits: torch.Tensor, emit: torch.Tensor,
               temperature: float) -> dict[str, torch.Tensor]:
    """Per row, the probability the server accepts the drafted token at ``temperature`` under each
    method.  ``emit`` maps draft ids to target ids (tokens outside the draft vocabulary have q = 0)."""
    vocab = target_logits.shape[-1]
    ids = emit.to(target_logits.device).clamp(0, vocab - 1)
    inside = ((emit >= 0) & (emit < vocab)).to(target_logits.device)
    draft_logits = draft_logits.to(target_logits.device)
    pick = draft_logits.argmax(-1)
    if temperature == 0:
        hit = ((target_logits.argmax(-1) == ids[pick]) & inside[pick]).float()
        return {GREEDY: hit, PROBABILISTIC: hit}
    p = torch.softmax(target_logits / temperature, -1)
    q = torch.softmax(draft_logits / temperature, -1) * inside
    p_on_draft = p[:, ids] * inside              # [R, Vd]: p_T of each draft id's target token
    greedy = p_on_draft.gather(1, pick[:, None]).squeeze(1)
    return {GREEDY: greedy, PROBABILISTIC: torch.minimum(p_on_draft, q).sum(-1).clamp(max=1.0)}


def chain(rows: torch.Tensor, accepted: torch.Tensor) -> tuple[list[float | None], float]:
    """(conditional acceptance per depth, accept length 1 + Σ_k Π_{j≤k} α_j) of summed counts [K]."""
    cond: list[float | None] = []
    length, reach = 1.0, 1.0
    for k in range(rows.shape[-1]):
        alpha = float(accepted[k] / rows[k]) if float(rows[k]) > 0 else None
        cond.append(alpha)
        reach *= alpha if alpha is not None else 0.0
        length += reach
    return cond, length


def _predict(rows: torch.Tensor, accepted: torch.Tensor, temperature: float) -> dict[str, Any]:
    """One method's figures at one temperature from the per-sample counts [S, K]."""
    cond, length = chain(rows.sum(0), accepted.sum(0))
    return {"cond_acc": cond, "rows": [int(r) for r in rows.sum(0).tolist()], "accept_length": length,
            "ci": _interval(rows, accepted, temperature), "samples": int(rows.shape[0])}


def round_starts(chain: torch.Tensor, scored: torch.Tensor, steps: int) -> torch.Tensor:
    """[B, N] bool: the rows a greedy-draft server starts a round from, replaying ``metrics.walk``
    (a round from row t accepts ``chain[t]`` tokens, the verifier adds one, the next starts at
    t + chain[t] + 1; rounds start only where rows t..t+K-1 are all scored)."""
    b, n = chain.shape
    ok = scored.clone()
    for k in range(1, steps):
        ok[:, : n - k] &= scored[:, k:]
        ok[:, max(n - k, 0):] = False
    starts = torch.zeros(b, n, dtype=torch.bool)
    for i, (fine, gains) in enumerate(zip(ok.tolist(), chain.tolist(), strict=True)):
        t = 0
        while t < n:
            if not fine[t]:
                t += 1
                continue
            starts[i, t] = True
            t += gains[t] + 1
    return starts


def per_round(rounds: torch.Tensor, credit: torch.Tensor, temperature: float) -> dict[str, Any]:
    """Tokens per round 1 + Σ credit / Σ rounds over samples [S], with its percentile bootstrap interval."""
    rounds, credit = rounds.double(), credit.double()
    total = float(rounds.sum())
    value = 1.0 + float(credit.sum()) / total if total > 0 else None
    s, ci = rounds.shape[0], None
    if s >= 2 and value is not None:
        gen = torch.Generator().manual_seed(int(temperature * 1000) + s + 1)
        picks = torch.randint(0, s, (BOOTSTRAP, s), generator=gen)
        weights = torch.zeros(BOOTSTRAP, s, dtype=torch.float64).scatter_add_(
            1, picks, torch.ones(BOOTSTRAP, s, dtype=torch.float64))
        lengths = 1.0 + (weights @ credit) / (weights @ rounds).clamp(min=1e-12)
        lo, hi = torch.quantile(lengths, torch.tensor([(1 - LEVEL) / 2, (1 + LEVEL) / 2], dtype=torch.float64)).tolist()
        ci = [lo, hi] if math.isfinite(lo) and math.isfinite(hi) else None
    return {"accept_length": value, "ci": ci, "rounds": int(total), "samples": int(s)}


def _interval(rows: torch.Tensor, accepted: torch.Tensor, temperature: float) -> list[float] | None:
    """The accept length's 95% percentile bootstrap interval, resampling samples (seeded: the same
    counts give the same interval)."""
    s = rows.shape[0]
    if s < 2:
        return None
    gen = torch.Generator().manual_seed(int(temperature * 1000) + s)
    picks = torch.randint(0, s, (BOOTSTRAP, s), generator=gen)
    weights = torch.zeros(BOOTSTRAP, s, dtype=torch.float64).scatter_add_(
        1, picks, torch.ones(BOOTSTRAP, s, dtype=torch.float64))
    n, a = weights @ rows, weights @ accepted             # [R, K]
    alpha = torch.where(n > 0, a / n.clamp(min=1e-12), torch.zeros_like(a))
    lengths = 1.0 + alpha.cumprod(1).sum(1)
    lo, hi = torch.quantile(lengths, torch.tensor([(1 - LEVEL) / 2, (1 + LEVEL) / 2], dtype=torch.float64)).tolist()
    return [lo, hi] if math.isfinite(lo) and math.isfinite(hi) else None


def target_head(verifier: Any, vocab: int, device: torch.device, dtype: torch.dtype, eps: float) -> TargetHead:
    """The verifier's final norm and every lm_head row, on the draft's device."""
    rows = verifier.lm_head_rows(torch.arange(vocab)).to(device, dtype)
    return TargetHead(verifier.final_norm().to(device, dtype), rows, eps)
