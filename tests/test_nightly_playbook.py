"""Playbook schema: the shipped playbooks load and name real tasks; bad input names file, line, field."""
from __future__ import annotations

import pytest

from draftops.errors import PlaybookError
from draftops.nightly import playbook
from tests.conftest import REPO
from tests.support.playbooks import _tasks_config, task_names

GOOD = """\
hosts: [box]
steps:
  - name: sync
    task: sync
  - name: drafter
    task: test-drafter
    args: {steps: 3, ckpt: "{root}/m/it's a {host} draft {x}", verbose: false, force: true}
    needs: [sync]
  - name: stop
    task: serve.stop
    cleanup: true
"""


def task_options() -> dict[str, dict[str, str]]:
    """Each task of the real collection -> its long options and their kinds, as tasks.py configures them."""
    return _tasks_config()["task_options"]


@pytest.mark.parametrize("name", ["smoke", "nightly"])
def test_shipped_playbooks_load_and_name_real_tasks(name):
    book = playbook.load(REPO / "playbooks" / f"{name}.yaml")
    assert book.name == name and book.hosts and book.steps
    assert any(s.cleanup and s.task == "serve.stop" for s in book.steps)
    # `bench` (the runner) lands on another branch; every other task must exist today
    book.check_tasks(task_names() | {"bench"}, name)
    playbook.load(REPO / "playbooks" / f"{name}.yaml", task_options())      # every argument is a real option
    assert book.threshold("speculative.tok_s") != book.threshold("drafter.step0_acc")
    assert book.lower_better("speculative.ttft_ms") and not book.lower_better("speculative.tok_s")


def test_the_cluster_playbook_loads_and_names_the_repositorys_slurm_host(no_inventory_env):
    from draftops.inventory import load_inventory
    book = playbook.load(REPO / "playbooks" / "cluster.yaml", task_options())
    assert book.name == "cluster" and book.hosts == ["cluster"]
    assert [s.task for s in book.steps] == ["sync", "env.check", "test-drafter"]
    assert load_inventory(REPO / "hosts.yaml", REPO).get("cluster").scheduler == "slurm"


def test_argv_is_what_a_user_types(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(GOOD)
    book = playbook.load(path)
    assert book.steps[1].argv("box", "/r") == ["test-drafter", "--host", "box", "--steps=3",
                                               "--ckpt=/r/m/it's a box draft {x}", "--force"]
    assert book.setup == "p" and book.name == "p"


@pytest.mark.parametrize("text, line, words", [
    (GOOD.replace("    needs: [sync]", "    needs: [stop]"), 8, ["step 2 ('drafter')", "'stop'", "earlier"]),
    (GOOD.replace("task: serve.stop", "task: serve.stpo"), None, ["serve.stpo", "serve.stop"]),
    (GOOD.replace("    cleanup: true", "    clean_up: true"), 11, ["step 3 ('stop')", "clean_up", "cleanup"]),
    (GOOD.replace("hosts: [box]", "hosts: [box, 'bad host']"), 1, ["field `hosts", "bad host"]),
    (GOOD + "thresholds: {'*tok_s': -5}\n", 12, ["field `thresholds", "above 0"]),
    (GOOD + "thresholds: {'*tok_s': .nan}\n", 12, ["thresholds"]),
    (GOOD + "baseline_window: 1\n", 12, ["baseline_window"]),
    (GOOD.replace("  - name: sync\n    task: sync\n", "  - name: sync\n"), 3, ["step 1 ('sync')", "`task`",
                                                                              "required"]),
    (GOOD.replace("{steps: 3,", "{host: other, steps: 3,"), 7, ["`host` is set by the runner"]),
    (GOOD.replace("    cleanup: true", "    cleanup: true\n    needs: [sync]"), 12, ["clean-up", "remove its `needs`"]),
    (GOOD + "hosts: [x]\n", 12, ["appears twice"]),
    ("hosts: [box\n", None, ["not valid YAML"]),
    ("- just a list\n", 1, ["a mapping"]),
    (GOOD.replace("task: sync", "task: nightly"), 4, ["recurse"]),
    # booleans and quoted text are not numbers (pydantic's lax mode would read `true` as 1)
    (GOOD + "thresholds: {'*tok_s': true}\n", 12, ["field `thresholds.*tok_s`", "valid number"]),
    (GOOD + "thresholds: {'*tok_s': '5%'}\n", 12, ["field `thresholds.*tok_s`", "valid number"]),
    (GOOD + "thresholds: {'*tok_s': '5'}\n", 12, ["field `thresholds.*tok_s`", "valid number"]),
    (GOOD + "baseline_window: true\nmin_nights: 1\n", 12, ["field `baseline_window`", "valid integer"]),
    (GOOD + "baseline_window: 0\n", 12, ["field `baseline_window`", "greater than or equal to 2"]),
    (GOOD + "min_nights: true\n", 12, ["field `min_nights`", "valid integer"]),
    (GOOD.replace("    cleanup: true", "    cleanup: true\n    timeout: true"), 12, ["step 3 ('stop')", "`timeout`",
                                                                                       "valid number"]),
])
def test_bad_playbooks_name_file_line_and_fix(tmp_path, text, line, words):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(PlaybookError) as info:
        book = playbook.load(path)
        book.check_tasks(task_names(), str(path))
    message = str(info.value)
    assert str(path) in message
    if line is not None:
        assert f"{path}:{line}:" in message, message
    for word in words:
        assert word in message, message


def test_missing_playbook_says_which_exist(tmp_path):
    with pytest.raises(PlaybookError, match="smoke.yaml"):
        playbook.load(tmp_path / "nope.yaml")


def test_the_smoke_playbook_benches_the_demos_language_not_random_ids():
    """Random token ids are text no draft was trained on: the measured accept length falls far below
    test-drafter's prediction and bench.compare suspects the wiring of a correctly wired server."""
    book = playbook.load(REPO / "playbooks" / "smoke.yaml")
    benches = [s for s in book.steps if s.task == "bench"]
    assert len(benches) == 2
    for step in benches:
        assert step.args.get("dataset") == "demo" and "input_len" not in step.args, step


ARGS = """\
hosts: [box]
steps:
  - name: look
    task: {task}
    args: {{{args}}}
"""


@pytest.mark.parametrize("task, args, words", [
    ("runs", "local: serve.stop", ["step 1 ('look'), argument `local`", "on/off flag", "'serve.stop'"]),
    ("test-drafter", "stpes: 3", ["argument `stpes`", "no option `--stpes`", "did you mean `steps`"]),
    ("serve.stop", "al: true", ["did you mean `all`", "its options: all, grace, port"]),
    ("test-drafter", "steps: three", ["argument `steps`", "whole number"]),
    ("test-drafter", "ckpt: true", ["`--ckpt` of `test-drafter` takes a value"]),
    ("bench.compare", "tolerance: lots", ["takes a number"]),
    ("sync", "p: 1", ["no option `--p`"]),
])
def test_step_args_are_checked_against_the_tasks_real_options_when_the_playbook_loads(tmp_path, task, args, words):
    path = tmp_path / "bad.yaml"
    path.write_text(ARGS.format(task=task, args=args))
    with pytest.raises(PlaybookError) as info:
        playbook.load(path, task_options())
    message = str(info.value)
    assert message.startswith(f"{path}:5: "), message
    for word in words:
        assert word in message, message


def test_good_args_of_every_kind_load():
    path = REPO / "tests" / "nonexistent.yaml"
    book = playbook.Playbook(hosts=["box"], steps=[
        {"name": "a", "task": "bench", "args": {"prompts": 8, "dataset": "demo", "output_len": 32}},
        {"name": "b", "task": "bench.compare", "args": {"tolerance": 0.2, "run_a": "-odd"}},
        {"name": "c", "task": "serve.stop", "args": {"all": True, "port": 8000}}])
    book.check_tasks(task_options(), str(path))
    assert book.steps[1].argv("box") == ["bench.compare", "--host", "box", "--tolerance=0.2", "--run-a=-odd"]
