"""Shared helpers for the drafter tests: one demo per test process, quiet evaluations."""
from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.metadata
import io
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from benchmarks import speculators_peer
from remote.drafter import EvalOptions, evaluate
from remote.drafter.demo.build import DemoPaths, DemoSpec
from tests.support.demo_cache import cached_demo

SPEC = DemoSpec()
# docs/drafter.md: in fp32, |logits padded into a batch - logits alone| <= PAD_BOUND * (1 + max |logit|)
PAD_BOUND = 2e-6


@functools.lru_cache(maxsize=1)
def demo() -> DemoPaths:
    """This process's copy of the demo, from the cache kept between test runs (tests/support/demo_cache.py:
    built once per source version, verified before each use)."""
    root = Path(tempfile.mkdtemp(prefix="draftops-demo-"))
    atexit.register(shutil.rmtree, root, True)
    return DemoPaths(cached_demo(root / "demo", SPEC))


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


def load_speculators() -> tuple[Any, Any]:
    """(Eagle3DraftModel, Eagle3SpeculatorConfig) of speculators 0.9.0, or skip (fail in CI, where
    these tests are the check that the evaluator computes what training computed)."""
    if not speculators_peer.available():
        if os.environ.get("CI"):
            pytest.fail("speculators==0.9.0 and transformers are not installed (see docs/drafter.md)")
        pytest.skip("speculators==0.9.0 not installed")
    classes = speculators_peer.import_eagle3()
    assert importlib.metadata.version("speculators") == "0.9.0"
    return classes


def local_demo_project(root: Path) -> Path:
    """``root`` (a made project) as a user's checkout on the `local` host: this repository's tasks.py,
    the remote package, and this session's demo as generated in the host root's state."""
    from tests.conftest import REPO, copy_remote_package
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    copy_remote_package(root)
    shutil.copytree(demo().root, root / ".draftops" / "state" / "demo")
    return root


def task_project(base: Path, hosts: dict[str, dict[str, Any]], default: str, *, demo_roots: tuple[Path, ...] = (),
                 local_demo: bool = False) -> Path:
    """``base/project`` as a user's checkout: this repository's tasks.py and remote package, a hosts.yaml of
    ``hosts`` (``default`` the default), and this session's demo seeded into the state of each host root
    in ``demo_roots`` (so the host takes it as complete instead of generating it again) and, with
    ``local_demo``, into the project's own state (the `local` host's)."""
    import yaml

    from tests.conftest import REPO, copy_remote_package
    project = base / "project"
    project.mkdir()
    copy_remote_package(project)
    (project / "tasks.py").write_text((REPO / "tasks.py").read_text())
    (project / "hosts.yaml").write_text(yaml.safe_dump({"default": default, "hosts": hosts}))
    for root in demo_roots:
        shutil.copytree(demo().root, root / "state" / "demo")
    if local_demo:
        shutil.copytree(demo().root, project / ".draftops" / "state" / "demo")
    return project
