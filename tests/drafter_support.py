"""Shared helpers for the drafter tests: one demo per test process, quiet evaluations."""
from __future__ import annotations

import atexit
import contextlib
import functools
import io
import shutil
import tempfile
from pathlib import Path
from typing import Any

from remote.drafter import EvalOptions, evaluate
from remote.drafter.demo import DemoPaths, DemoSpec, ensure_demo

SPEC = DemoSpec()


@functools.lru_cache(maxsize=1)
def demo() -> DemoPaths:
    """Build the demo once per process (about 15 s on 2 cores) into a temp folder."""
    root = Path(tempfile.mkdtemp(prefix="draftops-demo-"))
    atexit.register(shutil.rmtree, root, True)
    with contextlib.redirect_stdout(io.StringIO()):
        return ensure_demo(root / "demo")


def run_eval(out: Path, **kw: Any) -> dict[str, Any]:
    """evaluate() on the demo by default, with its progress events swallowed."""
    d = demo()
    kw.setdefault("ckpt", d.draft)
    kw.setdefault("data", d.data)
    kw.setdefault("verifier", d.target)
    with contextlib.redirect_stdout(io.StringIO()):
        return evaluate(EvalOptions(out=out, **kw))


def layout_acc(report: dict[str, Any], layer_ids: list[int]) -> float:
    return next(r["acc"] for r in report["layouts"] if r["layer_ids"] == layer_ids)
