"""What a doctor is asked (``Args``) and the steps that follows from it, in order.

The order serves the draft as it is *before* the fix is applied, so no copy of the old draft is
needed: baseline, as served, then fix, re-check and the fixed server. A serve and the bench of that
server are one step: a server the doctor stopped when it was interrupted is no use to a resumed
bench, so a resumed doctor redoes the pair, never half of it.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from draftops import cmdline

CAPTURE, CHECK, BASELINE, AS_SERVED, FIX, RECHECK, FIXED, COMPARE = (
    "capture", "check", "baseline", "as-served", "fix", "recheck", "fixed", "compare")
TUNE = "tune"
SERVED_STEPS = (BASELINE, AS_SERVED, FIXED)     # each serves one server and benches it
TITLES = {CAPTURE: "capture-check: the engine's own states", CHECK: "test-drafter: the draft as it is",
          BASELINE: "serve + bench: the target alone (baseline)", AS_SERVED: "serve + bench: the draft as it is",
          FIX: "apply the fix", RECHECK: "test-drafter: the fixed draft",
          FIXED: "serve + bench: the fixed draft", COMPARE: "bench.compare: as served and fixed vs baseline",
          TUNE: "tune: the fastest settings for the fixed draft, predicted and confirmed"}
# the bench every served step runs: 144 demo prompts as 6 repeats of 24 (the seed engine test's traffic, 3 × 48,
# in more blocks: the comparison rule's interval rests on the repeats, docs/bench.md § Comparing two runs)
BENCH = {"dataset": "demo", "prompts": 24, "concurrency": 4, "output_len": 32, "repeats": 6}
BASELINE_MAX_AGE_H = 24.0


@dataclasses.dataclass(frozen=True)
class Args:
    """What the doctor was asked; a resumed doctor is asked the same, but for ``FREE`` (state.resume)."""

    draft: str
    data: str | None = None
    profile: str | None = None
    target: str | None = None
    fix: bool = False
    bench: bool = True
    capture: bool = False
    port: int | None = None
    keep_serving: bool = False
    fresh: bool = False
    tune: bool = False          # with --fix: `invoke tune` of the fixed draft as the last step

    # what a resume may change: the servers' port (a port taken since), how the run ends and whether a
    # baseline is reused; the rest decides which steps run and what they measure
    FREE = ("port", "keep_serving", "fresh")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def words(self) -> list[str]:
        """The options that ask for this doctor, one word each (``cmdline.command`` quotes them)."""
        parts = ["--draft", self.draft]
        parts += ["--data", self.data] if self.data else []
        parts += ["--profile", self.profile] if self.profile else []
        parts += ["--target", self.target] if self.target else []
        parts += ["--fix"] if self.fix else []
        parts += ["--no-bench"] if self.fix and not self.bench else []
        parts += ["--capture"] if self.capture else []
        parts += ["--port", str(self.port)] if self.port else []
        parts += ["--keep-serving"] if self.keep_serving else []
        parts += ["--tune"] if self.tune else []
        return parts

    def flags(self) -> str:
        """The options that ask for this doctor, each word shell-quoted (a folder `my draft;id`)."""
        return cmdline.quote(self.words())


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
        out += [TUNE] if args.tune else []
    return out
