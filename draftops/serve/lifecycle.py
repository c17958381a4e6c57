"""A server's life on a host: make room on its port, start it as a detached job, wait until it
answers, read back what it really runs with, and list, stop and tail it.

The server is an ordinary draftops job (``<root>/runs/<id>/``, its own session, so it survives the
SSH link that started it); ``<root>/state/servers/<port>.json`` records which run serves which
port and what was asked. Liveness always comes from the run, so a crashed server reads as dead.
"""
from __future__ import annotations

import calendar
import os
import secrets
import shlex
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from draftops.errors import HostFileError, JobError, ServeError, ServeRefused
from draftops.link.host import Host
from draftops.runs import jobs
from draftops.serve import hosttool
from draftops.serve.checks import OVERRIDE_WARNING
from draftops.serve.request import Plan
from draftops.terminal import clean

ALIVE = ("running", "starting")
#: the state of a port claim whose `invoke serve` call is gone (killed before it registered its run)
STALE = "stale claim"
TAIL_LINES = 50
POLL_WINDOW_S = 3.0   # how long one readiness call keeps asking on the host (a dead run is seen this late)
#: how long a port claim without a run counts as "being started" (then it is a leftover)
CLAIM_S = 120.0
#: a 1-token completion on a cold CPU server can take a while
PROBE_TIMEOUT_S = 120.0
#: how long one read-back request (server info, metrics) may take in all, its body included
READBACK_TIMEOUT_S = 10.0
READBACK_HEAD = 500_000      # the read-back looks for the engine's own lines in this much of the log's start


@dataclass
class Server:
    """A registered server joined with the state of the run that owns its processes."""

    port: int
    run_id: str
    engine: str
    profile: str
    target: str
    draft: str | None
    listen: str
    state: str
    pid: int | None
    started: str | None
    uptime_s: float | None
    asked: dict[str, Any] = field(default_factory=dict)
    effective: dict[str, Any] | None = None
    entry: dict[str, Any] = field(default_factory=dict)   # the registry entry as written

    note: str | None = None                                # why the run is as it is (a Slurm job's end)

    @property
    def alive(self) -> bool:
        return self.state in ALIVE

    @property
    def reach(self) -> str:
        """Where the host reaches the server: on a Slurm host, the compute node its job landed on
        (recorded in the registry) when it listens on every address; else its listen address."""
        node = self.entry.get("node")
        return str(node) if node and self.listen in ("0.0.0.0", "::", "") else self.listen

    @property
    def shown_state(self) -> str:
        """What a listing says: alive, dead, or a stale claim (never alive for a claim whose caller is gone)."""
        return "alive" if self.alive else STALE if self.state == STALE else "dead"


def machine_id() -> str:
    """Which machine (and boot) a process id belongs to: a pid and its start time mean something only
    there, so a claim made from another laptop is judged by its age instead."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot = fh.read().strip()
    except OSError:
        boot = "no-boot-id"
    return f"{socket.gethostname()}/{boot}"


def process_start(pid: int) -> str | None:
    """The start time of ``pid`` in clock ticks since boot (/proc), None where it cannot be read:
    with the pid it names one process, so a recycled pid does not keep a claim alive."""
    try:
        with open(f"/proc/{int(pid)}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return None if fields[0] == "Z" else fields[19]
    except (OSError, IndexError, ValueError):
        return None


def claimer() -> dict[str, Any]:
    """Who claims a port: this `invoke serve` process, as :func:`claimer_alive` checks it later."""
    return {"machine": machine_id(), "pid": os.getpid(), "started": process_start(os.getpid())}


def claimer_alive(owner: Any) -> bool | None:
    """Whether the process that claimed a port still runs; None when this machine cannot tell (the
    claim came from another machine, or names no process)."""
    if not isinstance(owner, dict) or owner.get("machine") != machine_id():
        return None
    pid = owner.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    if owner.get("started") is None:            # no /proc where it was made: the pid alone
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except (PermissionError, OverflowError):
            return True
        return True
    return process_start(pid) == owner.get("started")


def claim_state(entry: dict[str, Any], now: float) -> str:
    """``starting`` while the `invoke serve` call that claimed the port (no run yet) can still start its
    server, else :data:`STALE`: its process is gone, or the claim is older than :data:`CLAIM_S`."""
    claimed = _epoch(entry.get("created"))
    if claimed is None or now - claimed >= CLAIM_S:
        return STALE
    return STALE if claimer_alive(entry.get("claimer")) is False else "starting"


def _epoch(stamp: str | None) -> float | None:
    try:
        return float(calendar.timegm(time.strptime(stamp or "", "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None


def servers(host: Host) -> list[Server]:
    """Every server registered on ``host``, alive or dead, by port."""
    return _joined(host, *hosttool.servers(host))


def _joined(host: Host, entries: list[dict[str, Any]], now: float) -> list[Server]:
    """Registry ``entries`` joined with the state of their runs (``now``: the host's clock)."""
    if not entries:
        return []
    wanted = sorted({e["run_id"] for e in entries if jobs.is_run_id(e.get("run_id"))})
    runs = {row["id"]: row for row in jobs.list_runs(host, wanted)}     # not the whole history
    out = []
    for entry in entries:
        if entry.get("run_id") is None:         # a claim: an `invoke serve` call starting its server
            run: dict[str, Any] = {"state": claim_state(entry, now)}
        else:
            run = runs.get(entry.get("run_id"), {"state": "dead"})
        started = run.get("started")
        begun = _epoch(started)
        alive = run.get("state") in ALIVE
        out.append(Server(
            port=int(entry["port"]), run_id=str(entry.get("run_id") or "—"), engine=str(entry.get("engine")),
            profile=str(entry.get("profile")), target=str(entry.get("target")), draft=entry.get("draft"),
            listen=str(entry.get("listen") or "127.0.0.1"), state=str(run.get("state")),
            pid=run.get("pid"), started=started,
            uptime_s=(now - begun) if begun is not None and alive else None,
            asked=entry.get("asked") or {}, effective=entry.get("effective"), entry=entry,
            note=run.get("note") if not alive and run.get("slurm") else None))
    return out


def find(host: Host, port: int | None) -> Server:
    """The server on ``port``, or the only one on the host."""
    rows = servers(host)
    if port is not None:
        for row in rows:
            if row.port == port:
                return row
        known = ", ".join(str(r.port) for r in rows) or "none"
        raise ServeError(f"Host {host.name!r} has no draftops server on port {port} (servers on ports: "
                         f"{known}); `invoke serve.status` lists them.")
    if len(rows) == 1:
        return rows[0]
    if not rows:
        raise ServeError(f"Host {host.name!r} has no draftops servers; start one with `invoke serve`.")
    raise ServeError(f"Host {host.name!r} has servers on ports {', '.join(str(r.port) for r in rows)}; "
                     "pick one with --port.")


def stop(host: Host, server: Server, grace: float = 10.0) -> dict[str, Any]:
    """TERM the server's process group, KILL it after ``grace``; forget the registry entry."""
    if not server.entry.get("run_id") and server.alive:
        raise ServeError(f"Host {host.name!r}: port {server.port} is being claimed by an `invoke serve` call "
                         "that has not started its server yet; stop it once `invoke serve.status` lists it.")
    final: dict[str, Any] = {"state": server.state}
    if server.alive:
        try:
            final = jobs.kill(host, server.run_id, grace)
        except JobError:
            final = {"state": "dead"}
    reaped: dict[str, Any] = {}
    if server.pid and host.spec.scheduler != "slurm":     # a Slurm job's pid is its node's: scancel did it
        reaped = hosttool.reap(host, int(server.pid), server.run_id, grace=min(grace, 5.0))
    hosttool.unregister(host, server.port, token=server.entry.get("token"))
    return {**final, "reaped": reaped}


@dataclass
class Room:
    """What making room for a server did: notes for the user, and how long a replaced server took
    to exit once told to (the engine's own shutdown; None when nothing was stopped)."""

    notes: list[str]
    replaced_exit_s: float | None = None


def make_room(host: Host, plan: Plan) -> Room:
    """Refuse a port in use; with --replace, stop the draftops server holding it first."""
    port, room = plan.launch.port, Room([])
    notes = room.notes
    entries, now, status = hosttool.servers_and_port(host, port, plan.launch.listen)
    mine = next((s for s in _joined(host, entries, now) if s.port == port), None)
    if mine is not None and mine.alive and not mine.entry.get("run_id"):
        raise ServeRefused(
            f"Port {port} on host {host.name!r} was claimed {mine.entry.get('created')} by another `invoke "
            "serve` call that is starting its server right now; wait for it (`invoke serve.status`), or "
            "choose another port (--port).")
    if mine is not None and mine.alive:
        what = f"the {mine.engine} server of run {mine.run_id} (draft {mine.draft or 'none, baseline'})"
        if not plan.request.replace:
            raise ServeRefused(
                f"Port {port} on host {host.name!r} is in use by {what}. Stop it first with `invoke "
                f"serve.stop --port {port}`, pass --replace to stop it and start the new server, or "
                "choose another port (--port, or `port:` in the serve profile).")
        stopped = stop(host, mine)
        exit_s = stopped.get("exit_s")
        room.replaced_exit_s = float(exit_s) if isinstance(exit_s, (int, float)) else None
        took = f"; it exited in {room.replaced_exit_s:.1f} s" if room.replaced_exit_s is not None else ""
        notes.append(f"stopped {what} on port {port} (--replace{took})")
    elif mine is not None:
        hosttool.unregister(host, port, token=mine.entry.get("token"))   # a dead server: nothing to stop
        notes.append(f"forgot the stale claim on port {port} (made {mine.entry.get('created')} by an `invoke "
                     "serve` call that is gone)" if mine.state == STALE
                     else f"forgot the dead server of run {mine.run_id} on port {port}")
    if notes:       # a server was stopped or forgotten: its port may take a moment to free
        status = hosttool.port(host, port, plan.launch.listen, wait_free=15.0)
    if status.get("in_use"):
        raise ServeRefused(
            f"Port {port} on host {host.name!r} is in use by a process draftops did not start "
            f"({status.get('detail')}); --replace only stops servers started by `invoke serve`. Choose "
            "another port (--port, or `port:` in the serve profile), or stop that process.")
    return room


def claim_entry(plan: Plan) -> dict[str, Any]:
    """The registry entry that claims the plan's port before its server starts (``run_id`` still None):
    who claims it (:func:`claimer`), what is asked, and a token only this call knows."""
    launch_ = plan.launch
    return {"token": secrets.token_hex(8), "run_id": None, "engine": plan.engine.name,
            "profile": plan.profile.name, "python": launch_.python, "target": launch_.target,
            "draft": launch_.draft, "listen": launch_.listen, "asked": plan.engine.asked(launch_),
            "effective": None, "claimer": claimer(), "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def launch(host: Host, plan: Plan, env: dict[str, str]) -> Server:
    """Start the server as a detached job and register it; returns at once."""
    engine, launch_ = plan.engine, plan.launch
    argv = engine.command(launch_)
    command = "exec " + " ".join([jobs.shell_path(argv[0])] + [shlex.quote(a) for a in argv[1:]])
    entry = claim_entry(plan)
    token, asked = entry["token"], entry["asked"]
    if not hosttool.register(host, launch_.port, entry, exclusive=True):
        raise ServeRefused(
            f"Port {launch_.port} on host {host.name!r} was claimed by another `invoke serve` call a moment "
            "ago; two servers cannot share it. Check `invoke serve.status`, or choose another port (--port).")
    try:
        job = jobs.start(host, f"serve-{engine.name}-{launch_.port}", command,
                         env={**env, **engine.environment(launch_)}, cwd="state", slurm=plan.profile.settings.slurm)
    except BaseException:
        hosttool.unregister(host, launch_.port, token=token)
        raise
    entry["run_id"] = job.id
    if not hosttool.register(host, launch_.port, entry, token=token):
        jobs.kill(host, job.id, 5.0)
        raise ServeError(f"Host {host.name!r}: the claim on port {launch_.port} was removed while the server "
                         f"was starting (by `invoke serve.stop`?); run {job.id} was stopped again.")
    # no status call: the start's reply has the pid, and wait_ready's first poll reads the state
    return Server(launch_.port, job.id, engine.name, plan.profile.name, launch_.target, launch_.draft,
                  launch_.listen, "starting", job.pid, None, 0.0, asked, None, entry)


def _log(host: Host, run_id: str) -> str:
    return f"{host.runs_dir}/{run_id}/log"


def log_tail(host: Host, run_id: str, lines: int = TAIL_LINES) -> str:
    """The server log's last ``lines`` lines, read by the agent ("" while there is no log)."""
    try:
        return host.agent.read(_log(host, run_id), "tail", lines=int(lines)).data.decode("utf-8", "replace")
    except HostFileError:
        return ""


def log_size(host: Host, run_id: str) -> int:
    """The server log's size in bytes (0 while there is no log): where ``serve.logs --follow`` starts."""
    try:
        return host.agent.read(_log(host, run_id), "size").size
    except HostFileError:
        return 0


def abandon(host: Host, server: Server, why: str) -> ServeError:
    """Stop every process of a server that did not come up; the error carries its log tail."""
    tail = log_tail(host, server.run_id)
    row = jobs.status(host, server.run_id)
    server.state, server.pid = row.get("state", "dead"), row.get("pid") or server.pid
    stop(host, server)
    return ServeError(
        f"The {server.engine} server on host {host.name!r} port {server.port} {why}; all its processes "
        f"are stopped. Its full log stays in {host.runs_dir}/{server.run_id}/log (`invoke logs "
        f"{server.run_id}`). Last {TAIL_LINES} log lines:\n{tail.rstrip()}")


Progress = Callable[[float, str, "int | None"], None]


def wait_ready(host: Host, plan: Plan, server: Server, progress: Progress) -> None:
    """Poll the engine's readiness probes on the host until all answer 200, the run dies, or the
    profile's ``ready_timeout`` passes (then everything is stopped and the log tail raised)."""
    timeout = plan.profile.settings.ready_timeout
    bound = jobs.pending_bound(host, "serve", plan.profile.settings.slurm)
    started = time.monotonic()
    probes = plan.engine.readiness(plan.launch)
    step = 0
    while True:
        elapsed = time.monotonic() - started
        row = jobs.status(host, server.run_id)
        _note_node(host, server, row)
        queued = row.get("slurm") or {}
        if bound is not None and queued.get("state") == "PENDING" and (queued.get("pending_s") or 0.0) >= bound:
            raise abandon(host, server, f"was still waiting in Slurm's queue after {queued['pending_s']:.0f} s, past "
                          f"its bound of {bound:.0f} s (--max-pending, else slurm max_pending in hosts.yaml; Slurm's "
                          f"reason: {queued.get('reason', 'none given')}); its job is cancelled, so that no server "
                          "starts later with nobody waiting for it")
        if row.get("state") not in ALIVE:
            code = row.get("exit_code")
            how = f"exit code {code}" if code is not None else f"its run is {row.get('state')}"
            if row.get("slurm"):
                how += f"; {row.get('note') or 'Slurm ended it'}"
            raise abandon(host, server, f"exited during start-up after {elapsed:.0f} s ({how})")
        if elapsed > timeout:
            raise abandon(host, server, f"was not ready after {timeout:.0f} s (ready_timeout of serve "
                          f"profile {plan.profile.name!r})")
        probe = probes[step]
        # the host asks again every 0.2 s for a window (one exec per window, not per try); the run's
        # state is checked between windows
        window = max(0.0, min(POLL_WINDOW_S, timeout - elapsed))
        status, _ = hosttool.http(host, server.port, probe.path, probe.body, server.reach,
                                  timeout=PROBE_TIMEOUT_S if probe.body is not None else 10.0, until_ok=window)
        progress(time.monotonic() - started, probe.what, status)
        if status == 200:
            step += 1
            if step == len(probes):
                return


def _note_node(host: Host, server: Server, row: dict[str, Any]) -> None:
    """Record in the registry the compute node a Slurm server's job landed on, once Slurm names it:
    bench, capture-check and serve.status reach the server there."""
    node = (row.get("slurm") or {}).get("node")
    if node and server.entry.get("node") != node and (row.get("slurm") or {}).get("state") != "PENDING":
        server.entry["node"] = node
        hosttool.register(host, server.port, server.entry, token=server.entry["token"])


@dataclass
class Readback:
    """Asked-for vs effective settings once the server is up."""

    rows: list[tuple[str, Any, Any, bool]]     # label, asked, effective, differs
    notes: list[str]
    effective: dict[str, Any]


def _same(asked: Any, effective: Any) -> bool:
    if isinstance(asked, str) and isinstance(effective, str):
        return asked.rstrip("/") == effective.rstrip("/")
    if isinstance(asked, (int, float)) and isinstance(effective, (int, float)):
        return abs(float(asked) - float(effective)) < 1e-9
    return bool(asked == effective)


def _unread_warning(plan: Plan, rows: list[tuple[str, Any, Any, bool]], effective: dict[str, Any]) -> str | None:
    """One paragraph when the read-back failed or left asked-for settings unknown: that read-back is
    what catches an engine silently running with other values, so its absence must be said."""
    missing = [label for label, asked, got, _ in rows if asked is not None and got is None]
    why = effective.get("_unread")
    if not why and not missing:
        return None
    cause = f" ({why})" if why else ""
    which = ", ".join(missing) if missing else "its settings"
    return (f"warning: could not read back what the {plan.engine.label} server runs with{cause}: {which} "
            "unknown. The server is up, but whether it silently runs with other values than asked for "
            "(an override) is not checked; see `invoke serve.logs`, and `invoke serve.status` once it answers.")


def read_back(host: Host, plan: Plan, server: Server) -> Readback:
    """Ask the server what it runs with, record it in the registry, and compare with the request."""
    try:
        head = host.agent.read(_log(host, server.run_id), "head", cap=READBACK_HEAD).data.decode("utf-8", "replace")
    except HostFileError:
        head = ""

    def fetch(path: str, body: Any) -> tuple[int | None, str]:
        return hosttool.http(host, server.port, path, body, server.reach, timeout=READBACK_TIMEOUT_S)

    effective = plan.engine.effective(fetch, head)
    rows, notes = [], []
    for key, label in plan.engine.settings:
        asked, got = server.asked.get(key), effective.get(key)
        differs = asked not in (None, "auto") and got is not None and not _same(asked, got)
        rows.append((label, asked, got, differs))
    unread = _unread_warning(plan, rows, effective)
    if unread:
        notes.append(unread)
    if OVERRIDE_WARNING in head:
        notes.append(f"{plan.engine.label} logged: {OVERRIDE_WARNING}")
    server.effective = effective
    hosttool.register(host, server.port, {**server.entry, "effective": effective}, token=server.entry["token"])
    return Readback(rows, notes, effective)


def ready_recorded(host: Host, plan: Plan, server: Server, entry: dict[str, Any], since: float,
                   record: Callable[[str, dict[str, Any], float | None], None]) -> tuple[Readback, float]:
    """Wait until a server that a step of a larger command (the doctor, the tune) started answers, as
    that command records it: ``record`` (its state, its effective settings, its seconds to ready) keeps
    its history row, failed or ready; ``entry``, the command's note of it, gets the job's start and
    state ``ready``. Returns the read-back and the seconds since ``since`` (time.monotonic)."""
    try:
        wait_ready(host, plan, server, lambda *_: None)
    except Exception:
        record("failed", {}, None)
        raise
    entry["started"] = jobs.status(host, server.run_id).get("started")
    readback = read_back(host, plan, server)
    ready_s = time.monotonic() - since
    record("ready", readback.effective, ready_s)
    entry["state"] = "ready"
    return readback, ready_s


def stop_recorded(host: Host, entry: dict[str, Any], *, not_ours: Callable[[Server | None], str | None],
                  kill_unregistered: bool, save: Callable[[], None], warn: Callable[[str], None]) -> None:
    """Stop a server a larger command started (``entry``: its run on its port), however far it came; one
    whose host records are not what the command noted (``not_ours`` says why, as the warning) is left
    alone; an unregistered one's run is killed when ``kill_unregistered``. The stop is tried and said,
    never a traceback; ``entry``'s state says how it ended."""
    try:
        server = next((s for s in servers(host) if s.run_id == entry["run_id"]), None)
        problem = not_ours(server)
        if problem is not None:
            warn(problem)
            entry["state"] = "not-ours"
            save()
            return
        if server is not None:
            stop(host, server)
        elif kill_unregistered:
            jobs.kill(host, str(entry["run_id"]), 10.0)
    except Exception as exc:        # noqa: BLE001  (the stop is tried and said, never a traceback)
        warn(f"could not stop the server of run {entry['run_id']}: {clean(str(exc))}")
        entry["state"] = "unknown"
        return
    entry["state"] = "stopped"
    save()
