"""`invoke logs` and `--follow` on logs that fight back: 200 MB of log, output without newlines,
terminal escape sequences, and a link that drops while following. Memory stays bounded on both
sides, the default is the log's end, and a dropped follow says so and re-attaches where it stopped."""
from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from draftops.link.agent import AGENT_NAME
from draftops.link.host import open_host
from draftops.runs import jobs
from tests.conftest import REPO, ssh_entry
from tests.support.processes import wait_state, wait_until

pytestmark = pytest.mark.ssh
PY = shlex.quote(sys.executable)
MEASURE = ("import resource, subprocess, sys\n"
           "p = subprocess.run(sys.argv[1:], stdout=sys.stdout, stderr=sys.stderr)\n"
           "sys.stderr.write('\\nMAXRSS_KB=%d\\n' % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
           "sys.exit(p.returncode)\n")


def cli_project(make_project, sshd, tmp_path, default: str) -> Path:
    root = make_project({"box": ssh_entry(sshd, tmp_path)}, default=default)
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    return root


@pytest.fixture(params=["box", "local"])
def project(request, make_project, sshd, tmp_path, no_inventory_env):
    """Both transports, for what depends on how bytes travel."""
    return cli_project(make_project, sshd, tmp_path, request.param)


@pytest.fixture
def box_project(make_project, sshd, tmp_path, no_inventory_env):
    """The SSH host only, for CLI checks whose transport does not matter (each invoke costs seconds)."""
    return cli_project(make_project, sshd, tmp_path, "box")


@pytest.fixture
def local_project(make_project, sshd, tmp_path, no_inventory_env):
    return cli_project(make_project, sshd, tmp_path, "local")


def measured(args: list[str], cwd: Path, timeout: float,
             stdout=subprocess.PIPE) -> tuple[subprocess.CompletedProcess, int]:
    """Run ``args`` and return it with the peak RSS (MiB) of its whole process tree."""
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(REPO)}
    env.pop("DRAFTOPS_HOST", None)
    proc = subprocess.run([sys.executable, "-c", MEASURE, *args], cwd=cwd, env=env, stdout=stdout,
                          stderr=subprocess.PIPE, timeout=timeout, check=False)
    err = proc.stderr.decode(errors="replace")
    rss = int(err.rsplit("MAXRSS_KB=", 1)[1].split()[0]) // 1024
    return proc, rss


def invoke_measured(project: Path, *args: str, timeout: float = 120, stdout=subprocess.PIPE):
    return measured([sys.executable, "-m", "invoke", *args], project, timeout, stdout)


def finished_job(project: Path, command: str = "echo small log") -> jobs.Job:
    job = jobs.start(open_host(None, project), "logs", command)
    wait_state(project, job.id, {"succeeded"})
    return job


def write_big_log(path: Path, megabytes: int) -> int:
    line = b"%s\n" % (b"log line with some words in it " * 3)
    block = line * ((1 << 20) // len(line))
    with open(path, "wb") as fh:
        fh.writelines(block for _ in range(megabytes))
        for i in range(60):
            fh.write(b"@@draftops {\"event\": \"progress\", \"done\": %d}\n" % i)
            fh.write(b"LAST-LINE-%03d\n" % i)
    return path.stat().st_size


def test_logs_of_a_200_mb_log_show_its_end_quickly_in_bounded_memory(project):
    small = finished_job(project)
    base, base_rss = invoke_measured(project, "logs", small.id)
    assert base.returncode == 0 and b"small log" in base.stdout, base.stderr
    big = finished_job(project)
    size = write_big_log(Path(big.run_dir) / "log", 200)
    started = time.monotonic()
    proc, rss = invoke_measured(project, "logs", big.id, timeout=90)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.decode().splitlines()
    assert lines[-50:] == [f"LAST-LINE-{i:03d}" for i in range(10, 60)]
    assert len(lines) == 50 and b"@@draftops" not in proc.stdout
    assert b"earlier log not shown" in proc.stderr + proc.stdout
    assert rss < base_rss + 48, f"{rss} MiB for the end of {size >> 20} MiB (baseline {base_rss} MiB)"
    assert elapsed < 45, f"{elapsed:.1f}s"
    more, _ = invoke_measured(project, "logs", big.id, "--lines", "3")
    assert more.stdout.decode().splitlines() == ["LAST-LINE-057", "LAST-LINE-058", "LAST-LINE-059"]


def test_logs_all_streams_a_large_log_in_bounded_memory(box_project, tmp_path):
    project = box_project
    small = finished_job(project)
    _, base_rss = invoke_measured(project, "logs", small.id, "--all")
    big = finished_job(project)
    write_big_log(Path(big.run_dir) / "log", 32)
    out = tmp_path / "out.txt"
    with open(out, "wb") as fh:
        proc, rss = invoke_measured(project, "logs", big.id, "--all", timeout=180, stdout=fh)
    assert proc.returncode == 0, proc.stderr
    with open(out, "rb") as fh:
        first = fh.readline()
        fh.seek(-14, os.SEEK_END)
        last = fh.read()
    assert first.startswith(b"log line") and last == b"LAST-LINE-059\n"
    assert out.stat().st_size > 32 << 20
    assert rss < base_rss + 48, f"{rss} MiB streaming 32 MiB (baseline {base_rss} MiB)"


def test_the_host_side_never_reads_a_whole_log_into_memory(local_project):
    project = local_project
    host = open_host(None, project)
    small = finished_job(project)
    agent = [sys.executable, f"{host.root}/state/{AGENT_NAME}", host.root]
    _, base_rss = measured([*agent, "follow", f"runs/{small.id}", "0"], project, 60, subprocess.DEVNULL)
    big = finished_job(project)
    write_big_log(Path(big.run_dir) / "log", 200)
    for command in (["follow", f"runs/{big.id}", "0"], ["tail", f"runs/{big.id}", "all"],
                    ["tail", f"runs/{big.id}", "50"], ["follow", f"runs/{big.id}", "-50"]):
        proc, rss = measured([*agent, *command], project, 120, subprocess.DEVNULL)
        assert proc.returncode == 0, proc.stderr
        assert rss < base_rss + 32, f"agent {command[0]}: {rss} MiB (baseline {base_rss} MiB)"


def test_follow_of_output_without_newlines_arrives_in_bounded_pieces(project):
    host = open_host(None, project)
    script = ("import sys\nfor i in range(320):\n    sys.stdout.write('x' * 65536)\n    sys.stdout.flush()\n")
    job = jobs.start(host, "no-newline", f"{PY} -c {shlex.quote(script)}")
    pieces: list[int] = []
    started = time.monotonic()
    final = jobs.follow(host, job.id, lambda line: pieces.append(len(line)))
    assert final["state"] == "succeeded"
    assert sum(pieces) == 320 * 65536
    assert max(pieces) <= jobs.MAX_LINE and len(pieces) >= 320
    assert time.monotonic() - started < 90


def follow_agents(run_id: str) -> list[int]:
    """Pids of host agents following ``run_id`` (the host is this machine in the tests)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        stem = AGENT_NAME.removesuffix(".py").encode()        # agent-<sha>.py, or its .<tag>.pyc
        if b"follow" in argv and any(run_id.encode() in arg for arg in argv) and any(stem in arg for arg in argv):
            found.append(int(pid))
    return found


def test_a_follow_whose_agent_dies_re_attaches_and_reaches_the_jobs_end(project):
    host = open_host(None, project)
    job = jobs.start(host, "long", "echo first; sleep 3; echo second")
    lines: list[str] = []
    try:
        def on_text(line: str) -> None:
            lines.append(line)
            if line == "first":
                for pid in follow_agents(job.id):
                    os.kill(pid, signal.SIGKILL)
        final = jobs.follow(host, job.id, on_text)
        assert final["state"] == "succeeded"
        assert [x for x in lines if not x.startswith("[draftops]")] == ["first", "second"]
        assert sum("re-attaching at byte 6" in x for x in lines) == 1
    finally:
        jobs.kill(host, job.id, grace_s=1)


def test_a_dropped_ssh_link_during_follow_is_reconnected_and_re_attached(make_project, sshd, tmp_path,
                                                                         no_inventory_env):
    project = make_project({"box": ssh_entry(sshd, tmp_path)}, default="box")
    host = open_host(None, project)
    job = jobs.start(host, "long", "echo first; sleep 3; echo second")
    lines: list[str] = []

    def on_text(line: str) -> None:
        lines.append(line)
        if line == "first":                       # the network goes away under the connection
            host.transport.connection.transport.sock.shutdown(socket.SHUT_RDWR)

    try:
        assert jobs.follow(host, job.id, on_text)["state"] == "succeeded"
        assert [x for x in lines if not x.startswith("[draftops]")] == ["first", "second"]
    finally:
        from draftops.link import host as host_module
        host_module.close_all()
        jobs.kill(open_host(None, project), job.id, grace_s=1)


def test_logs_follow_says_it_re_attaches_when_the_stream_drops_and_ends_with_the_job(box_project):
    project = box_project
    host = open_host(None, project)
    job = jobs.start(host, "long", "echo first; sleep 300")
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(REPO)}
    env.pop("DRAFTOPS_HOST", None)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "invoke", "logs", job.id, "--follow"], cwd=project,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out = bytearray()

        def read() -> None:
            while chunk := proc.stdout.read1(4096):
                out.extend(chunk)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        wait_until(lambda: b"first" in out, timeout=60, what="the first log line on screen")
        for pid in follow_agents(job.id):
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: b"re-attaching at byte" in out, timeout=60, what="the re-attach line")
        jobs.kill(host, job.id, grace_s=1)         # the follow goes on to the job's end
        err = proc.stderr.read()
        proc.wait(timeout=60)
        reader.join(10)
        assert b"went silent or dropped" in out and b"Traceback" not in err, (out, err)
        assert out.count(b"re-attaching") == 1
    finally:
        jobs.kill(host, job.id, grace_s=1)


ESCAPES = r"printf 'title\033]0;pwned\007 clip\033]52;c;ZXZpbA==\033\\ \033[2J\033[31mred\033[0m\ttab\n'"


def test_escape_sequences_in_logs_and_outcomes_never_reach_the_terminal(box_project):
    project = box_project
    result = '@@draftops {"event": "result", "headline": "\\u001b]0;owned\\u0007MATCH\\u001b[5m"}'
    job = finished_job(project, f"{ESCAPES}; echo {shlex.quote(result)}")
    for args in (["logs", job.id], ["logs", job.id, "--follow"], ["runs"]):
        proc, _ = invoke_measured(project, *args)
        assert proc.returncode == 0, proc.stderr
        for control in (b"\x1b", b"\x07", b"\x9b"):
            assert control not in proc.stdout and control not in proc.stderr, (args, proc.stdout)
        if args[0] == "logs":                      # (rich expands the tab to spaces in --follow)
            assert re.search(rb"title clip red(\t| +)tab", proc.stdout), proc.stdout
        else:
            assert b"MATCH" in proc.stdout


def test_logs_lines_options_and_bad_values(local_project):
    project = local_project
    job = finished_job(project, "for i in 1 2 3 4 5; do echo line$i; done")
    proc, _ = invoke_measured(project, "logs", job.id, "--lines", "2")
    assert proc.stdout.decode().splitlines() == ["line4", "line5"]
    proc, _ = invoke_measured(project, "logs", job.id, "--lines", "0")
    assert proc.returncode == 0 and b"line" not in proc.stdout
    proc, _ = invoke_measured(project, "logs", job.id, "--lines", "-1")
    assert proc.returncode == 1 and b"--lines must be 0 or more" in proc.stderr
    proc, _ = invoke_measured(project, "logs", "no-such-run")
    assert proc.returncode == 1 and b"no run 'no-such-run'" in proc.stderr
    proc, _ = invoke_measured(project, "logs", job.id, "--follow", "--lines", "1")
    assert proc.returncode == 0 and b"line5" in proc.stdout and b"line4" not in proc.stdout
