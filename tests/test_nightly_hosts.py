"""`run_hosts`: every host's night in a thread of one pool, all at once, one outcome per host in the
order given; a host whose run raises gets an outcome naming the error and the others still finish.
(tests/test_nightly_run_ssh.py runs real nights over sshd; this holds the pool's contract alone.)"""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from draftops.nightly import runner
from draftops.nightly.runner import HostNight, HostOutcome


def test_hosts_run_at_once_and_a_crash_is_that_hosts_outcome(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hosts = {f"h{i}": f"/r{i}" for i in range(5)}
    # every night waits for all the others: run one after another, the first one's wait breaks
    together = threading.Barrier(len(hosts), timeout=60)

    def night(self: HostNight) -> HostOutcome:
        together.wait()
        if self.host == "h2":
            raise OSError("disk full")
        return HostOutcome(self.host, started=self.root)

    monkeypatch.setattr(HostNight, "run", night)
    outcomes = runner.run_hosts(None, hosts, tmp_path, tmp_path / "night")  # type: ignore[arg-type]
    assert [o.host for o in outcomes] == list(hosts)
    assert [o.started for o in outcomes if o.host != "h2"] == ["/r0", "/r1", "/r3", "/r4"]
    crashed = outcomes[2]
    assert crashed.error == "the host's run raised OSError: disk full" and crashed.failed


def test_more_hosts_than_the_pool_holds_all_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "MAX_PARALLEL_HOSTS", 2)
    monkeypatch.setattr(HostNight, "run", lambda self: HostOutcome(self.host))
    hosts = {f"h{i}": "" for i in range(5)}
    assert [o.host for o in runner.run_hosts(None, hosts, tmp_path, tmp_path)] == list(hosts)  # type: ignore[arg-type]
    assert runner.run_hosts(None, {}, tmp_path, tmp_path) == []  # type: ignore[arg-type]
