"""The host side of draftops' plumbing: a stdlib-only script copied to ``<root>/state/`` on first use.

It runs under any python3 on the host (no ml-env needed) and does the work that must happen next to
the files: resolve and check ``root``, list and apply code syncs atomically, start detached jobs and
record their state, follow logs, pack run folders. Every subcommand prints one JSON object (or a raw
stream for ``follow``/``pack``), so the local side parses nothing ad hoc.
"""
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time

SYNC_META = ".draftops-sync.json"
TMP_MARK = ".draftops-tmp-"
EVENT_PREFIX = "@@draftops "
_AGENT_PATH = None   # where this script is installed on the host (set by prepare or main)


def _out(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _fail(message, code=2):
    sys.stderr.write(message + "\n")
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
def _read_json(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _alive(pid, run_id):
    """True when ``pid`` is a live (non-zombie) process of this run; guards against pid reuse."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open("/proc/%d/stat" % pid) as fh:
            if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                return False
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            return run_id.encode() in fh.read()
    except OSError:
        ps = subprocess.run(["ps", "-o", "stat=,args=", "-p", str(pid)], capture_output=True, text=True)
        line = ps.stdout.strip()
        return bool(line) and not line.startswith("Z") and run_id in line


def _status(run_dir):
    run_id = os.path.basename(run_dir.rstrip("/"))
    run_dir = os.path.abspath(run_dir)
    job = _read_json(os.path.join(run_dir, "job.json")) or {}
    status = _read_json(os.path.join(run_dir, "status.json")) or {}
    row = {"id": run_id, "name": job.get("name"), "command": job.get("command"),
           "created": job.get("created"), **status}
    if status.get("state") in (None, "starting", "running"):
        pid = status.get("pid")
        if pid and _alive(int(pid), run_id):
            row["state"] = "running"
        elif not pid and time.time() - os.path.getmtime(run_dir) < 30:
            row["state"] = "starting"
        else:
            row["state"] = "dead"
    return row


def cmd_start(run_dir):
    """Create ``run_dir`` from the job spec on stdin, start its runner in its own session with stdio
    detached, and print the runner's pid. job.json may hold secrets (env): it is 0600."""
    run_dir = os.path.abspath(run_dir)
    run_id = os.path.basename(run_dir.rstrip("/"))
    spec = json.loads(sys.stdin.read())
    os.makedirs(run_dir, mode=0o700)
    _atomic_write(os.path.join(run_dir, "job.json"), json.dumps(spec).encode(), 0o600)
    _atomic_write(os.path.join(run_dir, "command"), (spec["command"] + "\n").encode())
    log = open(os.path.join(run_dir, "log"), "ab")
    proc = subprocess.Popen([sys.executable, _AGENT_PATH, os.getcwd(), "runner", run_dir, run_id],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, close_fds=True)
    _out({"pid": proc.pid})


def cmd_runner(run_dir, run_id):
    """Run the job, then record its exit code; survives the SSH link (own session, no tty)."""
    run_dir = os.path.abspath(run_dir)
    job = _read_json(os.path.join(run_dir, "job.json"))
    status_path = os.path.join(run_dir, "status.json")
    started = _now()
    base = {"pid": os.getpid(), "started": started}
    _atomic_write(os.path.join(run_dir, "pid"), ("%d\n" % os.getpid()).encode())
    _atomic_write(status_path, json.dumps(dict(base, state="running")).encode())
    env = dict(os.environ, **job.get("env", {}), DRAFTOPS_RUN_ID=run_id, DRAFTOPS_RUN_DIR=run_dir,
               PYTHONUNBUFFERED="1")
    cwd = os.path.abspath(job.get("cwd") or run_dir)     # relative cwd: relative to root
    child = subprocess.Popen(["sh", "-c", job["command"]], cwd=cwd, env=env,
                             stdin=subprocess.DEVNULL)
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
    code = child.wait()
    state = "killed" if got else ("succeeded" if code == 0 else "failed")
    final = dict(base, state=state, exit_code=code, ended=_now())
    if got:
        final["signal"] = got["signal"]
    sys.stdout.flush()
    _atomic_write(status_path, json.dumps(final).encode())


def cmd_status(run_dir):
    if not os.path.isdir(run_dir):
        _fail("no run folder %s" % run_dir, 7)
    _out(_status(run_dir))


def cmd_runs(runs_dir):
    rows = []
    if os.path.isdir(runs_dir):
        for name in sorted(os.listdir(runs_dir)):
            full = os.path.join(runs_dir, name)
            if os.path.isdir(full):
                rows.append(_status(full))
    _out({"runs": rows})


def cmd_kill(run_dir, grace):
    row = _status(run_dir)
    if row["state"] != "running":
        _out(row)
        return
    pgid = int(row["pid"])
    os.killpg(pgid, signal.SIGTERM)
    deadline = time.time() + float(grace)
    while time.time() < deadline and _alive(pgid, row["id"]):
        time.sleep(0.1)
    if _alive(pgid, row["id"]):
        os.killpg(pgid, signal.SIGKILL)
        time.sleep(0.2)
    row = _status(run_dir)
    if row["state"] == "dead":      # runner was SIGKILLed before it could write its status
        final = dict(_read_json(os.path.join(run_dir, "status.json")) or {}, state="killed", ended=_now())
        _atomic_write(os.path.join(run_dir, "status.json"), json.dumps(final).encode())
        row = _status(run_dir)
    _out(row)


def cmd_follow(run_dir, offset):
    """Copy the log from ``offset`` to stdout as it grows; end with a job-end event."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    path = os.path.join(run_dir, "log")
    pos = int(offset)
    out = sys.stdout.buffer
    while True:
        row = _status(run_dir)
        try:
            with open(path, "rb") as fh:
                fh.seek(pos)
                chunk = fh.read()
        except OSError:
            chunk = b""
        if chunk:
            out.write(chunk)
            out.flush()
            pos += len(chunk)
        if row["state"] not in ("running", "starting") and not chunk:
            out.write((EVENT_PREFIX + json.dumps(dict(row, event="job-end", offset=pos)) + "\n").encode())
            out.flush()
            return
        if not chunk:
            time.sleep(0.2)


def cmd_pack(path):
    """Write a tar of ``path`` (a run folder) to stdout, for `invoke pull`."""
    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|gz") as tar:
        tar.add(path, arcname=".")


COMMANDS = {"prepare": cmd_prepare, "manifest": cmd_manifest, "apply": cmd_apply, "start": cmd_start,
            "runner": cmd_runner, "status": cmd_status, "runs": cmd_runs, "kill": cmd_kill,
            "follow": cmd_follow, "pack": cmd_pack}

def main(argv):
    """``agent.py ROOT COMMAND ARGS...``: paths in ARGS are relative to ROOT."""
    global _AGENT_PATH
    if _AGENT_PATH is None:
        _AGENT_PATH = os.path.abspath(__file__)
    os.chdir(argv[0])
    COMMANDS[argv[1]](*argv[2:])


if __name__ == "__main__":
    main(sys.argv[1:])
