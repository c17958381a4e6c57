"""Kept connections (hosts.yaml `persist:`, draftops/link/keeper.py) against a real sshd of their own: a later
call goes through the keeper and a standby agent, gets the same results as a direct connection, and
falls back to a direct connection whenever the keeper is missing, dead, not safely ours or loses its link.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from draftops.errors import InventoryError, RemoteError
from draftops.link import host as host_module
from draftops.link import keeper_link
from draftops.link.agent import AGENT_NAME
from draftops.link.connection import SSHTransport
from draftops.link.host import open_host, project_inventory
from tests.conftest import REPO, ssh_entry
from tests.support.proc import pids_whose
from tests.support.sshd import Sshd, children, start_sshd

pytestmark = pytest.mark.ssh


def _kill(pid: int) -> None:
    """SIGKILL ``pid`` if it is still there (a listed process may have ended since)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _keepers(folder: Path) -> list[int]:
    """Pids of live keeper processes serving ``folder``."""
    def serving(cmdline: bytes) -> bool:
        argv = cmdline.split(b"\0")
        return b"draftops.link.keeper" in argv and str(folder).encode() in argv
    return pids_whose("cmdline", serving)


def wait_for(check, seconds: float = 15.0, what: str = "") -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        time.sleep(0.05)


class Box:
    """A project whose default host is this test's own sshd, with keepers in a folder of this test."""

    def __init__(self, project: Path, server: Sshd, folder: Path):
        self.project, self.server, self.folder = project, server, folder
        inventory = project_inventory(project)
        self.inventory = inventory
        self.spec = inventory.get("box")
        self.chain = [*inventory.jump_chain(self.spec), self.spec]
        self.key = keeper_link.keeper_key(self.chain)
        self.socket = keeper_link.socket_path(folder, self.key)

    def start_keeper(self, persist: float = 30.0) -> None:
        # spawn() declines while the key's lock is held, and a keeper that has just ended may hold it
        # a moment longer than it shows in the process list (its fds close after its memory is gone)
        wait_for(lambda: keeper_link.spawn(self.chain, persist, self.folder, self.key), what="a keeper to start")
        wait_for(lambda: self.socket.exists() and keeper_link._alive(self.socket), what="the keeper's socket")

    def kept(self) -> keeper_link.KeptTransport:
        transport = keeper_link.open_transport(self.spec, self.inventory)
        assert isinstance(transport, keeper_link.KeptTransport)
        return transport

    def invoke(self, *args: str, timing: bool = False, timeout: float = 120) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
        env.pop("DRAFTOPS_HOST", None)
        if timing:
            env["DRAFTOPS_TIMING"] = "1"
        return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=self.project, env=env,
                              capture_output=True, text=True, timeout=timeout)

    def standbys(self) -> list[int]:
        """Pids of standby agents on the host (its processes are this machine's): pythons running
        ``-S <agent> --standby``, not the shells that start them."""
        def standby(cmdline: bytes) -> bool:
            argv = cmdline.split(b"\0")[:-1]
            return len(argv) == 4 and argv[1] == b"-S" and argv[3] == b"--standby" and \
                argv[2].startswith(self.spec.root.encode())
        return pids_whose("cmdline", standby)

    def waiting_standbys(self) -> list[int]:
        """Standbys that said ready: blocked reading their call on stdin (syscall 0, read, on fd 0)."""
        def reading(pid: int) -> bool:
            try:
                return Path(f"/proc/{pid}/syscall").read_text().startswith("0 0x0 ")
            except OSError:
                return False
        return [pid for pid in self.standbys() if reading(pid)]


@pytest.fixture
def box(make_project, client_key: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        request: pytest.FixtureRequest) -> Iterator[Box]:
    """A project and sshd of this test's own; a test marked ``banner`` gets an sshd whose SSH user's
    ~/.bashrc prints (tests/test_agent_framing_ssh.py's NOISY_BASHRC)."""
    folder = Path(tempfile.mkdtemp(prefix="dk-", dir="/tmp"))      # short: a socket path holds 108 bytes
    folder.chmod(0o700)
    extra = ""
    if request.node.get_closest_marker("banner"):
        from tests.support.banners import NOISY_BASHRC

        home = tmp_path / "home"
        home.mkdir()
        (home / ".bashrc").write_text(NOISY_BASHRC)
        extra = f"SetEnv HOME={home}\n"
    server = start_sshd(tmp_path / "sshd", client_key, extra_config=extra)
    monkeypatch.setenv("DRAFTOPS_PERSIST", "30")
    monkeypatch.setenv("DRAFTOPS_KEEPER_DIR", str(folder))
    project = make_project({"box": ssh_entry(server, tmp_path)}, default="box")
    shutil.copy(REPO / "tasks.py", project / "tasks.py")
    try:
        yield Box(project, server, folder)
    finally:
        host_module.close_all()
        keeper_link.PENDING.clear()               # no keeper for this sshd when pytest exits
        try:
            keeper_link.disconnect_all()
            wait_for(lambda: not _keepers(folder), what="the keepers to stop")
        finally:                                  # whatever failed above, no sshd or keeper is left
            for pid in [*_keepers(folder), *children(server.proc.pid)]:
                _kill(pid)
            server.stop()
            shutil.rmtree(folder, ignore_errors=True)


def test_the_second_invoke_call_goes_through_the_keeper_and_its_standby_agent(box: Box) -> None:
    first = box.invoke("sync", timing=True)
    assert first.returncode == 0, first.stderr
    assert "took handshake" in first.stderr and "took keeper" not in first.stderr
    wait_for(lambda: box.socket.exists(), what="the keeper the first call left")   # spawned as it exited
    second = box.invoke("sync", timing=True)
    assert second.returncode == 0, second.stderr
    assert "took keeper" in second.stderr and "took handshake" not in second.stderr
    # The second call's boot told the keeper which agent to start ahead, and its apply already ran in it.
    wait_for(lambda: len(box.standbys()) == 1, what="a standby agent")
    (standby,) = box.standbys()
    (box.project / "remote" / "job.py").write_text("print('changed')\n")
    third = box.invoke("sync", timing=True)
    assert third.returncode == 0, third.stderr
    code = Path(box.spec.root) / "code" / "remote" / "job.py"
    assert code.read_text() == "print('changed')\n"
    assert standby not in box.standbys()          # it ran the third call's boot, then ended
    wait_for(lambda: len(box.standbys()) == 1, what="the next standby")


def test_commands_through_a_keeper_behave_as_direct_ones(box: Box) -> None:
    box.start_keeper()
    kept = box.kept()
    result = kept.run("echo out; echo 'it''s' >&2; exit 3", check=False)
    assert (result.exit_code, result.stdout, result.stderr) == (3, b"out\n", b"its\n")
    with pytest.raises(RemoteError, match="exited 3"):
        kept.run("exit 3")
    blob = os.urandom(3 << 20)
    assert kept.run("cat", input=blob).stdout == blob
    seen: list[bytes] = []
    assert kept.stream("echo a; echo b >&2; exit 4", seen.append) == 4
    assert b"".join(seen).split() == [b"a", b"b"]
    with pytest.raises(RemoteError, match="timed out"):
        kept.run("sleep 5", timeout=0.5)
    results: dict[int, bytes] = {}

    def one(i: int) -> None:
        results[i] = kept.run(f"sleep 0.2; echo {i}").stdout

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {i: f"{i}\n".encode() for i in range(8)}
    assert kept.direct is None                     # all of it went through the keeper


def test_agent_calls_use_a_standby_and_a_broken_one_is_never_used(box: Box) -> None:
    box.start_keeper()
    host = open_host("box", box.project)
    assert isinstance(host.transport, keeper_link.KeptTransport)
    host.prepare()                                 # boots by exec; then tells the keeper
    wait_for(lambda: len(box.standbys()) == 2, what="standby agents")
    first = box.standbys()
    host_module.close_all()
    again = open_host("box", box.project)
    again.prepare()                                # the boot is run by a standby
    assert again.agent.info is not None and again.agent.info.root == host.agent.info.root
    wait_for(lambda: len(set(first) - set(box.standbys())) == 1 and len(box.standbys()) == 2,
             what="a fresh standby in place of the one used")
    assert again.agent.runs() == []                # a call after the boot, by the next standby
    # A standby that cannot start (its agent path is wrong) is dropped; calls go by exec meanwhile.
    for pid in box.standbys():
        _kill(pid)
    wait_for(lambda: not box.standbys(), what="the standbys to end")
    time.sleep(0.5)     # and the keeper to see their channels close
    again.transport.standby_ready(again.agent.python, AGENT_NAME, "/nonexistent/agent.pyc")  # type: ignore[attr-defined]
    assert again.agent.runs() == []
    host_module.close_all()
    third = open_host("box", box.project)
    third.prepare()
    assert third.agent.runs() == []


def test_a_standby_killed_after_the_keepers_look_at_it_costs_nothing_and_runs_nothing_twice(box: Box) -> None:
    """The keeper sees a stopped standby as usable and hands it the call; it is killed before it reads
    the call. Its channel ends without the standby's took line, so the keeper runs the call by exec."""
    box.start_keeper()
    host = open_host("box", box.project)
    host.prepare()
    wait_for(lambda: len(box.waiting_standbys()) == 2, what="standby agents")
    stopped = box.standbys()
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    marker = box.project / "ran"
    outcome: dict[str, object] = {}

    def start() -> None:
        try:
            outcome["pid"] = host.agent.start("20260101-000000-once-aaaa", {
                "name": "once", "command": f"echo ran >> {shlex.quote(str(marker))}", "cwd": "."})
        except Exception as exc:  # noqa: BLE001 - reported below
            outcome["error"] = exc

    caller = threading.Thread(target=start)
    caller.start()
    time.sleep(1.0)                                # the keeper is waiting for a stopped standby
    assert caller.is_alive()
    for pid in stopped:
        _kill(pid)
    caller.join(30)
    assert "error" not in outcome, outcome
    wait_for(lambda: host.agent.status("20260101-000000-once-aaaa").get("state") == "succeeded", what="the job")
    assert marker.read_text() == "ran\n"           # once
    assert host.agent.runs() != [] and host.transport.direct is None  # type: ignore[attr-defined]
    # 3 MB of input, more than the stopped standby's channel takes in: all of it reaches the exec, in order.
    wait_for(lambda: box.waiting_standbys() and box.waiting_standbys() == box.standbys(), what="a standby again")
    stopped = box.standbys()
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    blob = os.urandom(3 << 20)
    request = host.agent.standby_request({"argv": [host.agent.info.root, "runs", "runs"], "env": {}})
    got: dict[str, object] = {}
    caller = threading.Thread(target=lambda: got.update(
        done=host.transport.run_standby(request, "cat", blob)))  # type: ignore[attr-defined]
    caller.start()
    time.sleep(1.0)
    for pid in stopped:
        _kill(pid)
    caller.join(30)
    done = got["done"]
    assert done.exit_code == 0 and done.stdout == blob       # type: ignore[attr-defined]


def test_a_dead_missing_or_foreign_keeper_means_a_direct_connection(box: Box) -> None:
    box.start_keeper()
    (pid,) = _keepers(box.folder)
    _kill(pid)
    wait_for(lambda: not _keepers(box.folder), what="the keeper to die")
    assert box.socket.exists()                     # stale: nobody answers it
    direct = keeper_link.open_transport(box.spec, box.inventory)
    assert isinstance(direct, SSHTransport)
    assert direct.run("echo ok").stdout == b"ok\n"
    direct.close()
    box.socket.unlink()
    box.socket.write_text("not a socket")
    direct = keeper_link.open_transport(box.spec, box.inventory)
    assert isinstance(direct, SSHTransport)
    direct.close()
    box.socket.unlink()
    box.folder.chmod(0o755)                        # readable by others: not used at all
    assert keeper_link.keeper_dir() is None
    assert isinstance(keeper_link.open_transport(box.spec, box.inventory), SSHTransport)
    box.folder.chmod(0o700)


def test_a_keeper_gone_between_calls_means_the_next_command_runs_directly(box: Box) -> None:
    box.start_keeper()
    kept = box.kept()
    assert kept.run("echo one").stdout == b"one\n" and kept.direct is None
    (pid,) = _keepers(box.folder)
    _kill(pid)
    wait_for(lambda: not _keepers(box.folder), what="the keeper to die")
    keeper_link.PENDING.clear()
    assert kept.run("echo two").stdout == b"two\n"       # nothing had started: run directly instead
    assert isinstance(kept.direct, SSHTransport)
    assert [entry[3] for entry in keeper_link.PENDING] == [box.key]   # a new keeper as this process exits
    keeper_link.spawn_pending()
    wait_for(lambda: box.socket.exists() and keeper_link._alive(box.socket), what="the new keeper")
    kept.close()


def test_a_command_in_flight_when_the_keeper_dies_fails_clearly(box: Box) -> None:
    box.start_keeper()
    kept = box.kept()
    (pid,) = _keepers(box.folder)
    threading.Timer(0.5, _kill, (pid,)).start()
    result = kept.run("sleep 3; echo done", check=False)
    assert result.exit_code == -1
    assert b"kept connection to the host was lost" in result.stderr
    assert b"done" not in result.stdout


def test_a_dropped_link_stops_the_keeper_and_calls_connect_directly(box: Box) -> None:
    box.start_keeper()
    box.kept().run("true")
    for child in children(box.server.proc.pid):   # the sshd side of the kept connection
        _kill(child)
    wait_for(lambda: not _keepers(box.folder) and not box.socket.exists(), what="the keeper to stop")
    direct = keeper_link.open_transport(box.spec, box.inventory)
    assert isinstance(direct, SSHTransport) and direct.run("echo back").stdout == b"back\n"
    direct.close()


def test_an_idle_keeper_stops_and_disconnect_stops_one_now(box: Box) -> None:
    assert keeper_link.spawn(box.chain, 1, box.folder, box.key)       # idle from the start: 1 s
    log = box.folder / f"{box.key}.log"
    wait_for(lambda: log.exists() and "idle for 1s; stopping" in log.read_text(), seconds=30,
             what="the idle keeper to stop")
    wait_for(lambda: not box.socket.exists() and not _keepers(box.folder), what="it to be gone")
    box.start_keeper()
    out = box.invoke("disconnect")
    assert out.returncode == 0 and "kept connection closed" in out.stdout, out.stderr
    wait_for(lambda: not _keepers(box.folder), what="the keeper to stop")
    assert not box.socket.exists()
    again = box.invoke("disconnect")
    assert again.returncode == 0 and "no kept connection" in again.stdout
    wait_for(lambda: keeper_link.spawn(box.chain, 30, box.folder, box.key), what="a keeper to start")
    assert keeper_link.disconnect_all() == 1       # one still connecting (just left by a call) is waited for
    wait_for(lambda: not _keepers(box.folder), what="the starting keeper to stop")


def test_a_keeper_that_cannot_connect_backs_off(box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    for child in children(box.server.proc.pid):
        _kill(child)
    box.server.stop()
    assert keeper_link.spawn([box.spec], 30, box.folder, box.key)
    failed = box.folder / f"{box.key}.failed"
    wait_for(failed.exists, seconds=30, what="the failed keeper's marker")
    assert not keeper_link.spawn([box.spec], 30, box.folder, box.key)    # not again for a minute
    assert "could not connect" in (box.folder / f"{box.key}.log").read_text()


def test_persist_from_the_environment_is_checked(box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRAFTOPS_PERSIST", "soon")
    with pytest.raises(InventoryError, match="DRAFTOPS_PERSIST"):
        keeper_link.persist_seconds(box.spec)
    monkeypatch.setenv("DRAFTOPS_PERSIST", "0")
    assert isinstance(keeper_link.open_transport(box.spec, box.inventory), SSHTransport)
    monkeypatch.delenv("DRAFTOPS_PERSIST")
    assert keeper_link.persist_seconds(box.spec) == 600.0           # hosts.yaml's default
    other = box.spec.model_copy(update={"port": box.spec.port + 1})
    assert keeper_link.keeper_key([other]) != box.key


def test_a_keeper_holds_a_connection_through_a_jump_host(box: Box, jump_sshd: Sshd, tmp_path: Path) -> None:
    from tests.support.forwarding import _forwarded_to

    (box.project / "hosts.yaml").write_text(yaml.safe_dump({"default": "box", "hosts": {
        "bastion": ssh_entry(jump_sshd, tmp_path), "box": ssh_entry(box.server, tmp_path, jump="bastion")}}))
    behind = Box(box.project, box.server, box.folder)
    assert behind.key != box.key                   # another way to the host: another keeper
    before = _forwarded_to(jump_sshd, box.server.port)
    behind.start_keeper()
    assert _forwarded_to(jump_sshd, box.server.port) > before   # the keeper went through the bastion
    assert behind.kept().run("echo via-jump").stdout == b"via-jump\n"


def test_a_job_started_followed_read_and_pulled_through_a_keeper(box: Box) -> None:
    """The streaming agent calls (follow, tail, pack) and a job's start, through the keeper and its
    standby agents: the same results as over a direct connection (tests/test_jobs_ssh.py)."""
    from draftops.runs import jobs

    box.start_keeper()
    host = open_host("box", box.project)
    assert isinstance(host.transport, keeper_link.KeptTransport)
    host.prepare()
    wait_for(lambda: box.standbys(), what="a standby agent")
    emit = 'echo "@@draftops {\\"event\\": \\"progress\\", \\"done\\": 1, \\"total\\": 2}"'
    out = '"$DRAFTOPS_RUN_DIR/out.txt"'
    job = jobs.start(host, "kept", f"echo one; {emit}; sleep 0.5; echo two; echo it\\'s > {out}")
    lines: list[str] = []
    seen: list[dict] = []
    final = jobs.follow(host, job.id, lines.append, seen.append)
    assert lines == ["one", "two"] and seen[0]["done"] == 1
    assert final["state"] == "succeeded" and final["exit_code"] == 0
    read: list[str] = []
    jobs.read_log(host, job.id, read.append)
    assert read == ["one", "two"]
    pulled = jobs.pull(host, job.id, box.project / "runs")
    assert (pulled / "out.txt").read_text() == "it's\n"
    assert host.transport.direct is None          # every call went through the keeper


def test_a_job_started_through_a_keeper_survives_the_keepers_link_dropping(box: Box) -> None:
    from draftops.runs import jobs

    box.start_keeper()
    host = open_host("box", box.project)
    host.prepare()
    wait_for(lambda: box.standbys(), what="a standby agent")
    job = jobs.start(host, "survivor", "sleep 1.5; echo finished > \"$DRAFTOPS_RUN_DIR/out.txt\"; exit 7")
    for child in children(box.server.proc.pid):   # the sshd side of the kept connection, standbys too
        _kill(child)
    wait_for(lambda: not _keepers(box.folder), what="the keeper to stop")
    host_module.close_all()
    again = open_host("box", box.project)         # a direct connection now
    assert isinstance(again.transport, SSHTransport)
    deadline = time.monotonic() + 20
    while (row := jobs.status(again, job.id))["state"] in ("starting", "running"):
        assert time.monotonic() < deadline, row
        time.sleep(0.2)
    assert row["state"] == "failed" and row["exit_code"] == 7
    out = Path(host.agent.info.root) / "runs" / job.id / "out.txt"   # type: ignore[union-attr]
    assert out.read_text() == "finished\n"


def test_a_keeper_that_cannot_listen_leaves_nothing_and_calls_go_direct(box: Box) -> None:
    box.socket.mkdir()
    (box.socket / "in the way").write_text("")    # its socket cannot be renamed over this
    assert keeper_link.spawn(box.chain, 30, box.folder, box.key)
    failed = box.folder / f"{box.key}.failed"
    wait_for(failed.exists, what="the keeper's failure marker")
    wait_for(lambda: not _keepers(box.folder), what="the keeper to end")
    assert "could not listen" in (box.folder / f"{box.key}.log").read_text()
    assert not list(box.folder.glob(f"{box.key}.sock.*"))         # no staging socket left
    direct = keeper_link.open_transport(box.spec, box.inventory)
    assert isinstance(direct, SSHTransport) and direct.run("echo ok").stdout == b"ok\n"
    direct.close()


@pytest.mark.banner
def test_standby_agents_start_behind_a_banner_printing_shell(box: Box) -> None:
    """The SSH user's ~/.bashrc prints on stdout before every command, the standby's ready line too."""
    box.start_keeper()
    host = open_host("box", box.project)
    assert host.transport.run("true").stdout.startswith(b"hello from bashrc")    # the banner is real
    host.prepare()
    # two: for `python3` (what this new project's boot asked for) and for the python it resolved to
    wait_for(lambda: len(box.standbys()) == 2, what="the standby agents")
    standby = box.standbys()
    host_module.close_all()
    again = open_host("box", box.project)
    again.prepare()                                # through a standby, behind the banner
    assert again.agent.runs() == []
    wait_for(lambda: set(standby) - set(box.standbys()), what="the standby to be used")
    assert "did not start" not in (box.folder / f"{box.key}.log").read_text()


def test_quick_stdlib_tools_run_in_a_standby_as_they_would_by_exec(box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -S -m remote.serve ...` (draftops.runs.tools.STDLIB_TOOLS) through a standby: the same
    answers, exit codes, errors and input as the exec the direct connection makes."""
    from draftops.runs.sync import sync
    from draftops.runs.tools import ask_tool
    from draftops.serve import hosttool
    from tests.conftest import copy_remote_package

    copy_remote_package(box.project)
    box.start_keeper()
    host = open_host("box", box.project)
    sync(host)
    # two: one for `python3` (what this new project's first boot asked for), one for the interpreter
    # it resolved to (what every later call, tools included, asks for)
    wait_for(lambda: len(box.standbys()) == 2, what="the standby agents")
    before = set(box.standbys())
    entry = {"token": "t0k'en", "run_id": None, "engine": "vllm", "created": "2026-12-01T00:00:00Z"}
    assert hosttool.register(host, 8123, entry, exclusive=True)           # input on stdin
    wait_for(lambda: before - set(box.standbys()), what="a standby to be used")
    entries, now = hosttool.servers(host)
    assert [e["port"] for e in entries] == [8123] and entries[0]["token"] == "t0k'en" and now > 0
    assert not hosttool.register(host, 8123, entry, exclusive=True)       # refused: already claimed
    kept = ask_tool(host, "remote.serve", ["servers", "--state", host.state_dir, "nonsense"])
    host_module.close_all()
    monkeypatch.setenv("DRAFTOPS_PERSIST", "0")
    direct = open_host("box", box.project)
    assert isinstance(direct.transport, SSHTransport)
    same = ask_tool(direct, "remote.serve", ["servers", "--state", direct.state_dir, "nonsense"])
    assert hosttool.servers(direct)[0] == entries
    assert (kept.exit_code, kept.data, kept.error) == (same.exit_code, same.data, same.error)
    assert kept.exit_code != 0 and "nonsense" in kept.stderr


def _sshd_sessions(server: Sshd) -> list[int]:
    """The sshd processes serving this server's connections (not the listener, not what they run)."""
    found, todo = [], children(server.proc.pid)
    while todo:
        pid = todo.pop()
        try:
            name = Path(f"/proc/{pid}/comm").read_text()
        except OSError:
            continue
        if name.startswith("sshd"):
            found.append(pid)
            todo += children(pid)
    return found


def _signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def test_a_silent_link_is_bypassed_said_so_and_the_keeper_stops(box: Box) -> None:
    """The keeper's sshd session is stopped (kill -STOP): its TCP link stays up and answers nothing.
    `invoke runs` goes direct in bounded time and says so in one line; the keeper notices the silence
    (a keepalive with no answer) and stops, so the next call connects directly without waiting."""
    assert box.invoke("runs").returncode == 0                 # direct; leaves a keeper
    wait_for(lambda: box.socket.exists() and keeper_link._alive(box.socket), what="the keeper")
    assert box.invoke("runs").returncode == 0                 # through it; its boot starts standbys
    wait_for(lambda: box.waiting_standbys(), what="a standby agent")
    silent = _sshd_sessions(box.server)
    _signal_all(silent, signal.SIGSTOP)
    try:
        out = box.invoke("runs", timeout=60)                  # paramiko's own wait is an hour
        assert out.returncode == 0, out.stderr
        notes = [line for line in out.stderr.splitlines() if "kept connection did not answer" in line]
        assert len(notes) == 1 and "connecting directly" in notes[0], out.stderr
        wait_for(lambda: not _keepers(box.folder), seconds=40, what="the keeper to stop on a silent link")
        assert "did not answer a keepalive" in (box.folder / f"{box.key}.log").read_text()
    finally:
        _signal_all(silent, signal.SIGCONT)


def test_a_call_a_stopped_standby_did_not_take_goes_direct_and_never_runs_late(
        box: Box, capsys: pytest.CaptureFixture[str]) -> None:
    """Standbys stopped (SIGSTOP) while ready are handed calls: the keeper stops waiting for their took
    lines, each call runs directly, once, and the standbys, continued, find their requests expired."""
    from draftops.link.agent import _env

    box.start_keeper()
    host = open_host("box", box.project)
    host.prepare()
    wait_for(lambda: len(box.waiting_standbys()) == 2, what="standby agents")   # for python3 and the real one
    stopped = box.standbys()
    _signal_all(stopped, signal.SIGSTOP)
    marker = box.project / "ran"
    root = host.agent.info.root                                          # type: ignore[union-attr]
    try:
        assert host.agent.start("20260101-000000-once-aaaa", {
            "name": "once", "command": f"echo ran >> {shlex.quote(str(marker))}", "cwd": "."}) > 0
        assert "kept connection did not answer" in capsys.readouterr().err
        assert host.transport.direct is not None                        # type: ignore[attr-defined]
        # A request handed to the other stopped standby (the one for `python3`) would start a run.
        request = {"python": "python3", "agent": AGENT_NAME, "header": {
            "argv": [root, "start", "runs/20260101-000000-late-bbbb"], "env": _env("n0nce")}}
        spec = json.dumps({"name": "late", "command": f"echo late >> {shlex.quote(str(marker))}", "cwd": "."})
        done = box.kept().run_standby(request, "echo direct", spec.encode())
        assert done.stdout == b"direct\n"                              # the fallback ran instead
    finally:
        _signal_all(stopped, signal.SIGCONT)
    wait_for(lambda: not set(stopped) & set(box.standbys()), what="the stopped standbys to end")
    wait_for(lambda: host.agent.status("20260101-000000-once-aaaa").get("state") == "succeeded", what="the job")
    assert marker.read_text() == "ran\n"                             # once, and the late one never
    assert not (Path(root) / "runs" / "20260101-000000-late-bbbb").exists()


def test_half_a_request_line_does_not_keep_a_keeper_alive(box: Box) -> None:
    box.start_keeper(persist=1.0)
    import socket

    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(str(box.socket))
    try:
        client.sendall(b'{"op": "pi')                             # and nothing more, the socket kept open
        wait_for(lambda: not _keepers(box.folder), seconds=30, what="the idle keeper to stop")
        assert client.recv(16) == b""                             # it was hung up on
    finally:
        client.close()
