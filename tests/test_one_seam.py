"""One seam for host I/O (issue 23): outside draftops/link/ no module runs a raw command on a host's
transport. Every host read and call goes through the agent (framed replies, the bounded read) or the
tool runner (framed quick tools, jobs), so a shell banner cannot get into an answer at one forgotten
call site. The test reads the source, so a new call site fails here before any host sees it."""
from __future__ import annotations

import ast
from pathlib import Path

import draftops

PACKAGE = Path(draftops.__file__).resolve().parent
RAW = {"run", "stream", "run_standby", "stream_standby"}


def raw_calls(source: str) -> list[tuple[int, str]]:
    """(line, call) of every ``<anything>.transport.<raw>(...)`` and ``transport.<raw>(...)`` call."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in RAW):
            continue
        owner = node.func.value
        name = owner.attr if isinstance(owner, ast.Attribute) else owner.id if isinstance(owner, ast.Name) else ""
        if name == "transport":
            found.append((node.lineno, ast.unparse(node.func)))
    return found


def test_the_check_sees_a_raw_call_in_every_form():
    source = ("host.transport.run('cat x')\nself.box.transport.stream('tail', print)\n"
              "transport.run_standby({}, 'x', None)\nhost.agent.read('x')\nhost.run('x')\n")
    assert [call for _, call in raw_calls(source)] == ["host.transport.run", "self.box.transport.stream",
                                                       "transport.run_standby"]


def test_no_module_outside_the_link_package_runs_a_raw_host_command():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "link":
            continue
        offenders += [f"draftops/{rel}:{line}: {call}(...)" for line, call in raw_calls(path.read_text())]
    assert offenders == [], ("a raw transport call outside draftops/link/: read host files with host.agent.read, "
                             "run tools with draftops.runs.tools (call_tool, run_tool): " + "; ".join(offenders))
