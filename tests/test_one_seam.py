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


#: the one place above draftops/link/ that names EOFError: gzip's own, for a local archive that ends early
LOCAL_EOF = {"runs/jobs.py:_unpack"}


def link_names(source: str) -> list[tuple[int, str]]:
    """(line, what) of every name of the SSH library or a link's raw exceptions in ``source``: ``paramiko``
    (imported, or found in sys.modules), ``SSHException``, and ``EOFError`` outside LOCAL_EOF's functions."""
    found, tree = [], ast.parse(source)
    owner = {child: node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
             for child in ast.walk(node)}
    for node in ast.walk(tree):
        name = (node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute)
                else node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [getattr(node, "module", None) or "", *(alias.name for alias in node.names)]
            name = "paramiko" if any(m.split(".")[0] == "paramiko" for m in modules) else None
        if name in ("paramiko", "SSHException", "EOFError"):
            found.append((node.lineno, f"{name}@{owner.get(node, '')}"))
    return found


def test_the_link_names_check_sees_each_form():
    source = ("import paramiko\nimport sys\np = sys.modules.get('paramiko')\n"
              "def f():\n    try:\n        pass\n    except (OSError, EOFError, p.SSHException):\n        pass\n")
    assert [what for _, what in link_names(source)] == ["paramiko@", "paramiko@", "EOFError@f", "SSHException@f"]


def test_no_module_above_the_link_package_names_the_ssh_library_or_its_errors():
    """Transport failures are mapped inside draftops/link/ (LinkDropped), as httpx maps at its transport;
    the host agent's own source (onhost/, run on the host) is not above the link."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in ("link", "onhost"):
            continue
        offenders += [f"draftops/{rel}:{line}: {what}" for line, what in link_names(path.read_text())
                      if not (what.startswith("EOFError@") and f"{rel}:{what.split('@')[1]}" in LOCAL_EOF)]
    assert offenders == [], ("a transport failure named above draftops/link/: map it in draftops/link/agent.py "
                             "(LinkDropped) and catch that: " + "; ".join(offenders))
