"""Known engine regressions of EAGLE-3 acceptance, as data: per engine, the version range the sources
confirm as affected, the issue, and the release (or change) that fixed it. The drafter's finding
``engine-known-regression`` (remote/drafter/causes/engine_version.py) names the entry when the host's
engine version is in a range. Only ranges read in the sources are listed (docs/drafter.md § Findings);
an issue with no confirmed range (vllm #26191: "main" below a release; vllm #40551; sglang #14063,
a server flag) is left out rather than guessed. Stdlib only.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .convention import SGLANG, VLLM


@dataclass(frozen=True)
class Regression:
    """One regression: ``engine`` versions ``first``..``last`` (inclusive) are confirmed affected."""

    engine: str
    first: str
    last: str
    issue: str                  # where it is reported
    what: str                   # what happens to acceptance, in one clause
    fixed_in: str | None        # the release that fixed it; None: no release the sources confirm
    fix: str                    # what to do (the change that fixes it, when no release is confirmed)
    targets: str | None = None  # a regex on the target's model_type/architectures it is limited to


REGRESSIONS: tuple[Regression, ...] = (
    Regression(
        VLLM, "0.17.1", "0.19.1", "vllm #41838",
        "acceptance length falls steadily over hours of serving with prefix caching on (3.07 to 2.8 in the "
        "report) and only a restart restores it; the reporter saw it on 0.17.1 and on 0.19.1",
        None,
        "apply vllm PR #42359 (the reporter's 24-hour run on 0.19.1 with it showed no decay; it did not help "
        "0.17.1), or restart the server on a schedule until a release carries it"),
    Regression(
        SGLANG, "0.5.5.post3", "0.5.5.post3", "SpecForge #310 (sglang PR #13904)",
        "Qwen2.5-VL/Qwen3-VL targets lose the aux hidden states in the logits processor: accept length about "
        "1.0 (2.195 on 0.5.4)",
        None,
        "serve with sglang 0.5.4, or a build with sglang PR #13904 (merged 2025-11-25)",
        targets=r"(?i)qwen[23](_5)?_?vl"),
)

_POST = re.compile(r"\.?post(\d+)")


def version_key(version: str) -> tuple[int, ...] | None:
    """``"0.5.5.post3"`` -> (0, 5, 5, 0, 3): four release numbers, then the post number (0 without)."""
    m = re.match(r"v?(\d+(?:\.\d+)*)", version.strip())
    if not m:
        return None
    nums = [int(p) for p in m.group(1).split(".")][:4]
    post = _POST.search(version[m.end():])
    return (*nums, *([0] * (4 - len(nums))), int(post.group(1)) if post else 0)


def affecting(engine: str, version: str | None, target_type: str = "") -> list[Regression]:
    """The regressions whose range holds ``engine`` at ``version`` (none for an unknown version)."""
    key = version_key(version) if version else None
    if key is None:
        return []
    found = []
    for r in REGRESSIONS:
        first, last = version_key(r.first), version_key(r.last)
        if r.engine != engine or first is None or last is None or not first <= key <= last:
            continue
        if r.targets is not None and not re.search(r.targets, target_type):
            continue
        found.append(r)
    return found
