"""`invoke nightly.schedule / unschedule / schedule --show` against the real `crontab` command (cron is
installed by scripts/setup.sh --test), on a throw-away user's crontab; then the scheduled command line
is run by hand the way cron runs it (sh, a bare environment)."""
from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from draftops.nightly import schedule
from tests.conftest import REPO
from tests.support.tasks import invoke

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a throw-away crontab user")
KEEP = "0 1 * * * echo 'keep me' \\% > /dev/null"


@pytest.fixture
def cron_user():
    if shutil.which("crontab") is None:
        pytest.fail("the `crontab` command is missing: scripts/setup.sh --test installs cron")
    name = f"dotest{os.getpid() % 100000}"
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
    try:
        pwd.getpwnam(name)
        yield name
    finally:
        subprocess.run(["crontab", "-u", name, "-r"], capture_output=True)
        subprocess.run(["userdel", name], check=True)


def crontab(user: str) -> list[str]:
    done = subprocess.run(["crontab", "-u", user, "-l"], capture_output=True, text=True)
    return done.stdout.splitlines() if done.returncode == 0 else []


@pytest.fixture
def project(make_project, tmp_path, no_inventory_env) -> Path:
    root = make_project({"loc": {"transport": "local", "root": str(tmp_path / "locroot")}}, "loc")
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    (root / "playbooks").mkdir()
    (root / "playbooks" / "tiny.yaml").write_text(yaml.safe_dump(
        {"hosts": ["loc"], "steps": [{"name": "sync", "task": "sync"}]}))
    return root


def test_schedule_twice_show_run_by_hand_and_unschedule(project, cron_user):
    subprocess.run(["crontab", "-u", cron_user, "-"], input=KEEP + "\n", text=True, check=True)
    args = ("nightly.schedule", "--at", "02:30", "--playbook", "playbooks/tiny.yaml", "--user", cron_user)
    for _ in range(2):
        done = invoke(project, *args)
        assert done.returncode == 0, done.stdout + done.stderr
    lines = crontab(cron_user)
    start, end = schedule.markers(project)
    assert lines.count(start) == 1 and lines.count(end) == 1 and lines[0] == KEEP, lines
    (entry,) = [ln for ln in lines if not ln.startswith("#") and ln != KEEP]
    assert entry.startswith("30 2 * * * ") and sys.executable in entry and "flock -n" in entry
    moved = invoke(project, "nightly.schedule", "--at", "3:05", "--playbook", "playbooks/tiny.yaml",
                   "--user", cron_user)
    assert moved.returncode == 0
    assert [ln for ln in crontab(cron_user) if ln.startswith("5 3 ")] and len(crontab(cron_user)) == 4
    shown = invoke(project, "nightly.schedule", "--show", "--user", cron_user)
    assert start in shown.stdout.replace("\n", "") or "draftops nightly" in shown.stdout

    # the scheduled command, as cron runs it: `%` unescaped, /bin/sh, an almost empty environment
    (entry,) = [ln for ln in crontab(cron_user) if ln.startswith("5 3 ")]
    command = entry.split(" ", 5)[5].replace("\\%", "%")
    env = {"PATH": "/usr/bin:/bin", "HOME": "/root", "SHELL": "/bin/sh"}   # cron: no PYTHONPATH, no venv
    ran = subprocess.run(["/bin/sh", "-c", command], env=env, capture_output=True, text=True, timeout=300)
    log = (project / "runs" / "nightly.log").read_text()
    assert ran.returncode == 0, log
    assert "loc: healthy" in log and list((project / "runs").glob("nightly-*/report.html"))

    with open(project / "runs" / ".nightly.lock", "w") as held:     # a night still running
        fcntl.flock(held, fcntl.LOCK_EX)
        busy = subprocess.run(["/bin/sh", "-c", command], env=env, capture_output=True, text=True, timeout=60)
    assert busy.returncode == schedule.BUSY_EXIT
    assert "nightly skipped: the previous night still holds" in (project / "runs" / "nightly.log").read_text()
    assert len(list((project / "runs").glob("nightly-*"))) == 1

    gone = invoke(project, "nightly.unschedule", "--user", cron_user)
    assert gone.returncode == 0 and "removed" in gone.stdout
    assert crontab(cron_user) == [KEEP]
    again = invoke(project, "nightly.unschedule", "--user", cron_user)
    assert again.returncode == 0 and "no nightly was scheduled" in again.stdout


def test_a_damaged_block_is_refused_and_the_crontab_left_alone(project, cron_user):
    start, _ = schedule.markers(project)
    subprocess.run(["crontab", "-u", cron_user, "-"], input=f"{KEEP}\n{start}\n0 4 * * * mine\n", text=True,
                   check=True)
    before = crontab(cron_user)
    done = invoke(project, "nightly.schedule", "--at", "02:30", "--playbook", "playbooks/tiny.yaml",
                  "--user", cron_user)
    assert done.returncode == 1 and "crontab -e" in done.stderr + done.stdout
    assert crontab(cron_user) == before


@pytest.mark.parametrize("at", ["24:00", "2.30", "", "02:61", "now"])
def test_bad_times_are_refused(project, at):
    done = invoke(project, "nightly.schedule", "--at", at, "--playbook", "playbooks/tiny.yaml", "--user", "nobody")
    assert done.returncode == 1 and "HH:MM" in done.stdout + done.stderr


def test_odd_paths_are_quoted_and_percent_escaped(tmp_path):
    root = tmp_path / "my 'proj' 100%"
    line = schedule.block(root, "1:02", "playbooks/a b.yaml", python="/opt/py thon/bin/python")[1]
    assert line.startswith("2 1 * * * ") and "100\\%" in line and "'/opt/py thon/bin/python'" in line
    with pytest.raises(Exception, match="line break"):
        schedule.block(tmp_path / "a\nb", "1:02", "p.yaml")


@pytest.mark.parametrize("busy", [False, True])
def test_the_cron_line_runs_from_a_folder_with_quotes_and_dollar_parens(tmp_path, busy):
    """The line as cron hands it to sh (`\\%` back to `%`), from a project folder holding `'`, `"`, `%`
    and `$(...)`: it runs, nothing in the path is executed, and a held lock logs the skip."""
    root = tmp_path / "it's a \"p%th\" $(touch PWNED) dir"
    (root / "runs").mkdir(parents=True)
    python = root / "fake python"
    python.write_text("#!/bin/sh\necho ran: \"$@\"\n")
    python.chmod(0o755)
    line = schedule.command(root, "playbooks/a b's.yaml", str(python)).replace("\\%", "%")
    lock = (root / "runs" / ".nightly.lock").open("w")
    if busy:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        done = subprocess.run(["/bin/sh", "-c", line], cwd=tmp_path, capture_output=True, text=True,
                              env={"PATH": "/usr/bin:/bin"})
    finally:
        lock.close()
    log = (root / "runs" / "nightly.log").read_text()
    assert not list(tmp_path.rglob("PWNED")), log
    if busy:
        assert done.returncode == schedule.BUSY_EXIT, done.stderr + log
        assert "nightly skipped: the previous night still holds" in log and str(root / "runs") in log, log
    else:
        assert done.returncode == 0, done.stderr + log
        assert "ran: -m invoke nightly --playbook playbooks/a b's.yaml" in log, log


# what the user's own lines may hold: a form feed, U+2028, U+0085, a CRLF line end, bytes that are not UTF-8
ODD = (b"0 1 * * * echo 'form\x0cfeed'\n0 2 * * * echo 'line\xe2\x80\xa8sep'\n0 3 * * * echo 'nel\xc2\x85x'\n"
       b"0 4 * * * echo crlf\r\n0 5 * * * echo '\xff\xfe not utf-8'\n")


def crontab_bytes(user: str) -> bytes:
    return subprocess.run(["crontab", "-u", user, "-l"], capture_output=True, check=True).stdout


def test_the_users_lines_are_kept_byte_for_byte_whatever_they_hold(project, cron_user):
    subprocess.run(["crontab", "-u", cron_user, "-"], input=ODD, check=True)
    mine = crontab_bytes(cron_user)                 # as cron keeps it (Debian's lists a CR as `\r`)
    assert b"\xff\xfe" in mine and b"\x0c" in mine and b"\xe2\x80\xa8" in mine and b"\xc2\x85" in mine
    args = ("--playbook", "playbooks/tiny.yaml", "--user", cron_user)
    for at in ("02:30", "03:15"):
        done = invoke(project, "nightly.schedule", "--at", at, *args)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
        table = crontab_bytes(cron_user)
        assert table.startswith(mine) and table.count(b"draftops nightly") == 2, table
    assert b"15 3 * * * " in table and b"30 2 * * * " not in table
    shown = invoke(project, "nightly.schedule", "--show", "--user", cron_user)
    assert shown.returncode == 0 and "draftops nightly" in shown.stdout, shown.stdout + shown.stderr
    gone = invoke(project, "nightly.unschedule", "--user", cron_user)
    assert gone.returncode == 0 and "removed" in gone.stdout, gone.stdout + gone.stderr
    assert crontab_bytes(cron_user) == mine


def test_a_block_is_replaced_where_it_stands_and_a_table_without_a_final_newline_gets_one(tmp_path):
    root = tmp_path / "proj"
    first = schedule.block(root, "1:00", "p.yaml")
    second = schedule.block(root, "2:00", "p.yaml")
    table = schedule.with_block(b"A \xff\x0cB", root, first)             # no final newline
    assert table == b"A \xff\x0cB\n" + "\n".join(first).encode() + b"\n"
    table = b"top\r\n" + table + b"bottom \xe2\x80\xa8 end\n"
    moved = schedule.with_block(table, root, second)
    assert moved == table.replace("\n".join(first).encode(), "\n".join(second).encode())
    rest, old, at = schedule.without_block(moved.split(b"\n"), root)
    assert [ln.decode() for ln in old] == second and at == 2
