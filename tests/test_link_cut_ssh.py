"""A link that drops at every point of a call, between the client and a real sshd: during the
handshake, during authentication, as the command's channel opens and while its input travels. Each
drop is one paragraph that says the connection dropped: never a traceback, and never "rejected key"."""
from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from draftops.errors import AuthFailed, DraftopsError
from draftops.inventory import HostSpec
from draftops.link.connection import SSHTransport
from tests.conftest import REPO, ssh_entry
from tests.support.listeners import listen
from tests.support.tasks import invoke

pytestmark = pytest.mark.ssh


class CutProxy:
    """Forwards a local port to ``target``; every connection through it is cut (both ways) when the
    client sends its ``cut_at``-th chunk, which lands the cut at one fixed point of the SSH exchange."""

    def __init__(self, target: int, cut_at: int):
        self.target, self.cut_at = target, cut_at
        self.listener = listen(self._forward)
        self.port = self.listener.getsockname()[1]

    def _forward(self, client: socket.socket) -> None:
        server = socket.create_connection(("127.0.0.1", self.target))
        threading.Thread(target=self._up, args=(client, server), daemon=True).start()
        threading.Thread(target=self._down, args=(server, client), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket) -> None:
        chunks = 0
        while True:
            try:
                data = client.recv(1 << 16)
            except OSError:
                data = b""
            chunks += 1
            if not data or chunks >= self.cut_at:
                for end in (client, server):
                    try:
                        end.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    end.close()
                return
            server.sendall(data)

    @staticmethod
    def _down(server: socket.socket, client: socket.socket) -> None:
        while True:
            try:
                data = server.recv(1 << 16)
                if not data:
                    return
                client.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def cut_proxy(sshd) -> Iterator[type[CutProxy]]:
    made: list[CutProxy] = []

    def make(cut_at: int) -> CutProxy:
        made.append(CutProxy(sshd.port, cut_at))
        return made[-1]
    yield make    # type: ignore[misc]
    for proxy in made:
        proxy.close()


@pytest.mark.parametrize("cut_at", range(2, 12))
def test_a_link_cut_anywhere_in_a_call_is_one_paragraph_not_a_traceback_or_a_rejected_key(
        sshd, cut_proxy, tmp_path, cut_at):
    proxy = cut_proxy(cut_at)
    entry = ssh_entry(sshd, tmp_path, port=proxy.port, connect_timeout=2)
    spec = HostSpec.model_validate({"name": "box", "transport": "ssh", **entry})
    try:
        transport = SSHTransport(spec)
        result = transport.run("cat", input=b"x" * (3 << 20), check=False)
    except AuthFailed as exc:
        pytest.fail(f"a dropped link was reported as a rejected key: {exc}")
    except DraftopsError as exc:
        assert "Host 'box'" in str(exc)
        return
    # the connection may also drop after the command ran: no exit status came back, and it says so
    assert result.exit_code == -1 and b"dropped" in result.stderr, (result.exit_code, result.stderr[-300:])


def test_invoke_through_a_link_that_drops_as_the_channel_opens_has_no_traceback(
        make_project, sshd, cut_proxy, tmp_path, no_inventory_env):
    proxy = cut_proxy(7)       # past authentication, as the first command's channel opens
    project = make_project({"box": ssh_entry(sshd, tmp_path, port=proxy.port, connect_timeout=2)}, "box")
    (project / "tasks.py").write_text((REPO / "tasks.py").read_text())
    done = invoke(project, "runs", env={"DRAFTOPS_PERSIST": "0"})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "error: Host 'box'" in done.stderr, done.stderr
    assert "dropped" in done.stderr, done.stderr


@pytest.mark.parametrize("cut_at", [7, 10])   # as the boot's channel opens; after it started
def test_a_boot_cut_off_by_the_link_is_not_called_a_missing_python(
        make_project, sshd, cut_proxy, tmp_path, no_inventory_env, cut_at):
    proxy = cut_proxy(cut_at)
    project = make_project({"box": ssh_entry(sshd, tmp_path, port=proxy.port, connect_timeout=2)}, "box")
    (project / "tasks.py").write_text((REPO / "tasks.py").read_text())
    done = invoke(project, "runs", env={"DRAFTOPS_PERSIST": "0"})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "needs a python3" not in done.stderr and "could not start" not in done.stderr, done.stderr
    assert "dropped" in done.stderr and "invoke runs" in done.stderr, done.stderr
