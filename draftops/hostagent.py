"""The host side of draftops' plumbing: a stdlib-only script copied to ``<root>/state/`` on first use.

It runs under any python3 on the host (no ml-env needed) and does the work that must happen next to
the files: resolve and check ``root``, list and apply code syncs atomically, start detached jobs and
record their state, follow logs, pack run folders. Every subcommand prints one JSON object (or a raw
stream for ``tail``/``follow``/``pack``), so the local side parses nothing ad hoc.

Replies are framed: the host's shell start-up files may print a banner before this script runs, so
every answer starts with a marker line holding a nonce the local side chose (``$DRAFTOPS_FRAME``),
and the local side ignores whatever comes before it. A JSON reply is the line after the marker; a
raw stream is a JSON header line after the marker, then the bytes. Error messages on stderr carry
their own marker, so a banner on stderr does not bury them.
"""
import hashlib
import io
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import tempfile
import time

SYNC_META = ".draftops-sync.json"
TMP_MARK = ".draftops-tmp-"
EVENT_PREFIX = "@@draftops "
FRAME_ENV = "DRAFTOPS_FRAME"          # the nonce of this call's reply marker (chosen by the local side)
FRAME_PREFIX = "@@draftops-reply "    # stdout: the reply follows this marker line
ERROR_PREFIX = "@@draftops-error "    # stderr: the error message follows this marker line
_AGENT_PATH = None   # where this script is installed on the host (set by prepare or main)


def _marker(prefix):
    return "\n{}{}\n".format(prefix, os.environ.get(FRAME_ENV, "-")).encode()


def _out(obj):
    """Print one framed JSON reply."""
    sys.stdout.flush()
    sys.stdout.buffer.write(_marker(FRAME_PREFIX) + json.dumps(obj).encode() + b"\n")
    sys.stdout.buffer.flush()


def _raw_start(header):
    """Start a framed raw stream: the marker, one JSON header line, then the caller writes bytes."""
    _out(header)


def _fail(message, code=2):
    sys.stderr.flush()
    sys.stderr.buffer.write(_marker(ERROR_PREFIX) + message.encode("utf-8", "replace") + b"\n")
    sys.stderr.buffer.flush()
    sys.exit(code)


def _atomic_write(path, data, mode=0o644):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=os.path.basename(path) + TMP_MARK)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ---------------------------------------------------------------- root
def cmd_prepare(root, agent_name, source=None):
    """Expand ``root``, refuse / and $HOME, create code/runs/state, prove it is writable, and
    install this script's ``source`` as ``state/<agent_name>`` when it is not there yet."""
    home = os.path.realpath(os.path.expanduser("~"))
    resolved = os.path.realpath(os.path.expanduser(os.path.expandvars(root)))
    if resolved in ("/", home):
        _fail("root %r resolves to %s, which is %s; draftops deletes inside <root>/code during sync, so it "
              "needs a folder of its own, e.g. ~/draftops" % (root, resolved,
                                                               "/" if resolved == "/" else "the home directory"), 3)
    try:
        for sub in ("code", "runs", "state"):
            os.makedirs(os.path.join(resolved, sub), exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=os.path.join(resolved, "state"), prefix=".probe")
        os.close(fd)
        os.unlink(probe)
        agent = os.path.join(resolved, "state", agent_name)
        global _AGENT_PATH
        _AGENT_PATH = agent
        if source and not os.path.exists(agent):
            _atomic_write(agent, source.encode())
    except OSError as exc:
        _fail("root %r (%s) is not writable: %s" % (root, resolved, exc.strerror or exc), 4)
    _out({"root": resolved, "home": home, "python": sys.executable,
          "python_version": "%d.%d.%d" % sys.version_info[:3], "platform": sys.platform})
    return resolved


def boot(source, argv):
    """First call of a session (run inline with ``python3 -c``): prepare, then run ``argv[2:]`` if given.

    Folding the root check and agent install into the first real command saves an SSH exec, which is
    most of the cost of a no-op sync."""
    root = cmd_prepare(argv[0], argv[1], source)
    if len(argv) > 2:
        main([root] + list(argv[2:]))


# ---------------------------------------------------------------- sync
def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _scan(code_dir, cache):
    """Manifest of ``code_dir``: {rel: [kind, sha_or_target, mode]}; hashes reused when stat is unchanged."""
    manifest, new_cache = {}, {}
    for dirpath, dirnames, filenames in os.walk(code_dir):
        for name in list(dirnames):
            full = os.path.join(dirpath, name)
            if os.path.islink(full):
                dirnames.remove(name)
                filenames.append(name)
        for name in filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, code_dir)
            if TMP_MARK in name:
                os.unlink(full)          # left by an apply that was killed before os.replace
                continue
            st = os.lstat(full)
            if os.path.islink(full):
                manifest[rel] = ["l", os.readlink(full), 0]
                continue
            key = [st.st_size, st.st_mtime_ns, st.st_ino]
            old = cache.get(rel)
            sha = old[1] if old and old[0] == key else _sha256(full)
            new_cache[rel] = [key, sha]
            manifest[rel] = ["f", sha, st.st_mode & 0o777]
    return manifest, new_cache


def _load_cache(state_file):
    try:
        with open(state_file) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def digest(manifest):
    """Canonical hash of a manifest; the local side computes the same one."""
    return hashlib.sha256(json.dumps(sorted(manifest.items()), separators=(",", ":")).encode()).hexdigest()


def _scan_and_store(code_dir, state_file):
    """Manifest of ``code_dir``, keeping the stat cache in ``state_file`` up to date."""
    old = _load_cache(state_file)
    manifest, cache = _scan(code_dir, old)
    if cache != old:
        _atomic_write(state_file, json.dumps(cache).encode())
    return manifest


def cmd_manifest(code_dir, state_file):
    os.makedirs(code_dir, exist_ok=True)
    manifest = _scan_and_store(code_dir, state_file)
    _out({"manifest": manifest, "digest": digest(manifest)})


def _inside(code_dir, rel):
    full = os.path.normpath(os.path.join(code_dir, rel))
    if os.path.isabs(rel) or not full.startswith(code_dir.rstrip("/") + "/"):
        _fail("refusing sync entry %r: it points outside %s" % (rel, code_dir), 5)
    return full


def _clear_for(full):
    """Remove what stands where a file or link must go (a directory becoming a file)."""
    if os.path.isdir(full) and not os.path.islink(full):
        shutil.rmtree(full)


def cmd_apply(code_dir, state_file, expected_sha, expected_len, expected_tree="-"):
    """Apply a sync payload from stdin. With ``expected_tree``, apply only if the tree still has that
    manifest digest (the local side's memory of the last sync); otherwise answer "stale" with the
    manifest, and the local side falls back to a full comparison."""
    # Once the whole payload is here the apply must finish even if the SSH link drops.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    payload = sys.stdin.buffer.read()
    os.makedirs(code_dir, exist_ok=True)
    code_dir = os.path.realpath(code_dir)
    if expected_tree != "-":
        manifest = _scan_and_store(code_dir, state_file)
        if digest(manifest) != expected_tree:
            _out({"status": "stale", "manifest": manifest, "digest": digest(manifest)})
            return
    if len(payload) != int(expected_len) or hashlib.sha256(payload).hexdigest() != expected_sha:
        _fail("sync payload incomplete (%d of %s bytes); nothing was changed" % (len(payload), expected_len), 6)
    if not payload:
        _out({"status": "applied", "written": 0, "deleted": 0, "digest": expected_tree})
        return
    written = 0
    with tarfile.open(fileobj=io.BytesIO(payload), mode="r:*") as tar:
        meta = json.load(tar.extractfile(SYNC_META))
        for member in tar.getmembers():
            if member.name == SYNC_META:
                continue
            full = _inside(code_dir, member.name)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            _clear_for(full)
            tmp = os.path.join(os.path.dirname(full), TMP_MARK + os.path.basename(full))
            if member.issym():
                if os.path.lexists(tmp):
                    os.unlink(tmp)
                os.symlink(member.linkname, tmp)
            else:
                with open(tmp, "wb") as fh:
                    shutil.copyfileobj(tar.extractfile(member), fh)
                os.chmod(tmp, member.mode & 0o777)
            os.replace(tmp, full)
            written += 1
    deleted = 0
    for rel in meta.get("delete", []):
        full = _inside(code_dir, rel)
        if os.path.lexists(full) and not (os.path.isdir(full) and not os.path.islink(full)):
            os.unlink(full)
            deleted += 1
            parent = os.path.dirname(full)
            while parent != code_dir and os.path.isdir(parent) and not os.listdir(parent):
                os.rmdir(parent)
                parent = os.path.dirname(parent)
    manifest = _scan_and_store(code_dir, state_file)
    _out({"status": "applied", "written": written, "deleted": deleted, "files": len(manifest),
          "digest": digest(manifest)})


# ---------------------------------------------------------------- jobs
LIVE_STATES = (None, "starting", "running")
ENV_FILE = ".env.json"                # the job's env values (0600): read, then deleted, by the runner
PULL_NOTES = ".draftops-pull-notes.json"
NO_RUN = 7                            # exit code: no such run folder
BLOCK = 1 << 16
MAX_LINE = 1 << 16                    # the local side shows longer lines in pieces of this size
OUTCOME_POLL_S = 2.0                  # how often the runner looks for new result events
MAX_EVENT = 1 << 16
HAVE_PROC = os.path.exists("/proc/self/stat")


def _read_json(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _proc_info(pid):
    """(pgid, state letter, start time in clock ticks since boot) of ``pid``, or None if it is gone."""
    if not HAVE_PROC:
        return _proc_table().get(pid)
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return int(fields[2]), fields[0].decode(), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _proc_table():
    """{pid: (pgid, state, start_ticks)} of every process (start_ticks None where ``ps`` answers)."""
    if HAVE_PROC:
        table = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                info = _proc_info(int(name))
                if info is not None:
                    table[int(name)] = info
        return table
    ps = subprocess.run(["ps", "-A", "-o", "pid=,pgid=,stat="], capture_output=True, text=True, check=False)
    table = {}
    for line in ps.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[0].isdigit() and fields[1].isdigit():
            table[int(fields[0])] = (int(fields[1]), fields[2][:1], None)
    return table


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except OSError:
        ps = subprocess.run(["ps", "-o", "args=", "-p", str(pid)], capture_output=True, check=False)
        return ps.stdout


def _is_ours(pid, info, start_ticks, run_id):
    """Whether process ``pid`` is the runner we recorded, not a later process that got its pid."""
    if start_ticks is not None and info[2] is not None:
        return info[2] == start_ticks
    return run_id.encode() in _cmdline(pid)     # status written without a start time, or no /proc


def _group_state(pgid, start_ticks, run_id, table=None):
    """How the job's process group is doing: "running" while the runner (the group leader, started
    with setsid) lives, "orphaned" while only other members do (someone killed the runner), None
    when the group is gone.

    Pid reuse: the kernel keeps a group id taken while any member lives, so a leader pid that now
    belongs to another process (other start time) means every process of ours is gone."""
    if table is None:
        leader = _proc_info(pgid)
        if leader is not None and leader[1] != "Z" and _is_ours(pgid, leader, start_ticks, run_id):
            return "running"                     # the common case, without scanning every process
        table = _proc_table()
    leader = table.get(pgid)
    if leader is not None:
        if not _is_ours(pgid, leader, start_ticks, run_id):
            return None
        if leader[1] != "Z":
            return "running"
    members = any(info[0] == pgid and info[1] != "Z" for pid, info in table.items() if pid != pgid)
    return "orphaned" if members else None


def _read_pid(run_dir):
    try:
        with open(os.path.join(run_dir, "pid")) as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def _status(run_dir, table=None):
    run_dir = os.path.abspath(run_dir)
    run_id = os.path.basename(run_dir.rstrip("/"))
    job = _read_json(os.path.join(run_dir, "job.json")) or {}
    status_path = os.path.join(run_dir, "status.json")
    status = _read_json(status_path) or {}
    row = {"id": run_id, "name": job.get("name"), "task": job.get("task") or job.get("name"),
           "args": job.get("args"), "command": job.get("command"), "created": job.get("created")}
    row.update(status)
    if status.get("state") not in LIVE_STATES:
        return row
    pid = status.get("pid") or _read_pid(run_dir)
    group = _group_state(int(pid), status.get("start_ticks"), run_id, table) if pid else None
    if group == "running":
        row["state"] = "running"
    elif group == "orphaned":
        row.update(state="running", orphaned=True,
                   note="the runner process is gone (killed?) but the job's other processes still run in "
                        f"process group {int(pid)}; its exit code will not be recorded")
    else:
        again = _read_json(status_path) or {}
        if again.get("state") not in LIVE_STATES:            # it ended while we looked
            row.update(again)
        elif not pid and time.time() - os.path.getmtime(run_dir) < 30:
            row["state"] = "starting"
        else:
            row.update(state="dead", note="every process of the job is gone and none recorded an exit code "
                                          "(the runner was killed, or the host restarted)")
    return row


class _EventScanner:
    """Reads a growing log from where it stopped, in blocks (bounded memory, C-speed search), and
    keeps the fields of the last ``result`` event and the last ``error`` event: the run's outcome,
    which `invoke runs` shows. Any job records its own headline by printing a result event."""

    MARK = b"\n" + EVENT_PREFIX.encode()
    READ = 1 << 20

    def __init__(self, path):
        self.path, self.pos, self.carry = path, 0, b"\n"
        self.result, self.error = {}, None

    @property
    def outcome(self):
        outcome = dict(self.result)
        if self.error:
            outcome["error"] = self.error
        return outcome

    def scan(self, final=False):
        """Read what was appended since the last call; True when the outcome changed."""
        before = self.outcome
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.pos)
                while block := fh.read(self.READ):
                    self.pos += len(block)
                    self._search(self.carry + block)
        except OSError:
            return False
        if final and self.carry.startswith(self.MARK):        # an event line without its newline
            self._take(self.carry[len(self.MARK):])
        return self.outcome != before

    def _search(self, buf):
        start = 0
        while True:
            i = buf.find(self.MARK, start)
            if i < 0:
                self.carry = buf[-(len(self.MARK) - 1):]
                return
            j = buf.find(b"\n", i + 1)
            if j < 0:                                          # the line goes on in the next block
                self.carry = buf[i:] if len(buf) - i <= MAX_EVENT else b""
                return
            self._take(buf[i + len(self.MARK):j])
            start = j

    def _take(self, raw):
        try:
            event = json.loads(raw.decode("utf-8", "replace"))
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        if event.get("event") == "result":
            fields: dict = {}
            for key, value in event.items():
                if key in ("event", "t") or not isinstance(value, (str, int, float, bool)) or len(fields) >= 24:
                    continue
                fields[str(key)[:64]] = value[:300] if isinstance(value, str) else value
            self.result = fields
        elif event.get("event") == "error" and isinstance(event.get("message"), str):
            self.error = event["message"][:300]


def cmd_start(run_dir):
    """Create ``run_dir`` from the job spec on stdin, start its runner in its own session (the leader
    of a new process group) with stdio detached, and print the runner's pid.

    job.json says what the run is (task, arguments, env names); the env values go to a 0600 file the
    runner reads and deletes, so they never reach `runs`, a pulled folder or a log."""
    run_dir = os.path.abspath(run_dir)
    run_id = os.path.basename(run_dir.rstrip("/"))
    spec = json.loads(sys.stdin.read())
    env = spec.pop("env", None) or {}
    spec["env_keys"] = sorted(env)
    os.makedirs(run_dir, mode=0o700)
    if env:
        _atomic_write(os.path.join(run_dir, ENV_FILE), json.dumps(env).encode(), 0o600)
    _atomic_write(os.path.join(run_dir, "job.json"), json.dumps(spec).encode(), 0o600)
    _atomic_write(os.path.join(run_dir, "command"), (spec["command"] + "\n").encode())
    with open(os.path.join(run_dir, "log"), "ab") as log:      # the runner keeps its own descriptor
        agent = _AGENT_PATH or os.path.abspath(__file__)
        proc = subprocess.Popen([sys.executable, agent, os.getcwd(), "runner", run_dir, run_id],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)
    _atomic_write(os.path.join(run_dir, "pid"), f"{proc.pid}\n".encode())
    _out({"pid": proc.pid})


def cmd_runner(run_dir, run_id):
    """Run the job, keep its outcome (result events) and record its exit code; survives the SSH link
    (own session, no tty). The runner is its process group's leader: liveness and kill go by group."""
    run_dir = os.path.abspath(run_dir)
    job = _read_json(os.path.join(run_dir, "job.json")) or {}
    env_path = os.path.join(run_dir, ENV_FILE)
    extra = _read_json(env_path) or {}
    if os.path.exists(env_path):
        os.unlink(env_path)
    status_path = os.path.join(run_dir, "status.json")
    me = _proc_info(os.getpid())
    base = {"pid": os.getpid(), "pgid": os.getpgid(0), "start_ticks": me[2] if me else None,
            "started": _now()}
    _atomic_write(status_path, json.dumps(dict(base, state="running")).encode())
    env = dict(os.environ, **extra, DRAFTOPS_RUN_ID=run_id, DRAFTOPS_RUN_DIR=run_dir, PYTHONUNBUFFERED="1")
    env.pop(FRAME_ENV, None)
    cwd = os.path.abspath(job.get("cwd") or run_dir)     # relative cwd: relative to root
    try:
        child = subprocess.Popen(["sh", "-c", job["command"]], cwd=cwd, env=env, stdin=subprocess.DEVNULL)
    except (OSError, KeyError) as exc:
        print(f"draftops: cannot start the job in {cwd}: {exc}", flush=True)
        final = dict(base, state="failed", exit_code=127, ended=_now(), outcome={"error": str(exc)[:300]})
        _atomic_write(status_path, json.dumps(final).encode())
        return
    got = {}

    def forward(signum, _frame):
        got["signal"] = signum
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    scanner = _EventScanner(os.path.join(run_dir, "log"))
    while True:
        try:
            code = child.wait(timeout=OUTCOME_POLL_S)
            break
        except subprocess.TimeoutExpired:
            if scanner.scan():
                _atomic_write(status_path, json.dumps(dict(base, state="running",
                                                           outcome=scanner.outcome)).encode())
    sys.stdout.flush()
    scanner.scan(final=True)
    state = "killed" if got else ("succeeded" if code == 0 else "failed")
    final = dict(base, state=state, exit_code=code, ended=_now())
    if scanner.outcome:
        final["outcome"] = scanner.outcome
    if got:
        final["signal"] = got["signal"]
    _atomic_write(status_path, json.dumps(final).encode())


def _run_dir_or_fail(run_dir):
    if not os.path.isdir(run_dir):
        _fail(f"no run folder {run_dir}", NO_RUN)
    return os.path.abspath(run_dir)


def cmd_status(run_dir):
    _out(_status(_run_dir_or_fail(run_dir)))


def cmd_runs(runs_dir):
    rows = []
    if os.path.isdir(runs_dir):
        table = _proc_table()                  # one look at the process list for every run
        for name in sorted(os.listdir(runs_dir)):
            full = os.path.join(runs_dir, name)
            if os.path.isdir(full) and not os.path.islink(full):
                rows.append(_status(full, table))
    _out({"runs": rows})


def cmd_kill(run_dir, grace):
    """TERM the job's whole process group, KILL what is left after ``grace`` seconds; works when the
    runner itself is gone too (then this records the kill)."""
    run_dir = _run_dir_or_fail(run_dir)
    row = _status(run_dir)
    if row["state"] != "running":
        _out(row)
        return
    pgid = int(row.get("pgid") or row["pid"])

    def live():
        return _group_state(pgid, row.get("start_ticks"), row["id"]) is not None

    sent = None
    for sig, wait in ((signal.SIGTERM, float(grace)), (signal.SIGKILL, 5.0)):
        if not live():
            break
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        sent = sig
        deadline = time.time() + wait
        while time.time() < deadline and live():
            time.sleep(0.05)
    status_path = os.path.join(run_dir, "status.json")
    final = _read_json(status_path) or {}
    if final.get("state") in LIVE_STATES:      # the runner was gone, or SIGKILLed before it could record
        final.update(state="killed", ended=_now(), signal=sent)
        _atomic_write(status_path, json.dumps(final).encode())
    _out(_status(run_dir))


def _tail_offset(path, lines):
    """Where the last ``lines`` text lines of the log start (event lines not counted), reading
    backwards in blocks and never more than ``lines`` × MAX_LINE bytes: memory and time stay bounded
    whatever the size of the log."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return 0
    try:
        size = os.fstat(fd).st_size
        if lines <= 0:
            return size
        floor = max(0, size - lines * MAX_LINE)
        mark = EVENT_PREFIX.encode()
        count, pos, later = 0, size, b""
        while pos > floor:
            step = min(BLOCK, pos - floor)
            pos -= step
            block = os.pread(fd, step, pos)
            ext = block + later                  # a line start's prefix may reach into the next block
            i = len(block)
            while True:
                i = block.rfind(b"\n", 0, i)
                if i < 0:
                    break
                start = pos + i + 1
                if start < size and not ext.startswith(mark, i + 1):
                    count += 1
                    if count == lines:
                        return start
            later = ext[:len(mark)]
        return floor
    finally:
        os.close(fd)


def _read_at(path, pos, size=BLOCK):
    """Up to ``size`` bytes of ``path`` from ``pos`` (nothing when it cannot be read)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(pos)
            return fh.read(size)
    except OSError:
        return b""


def _copy_range(path, start, end, out):
    """Copy bytes [start, end) of ``path`` to ``out`` in blocks."""
    pos = start
    while pos < end:
        chunk = _read_at(path, pos, min(BLOCK, end - pos))
        if not chunk:
            break
        out.write(chunk)
        pos += len(chunk)
    out.flush()


def cmd_tail(run_dir, lines):
    """The log's last ``lines`` lines (or "all") as a framed raw stream, copied in blocks."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    path = os.path.join(_run_dir_or_fail(run_dir), "log")
    try:
        size = os.path.getsize(path)
    except OSError:
        size = 0
    start = 0 if lines == "all" else _tail_offset(path, int(lines))
    _raw_start({"offset": start, "size": size})
    _copy_range(path, start, size, sys.stdout.buffer)


def cmd_follow(run_dir, start):
    """Copy the log to stdout as it grows, from byte ``start`` (or "-N": the last N lines), in blocks;
    end with a job-end event on a line of its own."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    run_dir = _run_dir_or_fail(run_dir)
    path = os.path.join(run_dir, "log")
    pos = _tail_offset(path, int(start[1:])) if start.startswith("-") else int(start)
    _raw_start({"offset": pos})
    out = sys.stdout.buffer
    last = b"\n"
    while True:
        chunk = _read_at(path, pos)
        if chunk:
            out.write(chunk)
            out.flush()
            pos += len(chunk)
            last = chunk[-1:]
            continue
        row = _status(run_dir)
        if row["state"] in ("running", "starting"):
            time.sleep(0.2)
            continue
        while chunk := _read_at(path, pos):      # what the job wrote before it ended
            out.write(chunk)
            pos += len(chunk)
            last = chunk[-1:]
        if last != b"\n":
            out.write(b"\n")
        out.write((EVENT_PREFIX + json.dumps(dict(row, event="job-end", offset=pos)) + "\n").encode())
        out.flush()
        return


def _link_problem(rel, target):
    """Why a symlink may not travel with a pulled run folder (None: it stays inside, keep it)."""
    if os.path.isabs(target):
        return f"symlink to the absolute path {target} (outside the run folder)"
    if ".." in target.split("/"):
        return f"symlink to {target}: links with '..' are not pulled (they may lead out of the run folder)"
    return None


class _Exactly:
    """Reads exactly ``size`` bytes of a file that may change while it is packed: stops at ``size`` if
    it grew, pads with NULs (and says so) if it shrank."""

    def __init__(self, fh, size):
        self.fh, self.left, self.short = fh, size, False

    def read(self, n=-1):
        if self.left <= 0:
            return b""
        n = self.left if n is None or n < 0 else min(n, self.left)
        data = self.fh.read(n)
        if not data:
            self.short, data = True, b"\0" * n
        self.left -= len(data)
        return data


def _tarinfo(rel, st, kind):
    info = tarfile.TarInfo(rel)
    info.type, info.mode, info.mtime = kind, stat.S_IMODE(st.st_mode), int(st.st_mtime)
    return info


def _pack_dir(tar, dir_fd, rel, skipped):
    """Add the entries of the open folder ``dir_fd`` (named ``rel`` in the tar) without following any
    link: folders and files are opened relative to their parent's fd with O_NOFOLLOW."""
    try:
        names = sorted(os.listdir(dir_fd))
    except OSError as exc:
        skipped.append({"path": rel or ".", "reason": f"cannot list the folder: {exc.strerror}"})
        return
    for name in names:
        path = rel + "/" + name if rel else name
        if (not rel and name == ENV_FILE) or TMP_MARK in name:
            continue
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
                try:
                    tar.addfile(_tarinfo(path, st, tarfile.DIRTYPE))
                    _pack_dir(tar, fd, path, skipped)
                finally:
                    os.close(fd)
            elif stat.S_ISREG(st.st_mode):
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
                with os.fdopen(fd, "rb") as fh:
                    st = os.fstat(fd)
                    if not stat.S_ISREG(st.st_mode):
                        skipped.append({"path": path, "reason": "changed from a file to something else"})
                        continue
                    info = _tarinfo(path, st, tarfile.REGTYPE)
                    info.size = st.st_size
                    body = _Exactly(fh, st.st_size)
                    tar.addfile(info, body)
                    if body.short:
                        skipped.append({"path": path, "reason": "shrank while it was copied; padded with NULs"})
            elif stat.S_ISLNK(st.st_mode):
                target = os.readlink(name, dir_fd=dir_fd)
                problem = _link_problem(path, target)
                if problem:
                    skipped.append({"path": path, "reason": problem})
                    continue
                info = _tarinfo(path, st, tarfile.SYMTYPE)
                info.linkname, info.mode = target, 0o777
                tar.addfile(info)
            else:
                kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                        else "a device node")
                skipped.append({"path": path, "reason": f"{kind}, not a file"})
        except OSError as exc:
            skipped.append({"path": path, "reason": f"cannot read: {exc.strerror or exc}"})


def cmd_pack(run_dir):
    """A tar.gz of the run folder on stdout (framed), for `invoke pull`: files, folders and links that
    stay inside; everything else is left out and listed in a notes member at the end."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    run_dir = _run_dir_or_fail(run_dir)
    try:
        top = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        _fail(f"cannot open run folder {run_dir} without following links: {exc.strerror}", 8)
    _raw_start({"format": "tar.gz"})
    skipped: list = []
    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|gz") as tar:
        try:
            _pack_dir(tar, top, "", skipped)
        finally:
            os.close(top)
        notes = json.dumps({"skipped": skipped}).encode()
        info = tarfile.TarInfo(PULL_NOTES)
        info.size, info.mtime, info.mode = len(notes), int(time.time()), 0o644
        tar.addfile(info, io.BytesIO(notes))
    sys.stdout.buffer.flush()


COMMANDS = {"prepare": cmd_prepare, "manifest": cmd_manifest, "apply": cmd_apply, "start": cmd_start,
            "runner": cmd_runner, "status": cmd_status, "runs": cmd_runs, "kill": cmd_kill,
            "tail": cmd_tail, "follow": cmd_follow, "pack": cmd_pack}  # type: dict

def main(argv):
    """``agent.py ROOT COMMAND ARGS...``: paths in ARGS are relative to ROOT."""
    global _AGENT_PATH
    if _AGENT_PATH is None:
        _AGENT_PATH = os.path.abspath(__file__)
    os.chdir(argv[0])
    COMMANDS[argv[1]](*argv[2:])


if __name__ == "__main__":
    main(sys.argv[1:])
