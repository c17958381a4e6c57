"""Port claims whose `invoke serve` call is gone (killed between claiming the port and registering its
run): stale, shown as such, cleaned by `serve.stop --all` and by the next `serve`, never alive."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.support.serving import ok, project, registry  # noqa: F401
from tests.support.tasks import invoke

pytestmark = pytest.mark.ssh

#: what `invoke serve` writes before its server starts, made by a process that then ends (as one killed
#: inside its claim window): lifecycle.claim_entry, the function launch() claims the port with
CLAIMER = ("import json; from tests.test_serve_checks import plan_for; from draftops.serve import lifecycle; "
           "print(json.dumps(lifecycle.claim_entry(plan_for('sglang', baseline=True))))")


def claim_left_by_a_dead_call(state: Path, port: int) -> dict:
    """Claim ``port`` in the host registry under ``state`` as a since-ended `invoke serve` process did."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    made = subprocess.run([sys.executable, "-c", CLAIMER], capture_output=True, text=True, env=env, check=True)
    entry = json.loads(made.stdout)
    put = subprocess.run([sys.executable, "-m", "remote.serve", "servers", "--state", str(state), "put", str(port),
                          "--exclusive"], input=json.dumps(entry), capture_output=True, text=True, cwd=REPO,
                         check=True)
    assert json.loads(put.stdout)["written"] is True
    return entry


def host_state(root: Path, where: str) -> Path:
    return Path(registry(root)[where]["root"]) / "state"


@pytest.mark.parametrize("where", ["box", "loc"])
def test_a_claim_whose_serve_call_is_gone_is_stale_and_stop_all_cleans_it(project, where):  # noqa: F811
    root = project(where)
    port = registry(root)[where]["serve"]["default"]["port"]
    claim_left_by_a_dead_call(host_state(root, where), port)
    status = ok(invoke(root, "serve.status"))
    row = next(line for line in status.splitlines() if f"│ {port} " in line or line.startswith(f"port {port} "))
    assert "stale claim" in row and "alive" not in row, status
    stopped = " ".join(ok(invoke(root, "serve.stop", "--all")).split())
    assert f"port {port}" in stopped and "skipped" not in stopped, stopped
    assert not (host_state(root, where) / "servers" / f"{port}.json").exists()
    assert "no draftops servers" in ok(invoke(root, "serve.status"))


def test_the_next_serve_takes_over_a_stale_claim_at_once(project):  # noqa: F811
    root = project("loc")
    port = registry(root)["loc"]["serve"]["default"]["port"]
    claim_left_by_a_dead_call(host_state(root, "loc"), port)
    out = " ".join(ok(invoke(root, "serve", "--baseline")).split())
    assert f"forgot the stale claim on port {port}" in out and "ready: SGLang" in out
    assert "alive" in ok(invoke(root, "serve.status"))
    ok(invoke(root, "serve.stop", "--all"))


def test_a_claim_of_a_live_serve_call_still_reads_as_starting() -> None:
    """The claimer check must not call a claim stale while its `invoke serve` still runs (here: this test)."""
    from draftops.serve import lifecycle
    from tests.support.serve_plans import plan_for
    entry = lifecycle.claim_entry(plan_for("sglang", baseline=True))
    assert lifecycle.claim_state(entry, lifecycle._epoch(entry["created"]) or 0.0) == "starting"
    gone = {**entry, "claimer": {**entry["claimer"], "started": "1"}}       # same pid, another start: recycled
    assert lifecycle.claim_state(gone, lifecycle._epoch(entry["created"]) or 0.0) == lifecycle.STALE
