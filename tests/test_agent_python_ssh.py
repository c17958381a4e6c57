"""The agent's interpreter is remembered per host (issue 13): the boot reports ``sys.executable``,
draftops calls that binary directly for the rest of the session and in the next ones (no PATH
search, no pyenv shim), and forgets it when it stops working. Over the real sshd, whose login
``python3`` is this machine's own (a pyenv shim here)."""
from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from draftops.link.host import close_all, host_cache_file, open_host
from draftops.onhost.wire import PROTOCOL_VERSION
from tests.conftest import recorded_commands, ssh_entry

pytestmark = pytest.mark.ssh


@pytest.fixture
def project(make_project, sshd, tmp_path, no_inventory_env):
    return make_project({"box": ssh_entry(sshd, tmp_path)}, default="box")


def memory_of(project) -> os.PathLike:
    return host_cache_file(open_host(None, project).spec, project, "agent-python")


def python_in(command: str) -> str:
    return command.split(f" DRAFTOPS_PROTOCOL={PROTOCOL_VERSION} ", 1)[1].removeprefix("exec ").split(" ", 1)[0]


def test_the_reported_interpreter_is_used_for_the_session_and_remembered(project):
    host = open_host(None, project)
    assert host.agent.python == "python3"                       # nothing remembered yet
    info = host.agent.prepare()
    assert os.path.isabs(info.python) and os.access(info.python, os.X_OK)
    assert host.agent.python == info.python                     # later calls skip the PATH search
    assert python_in(host.agent.command_line(("runs", "runs"), "n")) == info.python
    assert host.agent.runs() == []
    memory = memory_of(project)
    assert json.loads(open(memory).read()) == {"python": info.python}
    close_all()
    again = open_host(None, project)
    assert again.agent.python == info.python                    # the next session starts with it
    assert python_in(again.agent.command_line((), "n")) == info.python
    assert again.agent.prepare().python == info.python


@pytest.mark.parametrize("broken", ["missing", "not-python", "garbage"])
def test_a_remembered_interpreter_that_stopped_working_is_forgotten(project, tmp_path, broken):
    real = open_host(None, project).agent.prepare().python
    memory = memory_of(project)
    close_all()
    fake = tmp_path / "gone" / "python3"
    if broken == "not-python":
        fake.parent.mkdir()
        shutil.copy("/bin/false", fake)
    text = "{not json" if broken == "garbage" else json.dumps({"python": str(fake)})
    open(memory, "w").write(text)
    host = open_host(None, project)
    started = time.monotonic()
    assert host.agent.runs() == []                              # the boot falls back to python3
    assert time.monotonic() - started < 30
    assert host.agent.python == real
    assert json.loads(open(memory).read()) == {"python": real}  # and the memory is mended


def test_the_next_session_boots_through_the_installed_copy_and_a_lost_one_costs_one_exec(project):
    """The warm boot over SSH (docs/protocol.md § Boot): no 60 kB source on the session's first
    command line; a copy the host lost since is refused before anything runs, then booted."""
    info = open_host(None, project).agent.prepare()
    close_all()
    host = open_host(None, project)
    commands = recorded_commands(host)
    assert host.agent.runs() == []
    # the warm stub that checks the installed copy (about 1.5 kB), not the 60 kB source
    assert len(commands) == 1 and " --warm " in commands[0] and len(commands[0]) < 4000
    assert host.agent.info is not None and host.agent.info.run == info.run
    close_all()
    os.unlink(info.run)                                         # the host lost the bytecode
    host = open_host(None, project)
    commands = recorded_commands(host)
    assert host.agent.runs() == []
    assert len(commands) == 2 and " --warm " in commands[0] and " -c " in commands[1]
    assert os.path.exists(info.run)                             # the boot made it again
