"""Benchmark: `invoke sync` against `rsync -a --delete`, over the same real sshd on 127.0.0.1.

Tree: about 2,000 files / 50 MB (mostly small source-like files plus a few larger binaries).
Cases: first sync, no-op, one file changed. Prints seconds and bytes sent for each.
Both tools pay for their own SSH connection in each case: draftops as a user runs it
(`invoke sync`, a new process), rsync with its usual ssh transport.

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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.sshd import keygen, start_sshd  # noqa: E402  (benchmarks reuse the test sshd)


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


def run_invoke_sync(project: Path, env: dict[str, str]) -> tuple[float, int]:
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "invoke", "sync"], cwd=project, env=env, check=True,
                         capture_output=True, text=True).stdout
    seconds = time.perf_counter() - started
    match = re.search(r"([\d.]+) (B|KiB|MiB|GiB) on the wire", out)
    scale = {"B": 1, "KiB": 1024, "MiB": 1 << 20, "GiB": 1 << 30}
    sent = int(float(match.group(1)) * scale[match.group(2)]) if match else 0
    return seconds, sent


def run_rsync(src: Path, dest: str, port: int, key: Path) -> tuple[float, int]:
    ssh = (f"ssh -p {port} -i {key} -o IdentitiesOnly=yes -o StrictHostKeyChecking=no "
           "-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR")
    started = time.perf_counter()
    out = subprocess.run(["rsync", "-a", "--delete", "--stats", "-e", ssh, f"{src}/", f"root@127.0.0.1:{dest}/"],
                         check=True, capture_output=True, text=True).stdout
    seconds = time.perf_counter() - started
    sent = int(re.search(r"Total bytes sent: ([\d,]+)", out).group(1).replace(",", ""))
    return seconds, sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--mb", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=3, help="runs per no-op/one-change case (median shown)")
    args = parser.parse_args()
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
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.pop("DRAFTOPS_HOST", None)
        rsync_dest = str(work / "rsync-dest")
        total = sum(p.stat().st_size for p in (project / "remote").rglob("*") if p.is_file())
        nfiles = sum(1 for p in (project / "remote").rglob("*") if p.is_file())
        print(f"tree: {nfiles} files, {total / 2**20:.1f} MiB; sshd on 127.0.0.1:{server.port}")
        results: dict[str, dict[str, tuple[float, int]]] = {}
        results["first sync"] = {"draftops": run_invoke_sync(project, env),
                                 "rsync": run_rsync(project / "remote", rsync_dest, server.port, key)}
        noop_d = [run_invoke_sync(project, env) for _ in range(args.repeat)]
        noop_r = [run_rsync(project / "remote", rsync_dest, server.port, key) for _ in range(args.repeat)]
        results["no-op"] = {"draftops": median(noop_d), "rsync": median(noop_r)}
        change_d, change_r, changed = [], [], 0
        target = project / "remote" / "pkg3" / "mod_3.py"
        for i in range(args.repeat):
            target.write_text(target.read_text() + f"\nX{i} = {i}\n")
            changed = target.stat().st_size
            change_d.append(run_invoke_sync(project, env))
            change_r.append(run_rsync(project / "remote", rsync_dest, server.port, key))
        results["one file changed"] = {"draftops": median(change_d), "rsync": median(change_r)}
        # The same two cases inside one invoke call (the connection already open, as in
        # `invoke sync test-drafter`): what sync itself costs, without Python start-up and imports.
        os.environ.pop("DRAFTOPS_HOST", None)
        from draftops.host import open_host
        from draftops.sync import sync
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
        print(f"{'case':<27} {'draftops s':>11} {'rsync s':>9} {'draftops bytes':>15} {'rsync bytes':>12}")
        for case, row in results.items():
            (ds, db), (rs, rb) = row["draftops"], row["rsync"]
            print(f"{case:<27} {ds:>11.3f} {rs:>9.3f} {db:>15,} {rb:>12,}")
        print("draftops bytes = the sync payload (tar); rsync bytes = its 'Total bytes sent'. The first three "
              "rows time `invoke sync` as a new process (Python start-up and imports included).")
        print(f"one change: the changed file is {changed:,} bytes; draftops sent "
              f"{results['one file changed']['draftops'][1] / changed:.0%} of it")
        server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def median(samples: list[tuple[float, int]]) -> tuple[float, int]:
    return statistics.median(s[0] for s in samples), int(statistics.median(s[1] for s in samples))


if __name__ == "__main__":
    main()
