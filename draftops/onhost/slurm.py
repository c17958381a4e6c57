"""Jobs on a Slurm host: submit a run's runner as a batch job (``sbatch``), read its state from the
controller (``scontrol``), cancel it (``scancel``). The agent runs on the login node; the runner runs
inside the job on a compute node, on the same shared filesystem, and writes status.json and the log
exactly as a detached runner does, so follow, tail and pack do not change.

What Slurm knows comes first while it knows it (PENDING with its reason, RUNNING on which node, and
the end states a runner cannot see: TIMEOUT, CANCELLED, OUT_OF_MEMORY, NODE_FAIL, PREEMPTED); the end
state is kept in the run folder (slurm.json), because Slurm forgets a finished job after MinJobAge.
There is no accounting database to ask (sacct) on many clusters, so nothing here needs one.

One part of the host agent: draftops/onhost/__init__.py assembles the parts, in order, into the one
stdlib-only script the host runs (docs/protocol.md)."""
import json
import os
import re
import shlex
import sys
import time

from draftops.onhost.wire import _AGENT_PATH, Exit, _atomic_write, _fail, _now, _out, _read_json  # noqa: F401

SLURM_FILE = "slurm.json"            # in a Slurm run's folder: the job id, when it was queued, its end
UNSUBMITTED = "unsubmitted"          # in a run folder whose submission draftops gave up on: never run it
JOB_SCRIPT = "slurm-job.sh"
SLURM_CALL_S = 60.0                  # every sbatch / scontrol / scancel call is bounded
SLURM_POLL_S = 2.0                   # follow asks the controller at most this often
LIVE_SLURM = ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "RUNNING",
              "COMPLETING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "STOPPED", "RESV_DEL_HOLD", "SPECIAL_EXIT")
#: each state in words, as `invoke runs` shows it; and the draftops state it ends a run in
WORDS = {
    "PENDING": "waiting in Slurm's queue",
    "CONFIGURING": "its node is being set up",
    "RUNNING": "running",
    "COMPLETING": "ending (Slurm is cleaning up)",
    "SUSPENDED": "suspended by Slurm",
    "COMPLETED": "completed",
    "FAILED": "failed",
    "CANCELLED": "cancelled (scancel)",
    "TIMEOUT": "stopped by Slurm at its time limit",
    "OUT_OF_MEMORY": "killed by Slurm for using more memory than it asked for",
    "NODE_FAIL": "lost: its node failed",
    "PREEMPTED": "preempted by a job of higher priority",
    "BOOT_FAIL": "its node failed to boot",
    "DEADLINE": "stopped at its deadline",
}
END_STATE = {"COMPLETED": None, "FAILED": None, "CANCELLED": "killed", "PREEMPTED": "killed",
             "TIMEOUT": "failed", "OUT_OF_MEMORY": "failed", "NODE_FAIL": "failed", "BOOT_FAIL": "failed",
             "DEADLINE": "failed"}
_UNREACHABLE = ("Unable to contact slurm controller", "Socket timed out", "Zero Bytes were transmitted",
                "Connection refused", "Transport endpoint")
_FIELD = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9/:_]*)=(.*?)(?=\s[A-Za-z][A-Za-z0-9/:_]*=|\s*$)")
_CACHE = {}  # type: dict  # job id -> (monotonic time, fields) within one agent call


class SlurmDown(Exception):
    """The controller did not answer (or the client command is missing): say so, change nothing."""


def _slurm_call(argv, timeout=SLURM_CALL_S):
    """Run a Slurm client command (argv, no shell: every value is one argument); (rc, stdout, stderr)."""
    import subprocess
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SlurmDown(f"`{argv[0]}` is not installed on this host (is it the cluster's login node?)") from None
    except subprocess.TimeoutExpired:
        raise SlurmDown(f"`{argv[0]}` did not answer within {timeout:.0f} s") from None
    return done.returncode, done.stdout, done.stderr.strip()


def _one_line(text):
    """Slurm's message on one line, without control characters (it is quoted in run rows and errors)."""
    return re.sub(r"[\x00-\x1f\x7f]+", " ", text).strip()[:500]


def _parse_job(line):
    return {m.group(1): m.group(2) for m in _FIELD.finditer(line)}


def _query(job_ids):
    """{job id: scontrol's fields} for the jobs Slurm still knows (a forgotten one is left out);
    SlurmDown when the controller does not answer."""
    now = time.monotonic()
    wanted = [j for j in job_ids if not (j in _CACHE and now - _CACHE[j][0] < 1.0)]
    argv = ["scontrol", "show", "job", "-o"] + ([wanted[0]] if len(wanted) == 1 else [])
    if wanted:
        rc, out, err = _slurm_call(argv)
        if rc != 0 and "Invalid job id" not in err and "No jobs" not in err:
            raise SlurmDown(_one_line(err or out) or f"scontrol exited {rc}")
        for line in out.splitlines():
            fields = _parse_job(line)
            if fields.get("JobId"):
                _CACHE[fields["JobId"]] = (now, fields)
        for job_id in wanted:
            if job_id not in _CACHE or _CACHE[job_id][0] != now:
                _CACHE[job_id] = (now, None)
    return {j: _CACHE[j][1] for j in job_ids if _CACHE.get(j, (0, None))[1] is not None}


def _slurm_spec(run_dir):
    job = _read_json(os.path.join(run_dir, "job.json")) or {}
    spec = job.get("slurm")
    return spec if isinstance(spec, dict) else None


def _exit_of(fields):
    """Slurm's ExitCode=CODE:SIGNAL as one number (128 + signal when a signal ended it)."""
    code, _, sig = fields.get("ExitCode", "").partition(":")
    if sig.isdigit() and int(sig):
        return 128 + int(sig)
    return int(code) if code.isdigit() else None


def _stamp_s(text):
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def _facts(fields, known):
    """What a run row says of its job: state, its words, reason, node, queue wait, exit code."""
    state = fields.get("JobState", "UNKNOWN").split("+")[0]
    facts = dict(known)
    facts.update(state=state, words=WORDS.get(state, state.lower().replace("_", " ")))
    reason = fields.get("Reason", "")
    if reason and reason not in ("None", "(null)"):
        facts["reason"] = _one_line(reason)
    node = fields.get("BatchHost") or fields.get("NodeList") or ""
    if node and node != "(null)":
        facts["node"] = _one_line(node)
    if fields.get("TimeLimit"):
        facts["time_limit"] = fields["TimeLimit"]
    submit, start = _stamp_s(fields.get("SubmitTime", "")), _stamp_s(fields.get("StartTime", ""))
    if state != "PENDING" and submit is not None and start is not None:
        facts["queued_s"] = max(0.0, start - submit)
        end = _stamp_s(fields.get("EndTime", ""))
        if state not in LIVE_SLURM and end is not None:
            facts["ran_s"] = max(0.0, end - start)
    if state == "PENDING" and isinstance(known.get("submitted"), (int, float)):
        facts["pending_s"] = round(max(0.0, time.time() - known["submitted"]), 1)
    if state not in LIVE_SLURM:
        facts["exit_code"] = _exit_of(fields)
    return facts


def _slurm_row(run_dir, row, status, fields_of=None):
    """``row`` (job.json + status.json) with what Slurm says of the run's job; the job's end state is
    kept in slurm.json once seen. ``fields_of``: the answer of one scontrol call for many runs."""
    path = os.path.join(run_dir, SLURM_FILE)
    known = _read_json(path) or {}
    recorded = status.get("state")
    if not known.get("job_id"):                  # not queued (yet, or sbatch refused it: status.json says)
        if recorded in (None, "starting"):
            row["state"] = "starting"
        return row
    facts = known.get("final") or _ask(path, known, row, recorded, fields_of)
    if facts is not None:
        row["slurm"] = facts
        _merge(row, facts, recorded, known["job_id"])
    return row


def _ask(path, known, row, recorded, fields_of):
    """Slurm's facts of a job whose end is not recorded yet (kept in slurm.json once it ended); None
    when Slurm cannot say, with ``row`` saying why."""
    job_id = known["job_id"]
    try:
        fields = (fields_of if fields_of is not None else _query([job_id])).get(job_id)
    except SlurmDown as exc:
        row["slurm"] = dict(known, state="UNKNOWN", words="unknown: Slurm's controller did not answer")
        row["note"] = f"Slurm's controller did not answer ({exc}); the state is what the run folder last recorded"
        if recorded is None:
            row["state"] = "starting"
        return None
    if fields is None:                           # Slurm forgot it (MinJobAge) before anyone saw its end
        row["slurm"] = dict(known, state="GONE", words="no longer known to Slurm")
        if recorded in (None, "starting", "running"):
            row.update(state="dead", note=f"Slurm no longer knows job {job_id} and its runner recorded no end "
                                          "(killed at its time limit, or its node failed, over MinJobAge ago)")
        return None
    facts = _facts(fields, known)
    if facts["state"] not in LIVE_SLURM:
        _atomic_write(path, json.dumps(dict(known, final=facts)).encode())
    return facts


def _merge(row, facts, recorded, job_id):
    """The run's state from Slurm's: queued and running as Slurm says; an end the runner could not
    see (TIMEOUT, CANCELLED, OUT_OF_MEMORY, NODE_FAIL, PREEMPTED) over what the runner recorded."""
    state = facts["state"]
    if state in LIVE_SLURM:
        if recorded not in (None, "starting", "running"):
            return                                # the runner recorded its end; Slurm is cleaning up
        row["state"] = "starting" if state in ("PENDING", "CONFIGURING") or recorded is None else "running"
        if state == "PENDING":
            row["note"] = f"waiting in Slurm's queue (reason: {facts.get('reason', 'none given')})"
        return
    ended = END_STATE.get(state, "failed")
    if ended is not None or recorded in (None, "starting", "running"):
        row["state"] = ended or ("succeeded" if facts.get("exit_code") == 0 else "failed")
        if ended == "killed" and recorded in (None, "starting"):
            # cancelled (or preempted) while queued: no process of its ever exited, so Slurm's "0:0" is
            # no exit status of the run's; it reads "never ran", not "killed (exit 0)"
            row["note"] = f"Slurm job {job_id}: {state} while it waited in Slurm's queue; it never ran"
            return
        row["note"] = f"Slurm job {job_id}: {state}, {facts['words']}"
        if row.get("exit_code") is None:
            row["exit_code"] = facts.get("exit_code")


def _slurm_rows_prefetch(run_dirs):
    """One scontrol call for every Slurm run of a listing that has no end recorded yet."""
    ids = []
    for run_dir in run_dirs:
        known = _read_json(os.path.join(run_dir, SLURM_FILE)) or {}
        if known.get("job_id") and known.get("final") is None:
            ids.append(known["job_id"])
    if not ids:
        return None
    try:
        return _query(sorted(set(ids)))
    except SlurmDown:
        return None


def _submit(run_dir, run_id, spec):
    """Queue the run's runner as a batch job; print ``{"pid": null, "job_id"}``. The run id is the job's
    name, so a submission whose answer was lost is found again (never queued twice)."""
    found = _find_by_name(run_id)
    if found:
        return _submitted(run_dir, found, "found queued under its name")
    agent = _AGENT_PATH or os.path.abspath(__file__)
    script = os.path.join(run_dir, JOB_SCRIPT)
    runner = " ".join(shlex.quote(a) for a in (sys.executable, "-S", agent, os.getcwd(), "runner", run_dir, run_id))
    _atomic_write(script, f"#!/bin/sh\n# draftops run {run_id}: its runner, inside the Slurm job\nexec {runner}\n"
                  .encode(), 0o700)
    args = [str(a) for a in spec.get("args") or []]
    bad = [a for a in args if not a.startswith("--") or re.search(r"[\x00-\x1f\x7f]", a)]
    if bad:
        _fail(f"sbatch options {bad!r} are not '--name=value' items without control characters; nothing was "
              "submitted", Exit.SCHEDULER)
    argv = ["sbatch", "--parsable", f"--job-name={run_id}", f"--output={run_dir}/log", "--open-mode=append",
            f"--chdir={os.getcwd()}", *args, script]
    _atomic_write(os.path.join(run_dir, "sbatch"), (" ".join(shlex.quote(a) for a in argv) + "\n").encode())
    try:
        rc, out, err = _slurm_call(argv)
    except SlurmDown as exc:
        rc, out, err = -1, "", str(exc)
    job_id = out.strip().split(";")[0]
    if rc == 0 and job_id.isdigit():
        return _submitted(run_dir, job_id, "submitted")
    found = _find_by_name(run_id)                # a lost answer: the job may be queued after all
    if found:
        return _submitted(run_dir, found, "found queued under its name after sbatch failed")
    _give_up(run_dir, _one_line(err or out) or f"sbatch exited {rc}")


def _find_by_name(run_id):
    """The id of a job of this user named ``run_id`` that Slurm knows, else None (also when it cannot tell)."""
    try:
        rc, out, _ = _slurm_call(["squeue", "-h", "--me", f"--name={run_id}", "-o", "%i"], timeout=20)
    except SlurmDown:
        return None
    ids = [line.strip() for line in out.splitlines() if line.strip().isdigit()]
    return ids[0] if rc == 0 and ids else None


def _submitted(run_dir, job_id, how):
    _atomic_write(os.path.join(run_dir, SLURM_FILE),
                  json.dumps({"job_id": job_id, "submitted": time.time(), "how": how}).encode())
    _out({"pid": None, "job_id": job_id})


def _give_up(run_dir, why):
    """The submission failed: mark the run so that a job queued despite the error never runs it
    (its runner sees the mark and exits), record it as failed, and exit SCHEDULER with Slurm's words."""
    _atomic_write(os.path.join(run_dir, UNSUBMITTED), (why + "\n").encode())
    _atomic_write(os.path.join(run_dir, "status.json"), json.dumps(
        {"state": "failed", "ended": _now(), "outcome": {"error": "not submitted: " + why[:280]},
         "note": "sbatch did not queue it: " + why[:300]}).encode())
    _fail(f"sbatch did not queue the job: {why}", Exit.SCHEDULER)


def _cancel(run_dir, row, grace):
    """``scancel`` the run's job and wait (bounded: ``grace`` and a minute for Slurm's own KillWait)
    until Slurm says it ended."""
    known = _read_json(os.path.join(run_dir, SLURM_FILE)) or {}
    job_id = known.get("job_id")
    if not job_id or row.get("state") not in ("starting", "running"):
        return row
    try:
        rc, out, err = _slurm_call(["scancel", str(job_id)])
    except SlurmDown as exc:
        _fail(f"scancel of Slurm job {job_id} failed: {exc}; the job was not cancelled", Exit.SCHEDULER)
    if rc != 0:
        _fail(f"scancel of Slurm job {job_id} failed: {_one_line(err or out)}", Exit.SCHEDULER)
    deadline = time.monotonic() + float(grace) + 60.0     # Slurm's own KillWait comes on top of ours
    while time.monotonic() < deadline:
        _CACHE.clear()
        try:
            fields = _query([job_id]).get(job_id)
        except SlurmDown:
            break
        if fields is None or fields.get("JobState", "").split("+")[0] not in LIVE_SLURM:
            break
        time.sleep(0.5)
    _CACHE.clear()


def _pending_too_long(run_dir, row):
    """Whether a follow should stop waiting for a job still queued past its ``max_pending`` bound; then
    ``row`` says so: the facts only, as what follows (the job stays queued, or a doctor cancels it) is the
    caller's to say."""
    facts = row.get("slurm") or {}
    bound = (_slurm_spec(run_dir) or {}).get("max_pending")
    waited = facts.get("pending_s")
    if facts.get("state") != "PENDING" or not isinstance(bound, (int, float)) or not isinstance(waited, float):
        return False
    if waited < bound:
        return False
    row.update(pending_bound=bound, note=(
        f"still waiting in Slurm's queue after {waited:.0f} s, past its bound of {bound:.0f} s (max_pending); "
        f"Slurm's reason: {facts.get('reason', 'none given')}"))
    return True


def _runner_may_run(run_dir):
    """False (and why, on the log) for a job whose submission draftops gave up on: it was queued even
    though sbatch said it failed, and the run is recorded as failed; running it too would run it twice."""
    if os.path.exists(os.path.join(run_dir, UNSUBMITTED)):
        print("draftops: this run's submission was given up on (see its status); the job Slurm started "
              "anyway does not run it", flush=True)
        return False
    return True
