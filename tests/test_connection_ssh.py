"""Connecting for real: jump hosts, host-key policy, and every bad input with a clear error."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from draftops.errors import AuthFailed, HostKeyRejected, HostUnreachable, InventoryError, RootError
from draftops.host import open_host
from tests.conftest import ssh_entry
from tests.sshd import free_port, keygen

pytestmark = pytest.mark.ssh


def test_jump_host_by_entry_name_goes_through_the_gateway(make_project, sshd, jump_sshd, tmp_path,
                                                          no_inventory_env):
    hosts = {"bastion": ssh_entry(jump_sshd, tmp_path),
             "gpu": ssh_entry(sshd, tmp_path, jump="bastion")}
    project = make_project(hosts, default="gpu")
    host = open_host(None, project, prepare=True)
    assert host.transport.run("echo via-jump").text.strip() == "via-jump"
    log = jump_sshd.log.read_text()
    assert f"port {sshd.port}" in log and "direct-tcpip" in log


def test_jump_host_as_user_at_host_port(make_project, sshd, jump_sshd, tmp_path, no_inventory_env):
    entry = ssh_entry(sshd, tmp_path, jump=f"root@127.0.0.1:{jump_sshd.port}")
    project = make_project({"gpu": entry}, default="gpu")
    assert open_host(None, project).transport.run("echo ok").text.strip() == "ok"


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
    from draftops import host as host_module
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
