"""Detached remote jobs over a real sshd (and the local host): survive a dropped link, kill, logs, pull."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from draftops.errors import JobError
from draftops.link import host as host_module
from draftops.link.host import open_host
from draftops.onhost import agent as hostagent
from draftops.runs import jobs
from tests.conftest import small_tmpfs, ssh_entry
from tests.support.processes import live_group_members, wait_state, wait_until

pytestmark = pytest.mark.ssh


@pytest.fixture(params=["box", "local"])
def project(request, make_project, sshd, tmp_path, no_inventory_env):
    return make_project({"box": ssh_entry(sshd, tmp_path)}, default=request.param)


def test_job_survives_dropped_connection_and_reports_exit_code(project):
    host = open_host(None, project)
    job = jobs.start(host, "survivor", "echo started; sleep 1.5; echo finished; exit 7")
    assert jobs.status(host, job.id)["state"] in ("starting", "running")
    host.transport.close()            # the SSH link goes away while the job runs
    host_module.close_all()
    row = wait_state(project, job.id, {"failed", "succeeded", "dead"})
    assert row["state"] == "failed" and row["exit_code"] == 7
    assert row["started"] and row["ended"] and 1.5 <= row["seconds"] < 15   # the sleep, to the ms
    log = open_host(None, project).transport.run(f"cat {jobs.shell_path(job.run_dir)}/log").text
    assert "started" in log and "finished" in log


def test_follow_streams_log_and_events_then_returns_final_status(project):
    host = open_host(None, project)
    emit = 'echo "@@draftops {\\"event\\": \\"progress\\", \\"done\\": 1, \\"total\\": 2}"'
    job = jobs.start(host, "follow", f"echo one; {emit}; sleep 0.5; echo two")
    lines, seen = [], []
    final = jobs.follow(host, job.id, lines.append, seen.append)
    assert lines == ["one", "two"]
    assert seen[0]["event"] == "progress" and seen[0]["done"] == 1
    assert final["state"] == "succeeded" and final["exit_code"] == 0


def test_follow_sees_the_end_of_a_job_whose_command_is_longer_than_a_line(project):
    """The job-end event carried the whole command: past MAX_LINE (64 KiB) it reached home in pieces,
    no end was seen, and a finished job (`bench --repeats 70`) read as a dropped connection."""
    host = open_host(None, project)
    job = jobs.start(host, "long", "echo done # " + "x" * (hostagent.MAX_LINE + 1000))
    lines: list[str] = []
    final = jobs.follow(host, job.id, lines.append)
    assert lines == ["done"] and final["state"] == "succeeded" and final["exit_code"] == 0


def test_kill_stops_the_process_group(project):
    host = open_host(None, project)
    job = jobs.start(host, "sleeper", "sleep 300 & wait")
    row = wait_state(project, job.id, {"running"})
    final = jobs.kill(host, job.id, grace_s=5)
    assert final["state"] == "killed"
    assert live_group_members(int(row["pid"])) == []


def test_dead_process_is_reported_dead_not_running(project):
    host = open_host(None, project)
    job = jobs.start(host, "victim", "sleep 300")
    row = wait_state(project, job.id, {"running"})
    os.kill(int(row["pid"]), signal.SIGKILL)      # runner dies without recording an exit
    os.killpg(int(row["pid"]), signal.SIGKILL)
    assert wait_state(project, job.id, {"dead"})["state"] == "dead"
    listed = {r["id"]: r for r in jobs.list_runs(host)}
    assert listed[job.id]["state"] == "dead"


def test_env_values_are_quoted_and_reach_the_job(project):
    host = open_host(None, project)
    tricky = "a b; echo INJECTED $HOME `id` 'q'"
    job = jobs.start(host, "env", 'printf "%s" "$TRICKY" > "$DRAFTOPS_RUN_DIR/out.txt"', env={"TRICKY": tricky})
    wait_state(project, job.id, {"succeeded"})
    local = jobs.pull(host, job.id)
    assert (local / "out.txt").read_text() == tricky
    status = json.loads((local / "status.json").read_text())
    assert status["exit_code"] == 0 and int((local / "pid").read_text()) == status["pid"]
    assert (local / "command").read_text().startswith("printf")
    assert "TRICKY" not in (local / "log").read_text()


def test_unknown_run_id_is_a_clear_error(project):
    host = open_host(None, project)
    with pytest.raises(JobError, match="no run 'nope'"):
        jobs.status(host, "nope")
    with pytest.raises(JobError):
        jobs.status(host, "../etc")


def test_put_and_get_move_single_files(project, tmp_path):
    host = open_host(None, project)
    source = tmp_path / "payload.bin"
    source.write_bytes(b"\x00draftops\xff" * 1000)
    remote_path = f"{host.root}/state/put-test.bin"
    host.transport.put(source, remote_path)
    back = tmp_path / "back" / "payload.bin"
    host.transport.get(remote_path, back)
    assert back.read_bytes() == source.read_bytes()


def test_job_whose_runner_was_killed_is_still_running_and_kill_stops_its_group(project):
    host = open_host(None, project)
    job = jobs.start(host, "orphan", "sleep 300 & sleep 300; wait")
    row = wait_state(project, job.id, {"running"})
    pgid = int(row["pid"])
    wait_until(lambda: len(live_group_members(pgid)) >= 3, what="sh and both sleeps")
    os.kill(pgid, signal.SIGKILL)                      # only the runner: its job keeps going
    wait_until(lambda: pgid not in live_group_members(pgid), what="the runner to die")
    assert live_group_members(pgid), "the job's processes should outlive the runner"
    row = jobs.status(host, job.id)
    assert row["state"] == "running" and row["orphaned"] is True and "runner" in row["note"]
    assert {r["id"]: r for r in jobs.list_runs(host)}[job.id]["state"] == "running"
    final = jobs.kill(host, job.id, grace_s=5)
    assert final["state"] == "killed"
    assert live_group_members(pgid) == []
    assert jobs.status(host, job.id)["state"] == "killed"


def test_kill_escalates_to_sigkill_for_a_group_that_ignores_sigterm(project):
    host = open_host(None, project)
    job = jobs.start(host, "stubborn", "trap '' TERM; while true; do sleep 0.1; done")
    row = wait_state(project, job.id, {"running"})
    started = time.monotonic()
    final = jobs.kill(host, job.id, grace_s=1)
    assert final["state"] == "killed" and final["signal"] == signal.SIGKILL
    assert live_group_members(int(row["pid"])) == []
    assert time.monotonic() - started < 15


def test_a_reused_pid_is_not_taken_for_the_job(project):
    """The recorded runner pid now belongs to another process whose command line even names the run:
    the start time tells them apart, so the run is dead and kill leaves the stranger alone."""
    host = open_host(None, project)
    job = jobs.start(host, "gone", "true")
    done = wait_state(project, job.id, {"succeeded"})
    stranger = subprocess.Popen(["sh", "-c", f"sleep 300; : {job.id}"], start_new_session=True)
    try:
        status_path = os.path.join(job.run_dir, "status.json")
        with open(status_path, "w") as fh:
            json.dump({"state": "running", "pid": stranger.pid, "pgid": stranger.pid,
                       "start_ticks": done["start_ticks"], "started": done["started"]}, fh)
        assert jobs.status(host, job.id)["state"] == "dead"
        assert jobs.kill(host, job.id, grace_s=1)["state"] == "dead"
        assert stranger.poll() is None, "kill signalled a process that is not the job's"
    finally:
        stranger.kill()
        stranger.wait()


def test_kill_and_status_of_unknown_runs_are_clear_errors(project):
    host = open_host(None, project)
    for bad in ("nope", "../etc", ".hidden", "", "a\nb", "\x1b[31m"):
        with pytest.raises(JobError):
            jobs.kill(host, bad)


def test_a_run_id_with_an_undecodable_byte_is_refused_before_it_reaches_the_host(project):
    """`invoke logs $'\\xff'` gives Python the surrogate '\\udcff', which the SSH library cannot encode."""
    host = open_host(None, project)
    for call in (jobs.status, jobs.kill, lambda h, i: jobs.read_log(h, i, print), jobs.pull):
        with pytest.raises(JobError, match="is not a run id"):
            call(host, "run-\udcff")


def test_a_job_whose_folder_vanished_cannot_start_is_recorded_failed(project):
    host = open_host(None, project)
    job = jobs.start(host, "nowhere", "true", cwd="does/not/exist")
    row = wait_state(project, job.id, {"failed", "dead"})
    assert row["state"] == "failed" and row["exit_code"] == 127
    assert "does/not/exist" in row["outcome"]["error"]


def test_runs_record_task_arguments_and_outcome_but_never_env_values(project):
    host = open_host(None, project)
    secret = "hunter2-do-not-log"
    result = json.dumps({"event": "result", "headline": "412 tok/s", "tokens_per_s": 412.5,
                         "status": "ok"})
    command = f"echo warming up; echo '@@draftops {result}'; exit 3"
    job = jobs.start(host, "bench", command, env={"API_TOKEN": secret}, task="bench",
                     args={"model": "a b", "steps": 3, "dry_run": False, "fast": True, "limit": None})
    row = wait_state(project, job.id, {"failed", "succeeded", "dead"})
    assert row["state"] == "failed" and row["exit_code"] == 3
    assert row["task"] == "bench" and row["args"] == {"model": "a b", "steps": 3, "fast": True}
    assert row["outcome"] == {"headline": "412 tok/s", "tokens_per_s": 412.5, "status": "ok"}
    listed = {r["id"]: r for r in jobs.list_runs(host)}[job.id]
    assert listed["outcome"]["headline"] == "412 tok/s"
    for path in os.listdir(job.run_dir):          # the env file is gone once the runner read it
        with open(os.path.join(job.run_dir, path), "rb") as fh:
            assert secret.encode() not in fh.read(), path
    local = jobs.pull(host, job.id)
    job_json = json.loads((local / "job.json").read_text())
    assert job_json["env_keys"] == ["API_TOKEN"] and "env" not in job_json


def test_result_events_while_running_show_as_the_outcome_before_the_end(project):
    host = open_host(None, project)
    event = json.dumps({"event": "result", "headline": "serving on :30000"})
    job = jobs.start(host, "serve", f"echo '@@draftops {event}'; sleep 300")
    try:
        wait_until(lambda: (jobs.status(host, job.id).get("outcome") or {}).get("headline")
                   == "serving on :30000", timeout=20, what="the live headline")
        assert jobs.status(host, job.id)["state"] == "running"
    finally:
        jobs.kill(host, job.id, grace_s=2)


@pytest.fixture
def full_runs(project):
    """``<root>/runs`` on the host is a 64 KiB tmpfs (mounting needs root with CAP_SYS_ADMIN)."""
    host = open_host(None, project)
    with small_tmpfs(Path(host.runs_dir), "64k"):
        try:
            yield project
        finally:
            host_module.close_all()


def test_a_job_that_fills_the_disk_is_recorded_failed_with_its_outcome_not_dead(full_runs):
    """The job prints a result event, then fills the disk and fails. The runner's status.json updates
    (its outcome, then the exit) cannot make a temp copy; they must still be recorded, not leave a
    crashed runner and a run shown as `dead` ("the runner was killed, or the host restarted")."""
    host = open_host(None, full_runs)
    event = '@@draftops {"event": "result", "path": "r.json", "headline": "half done"}'
    job = jobs.start(host, "filler", f"echo '{event}'; sleep 0.3; "
                     'head -c 1000000 /dev/zero > "$DRAFTOPS_RUN_DIR/fill"; sleep 2.5; exit 3')
    row = wait_state(full_runs, job.id, {"failed", "succeeded", "dead", "killed"}, timeout=30)
    assert row["state"] == "failed" and row["exit_code"] == 3, row
    assert row["outcome"]["headline"] == "half done"


def lose_start_reply(host, *, run_it: bool) -> None:
    """The link drops around the agent's `start`: after it ran on the host (``run_it``) or before it
    was sent; either way no answer comes back (exit -1, as paramiko and the keeper report it)."""
    from draftops.link.connection import CommandResult

    real = host.transport.run

    def dropped(command, **kwargs):
        if " start " not in command:
            return real(command, **kwargs)
        if run_it:
            real(command, **kwargs)
        return CommandResult(command, -1, b"", b"")
    host.transport.run = dropped


def test_a_start_whose_answer_is_lost_finds_the_job_running_and_never_starts_it_twice(project, tmp_path):
    host = open_host(None, project)
    host.prepare()
    lose_start_reply(host, run_it=True)
    count = tmp_path / "ran"
    job = jobs.start(host, "once", f"echo ran >> {count}; sleep 0.5")
    row = wait_state(project, job.id, {"succeeded", "failed", "dead"})
    assert row["state"] == "succeeded" and count.read_text() == "ran\n"
    assert [r["id"] for r in jobs.list_runs(host)] == [job.id]


def test_a_start_lost_before_it_reached_the_host_says_nothing_started(project, tmp_path):
    host = open_host(None, project)
    host.prepare()
    lose_start_reply(host, run_it=False)
    with pytest.raises(JobError, match=r"did not start: the link dropped before .*start it again") as err:
        jobs.start(host, "never", f"touch {tmp_path / 'ran'}")
    assert "Traceback" not in str(err.value)
    assert not (tmp_path / "ran").exists() and jobs.list_runs(host) == []


def within(seconds: float, call, *args, **kwargs):
    """``call(*args, **kwargs)``'s result, or an AssertionError if it still runs after ``seconds`` (a hang)."""
    import threading

    box: dict = {}

    def run():
        try:
            box["value"] = call(*args, **kwargs)
        except BaseException as exc:          # noqa: BLE001 - handed to the test below
            box["error"] = exc
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still running after {seconds}s: a hang"
    if "error" in box:
        raise box["error"]
    return box["value"]


def test_run_folders_a_job_wrote_over_never_hang_crash_or_exhaust_the_agent(project):
    """A run folder is the job's to write in: its job.json, status.json, pid or log may become a FIFO
    (the agent's open waited forever: `invoke runs` and `invoke sync` hung), a link to /dev/zero (the
    read never ended and took all memory), JSON that is not an object or a pid that is not a number
    (the agent crashed with a traceback, and one such folder broke `invoke runs` for every run)."""
    host = open_host(None, project)
    good = jobs.start(host, "good", "echo fine")
    wait_state(project, good.id, {"succeeded"})
    runs = Path(host.runs_dir)
    odd = {"fifo-job": {"job.json": "fifo"}, "fifo-status": {"status.json": "fifo"},
           "zero-job": {"job.json": "/dev/zero"}, "zero-status": {"status.json": "/dev/zero"},
           "zero-pid": {"status.json": '{"state": "running"}', "pid": "/dev/zero"},
           "string-job": {"job.json": '"just a string"', "status.json": "[1, 2]"},
           "bad-pid": {"status.json": '{"state": "running", "pid": "x", "pgid": "y"}', "pid": "nope"},
           "log-dir": {"status.json": '{"state": "succeeded", "exit_code": 0}', "log": "dir"},
           "log-fifo": {"status.json": '{"state": "succeeded", "exit_code": 0}', "log": "fifo"},
           "log-zero": {"status.json": '{"state": "succeeded", "exit_code": 0}', "log": "/dev/zero"}}
    for name, files in odd.items():
        folder = runs / f"20990101-000000-{name}"
        folder.mkdir()
        os.utime(folder, (1, 1))                       # long past its start: not "starting"
        for file, what in files.items():
            if what == "fifo":
                os.mkfifo(folder / file)
            elif what == "dir":
                (folder / file).mkdir()
            elif what.startswith("/"):
                os.symlink(what, folder / file)
            else:
                (folder / file).write_text(what)
            os.utime(folder, (1, 1))
    rows = {row["id"]: row for row in within(20, jobs.list_runs, host)}
    assert rows[good.id]["state"] == "succeeded"
    assert {f"20990101-000000-{name}" for name in odd} <= set(rows)
    for name in odd:
        run_id = f"20990101-000000-{name}"
        assert within(20, jobs.status, host, run_id)["id"] == run_id
        within(20, jobs.read_log, host, run_id, print)
        assert within(20, jobs.kill, host, run_id, grace_s=1)["state"] != "running"
        if name.startswith("log-"):
            assert within(20, jobs.follow, host, run_id, print)["state"] == "succeeded"
    from draftops.runs.sync import sync
    within(30, sync, host)                     # the sync looks for live runs in every folder


def test_a_run_folder_removed_while_it_is_followed_ends_the_follow_with_a_note(project, tmp_path):
    """`rm -rf` (or a move) of the run folder during `invoke logs --follow`: the agent crashed reading
    its mtime, the traceback went out as log lines and the follow ended as if the link had dropped."""
    host = open_host(None, project)
    job = jobs.start(host, "vanish", "echo first; sleep 0.6; echo second; sleep 20")
    wait_state(project, job.id, {"running"})
    lines: list[str] = []

    def move_it():      # once the follow has read from the folder (a fixed sleep raced it under load)
        deadline = time.monotonic() + 20
        while not any("first" in line for line in lines) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.rename(job.run_dir, tmp_path / "moved")
    import threading
    mover = threading.Thread(target=move_it)
    mover.start()
    try:
        final = within(20, jobs.follow, host, job.id, lines.append)
    finally:
        mover.join()
        os.rename(tmp_path / "moved", job.run_dir)
        jobs.kill(host, job.id, grace_s=1)
    assert not any("Traceback" in line for line in lines), lines
    assert final["state"] == "dead" and "run folder is gone" in final["note"]
