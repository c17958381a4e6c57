"""One builder of the ``python -m MODULE ARGS`` line that runs a module on the host (issue 23): a job's
command and a quick tool's exec take it from ``jobs.python_m``, so quoting and the run-folder
placeholder are decided in one place. The lines run here in a real ``sh``."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from draftops.runs import jobs
from tests.conftest import REPO

ECHO = "import json, sys\nprint(json.dumps({'argv': sys.argv[1:], 'no_site': sys.flags.no_site}))\n"
AWKWARD = ["a b", "it's", "$(touch pwned)", "--x=\"q\"", ""]


def run_line(line: str, where: Path) -> dict:
    (where / "argv_echo.py").write_text(ECHO)
    done = subprocess.run(["sh", "-c", line], cwd=where, capture_output=True, text=True, timeout=60, check=True,
                          env={"PYTHONPATH": str(where), "DRAFTOPS_RUN_DIR": "/runs/r 1", "PATH": "/usr/bin:/bin"})
    return json.loads(done.stdout)


def test_a_job_line_hands_every_argument_over_as_typed_and_expands_only_the_run_folder(tmp_path: Path) -> None:
    got = run_line(jobs.python_m(sys.executable, "argv_echo", [jobs.RUN_DIR, *AWKWARD], in_job=True), tmp_path)
    assert got == {"argv": ["/runs/r 1", *AWKWARD], "no_site": 0}
    assert not (tmp_path / "pwned").exists()


def test_a_quick_tool_line_keeps_the_placeholder_as_text_and_can_skip_site(tmp_path: Path) -> None:
    got = run_line(jobs.python_m(sys.executable, "argv_echo", [jobs.RUN_DIR, *AWKWARD], no_site=True), tmp_path)
    assert got == {"argv": [jobs.RUN_DIR, *AWKWARD], "no_site": 1}
    assert not (tmp_path / "pwned").exists()


# a shell line (an f-string) that puts `-m` before a module name held in a variable, or before one of
# the synced code's modules
MODULE_LINE = re.compile(r"""\bf(["'])(?:(?!\1).)*-m (\{|remote\.)""")


def test_no_other_code_builds_a_python_m_line_of_its_own() -> None:
    found = [f"{path.relative_to(REPO)}:{n}: {line.strip()}"
             for path in sorted((REPO / "draftops").rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if MODULE_LINE.search(line)]
    assert found == []


def test_the_pattern_finds_the_builders_this_replaced() -> None:
    assert MODULE_LINE.search('            f\'PYTHONPATH="$PWD" exec {python} -m {module} {argv}\')')
    assert MODULE_LINE.search('            f"{no_site} -m {module} " + " ".join(shlex.quote(a) for a in args))')
    assert not MODULE_LINE.search('    pip = f"{py} -m pip --disable-pip-version-check"')
