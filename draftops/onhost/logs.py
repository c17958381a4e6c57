"""A run's output on the host: tail and follow its log in bounded blocks (events and lines), and
pack its run folder, never following links, for a pull. And the one bounded read of any host file
(whole, head, tail, size) the local side does instead of a shell's cat, head, tail or wc.

One part of the host agent: draftops/onhost/__init__.py assembles the parts, in order, into the one
stdlib-only script the host runs (docs/protocol.md)."""
import io
import json
import os
import signal
import stat
import sys
import time

from draftops.onhost.runs import BLOCK, ENV_FILE, FOLLOW_POLL_S, _exit_fd, _pause_or_exit, _run_dir_or_fail, _status  # noqa: F401
from draftops.onhost.slurm import SLURM_POLL_S, _pending_too_long  # noqa: F401
from draftops.onhost.wire import (  # noqa: F401
    _CLOEXEC,
    EVENT_PREFIX,
    HOST_ONLY,
    MAX_LINE,
    PULL_NOTES,
    TMP_MARK,
    Exit,
    _fail,
    _open_regular,
    _raw_start,
)


def _tail_offset(path, lines):
    """Where the last ``lines`` text lines of the log start (event lines not counted), reading
    backwards in blocks and never more than ``lines`` × MAX_LINE bytes: memory and time stay bounded
    whatever the size of the log."""
    fd = _open_regular(path)
    if fd is None:
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
    """Up to ``size`` bytes of ``path`` from ``pos`` (nothing when it cannot be read, or is no regular file)."""
    fd = _open_regular(path)
    if fd is None:
        return b""
    try:
        return os.pread(fd, size, pos)
    except OSError:
        return b""
    finally:
        os.close(fd)


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
    fd = _open_regular(path)
    size = 0
    if fd is not None:
        size = os.fstat(fd).st_size
        os.close(fd)
    start = 0 if lines == "all" else _tail_offset(path, int(lines))
    _raw_start({"offset": start, "size": size})
    _copy_range(path, start, size, sys.stdout.buffer)


def _bounded(wait):
    if wait not in ("bounded", "unbounded"):
        _fail(f"follow: wait must be 'bounded' or 'unbounded', not {wait!r}", Exit.USAGE)
    return wait == "bounded"


def cmd_follow(run_dir, start, wait="bounded"):
    """Copy the log to stdout as it grows, from byte ``start`` (or "-N": the last N lines), in blocks;
    end with a job-end event on a line of its own. ``wait``: "bounded" (a task following the job it
    started) stops at a Slurm job's pending bound; "unbounded" (`invoke logs --follow`) waits it out."""
    bounded = _bounded(wait)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    run_dir = _run_dir_or_fail(run_dir)
    path = os.path.join(run_dir, "log")
    pos = _tail_offset(path, int(start[1:])) if start.startswith("-") else int(start)
    _raw_start({"offset": pos})
    out = sys.stdout.buffer
    last = b"\n"
    pause = FOLLOW_POLL_S[0]
    runner, woken = None, False  # the runner's exit descriptor: its end is seen at once, not a pause later
    try:
        while True:
            chunk = _read_at(path, pos)
            if chunk:
                out.write(chunk)
                out.flush()
                pos += len(chunk)
                last = chunk[-1:]
                pause = FOLLOW_POLL_S[0]
                continue
            row = _status(run_dir)
            if row["state"] not in ("running", "starting") or (bounded and _pending_too_long(run_dir, row)):
                break
            if row.get("slurm"):                 # the runner's pid is a compute node's; ask Slurm calmly
                pause = max(pause, SLURM_POLL_S)
            elif runner is None and not woken and row.get("pid") and not row.get("orphaned"):
                runner = _exit_fd(row["pid"])
            # quick jobs (a config rewrite) end within the first few looks
            if _pause_or_exit(runner, pause) and runner is not None:
                os.close(runner)         # it exited: look again now; later waits (an orphaned group) sleep
                runner, woken = None, True
            pause = min(pause * 2, FOLLOW_POLL_S[1])
    finally:
        if runner is not None:
            os.close(runner)
    while chunk := _read_at(path, pos):      # what the job wrote before it ended
        out.write(chunk)
        pos += len(chunk)
        last = chunk[-1:]
    if last != b"\n":
        out.write(b"\n")
    # without the command: it can pass MAX_LINE (a bench plan), and a line that long reaches home in pieces
    end = {k: v for k, v in row.items() if k != "command"}
    out.write((EVENT_PREFIX + json.dumps(dict(end, event="job-end", offset=pos)) + "\n").encode())
    out.flush()


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
    import tarfile
    info = tarfile.TarInfo(rel)
    info.type, info.mode, info.mtime = kind, stat.S_IMODE(st.st_mode), int(st.st_mtime)
    return info


def _pack_dir(tar, dir_fd, rel, skipped):
    """Add the entries of the open folder ``dir_fd`` (named ``rel`` in the tar) without following any
    link: folders and files are opened relative to their parent's fd with O_NOFOLLOW. A sub-folder
    holding ``HOST_ONLY`` is added with that file only (it stays on the host by design, so no note)."""
    import tarfile
    try:
        names = sorted(os.listdir(dir_fd))
    except OSError as exc:
        skipped.append({"path": rel or ".", "reason": f"cannot list the folder: {exc.strerror}"})
        return
    if rel and HOST_ONLY in names:      # the folder stays on the host: its marker alone travels
        names = [HOST_ONLY]
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
                _pack_file(tar, dir_fd, name, path, skipped)
            elif stat.S_ISLNK(st.st_mode):
                _pack_link(tar, dir_fd, name, path, st, skipped)
            else:
                kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                        else "a device node")
                skipped.append({"path": path, "reason": f"{kind}, not a file"})
        except OSError as exc:
            skipped.append({"path": path, "reason": f"cannot read: {exc.strerror or exc}"})


def _pack_file(tar, dir_fd, name, path, skipped):
    """Add one regular file, opened without following a link; exactly the size it had when opened."""
    import tarfile
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            skipped.append({"path": path, "reason": "changed from a file to something else"})
            return
        info = _tarinfo(path, st, tarfile.REGTYPE)
        info.size = st.st_size
        body = _Exactly(fh, st.st_size)
        tar.addfile(info, body)
        if body.short:
            skipped.append({"path": path, "reason": "shrank while it was copied; padded with NULs"})


def _pack_link(tar, dir_fd, name, path, st, skipped):
    """Add one symbolic link as a link (never its target), unless it leads out of the run folder."""
    import tarfile
    target = os.readlink(name, dir_fd=dir_fd)
    problem = _link_problem(path, target)
    if problem:
        skipped.append({"path": path, "reason": problem})
        return
    info = _tarinfo(path, st, tarfile.SYMTYPE)
    info.linkname, info.mode = target, 0o777
    tar.addfile(info)


def cmd_pack(run_dir):
    """A tar.gz of the run folder on stdout (framed), for `invoke pull`: files, folders and links that
    stay inside; everything else is left out and listed in a notes member at the end."""
    import tarfile
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    run_dir = _run_dir_or_fail(run_dir)
    try:
        top = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        _fail(f"cannot open run folder {run_dir} without following links: {exc.strerror}", Exit.UNSAFE_RUN)
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


READ_HOWS = ("whole", "head", "tail", "size")
MAX_READ = 64 << 20                   # the most a read may ask for: its reply is held in memory here


def _open_file(path):
    """A descriptor of ``path``, a regular file (a link is followed to a file, never into a FIFO, a
    device or a folder: an open would wait forever, a read never end); else exit NO_FILE, saying why."""
    try:
        st = os.stat(path)
        kind = None if stat.S_ISREG(st.st_mode) else ("a folder" if stat.S_ISDIR(st.st_mode) else
                                                       "a FIFO" if stat.S_ISFIFO(st.st_mode) else
                                                       "a socket" if stat.S_ISSOCK(st.st_mode) else "a device")
        if kind is None:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _CLOEXEC)
            if stat.S_ISREG(os.fstat(fd).st_mode):
                return fd
            os.close(fd)
            kind = "no longer a regular file"
    except OSError as exc:
        _fail(f"{path} cannot be read: {exc.strerror or exc}", Exit.NO_FILE)
    _fail(f"{path} is {kind}, not a regular file; draftops reads only files", Exit.NO_FILE)


def _read_upto(fd, pos, limit):
    """Up to ``limit`` bytes of ``fd`` from ``pos`` (fewer at its end), in blocks."""
    parts, left = [], limit
    while left > 0:
        chunk = os.pread(fd, min(BLOCK, left), pos)
        if not chunk:
            break
        parts.append(chunk)
        pos += len(chunk)
        left -= len(chunk)
    return b"".join(parts)


def _last_lines(data, lines, cut):
    """Where the last ``lines`` lines of ``data`` start (a final newline ends a line, it starts none);
    ``cut``: ``data`` begins mid-file, so its first, partial line is never shown."""
    end = len(data) - 1 if data.endswith(b"\n") else len(data)
    for _ in range(lines):
        end = data.rfind(b"\n", 0, end)
        if end < 0:
            return data.find(b"\n") + 1 if cut else 0
    return end + 1


def _read_part(fd, path, how, cap, lines):
    """(offset, bytes) of the part asked for; a whole read of a file over ``cap`` bytes exits TOO_BIG."""
    size = os.fstat(fd).st_size
    if how == "size":
        return size, b""
    if how == "whole":
        data = _read_upto(fd, 0, cap + 1)
        if len(data) > cap:
            _fail(f"{path} is {max(size, len(data))} bytes, more than the {cap} this read takes", Exit.TOO_BIG)
        return 0, data
    if how == "head":
        return 0, _read_upto(fd, 0, cap)
    start = max(0, size - cap)
    data = _read_upto(fd, start, size - start)
    at = _last_lines(data, lines, start > 0) if lines > 0 else len(data)
    return start + at, data[at:]


def cmd_read(path, how, cap, lines="0"):
    """A bounded read of one host file as a framed stream: header ``{"size", "offset", "length",
    "executable"}``, then ``length`` bytes: the whole file (at most ``cap`` bytes, else TOO_BIG), its
    first ``cap`` bytes, its last ``lines`` lines within its last ``cap`` bytes, or nothing (size)."""
    if how not in READ_HOWS or not cap.isdigit() or not 0 < int(cap) <= MAX_READ or not lines.isdigit():
        _fail(f"usage: read PATH {'|'.join(READ_HOWS)} CAP (1..{MAX_READ}) [LINES]; got {how!r} {cap!r} "
              f"{lines!r}", Exit.USAGE)
    path = os.path.expanduser(path)
    fd = _open_file(path)
    try:
        size = os.fstat(fd).st_size
        offset, data = _read_part(fd, path, how, int(cap), int(lines))
    except OSError as exc:
        _fail(f"{path} cannot be read: {exc.strerror or exc}", Exit.NO_FILE)
    finally:
        os.close(fd)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    _raw_start({"size": size, "offset": offset, "length": len(data), "executable": os.access(path, os.X_OK)})
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
