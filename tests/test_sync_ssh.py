"""Sync over a real sshd: new / changed / deleted / excluded / oddly named files, dry-run, no-op, interruption."""
from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import paramiko
import pytest

from draftops.errors import SyncError
from draftops.link.host import open_host
from draftops.onhost.wire import OWNER_MARK
from draftops.runs.sync import sync
from tests.conftest import ssh_entry

pytestmark = pytest.mark.ssh


def apply_running() -> bool:
    """True while a host-agent `apply` process is alive (it is reading the sync payload)."""
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        # python [-S] <state>/agent-<sha>.py|.<tag>.pyc ROOT apply ...
        at = next((i for i, arg in enumerate(argv[:4]) if arg.split(b"/")[-1].startswith(b"agent-")), None)
        if at is not None and argv[at + 2:at + 3] == [b"apply"]:
            return True
    return False


def tree(root: Path) -> dict[str, tuple]:
    """{rel: (kind, content or target, exec bit)} of a folder, symlinks not followed."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            if full.is_symlink():
                out[rel] = ("l", os.readlink(full), False)
            else:
                out[rel] = ("f", full.read_bytes(), bool(full.stat().st_mode & 0o100))
    return out


@pytest.fixture
def ssh_project(make_project, sshd, tmp_path, no_inventory_env):
    files = {
        "remote/__init__.py": "",
        "remote/a.py": "A = 1\n",
        "remote/sub dir/naïve café.txt": "unicode name\n",
        "remote/run.sh": "#!/bin/sh\necho run\n",
        "remote/ignored.log": "excluded by .gitignore\n",
        "remote/cache/big.bin": "excluded folder\n",
        "remote/__pycache__/a.cpython-311.pyc": "junk",
        ".gitignore": "*.log\nremote/cache/\n",
        "remote/.gitignore": "secret.txt\n",
        "remote/secret.txt": "excluded by nested .gitignore\n",
    }
    project = make_project({"box": ssh_entry(sshd, tmp_path)}, default="box", files=files)
    (project / "remote/run.sh").chmod(0o755)
    os.symlink("a.py", project / "remote/link_to_a.py")
    return project


def code_tree(project: Path, tmp_path: Path) -> dict[str, tuple]:
    """The synced tree on the host, without draftops' ownership marker."""
    out = tree(tmp_path / "hostroot" / "code")
    out.pop(OWNER_MARK, None)
    return out


def test_first_sync_copies_files_modes_links_and_respects_excludes(ssh_project, tmp_path):
    host = open_host(None, ssh_project)
    report = sync(host)
    remote = code_tree(ssh_project, tmp_path)
    assert set(remote) == {"remote/__init__.py", "remote/a.py", "remote/sub dir/naïve café.txt",
                           "remote/run.sh", "remote/link_to_a.py", "remote/.gitignore"}
    assert remote["remote/run.sh"][2] is True and remote["remote/a.py"][2] is False
    assert remote["remote/link_to_a.py"] == ("l", "a.py", False)
    assert remote["remote/sub dir/naïve café.txt"][1] == b"unicode name\n"
    assert len(report.upload) == 6 and report.bytes_sent > 0


def test_changed_and_deleted_files_follow_and_noop_sends_nothing(ssh_project, tmp_path):
    host = open_host(None, ssh_project)
    sync(host)
    (ssh_project / "remote/a.py").write_text("A = 2  # changed\n")
    (ssh_project / "remote/sub dir/naïve café.txt").unlink()
    (ssh_project / "remote/new.py").write_text("NEW = True\n")
    report = sync(host)
    assert report.upload == ["remote/a.py", "remote/new.py"]
    assert report.delete == ["remote/sub dir/naïve café.txt"]
    remote = code_tree(ssh_project, tmp_path)
    assert remote["remote/a.py"][1] == b"A = 2  # changed\n"
    assert "remote/sub dir/naïve café.txt" not in remote
    assert not (tmp_path / "hostroot/code/remote/sub dir").exists()   # emptied folder removed too
    again = sync(host)
    assert again.noop and again.bytes_sent == 0 and again.upload == [] and again.delete == []


def test_dry_run_reports_but_changes_nothing(ssh_project, tmp_path):
    host = open_host(None, ssh_project)
    report = sync(host, dry_run=True)
    assert report.dry_run and len(report.upload) == 6 and report.bytes_sent == 0
    assert code_tree(ssh_project, tmp_path) == {}


def test_remote_edit_is_detected_and_repaired(ssh_project, tmp_path):
    host = open_host(None, ssh_project)
    sync(host)
    tampered = tmp_path / "hostroot/code/remote/a.py"
    tampered.write_text("tampered on the host, same size!")
    os.utime(tampered, ns=(1, 1))
    report = sync(host)
    assert report.upload == ["remote/a.py"]
    assert tampered.read_text() == "A = 1\n"


def test_files_outside_code_dir_are_never_touched(ssh_project, tmp_path):
    host = open_host(None, ssh_project)
    bystander = tmp_path / "hostroot" / "precious.txt"
    bystander.parent.mkdir(parents=True, exist_ok=True)
    bystander.write_text("keep me")
    sync(host)
    for rel in list((ssh_project / "remote").iterdir()):
        if rel.is_file() and not rel.is_symlink():
            rel.unlink()
    sync(host)
    assert bystander.read_text() == "keep me"


def test_sync_path_outside_project_is_refused(ssh_project):
    host = open_host(None, ssh_project)
    with pytest.raises(SyncError, match="outside the project"):
        sync(host, paths=["remote", "../elsewhere"])


def test_interrupted_sync_leaves_remote_tree_consistent(ssh_project, tmp_path, monkeypatch):
    host = open_host(None, ssh_project)
    sync(host)
    before = code_tree(ssh_project, tmp_path)
    big = ssh_project / "remote" / "weights"
    big.mkdir()
    for i in range(6):
        (big / f"w{i}.bin").write_bytes(os.urandom(4 << 20))
    (ssh_project / "remote/a.py").write_text("A = 3\n")
    # Cut the real TCP link once 8 MiB of the payload are on their way (deterministic, no race).
    original = paramiko.Channel.sendall
    sent = {"bytes": 0}

    def cutting_sendall(channel, data):
        sent["bytes"] += len(data)
        if sent["bytes"] > 8 << 20:
            channel.get_transport().sock.shutdown(socket.SHUT_RDWR)
        return original(channel, data)

    monkeypatch.setattr(paramiko.Channel, "sendall", cutting_sendall)
    with pytest.raises(SyncError, match="left as they were"):
        sync(host)
    monkeypatch.setattr(paramiko.Channel, "sendall", original)
    deadline = time.monotonic() + 10
    while apply_running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert code_tree(ssh_project, tmp_path) == before, "a cut transfer must leave the old tree in place"
    assert not list((tmp_path / "hostroot/code").rglob("*draftops-tmp*"))
    # A fresh connection finishes the job.
    from draftops.link import host as host_module
    host_module.close_all()
    report = sync(open_host(None, ssh_project))
    assert "remote/weights/w5.bin" in report.upload
    assert code_tree(ssh_project, tmp_path)["remote/a.py"][1] == b"A = 3\n"


def test_noop_and_small_edit_take_one_round_trip(ssh_project, tmp_path, monkeypatch):
    host = open_host(None, ssh_project)
    sync(host)
    calls = []
    original = type(host.transport).run

    def counting_run(self, command, **kwargs):
        calls.append(command)
        return original(self, command, **kwargs)

    monkeypatch.setattr(type(host.transport), "run", counting_run)
    assert sync(host).noop and len(calls) == 1
    (ssh_project / "remote/a.py").write_text("A = 42\n")
    calls.clear()
    report = sync(host)
    assert report.upload == ["remote/a.py"] and len(calls) == 1
    assert (tmp_path / "hostroot/code/remote/a.py").read_text() == "A = 42\n"


def test_host_bytecode_cache_is_kept_and_follows_deleted_modules(ssh_project, tmp_path):
    """A tool run from the code folder makes the host's python cache bytecode there. The next no-op
    sync is still one exec and keeps that cache; a deleted module takes its bytecode with it, and a
    deleted package leaves no folder behind (it would import as an empty namespace package)."""
    (ssh_project / "remote/pkg").mkdir()
    (ssh_project / "remote/pkg/__init__.py").write_text("")
    (ssh_project / "remote/pkg/m.py").write_text("M = 1\n")
    host = open_host(None, ssh_project)
    sync(host)
    code = tmp_path / "hostroot" / "code"
    host.transport.run(f"cd {code} && env -u PYTHONDONTWRITEBYTECODE -u PYTHONPYCACHEPREFIX {sys.executable} "
                       "-c 'import remote.a, remote.pkg.m'")
    cached = sorted(p.relative_to(code).as_posix() for p in code.rglob("*.pyc"))
    assert any(c.startswith("remote/__pycache__/a.") for c in cached)
    assert any(c.startswith("remote/pkg/__pycache__/m.") for c in cached)

    commands: list[str] = []
    run = host.transport.run
    host.transport.run = lambda command, **kw: commands.append(command) or run(command, **kw)  # type: ignore[method-assign]
    again = sync(host)
    assert again.noop and again.delete == [] and len(commands) == 1, commands
    assert sorted(p.relative_to(code).as_posix() for p in code.rglob("*.pyc")) == cached

    # a same-size edit whose host copy ends up with the cached source's size and mtime: python would
    # trust the stale bytecode, so the sync drops it with the old source
    source = code / "remote/a.py"
    stamp = source.stat().st_mtime_ns
    (ssh_project / "remote/a.py").write_text("A = 7\n")
    assert sync(host).upload == ["remote/a.py"]
    os.utime(source, ns=(stamp, stamp))
    got = host.transport.run(f"cd {code} && env -u PYTHONDONTWRITEBYTECODE -u PYTHONPYCACHEPREFIX {sys.executable} "
                             "-c 'import remote.a; print(remote.a.A)'").stdout
    assert got.strip() == b"7"

    (ssh_project / "remote/a.py").unlink()
    (ssh_project / "remote/link_to_a.py").unlink()
    for name in ("__init__.py", "m.py"):
        (ssh_project / "remote/pkg" / name).unlink()
    (ssh_project / "remote/pkg").rmdir()
    report = sync(host)
    assert set(report.delete) == {"remote/a.py", "remote/link_to_a.py", "remote/pkg/__init__.py", "remote/pkg/m.py"}
    assert not list((code / "remote/__pycache__").glob("a.*.pyc"))
    assert list((code / "remote/__pycache__").glob("__init__.*.pyc")), "the cache of a kept module stays"
    assert not (code / "remote/pkg").exists()
    assert sync(host).noop


def test_verbose_list_shows_odd_names_quoted_never_their_escape_sequences(ssh_project, tmp_path):
    """A name on the host (to be deleted) or here may hold an escape sequence or a newline: the list
    shows it quoted, with visible escapes, and sends no control character to the terminal."""
    import io

    from rich.console import Console

    from draftops.console import show_sync

    host = open_host(None, ssh_project)
    sync(host)
    planted = tmp_path / "hostroot" / "code" / "remote" / "evil\x1b]0;pwned\x07\x1b[2J.py"
    planted.write_text("on the host only\n")
    (ssh_project / "remote" / "new\nline.py").write_text("here\n")
    report = sync(host, dry_run=True)
    out = io.StringIO()
    show_sync(report, Console(file=out, width=300, color_system=None), verbose=True)
    text = out.getvalue()
    assert "\x1b" not in text and "\x07" not in text
    assert "- 'remote/evil\\x1b]0;pwned\\x07\\x1b[2J.py'" in text
    assert "+ 'remote/new\\nline.py'" in text
