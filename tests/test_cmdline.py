"""Every command draftops prints pastes and runs as printed (issue 35, items 1, 3, 7, 10, 14, 16, G):
the real `.venv/bin/invoke` is run as a new user runs it, the venv NOT activated (PATH without
.venv/bin), its output piped (not a terminal), and the commands it prints are pasted back into
`bash -c` from the same folder. A second host, `other`, is a `local`-transport entry with a root of
its own, so that a command printed for it must name it (`--host other`) to reach it."""
from __future__ import annotations

import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

INVOKE = REPO / ".venv" / "bin" / "invoke"
PLAIN_PATH = "/usr/local/bin:/usr/bin:/bin"        # the venv not activated
QUOTED = re.compile(r"`([^`\n]*invoke [^`\n]*)`")


def run(argv: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("DRAFTOPS_HOST", "DRAFTOPS_INVENTORY", "VIRTUAL_ENV")}
    env.update(PATH=PLAIN_PATH, PYTHONPATH=str(REPO))
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, check=False)


def paste(command: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """A printed command pasted into a shell as it was printed."""
    return run(["bash", "-c", command], cwd, timeout)


def commands(text: str) -> list[str]:
    return QUOTED.findall(text)


@pytest.fixture
def project(make_project, no_inventory_env, tmp_path: Path) -> Path:
    """A project whose default is `local`, with a second local-transport host `other`, and the
    repository's venv reachable as `.venv` (so `.venv/bin/invoke` can be typed in it)."""
    root = make_project({"other": {"transport": "local", "root": str(tmp_path / "otherroot")},
                         "blackwell": {"address": "blackwell.invalid"}}, default="local")
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    (root / ".venv").symlink_to(REPO / ".venv")
    return root


def assert_pasteable(command: str, cwd: Path) -> None:
    """One line, shell-quoted (it splits back into words), and its program runs from ``cwd``."""
    assert "\n" not in command
    words = shlex.split(command)
    assert shlex.join(words) == command, command          # every word quoted the one way
    program = words[0] if "/" in words[0] else None
    assert program is not None, f"{command}: a bare `invoke` is not on PATH with the venv not activated"
    assert os.access(cwd / program, os.X_OK), command      # absolute: cwd / abs is abs


@pytest.mark.parametrize("how", ["relative", "absolute-from-elsewhere"])
def test_a_printed_command_names_the_program_as_started_and_its_host_and_runs_pasted(
        project: Path, tmp_path: Path, how: str) -> None:
    if how == "relative":
        cwd, argv = project, [".venv/bin/invoke"]
    else:
        cwd = tmp_path / "elsewhere"
        cwd.mkdir()
        argv = [str(project / ".venv" / "bin" / "invoke"), "-r", str(project)]
    done = run([*argv, "logs", "not-a-run", "--host", "other"], cwd)
    assert done.returncode == 1, done.stderr
    printed = commands(done.stderr)
    assert printed, done.stderr
    for command in printed:
        assert_pasteable(command, cwd)
        assert shlex.split(command)[:len(argv)] == argv              # as it was started
        assert shlex.split(command)[-2:] == ["--host", "other"]      # for the host it was about
    pasted = paste(printed[0], cwd)                                   # `… runs --host other`
    assert pasted.returncode == 0, pasted.stderr
    # the default host is never named
    done = run([*argv, "logs", "not-a-run"], cwd)
    assert commands(done.stderr) and all("--host" not in c for c in commands(done.stderr)), done.stderr


def test_sync_refusal_names_the_host_and_its_commands_run_pasted(project: Path, tmp_path: Path) -> None:
    """sync's refusal under a running run (made on the host by its agent) prints `logs … --follow`,
    `kill …` and `sync --force`: for host `other`, each names it, and the pasted kill stops the run."""
    from draftops.link.host import close_all, open_host
    from draftops.runs import jobs

    assert run([".venv/bin/invoke", "sync", "--host", "other"], project).returncode == 0
    host = open_host("other", project)
    try:
        job = jobs.start(host, "sleeper", "sleep 120")
    finally:
        close_all()
    (project / "remote" / "job.py").write_text("print('changed')\n")
    done = run([".venv/bin/invoke", "sync", "--host", "other"], project)
    assert done.returncode == 1 and job.id in done.stderr, done.stderr
    printed = commands(done.stderr)
    assert len(printed) >= 4, done.stderr
    for command in printed:
        assert_pasteable(command, project)
        assert shlex.split(command)[-2:] == ["--host", "other"], command
    kill = next(c for c in printed if " kill " in c)
    pasted = paste(kill, project)
    assert pasted.returncode == 0 and f"run {job.id}: " in pasted.stdout, pasted.stdout + pasted.stderr
    assert re.search(r": (killed|stopped)$", pasted.stdout.strip()), pasted.stdout


def test_a_doctor_command_quotes_a_draft_folder_with_shell_characters() -> None:
    from draftops import cmdline
    from draftops.doctor.plan import Args

    args = Args(draft="/data/my draft;id", data="$(touch x)", port=8001, fix=True)
    assert shlex.split(args.flags()) == ["--draft", "/data/my draft;id", "--data", "$(touch x)", "--fix",
                                         "--port", "8001"]
    line = cmdline.command("doctor", *args.words(), host="gpu")
    assert shlex.split(line)[-2:] == ["--host", "gpu"] and "'/data/my draft;id'" in line


def test_commands_in_text_from_the_host_are_rebuilt() -> None:
    """Text made where draftops cannot be imported (the agent, remote/ tools) says plain `invoke …`:
    shown, it names this program, quotes each word and adds the host; a command that names its host
    keeps it, unbalanced quotes are left alone."""
    from draftops import cmdline

    text = ("Wait for them to end (`invoke logs 2026-x --follow`), or `invoke sync --force test-drafter`; "
            "`invoke env.setup --host gpu`; `invoke bad 'quote`.")
    out = cmdline.commands_in(text, "gpu")
    found = commands(out)
    assert [shlex.split(c)[len(cmdline.program()):] for c in found[:3]] == [
        ["logs", "2026-x", "--follow", "--host", "gpu"], ["sync", "--force", "test-drafter", "--host", "gpu"],
        ["env.setup", "--host", "gpu"]]
    assert "`invoke bad 'quote`" in out


def test_piped_text_is_never_wrapped_at_80_columns() -> None:
    """A console that is not a terminal keeps a long line whole (rich assumes 80 columns there)."""
    from draftops.console import _Deferred

    buf = io.StringIO()
    shown = _Deferred(highlight=False, file=buf)
    line = "stop it with `" + " ".join(["/a/long/path/.venv/bin/invoke", "serve.stop", "--port", "8000"] * 4) + "`"
    assert len(line) > 100
    shown.print(line)
    assert buf.getvalue() == line + "\n"


def test_h_is_help_for_every_task_and_host_has_no_short_flag() -> None:
    sys.path.insert(0, str(REPO))
    import importlib.util
    spec = importlib.util.spec_from_file_location("draftops_tasks_for_cmdline_test", REPO / "tasks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ns = module.ns
    tasks = [*ns.tasks.values(), *(t for sub in ns.collections.values() for t in sub.tasks.values())]
    for task_ in tasks:
        saved = dict(task_.help)        # Invoke's get_arguments pops each option's help: put it back
        try:
            arguments = list(task_.get_arguments())
        finally:
            task_.help = saved
        for argument in arguments:
            assert "h" not in argument.names, (task_.name, argument.names)
            if argument.name == "host":
                assert argument.names == ("host",), (task_.name, argument.names)


def test_dash_h_prints_help(project: Path) -> None:
    for task_ in ("doctor", "test-drafter", "serve.stop"):
        done = run([".venv/bin/invoke", task_, "-h"], project)
        assert done.returncode == 0 and done.stdout.startswith("Usage:") and "--host=STRING" in done.stdout, done


def test_did_you_mean_for_a_flag_a_task_and_a_host(project: Path) -> None:
    done = run([".venv/bin/invoke", "test-drafter", "--ckp", "x"], project)
    assert done.returncode != 0 and "No idea what '--ckp' is! (did you mean '--ckpt'?)" in done.stderr, done.stderr
    done = run([".venv/bin/invoke", "serve", "stp"], project)
    assert "(did you mean 'stop'?)" in done.stderr, done.stderr
    done = run([".venv/bin/invoke", "runs", "--host", "blackwel"], project)
    assert done.returncode == 1 and "Unknown host 'blackwel' (did you mean 'blackwell'?)" in done.stderr, done.stderr


def test_two_word_tasks_work_next_to_the_dotted_ones() -> None:
    """Run in the repository on `local` (its synced code has remote.serve); no server runs there."""
    for words in (["serve", "status"], ["serve.status"]):
        done = run([".venv/bin/invoke", *words, "--host", "local"], REPO)
        assert done.returncode == 0 and "no draftops servers on local" in done.stdout, done
    done = run([".venv/bin/invoke", "serve", "stop", "--host", "local"], REPO)
    assert done.returncode == 1 and "has no draftops servers" in done.stderr, done.stderr     # serve.stop ran
    done = run([".venv/bin/invoke", "bench", "compare", "--help"], REPO)
    assert done.returncode == 0 and "bench.compare [--options]" in done.stdout, done
    done = run([".venv/bin/invoke", "patch-sglang", "apply", "--help"], REPO)
    assert done.returncode == 0 and "patch-sglang.apply [--options]" in done.stdout, done


def test_every_command_a_few_tasks_print_is_quoted_on_one_line_and_starts_with_a_runnable_program(
        project: Path) -> None:
    """The commands in the output of a few tasks for host `other` (errors made here and on the host,
    the doctor's resume hints): each one line, quoted, this program first and `--host other` in it; those
    without a placeholder run when pasted."""
    said = ""
    for args in (["logs", "not-a-run"], ["pull", "20260101-000000-x-abcd"], ["doctor", "--resume"],
                 ["doctor", "--resume", "20260101-000000-doctor-abcd"]):
        done = run([".venv/bin/invoke", *args, "--host", "other"], project)
        assert done.returncode == 1, done
        said += done.stdout + done.stderr
    printed = commands(said)
    assert len(printed) >= 4 and any(" doctor --resume " in c for c in printed), said
    for command in printed:
        assert_pasteable(command, project)
        words = shlex.split(command)
        assert words[0] == ".venv/bin/invoke" and words[words.index("--host") + 1] == "other", command
    runnable = {c for c in printed if not re.search(r"\b[A-Z]{3,}\b", c) and " doctor " not in c}
    assert runnable, printed
    for command in runnable:
        assert paste(command, project).returncode == 0, command


@pytest.mark.parametrize(("argv", "path_has_it", "expected"), [
    ([".venv/bin/invoke", "logs", "x"], False, (".venv/bin/invoke",)),                       # as typed
    ([".venv/bin/invoke", "-r", "/p", "--collection=tasks", "logs"], False,
     (".venv/bin/invoke", "-r", "/p", "--collection=tasks")),                                  # where tasks.py is
    ([".venv/bin/invoke", "-e", "logs", "-r", "/p"], False, (".venv/bin/invoke",)),          # after the task: its own
    ([str(INVOKE), "logs"], True, ("invoke",)),                                               # PATH finds this one
    ([str(INVOKE), "logs"], False, (str(INVOKE),)),                                           # PATH finds none
])
def test_the_program_is_the_one_this_process_was_started_with(monkeypatch: pytest.MonkeyPatch, argv: list[str],
                                                              path_has_it: bool, expected: tuple[str, ...]) -> None:
    from draftops import cmdline

    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setenv("PATH", str(INVOKE.parent) + ":/usr/bin:/bin" if path_has_it else "/usr/bin:/bin")
    monkeypatch.chdir(REPO)
    cmdline.start.cache_clear()
    cmdline.program.cache_clear()
    try:
        assert cmdline.program() == expected
        line = cmdline.command("logs", "a run", host="gpu")
        assert shlex.split(line) == [*expected, "logs", "a run", "--host", "gpu"]
        assert cmdline.commands_in(f"see `{line}`.") == f"see `{line}`."        # rebuilt once, never twice
    finally:
        cmdline.start.cache_clear()
        cmdline.program.cache_clear()


def test_python_dash_m_invoke_is_printed_as_such(monkeypatch: pytest.MonkeyPatch) -> None:
    import invoke

    from draftops import cmdline

    monkeypatch.setattr(sys, "argv", [str(Path(invoke.__file__).parent / "__main__.py"), "logs"])
    cmdline.start.cache_clear()
    cmdline.program.cache_clear()
    try:
        assert cmdline.program() == (sys.executable, "-m", "invoke")
    finally:
        cmdline.start.cache_clear()
        cmdline.program.cache_clear()


def test_the_default_host_is_the_users_not_the_one_adopted_call_wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--host gpu` anywhere on the line becomes $DRAFTOPS_HOST for the call; a command printed for gpu
    still names it, since the user's shell has no such variable."""
    from draftops import cmdline
    from draftops.cli.common import adopt_callwide_host

    monkeypatch.delenv("DRAFTOPS_HOST", raising=False)
    cmdline.start.cache_clear()
    try:
        adopt_callwide_host(["invoke", "sync", "test-drafter", "--host", "gpu"])
        assert os.environ["DRAFTOPS_HOST"] == "gpu" and cmdline.default_host() != "gpu"
        assert shlex.split(cmdline.command("kill", "r1"))[-2:] == ["--host", "gpu"]
    finally:
        monkeypatch.delenv("DRAFTOPS_HOST", raising=False)
        cmdline.start.cache_clear()
