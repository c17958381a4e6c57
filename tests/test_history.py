"""The local run history: typed record/query/latest, filters, bad input, a writer killed mid-way,
two writers at once, and a database file that is not one."""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from draftops.errors import HistoryError
from draftops.history import History, RunRecord, for_project, parse_since, project_revision

REPO = Path(__file__).resolve().parent.parent


def _rec(run_id: str, **kw) -> RunRecord:
    base = {"kind": "bench", "host": "local", "time": "2026-11-30T10:00:00Z"}
    return RunRecord(run_id=run_id, **{**base, **kw})


def test_record_roundtrip_and_upsert(tmp_path: Path) -> None:
    hist = for_project(tmp_path)
    rec = _rec("r1", engine="vllm", engine_version="0.32.0+cpu", target="/m/t", draft="/m/d",
               draft_digest="sha256:abcd", settings={"prompts": 20, "path": Path("/x")},
               metrics={"tok_s": 90.0, "bad": float("nan"), "pair": (1, 2)}, verdict="succeeded")
    hist.record(rec)
    got = hist.get("r1")
    assert got is not None and got.engine == "vllm" and got.time == "2026-11-30T10:00:00.000000Z"
    assert got.settings == {"prompts": 20, "path": "/x"}
    assert got.metrics == {"tok_s": 90.0, "bad": None, "pair": [1, 2]}     # NaN = not measured
    hist.record(_rec("r1", verdict="failed", metrics={"tok_s": 1.0}))      # completed in place
    assert [r.verdict for r in hist.query()] == ["failed"]
    assert (tmp_path / "runs" / "history.sqlite").is_file()


def test_query_filters_and_latest(tmp_path: Path) -> None:
    hist = History(tmp_path / "h.sqlite")
    hist.record(_rec("a", kind="test-drafter", time="2026-11-01T09:00:00Z", draft="/data/drafts/demo",
                     draft_digest="sha256:1111aaaa"))
    hist.record(_rec("b", kind="bench", time="2026-11-20T09:00:00Z", draft="/data/drafts/demo",
                     draft_digest="sha256:2222bbbb", host="gpu"))
    hist.record(_rec("c", kind="bench", time="2026-11-25T09:00:00Z", draft=None))
    hist.record(_rec("d", kind="bench", time="2026-11-26T09:00:00Z", draft="/data/drafts/demo_v2"))
    assert [r.run_id for r in hist.query()] == ["d", "c", "b", "a"]
    assert [r.run_id for r in hist.query(kind="bench")] == ["d", "c", "b"]
    assert [r.run_id for r in hist.query(draft="demo")] == ["b", "a"]          # last component, not demo_v2
    assert [r.run_id for r in hist.query(draft="/data/drafts/demo_v2")] == ["d"]
    assert [r.run_id for r in hist.query(draft="2222")] == ["b"]               # digest prefix
    assert [r.run_id for r in hist.query(draft="sha256:1111aaaa")] == ["a"]
    assert [r.run_id for r in hist.query(draft="dem%")] == []                  # LIKE wildcards are literal
    with pytest.raises(HistoryError, match="--draft is empty"):
        hist.query(draft=" ")
    assert [r.run_id for r in hist.query(host="gpu")] == ["b"]
    assert [r.run_id for r in hist.query(since=parse_since("2026-11-21T00:00:00Z"))] == ["d", "c"]
    latest = hist.latest(kind="bench", host="local")
    assert latest is not None and latest.run_id == "d"
    assert hist.latest(kind="serve") is None


def test_empty_or_missing_history_reads_as_no_runs(tmp_path: Path) -> None:
    assert History(tmp_path / "none.sqlite").query() == []
    sqlite3.connect(tmp_path / "empty.sqlite").close()
    assert History(tmp_path / "empty.sqlite").latest() is None
    assert not (tmp_path / "none.sqlite").exists()                            # reading creates nothing


def test_parse_since_forms() -> None:
    now = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
    assert parse_since("12h", now) == "2026-11-30T00:00:00.000000Z"
    assert parse_since("2w", now) == (now - timedelta(weeks=2)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert parse_since("2026-11-30T10:00:00+02:00") == "2026-11-30T08:00:00.000000Z"
    local_midnight = datetime(2026, 11, 30).astimezone().astimezone(timezone.utc)
    assert parse_since("2026-11-30") == local_midnight.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    for bad in ("yesterday", "5y", ""):
        with pytest.raises(HistoryError, match="--since"):
            parse_since(bad)


@pytest.mark.parametrize("since", ["99999999d", "999999999999999999999w", "0001-01-01",
                                   "9999-12-31T23:59:59-05:00"])
def test_parse_since_out_of_range_is_a_clear_error(since: str) -> None:
    """Ages and dates past what a datetime holds: the --since message, not an OverflowError."""
    with pytest.raises(HistoryError, match="--since"):
        parse_since(since)


def test_record_time_out_of_range_is_refused(tmp_path: Path) -> None:
    hist = History(tmp_path / "h.sqlite")
    with pytest.raises(HistoryError, match="run r: .*out of range"):
        hist.record(RunRecord(run_id="r", kind="bench", host="local", time="9999-12-31T23:59:59-05:00"))


@pytest.mark.parametrize("bad,needle", [
    ({"run_id": ""}, "run id"), ({"run_id": "a\nb"}, "run id"), ({"kind": "Bench; DROP"}, "kind"),
    ({"host": ""}, "host"), ({"time": "noon"}, "not a date"), ({"metrics": [1, 2]}, "metrics"),
])
def test_bad_records_refused_with_the_field_named(tmp_path: Path, bad: dict, needle: str) -> None:
    hist = History(tmp_path / "h.sqlite")
    with pytest.raises(HistoryError, match=needle):
        hist.record(RunRecord(**{"run_id": "r", "kind": "bench", "host": "local", **bad}))
    assert hist.query() == []


def test_quotes_and_odd_text_are_data_not_sql(tmp_path: Path) -> None:
    hist = History(tmp_path / "h.sqlite")
    odd = "it's \"quoted\"; DROP TABLE runs; --"
    hist.record(_rec(odd, draft=odd, target="ünï/cödé", settings={odd: odd}))
    got = hist.get(odd)
    assert got is not None and got.draft == odd and got.settings == {odd: odd} and got.target == "ünï/cödé"


def test_not_a_database_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    path.write_bytes(b"this is a text file, not sqlite" * 100)
    hist = History(path)
    with pytest.raises(HistoryError, match="mv .*history.sqlite.bad"):
        hist.query()
    with pytest.raises(HistoryError, match="not a readable SQLite database"):
        hist.record(_rec("r"))
    assert path.read_bytes().startswith(b"this is a text file")               # left as it was


@pytest.mark.parametrize("make", ["CREATE TABLE runs (run_id TEXT PRIMARY KEY, kind TEXT)", "CREATE TABLE other (x)"])
def test_a_foreign_table_layout_is_named_with_the_fix(tmp_path: Path, make: str) -> None:
    """A file claiming schema 1 whose `runs` table is not ours (or missing): say so, not "no such column"."""
    db = tmp_path / "h.sqlite"
    with sqlite3.connect(db) as conn:
        conn.execute(make)
        conn.execute("PRAGMA user_version = 1")
    conn.close()
    for call in (lambda: History(db).query(), lambda: History(db).record(_rec("r"))):
        with pytest.raises(HistoryError) as info:
            call()
        message = str(info.value)
        assert "not a draftops run history" in message and f"mv {db} {db}.bad" in message, message


@pytest.mark.parametrize("make", ["CREATE TABLE runs (run_id TEXT PRIMARY KEY, kind TEXT, host TEXT, time TEXT)",
                                  "CREATE TABLE other (x)"])
def test_a_database_of_something_else_is_never_read_as_empty_nor_changed(tmp_path: Path, make: str) -> None:
    """Schema version 0 with tables in it: written by something else. Its rows must not read as "no runs
    recorded", and recording must not turn it into a draftops history (WAL, our tables, version 1)."""
    db = tmp_path / "h.sqlite"
    with sqlite3.connect(db) as conn:
        conn.execute(make)
        conn.execute("INSERT INTO " + make.split()[2] + (" VALUES ('x', 'bench', 'gpu', '2026')" if "runs" in make
                                                          else " VALUES (1)"))
    conn.close()
    before = db.read_bytes()
    for call in (lambda: History(db).query(), lambda: History(db).get("x"), lambda: History(db).record(_rec("r"))):
        with pytest.raises(HistoryError) as info:
            call()
        message = str(info.value)
        assert "not a draftops run history" in message and f"mv {db} {db}.bad" in message, message
    assert db.read_bytes() == before and not db.with_name("h.sqlite-wal").exists()


def test_a_new_empty_file_reads_as_no_runs_and_records(tmp_path: Path) -> None:
    db = tmp_path / "h.sqlite"
    db.write_bytes(b"")
    assert History(db).query() == [] and History(db).get("r") is None
    History(db).record(_rec("r"))
    assert [r.run_id for r in History(db).query()] == ["r"]


def test_newer_schema_refused(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(HistoryError, match="newer draftops"):
        History(path).record(_rec("r"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_folder(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(HistoryError, match="writable"):
            History(folder / "h.sqlite").record(_rec("r"))
    finally:
        folder.chmod(0o700)


def test_read_only_folder_as_nobody(tmp_path: Path) -> None:
    """The same check with a real unprivileged process when the suite runs as root."""
    if os.geteuid() != 0 or not Path("/usr/bin/setpriv").exists():
        pytest.skip("needs root and setpriv to drop to uid 65534")
    folder = tmp_path / "ro"
    folder.mkdir()
    tmp_path.chmod(0o755)
    script = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(REPO)!r})
        from draftops.history import History, RunRecord
        from draftops.errors import HistoryError
        try:
            History(__import__("pathlib").Path({str(folder / 'h.sqlite')!r})).record(
                RunRecord(run_id="r", kind="bench", host="local"))
        except HistoryError as exc:
            print("ERR", exc)
    """)
    done = subprocess.run(["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                           sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.stdout.startswith("ERR cannot open the run history"), done.stdout + done.stderr


WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {repo!r})
    from pathlib import Path
    from draftops.history import History, RunRecord
    hist = History(Path({db!r}))
    blob = "x" * 20000
    for i in range({count}):
        hist.record(RunRecord(run_id=f"{prefix}-{{i:05d}}", kind="bench", host="{prefix}",
                              metrics={{"i": i, "blob": blob}}))
        print(i, flush=True)
""")


def _writer(db: Path, prefix: str, count: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WRITER.format(repo=str(REPO), db=str(db), prefix=prefix,
                                                                 count=count)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _integrity(db: Path) -> str:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()


def test_writer_killed_mid_way_leaves_a_readable_history(tmp_path: Path) -> None:
    db = tmp_path / "h.sqlite"
    proc = _writer(db, "w", 100000)
    assert proc.stdout is not None
    committed = -1
    while committed < 40:
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else "writer ended"
        committed = int(line)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    committed = max([committed, *(int(x) for x in proc.stdout.read().split())])   # lines still in the pipe
    assert _integrity(db) == "ok"
    hist = History(db)
    runs = hist.query(kind="bench")
    # every run it reported committed is there; at most the one in flight beyond it
    assert committed + 1 <= len(runs) <= committed + 2
    assert {r.run_id for r in runs} >= {f"w-{i:05d}" for i in range(committed + 1)}
    hist.record(_rec("after-crash"))                                # and it still takes writes
    assert hist.get("after-crash") is not None


def test_killed_inside_an_open_transaction_rolls_back(tmp_path: Path) -> None:
    db = tmp_path / "h.sqlite"
    History(db).record(_rec("committed"))
    script = textwrap.dedent(f"""
        import sqlite3, time
        conn = sqlite3.connect({str(db)!r}, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO runs (run_id, kind, host, time, recorded_at) "
                     "VALUES ('half', 'bench', 'local', '2026-11-30T10:00:00.000000Z', 'x')")
        print("inserted", flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "inserted"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    hist = History(db)
    assert [r.run_id for r in hist.query()] == ["committed"]
    hist.record(_rec("next"))                                       # the dead writer's lock is gone
    assert _integrity(db) == "ok" and len(hist.query()) == 2


def test_a_writer_holding_its_lock_too_long_is_named_with_the_fix(tmp_path: Path, monkeypatch) -> None:
    """A write lock held past the busy timeout (a stuck run, a sqlite3 shell inside BEGIN): the
    message says who may hold it and what to do, not just SQLite's "database is locked"."""
    db = tmp_path / "h.sqlite"
    hist = History(db)
    hist.record(_rec("first"))
    monkeypatch.setattr("draftops.history.BUSY_TIMEOUT_S", 0.2)
    holder = sqlite3.connect(db, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(HistoryError) as info:
            hist.record(_rec("second"))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    message = str(info.value)
    assert str(db) in message and "another process" in message and "run again" in message, message
    assert [r.run_id for r in hist.query()] == ["first"]


def test_two_writers_at_once(tmp_path: Path) -> None:
    db = tmp_path / "h.sqlite"
    count = 60
    procs = [_writer(db, prefix, count) for prefix in ("p1", "p2")]
    deadline = time.monotonic() + 240
    for proc in procs:
        _, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        assert proc.returncode == 0, err
    hist = History(db)
    assert len(hist.query(host="p1")) == count and len(hist.query(host="p2")) == count
    assert _integrity(db) == "ok"


FIRST_WRITER = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {repo!r})
    from pathlib import Path
    from draftops.history import History, RunRecord
    go = Path({go!r})
    Path({go!r} + "-ready-{name}").touch()
    while not go.exists():
        time.sleep(0.001)
    History(Path({db!r})).record(RunRecord(run_id="{name}", kind="bench", host="{name}"))
""")


def test_many_first_writers_on_a_new_history(tmp_path: Path) -> None:
    """Several runs finishing together on a fresh checkout all create the history at once; SQLite
    refuses the WAL switch to all but one without waiting, and none of them may fail for it."""
    for trial in range(8):
        db, go = tmp_path / f"h{trial}.sqlite", tmp_path / f"go{trial}"
        names = [f"t{trial}w{k}" for k in range(6)]
        procs = [subprocess.Popen([sys.executable, "-c", FIRST_WRITER.format(repo=str(REPO), db=str(db), go=str(go),
                                                                             name=name)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for name in names]
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob(f"go{trial}-ready-*"))) < len(names) and time.monotonic() < deadline:
            time.sleep(0.01)                                        # all of them at the start line
        go.touch()
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
        assert sorted(r.run_id for r in History(db).query()) == sorted(names)
        assert _integrity(db) == "ok"


def test_new_history_waits_for_a_reader_instead_of_failing(tmp_path: Path) -> None:
    """The WAL switch needs the file to itself; SQLite refuses it at once, without its busy handler,
    while another connection is writing, and the writer must wait instead of failing."""
    db = tmp_path / "h.sqlite"
    other = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")                                # a write lock on a rollback-mode file
    release = threading.Timer(0.4, lambda: other.execute("COMMIT"))
    release.start()
    try:
        History(db).record(_rec("waited"))
    finally:
        release.join()
        other.close()
    assert History(db).get("waited") is not None


def test_project_revision(tmp_path: Path) -> None:
    assert project_revision(tmp_path) is None
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "f").write_text("1")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}
    subprocess.run(["git", "-C", str(tmp_path), "add", "f"], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "commit", "-qm", "x"], check=True, env=env)
    rev = project_revision(tmp_path)
    assert rev is not None and len(rev) == 12 and not rev.endswith("-dirty")
    (tmp_path / "f").write_text("2")
    assert project_revision(tmp_path) == rev + "-dirty"


FULL_DISK_WRITER = textwrap.dedent("""
    import resource, signal, sys
    sys.path.insert(0, {repo!r})
    from pathlib import Path
    from draftops.errors import HistoryError
    from draftops.history import History, RunRecord
    hist = History(Path({db!r}))
    hist.record(RunRecord(run_id="small", kind="bench", host="local"))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)        # a write past the limit fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))
    done = 0
    try:
        for i in range(1000):
            hist.record(RunRecord(run_id=f"big-{{i}}", kind="bench", host="local", metrics={{"blob": "x" * 50000}}))
            done += 1
    except HistoryError as exc:
        print(done, "|", exc)
""")


def test_full_disk_fails_cleanly_and_keeps_what_was_committed(tmp_path: Path) -> None:
    """A file-size limit stands in for a full disk: the write that does not fit is refused with a
    clear message, and every run committed before it is still there."""
    db = tmp_path / "h.sqlite"
    done = subprocess.run([sys.executable, "-c", FULL_DISK_WRITER.format(repo=str(REPO), db=str(db))],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    count, message = done.stdout.split("|", 1)
    assert "could not be written" in message and "Free disk space" in message
    assert _integrity(db) == "ok"
    hist = History(db)
    assert len(hist.query()) == 1 + int(count)
    hist.record(_rec("after"))                                      # room again: writes work
    assert hist.get("after") is not None


def test_keep_records_with_the_revision_and_only_warns_when_it_cannot(tmp_path: Path) -> None:
    """The one "record in history, warn on failure" every task uses: a record that cannot be built
    (a host read failing) or written (a broken history file) is one warning naming the run."""
    from draftops import records

    warned: list[str] = []
    seen: list[str | None] = []

    def build(rev: str | None) -> RunRecord:
        seen.append(rev)
        return RunRecord(run_id="r1", kind="bench", host="h")

    records.keep(tmp_path, "run r1", build, warned.append)
    assert for_project(tmp_path).get("r1") is not None and seen == [project_revision(tmp_path)] and not warned

    def unreadable(rev: str | None) -> RunRecord:
        raise PermissionError("host said no")

    records.keep(tmp_path, "serve run r2", unreadable, warned.append)
    (tmp_path / "runs" / "history.sqlite").write_bytes(b"garbage" * 100)
    records.keep(tmp_path, "run r3", build, warned.append)
    assert warned[0] == "serve run r2 was not recorded in the local history: PermissionError: host said no"
    assert warned[1].startswith("run r3 was not recorded in the local history: ") and "Error:" not in warned[1]


def _tampered(path: Path) -> None:
    """Rows edited by hand, as the outside probe wrote them (issue 35 I), beside one good run."""
    History(path).record(_rec("good", kind="bench", time="2026-11-30T10:00:00Z", host="local", engine="vllm",
                              target="t", settings={"mode": "baseline"}, verdict="succeeded"))
    conn = sqlite3.connect(path)
    rows = [("esc", "\x1b[2J\x1b[31m2026-11-30T11:00:00Z", "{}", "{}"),
            ("metrics-int", "2026-11-30T12:00:00Z", "{}", "7"),
            ("settings-str", "2026-11-30T13:00:00Z", '"str"', "{}"),
            ("not-json", "2026-11-30T14:00:00Z", "{", "{}")]
    for run_id, when, settings, metrics in rows:
        conn.execute("INSERT INTO runs (run_id, kind, host, time, engine, target, settings, metrics, verdict, "
                     "recorded_at) VALUES (?, 'bench', 'local', ?, 'vllm', 't', ?, ?, 'succeeded', ?)",
                     [run_id, when, settings, metrics, "2026-11-30T15:00:00Z"])
    conn.execute("INSERT INTO runs (run_id, kind, host, time, recorded_at) VALUES ('blob', 'bench', ?, "
                 "'2026-11-30T10:00:00Z', 'x')", [b"\x1b[2J"])
    conn.commit()
    conn.close()


def test_a_hand_edited_row_is_skipped_with_one_warning_and_never_reaches_the_terminal(tmp_path: Path,
                                                                                      capsys) -> None:
    """A time of `\\x1b[2J…` reached the terminal raw; metrics 7 or settings "str" crashed every reader."""
    path = tmp_path / "h.sqlite"
    _tampered(path)
    found = History(path).query()
    assert [r.run_id for r in found] == ["good"]
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "5 row(s) skipped" in err and str(path) in err
    assert "'metrics-int': metrics is int, not a JSON object" in err and "\x1b" not in err
    assert History(path).get("metrics-int") is None and History(path).get("good") is not None


def test_the_doctors_baseline_lookup_reads_past_a_bad_row(tmp_path: Path, capsys) -> None:
    """`doctor --fix` (reusable_baseline) called .get on a metrics or settings row stored as 7 or "str"."""
    from draftops.doctor.serving import reusable_baseline

    path = tmp_path / "h.sqlite"
    _tampered(path)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE runs SET git_rev = 'rev1'")
    conn.commit()
    conn.close()
    (tmp_path / "runs" / "good").mkdir(parents=True)
    (tmp_path / "runs" / "good" / "bench-result.json").write_text("{}")
    found = reusable_baseline(tmp_path / "runs", History(path), host="local", engine="vllm", target="t",
                              settings={}, git_rev="rev1", now=datetime(2026, 11, 30, 16, tzinfo=timezone.utc))
    assert found is not None and found.run_id == "good"
    assert "row(s) skipped" in capsys.readouterr().err


def test_runs_local_shows_the_good_rows_of_a_tampered_history(tmp_path: Path, make_project, no_inventory_env) -> None:
    root = make_project({"here": {"transport": "local", "root": str(tmp_path / "hostroot")}}, default="here")
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    _tampered(root / "runs" / "history.sqlite")
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(REPO)}
    env.pop("DRAFTOPS_HOST", None)
    done = subprocess.run([sys.executable, "-m", "invoke", "runs", "--local"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "good" in done.stdout and "\x1b[2J" not in done.stdout + done.stderr
    assert "row(s) skipped" in done.stderr and "Traceback" not in done.stderr
