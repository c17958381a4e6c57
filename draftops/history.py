"""The local run history, ``runs/history.sqlite``: one row per test-drafter, serve, bench and compare
run, so numbers collected weeks apart can be found and held side by side.

Why SQLite and how it stays safe:
* WAL journal with ``synchronous=FULL``: a committed run survives a crash or power cut, and a
  writer killed mid-transaction leaves the last committed state (SQLite rolls the rest back on the
  next open), so the file is always readable.
* Every write is one ``BEGIN IMMEDIATE`` transaction with a busy timeout, so two draftops
  processes recording at the same moment queue instead of failing or interleaving.
* A run is keyed by its id and written as an upsert: a run recorded when it starts is completed
  in place when it ends.
"""
from __future__ import annotations

import json
import math
import re
import shlex
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path, PurePath
from typing import Any

from draftops.errors import HistoryError
from draftops.terminal import clean

DB_NAME = "history.sqlite"
SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 30.0
_KIND = re.compile(r"^[a-z][a-z0-9-]{0,31}$")
_COLUMNS = ("run_id", "kind", "host", "time", "git_rev", "engine", "engine_version", "target", "draft",
            "draft_digest", "settings", "metrics", "verdict")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id         TEXT PRIMARY KEY,
    kind           TEXT NOT NULL,
    host           TEXT NOT NULL,
    time           TEXT NOT NULL,
    git_rev        TEXT,
    engine         TEXT,
    engine_version TEXT,
    target         TEXT,
    draft          TEXT,
    draft_digest   TEXT,
    settings       TEXT NOT NULL DEFAULT '{}',
    metrics        TEXT NOT NULL DEFAULT '{}',
    verdict        TEXT,
    recorded_at    TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_kind_time ON runs(kind, time);
CREATE INDEX IF NOT EXISTS runs_draft_digest ON runs(draft_digest);
"""


def now_iso() -> str:
    """UTC time in the one format the table holds (fixed width, so text order is time order)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def to_iso(moment: datetime) -> str:
    if moment.tzinfo is None:
        moment = moment.astimezone()          # naive means local time
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class RunRecord:
    """What one run was and what it found. ``settings`` and ``metrics`` are JSON objects."""

    run_id: str
    kind: str                      # test-drafter | serve | bench | compare | ...
    host: str
    time: str = field(default_factory=now_iso)
    git_rev: str | None = None
    engine: str | None = None
    engine_version: str | None = None
    target: str | None = None
    draft: str | None = None
    draft_digest: str | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)
    metrics: Mapping[str, Any] = field(default_factory=dict)
    verdict: str | None = None


def json_safe(value: Any) -> Any:
    """JSON-safe copy: NaN/inf become null (not measured), paths become text, tuples lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [json_safe(v) for v in value]
    if isinstance(value, PurePath):
        return str(value)
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


def _cleaned(value: Any) -> Any:
    """``value`` with every string in it (keys too) cleaned of terminal escapes and control text."""
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, Mapping):
        return {_cleaned(k): _cleaned(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_cleaned(v) for v in value]
    return value


#: the columns that hold text from a host (a version, a path, settings read back from a server);
#: the id, kind, host and time are checked by _check instead
_HOST_TEXT = ("git_rev", "engine", "engine_version", "target", "draft", "draft_digest", "verdict",
              "settings", "metrics")


def clean_record(rec: RunRecord) -> RunRecord:
    """The record as it is stored: host text cleaned once here, so no reader of the history (runs
    --local, the nightly report, bench.compare) gets an escape sequence from it."""
    return replace(rec, **{name: _cleaned(getattr(rec, name)) for name in _HOST_TEXT})


def _check(rec: RunRecord) -> None:
    if not isinstance(rec.run_id, str) or not rec.run_id.strip() or "\n" in rec.run_id:
        raise HistoryError(f"run id {rec.run_id!r} cannot be recorded: it must be one line of text.")
    if not isinstance(rec.kind, str) or not _KIND.match(rec.kind):
        raise HistoryError(f"run kind {rec.kind!r} cannot be recorded: use lower-case letters, digits and '-'.")
    if not isinstance(rec.host, str) or not rec.host:
        raise HistoryError(f"run {rec.run_id}: the host name is empty.")
    try:
        parse_time(rec.time)
    except HistoryError as exc:
        raise HistoryError(f"run {rec.run_id}: {exc}") from None
    for name in ("settings", "metrics"):
        if not isinstance(getattr(rec, name), Mapping):
            raise HistoryError(f"run {rec.run_id}: {name} must be a mapping, not "
                               f"{type(getattr(rec, name)).__name__}.")


def _values(rec: RunRecord) -> list[Any]:
    """The row's column values (checked; time in the table's form; settings and metrics as JSON)."""
    _check(rec)
    rec = clean_record(rec)
    values = [getattr(rec, c) for c in _COLUMNS]
    values[_COLUMNS.index("time")] = to_iso(parse_time(rec.time))
    for name in ("settings", "metrics"):
        values[_COLUMNS.index(name)] = json.dumps(json_safe(getattr(rec, name)), sort_keys=True, allow_nan=False)
    return values


class BadRow(ValueError):
    """A row of the table that draftops did not write as it is (edited by hand, or by another tool)."""


def _row(row: sqlite3.Row) -> RunRecord:
    """The one reader of a stored row: every column as RunRecord types it, text cleaned of escapes (a row
    is text someone may have edited); BadRow saying which column is wrong otherwise."""
    data: dict[str, Any] = {}
    for key in _COLUMNS:
        value = row[key]
        if value is not None and not isinstance(value, str):
            raise BadRow(f"{key} is {type(value).__name__}, not text")
        data[key] = clean(value) if isinstance(value, str) else value
    for key in ("run_id", "kind", "host", "time"):
        if not data[key]:
            raise BadRow(f"{key} is empty")
    if data["run_id"] != row["run_id"] or "\n" in data["run_id"] or not _KIND.match(data["kind"]):
        raise BadRow("its run id or kind holds characters draftops never writes")
    try:
        data["time"] = to_iso(parse_time(row["time"]))
    except HistoryError:
        raise BadRow(f"time {data['time']!r} is not a time") from None
    for key in ("settings", "metrics"):
        try:
            parsed = json.loads(row[key] or "{}")
        except (ValueError, RecursionError):
            raise BadRow(f"{key} is not JSON") from None
        if not isinstance(parsed, dict):
            raise BadRow(f"{key} is {type(parsed).__name__}, not a JSON object")
        data[key] = _cleaned(parsed)
    return RunRecord(**data)


def _rows(path: Path, rows: Iterator[sqlite3.Row]) -> list[RunRecord]:
    """The readable rows; the others are skipped with one warning on stderr for all of them, which names
    the file, the rows and the fix (the history stays usable, and a bad row is never shown raw)."""
    good: list[RunRecord] = []
    bad: list[str] = []
    for row in rows:
        try:
            good.append(_row(row))
        except BadRow as exc:
            run_id = row["run_id"]
            bad.append(f"{clean(run_id) if isinstance(run_id, str) else repr(run_id)!r}: {exc}")
    if bad:
        shown = "; ".join(bad[:3]) + (f"; and {len(bad) - 3} more" if len(bad) > 3 else "")
        aside = shlex.join(["mv", str(path), f"{path}.bad"])
        sys.stderr.write(f"warning: {path}: {len(bad)} row(s) skipped, not as draftops writes them ({shown}). "
                         f"Delete those rows with sqlite3, or move the file aside ({aside}) to start a new "
                         "history.\n")
    return good


def parse_time(text: str) -> datetime:
    """An ISO date or date-time (naive = local time) as an aware datetime that also exists in UTC
    (the table's form: year 1 local or 9999-12-31 behind UTC would overflow when stored)."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        raise HistoryError(f"{text!r} is not a date or time; write 2026-11-30 or 2026-11-30T14:05.") from None
    try:
        moment = moment if moment.tzinfo else moment.astimezone()
        moment.astimezone(timezone.utc)
    except (ValueError, OverflowError):
        raise HistoryError(f"{text!r} is out of range in UTC; give a date between the years 2 and 9998.") from None
    return moment


def parse_since(text: str, now: datetime | None = None) -> str:
    """``--since``: a date (local midnight), a date-time, or an age like 90m, 12h, 7d, 2w."""
    text = text.strip()
    age = re.fullmatch(r"(\d+)\s*([mhdw])", text)
    if age:
        unit = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}[age.group(2)]
        try:
            return to_iso((now or datetime.now(timezone.utc)) - timedelta(**{unit: int(age.group(1))}))
        except OverflowError:
            raise HistoryError(f"--since {text!r} reaches back before the year 1; give a shorter age, or a "
                               "date (2026-11-30).") from None
    try:
        return to_iso(parse_time(text))
    except HistoryError as exc:
        if "out of range" in str(exc):
            raise HistoryError(f"--since {exc}") from None
        raise HistoryError(f"--since {text!r} is neither a date (2026-11-30), a date-time (2026-11-30T14:05) "
                           "nor an age (90m, 12h, 7d, 2w).") from None


def _rollback(conn: sqlite3.Connection) -> None:
    """Undo an open transaction; SQLite may already have rolled back after a failed COMMIT (a full
    disk), and that must not hide the original error."""
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass


def _like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


class History:
    """The history database at ``path`` (created on first write, parents included)."""

    def __init__(self, path: Path):
        self.path = Path(path)

    @contextmanager
    def _connect(self, write: bool) -> Iterator[sqlite3.Connection]:
        if not write and not self.path.exists():
            raise FileNotFoundError(self.path)
        try:
            if write:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise self._error(exc) from None
        try:
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            conn.execute("PRAGMA synchronous = FULL")
            if write:
                self._migrate(conn)
            else:
                self._check_version(conn)
            yield conn
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        finally:
            conn.close()

    def _check_version(self, conn: sqlite3.Connection) -> int:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise HistoryError(f"{self.path} was written by a newer draftops (history schema {version}, this one "
                               f"reads {SCHEMA_VERSION}); update draftops, or point it at another project.")
        return version

    def _unwritten(self, conn: sqlite3.Connection) -> bool:
        """Whether no draftops run was ever recorded here (schema 0: a new, empty file). A schema-0
        file that holds tables was written by something else: its rows must not read as no runs."""
        # one statement, one snapshot: a first writer committing between two reads would look foreign
        version, tables = conn.execute("SELECT (SELECT user_version FROM pragma_user_version), "
                                       "(SELECT count(*) FROM sqlite_master WHERE type = 'table')").fetchone()
        if version != 0:
            return False
        if tables:
            raise HistoryError(f"{self.path} is not a draftops run history (it holds tables but no draftops schema "
                               f"version). Move it aside (mv {self.path} {self.path}.bad); the next run starts "
                               "a new history.")
        return True

    def _migrate(self, conn: sqlite3.Connection) -> None:
        if self._check_version(conn) == SCHEMA_VERSION or not self._unwritten(conn):
            return                     # (a file of something else is refused before anything changes in it)
        self._ensure_wal(conn)
        conn.execute("BEGIN IMMEDIATE")
        try:
            if self._check_version(conn) < SCHEMA_VERSION:       # another writer may have won the race
                for statement in filter(str.strip, _SCHEMA.split(";")):   # executescript would COMMIT early
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise

    @staticmethod
    def _ensure_wal(conn: sqlite3.Connection) -> None:
        """Switch a new database to WAL. SQLite answers "database is locked" at once, without its busy
        handler, when another connection is doing the same switch, so wait here instead; the loser
        usually finds the file already in WAL on its next look."""
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        pause = 0.005
        while conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            try:
                conn.execute("PRAGMA journal_mode = WAL")
            except sqlite3.OperationalError as exc:
                if ("locked" not in str(exc) and "busy" not in str(exc)) or time.monotonic() > deadline:
                    raise
                time.sleep(pause)
                pause = min(pause * 2, 0.1)

    def _error(self, exc: BaseException) -> HistoryError:
        text = str(exc)
        if "not a database" in text or "malformed" in text:
            return HistoryError(f"{self.path} is not a readable SQLite database ({text}). Move it aside "
                                f"(mv {self.path} {self.path}.bad); the next run starts a new history.")
        if "readonly" in text or "unable to open" in text or isinstance(exc, OSError):
            return HistoryError(f"cannot open the run history {self.path} for writing ({text}); make it and "
                                "its folder writable, or run from a project checkout you own.")
        if "no such column" in text or "no such table" in text or "has no column named" in text:
            return HistoryError(f"{self.path} is not a draftops run history (schema {SCHEMA_VERSION} has a `runs` "
                                f"table with other columns; {text}). Move it aside (mv {self.path} {self.path}.bad); "
                                "the next run starts a new history.")
        if "locked" in text or "busy" in text:
            return HistoryError(f"the run history {self.path} stayed locked for {BUSY_TIMEOUT_S:.0f} s: another "
                                f"process holds a write transaction on it (a stuck draftops run, or a sqlite3 "
                                f"shell inside BEGIN; `fuser {self.path}` names it where fuser is installed). "
                                "Let it finish or stop it, then run again; nothing was changed.")
        if "disk is full" in text or "disk I/O" in text:
            return HistoryError(f"the run history {self.path} could not be written ({text}); nothing was "
                                "changed. Free disk space and record again.")
        return HistoryError(f"run history {self.path}: {text}")

    def record(self, rec: RunRecord) -> None:
        """Insert the run, or update it in place when its id is already there."""
        values = _values(rec)
        placeholders = ", ".join("?" for _ in range(len(_COLUMNS) + 1))
        updates = ", ".join(f"{c} = excluded.{c}" for c in (*_COLUMNS[1:], "recorded_at"))
        with self._connect(write=True) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(f"INSERT INTO runs ({', '.join(_COLUMNS)}, recorded_at) VALUES ({placeholders}) "
                             f"ON CONFLICT(run_id) DO UPDATE SET {updates}", [*values, now_iso()])
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise

    def insert(self, rec: RunRecord) -> None:
        """Add the run; HistoryError when its id is already there (a row that must never be replaced,
        such as a night's: an id reused must not overwrite the earlier night)."""
        values = _values(rec)
        placeholders = ", ".join("?" for _ in range(len(_COLUMNS) + 1))
        with self._connect(write=True) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                if conn.execute("SELECT 1 FROM runs WHERE run_id = ?", [rec.run_id]).fetchone():
                    raise HistoryError(f"run {rec.run_id} is already in {self.path}; it is not replaced.")
                conn.execute(f"INSERT INTO runs ({', '.join(_COLUMNS)}, recorded_at) VALUES ({placeholders})",
                             [*values, now_iso()])
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise

    def query(self, *, kind: str | None = None, draft: str | None = None, since: str | None = None,
              host: str | None = None, engine: str | None = None, target: str | None = None,
              limit: int | None = None) -> list[RunRecord]:
        """Runs matching every given filter, newest first.

        ``draft`` matches the draft path, its last path component(s), or the config digest
        (a prefix of it is enough); ``since`` is an ISO time as ``parse_since`` returns it.
        """
        where: list[str] = []
        args: list[Any] = []
        for column, value in (("kind", kind), ("host", host), ("engine", engine), ("target", target)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        if draft is not None and not draft.strip():
            raise HistoryError("--draft is empty: give a draft path, its last path part or a digest prefix.")
        if draft is not None:
            digest = draft if draft.startswith("sha256:") else "sha256:" + draft
            where.append("(draft = ? OR draft LIKE ? ESCAPE '\\' OR draft_digest LIKE ? ESCAPE '\\')")
            args += [draft, "%/" + _like(draft.rstrip("/")), _like(digest) + "%"]
        if since is not None:
            where.append("time >= ?")
            args.append(since)
        sql = "SELECT * FROM runs" + (" WHERE " + " AND ".join(where) if where else "")
        sql += " ORDER BY time DESC, run_id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(int(limit))
        try:
            with self._connect(write=False) as conn:
                if self._unwritten(conn):              # (after _connect's check of a newer schema)
                    return []
                return _rows(self.path, conn.execute(sql, args))
        except FileNotFoundError:
            return []

    def latest(self, **filters: Any) -> RunRecord | None:
        """The newest run matching ``filters`` (the keywords of ``query``), or None."""
        found = self.query(limit=1, **filters)
        return found[0] if found else None

    def get(self, run_id: str) -> RunRecord | None:
        try:
            with self._connect(write=False) as conn:
                if self._unwritten(conn):
                    return None
                found = _rows(self.path, conn.execute("SELECT * FROM runs WHERE run_id = ?", [run_id]))
                return found[0] if found else None
        except FileNotFoundError:
            return None


def for_project(project_root: Path) -> History:
    """The history of the project checkout at ``project_root`` (``runs/history.sqlite``)."""
    return History(Path(project_root) / "runs" / DB_NAME)


def project_revision(project_root: Path) -> str | None:
    """The checkout's git revision, ``-dirty`` when tracked files differ; None outside git."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(project_root), *args], capture_output=True, text=True,
                                  timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None
    rev = git("rev-parse", "--short=12", "HEAD")
    if not rev:
        return None
    return rev + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
