"""The host agent is one file on the wire and parts in the tree (draftops/onhost/): the assembled
script runs alone under ``python -S`` with only the standard library, and says what its parts say."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from draftops import onhost
from draftops.link import agent
from draftops.onhost import wire
from remote import events

PARTS_DIR = Path(onhost.__file__).resolve().parent


def imported_modules(source: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "__import__":
            names |= {a.value.split(".")[0] for a in node.args if isinstance(a, ast.Constant)}
    return names


def test_the_assembled_script_imports_only_the_standard_library():
    modules = imported_modules(onhost.source())
    assert modules and modules <= set(sys.stdlib_module_names), modules - set(sys.stdlib_module_names)


def test_the_assembled_script_compiles_and_runs_alone_under_python_minus_S(tmp_path):
    script = tmp_path / "agent.py"
    script.write_text(onhost.source())
    subprocess.run([sys.executable, "-S", "-m", "py_compile", str(script)], check=True)
    # run from an empty folder with no path to draftops: a part that still needed the tree would fail
    done = subprocess.run([sys.executable, "-S", "-I", str(script), str(tmp_path / "root"), "nope"],
                          cwd=tmp_path, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == wire.Exit.USAGE, done.stderr
    assert "COMMAND one of" in done.stderr


def test_the_agent_the_host_gets_is_the_assembled_script_and_its_name_is_its_hash():
    import hashlib
    assert agent.AGENT_SOURCE == onhost.source()
    assert agent.AGENT_NAME == f"agent-{hashlib.sha256(onhost.source().encode()).hexdigest()[:12]}.py"


def test_the_parts_are_assembled_in_order_and_each_stays_small():
    source = onhost.source()
    positions = []
    for part in onhost.PARTS:
        text = (PARTS_DIR / f"{part}.py").read_text()
        assert text.count("\n") < 700, f"draftops/onhost/{part}.py has grown past 700 lines: split it"
        first_def = next(line for line in text.splitlines() if line.startswith("def "))
        positions.append(source.index(first_def))
    assert positions == sorted(positions)


def test_event_prefix_has_one_source_and_the_script_carries_its_value():
    assert wire.EVENT_PREFIX == events.EVENT_PREFIX
    assert f"EVENT_PREFIX = {events.EVENT_PREFIX!r}\n" in onhost.source()
    assert "from remote" not in onhost.source() and "draftops.onhost" not in onhost.source().split('"""', 2)[2]


def test_one_temp_mark_names_every_temp_file_of_the_agent():
    source = onhost.source()
    assert "CODE_TMP" not in source and source.count('".draftops-tmp-"') == 1


@pytest.mark.parametrize("bad", ["from draftops.terminal import clean\n", "import remote.events\n"])
def test_a_part_that_imports_other_draftops_code_is_refused_when_assembled(bad):
    with pytest.raises(ValueError, match="may import only the stdlib"):
        onhost.assemble_part("import os\n" + bad)


def test_the_script_module_is_one_namespace_for_tests_of_its_internals(monkeypatch):
    script = onhost.script()
    monkeypatch.setattr(script, "BLOCK", 7)
    assert script._read_at.__globals__["BLOCK"] == 7            # a part's function sees the patched name
    assert script.cmd_apply.__globals__ is script.cmd_status.__globals__
