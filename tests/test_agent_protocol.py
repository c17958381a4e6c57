"""The host-agent protocol (docs/protocol.md): every exit code reaches the caller as its named error
carrying the failed command's result; an empty or missing answer is an error naming the host and the
command, never an empty reply; a caller of another protocol version is refused by the agent before
it does anything, and an installed agent of another version is reinstalled (or, when that cannot
help, refused clearly); dead commands are gone.

The real agent runs here on a ``transport: local`` host (real processes, real files). Where a test
needs an exit code the real agent only gives under conditions this machine cannot make (a disk
full mid-apply, a lock held for ten minutes), a transport double stands at the process boundary
and answers in the agent's real framing."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from draftops import onhost
from draftops.errors import (
    AgentError,
    HostFileError,
    JobError,
    RemoteError,
    RootError,
    SchedulerError,
    SyncError,
    SyncRefused,
    UnknownRun,
)
from draftops.inventory import HostSpec
from draftops.link.agent import AGENT_NAME, AGENT_SOURCE, AgentClient
from draftops.link.connection import CommandResult, NoStandbys
from draftops.link.host import open_host
from draftops.onhost import agent as hostagent
from draftops.onhost.wire import Exit
from tests.conftest import recorded_commands

# what each exit code must raise: written out here, not read from draftops.link.agent.ERRORS
EXPECTED = {
    Exit.CRASHED: AgentError, Exit.USAGE: AgentError, Exit.ROOT_REFUSED: RootError,
    Exit.ROOT_UNWRITABLE: RootError, Exit.REFUSED_ENTRY: SyncRefused, Exit.INCOMPLETE: SyncRefused,
    Exit.NO_RUN: UnknownRun, Exit.UNSAFE_RUN: AgentError, Exit.PROTOCOL_MISMATCH: AgentError,
    Exit.REFUSED_CODE: SyncRefused, Exit.SCAN_FAILED: SyncRefused, Exit.APPLY_FAILED: SyncRefused,
    Exit.BUSY: SyncRefused, Exit.LOCK_TIMEOUT: SyncRefused, Exit.NO_PYTHON: AgentError,
    Exit.NO_FILE: HostFileError, Exit.TOO_BIG: HostFileError, Exit.SCHEDULER: SchedulerError,
}
OLD = hostagent.PROTOCOL_VERSION - 1
OLD_SOURCE = AGENT_SOURCE.replace(f"PROTOCOL_VERSION = {OLD + 1} ", f"PROTOCOL_VERSION = {OLD} ", 1)
assert OLD_SOURCE != AGENT_SOURCE


def _nonce(command: str) -> str:
    return command.split(f"{hostagent.FRAME_ENV}=", 1)[1].split()[0]


def _framed(prefix: str, nonce: str, line: str) -> bytes:
    return f"\n{prefix}{nonce}\n{line}\n".encode()


PREPARE = {"protocol": hostagent.PROTOCOL_VERSION, "root": "/srv/dbl", "home": "/home/u", "python": "/usr/bin/python3",
           "python_version": "3.12.0", "platform": "linux", "agent": f"/srv/dbl/state/{AGENT_NAME}",
           "installed": False}


class AgentDouble(NoStandbys):
    """A transport whose "host" answers like the agent would: the boot's prepare reply, then whatever
    ``answer(command)`` says for each later call (exit code, stdout, stderr), framed as the real one."""

    def __init__(self, answer: Callable[[str, str], tuple[int, bytes, bytes]]):
        self.spec = HostSpec(name="dbl", address="dbl.example", root="/srv/dbl")
        self.answer, self.commands = answer, []

    def run(self, command: str, *, input: bytes | None = None, timeout: float | None = None,
            check: bool = True) -> CommandResult:
        self.commands.append(command)
        nonce = _nonce(command)
        if " -c " in command:                      # the boot: prepare's reply first
            prepared = _framed(hostagent.FRAME_PREFIX, nonce, json.dumps(PREPARE))
            if command.rstrip().endswith(AGENT_NAME):
                return CommandResult(command, 0, prepared, b"")
            code, out, err = self.answer(command, nonce)
            return CommandResult(command, code, prepared + out, err)
        code, out, err = self.answer(command, nonce)
        return CommandResult(command, code, out, err)

    def stream(self, command: str, on_output: Callable[[bytes], None]) -> int:
        self.commands.append(command)
        code, out, err = self.answer(command, _nonce(command))
        on_output(out + err)
        return code

    def close(self) -> None:
        pass


def refusing(code: int, message: str = "the reason, and the fix") -> Callable[[str, str], tuple[int, bytes, bytes]]:
    def answer(command: str, nonce: str) -> tuple[int, bytes, bytes]:
        return code, b"", b"banner on stderr\n" + _framed(hostagent.ERROR_PREFIX, nonce, message)
    return answer


CALLS: dict[str, Callable[[AgentClient], object]] = {
    "apply": lambda agent: agent.apply("code", "state/x.json", b"", expected_tree=None, force=False),
    "status": lambda agent: agent.status("r1"),
    "tail": lambda agent: agent.tail("r1", 5, lambda chunk: None),
    "read": lambda agent: agent.read("/srv/dbl/x.json"),
}


@pytest.mark.parametrize("code", [code for code in Exit if code != Exit.OK], ids=lambda code: code.name)
@pytest.mark.parametrize("call", sorted(CALLS))
def test_every_exit_code_maps_to_its_named_error_with_the_result(code, call):
    transport = AgentDouble(refusing(code))
    agent = AgentClient(transport.spec, transport)    # type: ignore[arg-type]
    agent.prepare()
    with pytest.raises(RemoteError) as err:
        CALLS[call](agent)
    assert type(err.value) is EXPECTED[code], (code, type(err.value))
    result = err.value.result
    assert result.host == "dbl" and result.exit_code == code and result.command.startswith(call)
    assert "the reason, and the fix" in result.stderr
    assert str(err.value).startswith("Host 'dbl'"), str(err.value)
    if code == Exit.NO_RUN:
        assert isinstance(err.value, JobError)
        assert ("has no run 'r1'" if call not in ("apply", "read") else "the reason, and the fix") in str(err.value)
    elif EXPECTED[code] is SyncRefused:
        assert isinstance(err.value, SyncError) and "the reason, and the fix." in str(err.value)


def test_an_exit_code_outside_the_table_is_an_agent_error_that_shows_the_output():
    transport = AgentDouble(refusing(255, "ssh: connection reset"))
    agent = AgentClient(transport.spec, transport)    # type: ignore[arg-type]
    agent.prepare()
    with pytest.raises(AgentError, match=r"failed running `runs runs` \(exit 255\): ssh: connection reset"):
        agent.runs()


@pytest.mark.parametrize("stdout", [b"", b"banner only\n", b"\n@@draftops-reply WRONGNONCE\n{}\n"],
                         ids=["nothing", "banner", "another-nonce"])
def test_an_empty_or_missing_reply_is_an_error_naming_host_and_command(stdout):
    transport = AgentDouble(lambda command, nonce: (0, stdout, b""))
    agent = AgentClient(transport.spec, transport)    # type: ignore[arg-type]
    agent.prepare()
    with pytest.raises(AgentError, match=r"^Host 'dbl' \(.*\): the draftops agent's answer to `kill runs/r1 2.0` "
                                         "has no reply marker") as err:
        agent.kill("r1", 2)
    assert err.value.result.command == "kill runs/r1 2.0" and err.value.result.exit_code == 0


@pytest.mark.parametrize("line,why", [("", "not JSON"), ("[]", "not a JSON object"), ("{}", "does not match")],
                         ids=["empty-line", "list", "empty-object"])
def test_a_framed_but_empty_reply_is_an_error_not_an_empty_answer(line, why):
    transport = AgentDouble(lambda command, nonce: (0, _framed(hostagent.FRAME_PREFIX, nonce, line), b""))
    agent = AgentClient(transport.spec, transport)    # type: ignore[arg-type]
    agent.prepare()
    with pytest.raises(AgentError, match=f"^Host 'dbl'.*{why}"):
        agent.manifest("code", "state/x.json")
    with pytest.raises(AgentError, match=f"^Host 'dbl'.*{why}"):
        agent.runs()


def test_a_stream_without_its_header_line_is_an_error():
    transport = AgentDouble(lambda command, nonce: (0, f"\n{hostagent.FRAME_PREFIX}{nonce}\n".encode(), b""))
    agent = AgentClient(transport.spec, transport)    # type: ignore[arg-type]
    agent.prepare()
    with pytest.raises(AgentError, match="`pack runs/r1` stream ended before its header"):
        agent.pack("r1", lambda chunk: None)


def test_a_mismatch_that_a_reinstall_does_not_cure_is_refused_clearly():
    transport = AgentDouble(refusing(Exit.PROTOCOL_MISMATCH, "this agent speaks protocol 0"))
    agent = AgentClient(transport.spec, transport)    # type: ignore[arg-type]
    agent.prepare()
    with pytest.raises(AgentError, match=f"speaks protocol 0. Reinstalling the agent \\({AGENT_NAME}\\).*did not "
                                         f"help; remove /srv/dbl/state/{AGENT_NAME}"):
        agent.runs()
    boots = [c for c in transport.commands if " -c " in c]
    assert len(boots) == 2, "one reinstall (a second boot), then the refusal; no loop"


# ---------------------------------------------------------------- the real agent, on a local host
@pytest.fixture
def local_host(make_project, tmp_path, no_inventory_env):
    project = make_project({"here": {"transport": "local", "root": str(tmp_path / "hostroot")}}, default="here")
    return lambda: open_host(None, project)


def installed(tmp_path: Path) -> Path:
    return tmp_path / "hostroot" / "state" / AGENT_NAME


def test_an_installed_agent_changed_in_place_is_rewritten_by_the_next_session(local_host, tmp_path):
    from draftops.link.host import close_all
    first = local_host().agent.prepare()
    assert first.installed and installed(tmp_path).read_text() == AGENT_SOURCE
    close_all()
    assert local_host().agent.prepare().installed is False           # same file: left alone
    close_all()
    installed(tmp_path).write_text(AGENT_SOURCE[:1000])              # a truncated copy
    assert local_host().agent.prepare().installed is True
    assert installed(tmp_path).read_text() == AGENT_SOURCE


def plant_old_agent(host, tmp_path: Path) -> None:
    """Put a copy that speaks protocol 0 where the session runs its agent from: the .py and the
    bytecode beside it that later calls load."""
    import py_compile
    installed(tmp_path).write_text(OLD_SOURCE)
    assert host.agent.info.run.endswith(".pyc") and host.agent.info.run != str(installed(tmp_path))
    py_compile.compile(str(installed(tmp_path)), cfile=host.agent.info.run, doraise=True)


def test_an_installed_agent_of_another_protocol_is_reinstalled_mid_session(local_host, tmp_path):
    host = local_host()
    job_runs = host.agent.runs()
    assert job_runs == []
    plant_old_agent(host, tmp_path)
    assert host.agent.runs() == []                                   # refused by it, reinstalled, retried
    assert installed(tmp_path).read_text() == AGENT_SOURCE
    plant_old_agent(host, tmp_path)
    shown: list[bytes] = []
    with pytest.raises(UnknownRun, match="has no run 'r9'"):         # a stream call reinstalls too
        host.agent.tail("r9", 5, shown.append)
    assert installed(tmp_path).read_text() == AGENT_SOURCE
    assert host.agent.runs() == []                                   # its bytecode was made again too


def agent_run(tmp_path: Path, *args: str, protocol: str | None = str(hostagent.PROTOCOL_VERSION),
              input: bytes = b"") -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], hostagent.FRAME_ENV: "n"}
    if protocol is not None:
        env[hostagent.PROTOCOL_ENV] = protocol
    return subprocess.run([sys.executable, str(installed(tmp_path)), str(tmp_path / "hostroot"), *args],
                          input=input, capture_output=True, env=env, check=False)


def test_the_agent_refuses_a_caller_of_another_protocol_before_doing_anything(local_host, tmp_path):
    local_host().agent.prepare()
    spec = json.dumps({"name": "x", "command": "touch ran", "cwd": "."}).encode()
    mine = hostagent.PROTOCOL_VERSION
    proc = agent_run(tmp_path, "start", "runs/r1", protocol=str(mine + 1), input=spec)
    assert proc.returncode == Exit.PROTOCOL_MISMATCH
    assert f"speaks protocol {mine}, the caller speaks {mine + 1}".encode() in proc.stderr
    assert not (tmp_path / "hostroot" / "runs" / "r1").exists()
    assert agent_run(tmp_path, "runs", "runs").returncode == 0
    assert agent_run(tmp_path, "runs", "runs", protocol=None).returncode == 0     # by hand: no check


@pytest.mark.parametrize("args", [("prepare", ".", AGENT_NAME), ("nope",), ("status",), ("status", "a", "b"), ()],
                         ids=["dead-prepare", "unknown", "too-few", "too-many", "none"])
def test_an_unknown_command_or_wrong_arguments_is_a_usage_error(local_host, tmp_path, args):
    local_host().agent.prepare()
    proc = agent_run(tmp_path, *args)
    assert proc.returncode == Exit.USAGE, proc.stderr
    assert b"usage:" in proc.stderr and b"Traceback" not in proc.stderr


def test_the_local_side_calls_every_agent_command_and_no_other():
    """No dead commands: each one the agent offers is called by draftops.link.agent (``runner`` by ``start``)."""
    client = Path(sys.modules[AgentClient.__module__].__file__ or "").read_text()
    called = {name for name in hostagent.COMMANDS if f'("{name}", ' in client or f'(("{name}", ' in client}
    assert called | {"runner"} == set(hostagent.COMMANDS)
    assert '"runner"' in onhost.source().split("def cmd_start", 1)[1].split("def ", 1)[0]


# ---------------------------------------------------------------- RemoteError carries the result
def test_a_failed_host_command_carries_its_result_like_invokes_unexpected_exit(local_host):
    host = local_host()
    script = "printf 'o%.0s' $(seq 5000); printf 'e%.0s' $(seq 5000) >&2; echo ' the reason' >&2; exit 3"
    with pytest.raises(RemoteError) as err:
        host.transport.run(script)
    result = err.value.result
    assert (result.host, result.command, result.exit_code) == ("here", script, 3)
    assert result.stdout.endswith("ooo") and result.stderr.endswith("the reason\n")
    assert len(result.stdout) <= 2000 and len(result.stderr) <= 2000        # tails, not whole streams
    assert err.value.exit_code == 3 and str(err.value).startswith("Host 'here' (")


def test_a_timed_out_host_command_has_no_exit_code_in_its_result(local_host):
    host = local_host()
    started = time.monotonic()
    with pytest.raises(RemoteError, match="^Host 'here' .*timed out after 0.3s") as err:
        host.transport.run("echo started; sleep 5", timeout=0.3)
    assert time.monotonic() - started < 4
    assert err.value.result.exit_code is None and err.value.result.command == "echo started; sleep 5"


class BootRefused(NoStandbys):
    """A host whose boot is refused with ``code`` (as the real agent refuses root), counting the boots."""

    def __init__(self, code: int):
        self.spec = HostSpec(name="dbl", address="dbl.example", root="/srv/dbl")
        self.code, self.pythons = code, []

    def run(self, command: str, *, input: bytes | None = None, timeout: float | None = None,
            check: bool = True) -> CommandResult:
        after = command.split(f" DRAFTOPS_PROTOCOL={hostagent.PROTOCOL_VERSION} ", 1)[1]
        self.pythons.append(after.removeprefix("exec ").split(" ", 1)[0])       # the shell execs the agent
        return CommandResult(command, self.code, b"", _framed(hostagent.ERROR_PREFIX, _nonce(command), "no way"))


@pytest.mark.parametrize("code,kept", [(Exit.ROOT_UNWRITABLE, True), (Exit.ROOT_REFUSED, True),
                                       (Exit.NO_PYTHON, False), (Exit.CRASHED, False)])
def test_a_remembered_interpreter_is_forgotten_only_when_it_fails_to_run_the_agent(tmp_path, code, kept):
    memory = tmp_path / "agent-python.json"
    memory.write_text(json.dumps({"python": "/opt/py/bin/python3"}))
    transport = BootRefused(code)
    agent = AgentClient(transport.spec, transport, memory)    # type: ignore[arg-type]
    with pytest.raises(EXPECTED[code]):
        agent.prepare()
    if kept:       # root's fault: one boot, with the remembered python, which stays remembered
        assert transport.pythons == ["/opt/py/bin/python3"] and memory.exists()
    else:          # the interpreter's: forgotten, and the boot tried once more with python3
        assert transport.pythons == ["/opt/py/bin/python3", "python3"] and not memory.exists()


@pytest.mark.parametrize("code", [-1, 137])
def test_a_boot_cut_off_by_a_dropped_link_or_a_signal_keeps_the_interpreter_and_is_not_run_again(tmp_path, code):
    """No prepare reply because the link dropped (-1) or the boot was killed: it may have run its
    command, so it is that call's error, not a sign the remembered interpreter stopped working."""
    memory = tmp_path / "agent-python.json"
    memory.write_text(json.dumps({"python": "/opt/py/bin/python3"}))
    transport = BootRefused(code)
    agent = AgentClient(transport.spec, transport, memory)    # type: ignore[arg-type]
    with pytest.raises(RemoteError):
        agent.runs()
    assert transport.pythons == ["/opt/py/bin/python3"] and memory.exists()


def test_later_calls_load_the_agent_compiled_for_its_python_and_a_bad_copy_is_made_again(local_host, tmp_path):
    from draftops.link.host import close_all
    host = local_host()
    info = host.agent.prepare()
    pyc = Path(info.run)
    assert pyc.parent == installed(tmp_path).parent and pyc.name.endswith(f".{sys.implementation.cache_tag}.pyc")
    assert str(pyc) in host.agent.command_line(("runs", "runs"), "n")
    assert host.agent.runs() == []
    close_all()
    pyc.write_bytes(b"not bytecode at all")                           # damaged: the next boot makes it again
    host = local_host()
    assert host.agent.runs() == [] and pyc.read_bytes()[:4] != b"not "
    close_all()
    whole = pyc.read_bytes()
    pyc.write_bytes(whole[:len(whole) // 2])                          # cut short after a valid header
    host = local_host()
    assert host.agent.runs() == [] and pyc.read_bytes() == whole
    close_all()
    pyc.unlink()
    pyc.mkdir()                                                       # cannot be written: the .py is run
    host = local_host()
    assert host.agent.runs() == [] and host.agent.info.run == str(installed(tmp_path))


# ---------------------------------------------------------------- the warm boot (hostagent.warm_boot)
def is_warm(command: str) -> bool:
    return f" {hostagent.WARM_FLAG} " in command and "def boot(" not in command


def is_boot(command: str) -> bool:
    return " -c " in command and "def boot(" in command


def test_a_new_session_boots_through_the_installed_copy_without_the_source(local_host, tmp_path):
    from draftops.link.host import close_all
    first = local_host().agent.prepare()
    close_all()
    host = local_host()
    assert host.agent.warm == first.run                              # remembered from the last boot
    commands = recorded_commands(host)
    assert host.agent.runs() == []
    assert len(commands) == 1 and is_warm(commands[0]) and len(commands[0]) < 4000   # not the 60 kB source
    assert host.agent.info is not None and host.agent.info.run == first.run and host.agent.info.installed is False
    assert host.agent.info.root == first.root and host.agent.runs() == []
    assert not is_warm(commands[1]) and first.run in commands[1]     # later calls: the installed copy, as before


def start_once(host, tmp_path: Path) -> None:
    """Start a job that appends to a file: run exactly once whichever way the session booted."""
    spec = {"name": "once", "command": f"echo ran >> {tmp_path / 'ran.txt'}", "cwd": "."}
    host.agent.start("20260101-000000-once-aaaa", spec)
    for _ in range(200):
        if host.agent.status("20260101-000000-once-aaaa").get("state") not in ("running", "starting"):
            break
        time.sleep(0.05)


@pytest.mark.parametrize("stale", ["edited", "removed", "damaged", "foreign", "other-python"])
def test_a_stale_warm_note_costs_one_refused_exec_then_the_boot_and_nothing_runs_twice(local_host, tmp_path, stale):
    from draftops.link.host import close_all
    first = local_host().agent.prepare()
    close_all()
    pyc = Path(first.run)
    note = next((tmp_path).rglob("agent-run-*.json"))
    if stale == "edited":                 # the installed source changed in place: not this version any more
        installed(tmp_path).write_text(AGENT_SOURCE + "\n# edited by hand\n")
    elif stale == "removed":
        pyc.unlink()
    elif stale == "damaged":
        pyc.write_bytes(pyc.read_bytes()[:40])
    elif stale == "foreign":              # a valid copy of this agent somewhere else: not the installed one
        elsewhere = tmp_path / "elsewhere.pyc"
        elsewhere.write_bytes(pyc.read_bytes())
        note.write_text(json.dumps({**json.loads(note.read_text()), "run": str(elsewhere)}))
    else:                                 # noted for another interpreter: not even tried
        note.write_text(json.dumps({**json.loads(note.read_text()), "python": "/opt/other/bin/python3"}))
    host = local_host()
    commands = recorded_commands(host)
    start_once(host, tmp_path)
    if stale in ("other-python", "foreign"):   # not even tried: a note naming no installed copy is ignored
        assert is_boot(commands[0])
    else:
        assert is_warm(commands[0]) and is_boot(commands[1])       # refused, then booted with the source
    assert (tmp_path / "ran.txt").read_text() == "ran\n"            # the job started once
    assert installed(tmp_path).read_text() == AGENT_SOURCE and host.agent.info.run == first.run
    assert json.loads(note.read_text())["run"] == first.run         # noted afresh: the next session is warm
    close_all()
    host = local_host()
    again = recorded_commands(host)
    assert host.agent.runs() and len(again) == 1 and is_warm(again[0])


def test_the_installed_copy_refuses_a_warm_boot_it_cannot_prove_and_replies_nothing(local_host, tmp_path):
    info = local_host().agent.prepare()
    env = {"PATH": os.environ["PATH"], hostagent.FRAME_ENV: "n",
           hostagent.PROTOCOL_ENV: str(hostagent.PROTOCOL_VERSION)}

    def warm(run: str, name: str = AGENT_NAME) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-S", run, hostagent.WARM_FLAG, str(tmp_path / "hostroot"), name,
                               "runs", "runs"], capture_output=True, env=env, check=False)
    good = warm(info.run)
    assert good.returncode == 0 and good.stdout.count(b"@@draftops-reply") == 2, good.stderr
    for proc in (warm(info.run, "agent-000000000000.py"), warm(str(installed(tmp_path)))):
        assert proc.returncode == Exit.PROTOCOL_MISMATCH and b"warm boot refused" in proc.stderr
        assert b"@@draftops-reply" not in proc.stdout


def test_a_warm_boot_refused_for_its_root_is_that_error_at_once_not_a_second_boot(make_project, tmp_path,
                                                                                 no_inventory_env):
    """Root's fault (here: a root that resolves to $HOME) would fail the boot the same way: one exec, the
    RootError, and the note stays for when root is fixed."""
    from draftops.link.host import close_all, host_cache_file
    good = make_project({"here": {"transport": "local", "root": str(tmp_path / "hostroot")}}, default="here")
    run = open_host(None, good).agent.prepare().run
    close_all()
    (tmp_path / "homelink").symlink_to(os.path.expanduser("~"))          # only the agent resolves it
    home = make_project({"here": {"transport": "local", "root": str(tmp_path / "homelink")}}, default="here")
    note = host_cache_file(open_host(None, home).spec, home, "agent-run")
    close_all()
    note.parent.mkdir(parents=True, exist_ok=True)
    note.write_text(json.dumps({"agent": AGENT_NAME, "python": sys.executable, "run": run}))
    host = open_host(None, home)
    commands = recorded_commands(host)
    with pytest.raises(RootError, match="home directory"):
        host.agent.runs()
    assert len(commands) == 1 and is_warm(commands[0]) and note.exists()


# ---------------------------------------------------------------- runs of a few ids
def finished_runs(host, tmp_path: Path, count: int) -> list[str]:
    ids = [f"20260101-00000{i}-quick-aaa{i}" for i in range(count)]
    for run_id in ids:
        host.agent.start(run_id, {"name": "quick", "command": "true", "cwd": "."})
    for run_id in ids:
        for _ in range(200):
            if host.agent.status(run_id).get("state") == "succeeded":
                break
            time.sleep(0.05)
    return ids


def test_runs_of_given_ids_read_only_those_and_never_a_path(local_host, tmp_path):
    host = local_host()
    ids = finished_runs(host, tmp_path, 3)
    assert [r["id"] for r in host.agent.runs()] == ids
    picked = host.agent.runs([ids[2], ids[0], "no-such-run", ids[0]])
    assert [r["id"] for r in picked] == [ids[0], ids[2]] and all(r["state"] == "succeeded" for r in picked)
    assert host.agent.runs([]) == []
    (tmp_path / "hostroot" / "outside").mkdir()
    proc = agent_run(tmp_path, "runs", "runs", f"..,../outside,{ids[1]}/..,{ids[1]}")
    assert proc.returncode == 0 and proc.stdout.count(b'"id"') == 1 and ids[1].encode() in proc.stdout


def test_servers_are_joined_with_their_own_runs_not_the_whole_history(local_host, tmp_path):
    from draftops.serve import lifecycle
    host = local_host()
    ids = finished_runs(host, tmp_path, 3)
    commands = recorded_commands(host)
    entries = [{"port": 8000, "run_id": ids[1], "engine": "vllm"},
               {"port": 8001, "run_id": "../outside", "engine": "vllm"},
               {"port": 8002, "run_id": None, "engine": "vllm", "created": "2020-01-01T00:00:00Z"}]
    servers = lifecycle._joined(host, entries, time.time())
    # 8002: an old claim that never started a run is a stale claim (issue 22, J), never alive
    assert [(s.port, s.state) for s in servers] == [(8000, "succeeded"), (8001, "dead"), (8002, "stale claim")]
    assert len(commands) == 1 and commands[0].rstrip().endswith(f"runs runs {ids[1]}")


@pytest.mark.parametrize("code", [-1, 137])
def test_a_warm_boot_cut_off_by_a_dropped_link_or_a_signal_is_not_run_again(local_host, tmp_path, code):
    """No reply and exit -1 (the SSH link dropped) or a kill: the command may have run on the host, so
    it is that call's error; booting again could start a job twice. The note stays."""
    from draftops.link.host import close_all
    local_host().agent.prepare()
    close_all()
    host = local_host()
    commands = recorded_commands(host)
    real = host.transport.run
    host.transport.run = lambda command, **kwargs: (commands.append(command),
                                                    CommandResult(command, code, b"", b""))[1]
    with pytest.raises(RemoteError):
        start_once(host, tmp_path)
    assert len(commands) == 1 and is_warm(commands[0]) and host.agent.warm is not None
    host.transport.run = real
    assert host.agent.runs() == []                     # the next call is warm again, and works


# ---------------------------------------------------------------- the warm boot's notes are not trusted blindly
EVIL = "import pathlib, sys\npathlib.Path({marker!r}).write_text('ran ' + ' '.join(sys.argv))\n"


@pytest.mark.parametrize("case", ["another-state-folder", "any-script", "group-writable"])
def test_a_warm_note_naming_what_is_not_the_installed_copy_never_runs_it(local_host, tmp_path, case):
    """A note (`.draftops/cache/agent-run-*.json`) pointing elsewhere is not run: the local side accepts
    only a path named as prepare names the copy, and the host, before it executes anything, only a
    file of this user's, writable by nobody else, in `<root>/state`. The session boots cold, once, and
    notes the right copy atomically."""
    from draftops.link.host import close_all
    first = local_host().agent.prepare()
    close_all()
    note = next(tmp_path.rglob("agent-run-*.json"))
    marker = tmp_path / "evil-ran"
    if case == "group-writable":
        Path(first.run).chmod(0o664)
    else:
        evil = (tmp_path / "other" / "state" / AGENT_NAME if case == "another-state-folder"
                else tmp_path / "evil.py")
        evil.parent.mkdir(parents=True, exist_ok=True)
        evil.write_text(EVIL.format(marker=str(marker)))
        note.write_text(json.dumps({**json.loads(note.read_text()), "run": str(evil)}))
    host = local_host()
    commands = recorded_commands(host)
    start_once(host, tmp_path)
    assert not marker.exists()
    assert (tmp_path / "ran.txt").read_text() == "ran\n"
    if case == "any-script":
        assert is_boot(commands[0])                                 # not even tried
    else:
        assert is_warm(commands[0]) and is_boot(commands[1])        # refused by the host, then booted
    assert json.loads(note.read_text())["run"] == first.run and not Path(first.run).stat().st_mode & 0o022
    close_all()
    again = local_host()
    warm = recorded_commands(again)
    assert again.agent.runs() and len(warm) == 1 and is_warm(warm[0])


NOTE_READER = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from pathlib import Path
from draftops.link.agent import AgentClient
from draftops.link.connection import LocalTransport
from draftops.inventory import HostSpec
spec = HostSpec.model_validate({"name": "here", "transport": "local", "root": sys.argv[3]})
client = AgentClient(spec, LocalTransport(spec), Path(sys.argv[1]), Path(sys.argv[2]))
print(json.dumps([client.python, client.warm]))
"""


@pytest.mark.parametrize("kind", ["fifo", "dev-zero-link", "huge", "deep", "not-a-python"])
def test_a_cache_note_that_is_no_small_json_file_is_ignored(tmp_path, kind):
    """Both notes (the installed copy, the remembered interpreter) are read as a small regular file only:
    a FIFO hung every call, a link to /dev/zero was a MemoryError. Such a note means a cold boot."""
    notes = [tmp_path / "agent-python.json", tmp_path / "agent-run.json"]
    for note in notes:
        if kind == "fifo":
            os.mkfifo(note)
        elif kind == "dev-zero-link":
            note.symlink_to("/dev/zero")
        elif kind == "huge":
            note.write_text(json.dumps({"python": sys.executable, "pad": "x" * (1 << 20)}))
        elif kind == "deep":
            note.write_text("[" * 100000 + "]" * 100000)
        else:
            note.write_text(json.dumps({"python": str(tmp_path / "evil.sh"), "agent": AGENT_NAME,
                                        "run": str(tmp_path / "evil.sh")}))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    out = subprocess.run([sys.executable, "-c", NOTE_READER, *map(str, notes), str(tmp_path / "root")],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [sys.executable, None]          # the default interpreter, a cold boot
