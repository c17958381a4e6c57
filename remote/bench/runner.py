"""Execute a bench plan on the host: ``python -m remote.bench.runner --plan-json JSON``.

Runs as a draftops job (its run folder is ``$DRAFTOPS_RUN_DIR``; the plan's paths say ``@RUN_DIR@``
for it). Stdlib only: it starts the engine's own client with the engine's python, so it does not
need the engine itself. For every step (warm-up, then the measured repeats) it makes the plan's
HTTP calls before and after, keeps the server log lines written while the client ran (by byte
offset), and checks that the server is still alive; the first failure stops the run, and what was
written so far stays in the folder with ``runner.json`` saying what failed. Host facts (GPU,
driver, CPU, the engine's version, the draft's config digest and layer ids) go to ``host.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from .. import events, exitcodes
from ..fileio import write_json  # atomic: a reader (or a pull after a crash) sees the old file or the new one
from . import client_link, digest

RUN_DIR_TOKEN = "@RUN_DIR@"
RUNNER_FILE = "runner.json"
HOST_FILE = "host.json"
DATASETS = "remote.bench.datasets"
CLIENT_PATH_VAR = "DRAFTOPS_CLIENT_PYTHONPATH"
#: a client run longer than this is stopped (a hung server must not hold the job forever)
CLIENT_TIMEOUT_S = 3600.0


def substitute(value: Any, run_dir: str) -> Any:
    """Replace the run-folder token in every string of a JSON value."""
    if isinstance(value, str):
        return value.replace(RUN_DIR_TOKEN, run_dir)
    if isinstance(value, list):
        return [substitute(v, run_dir) for v in value]
    if isinstance(value, dict):
        return {k: substitute(v, run_dir) for k, v in value.items()}
    return value


def pid_alive(pid: int | None) -> bool:
    """Whether the server's process still runs (a zombie counts as dead)."""
    if not pid:
        return True                 # nothing to check against: the client's own errors will tell
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True


def http(base_url: str, method: str, path: str, timeout: float = 30.0) -> tuple[int | None, bytes, str | None]:
    """(status, body, error) of one request; an HTTP error status is an answer, not a failure."""
    import urllib.error
    import urllib.request
    request = urllib.request.Request(base_url.rstrip("/") + path, method=method,
                                     data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, resp.read(), None
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), None
    except (urllib.error.URLError, OSError) as exc:
        return None, b"", str(getattr(exc, "reason", exc))


def file_size(path: str | None) -> int:
    try:
        return os.path.getsize(path) if path else 0
    except OSError:
        return 0


def copy_slice(src: str | None, start: int, dest: Path) -> int:
    """Copy the bytes of ``src`` written since ``start`` to ``dest``; returns how many."""
    if not src:
        dest.write_bytes(b"")
        return 0
    try:
        with open(src, "rb") as fh:
            fh.seek(start)
            data = fh.read()
    except OSError:
        data = b""
    dest.write_bytes(data)
    return len(data)


def child_env(with_code: bool) -> dict[str, str]:
    """The environment of a child process: the serve profile's PYTHONPATH (passed as
    ``DRAFTOPS_CLIENT_PYTHONPATH``, since the job's own PYTHONPATH is the synced code), plus the code
    folder for draftops' own modules (not for the engine's client, which must not see them)."""
    env = dict(os.environ)
    extra = env.pop(CLIENT_PATH_VAR, "")
    parts = ([os.getcwd()] if with_code else []) + ([extra] if extra else [])
    env.pop("PYTHONPATH", None)
    if parts:
        env["PYTHONPATH"] = ":".join(parts)
    return env


def _run_cmd(text: str, timeout: float = 30.0) -> str | None:
    try:
        done = subprocess.run(shlex.split(text), capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _gpu_facts() -> dict[str, Any]:
    """The GPUs, the driver and the CUDA version, as nvidia-smi says them (what it does not say is left out)."""
    facts: dict[str, Any] = {}
    out = _run_cmd("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader")
    if out:
        names = [line.split(",")[0].strip() for line in out.splitlines()]
        facts["gpu"] = f"{len(names)} x {names[0]}" if len(set(names)) == 1 else "; ".join(names)
        facts["driver"] = out.splitlines()[0].split(",")[-1].strip()
    smi = _run_cmd("nvidia-smi") or ""
    if "CUDA Version:" in smi:
        facts["cuda"] = smi.split("CUDA Version:")[1].split()[0]
    return facts


def host_facts(engine: str, python: str, target: str, draft: str | None) -> dict[str, Any]:
    """GPU, driver, CUDA and CPU of the host; the engine's version and the draft as the engine reads it."""
    facts: dict[str, Any] = {"gpu": None, "driver": None, "cuda": None, "cpu": None}
    if shutil.which("nvidia-smi"):
        facts.update(_gpu_facts())
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                facts["cpu"] = f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
                break
    except OSError:
        pass
    code = ("import json, sys; from remote.serve.configs import inspect; from pathlib import Path; "
            "d = sys.argv[3]; print(json.dumps(inspect(sys.argv[1], Path(sys.argv[2]), Path(d) if d else None, "
            "sys.argv[1] == 'sglang')))")
    try:
        done = subprocess.run([python, "-c", code, engine, target, draft or ""], capture_output=True, text=True,
                              timeout=120, check=False, env=child_env(with_code=True))
        lines = done.stdout.strip().splitlines()
        inspected = json.loads(lines[-1]) if done.returncode == 0 and lines else None
        if inspected is None:
            facts["inspect_error"] = done.stderr.strip()[-1000:]
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        inspected, facts["inspect_error"] = None, str(exc)
    facts["inspect"] = inspected
    if draft:
        try:
            facts["draft_digest"] = digest.file_digest(draft)
        except OSError as exc:
            facts["draft_digest_error"] = str(exc)
    return facts


def last_words(log: Path, limit: int = 300) -> str:
    """The last line of a client's log that says something (an error is the client's last word;
    progress-bar redraws and blank lines are skipped), cut to ``limit`` characters: why a client
    failed, without opening its log."""
    try:
        with open(log, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - 16384))
            tail = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    for line in reversed(tail.replace("\r", "\n").splitlines()):
        text = "".join(ch for ch in line.strip() if ch.isprintable())
        if text and not text.startswith("$ ") and "it/s]" not in text and "s/it]" not in text:
            return text if len(text) <= limit else text[: limit - 3] + "..."
    return ""

class Runner:
    """One bench run in the job's folder."""

    def __init__(self, plan: dict[str, Any], run_dir: Path):
        self.plan, self.run_dir = plan, run_dir
        self.facts: threading.Thread | None = None      # host.json being gathered (facts_meanwhile)
        self.server = plan["server"]
        self.session: client_link.ClientSession | None = None     # one client process for every step
        self.session_tried = False
        self.doc: dict[str, Any] = {"status": "running", "failure": None, "steps": [],
                                    "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    def save(self) -> None:
        write_json(self.run_dir / RUNNER_FILE, self.doc)

    def fail(self, why: str) -> None:
        self.doc.update(status="failed", failure=why)
        print(f"bench: FAILED: {why}", flush=True)

    def server_alive(self) -> bool:
        return pid_alive(self.server.get("pid"))

    def server_gone(self) -> bool:
        """Dead, or no longer answering at all (its job's wrapper can outlive the server briefly)."""
        for attempt in range(3):
            if not self.server_alive():
                return True
            if http(self.server["base_url"], "GET", "/v1/models", timeout=10.0)[0] is not None:
                return False
            time.sleep(1.0 + attempt)
        return True

    def call(self, call: dict[str, Any]) -> dict[str, Any]:
        status, body, error = http(self.server["base_url"], call["method"], call["path"])
        if call.get("save_as"):
            (self.run_dir / call["save_as"]).write_bytes(body)
        ok = status is not None and (200 <= status < 300 or (call.get("optional") and status in (400, 404, 405)))
        return {"method": call["method"], "path": call["path"], "status": status, "error": error,
                "saved": call.get("save_as"), "ok": bool(ok)}

    def snapshot(self, name: str, path: str) -> None:
        """A server snapshot kept in the folder (server info / version) for the record."""
        status, body, error = http(self.server["base_url"], "GET", path)
        if status == 200:
            (self.run_dir / name).write_bytes(body)
        self.doc.setdefault("snapshots", []).append({"path": path, "status": status, "error": error,
                                                     "file": name if status == 200 else None})

    def run_command(self, argv: list[str], log_name: str, with_code: bool = False
                    ) -> tuple[int | None, float, str]:
        started = time.monotonic()
        log_path = self.run_dir / log_name
        with open(log_path, "ab") as log:
            log.write(("$ " + shlex.join(argv) + "\n").encode())
            log.flush()
            try:
                proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        env=child_env(with_code))
            except OSError as exc:
                return None, 0.0, f"could not start {argv[0]}: {exc}"
            while True:
                try:
                    code = proc.wait(timeout=2.0)
                    return code, time.monotonic() - started, ""
                except subprocess.TimeoutExpired:
                    if not self.server_alive():
                        time.sleep(5.0)          # the client notices the dead server and ends on its own
                        if proc.poll() is None:
                            proc.kill()
                        return proc.wait(), time.monotonic() - started, "server died"
                    if time.monotonic() - started > CLIENT_TIMEOUT_S:
                        proc.kill()
                        return proc.wait(), time.monotonic() - started, "timed out"

    def open_session(self) -> None:
        """Start the one client process (before the warm-up), or say in the log why each step starts
        its own: asked for, or an engine without the library entry (an older engine)."""
        self.session_tried = True
        mode = self.plan.get("client_mode") or os.environ.get(client_link.MODE_VAR) or "library"
        first = next((s["argv"] for s in self.plan["steps"]), None)
        module = first[2] if first and self.plan["engine"] == "sglang" and len(first) > 2 else None
        why: str | None = None
        if mode == "process":
            why = f"one client process per step was asked for ({client_link.MODE_VAR}=process)"
        elif first is None or client_link.client_args(first) is None:
            why = "the plan's client command is not one the bench's client process runs"
        else:
            session = client_link.ClientSession(self.plan["python"], self.plan["engine"], module,
                                                self.run_dir / "client-session.log", child_env(with_code=True))
            why = session.start(self.server_alive)
            if why is None:
                self.session = session
                self.doc["client"] = {"mode": "library", "entry": session.entry, "pid": session.pid,
                                      "ready_s": round(session.ready_s or 0.0, 3)}
                print(f"bench: one client process for every step ({session.entry}, ready in "
                      f"{session.ready_s:.1f} s)", flush=True)
                return
            session.close()
            why = f"the engine's client has no library entry ({why})"
        self.doc["client"] = {"mode": "process", "why": why}
        print(f"bench: {why}; each step starts its own client process", flush=True)

    def run_client(self, argv: list[str], record: dict[str, Any]) -> tuple[int | None, float, str]:
        """One step's client: a request to the client process when there is one, else a process of its own."""
        if not self.session_tried:
            self.open_session()
        args = client_link.client_args(argv)
        if self.session is None or args is None:
            return self.run_command(argv, record["client_log"])
        code, seconds, why, inside = self.session.run(shlex.join(argv), args, self.run_dir / record["client_log"],
                                                      CLIENT_TIMEOUT_S, self.server_alive)
        if inside is not None:
            record["client_call_s"] = inside
        if why and why not in ("server died", "timed out"):
            why = f"failed inside the bench's client process ({why})"
        return code, seconds, why

    def prepare(self, argv: list[str]) -> tuple[int | None, str]:
        """One preparation command. Our own stdlib dataset converter runs in this process: a new
        python's start-up costs more than the conversion (it used to be ~0.07 s of every bench)."""
        if list(argv[1:3]) == ["-m", DATASETS] and len(argv) == 5:
            from . import datasets
            from .errors import BenchParseError
            with open(self.run_dir / "prepare.log", "ab") as log:
                log.write(("$ " + shlex.join(argv) + " (in the runner)\n").encode())
                try:
                    count = datasets.write_sharegpt(argv[3], argv[4])
                except Exception as exc:    # noqa: BLE001 - any failure fails this step, as a python of its own did
                    why = str(exc) if isinstance(exc, (OSError, ValueError, BenchParseError)) else repr(exc)
                    log.write(f"error: {why}\n".encode())
                    return 1, why           # the reason (file and line) reaches the user's error
                log.write(f"{count}\n".encode())
            return 0, ""
        code, _, why = self.run_command(argv, "prepare.log", with_code=True)
        return code, why

    def step(self, step: dict[str, Any], number: int, total: int) -> bool:
        name = "warmup" if step["kind"] == "warmup" else f"rep{step['index']}"
        label = "warm-up" if step["kind"] == "warmup" else f"repeat {step['index']}/{self.plan['repeats']}"
        events.progress(number, total, f"bench: {label}")
        record: dict[str, Any] = {"name": name, "kind": step["kind"], "index": step["index"],
                                  "output": step["output"], "client_log": f"client-{name}.log"}
        self.doc["steps"].append(record)
        if not self.server_alive():
            self.fail(f"the server (pid {self.server.get('pid')}) is not running before the {label}")
            return False
        if step["kind"] != "warmup" and self.facts is not None:
            self.facts.join()       # gathering the host facts must not share the machine with a measured repeat
        record["before"] = [self.call(c) for c in step.get("before", [])]
        offset = file_size(self.server.get("log"))
        print(f"bench: {label}: {shlex.join(step['argv'])}", flush=True)
        code, seconds, why = self.run_client(step["argv"], record)
        record.update(exit_code=code, seconds=round(seconds, 3))
        if step.get("log_slice"):
            record["log_bytes"] = copy_slice(self.server.get("log"), offset, self.run_dir / step["log_slice"])
            record["log_slice"] = step["log_slice"]
        alive = not self.server_gone()
        if alive:
            record["after"] = [self.call(c) for c in step.get("after", [])]
            alive = not any(c["status"] is None for c in record["after"]) or not self.server_gone()
        record["server_alive_after"] = alive
        self.save()
        if not alive or why == "server died":
            self.fail(f"the server died during the {label} (client exit {code}); the files written up to "
                      "then are kept")
            return False
        if why or code != 0:
            said = last_words(self.run_dir / record["client_log"])
            self.fail(f"the client {why or f'exited {code}'} in the {label}"
                      + (f", saying: {said}" if said else "") + f"; its output is in {record['client_log']}")
            return False
        missing = [c["path"] for c in record.get("after", []) + record.get("before", []) if not c["ok"]]
        if missing:
            record["failed_calls"] = missing
        print(f"bench: {label} done in {seconds:.1f} s", flush=True)
        return True

    def facts_meanwhile(self) -> None:
        """host.json, gathered on a thread while the benchmark starts: asking the engine's python for
        its version takes that python's start-up (0.1-0.2 s), and nothing needs it before the end. It
        overlaps the snapshots, the prompts and the warm-up; a measured repeat waits for it (see
        :meth:`step`), so it never shares the machine with one."""
        plan = self.plan

        def gather() -> None:
            try:
                facts = host_facts(plan["engine"], plan["python"], plan["target"], plan.get("draft"))
            except Exception as exc:    # noqa: BLE001 - the facts are a record; a bug there must not stop the bench
                facts = {"error": f"{type(exc).__name__}: {exc}"}
            write_json(self.run_dir / HOST_FILE, facts)

        self.facts = threading.Thread(target=gather, name="host-facts", daemon=True)
        self.facts.start()

    def run(self) -> int:
        self.facts_meanwhile()
        try:
            self.steps()
        finally:
            if self.session is not None:
                self.session.close()
            if self.facts is not None:
                self.facts.join()  # host.json is written before the result is announced
        self.doc["ended"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.save()
        events.result(RUNNER_FILE, status=self.doc["status"],
                      headline=self.doc["failure"] or f"{self.plan['repeats']} repeat(s) done")
        return exitcodes.OK if self.doc["status"] == "succeeded" else exitcodes.CHECK_FAILED

    def steps(self) -> None:
        """The snapshots, the prompts, the warm-up and the repeats, until the first failure."""
        plan = self.plan
        for name, path in plan.get("snapshots", {}).items():
            self.snapshot(name, path)
        total = len(plan["prepare"]) + len(plan["steps"])
        self.save()
        for number, argv in enumerate(plan["prepare"]):
            events.progress(number, total, "bench: preparing the prompts")
            code, why = self.prepare(argv)
            if code != 0:
                self.fail(f"preparing the prompts failed ({why or f'exit {code}'}); see prepare.log")
                break
        else:
            self.open_session()     # before the first step: its import is no step's time
            for number, step in enumerate(plan["steps"], start=len(plan["prepare"])):
                if not self.step(step, number, total):
                    break
            else:
                events.progress(total, total, "bench: done")
                self.doc["status"] = "succeeded"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m remote.bench.runner")
    parser.add_argument("--plan-json", required=True, help="the plan (draftops.bench.runner.job_plan)")
    args = parser.parse_args(argv)
    run_dir = os.environ.get("DRAFTOPS_RUN_DIR") or os.getcwd()
    plan = substitute(json.loads(args.plan_json), run_dir)
    folder = Path(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / "plan.json", plan)
    return Runner(plan, folder).run()


if __name__ == "__main__":
    exitcodes.run("bench-runner", main)
