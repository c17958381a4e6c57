"""What a doctor is asked (``Args``) and the steps that follows from it, in order.

The order serves the draft as it is *before* the fix is applied, so no copy of the old draft is
needed: baseline, as served, then fix, re-check and the fixed server. A serve and the bench of that
server are one step: a server the doctor stopped when it was interrupted is no use to a resumed
bench, so a resumed doctor redoes the pair, never half of it.
"""
from __future__ import annotations

import dataclasses
from typing import Any

CAPTURE, CHECK, BASELINE, AS_SERVED, FIX, RECHECK, FIXED, COMPARE = (
    "capture", "check", "baseline", "as-served", "fix", "recheck", "fixed", "compare")
SERVED_STEPS = (BASELINE, AS_SERVED, FIXED)     # each serves one server and benches it
TITLES = {CAPTURE: "capture-check: the engine's own states", CHECK: "test-drafter: the draft as it is",
          BASELINE: "serve + bench: the target alone (baseline)", AS_SERVED: "serve + bench: the draft as it is",
          FIX: "apply the fix", RECHECK: "test-drafter: the fixed draft",
          FIXED: "serve + bench: the fixed draft", COMPARE: "bench.compare: as served and fixed vs baseline"}
# the bench every served step runs: 144 demo prompts as 6 repeats of 24 (the seed engine test's traffic, 3 × 48,
# in more blocks: the comparison rule's interval rests on the repeats, docs/bench.md § Comparing two runs)
BENCH = {"dataset": "demo", "prompts": 24, "concurrency": 4, "output_len": 32, "repeats": 6}
BASELINE_MAX_AGE_H = 24.0


@dataclasses.dataclass(frozen=True)
class Args:
    """What the doctor was asked; a resumed doctor must be asked the same (``same_as``)."""

    draft: str
    data: str | None = None
    profile: str | None = None
    fix: bool = False
    bench: bool = True
    capture: bool = False
    port: int | None = None
    keep_serving: bool = False
    fresh: bool = False

    # what a resume may change: how the run ends and whether a baseline is reused
    FREE = ("keep_serving", "fresh")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Args:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})

    def differences(self, other: Args) -> list[str]:
        """The fields that differ from ``other``'s (those a resume may change left out)."""
        mine, theirs = self.to_dict(), other.to_dict()
        return [k for k in mine if k not in self.FREE and mine[k] != theirs[k]]

    def flags(self) -> str:
        """The command line that asks for this doctor."""
        parts = [f"--draft {self.draft}"]
        parts += [f"--data {self.data}"] if self.data else []
        parts += [f"--profile {self.profile}"] if self.profile else []
        parts += ["--fix"] if self.fix else []
        parts += ["--no-bench"] if self.fix and not self.bench else []
        parts += ["--capture"] if self.capture else []
        parts += [f"--port {self.port}"] if self.port else []
        parts += ["--keep-serving"] if self.keep_serving else []
        return " ".join(parts)


def steps(args: Args) -> list[str]:
    """The steps of a doctor asked ``args``, in order."""
    out = [CAPTURE] if args.capture else []
    out.append(CHECK)
    if not args.fix:
        return out
    if args.bench:
        out += [BASELINE, AS_SERVED]
    out += [FIX, RECHECK]
    if args.bench:
        out += [FIXED, COMPARE]
    return out
