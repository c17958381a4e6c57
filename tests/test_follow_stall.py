"""A `--follow` whose link goes silent longer than the keeper's keepalive bound (it then closes the
link) re-attaches where the stream stopped and reaches the job's end: the job lives on without the
link. A real job on the local host and the real agent stream; the stall is held inside the stream's
consumer, then the stream is cut as the keeper cuts a silent link."""
from __future__ import annotations

import threading
import time

import pytest

from draftops.errors import FailedCommand, JobError, RemoteError
from draftops.link.host import open_host
from draftops.link.keeper import LINK_S
from draftops.runs import jobs
from tests.conftest import ssh_entry


@pytest.fixture
def host(make_project, tmp_path, no_inventory_env):
    project = make_project({"here": {"transport": "local", "root": str(tmp_path / "hostroot")}}, default="here")
    return open_host(None, project)


def stalling(host, stall_s: float, cuts: int = 1):
    """The host's real ``agent.follow``, whose first ``cuts`` streams stall ``stall_s`` after their first
    chunk and are then cut (the link is gone: no exit status); a re-attach among them finds the link down."""
    real = host.agent.follow
    calls = []

    def follow(run_id, on_output, **kw):
        calls.append(kw["offset"])
        if len(calls) > cuts:
            return real(run_id, on_output, **kw)
        if len(calls) > 1:
            raise RemoteError("the link is down", FailedCommand(host.name, "follow", None))

        def feed(chunk: bytes) -> None:
            on_output(chunk)
            time.sleep(stall_s)
            raise RemoteError("the link went silent", FailedCommand(host.name, "follow", None))

        return real(run_id, feed, **kw)

    host.agent.follow = follow
    return calls


def test_a_follow_outlives_a_stall_longer_than_the_link_bound_and_reaches_the_jobs_end(host, monkeypatch):
    monkeypatch.setattr(jobs, "REATTACH_PAUSE_S", 0.1, raising=False)
    job = jobs.start(host, "stall", f"echo one; sleep 1; echo two; sleep {LINK_S + 4:g}; echo three; exit 3")
    calls = stalling(host, LINK_S + 1)
    lines: list[str] = []
    final = jobs.follow(host, job.id, lines.append)
    assert final["state"] == "failed" and final["exit_code"] == 3
    said = [x for x in lines if x.startswith("[draftops]")]
    assert len(said) == 1 and "went silent or dropped" in said[0] and "re-attaching at byte 4" in said[0]
    assert [x for x in lines if not x.startswith("[draftops]")] == ["one", "two", "three"]
    assert calls == [0, 4]              # re-attached at the byte the cut stream stopped at, nothing twice


def test_a_follow_with_lines_re_attaches_after_the_shown_tail(host, monkeypatch):
    monkeypatch.setattr(jobs, "REATTACH_PAUSE_S", 0.1, raising=False)
    job = jobs.start(host, "tail", "echo a; echo b; sleep 2; echo c")
    time.sleep(0.5)
    stalling(host, 0.1)
    lines: list[str] = []
    final = jobs.follow(host, job.id, lines.append, lines=1)
    assert final["state"] == "succeeded"
    assert [x for x in lines if not x.startswith("[draftops]")] == ["b", "c"]


def test_the_retrying_is_bounded_and_then_says_how_to_re_attach(host, monkeypatch):
    monkeypatch.setattr(jobs, "REATTACH_PAUSE_S", 0.05, raising=False)
    monkeypatch.setattr(jobs, "REATTACH_S", 0.5, raising=False)
    job = jobs.start(host, "gone", "echo x; sleep 30")
    stalling(host, 0.0, cuts=1000)
    lines: list[str] = []
    with pytest.raises(JobError, match="re-attaching did not work for 0.5 s") as err:
        jobs.follow(host, job.id, lines.append)
    assert f"logs {job.id} --follow" in str(err.value)
    assert sum(x.startswith("[draftops]") for x in lines) == 1
    jobs.kill(host, job.id)


@pytest.mark.ssh
def test_a_follow_over_ssh_re_attaches_after_the_link_drops_and_reaches_the_jobs_end(make_project, sshd, tmp_path,
                                                                                   no_inventory_env, monkeypatch):
    """Over a real sshd: the connection is closed under a running follow (as the keeper closes a silent
    link); the follow reconnects, re-attaches at the byte it stopped at and sees the job end."""
    monkeypatch.setattr(jobs, "REATTACH_PAUSE_S", 0.2, raising=False)
    host = open_host(None, make_project({"box": ssh_entry(sshd, tmp_path)}, default="box"))
    job = jobs.start(host, "drop", "echo one; sleep 2; echo two; sleep 1; echo three; exit 5")
    lines: list[str] = []

    def on_text(line: str) -> None:
        lines.append(line)
        if line == "one":
            threading.Timer(0.3, host.transport.close).start()

    final = jobs.follow(host, job.id, on_text)
    assert final["state"] == "failed" and final["exit_code"] == 5
    assert [x for x in lines if not x.startswith("[draftops]")] == ["one", "two", "three"]
    assert sum(x.startswith("[draftops]") and "re-attaching at byte 4" in x for x in lines) == 1
