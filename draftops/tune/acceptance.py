"""The acceptance profile tune predicts from: test-drafter's per-position conditional acceptance
(``metrics.served.<basis>.cond_acc``, unrolled to K_max) and, to check it, a server's own per-position
counters (vLLM's ``/metrics``, made conditional by bench: ``BenchResult.per_position``)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from draftops.tune.profile import AcceptanceProfile

if TYPE_CHECKING:
    from draftops.bench.result import PerPosition
    from draftops.documents.drafter_report import Counts, DrafterReport


def counts(report: DrafterReport) -> Counts | None:
    """The served layout's figures on the report's own basis (verifier targets, else the data)."""
    served = report.metrics.served
    if served is None:
        return None
    chosen = served.verifier if report.metrics.basis == "verifier" else served.data
    return chosen or served.data or served.verifier


def _leading(values: list[float | None] | None) -> tuple[float, ...]:
    """The rates up to the first missing one (a depth no row reached ends the profile)."""
    out: list[float] = []
    for v in values or []:
        if v is None:
            break
        out.append(float(v))
    return tuple(out)


def from_report(report: DrafterReport) -> AcceptanceProfile | None:
    """The draft's profile from test-drafter's report; None when it holds no per-position figure."""
    found = counts(report)
    rates = _leading(found.cond_acc if found else None)
    if not rates or found is None:
        return None
    samples = (found.cond_total or [0])[0]
    return AcceptanceProfile(conditional=rates, samples=int(samples), source=f"report:{report.metrics.basis}")


def from_server(measured: PerPosition, engine: str = "vllm") -> AcceptanceProfile | None:
    """A server's profile from its per-position counters; None when the server gave none."""
    rates = _leading(measured.conditional) if measured.available else ()
    if not rates:
        return None
    return AcceptanceProfile(conditional=rates, samples=int(measured.drafts or 0), source=f"server:{engine}")
