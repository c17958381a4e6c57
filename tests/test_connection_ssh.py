"""Connecting for real: jump hosts, host-key policy, and every bad input with a clear error."""
from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from draftops.errors import AuthFailed, HostKeyRejected, HostUnreachable, InventoryError, RootError
from draftops.link.host import open_host
from draftops.runs import jobs
from draftops.runs.sync import sync
from tests.conftest import REPO, small_tmpfs, ssh_entry
from tests.support.forwarding import _forwarded_to
from tests.support.sshd import free_port, keygen
from tests.support.tasks import invoke

pytestmark = pytest.mark.ssh


def tcp_connections() -> set[tuple[str, int]]:
    """(socket inode, remote port) of this process's established TCP connections (from /proc: the
    servers it talks to directly, as opposed to through a channel of another connection)."""
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "01" and fields[9] in inodes:      # 01: ESTABLISHED
                found.add((fields[9], int(fields[2].rsplit(":", 1)[1], 16)))
    return found


def assert_only_the_first_hop_is_direct(before: set[tuple[str, int]], first, behind) -> None:
    """Of the TCP connections opened since ``before``, one goes to the first hop and none to the
    servers behind it: those are reached through SSH channels (a client that ignored `jump` would
    open one to the target). Connections other tests left open do not count."""
    peers = {port for _inode, port in tcp_connections() - before}
    assert first.port in peers, f"no new TCP connection to the first hop {first.port}: {peers}"
    for server in behind:
        assert server.port not in peers, f"a direct TCP connection to {server.port}, not through the jump"


def test_jump_host_by_entry_name_goes_through_the_gateway(make_project, sshd, jump_sshd, tmp_path,
                                                          no_inventory_env):
    hosts = {"bastion": ssh_entry(jump_sshd, tmp_path),
             "gpu": ssh_entry(sshd, tmp_path, jump="bastion")}
    project = make_project(hosts, default="gpu")
    before, connections = _forwarded_to(jump_sshd, sshd.port), tcp_connections()
    host = open_host(None, project, prepare=True)
    assert host.transport.run("echo via-jump").text.strip() == "via-jump"
    assert_only_the_first_hop_is_direct(connections, jump_sshd, [sshd])
    assert _forwarded_to(jump_sshd, sshd.port) > before       # the bastion opened the channel to the target


def test_jump_host_as_user_at_host_port(make_project, sshd, jump_sshd, tmp_path, no_inventory_env):
    entry = ssh_entry(sshd, tmp_path, jump=f"root@127.0.0.1:{jump_sshd.port}")
    project = make_project({"gpu": entry}, default="gpu")
    before, connections = _forwarded_to(jump_sshd, sshd.port), tcp_connections()
    assert open_host(None, project).transport.run("echo ok").text.strip() == "ok"
    assert_only_the_first_hop_is_direct(connections, jump_sshd, [sshd])
    assert _forwarded_to(jump_sshd, sshd.port) > before


def test_the_direct_connection_check_sees_a_direct_connection(make_project, sshd, jump_sshd, tmp_path,
                                                              no_inventory_env):
    """The check above can fail: without `jump`, the target is a direct peer and the log gains nothing."""
    project = make_project({"gpu": ssh_entry(sshd, tmp_path)}, default="gpu")
    before, connections = _forwarded_to(jump_sshd, sshd.port), tcp_connections()
    assert open_host(None, project).transport.run("echo ok").text.strip() == "ok"
    with pytest.raises(AssertionError, match="no new TCP connection to the first hop"):
        assert_only_the_first_hop_is_direct(connections, jump_sshd, [sshd])
    assert sshd.port in {port for _inode, port in tcp_connections() - connections}
    assert _forwarded_to(jump_sshd, sshd.port) == before


def test_unreachable_address_fails_within_connect_timeout(make_project, sshd, tmp_path, no_inventory_env):
    dead_port = free_port()   # nothing listens there
    project = make_project({"gone": ssh_entry(sshd, tmp_path, port=dead_port, connect_timeout=2)}, "gone")
    started = time.monotonic()
    with pytest.raises(HostUnreachable, match=r"'gone'.*within 2s") as err:
        open_host(None, project, prepare=True)
    assert time.monotonic() - started < 2.5
    assert str(dead_port) in str(err.value) and "hosts.yaml" in str(err.value)


def test_wrong_key_is_rejected_with_the_key_named(make_project, sshd, tmp_path, no_inventory_env):
    stranger = keygen(tmp_path / "stranger")
    project = make_project({"box": ssh_entry(sshd, tmp_path, key=str(stranger))}, "box")
    with pytest.raises(AuthFailed, match="rejected key .*stranger"):
        open_host(None, project, prepare=True)


def test_missing_key_file_is_an_inventory_error(make_project, sshd, tmp_path, no_inventory_env):
    project = make_project({"box": ssh_entry(sshd, tmp_path, key=str(tmp_path / "nope"))}, "box")
    with pytest.raises(InventoryError, match="key file .*nope does not exist"):
        open_host(None, project, prepare=True)


@pytest.mark.parametrize("which", ["public half", "not a key", "empty"])
def test_a_key_file_that_is_not_a_private_key_is_named_not_called_unreachable(make_project, sshd, tmp_path,
                                                                             no_inventory_env, which):
    """`key:` naming the .pub (or any file that is no private key) was reported as "could not be reached
    ... check that the box is up", after three attempts against a box that was up all along."""
    key = {"public half": sshd.key.with_suffix(".pub"), "not a key": tmp_path / "notes.txt",
           "empty": tmp_path / "empty"}[which]
    if which != "public half":
        key.write_text("" if which == "empty" else "hello\n")
    project = make_project({"box": ssh_entry(sshd, tmp_path, key=str(key))}, "box")
    started = time.monotonic()
    with pytest.raises(InventoryError, match=rf"Host 'box': key file {key} is not a private key .*`key:`"):
        open_host(None, project, prepare=True)
    assert time.monotonic() - started < 2


def test_a_key_with_a_passphrase_is_named_not_called_rejected(make_project, sshd, tmp_path, no_inventory_env):
    """A passphrase-protected key was reported as "rejected key ... put its .pub into authorized_keys",
    though the host never saw it: draftops cannot ask for the passphrase."""
    import subprocess

    key = tmp_path / "locked"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "s3cret", "-f", str(key)], check=True)
    project = make_project({"box": ssh_entry(sshd, tmp_path, key=str(key))}, "box")
    with pytest.raises(InventoryError, match=rf"Host 'box': key file {key} is protected by a passphrase.*ssh-add"):
        open_host(None, project, prepare=True)


@pytest.mark.parametrize("where", ["a folder", "under a file"])
def test_accept_new_with_a_known_hosts_it_cannot_write_refuses_the_key(make_project, sshd, tmp_path,
                                                                      no_inventory_env, where):
    """accept-new trusts a key on first use only because it is recorded; a key that cannot be recorded
    was added in memory before the write failed, so the connect's retry found it and went ahead: every
    call trusted whatever key the host showed, silently."""
    if where == "a folder":
        known = tmp_path / "kh-folder"
        known.mkdir()
    else:
        (tmp_path / "plain-file").write_text("")
        known = tmp_path / "plain-file" / "known_hosts"
    project = make_project({"box": ssh_entry(sshd, tmp_path, known_hosts=str(known))}, "box")
    with pytest.raises(HostKeyRejected, match=rf"Host 'box' .*cannot record .* in {known} .*`known_hosts:`"):
        open_host(None, project, prepare=True)


def test_strict_host_key_refuses_unknown_then_accepts_known(make_project, sshd, tmp_path, no_inventory_env):
    known = tmp_path / "strict_known_hosts"
    project = make_project({"box": ssh_entry(sshd, tmp_path, host_key="strict", known_hosts=str(known))}, "box")
    with pytest.raises(HostKeyRejected, match="not in .*strict_known_hosts"):
        open_host(None, project, prepare=True)
    assert not known.exists()          # strict never writes known_hosts
    key_type, key_b64 = sshd.host_key_pub.read_text().split()[:2]
    known.write_text(f"[127.0.0.1]:{sshd.port} {key_type} {key_b64}\n")
    assert open_host(None, project).transport.run("echo trusted").text.strip() == "trusted"


def test_accept_new_records_key_and_refuses_a_changed_one(make_project, sshd, tmp_path, no_inventory_env):
    known = tmp_path / "tofu_known_hosts"
    project = make_project({"box": ssh_entry(sshd, tmp_path, known_hosts=str(known))}, "box")
    open_host(None, project).transport.run("true")
    assert f"[127.0.0.1]:{sshd.port}" in known.read_text()
    from draftops.link import host as host_module
    host_module.close_all()
    other = keygen(tmp_path / "other_host_key")
    key_type, key_b64 = other.with_suffix(".pub").read_text().split()[:2]
    known.write_text(f"[127.0.0.1]:{sshd.port} {key_type} {key_b64}\n")
    with pytest.raises(HostKeyRejected, match="differs"):
        open_host(None, project, prepare=True)


def test_unknown_host_lists_known_ones(make_project, sshd, tmp_path, no_inventory_env):
    project = make_project({"box": ssh_entry(sshd, tmp_path)}, "box")
    with pytest.raises(InventoryError, match=r"Unknown host 'gpu9'.*box, local"):
        open_host("gpu9", project, prepare=True)


@pytest.mark.parametrize("root,match", [
    ("/root", "home directory"),
    ("~", "home directory"),
    ("/", r"straight into / or the home"),
])
def test_root_of_slash_or_home_is_refused(make_project, sshd, tmp_path, no_inventory_env, root, match):
    project = make_project({"box": ssh_entry(sshd, tmp_path, root=root)}, "box")
    with pytest.raises((RootError, InventoryError), match=match):
        open_host(None, project, prepare=True)


def test_root_that_is_not_writable_is_refused(make_project, sshd, tmp_path, no_inventory_env):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    project = make_project({"box": ssh_entry(sshd, tmp_path, root=str(blocker / "draftops"))}, "box")
    with pytest.raises(RootError, match="not writable.*Fix `root:`"):
        open_host(None, project, prepare=True)
    assert blocker.read_text() == "not a folder"


def test_root_on_read_only_filesystem_is_refused(make_project, sshd, tmp_path, no_inventory_env):
    project = make_project({"box": ssh_entry(sshd, tmp_path, root="/proc/draftops")}, "box")
    with pytest.raises(RootError, match="not writable"):
        open_host(None, project, prepare=True)
    assert not Path("/proc/draftops").exists()


def test_a_root_on_a_full_disk_says_to_free_space_not_to_fix_root(make_project, sshd, tmp_path, no_inventory_env):
    """The agent cannot be installed on a full disk: that was "not writable: No space left on device.
    Fix `root:` in hosts.yaml.", the wrong fix for a root that is right; and `invoke sync` wrapped it
    again ("sync failed: Host 'box' (...): ... hosts.yaml.. The files on the host were ...")."""
    from draftops.runs.sync import sync

    with small_tmpfs(tmp_path / "small", "64k") as disk:
        project = make_project({"box": ssh_entry(sshd, tmp_path, root=str(disk / "draftops"))}, "box")
        with pytest.raises(RootError) as err:
            open_host(None, project, prepare=True)
        text = str(err.value)
        assert "full" in text and "free space" in text and "not writable" not in text, text
        with pytest.raises(RootError) as err:
            sync(open_host(None, project))
        assert str(err.value) == text


# --- R7: jump chains ---------------------------------------------------------------------------

def test_two_hop_chain_goes_through_both_jump_hosts(make_project, sshd, jump_sshd, outer_jump_sshd, tmp_path,
                                                    no_inventory_env):
    hosts = {"outer": ssh_entry(outer_jump_sshd, tmp_path),
             "inner": ssh_entry(jump_sshd, tmp_path, jump="outer"),
             "gpu": ssh_entry(sshd, tmp_path, jump="inner")}
    project = make_project(hosts, default="gpu")
    before = (_forwarded_to(outer_jump_sshd, jump_sshd.port), _forwarded_to(jump_sshd, sshd.port))
    connections = tcp_connections()
    host = open_host(None, project, prepare=True)
    assert host.transport.run("echo via-two-hops").text.strip() == "via-two-hops"
    assert_only_the_first_hop_is_direct(connections, outer_jump_sshd, [jump_sshd, sshd])
    # the outer hop carried the channel to the inner one, which carried the channel to the target
    assert _forwarded_to(outer_jump_sshd, jump_sshd.port) > before[0]
    assert _forwarded_to(jump_sshd, sshd.port) > before[1]


def test_two_hop_chain_written_as_comma_separated_hops(make_project, sshd, jump_sshd, outer_jump_sshd,
                                                       tmp_path, no_inventory_env):
    jump = f"root@127.0.0.1:{outer_jump_sshd.port},root@127.0.0.1:{jump_sshd.port}"
    project = make_project({"gpu": ssh_entry(sshd, tmp_path, jump=jump)}, default="gpu")
    before, before_inner = _forwarded_to(outer_jump_sshd, jump_sshd.port), _forwarded_to(jump_sshd, sshd.port)
    connections = tcp_connections()
    assert open_host(None, project).transport.run("echo ok").text.strip() == "ok"
    assert_only_the_first_hop_is_direct(connections, outer_jump_sshd, [jump_sshd, sshd])
    assert _forwarded_to(outer_jump_sshd, jump_sshd.port) > before
    assert _forwarded_to(jump_sshd, sshd.port) > before_inner


def test_closed_outer_hop_fails_with_the_hop_named(make_project, sshd, jump_sshd, tmp_path, no_inventory_env):
    """a -> b -> c with c closed must not connect (it used to go straight to b)."""
    dead = free_port()
    hosts = {"c": ssh_entry(sshd, tmp_path, port=dead, connect_timeout=2),
             "b": ssh_entry(jump_sshd, tmp_path, jump="c"),
             "a": ssh_entry(sshd, tmp_path, jump="b")}
    project = make_project(hosts, default="a")
    started = time.monotonic()
    with pytest.raises(HostUnreachable) as err:
        open_host(None, project, prepare=True)
    assert time.monotonic() - started < 3.5
    text = str(err.value)
    assert text.startswith(f"Host 'c' (root@127.0.0.1:{dead}), jump host 1 of 2 for 'a', could not be reached")
    assert "Traceback" not in text


def test_closed_inner_hop_fails_naming_it_and_the_hop_before(make_project, sshd, jump_sshd, tmp_path,
                                                             no_inventory_env):
    dead = free_port()
    hosts = {"bastion": ssh_entry(jump_sshd, tmp_path),
             "inner": ssh_entry(sshd, tmp_path, port=dead, jump="bastion", connect_timeout=2),
             "gpu": ssh_entry(sshd, tmp_path, jump="inner")}
    project = make_project(hosts, default="gpu")
    with pytest.raises(HostUnreachable, match=rf"Host 'inner' \(root@127.0.0.1:{dead}\), jump host 2 of 2 for "
                                              r"'gpu', via 'bastion' could not be reached within 2s.*Connect"):
        open_host(None, project, prepare=True)


def test_closed_target_behind_a_jump_names_the_target(make_project, sshd, jump_sshd, tmp_path, no_inventory_env):
    dead = free_port()
    hosts = {"bastion": ssh_entry(jump_sshd, tmp_path),
             "gpu": ssh_entry(sshd, tmp_path, port=dead, jump="bastion", connect_timeout=2)}
    project = make_project(hosts, default="gpu")
    with pytest.raises(HostUnreachable, match=rf"Host 'gpu' \(root@127.0.0.1:{dead}\) via 'bastion' could not"):
        open_host(None, project, prepare=True)


def test_jump_loop_is_an_inventory_error_before_any_connection(make_project, sshd, jump_sshd, tmp_path,
                                                                no_inventory_env):
    hosts = {"a": ssh_entry(sshd, tmp_path, jump="b"), "b": ssh_entry(jump_sshd, tmp_path, jump="a")}
    project = make_project(hosts, default="a")
    before = jump_sshd.log.read_text().count("Accepted publickey")
    with pytest.raises(InventoryError, match=r"jump chain a -> b -> a loops back to 'a'"):
        open_host(None, project, prepare=True)
    assert jump_sshd.log.read_text().count("Accepted publickey") == before


def test_wrong_key_on_a_jump_host_names_that_hop(make_project, sshd, jump_sshd, tmp_path, no_inventory_env):
    stranger = keygen(tmp_path / "stranger")
    hosts = {"bastion": ssh_entry(jump_sshd, tmp_path, key=str(stranger)),
             "gpu": ssh_entry(sshd, tmp_path, jump="bastion")}
    project = make_project(hosts, default="gpu")
    with pytest.raises(AuthFailed, match=r"Host 'bastion' .*jump host 1 of 1 for 'gpu', rejected key .*stranger"):
        open_host(None, project, prepare=True)


# --- R15: paramiko's own traceback never reaches the terminal ------------------------------------

@pytest.fixture
def not_ssh_port():
    """A TCP port that accepts and hangs up at once (or answers HTTP): paramiko's banner read fails."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        count = 0
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            count += 1
            if count % 2:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


def test_a_port_that_is_not_ssh_gives_one_clear_error_and_no_traceback(make_project, sshd, tmp_path,
                                                                        no_inventory_env, not_ssh_port):
    project = make_project({"web": ssh_entry(sshd, tmp_path, port=not_ssh_port, connect_timeout=2)}, "web")
    (project / "tasks.py").write_text((REPO / "tasks.py").read_text())
    result = invoke(project, "runs")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    assert "paramiko" not in result.stderr and "Exception (client)" not in result.stderr
    assert (f"Host 'web' (root@127.0.0.1:{not_ssh_port}) could not be reached within 2s" in result.stderr
            and "SSHException: Error reading SSH protocol banner" in result.stderr), result.stderr


def test_paramiko_messages_are_kept_at_debug_level(make_project, sshd, tmp_path, no_inventory_env,
                                                   not_ssh_port, caplog, capfd):
    project = make_project({"web": ssh_entry(sshd, tmp_path, port=not_ssh_port, connect_timeout=1)}, "web")
    with caplog.at_level(logging.DEBUG, logger="draftops.link.connection"), pytest.raises(HostUnreachable):
        open_host(None, project, prepare=True)
    assert any("paramiko ERROR" in r.getMessage() and "banner" in r.getMessage() for r in caplog.records)
    assert "Traceback" not in capfd.readouterr().err


# --- item 2: remote code runs under the interpreter the test names -----------------------------

def test_ssh_entry_names_this_runs_interpreter_for_remote_jobs(make_project, sshd, tmp_path, no_inventory_env):
    """A job on an SSH host runs with this test run's python (the venv's), not the login's python3,
    so the suite passes on a machine whose system python has no torch."""
    project = make_project({"box": ssh_entry(sshd, tmp_path)}, "box",
                           files={"remote/__init__.py": "",
                                  "remote/which.py": "import sys, torch\nprint('exe=' + sys.executable)\n"})
    host = open_host(None, project)
    sync(host)
    job = jobs.start(host, "which", jobs.python_module_command(host, "remote.which", []))
    lines: list[str] = []
    final = jobs.follow(host, job.id, lines.append)
    assert final["state"] == "succeeded", lines
    assert f"exe={sys.executable}" in lines
    assert host.spec.python == sys.executable
