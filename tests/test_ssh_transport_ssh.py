"""The SSH transport's algorithm preferences (issue 13): the fast cipher when the server offers it,
and a server that offers only the older ones still works, host-key policy untouched."""
from __future__ import annotations

import pytest

from draftops.errors import HostKeyRejected
from draftops.link.host import open_host
from draftops.runs.sync import sync
from tests.conftest import ssh_entry
from tests.support.sshd import start_sshd

pytestmark = pytest.mark.ssh


def negotiated(host) -> tuple[str, str, str]:
    transport = host.transport.connection.transport
    return transport.remote_cipher, transport.local_cipher, transport.local_compression


def test_gcm_is_chosen_when_the_server_offers_it(make_project, sshd, tmp_path, no_inventory_env):
    project = make_project({"box": ssh_entry(sshd, tmp_path)}, "box")
    host = open_host(None, project)
    assert sync(host).upload == ["remote/__init__.py", "remote/job.py"]
    assert negotiated(host) == ("aes128-gcm@openssh.com", "aes128-gcm@openssh.com", "none")


def test_small_packets_are_sent_at_once(make_project, sshd, tmp_path, no_inventory_env):
    """TCP_NODELAY on the connection's socket: a command's input and its end-of-input are two small
    packets, and with Nagle's rule the second waited 40 ms for the host's delayed ACK."""
    import socket

    host = open_host(None, make_project({"box": ssh_entry(sshd, tmp_path)}, "box"))
    sock = host.transport.connection.transport.sock
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    assert host.transport.run("cat", input=b"x" * 1000).stdout == b"x" * 1000


def test_a_server_without_gcm_or_etm_still_syncs(make_project, client_key, tmp_path, no_inventory_env):
    old = start_sshd(tmp_path / "old-sshd", client_key,
                     extra_config="Ciphers aes256-ctr\nMACs hmac-sha2-512\n")
    try:
        project = make_project({"box": ssh_entry(old, tmp_path)}, "box")
        host = open_host(None, project)    # closed by the autouse fixture's close_all
        report = sync(host)
        assert report.upload and (tmp_path / "hostroot" / "code" / "remote" / "job.py").read_text() == "print('hi')\n"
        transport = host.transport.connection.transport
        assert (transport.local_cipher, transport.local_mac) == ("aes256-ctr", "hmac-sha2-512")
    finally:
        old.stop()


def test_strict_host_key_policy_still_refuses_an_unknown_key(make_project, sshd, tmp_path, no_inventory_env):
    project = make_project({"box": ssh_entry(sshd, tmp_path, host_key="strict")}, "box")
    with pytest.raises(HostKeyRejected, match="host_key: strict"):
        open_host(None, project, prepare=True)
    assert not (tmp_path / "known_hosts").exists()
