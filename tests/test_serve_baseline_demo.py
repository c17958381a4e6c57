"""`invoke serve --baseline` on the built-in `local` host, whose only model is the generated demo: it
serves the demo's target (the baseline to hold `--draft demo` against), as `--draft demo` finds its
target; a host with a profile of its own and no target is refused with the flag that does it."""
from __future__ import annotations

from pathlib import Path

import pytest

from draftops.errors import ServeRefused
from draftops.inventory import HostSpec, local_host
from draftops.serve import profiles
from draftops.serve.request import Request, resolve


def test_baseline_on_local_with_no_target_serves_the_demo_target(tmp_path: Path):
    spec = local_host(tmp_path)
    chosen = profiles.resolve(spec)
    plan = resolve(Request(baseline=True), chosen, "/r/state/demo",
                   demo_baseline=spec.transport == "local" and chosen.builtin)
    assert (plan.launch.target, plan.launch.draft, plan.demo) == ("/r/state/demo/target", None, True)
    assert any("serving the generated demo's target" in note for note in plan.notes)
    same = resolve(Request(draft="demo"), chosen, "/r/state/demo", demo_baseline=True)
    assert same.launch.target == plan.launch.target and same.demo        # the pair compares
    mine = resolve(Request(baseline=True, target="/models/t"), chosen, "/r/state/demo", demo_baseline=True)
    assert (mine.launch.target, mine.demo) == ("/models/t", False)


def test_baseline_on_a_host_with_no_target_names_the_flag_for_the_demo():
    spec = HostSpec(name="box", address="box.example", engine="vllm")
    with pytest.raises(ServeRefused, match=r"has no `target:`.*`--baseline --target demo`"):
        resolve(Request(baseline=True), profiles.resolve(spec), "/demo")
    plan = resolve(Request(baseline=True, target="demo"), profiles.resolve(spec), "/r/state/demo")
    assert (plan.launch.target, plan.demo) == ("/r/state/demo/target", True)
