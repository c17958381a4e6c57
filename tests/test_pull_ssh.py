"""`pull` of run folders holding odd entries (links out, `..` links, FIFOs, sockets, unreadable files)
and pulls cut short: nothing crashes, nothing is followed out of the run folder, every left-out entry
is named with a reason, and the local folder is either the whole new copy or left as it was."""
from __future__ import annotations

import io
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

from draftops import onhost
from draftops.errors import DraftopsError, JobError
from draftops.link.host import open_host
from draftops.onhost import agent as hostagent
from draftops.runs import jobs
from tests.support.processes import wait_state

pytestmark = pytest.mark.ssh


@pytest.fixture(params=["box", "local"])
def project(request, make_project, sshd, tmp_path, no_inventory_env):
    from tests.conftest import ssh_entry
    return make_project({"box": ssh_entry(sshd, tmp_path)}, default=request.param)


def finished_job(project, script: str = "echo done") -> tuple[object, jobs.Job]:
    host = open_host(None, project)
    job = jobs.start(host, "odd", script)
    wait_state(project, job.id, {"succeeded"})
    return host, job


def fill_with_odd_entries(run_dir: Path, outside: Path) -> None:
    (run_dir / "sub" / "deeper").mkdir(parents=True)
    (run_dir / "sub" / "deeper" / "file.txt").write_text("deep")
    (run_dir / "report.json").write_text('{"ok": true}')
    (run_dir / "empty-dir").mkdir()
    (outside / "secret.txt").write_text("outside the run folder")
    os.symlink("sub/deeper/file.txt", run_dir / "latest")                 # stays inside: kept
    os.symlink("sub", run_dir / "sub-link")                              # folder link inside: kept
    os.symlink(str(outside / "secret.txt"), run_dir / "abs-link")         # absolute: left out
    os.symlink(str(outside), run_dir / "abs-dir-link")
    os.symlink("../../../../../../../../etc/passwd", run_dir / "dotdot-link")
    os.symlink("sub/../../x", run_dir / "sneaky-link")
    os.symlink("missing-target", run_dir / "dangling")                   # inside, dangling: kept
    os.mkfifo(run_dir / "fifo")
    os.mknod(run_dir / "sock", stat.S_IFSOCK | 0o600)                   # what a bound unix socket leaves


def test_pull_of_a_run_folder_with_links_fifos_and_sockets(project, tmp_path):
    host, job = finished_job(project)
    outside = tmp_path / "outside"
    outside.mkdir()
    fill_with_odd_entries(Path(job.run_dir), outside)
    pulled = jobs.pull_run(host, job.id)
    dest = pulled.path
    assert dest == project / "runs" / job.id
    assert (dest / "sub" / "deeper" / "file.txt").read_text() == "deep"
    assert (dest / "latest").is_symlink() and (dest / "latest").read_text() == "deep"
    assert (dest / "sub-link").is_symlink() and (dest / "sub-link" / "deeper" / "file.txt").is_file()
    assert (dest / "dangling").is_symlink() and (dest / "empty-dir").is_dir()
    assert (dest / "log").read_text() == "done\n"
    skipped = {note["path"]: note["reason"] for note in pulled.skipped}
    assert set(skipped) == {"abs-link", "abs-dir-link", "dotdot-link", "sneaky-link", "fifo", "sock"}
    assert "absolute" in skipped["abs-link"] and "FIFO" in skipped["fifo"] and "socket" in skipped["sock"]
    assert "'..'" in skipped["dotdot-link"]
    for name in skipped:
        assert not os.path.lexists(dest / name)
    assert not (dest / hostagent.PULL_NOTES).exists()
    assert sorted(p.name for p in (project / "runs").iterdir()) == [job.id]     # no temp folder left
    assert (outside / "secret.txt").read_text() == "outside the run folder"


def test_a_folder_marked_host_only_stays_on_the_host_but_its_marker(project):
    """The engine states a capture check keeps (gigabytes on a real target) are read on the host only."""
    host, job = finished_job(project)
    kept = Path(job.run_dir) / "engine-states"
    kept.mkdir()
    (kept / "hs_0.safetensors").write_bytes(b"\0" * 4096)
    (kept / hostagent.HOST_ONLY).write_text("stays on the host")
    (Path(job.run_dir) / "capture-check.json").write_text("{}")
    pulled = jobs.pull_run(host, job.id)
    assert (pulled.path / "capture-check.json").is_file() and pulled.skipped == []
    assert sorted(p.name for p in (pulled.path / "engine-states").iterdir()) == [hostagent.HOST_ONLY]
    assert (kept / "hs_0.safetensors").is_file()                   # the host's copy is untouched


def test_pull_replaces_an_earlier_copy_whole(project):
    host, job = finished_job(project)
    (Path(job.run_dir) / "stale-local-file").write_text("from an earlier pull")
    first = jobs.pull(host, job.id)
    assert (first / "stale-local-file").exists()
    (Path(job.run_dir) / "stale-local-file").unlink()              # gone on the host since
    (Path(job.run_dir) / "new-on-host").write_text("new")
    second = jobs.pull(host, job.id)
    assert second == first and (second / "new-on-host").read_text() == "new"
    assert not (second / "stale-local-file").exists()
    assert sorted(p.name for p in (project / "runs").iterdir()) == [job.id]


def test_a_pull_cut_short_leaves_the_earlier_copy_and_no_partial_folder(project):
    host, job = finished_job(project)
    big = Path(job.run_dir) / "big.bin"
    big.write_bytes(os.urandom(4 << 20))
    earlier = jobs.pull(host, job.id)
    (earlier / "marker").write_text("the earlier copy")
    real_stream = host.transport.stream

    def dropped(command, on_output):                   # the link drops after 256 KiB of the tar
        sent = {"n": 0}

        def part(chunk: bytes) -> None:
            if sent["n"] < 256 << 10:
                on_output(chunk[:(256 << 10) - sent["n"]])
            sent["n"] += len(chunk)

        real_stream(command, part)
        return -1

    host.transport.stream = dropped
    with pytest.raises(JobError, match="left as it was"):
        jobs.pull_run(host, job.id)
    host.transport.stream = real_stream
    assert (earlier / "marker").read_text() == "the earlier copy"
    assert sorted(p.name for p in (project / "runs").iterdir()) == [job.id]
    fresh = jobs.pull_run(host, job.id, dest_root=project / "other")
    assert (fresh.path / "big.bin").read_bytes() == big.read_bytes()


def test_a_corrupt_stream_is_an_error_and_leaves_nothing(project):
    host, job = finished_job(project)
    real_stream = host.transport.stream

    def corrupt(command, on_output):
        def flip(chunk: bytes) -> None:
            on_output(chunk.replace(b"\x00", b"\x01"))
        return real_stream(command, flip)

    host.transport.stream = corrupt
    with pytest.raises(JobError, match="failed"):
        jobs.pull_run(host, job.id)
    host.transport.stream = real_stream
    assert not (project / "runs").exists() or list((project / "runs").iterdir()) == []


def test_pull_refuses_a_run_folder_that_is_a_symlink_and_bad_ids(project, tmp_path):
    host = open_host(None, project)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "private").write_text("not a run")
    Path(host.runs_dir).mkdir(parents=True, exist_ok=True)
    os.symlink(elsewhere, Path(host.runs_dir) / "linked-run")
    with pytest.raises(DraftopsError, match="without following links"):
        jobs.pull_run(host, "linked-run")
    assert not (project / "runs" / "linked-run").exists()
    for bad in ("../hostroot", "a/b", ".hidden"):
        with pytest.raises(JobError, match="not a run id"):
            jobs.pull_run(host, bad)


def test_a_local_tar_with_members_leading_out_is_not_unpacked_there(tmp_path):
    """Defence in depth: the local side checks what it unpacks even if a host sends bad members."""
    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        def add(name: str, kind: bytes, link: str = "", data: bytes = b"") -> None:
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.size = kind, link, len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)
        add("ok.txt", tarfile.REGTYPE, data=b"ok")
        add("../escape.txt", tarfile.REGTYPE, data=b"x")
        add("/abs.txt", tarfile.REGTYPE, data=b"x")
        add("a", tarfile.SYMTYPE, link="b/../..")
        add("hard", tarfile.LNKTYPE, link="ok.txt")
        add("dev", tarfile.CHRTYPE)
        add("fifo", tarfile.FIFOTYPE)
    tree = tmp_path / "tree"
    tree.mkdir()
    skipped = jobs._extract(archive, tree)
    assert sorted(p.name for p in tree.iterdir()) == ["ok.txt"]
    assert {n["path"] for n in skipped} == {"../escape.txt", "/abs.txt", "a", "hard", "dev", "fifo"}
    assert not (tmp_path / "escape.txt").exists()


def test_unreadable_entries_are_left_out_with_a_note(tmp_path):
    """The agent packs as an ordinary user (uid 65534): a 0600 file and a 0700 folder of root's are
    named in the notes, the rest travels."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or os.getuid() != 0:
        pytest.skip("needs root and setpriv to make files another user cannot read")
    base = Path(tempfile.mkdtemp(prefix="draftops-pack-"))
    try:
        base.chmod(0o755)
        run_dir = base / "runs" / "r1"
        (run_dir / "closed").mkdir(parents=True)
        (run_dir / "open.txt").write_text("readable")
        (run_dir / "secret.txt").write_text("root only")
        (run_dir / "closed" / "inside.txt").write_text("x")
        for path in (base / "runs", run_dir):
            path.chmod(0o755)
        (run_dir / "open.txt").chmod(0o644)
        (run_dir / "secret.txt").chmod(0o600)
        (run_dir / "closed").chmod(0o700)
        agent = base / "agent.py"
        agent.write_text(onhost.source())
        agent.chmod(0o644)
        proc = subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
                               str(agent), str(base), "pack", "runs/r1"],
                              capture_output=True, env={"DRAFTOPS_FRAME": "n0nce", "PATH": os.environ["PATH"]},
                              check=False)
        assert proc.returncode == 0, proc.stderr.decode()
        from draftops.link.framing import Unframer
        body = bytearray()
        unframer = Unframer("n0nce", body.extend, lambda header: None)
        unframer.feed(proc.stdout)
        with tarfile.open(fileobj=io.BytesIO(bytes(body)), mode="r:gz") as tar:
            names = tar.getnames()
            notes = tar.extractfile(hostagent.PULL_NOTES).read().decode()
        assert "open.txt" in names and "secret.txt" not in names and "closed/inside.txt" not in names
        assert "secret.txt" in notes and "Permission denied" in notes and "closed" in notes
    finally:
        shutil.rmtree(base)


def test_pull_again_keeps_files_written_here_after_the_earlier_pull(project):
    """`invoke bench` writes bench-result.json into runs/<id>/ after pulling it; pulling that run again
    (to see its log) must not delete it, nor a note of ours, while the host's files are refreshed."""
    host, job = finished_job(project)
    first = jobs.pull(host, job.id)
    (first / "bench-result.json").write_text('{"schema": "draftops.bench-result/1"}')
    (first / "notes").mkdir()
    (first / "notes" / "mine.md").write_text("looked fine")
    (first / "log").write_text("edited here")
    (Path(job.run_dir) / "new-on-host").write_text("new")
    second = jobs.pull(host, job.id)
    assert (second / "bench-result.json").read_text() == '{"schema": "draftops.bench-result/1"}'
    assert (second / "notes" / "mine.md").read_text() == "looked fine"
    assert (second / "log").read_text() == "done\n"                  # the host's file wins
    assert (second / "new-on-host").read_text() == "new"
    assert sorted(p.name for p in (project / "runs").iterdir()) == [job.id]


PULL_WORKER = """
import sys
from pathlib import Path
from draftops.runs import jobs
from draftops.link.host import open_host
host = open_host(None, Path(sys.argv[1]))
real = host.agent.pack
def slow(run_id, write):                      # half the tar, then hang: the test kills us here
    def part(chunk):
        write(chunk)
        print("writing", flush=True)
        import time; time.sleep(600)
    real(run_id, part)
host.agent.pack = slow
jobs.pull_run(host, sys.argv[2])
"""


def test_a_pull_killed_mid_transfer_leaves_no_temp_folder_behind_the_next_pull(project):
    """SIGKILL (or a power cut) skips the pull's clean-up: its temp folder stayed in runs/ for good, as
    big as what had arrived. The next pull removes what a dead pull left, never a live pull's folder."""
    host, job = finished_job(project)
    (Path(job.run_dir) / "big.bin").write_bytes(os.urandom(1 << 20))
    runs = project / "runs"
    live = subprocess.Popen([sys.executable, "-c", PULL_WORKER, str(project), job.id], stdout=subprocess.PIPE,
                            text=True)
    dead = subprocess.Popen([sys.executable, "-c", PULL_WORKER, str(project), job.id], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert live.stdout.readline().strip() == "writing" and dead.stdout.readline().strip() == "writing"
        dead.kill()
        dead.wait()
        assert len(list(runs.glob(f".{job.id}.pull-*"))) == 2
        pulled = jobs.pull_run(host, job.id)
        assert (pulled.path / "big.bin").stat().st_size == 1 << 20
        assert len(list(runs.glob(f".{job.id}.pull-*"))) == 1, "the live pull's folder must stay"
    finally:
        live.kill()
        live.wait()
    jobs.pull_run(host, job.id)
    assert sorted(p.name for p in runs.iterdir()) == [job.id]


def host_folder(host, name: str) -> Path:
    """A folder in the host's <root>/runs named ``name`` (as a stray or crafted run folder would be)."""
    folder = Path(host.runs_dir) / name
    folder.mkdir(parents=True)
    (folder / "log").write_text("from the host\n")
    return folder


@pytest.mark.parametrize("name", ["history.sqlite", "history.sqlite-wal", "nightly-2026-12-01",
                                  "nightly-2026-12-01-031500-2", "nightly.log"])
def test_pull_refuses_ids_that_name_draftops_own_local_files(project, name):
    """The probe pulled a host run folder named history.sqlite: the local history became a folder."""
    from draftops import history
    host = open_host(None, project)
    history.for_project(project).record(history.RunRecord(
        run_id="r1", kind="serve", host="box", time="2026-12-01T00:00:00+00:00"))
    db = project / "runs" / "history.sqlite"
    before = db.read_bytes()
    host_folder(host, name)
    with pytest.raises(JobError) as info:
        jobs.pull_run(host, name)
    assert "draftops' own local file" in str(info.value) and "Rename the folder on the host" in str(info.value)
    assert db.is_file() and db.read_bytes() == before
    assert not (project / "runs" / name).is_dir()


@pytest.mark.parametrize("local", ["folder", "file", "link"])
def test_pull_refuses_to_replace_a_local_entry_the_host_did_not_put_there(project, local, tmp_path):
    """A compare folder written here, a user's file or a link of the same name stays as it was."""
    host = open_host(None, project)
    run_id = jobs.new_run_id("compare")
    host_folder(host, run_id)
    dest = project / "runs" / run_id
    dest.parent.mkdir(parents=True, exist_ok=True)
    if local == "folder":
        dest.mkdir()
        (dest / "compare.json").write_text("{}")
    elif local == "file":
        dest.write_text("mine")
    else:
        (tmp_path / "target").mkdir()
        os.symlink(tmp_path / "target", dest)
    with pytest.raises(JobError, match=rf"{dest} exists here and is a .*Move it aside"):
        jobs.pull_run(host, run_id)
    if local == "folder":
        assert sorted(os.listdir(dest)) == ["compare.json"]
    elif local == "file":
        assert dest.read_text() == "mine"
    else:
        assert dest.is_symlink()
    assert sorted(p.name for p in (project / "runs").iterdir()) == [run_id]
