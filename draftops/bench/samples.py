"""A bench result's repeats as blocks for the comparison rule (draftops.comparison): one value per
repeat and, where the client saved per-request samples, the within-repeat noise they show."""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from draftops.bench.result import BenchResult, Metrics
from draftops.bench.stats import summarize
from draftops.comparison import Blocks

KEYS = ("output_len", "ttft_ms", "latency_ms")
MIN_REQUESTS = 4          # fewer requests in a repeat say nothing about its noise


def _samples(res: BenchResult) -> list[dict[str, list[float]] | None]:
    out: list[dict[str, list[float]] | None] = []
    for rep in res.repeats:
        got = (rep.record or {}).get("samples")
        ok = isinstance(got, dict) and all(isinstance(got.get(k), list) for k in KEYS)
        out.append(got if ok else None)
    return out


def _sd(values: Sequence[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def _throughput_noise(s: dict[str, list[float]]) -> float | None:
    """Standard error of log(Σ tokens / Σ latency) over the repeat's requests (delta method): how much
    the repeat's throughput would move with another draw of its requests."""
    out, lat = s["output_len"], s["latency_ms"]
    if len(out) < MIN_REQUESTS or not sum(lat) or not sum(out):
        return None
    mo, ml = statistics.fmean(out), statistics.fmean(lat)
    return _sd([o / mo - t / ml for o, t in zip(out, lat, strict=False)]) / math.sqrt(len(out))


def _tpots(s: dict[str, list[float]]) -> list[float]:
    return [(t - f) / (o - 1) for o, f, t in zip(s["output_len"], s["ttft_ms"], s["latency_ms"], strict=False)
            if o > 1 and t > f]


def _median_block(values: list[float]) -> tuple[float, float] | None:
    """(median, standard error of its log) of one repeat's per-request latencies."""
    logs = [math.log(v) for v in values if v > 0]
    if len(logs) < MIN_REQUESTS:
        return None
    return statistics.median(values), 1.2533 * _sd(logs) / math.sqrt(len(logs))


LATENCY: dict[str, Callable[[dict[str, list[float]]], list[float]]] = {
    "ttft": lambda s: list(s["ttft_ms"]), "tpot": _tpots}
REPEAT_FIELD = {"throughput": "output_throughput", "ttft": "ttft_median_ms", "tpot": "tpot_median_ms"}


def _stat_values(res: BenchResult, metric: str) -> list[float | None]:
    return list(getattr(res.metrics, REPEAT_FIELD[metric]).values)


def blocks(res: BenchResult, metric: str) -> Blocks:
    """``throughput`` (output tok/s), ``ttft`` or ``tpot`` (median ms) of each repeat; the within-repeat
    noise only when every repeat kept its per-request samples (an older result folder has none)."""
    samples = _samples(res)
    have = bool(samples) and all(s is not None for s in samples)
    if metric == "throughput":
        values = _stat_values(res, metric)
        within = [_throughput_noise(s) for s in samples if s is not None] if have else []
        return Blocks(values, [w for w in within if w is not None] if have and all(w is not None for w in within)
                      else None)
    if have:
        got = [_median_block(LATENCY[metric](s)) for s in samples if s is not None]
        if all(g is not None for g in got):
            return Blocks([g[0] for g in got if g], [g[1] for g in got if g])
    return Blocks(_stat_values(res, metric))


def accept_blocks(res: BenchResult) -> Blocks:
    """The measured accept length of each repeat (the client's, else the server's)."""
    acc = res.accept_length
    if acc is None:
        return Blocks([])
    stat = acc.client if acc.client is not None and acc.client.n else acc.server
    return Blocks(list(stat.values) if stat else [])


def has_samples(res: BenchResult) -> bool:
    return bool(res.repeats) and all(s is not None for s in _samples(res))


def describe(res: BenchResult) -> dict[str, Any]:
    """How many requests the run's samples hold, per repeat (for compare.json)."""
    return {"per_request": has_samples(res), "requests": [len(s["output_len"]) if s else 0 for s in _samples(res)]}


def merged(b: BenchResult, extra: BenchResult) -> BenchResult:
    """Run B with the repeats of a second bench of the same server (the doctor's extra repeats) appended,
    as one run: every per-repeat metric, the accept length's repeats and the per-request samples."""
    fields = {name: summarize([*getattr(b.metrics, name).values, *getattr(extra.metrics, name).values])
              for name in Metrics.model_fields if name not in ("completed", "failed")}
    metrics = Metrics(**fields, completed=_add(b.metrics.completed, extra.metrics.completed),
                      failed=_add(b.metrics.failed, extra.metrics.failed))
    accept = b.accept_length
    if accept is not None and extra.accept_length is not None:
        both = {side: summarize([*(getattr(accept, side).values if getattr(accept, side) else []),
                                 *(getattr(extra.accept_length, side).values
                                   if getattr(extra.accept_length, side) else [])])
                for side in ("client", "server")}
        accept = accept.model_copy(update={side: stat if stat.n else None for side, stat in both.items()})
    shift = max((r.index for r in b.repeats), default=0)
    repeats = [*b.repeats, *(r.model_copy(update={"index": r.index + shift}) for r in extra.repeats)]
    settings = b.settings.model_copy(update={"repeats": len(repeats)})
    return b.model_copy(update={"metrics": metrics, "accept_length": accept, "repeats": repeats,
                                "settings": settings})


def _add(x: int | None, y: int | None) -> int | None:
    return None if x is None and y is None else (x or 0) + (y or 0)
