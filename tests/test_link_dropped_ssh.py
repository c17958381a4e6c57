"""Transport failures are mapped inside draftops/link/ (issue 37, item 5): a link that drops during an
agent call, over the real sshd, surfaces as ``LinkDropped`` (a ConnectError, and an AgentError as
before) with its one paragraph, whatever the SSH library or socket raised underneath; what the
caller's own callback raises (a full disk while a pull writes) passes as it is."""
from __future__ import annotations

import errno
import time

import paramiko
import pytest

from draftops.errors import AgentError, ConnectError, LinkDropped, SyncError
from draftops.link.host import open_host
from draftops.runs import jobs, sync
from tests.conftest import ssh_entry

pytestmark = pytest.mark.ssh


@pytest.fixture
def host(make_project, sshd, tmp_path, no_inventory_env):
    project = make_project({"box": ssh_entry(sshd, tmp_path)}, default="box")
    host = open_host(None, project)
    host.prepare()
    return host


def one_paragraph(exc: BaseException, call: str) -> str:
    text = str(exc)
    assert text.startswith("Host 'box' (") and "\n\n" not in text
    assert f"the connection dropped during `{call}" in text and "Run the command again" in text
    return text


def drop_as_channels_open(host, sshd) -> None:
    """Kill the sshd child that serves this link as the next command's channel opens."""
    transport = host.transport.connection.transport
    opened = transport.open_session

    def open_then_drop(*args, **kwargs):
        channel = opened(*args, **kwargs)
        sshd.stop_sessions()
        time.sleep(0.5)
        return channel
    transport.open_session = open_then_drop


def test_a_link_killed_as_a_call_starts_is_link_dropped(host, sshd):
    job = jobs.start(host, "short", "echo done")
    drop_as_channels_open(host, sshd)
    with pytest.raises(LinkDropped) as caught:
        host.agent.status(job.id)
    assert isinstance(caught.value, ConnectError) and isinstance(caught.value, AgentError)
    one_paragraph(caught.value, f"status runs/{job.id}")
    assert caught.value.exit_code is None or caught.value.exit_code == -1
    assert host.agent.status(job.id)["id"] == job.id          # the next call connects again


def test_a_link_killed_during_a_stream_is_link_dropped(host, sshd):
    job = jobs.start(host, "long", "echo started; sleep 30")
    try:
        def drop(chunk: bytes) -> None:
            sshd.stop_sessions()
        with pytest.raises(LinkDropped) as caught:
            host.agent.follow(job.id, drop)
        assert isinstance(caught.value, ConnectError)
        assert f"follow runs/{job.id}" in str(caught.value)
    finally:
        jobs.kill(host, job.id)


def test_a_channel_closed_during_a_stream_is_link_dropped(host):
    job = jobs.start(host, "long", "echo started; sleep 30")
    try:
        def close(chunk: bytes) -> None:
            host.transport.connection.transport.close()
        with pytest.raises(LinkDropped):
            host.agent.follow(job.id, close)
    finally:
        jobs.kill(host, job.id)


def test_sync_over_a_dropped_link_says_what_state_the_files_are_in(host, sshd):
    drop_as_channels_open(host, sshd)
    with pytest.raises(SyncError) as caught:
        sync.sync(host)
    assert isinstance(caught.value.__cause__, LinkDropped)
    assert "sync failed" in str(caught.value) and "run `invoke sync` again" in str(caught.value)


def test_the_callers_own_error_is_not_taken_for_the_link(host):
    job = jobs.start(host, "short", "echo done")
    time.sleep(1)

    def full_disk(chunk: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(OSError) as caught:
        host.agent.pack(job.id, full_disk)
    assert not isinstance(caught.value, LinkDropped) and caught.value.errno == errno.ENOSPC


class Failing:
    """The transport boundary failing as each library does: every call raises ``error``."""

    def __init__(self, error: BaseException):
        self.error = error

    def run(self, *args, **kwargs):
        raise self.error

    def stream(self, *args, **kwargs):
        raise self.error

    def run_standby(self, *args, **kwargs):
        raise self.error

    def stream_standby(self, *args, **kwargs):
        raise self.error


@pytest.mark.parametrize("error", [EOFError(), OSError("Socket is closed"),
                                   paramiko.SSHException("Unable to open channel."),
                                   ConnectionResetError(104, "Connection reset by peer")],
                         ids=["EOFError", "OSError", "SSHException", "reset"])
def test_each_kind_of_transport_failure_maps_to_link_dropped(host, error):
    host.agent.transport = Failing(error)
    for call, what in [(lambda: host.agent.status("r1"), "status runs/r1"),
                       (lambda: host.agent.tail("r1", 5, lambda chunk: None), "tail runs/r1 5"),
                       (lambda: host.agent.quick("true", None), "true")]:
        with pytest.raises(LinkDropped) as caught:
            call()
        one_paragraph(caught.value, what)
        assert type(error).__name__ in str(caught.value) and caught.value.__cause__ is error
