"""One tool runner (issue 8): every remote tool is started, followed, pulled and read the same way
(``draftops.runs.tools.run_tool``), ends with a code from one table (``remote/exitcodes.py``), and its
``error`` event is what the local side shows. Runs over a real sshd and on the local host."""
from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from draftops.console import LiveJob
from draftops.link.host import open_host
from draftops.runs import jobs
from draftops.runs.sync import sync
from draftops.runs.tools import JobView, ToolFailed, ToolResult, run_tool
from remote import events, exitcodes
from tests.conftest import REPO, ssh_entry

TOOL = textwrap.dedent('''
    """A tool of the test: ``python -m remote.tool_double MODE --out DIR``."""
    import json, os, sys
    from remote import events, exitcodes

    def main() -> int:
        mode, out = sys.argv[1], sys.argv[3]
        print("starting", mode)
        events.progress(1, 2, "double: half way")
        if mode == "refuse":
            events.error("The file /data/x.json has no field `ids`; add it.", kind="Refused")
            print("error: The file /data/x.json has no field `ids`; add it.", file=sys.stderr)
            return exitcodes.REFUSED
        if mode == "crash":
            print("a line before the crash")
            raise ValueError("boom")
        if mode == "escape":
            os.symlink("/etc/passwd", os.path.join(out, "result.json"))
            events.result("result.json")
            return exitcodes.OK
        with open(os.path.join(out, "result.json"), "w") as fh:
            json.dump({"mode": mode, "answer": 42}, fh)
        events.result(os.path.join(out, "result.json"), headline="42")
        return exitcodes.OK

    if __name__ == "__main__":
        exitcodes.run("tool-double", main)
''')


@pytest.fixture(params=["box", "local"])
def host(request, make_project, sshd, tmp_path, no_inventory_env):
    files = {f"remote/{name}": (REPO / "remote" / name).read_text() for name in ("__init__.py", "events.py",
                                                                                  "exitcodes.py")}
    files["remote/tool_double.py"] = TOOL
    project = make_project({"box": ssh_entry(sshd, tmp_path)}, default=request.param, files=files)
    target = open_host(None, project)
    sync(target)
    return target


class Recorder(JobView):
    """A view that keeps what it was told."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def started(self, host: str, run_id: str) -> None:
        self.calls.append(("started", run_id))

    def text(self, line: str) -> None:
        self.calls.append(("text", line))

    def event(self, event: dict[str, Any]) -> None:
        self.calls.append(("event", event.get("event")))

    def ended(self, run_id: str, final: dict[str, Any]) -> None:
        self.calls.append(("ended", final.get("state")))


def _run(host, mode: str, view: JobView | None = None) -> ToolResult:
    return run_tool(host, "remote.tool_double", [mode, "--out", jobs.RUN_DIR], view=view)


def test_a_tool_that_succeeds_is_followed_pulled_and_its_result_read_once(host):
    view = Recorder()
    done = _run(host, "ok", view)
    assert done.ok and done.exit_code == exitcodes.OK and done.meaning == "ok"
    assert done.data == {"mode": "ok", "answer": 42} and done.result_file == done.folder / "result.json"
    assert done.folder == host.project_root / "runs" / done.run_id and (done.folder / "log").is_file()
    assert done.check() is done and done.error is None
    assert view.calls[0] == ("started", done.run_id) and view.calls[-1] == ("ended", "succeeded")
    assert ("text", "starting ok") in view.calls and ("event", "progress") in view.calls
    assert ("event", "result") in view.calls


def test_a_refusal_shows_the_tools_own_paragraph_once_and_the_rest_of_the_log(host):
    done = _run(host, "refuse")
    assert not done.ok and done.exit_code == exitcodes.REFUSED and done.meaning == "refused"
    assert done.error and done.error["kind"] == "Refused" and done.data is None
    with pytest.raises(ToolFailed) as caught:
        done.check()
    text = str(caught.value)
    assert text.startswith(f"run {done.run_id} failed (exit 3): The file /data/x.json has no field `ids`")
    assert text.count("/data/x.json") == 1 and f"{done.folder}/log" in text     # stderr's copy left out
    assert text.splitlines()[1:] == ["starting refuse"] and "@@draftops" not in text
    assert caught.value.result is done


def test_a_crash_is_an_internal_error_with_its_event_and_the_log_end(host):
    done = _run(host, "crash")
    assert done.exit_code == exitcodes.INTERNAL and done.meaning == "internal error"
    assert "ValueError('boom')" in done.error_message
    text = done.failure()
    assert "(exit 4): internal error in tool-double: ValueError('boom')" in text
    assert "a line before the crash" in text and "Traceback" in text   # the log's end follows
    assert "@@draftops" not in text


def test_a_result_file_that_leads_out_of_the_run_folder_is_not_read(host):
    done = _run(host, "escape")
    assert done.ok and done.data is None and done.result_file is None
    assert done.notes and "result.json" in done.notes[0]
    assert [note["path"] for note in done.skipped] == ["result.json"]     # the pull said why


def test_the_live_view_renders_what_it_is_given():
    out = io.StringIO()
    view = LiveJob(Console(file=out, width=120, color_system=None), log="print", note=": installing")
    view.started("box", "20261130-000000-x-abcd")
    with view.following():
        view.text("pip install [torch]")
        view.event({"event": "progress", "done": 1, "total": 4, "what": "step"})
    view.ended("20261130-000000-x-abcd", {"state": "failed", "exit_code": 3})
    view.skipped([{"path": "fifo", "reason": "not a file"}] * 21)
    text = out.getvalue()
    assert "run 20261130-000000-x-abcd on box: installing" in text
    assert "pip install [torch]" in text                       # host text shown as text, not markup
    assert "job 20261130-000000-x-abcd: failed (exit 3)" in text
    assert text.count("not pulled fifo: not a file") == 20 and "1 more entries" in text


def test_window_and_hide_leave_no_log_line_behind():
    for mode in ("window", "hide"):
        out = io.StringIO()
        view = LiveJob(Console(file=out, width=120, color_system=None), log=mode)
        with view.following():
            view.text("secret-log-line")
        view.ended("r1", {"state": "succeeded", "exit_code": 0})
        lines = out.getvalue().splitlines()
        assert "secret-log-line" not in lines and "job r1: succeeded (exit 0)" in lines
        # piped (a StringIO), "window" shows the latest line as one passing "… " line (issue 35, item
        # 12); "hide" shows none at all
        expected = ["… secret-log-line"] if mode == "window" else []
        assert [line for line in lines if "secret-log-line" in line] == expected, lines


@pytest.mark.parametrize(("code", "argv", "expected"), [
    ("from remote import exitcodes\nexitcodes.run('t', lambda: 1 // 0)", [], exitcodes.INTERNAL),
    ("from remote import exitcodes\nexitcodes.run('t', lambda: exitcodes.CHECK_FAILED)", [], exitcodes.CHECK_FAILED),
    (None, ["-m", "remote.serve", "port", "not-a-number"], exitcodes.USAGE),
    (None, ["-m", "remote.bench.probe", "no-such-engine"], exitcodes.USAGE),
])
def test_remote_tools_end_with_a_code_of_the_table(code, argv, expected):
    proc = subprocess.run([sys.executable, *(["-c", code] if code else argv)], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == expected, proc.stderr
    if expected == exitcodes.INTERNAL:
        [event] = [events.parse(line) for line in proc.stdout.splitlines() if events.parse(line)]
        assert event["event"] == "error" and "ZeroDivisionError" in event["message"]
        assert event["exit_code"] == exitcodes.INTERNAL and "Traceback" in proc.stderr


def test_a_crashing_quick_tool_is_an_internal_error_with_its_message(tmp_path: Path):
    """remote.serve fed a registry entry that is not JSON: a bug-shaped failure, reported as such."""
    proc = subprocess.run([sys.executable, "-m", "remote.serve", "servers", "--state", str(tmp_path), "put", "8000"],
                          cwd=REPO, input="{not json", capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == exitcodes.INTERNAL
    errors = [e for e in map(events.parse, proc.stdout.splitlines()) if e and e["event"] == "error"]
    assert errors and "JSONDecodeError" in errors[0]["message"]
    assert json.dumps(errors[0])        # one JSON line the local side reads


@pytest.mark.parametrize("argv", [["remote.serve", "servers", "--state", "{tmp}", "list"],
                                  ["remote.serve", "port", "1", "--host", "127.0.0.1"],
                                  ["remote.drafter.demo_spec", "{tmp}/no-demo"]])
def test_the_stdlib_tools_answer_without_site_packages(argv, tmp_path: Path):
    """STDLIB_TOOLS are run with ``python -S`` (no site-packages): a third-party import in one of
    them would fail here before it failed on a host."""
    from draftops.runs.tools import STDLIB_TOOLS
    assert argv[0] in STDLIB_TOOLS
    proc = subprocess.run([sys.executable, "-S", "-m", *(a.format(tmp=tmp_path) for a in argv)], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == exitcodes.OK, proc.stderr
    assert isinstance(json.loads(proc.stdout.strip().splitlines()[-1]), dict)


REFUSING = textwrap.dedent('''
    import sys
    from remote import exitcodes

    class Mine(exitcodes.ToolError):
        """A tool's own tree, as remote/*/errors.py declare theirs."""

    def body() -> int:
        if sys.argv[1] == "usage":
            raise exitcodes.ToolError("The engine 'x' is unknown; give sglang or vllm.", kind="ValueError",
                                      exit_code=exitcodes.USAGE)
        raise Mine("The file /data/x.json has no field `ids`; add it.")

    def finish(ending: exitcodes.Ending) -> None:
        print("ended", ending.code, ending.error_type)

    exitcodes.run("t", lambda: exitcodes.main("t", body, heading="t refused", finish=finish))
''')


@pytest.mark.parametrize(("mode", "code", "kind", "stderr"), [
    ("refuse", exitcodes.REFUSED, "Mine", "t refused: The file /data/x.json has no field `ids`; add it."),
    ("usage", exitcodes.USAGE, "ValueError", "t refused: The engine 'x' is unknown; give sglang or vllm."),
])
def test_a_tool_error_is_its_code_its_paragraph_and_one_event(mode, code, kind, stderr):
    """The envelope (exitcodes.main) reports a ToolError the one way for every tool."""
    proc = subprocess.run([sys.executable, "-c", REFUSING, mode], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == code, proc.stderr
    assert proc.stderr.strip() == stderr                       # one paragraph, no traceback
    [event] = [e for e in map(events.parse, proc.stdout.splitlines()) if e]
    assert event["event"] == "error" and event["kind"] == kind and event["exit_code"] == code
    assert event["message"] == stderr.split(": ", 1)[1]
    assert f"ended {code} {'Mine' if mode == 'refuse' else 'ToolError'}" in proc.stdout   # finish saw it


STOPPABLE = textwrap.dedent('''
    import os, pathlib, signal, sys, time
    from remote import exitcodes

    def body() -> int:
        try:
            print("ready", flush=True)
            time.sleep(120)
            return exitcodes.OK
        finally:
            if sys.argv[2] == "SIGTERM":
                os.kill(os.getpid(), signal.SIGTERM)     # a second TERM while it cleans up
            pathlib.Path(sys.argv[1]).write_text("unwound")

    exitcodes.run("t", body)
''')


def _default_sigint() -> None:
    """A suite run as a background job ignores SIGINT, and its children would inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_tool_unwinds_then_dies_by_the_signal(signum, tmp_path: Path):
    """`invoke kill` (TERM) and Ctrl-C (INT): the tool's clean-ups run (a temporary file is removed),
    a second TERM does not cut them short, no traceback, and the exit status is the signal's, as a
    killed job's always was."""
    marker = tmp_path / "marker"
    name = signal.Signals(signum).name
    proc = subprocess.Popen([sys.executable, "-c", STOPPABLE, str(marker), name], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signum, err
    assert marker.read_text() == "unwound"
    assert err.strip() == f"t: stopped by {name}"


def test_every_remote_tool_goes_through_the_one_envelope():
    """No tool writes its own envelope: every ``__main__`` of remote/ runs through exitcodes.run, the
    ``error`` event and the INTERNAL crash are written only in exitcodes.py, and every error class of
    remote/ derives from exitcodes.ToolError (a HeaderError-like ValueError stays a ValueError)."""
    import ast
    own_errors = []
    for path in sorted((REPO / "remote").rglob("*.py")):
        text = path.read_text()
        name = str(path.relative_to(REPO))
        if name == "remote/exitcodes.py":
            continue
        assert "events.error(" not in text and "internal_error(" not in text, name
        if '__name__ == "__main__"' in text or name.endswith("__main__.py"):
            assert "exitcodes.run(" in text or "import run" in text, name
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and any(getattr(b, "id", None) == "Exception" for b in node.bases):
                own_errors.append(f"{name}: {node.name}")
    assert own_errors == []
