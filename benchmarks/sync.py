"""Benchmark: `invoke sync` against `rsync -a --delete`, over the same real sshd on 127.0.0.1.

Tree: about 2,000 files / 50 MB (mostly small source-like files plus a few larger binaries).
Cases: first sync, no-op, one file changed. Prints seconds and bytes sent for each, the ratio
draftops/rsync measured side by side in the same run, where `invoke sync`'s time goes stage by stage
(from its DRAFTOPS_TIMING=1 stamps on stderr, see draftops/timing.py), and `invoke --list`'s wall time.
Both tools run as new processes in each case: draftops as a user runs it (`invoke sync`), rsync with its
usual ssh transport. draftops is measured twice: through the connection its earlier calls left open
(hosts.yaml `persist:`, the default) and connecting afresh in every call (DRAFTOPS_PERSIST=0); rsync
connects afresh. Every measured run starts after os.sync(): rsync never flushes what it writes, and
draftops' fdatasync of its own files would otherwise also wait for rsync's writeback.

    python benchmarks/sync.py [--files 2000] [--mb 50] [--repeat 3]
"""
from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))
REPO = HERE   # the checkout whose draftops is measured (--repo: e.g. an export of main, for "before")

from draftops import timing  # noqa: E402  (reads the timing lines of the measured processes)
from tests.support.sshd import keygen, start_sshd  # noqa: E402  (benchmarks reuse the test sshd)


def make_tree(root: Path, files: int, total_mb: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    big = 10
    big_bytes = total_mb * (1 << 20) * 3 // 4 // big
    small_bytes = total_mb * (1 << 20) // 4 // (files - big)
    for i in range(files - big):
        path = root / "remote" / f"pkg{i % 40}" / f"mod_{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        vocabulary = ("torch", "layer", "hidden", "draft", "token", "eagle")
        words = " ".join(rng.choice(vocabulary) for _ in range(small_bytes // 6))
        path.write_text(f"# module {i}\nDOC = '''{words}'''\n")
    for i in range(big):
        path = root / "remote" / "blobs" / f"blob_{i}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(big_bytes))


STAGES = ("interpreter + invoke", "imports", "inventory", "ssh library import", "handshake", "rich import",
          "scan wait", "host shell start-up", "agent", "transfer", "apply", "reply", "rest of the task", "close",
          "exit")
PARALLEL = ("scan",)   # runs on a thread during the handshake: shown, not added to the total


def stage_split(stderr: str, spawned: float, ended: float) -> dict[str, float]:
    """Seconds per stage of one `invoke sync` process, from its timing lines (see draftops/timing.py)."""
    moments, stages, _ = timing.read(stderr)    # host commands ("exec" lines) overlap the stages
    split = dict.fromkeys(STAGES, 0.0)
    for name, values in stages.items():
        split[name] = split.get(name, 0.0) + sum(values)
    if "draftops-import" not in moments or "task-start" not in moments:
        return {}       # a checkout from before DRAFTOPS_TIMING (--repo): totals only
    split["interpreter + invoke"] = moments["draftops-import"] - spawned
    split["imports"] = moments["task-start"] - moments["draftops-import"]
    split["exit"] = ended - moments.get("task-end", ended) - split["close"]
    split["rest of the task"] = (ended - spawned) - sum(v for k, v in split.items() if k not in PARALLEL)
    return split


SPLITS: dict[str, list[dict[str, float]]] = {}


def run_invoke_sync(project: Path, env: dict[str, str], case: str = "") -> tuple[float, int]:
    os.sync()              # start with no dirty pages: neither tool pays for the other's writeback
    spawned = time.time()
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "invoke", "sync"], cwd=project,
                          env={**env, "DRAFTOPS_TIMING": "1"}, check=True, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    out = proc.stdout
    SPLITS.setdefault(case, []).append(stage_split(proc.stderr, spawned, spawned + seconds))
    match = re.search(r"([\d.]+) (B|KiB|MiB|GiB) on the wire", out)
    scale = {"B": 1, "KiB": 1024, "MiB": 1 << 20, "GiB": 1 << 30}
    sent = int(float(match.group(1)) * scale[match.group(2)]) if match else 0
    return seconds, sent


def run_rsync(src: Path, dest: str, port: int, key: Path, control: Path | None = None,
              durable: bool = False) -> tuple[float, int]:
    """One `rsync -a --delete` over ssh; ``control``: through an OpenSSH ControlPersist master there;
    ``durable``: with --fsync (every file flushed, as draftops' apply does)."""
    ssh = (f"ssh -p {port} -i {key} -o IdentitiesOnly=yes -o StrictHostKeyChecking=no "
           "-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR")
    if control is not None:
        ssh += f" -o ControlMaster=auto -o ControlPath={control} -o ControlPersist=60"
    os.sync()
    started = time.perf_counter()
    flags = ["-a", "--delete", "--stats", *(["--fsync"] if durable else [])]
    out = subprocess.run(["rsync", *flags, "-e", ssh, f"{src}/", f"root@127.0.0.1:{dest}/"],
                         check=True, capture_output=True, text=True).stdout
    seconds = time.perf_counter() - started
    found = re.search(r"Total bytes sent: ([\d,]+)", out)
    sent = int(found.group(1).replace(",", "")) if found else 0
    return seconds, sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--mb", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=3, help="runs per case (median shown)")
    parser.add_argument("--repo", type=Path, default=HERE, help="measure the draftops of this checkout")
    args = parser.parse_args()
    global REPO
    REPO = args.repo.resolve()
    sys.path.insert(0, str(REPO))     # the in-process (open session) rows import its draftops too
    if not shutil.which("rsync"):
        sys.exit("rsync is not installed (apt-get install rsync)")
    work = Path(tempfile.mkdtemp(prefix="draftops-bench-"))
    try:
        key = keygen(work / "id_ed25519")
        server = start_sshd(work / "sshd", key)
        project = work / "project"
        make_tree(project, args.files, args.mb)
        shutil.copy(REPO / "tasks.py", project / "tasks.py")
        (project / "hosts.yaml").write_text(
            f"default: bench\nhosts:\n  bench:\n    address: 127.0.0.1\n    port: {server.port}\n"
            f"    user: root\n    key: {key}\n    host_key: accept-new\n    known_hosts: {work}/known_hosts\n"
            f"    root: {work}/hostroot\n")
        keepers = work / "k"                # this run's kept connections (hosts.yaml `persist:`)
        os.environ["DRAFTOPS_KEEPER_DIR"] = str(keepers)
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.pop("DRAFTOPS_HOST", None)
        env.pop("DRAFTOPS_PERSIST", None)          # each host's `persist:` (default 600 s): as a user has it
        env.pop("PYTHONDONTWRITEBYTECODE", None)   # Python's default: draftops' modules load from .pyc
        fresh = {**env, "DRAFTOPS_PERSIST": "0"}   # every call connects afresh (no kept connection)
        rsync_dest = str(work / "rsync-dest")
        total = sum(p.stat().st_size for p in (project / "remote").rglob("*") if p.is_file())
        nfiles = sum(1 for p in (project / "remote").rglob("*") if p.is_file())
        print(f"tree: {nfiles} files, {total / 2**20:.1f} MiB; sshd on 127.0.0.1:{server.port}")
        results: dict[str, dict[str, tuple[float, int]]] = {}
        target = project / "remote" / "pkg3" / "mod_3.py"
        changed = 0
        # Each case twice: as a user has it (the connection kept by an earlier call's keeper, and a host
        # agent started ahead), and with every call connecting afresh (DRAFTOPS_PERSIST=0).
        for label, case_env in (("", env), (FRESH, fresh)):
            if case_env is env:
                warm_up_keeper(project, env, keepers)
            first_d, first_r = [], []
            for _ in range(args.repeat):
                for stale in (work / "hostroot", project / ".draftops", Path(rsync_dest)):
                    shutil.rmtree(stale, ignore_errors=True)
                first_d.append(run_invoke_sync(project, case_env, "first sync" + label))
                first_r.append(run_rsync(project / "remote", rsync_dest, server.port, key))
            results["first sync" + label] = {"draftops": median(first_d), "rsync": median(first_r)}
            noop_d, noop_r = [], []
            for _ in range(args.repeat):       # interleaved, so a burst of load hits both tools alike
                noop_d.append(run_invoke_sync(project, case_env, "no-op" + label))
                noop_r.append(run_rsync(project / "remote", rsync_dest, server.port, key))
            results["no-op" + label] = {"draftops": median(noop_d), "rsync": median(noop_r)}
            change_d, change_r = [], []
            for i in range(args.repeat):
                target.write_text(target.read_text() + f"\nX{i} = {i}\n")
                changed = target.stat().st_size
                change_d.append(run_invoke_sync(project, case_env, "one file changed" + label))
                change_r.append(run_rsync(project / "remote", rsync_dest, server.port, key))
            results["one file changed" + label] = {"draftops": median(change_d), "rsync": median(change_r)}
        rsync_refs = rsync_references(project / "remote", rsync_dest, server.port, key, work / "cm", target,
                                      args.repeat)
        os.environ["DRAFTOPS_PERSIST"] = "0"      # the open-session rows below: this process's own connection
        # The same two cases inside one invoke call (the connection already open, as in
        # `invoke sync test-drafter`): what sync itself costs, without Python start-up and imports.
        os.environ.pop("DRAFTOPS_HOST", None)
        from draftops.link.host import open_host
        from draftops.runs.sync import sync
        host = open_host(None, project)
        sync(host)
        warm_noop, warm_change = [], []
        for i in range(args.repeat):
            report = sync(host)
            warm_noop.append((report.seconds, report.bytes_sent))
            target.write_text(target.read_text() + f"\nY{i} = {i}\n")
            report = sync(host)
            warm_change.append((report.seconds, report.bytes_sent))
        results["no-op (open session)"] = {"draftops": median(warm_noop), "rsync": median(noop_r)}
        results["one change (open session)"] = {"draftops": median(warm_change), "rsync": median(change_r)}
        print(f"{'case':<36} {'draftops s':>11} {'rsync s':>9} {'ratio':>6} {'goal':>5} "
              f"{'draftops bytes':>15} {'rsync bytes':>12}")
        for case, row in results.items():
            (ds, db), (rs, rb) = row["draftops"], row["rsync"]
            goal = GOALS.get(case)
            print(f"{case:<36} {ds:>11.3f} {rs:>9.3f} {ds / rs:>5.2f}x {f'{goal:.1f}x' if goal else '':>5} "
                  f"{db:>15,} {rb:>12,}")
        print("draftops bytes = the sync payload (tar); rsync bytes = its 'Total bytes sent'. The first six "
              "rows time `invoke sync` as a new process (Python start-up and imports included): first as a "
              f"user has it, through the connection an earlier call left open (hosts.yaml `persist:`, "
              f"draftops/link/keeper.py), then{FRESH}, connecting afresh in every call (DRAFTOPS_PERSIST=0). rsync "
              "connects afresh every time.")
        print(f"one change: the changed file is {changed:,} bytes; draftops sent "
              f"{results['one file changed']['draftops'][1] / changed:.0%} of it")
        print_references(results, rsync_refs)
        print_split()
        print_startup(project, env, args.repeat)
        print("bytecode cache: on for the measured processes (PYTHONDONTWRITEBYTECODE unset, Python's default)")
        print(f"load average while measuring: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
              f"on {os.cpu_count()} cores")
        server.stop()
    finally:
        from draftops.link import keeper_link
        keeper_link.disconnect_all()
        shutil.rmtree(work, ignore_errors=True)


FRESH = " (fresh connection)"


def rsync_references(src: Path, dest: str, port: int, key: Path, control: Path, target: Path,
                     repeat: int) -> dict[str, list[tuple[float, int]]]:
    """rsync as a kept draftops call should also be held against: through a connection kept the same
    way (OpenSSH ControlPersist: no-op, one change), and a first sync as durable as draftops' apply
    (--fsync, rsync >= 3.2.4). Measured after the main cases, not interleaved with them."""
    refs: dict[str, list[tuple[float, int]]] = {"no-op": [], "one file changed": [], "first sync": []}
    run_rsync(src, dest, port, key, control)
    for _ in range(repeat):
        refs["no-op"].append(run_rsync(src, dest, port, key, control))
    for i in range(repeat):
        target.write_text(target.read_text() + f"\nZ{i} = {i}\n")
        refs["one file changed"].append(run_rsync(src, dest, port, key, control))
    subprocess.run(["ssh", "-o", f"ControlPath={control}", "-O", "exit", "x"], capture_output=True)
    if "--fsync" in subprocess.run(["rsync", "--help"], capture_output=True, text=True).stdout:
        for _ in range(repeat):
            shutil.rmtree(dest, ignore_errors=True)
            refs["first sync"].append(run_rsync(src, dest, port, key, durable=True))
    return refs


def print_references(results: dict[str, dict[str, tuple[float, int]]],
                     refs: dict[str, list[tuple[float, int]]]) -> None:
    what = {"first sync": "rsync --fsync (every file flushed, as draftops' apply does)",
            "no-op": "rsync through an OpenSSH ControlPersist connection",
            "one file changed": "rsync through an OpenSSH ControlPersist connection"}
    for case, samples in refs.items():
        if samples:
            kept_s, ref_s = results[case]["draftops"][0], median(samples)[0]
            print(f"{case}: {what[case]} {ref_s:.3f} s; draftops through its kept connection {kept_s:.3f} s = "
                  f"{kept_s / ref_s:.2f}x of that (measured after, not interleaved)")


def warm_up_keeper(project: Path, env: dict[str, str], keepers: Path) -> None:
    """Two unmeasured calls: the first leaves a keeper as it exits, the second tells it which host agent
    to keep started (as any user's earlier calls of the day would have)."""
    subprocess.run([sys.executable, "-m", "invoke", "sync"], cwd=project, env=env, check=True, capture_output=True)
    deadline = time.monotonic() + 30
    while not list(keepers.glob("*.sock")):
        if time.monotonic() > deadline:
            sys.exit(f"no keeper appeared in {keepers}; see its .log there")
        time.sleep(0.05)
    subprocess.run([sys.executable, "-m", "invoke", "sync"], cwd=project, env=env, check=True, capture_output=True)
    time.sleep(0.5)


GOALS = {"first sync": 1.5, "no-op": 1.2, "one file changed": 1.2}   # issue 13, as whole processes
GOALS.update({case + FRESH: goal for case, goal in GOALS.items()})


def print_split() -> None:
    """Median seconds per stage of each whole-process case (stages of the same run add up to about its
    total; the medians of the stages need not add up to the median total)."""
    cases = [case for case, splits in SPLITS.items() if all(splits)]
    if not cases:
        print("\n(no stage split: this checkout's `invoke sync` prints no DRAFTOPS_TIMING stamps)")
        return
    print("\nwhere `invoke sync` spends its time (median seconds per stage, DRAFTOPS_TIMING=1):")
    print(f"{'stage':<22}" + "".join(f"{case.replace(FRESH, ' (fresh)'):>25}" for case in cases))
    for stage in (*STAGES, *PARALLEL):
        print(f"{stage:<22}" + "".join(f"{statistics.median(s[stage] for s in SPLITS[c]):>25.3f}"
                                        for c in cases))
    print(f"{'total':<22}" + "".join(
        f"{statistics.median(sum(v for k, v in s.items() if k not in PARALLEL) for s in SPLITS[c]):>25.3f}"
        for c in cases))
    print("interpreter + invoke: process start until draftops is first imported (invoke's own import and "
          "task loading); imports: until the task body starts; host shell start-up: exec request sent until "
          "the agent's first line runs on the host; agent: its start-up until it reads the payload; reply: "
          "its end until the answer is back here; inventory, ssh library import, rich import: loading pydantic "
          "and hosts.yaml, paramiko and fabric, rich, each when first needed; rest of the task: local work between "
          "those (cache files, "
          "diff, tar, printing); close: closing the SSH connection at exit; exit: after the task until the "
          "process is gone (close not included); scan: the local scan, on a thread while the handshake runs "
          "(not in the total); scan wait: how long the task then still waited for it.")


def print_startup(project: Path, env: dict[str, str], repeat: int) -> None:
    """Wall time of a bare interpreter and of `invoke --list` (no connection), median of runs."""
    def wall(argv: list[str]) -> float:
        times = []
        for _ in range(max(repeat, 5)):
            started = time.perf_counter()
            subprocess.run(argv, cwd=project, env=env, check=True, capture_output=True)
            times.append(time.perf_counter() - started)
        return statistics.median(times)
    bare = wall([sys.executable, "-c", "pass"])
    listing = wall([sys.executable, "-m", "invoke", "--list"])
    print(f"\nstart-up: bare interpreter {bare:.3f} s; `invoke --list` {listing:.3f} s (goal < 0.3 s)")


def median(samples: list[tuple[float, int]]) -> tuple[float, int]:
    return statistics.median(s[0] for s in samples), int(statistics.median(s[1] for s in samples))


if __name__ == "__main__":
    main()
