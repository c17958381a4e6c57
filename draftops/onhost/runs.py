"""Jobs on the host: start a detached runner that outlives the link, record and read its state
(process group, start time), list recent runs, stop one.

One part of the host agent: draftops/onhost/__init__.py assembles the parts, in order, into the one
stdlib-only script the host runs (docs/protocol.md)."""
import json
import os
import signal
import stat
import sys
import time

from draftops.onhost.slurm import (  # noqa: F401
    _cancel,
    _runner_may_run,
    _slurm_row,
    _slurm_rows_prefetch,
    _submit,
)
from draftops.onhost.wire import (  # noqa: F401
    _AGENT_PATH,
    EVENT_PREFIX,
    FRAME_ENV,
    PROTOCOL_ENV,
    Exit,
    _atomic_write,
    _fail,
    _now,
    _out,
    _read_json,
    _read_small,
    _write_status,
)


def _live_runs_on_code(code_dir):
    """Ids of live runs whose working folder is in ``code_dir``: a sync would change code under them
    (a module imported later, a script read again) mid-run."""
    code_real = os.path.realpath(code_dir)
    try:
        names = sorted(os.listdir("runs"))
    except OSError:
        return []
    busy = []
    for name in names:
        run_dir = os.path.join("runs", name)
        job = _read_json(os.path.join(run_dir, "job.json"))
        cwd = job.get("cwd") if isinstance(job, dict) else None
        if not isinstance(cwd, str) or not cwd:
            continue
        cwd = os.path.realpath(cwd)
        if cwd != code_real and not cwd.startswith(code_real + "/"):
            continue
        try:
            if _status(run_dir).get("state") in ("running", "starting"):
                busy.append(name)
        except OSError:
            continue            # the run folder went away while we looked
    return busy


# ---------------------------------------------------------------- jobs
LIVE_STATES = (None, "starting", "running")
ENV_FILE = ".env.json"                # the job's env values (0600): read, then deleted, by the runner
BLOCK = 1 << 16
OUTCOME_POLL_S = 2.0                  # how often the runner looks for new result events
FOLLOW_POLL_S = (0.01, 0.1)           # follow: first pause after output or start, doubling to the last
MAX_EVENT = 1 << 16
HAVE_PROC = os.path.exists("/proc/self/stat")










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
    import subprocess
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
        import subprocess
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


def _age(path):
    """Seconds since ``path`` last changed; infinite when it is gone."""
    try:
        return time.time() - os.path.getmtime(path)
    except OSError:
        return float("inf")


def _pid_in(value):
    """``value`` if it can be a pid (a status.json some job wrote over may hold anything), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _read_pid(run_dir):
    data = _read_small(os.path.join(run_dir, "pid"), 64)
    try:
        return _pid_in(int(data.strip())) if data is not None else None
    except ValueError:
        return None


def _status(run_dir, table=None, slurm_fields=None):
    """The run's row. A Slurm run's state comes from Slurm while it knows the job (``slurm_fields``:
    one scontrol answer for a whole listing); its runner's pid is a compute node's, never looked up here."""
    run_dir = os.path.abspath(run_dir)
    run_id = os.path.basename(run_dir.rstrip("/"))
    job = _read_json(os.path.join(run_dir, "job.json")) or {}
    status_path = os.path.join(run_dir, "status.json")
    status = _read_json(status_path) or {}
    row = {"id": run_id, "name": job.get("name"), "task": job.get("task") or job.get("name"),
           "args": job.get("args"), "command": job.get("command"), "created": job.get("created")}
    row.update(status)
    if job.get("slurm"):
        return _slurm_row(run_dir, row, status, slurm_fields)
    if status.get("state") not in LIVE_STATES:
        return row
    pid = _pid_in(status.get("pid")) or _read_pid(run_dir)
    group = _group_state(pid, status.get("start_ticks"), run_id, table) if pid else None
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
        elif not pid and _age(run_dir) < 30:
            row["state"] = "starting"
        elif not os.path.isdir(run_dir):
            row.update(state="dead", note="its run folder is gone (removed or moved while draftops read it), "
                                          "so nothing tells how the job went")
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
    if isinstance(spec.get("slurm"), dict):
        _submit(run_dir, run_id, spec["slurm"])
        return
    import subprocess
    with open(os.path.join(run_dir, "log"), "ab") as log:      # the runner keeps its own descriptor
        agent = _AGENT_PATH or os.path.abspath(__file__)
        # -S: the runner is this stdlib-only file; the job's own command gets its python's site as usual
        proc = subprocess.Popen([sys.executable, "-S", agent, os.getcwd(), "runner", run_dir, run_id],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)
    _atomic_write(os.path.join(run_dir, "pid"), f"{proc.pid}\n".encode())
    _out({"pid": proc.pid})


def cmd_runner(run_dir, run_id):
    """Run the job, keep its outcome (result events) and record its exit code; survives the SSH link
    (own session, no tty). The runner is its process group's leader: liveness and kill go by group."""
    import subprocess
    run_dir = os.path.abspath(run_dir)
    job = _read_json(os.path.join(run_dir, "job.json")) or {}
    if job.get("slurm") and not _runner_may_run(run_dir):
        sys.exit(1)                            # Slurm records the job as FAILED: it ran nothing
    env_path = os.path.join(run_dir, ENV_FILE)
    extra = _read_json(env_path) or {}
    if os.path.exists(env_path):
        os.unlink(env_path)
    status_path = os.path.join(run_dir, "status.json")
    me = _proc_info(os.getpid())
    base = {"pid": os.getpid(), "pgid": os.getpgid(0), "start_ticks": me[2] if me else None,
            "started": _now()}
    if os.environ.get("SLURM_JOB_ID"):           # inside a Slurm job: which node, which job
        import socket
        base.update(node=socket.gethostname(), slurm_job_id=os.environ["SLURM_JOB_ID"])
    _atomic_write(status_path, json.dumps(dict(base, state="running")).encode())
    env = dict(os.environ, **extra, DRAFTOPS_RUN_ID=run_id, DRAFTOPS_RUN_DIR=run_dir, PYTHONUNBUFFERED="1")
    env.pop(FRAME_ENV, None)
    env.pop(PROTOCOL_ENV, None)
    cwd = os.path.abspath(job.get("cwd") or run_dir)     # relative cwd: relative to root
    began = time.monotonic()
    try:
        child = subprocess.Popen(["sh", "-c", job["command"]], cwd=cwd, env=env, stdin=subprocess.DEVNULL)
    except (OSError, KeyError) as exc:
        print(f"draftops: cannot start the job in {cwd}: {exc}", flush=True)
        final = dict(base, state="failed", exit_code=127, ended=_now(), outcome={"error": str(exc)[:300]})
        _write_status(status_path, json.dumps(final).encode())
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
    code = _wait_for(child, scanner, status_path, base)
    sys.stdout.flush()
    scanner.scan(final=True)
    state = "killed" if got else ("succeeded" if code == 0 else "failed")
    # `started`/`ended` are whole seconds (for people); `seconds` is how long the command ran, to the ms
    final = dict(base, state=state, exit_code=code, ended=_now(), seconds=round(time.monotonic() - began, 3))
    if scanner.outcome:
        final["outcome"] = scanner.outcome
    if got:
        final["signal"] = got["signal"]
    _write_status(status_path, json.dumps(final).encode())
    if "slurm_job_id" in base:                 # Slurm's own state (COMPLETED / FAILED) follows the command's
        sys.exit(code if 0 <= code < 256 else 128 + min(-code, 127))


def _wait_for(child, scanner, status_path, base):
    """Wait for the job's command to exit and return its code; meanwhile keep status.json's outcome
    up to date from the log's result events."""
    import subprocess
    exit_fd = _exit_fd(child.pid)
    try:
        while True:
            if exit_fd is not None:              # woken the moment the command exits
                if _pause_or_exit(exit_fd, OUTCOME_POLL_S):
                    return child.wait()
            else:                                # Popen.wait(timeout) looks every 50 ms at best
                try:
                    return child.wait(timeout=OUTCOME_POLL_S)
                except subprocess.TimeoutExpired:
                    pass
            if scanner.scan():
                _write_status(status_path, json.dumps(dict(base, state="running",
                                                           outcome=scanner.outcome)).encode())
    finally:
        if exit_fd is not None:
            os.close(exit_fd)


def _exit_fd(pid):
    """A descriptor that turns readable when process ``pid`` exits (a Linux pidfd), or None where
    there is none (older kernels and Pythons, other systems: callers then poll as before)."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None or not pid:
        return None
    try:
        return opener(int(pid))
    except (OSError, ValueError):
        return None


def _pause_or_exit(fd, seconds):
    """Wait ``seconds``, or less if the process behind ``fd`` exits first (then True)."""
    if fd is None:
        time.sleep(seconds)
        return False
    import select
    return bool(select.select([fd], [], [], seconds)[0])


def _run_dir_or_fail(run_dir):
    if not os.path.isdir(run_dir):
        _fail(f"no run folder {run_dir}", Exit.NO_RUN)
    return os.path.abspath(run_dir)


def cmd_status(run_dir):
    _out(_status(_run_dir_or_fail(run_dir)))


def cmd_runs(runs_dir, ids=None):
    """Every run's status, or only those of ``ids`` (comma-separated run ids; unknown ones are left
    out): a caller that wants a few runs does not read a history of thousands."""
    rows = []
    if os.path.isdir(runs_dir):
        table = _proc_table()                  # one look at the process list for every run
        if ids is None:
            names = sorted(os.listdir(runs_dir))
        else:
            names = sorted({n for n in ids.split(",") if n and n not in (".", "..") and "/" not in n})
        dirs = [os.path.join(runs_dir, name) for name in names]
        dirs = [d for d in dirs if os.path.isdir(d) and not os.path.islink(d)]
        fields = _slurm_rows_prefetch(dirs)
        rows = [_status(full, table, fields) for full in dirs]
    _out({"runs": rows})


def _named_by_time(name):
    """Whether ``name`` starts as draftops.runs.jobs.new_run_id names runs: ``YYYYmmdd-HHMMSS-``."""
    return name[:8].isdigit() and name[8:9] == "-" and name[9:15].isdigit() and name[15:16] == "-"


def cmd_recent(runs_dir, count):
    """The last ``count`` runs by id (an id starts with its start time) and how many runs there are:
    `invoke runs` shows the end of a long history without reading every run's status."""
    count = int(count)
    names = []
    if os.path.isdir(runs_dir):
        # a folder not named as draftops names runs (by the time it started) is counted as the oldest:
        # it would otherwise sort after every run and always take a place among "the last N"
        for name in sorted(os.listdir(runs_dir), key=lambda n: (_named_by_time(n), n)):
            try:
                if stat.S_ISDIR(os.lstat(os.path.join(runs_dir, name)).st_mode):
                    names.append(name)
            except OSError:                    # removed while listed
                pass
    table = _proc_table() if names else None
    dirs = [os.path.join(runs_dir, name) for name in names[max(0, len(names) - count):]]
    fields = _slurm_rows_prefetch(dirs)
    rows = [_status(full, table, fields) for full in dirs]
    _out({"runs": rows, "total": len(names)})


def cmd_kill(run_dir, grace):
    """TERM the job's whole process group, KILL what is left after ``grace`` seconds; works when the
    runner itself is gone too (then this records the kill)."""
    run_dir = _run_dir_or_fail(run_dir)
    row = _status(run_dir)
    if row.get("slurm"):                       # scancel: Slurm signals the job's processes on its node
        _cancel(run_dir, row, grace)
        _out(_status(run_dir))
    elif row["state"] != "running":
        _out(row)
    else:
        _kill_group(run_dir, row, grace)


def _kill_group(run_dir, row, grace):
    """TERM, then KILL, the process group of a running job started here (not a Slurm job)."""
    pgid = _pid_in(row.get("pgid")) or _pid_in(row.get("pid")) or _read_pid(run_dir)

    def live():
        return _group_state(pgid, row.get("start_ticks"), row["id"]) is not None

    sent, first, gone = None, None, None
    for sig, wait in ((signal.SIGTERM, float(grace)), (signal.SIGKILL, 5.0)):
        if gone is not None or not live():
            break
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        sent, first = sig, first or time.monotonic()
        deadline = time.time() + wait
        while gone is None and time.time() < deadline:
            if live():
                time.sleep(0.05)
            else:
                gone = time.monotonic()
    status_path = os.path.join(run_dir, "status.json")
    final = _read_json(status_path) or {}
    if final.get("state") in LIVE_STATES:      # the runner was gone, or SIGKILLed before it could record
        final.update(state="killed", ended=_now(), signal=sent)
        _atomic_write(status_path, json.dumps(final).encode())
    row = _status(run_dir)
    if first is not None and gone is not None:   # how long its processes took to exit once told (theirs)
        row["exit_s"] = round(gone - first, 3)
    _out(row)
























