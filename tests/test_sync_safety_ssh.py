"""Sync never writes or deletes outside the real <root>/code: symlinks on the host (anywhere on the
way, or `code` itself), a `code/` folder of someone else's files, and crafted tar members.

Each test runs over the real sshd and on the built-in `local` host where the host matters."""
from __future__ import annotations

import io
import json
import os
import shutil
import socket
import tarfile
from pathlib import Path

import pytest

from draftops.errors import SyncError, SyncRefused
from draftops.link.agent import ApplyResult
from draftops.link.host import Host, open_host
from draftops.onhost.wire import OWNER_MARK, SYNC_META, Exit
from draftops.runs.sync import STATE_FILE, sync
from tests.conftest import ssh_entry

pytestmark = pytest.mark.ssh

FILES = {"remote/__init__.py": "", "remote/a.py": "A = 1\n", "remote/sub dir/b.py": "B = 2\n"}


@pytest.fixture(params=["box", "local"])
def kind(request) -> str:
    return request.param


@pytest.fixture
def project(kind, make_project, sshd, tmp_path, no_inventory_env) -> Path:
    return make_project({"box": ssh_entry(sshd, tmp_path)}, default=kind, files=FILES)


def host_root(kind: str, project: Path, tmp_path: Path) -> Path:
    """Where the host's root is before draftops ever ran there."""
    return tmp_path / "hostroot" if kind == "box" else project / ".draftops"


@pytest.fixture
def elsewhere(tmp_path) -> Path:
    """A folder outside every root, with a file and a folder that must survive every test."""
    outside = tmp_path / "elsewhere"
    (outside / "important").mkdir(parents=True)
    (outside / "important" / "keep.txt").write_text("not yours")
    (outside / "victim.txt").write_text("precious")
    return outside


def snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every path under ``folder`` with its content (files) or target (links), links not followed."""
    out: dict[str, bytes | str] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            full = Path(dirpath) / name
            rel = full.relative_to(folder).as_posix()
            out[rel] = os.readlink(full) if full.is_symlink() else (full.read_bytes() if full.is_file() else "dir")
    return out


def code_dir(host: Host) -> Path:
    return Path(host.root) / "code"


# ---------------------------------------------------------------- symlinks on the host
@pytest.mark.parametrize("linked", ["remote/data", "remote"])
def test_symlink_on_the_host_is_replaced_never_followed(project, elsewhere, linked):
    """The issue's case: `ln -s /elsewhere code/remote/data` on the host, `remote/data/important` here."""
    host = open_host(None, project)
    sync(host)
    before = snapshot(elsewhere)
    target = code_dir(host) / linked
    if target.is_dir():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(elsewhere, target)
    (project / "remote/data").mkdir()
    (project / "remote/data/important").write_text("mine\n")
    (project / "remote/data/x.py").write_text("X = 1\n")
    report = sync(host)
    assert snapshot(elsewhere) == before, "nothing outside <root>/code may change"
    assert not (code_dir(host) / "remote").is_symlink() and not (code_dir(host) / "remote/data").is_symlink()
    assert (code_dir(host) / "remote/data/important").read_text() == "mine\n"
    assert (code_dir(host) / "remote/data/x.py").read_text() == "X = 1\n"
    assert (code_dir(host) / "remote/a.py").read_text() == "A = 1\n"
    assert sync(host).noop and report.upload


def test_symlinked_code_folder_is_refused(project, elsewhere):
    host = open_host(None, project)
    sync(host)
    real = code_dir(host).parent / "real-code"
    code_dir(host).rename(real)                  # a draftops-made folder, marker and all
    os.symlink(real, code_dir(host))
    (project / "remote/a.py").unlink()
    with pytest.raises(SyncError, match="symbolic link") as err:
        sync(host)
    assert str(code_dir(host)) in str(err.value) and "root:" in str(err.value)
    assert (real / "remote/a.py").read_text() == "A = 1\n", "the link's target must not be touched"
    os.unlink(code_dir(host))
    os.symlink(elsewhere, code_dir(host))
    before = snapshot(elsewhere)
    with pytest.raises(SyncError, match="symbolic link"):
        sync(host, dry_run=True)
    assert snapshot(elsewhere) == before


def test_code_folder_of_someone_elses_files_is_refused(kind, project, tmp_path):
    theirs = host_root(kind, project, tmp_path) / "code"
    (theirs / "data").mkdir(parents=True)
    (theirs / "data" / "results.csv").write_text("a,b\n1,2\n")
    host = open_host(None, project)
    assert code_dir(host) == theirs
    with pytest.raises(SyncError, match="did not put there") as err:
        sync(host)
    assert str(theirs) in str(err.value) and "root:" in str(err.value)
    assert snapshot(theirs) == {"data": "dir", "data/results.csv": b"a,b\n1,2\n"}
    # An empty unmarked folder (nothing to lose, e.g. from an earlier draftops) is adopted.
    shutil.rmtree(theirs / "data")
    sync(host)
    assert (theirs / OWNER_MARK).is_file() and (theirs / "remote/a.py").read_text() == "A = 1\n"


def test_code_that_is_a_file_is_refused(project):
    host = open_host(None, project)
    shutil.rmtree(code_dir(host))   # made (empty, marked) by prepare
    code_dir(host).write_text("a file where the folder should be")
    with pytest.raises(SyncError, match="refusing to sync into"):
        sync(host)
    assert code_dir(host).read_text() == "a file where the folder should be"


def test_hardlinked_host_file_is_replaced_not_written_through(project, elsewhere):
    host = open_host(None, project)
    sync(host)
    inside = code_dir(host) / "remote/a.py"
    inside.unlink()
    os.link(elsewhere / "victim.txt", inside)
    (project / "remote/a.py").write_text("A = 2\n")
    sync(host)
    assert (elsewhere / "victim.txt").read_text() == "precious"
    assert inside.read_text() == "A = 2\n"


def test_fifo_and_socket_in_host_tree_are_removed_without_hanging(project):
    host = open_host(None, project)
    sync(host)
    os.mkfifo(code_dir(host) / "remote/pipe")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(code_dir(host) / "remote/sock"))
    sock.close()
    report = sync(host)
    assert sorted(report.delete) == ["remote/pipe", "remote/sock"]
    assert not os.path.lexists(code_dir(host) / "remote/pipe")


# ---------------------------------------------------------------- crafted payloads
def member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"x = 1\n", link: str = "") -> tuple:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.mode = 0o644
    if kind == tarfile.CHRTYPE:
        info.devmajor, info.devminor = 1, 3
    info.size = len(data) if kind in (tarfile.REGTYPE, tarfile.AREGTYPE) else 0
    return info, data


def payload(members: list[tuple], delete: list[str] = ()) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        meta = json.dumps({"delete": list(delete)}).encode()
        info = tarfile.TarInfo(SYNC_META)
        info.size = len(meta)
        tar.addfile(info, io.BytesIO(meta))
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.size else None)
    return buf.getvalue()


def send(host: Host, data: bytes) -> ApplyResult:
    return host.agent.apply("code", STATE_FILE, data, expected_tree=None, force=False)


def crafted_cases(elsewhere: Path) -> dict[str, tuple[list[tuple], list[str]]]:
    good = member("remote/good.py")
    return {
        "dotdot": ([good, member("../escaped.py")], []),
        "dotdot-deep": ([good, member("remote/../../escaped.py")], []),
        "absolute": ([good, member(str(elsewhere / "abs.py"))], []),
        "dot": ([good, member("remote/./x.py")], []),
        "empty-part": ([good, member("remote//x.py")], []),
        "link-then-write-through": ([good, member("remote/lnk", tarfile.SYMTYPE, link=str(elsewhere)),
                                     member("remote/lnk/written.py")], []),
        "hardlink": ([good, member("remote/hl", tarfile.LNKTYPE, link=str(elsewhere / "victim.txt"))], []),
        "fifo": ([good, member("remote/fifo", tarfile.FIFOTYPE)], []),
        "char-device": ([good, member("remote/null", tarfile.CHRTYPE)], []),
        "folder": ([good, member("remote/folder", tarfile.DIRTYPE)], []),
        "twice": ([good, member("remote/dup.py"), member("remote/dup.py")], []),
        "sent-and-deleted": ([good, member("remote/a.py")], ["remote/a.py"]),
        "marker": ([good, member(OWNER_MARK)], []),
        "delete-marker": ([good], [OWNER_MARK]),
        "delete-dotdot": ([good], ["../elsewhere/victim.txt"]),
        "delete-absolute": ([good], [str(elsewhere / "victim.txt")]),
        "delete-through-host-link": ([good], ["remote/hostlink/victim.txt"]),
        "write-through-host-link": ([good, member("remote/hostlink/written.py")], []),
        "file-over-folder-that-stays": ([good, member("remote/sub dir")], []),
    }


def test_crafted_tar_members_are_refused_before_anything_is_applied(project, elsewhere):
    host = open_host(None, project)
    sync(host)
    os.symlink(elsewhere, code_dir(host) / "remote/hostlink")
    before_code, before_outside = snapshot(code_dir(host)), snapshot(elsewhere)
    for case, (members, delete) in crafted_cases(elsewhere).items():
        with pytest.raises(SyncRefused) as err:
            send(host, payload(members, delete))
        assert err.value.exit_code == Exit.REFUSED_ENTRY, (case, err.value)
        assert err.value.result.host == host.name and err.value.result.command.startswith("apply code"), case
        assert "nothing was changed" in str(err.value), case
        assert snapshot(elsewhere) == before_outside, case
        assert snapshot(code_dir(host)) == before_code, f"{case}: a refused payload was applied in part"
        assert not (code_dir(host).parent / "escaped.py").exists(), case


def test_a_sane_crafted_payload_is_applied(project):
    """The refusals above are about the members, not about crafted payloads as such."""
    host = open_host(None, project)
    sync(host)
    answer = send(host, payload([member("remote/good.py"), member("remote/ok", tarfile.SYMTYPE, link="good.py")],
                                ["remote/a.py"]))
    assert answer.status == "applied" and answer.written == 2 and answer.deleted == 1
    assert os.readlink(code_dir(host) / "remote/ok") == "good.py"
    assert not (code_dir(host) / "remote/a.py").exists()
