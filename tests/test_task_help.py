"""`invoke --list` and `invoke --help TASK` as a new user reads them: every task's summary is a complete
sentence (Invoke shows only the docstring's first line, which cut wrapped summaries mid-sentence),
and an option that takes a value says so (Invoke showed a float option as a bare flag)."""
from __future__ import annotations

import os
import subprocess
import sys

from invoke.util import helpline

from tests.conftest import REPO
from tests.support.task_collection import collection


def invoke(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "100"}, timeout=60, check=True)
    return done.stdout


def test_every_task_summary_in_the_list_is_a_complete_sentence():
    ns = collection()
    tasks = [*ns.tasks.values(), *(t for sub in ns.collections.values() for t in sub.tasks.values())]
    assert len(tasks) > 20
    for task in tasks:
        line = helpline(task)
        assert line and line.rstrip().endswith((".", ")", "`")), (task.name, line)
        assert line.count("(") == line.count(")"), (task.name, line)
    listed = " ".join(invoke("--list").split())
    assert "follow it to its end" in listed and "--local: the local history." in listed


def test_options_that_take_a_value_show_it_in_help():
    text = invoke("--help", "bench.compare")
    assert "--tolerance=NUMBER" in text and "-t NUMBER" in text
    assert "--run-a=STRING" in text
    assert "--all " in invoke("--help", "runs")       # a boolean stays a flag


def test_every_option_keeps_its_help_text_in_help():
    """Invoke pops an option's help as it builds the option: the playbook check's look at every
    task's options (tasks.py, at import) must leave them, or `--help` lists bare flags."""
    for name, words in (("runs", "list the local run history"), ("bench.compare", "run A"),
                        ("serve", "serve the profile's target with no draft"),
                        ("test-drafter", "hidden-state dump folder on the host")):
        text = " ".join(invoke("--help", name).split())
        assert words in text, (name, text)
