"""Sync under faults: unreadable folders, type changes, a full disk, concurrent syncs, a running job,
file names that look like draftops' temp files, and sync paths that name the same folder twice."""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from draftops.errors import SyncError
from draftops.link import host as host_module
from draftops.link.host import Host, open_host
from draftops.runs import jobs
from draftops.runs.sync import local_manifest, sync, sync_roots
from tests.conftest import REPO, small_tmpfs, ssh_entry

pytestmark = pytest.mark.ssh

FILES = {"remote/__init__.py": "", "remote/a.py": "A = 1\n", "remote/sub/b.py": "B = 2\n",
         "remote/sub/deeper/c.py": "C = 3\n"}
SYNC_SNIPPET = """
import sys
from pathlib import Path
from draftops.errors import SyncError
from draftops.link.host import open_host
from draftops.runs.sync import sync
try:
    report = sync(open_host(None, Path(sys.argv[1])))
except SyncError as exc:
    print(exc)
    sys.exit(3)
print("synced", len(report.upload), len(report.delete))
"""
SYNC_WORKER = """
import json, os, sys, time, traceback
from pathlib import Path
from draftops.link.host import open_host
from draftops.runs.sync import sync
host = open_host(None, Path(sys.argv[1]), prepare=True)
print("ready", flush=True)
for line in sys.stdin:          # one sync per line; the line names a start barrier shared by N workers
    barrier, count = line.split()
    (Path(barrier) / str(os.getpid())).touch()
    while len(os.listdir(barrier)) < int(count):
        time.sleep(0.005)
    try:
        report = sync(host)
        print(json.dumps({"ok": True, "upload": len(report.upload)}), flush=True)
    except BaseException:
        print(json.dumps({"ok": False, "error": traceback.format_exc()}), flush=True)
"""


@pytest.fixture(params=["box", "local"])
def project(request, make_project, sshd, tmp_path, no_inventory_env) -> Path:
    return make_project({"box": ssh_entry(sshd, tmp_path)}, default=request.param, files=FILES)


@pytest.fixture
def box(make_project, sshd, tmp_path, no_inventory_env) -> Path:
    return make_project({"box": ssh_entry(sshd, tmp_path)}, default="box", files=FILES)


def code_dir(host: Host) -> Path:
    return Path(host.root) / "code"


def mirror(project: Path, host: Host) -> dict[str, bytes | str]:
    """{rel: content or link target} of the host's tree, to compare with the project's remote/."""
    out: dict[str, bytes | str] = {}
    for dirpath, dirnames, filenames in os.walk(code_dir(host)):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            full = Path(dirpath) / name
            rel = full.relative_to(code_dir(host)).as_posix()
            if rel != ".draftops-owned":
                out[rel] = os.readlink(full) if full.is_symlink() else full.read_bytes()
    return out


def local_tree(project: Path) -> dict[str, bytes | str]:
    out: dict[str, bytes | str] = {}
    for rel, (kind, _value, _mode) in local_manifest(project, ["remote"]).items():
        full = project / rel
        out[rel] = os.readlink(full) if kind == "l" else full.read_bytes()
    return out


def run_sync_process(project: Path, *, without_root_powers: bool = False) -> subprocess.CompletedProcess:
    """`sync` in a process of its own; ``without_root_powers`` drops the capabilities that let root
    read any file, so that chmod 000 means unreadable even when the tests run as root."""
    prefix: list[str] = []
    if without_root_powers and os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.fail("setpriv (util-linux) is needed to drop root's read-anything capabilities")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-all"]
    return subprocess.run([*prefix, sys.executable, "-c", SYNC_SNIPPET, str(project)], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env=dict(os.environ), check=False)


# ---------------------------------------------------------------- R8: unreadable here or there
@pytest.mark.parametrize("what", ["folder", "file"])
def test_unreadable_local_path_stops_the_sync_and_deletes_nothing(project, what):
    host = open_host(None, project)
    sync(host)
    before = mirror(project, host)
    (project / "remote/a.py").write_text("A = 2\n")        # a pending change must not go half-way
    blocked = project / ("remote/sub" if what == "folder" else "remote/sub/b.py")
    blocked.chmod(0)
    try:
        result = run_sync_process(project, without_root_powers=True)
    finally:
        blocked.chmod(0o755 if what == "folder" else 0o644)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "Cannot read" in result.stdout and str(blocked) in result.stdout and ".gitignore" in result.stdout
    assert mirror(project, host) == before, "an unreadable local path must never turn into deletions"
    assert sync(host).upload == ["remote/a.py"]


def test_unreadable_folder_on_the_host_stops_the_sync(make_project, tmp_path, no_inventory_env):
    """The local host runs the agent in our own process tree, so it can be denied root's powers too."""
    project = make_project(files=FILES)
    host = open_host(None, project)
    sync(host)
    (project / "remote/a.py").unlink()
    hidden = code_dir(host) / "remote/sub"
    hidden.chmod(0)
    try:
        result = run_sync_process(project, without_root_powers=True)
    finally:
        hidden.chmod(0o755)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "cannot read" in result.stdout and str(hidden) in result.stdout
    assert (code_dir(host) / "remote/a.py").exists(), "nothing may change after a failed host scan"


# ---------------------------------------------------------------- R9: type changes, full disk
def test_file_becomes_folder_and_back_and_link_changes(project):
    host = open_host(None, project)
    sync(host)
    steps = []
    (project / "remote/a.py").unlink()
    (project / "remote/a.py").mkdir()
    (project / "remote/a.py/inner.py").write_text("inner\n")
    steps.append("file -> folder")
    shutil.rmtree(project / "remote/sub")
    (project / "remote/sub").write_text("now a file\n")
    steps.append("folder -> file")
    os.symlink("a.py", project / "remote/link")
    steps.append("new link")
    for step in steps:
        sync(host)
        assert mirror(project, host) == local_tree(project), step
    (project / "remote/link").unlink()
    (project / "remote/link").mkdir()
    (project / "remote/link/x.py").write_text("x\n")
    shutil.rmtree(project / "remote/a.py")
    os.symlink("sub", project / "remote/a.py")
    sync(host)
    assert mirror(project, host) == local_tree(project)
    assert sync(host).noop


def test_type_change_made_on_the_host_is_repaired(project):
    host = open_host(None, project)
    sync(host)
    shutil.rmtree(code_dir(host) / "remote/sub")
    (code_dir(host) / "remote/sub").write_text("someone made this a file")
    (code_dir(host) / "remote/a.py").unlink()
    (code_dir(host) / "remote/a.py").mkdir()
    (code_dir(host) / "remote/a.py/stray.txt").write_text("stray")
    sync(host)
    assert mirror(project, host) == local_tree(project)


@pytest.fixture(params=["root", "code"])
def small_disk(request, make_project, sshd, tmp_path, no_inventory_env):
    """A box whose whole root, or only <root>/code, is a 1 MiB tmpfs (mounting needs root with
    CAP_SYS_ADMIN, as in CI's container)."""
    project = make_project({"box": ssh_entry(sshd, tmp_path)}, default="box", files=FILES)
    with small_tmpfs(tmp_path / "hostroot" / ("code" if request.param == "code" else ""), "1m"):
        try:
            yield project
        finally:
            host_module.close_all()


def test_full_disk_recovers_when_pending_deletions_free_the_space(small_disk):
    project = small_disk
    (project / "remote/big1.bin").write_bytes(os.urandom(600 << 10))
    host = open_host(None, project)
    sync(host)
    (project / "remote/big1.bin").unlink()
    (project / "remote/big2.bin").write_bytes(os.urandom(600 << 10))
    report = sync(host)
    assert report.upload == ["remote/big2.bin"] and report.delete == ["remote/big1.bin"]
    assert mirror(project, host) == local_tree(project)


def test_full_disk_fails_cleanly_then_recovers(small_disk):
    project = small_disk
    host = open_host(None, project)
    sync(host)
    before = mirror(project, host)
    (project / "remote/sub/b.py").unlink()
    (project / "remote/new/deep").mkdir(parents=True)
    (project / "remote/new/deep/small.py").write_text("S = 1\n")
    (project / "remote/new/huge.bin").write_bytes(os.urandom(2 << 20))
    with pytest.raises(SyncError, match="No space left") as err:
        sync(host)
    assert "free space" in str(err.value) and str(code_dir(host)) in str(err.value)
    after = mirror(project, host)
    assert after == {k: v for k, v in before.items() if k != "remote/sub/b.py"}, "old or new, never partial"
    assert not any(".draftops-tmp-" in p.name for p in code_dir(host).rglob("*")), "temp files left behind"
    assert not (code_dir(host) / "remote/new").exists(), "folders made for the failed files stay behind"
    (project / "remote/new/huge.bin").unlink()
    sync(host)
    assert mirror(project, host) == local_tree(project)


# ---------------------------------------------------------------- R11: concurrency, lock, running job
def test_concurrent_syncs_from_several_processes_serialise(box, tmp_path):
    """Four checkouts of the project, each with its own edits, sync into one host root at the same
    moment, three times over. Every sync succeeds, the tree ends exactly equal to one checkout (never a
    mixture) and no temp file is left. Without a lock, fixed temp names collided and one scan deleted
    another apply's temp files: crashes here and there, and mixed trees."""
    for i in range(90):
        (box / f"remote/pkg{i % 7}/m{i}.py").parent.mkdir(parents=True, exist_ok=True)
        (box / f"remote/pkg{i % 7}/m{i}.py").write_text(f"M = {i}\n" * 200)
    open_host(None, box).prepare()          # the host key is known before the workers connect
    checkouts = [box]
    for k in range(1, 4):
        shutil.copytree(box, tmp_path / f"checkout{k}", ignore=shutil.ignore_patterns(".draftops"))
        checkouts.append(tmp_path / f"checkout{k}")
    workers = [subprocess.Popen([sys.executable, "-c", SYNC_WORKER, str(checkout)], cwd=REPO, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE) for checkout in checkouts]
    try:
        assert [w.stdout.readline().strip() for w in workers] == ["ready"] * 4
        host = open_host(None, box)
        for round_ in range(3):
            for k, checkout in enumerate(checkouts):
                for i in range(round_ % 3, 90, 3):
                    (checkout / f"remote/pkg{i % 7}/m{i}.py").write_text(f"M = {i} {round_} {k}\n" * 200)
                (checkout / f"remote/only{k}-{round_}.py").write_text("x\n")
                if round_:
                    (checkout / f"remote/only{k}-{round_ - 1}.py").unlink()
            barrier = tmp_path / f"barrier{round_}"
            barrier.mkdir()
            for worker in workers:
                worker.stdin.write(f"{barrier} {len(workers)}\n")
                worker.stdin.flush()
            answers = [json.loads(worker.stdout.readline()) for worker in workers]
            assert all(answer["ok"] for answer in answers), answers
            assert mirror(box, host) in [local_tree(checkout) for checkout in checkouts], f"round {round_}"
            assert not any(".draftops-tmp-" in p.name for p in code_dir(host).rglob("*"))
    finally:
        for worker in workers:
            worker.stdin.close()
            worker.wait(30)


def test_sync_waits_for_the_hosts_sync_lock(project):
    host = open_host(None, project)
    sync(host)
    (project / "remote/a.py").write_text("A = 2\n")
    lock_path = Path(host.root) / "state" / "sync.lock"
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        outcome: dict[str, object] = {}
        worker = threading.Thread(target=lambda: outcome.update(report=sync(open_host(None, project))))
        worker.start()
        time.sleep(1.5)
        assert worker.is_alive(), "a sync must wait while another holds the host's sync lock"
        assert (code_dir(host) / "remote/a.py").read_text() == "A = 1\n"
        fcntl.flock(lock, fcntl.LOCK_UN)
    worker.join(30)
    assert not worker.is_alive() and outcome["report"].upload == ["remote/a.py"]
    assert (code_dir(host) / "remote/a.py").read_text() == "A = 2\n"


def test_sync_refuses_to_change_code_under_a_running_job_unless_forced(project):
    host = open_host(None, project)
    sync(host)
    job = jobs.start(host, "long-run", "sleep 60")
    other = jobs.start(host, "elsewhere", "sleep 60", cwd=".")     # not working in code: no objection
    try:
        deadline = time.monotonic() + 10
        while jobs.status(host, job.id)["state"] != "running" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sync(host).noop, "a sync that changes nothing is never refused"
        (project / "remote/a.py").write_text("A = 2\n")
        (project / "remote/sub/b.py").unlink()
        with pytest.raises(SyncError, match="--force") as err:
            sync(host)
        assert job.id in str(err.value) and other.id not in str(err.value)
        assert f"invoke kill {job.id}" in str(err.value) and "nothing was changed" in str(err.value)
        assert (code_dir(host) / "remote/a.py").read_text() == "A = 1\n"
        assert (code_dir(host) / "remote/sub/b.py").exists()
        report = sync(host, force=True)
        assert report.busy_runs == [job.id] and report.upload == ["remote/a.py"]
        assert (code_dir(host) / "remote/a.py").read_text() == "A = 2\n"
    finally:
        jobs.kill(host, job.id, 1)
        jobs.kill(host, other.id, 1)
    (project / "remote/a.py").write_text("A = 3\n")
    assert sync(host).upload == ["remote/a.py"], "a finished run no longer holds the code"


# ---------------------------------------------------------------- R12: names like our temp files
def test_files_named_like_temp_files_are_synced_and_kept(project):
    (project / "remote/x.draftops-tmp-y").write_text("user data\n")
    (project / f"remote/.draftops-tmp-{os.getpid()}-0badcafe-0").write_text("also user data\n")
    host = open_host(None, project)
    first = sync(host)
    assert "remote/x.draftops-tmp-y" in first.upload
    assert (code_dir(host) / "remote/x.draftops-tmp-y").read_text() == "user data\n"
    again = sync(host)
    assert again.noop and again.bytes_sent == 0, "a file must not be deleted and re-sent on every sync"
    assert mirror(project, host) == local_tree(project)


def test_leftover_temp_file_of_a_killed_apply_is_removed(project):
    host = open_host(None, project)
    sync(host)
    leftover = code_dir(host) / "remote/sub/.draftops-tmp-99999-deadbeef-3"
    leftover.write_bytes(b"half a file")
    sync(host)
    assert not leftover.exists() and mirror(project, host) == local_tree(project)


# ---------------------------------------------------------------- R15: sync paths named twice
def test_sync_paths_naming_the_same_folder_are_sent_once(make_project, sshd, tmp_path, no_inventory_env):
    project = make_project({"box": ssh_entry(sshd, tmp_path, sync_paths=[
        "remote/../remote", "./remote/", "remote/sub", str(tmp_path / "project" / "remote")])},
        default="box", files=FILES)
    host = open_host(None, project)
    first = sync(host)
    assert sorted(first.upload) == sorted(FILES)
    assert sync(host).noop, "the same files under a second name are re-sent on every sync"
    assert mirror(project, host) == local_tree(project)


def test_sync_roots_normalise_and_refuse_escapes(tmp_path):
    (tmp_path / "remote/sub").mkdir(parents=True)
    (tmp_path / "configs").mkdir()
    assert sync_roots(tmp_path, ["remote", "remote/../remote", "./remote/", "remote/sub", "configs"]) == \
        ["remote", "configs"]
    assert sync_roots(tmp_path, ["remote", "."]) == ["."]
    assert sync_roots(tmp_path, [str(tmp_path / "configs")]) == ["configs"]
    for bad in ("..", "../elsewhere", "remote/../../x", "/etc"):
        with pytest.raises(SyncError, match="outside the project"):
            sync_roots(tmp_path, [bad])


# ---------------------------------------------------------------- local oddities
def test_local_fifo_is_a_clear_error_not_a_hang(project):
    os.mkfifo(project / "remote/pipe")
    with pytest.raises(SyncError, match="FIFO") as err:
        sync(open_host(None, project))
    assert str(project / "remote/pipe") in str(err.value) and ".gitignore" in str(err.value)


def test_file_names_that_are_not_utf8_round_trip(project):
    odd = os.fsdecode(b"remote/caf\xe9-latin1.py")
    (project / odd).write_text("odd = True\n")
    host = open_host(None, project)
    sync(host)
    assert (code_dir(host) / odd).read_text() == "odd = True\n"
    assert sync(host).noop


BOUNDED_SYNC = """
import resource, sys
from pathlib import Path
from draftops.errors import DraftopsError
from draftops.link.host import open_host
from draftops.runs.sync import sync
host = open_host(None, Path(sys.argv[1]), prepare=True)
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[2]), resource.RLIM_INFINITY))
try:
    sync(host)
except DraftopsError as exc:
    print("error:", exc)
"""


def test_changes_too_big_for_memory_are_a_clear_error_not_a_memory_error_traceback(box):
    """The changes travel as one tar held in memory: a weights file bigger than the memory left made
    `invoke sync` end in a MemoryError traceback. It is one paragraph naming the file and the fix."""
    open_host(None, box).prepare()                     # the host key is known before the worker connects
    with open(box / "remote" / "weights.bin", "wb") as fh:   # sparse: no disk, but 1.5 GiB to read
        fh.truncate(3 << 29)
    done = subprocess.run([sys.executable, "-c", BOUNDED_SYNC, str(box), str(1200 << 20)], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "do not fit in memory" in done.stdout and "remote/weights.bin" in done.stdout, done.stdout
    assert ".gitignore" in done.stdout


def test_a_gitignore_that_is_not_utf8_is_read_as_git_reads_it(tmp_path):
    """git reads .gitignore as bytes: a Latin-1 name in it (or any byte) made the scan end in a
    UnicodeDecodeError traceback. Its patterns match the names os.walk gives for those bytes."""
    (tmp_path / "remote").mkdir()
    (tmp_path / "remote" / "keep.py").write_text("K = 1\n")
    (tmp_path / "remote" / os.fsdecode(b"caf\xe9.bin")).write_bytes(b"x")
    (tmp_path / "remote" / ".gitignore").write_bytes(b"caf\xe9.bin\n")
    assert set(local_manifest(tmp_path, ["remote"])) == {"remote/keep.py", "remote/.gitignore"}


def test_a_gitignore_pattern_pathspec_cannot_read_is_named_with_its_line(tmp_path):
    """An invalid pattern (a lone backslash) ended the scan in pathspec's traceback; it is a SyncError
    naming the file and line, before anything is sent (a pattern left out could send a secret)."""
    (tmp_path / "remote").mkdir()
    (tmp_path / "remote" / "keep.py").write_text("K = 1\n")
    (tmp_path / "remote" / ".gitignore").write_text("*.log\nsecret.txt\n\\\n")
    with pytest.raises(SyncError, match=r"remote/\.gitignore:3: '\\\\' is not a \.gitignore pattern"):
        local_manifest(tmp_path, ["remote"])
