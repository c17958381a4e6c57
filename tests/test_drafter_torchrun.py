"""The evaluator under torchrun (remote/drafter/launch/launcher.py): 2 gloo ranks on the demo give one process's
report, a rank killed mid-run is named with its signal and leaves no report, and the bad inputs of a
torchrun (dumps that differ across ranks, a rank without its files, more ranks than the host runs)
are one paragraph each.  Real torchrun, real processes; every wait bounded."""
from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from remote import events
from remote.drafter.data.batching import iter_batches, plan
from remote.drafter.launch.distributed import World
from remote.drafter.scoring.metrics import StepCounts
from remote.drafter.scoring.reduce import counts
from tests.conftest import REPO
from tests.support.drafter_support import demo
from tests.support.sshd import free_port
from tests.support.torchrun import comparable

MEMORY_CAP = 6 << 30   # per process (the ranks inherit it): torch's import maps about 2 GiB


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


def _eval_args(out: Path, data: Path | None = None) -> list[str]:
    d = demo()
    return ["eval", "--ckpt", str(d.draft), "--data", str(data or d.data), "--verifier", str(d.target),
            "--out", str(out)]


def launch(out: Path, *flags: str, data: Path | None = None, timeout: float = 180) -> subprocess.Popen[str]:
    out.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "remote.drafter.launch", *flags, *_eval_args(out, data)],
                            cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_cap)


def finish(proc: subprocess.Popen[str], timeout: float = 180) -> tuple[int, str]:
    try:
        text, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        text, _ = proc.communicate()
        pytest.fail(f"the launcher ran past {timeout} s:\n{text[-3000:]}")
    return proc.returncode, text


def error_of(text: str) -> str:
    found = [e for e in map(events.parse, text.splitlines()) if e is not None and e.get("event") == "error"]
    assert found, text[-3000:]
    return str(found[-1]["message"])


@pytest.mark.slow
@pytest.mark.parametrize("folder", ["data", "data_pt"])   # planned batches; torch files: contiguous shares
def test_two_gloo_ranks_give_one_process_report(tmp_path: Path, folder: str) -> None:
    data = demo().root / folder
    one = subprocess.run([sys.executable, "-m", "remote.drafter", *_eval_args(tmp_path / "one", data), "--full"],
                         cwd=REPO, env=_env(), capture_output=True, text=True, timeout=180, check=False)
    assert one.returncode == 0, one.stderr[-3000:]
    code, text = finish(launch(tmp_path / "two", "--gpus", "2", data=data))
    assert code == 0, text[-3000:]
    results = [e for e in map(events.parse, text.splitlines()) if e is not None and e.get("event") == "result"]
    assert len(results) == 1        # rank 0 alone reports
    single = json.loads((tmp_path / "one" / "report.json").read_text())
    ranks = json.loads((tmp_path / "two" / "report.json").read_text())
    assert ranks["verdict"]["status"] == "MISMATCH" and ranks["verdict"]["fix_layer_ids"] == [-1, 1, 3]
    assert ranks["run"]["mode"] == "full"          # --gpus implies --full
    assert comparable(ranks) == comparable(single)  # counts, verdict, fix, layouts, every figure
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == ["report.json"]


@pytest.mark.slow
def test_a_rank_killed_mid_run_is_named_and_leaves_no_report(tmp_path: Path) -> None:
    proc = launch(tmp_path / "run", "--gpus", "2")
    assert proc.stdout is not None
    seen = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:    # rank 0 reaches the metrics pass only once both ranks scanned
        line = proc.stdout.readline()
        seen.append(line)
        if "drafter: metrics:" in line or not line:
            break
    victim = _rank_pid(proc.pid, 1)
    assert victim is not None, "".join(seen)
    os.kill(victim, 9)
    code, text = finish(proc)
    message = error_of(text)
    assert code == 3, text[-3000:]
    assert "rank 1 " in message and "signal 9 (SIGKILL)" in message and f"pid {victim}" in message
    assert not (tmp_path / "run" / "report.json").exists()


@pytest.mark.slow
def test_sigterm_stops_the_launcher_and_its_ranks_as_any_tool_is_stopped(tmp_path: Path) -> None:
    """`invoke kill` sends SIGTERM: torchrun stops the ranks and raises its own SignalException, which
    must end the launcher by that signal in one line, not as an internal error with a traceback."""
    proc = launch(tmp_path / "run", "--gpus", "2")
    assert proc.stdout is not None
    seen = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        seen.append(line)
        if "drafter: metrics:" in line or not line:
            break
    ranks = [_rank_pid(proc.pid, r) for r in (0, 1)]
    assert None not in ranks, "".join(seen)
    proc.send_signal(signal.SIGTERM)
    code, text = finish(proc)
    assert code == -signal.SIGTERM, text[-3000:]
    assert "drafter-launch: stopped by SIGTERM" in text and "Traceback" not in text, text[-3000:]
    assert not (tmp_path / "run" / "report.json").exists()
    for pid in ranks:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]


def _rank_pid(launcher: int, rank: int) -> int | None:
    """The pid of the launcher's rank ``rank`` (a child whose environment says RANK=rank)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            env = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == launcher and f"RANK={rank}".encode() in env:
            return int(entry.name)
    return None


def two_nodes(tmp_path: Path, second_data: Path) -> list[tuple[int, str]]:
    """2 nodes x 1 rank on 127.0.0.1, node 1 reading ``second_data``."""
    port = free_port()
    common = ["--gpus", "1", "--nnodes", "2", "--endpoint", f"127.0.0.1:{port}", "--rdzv-timeout", "60",
              "--collective-timeout", "60"]
    procs = [launch(tmp_path / "node0", *common, "--node-rank", "0"),
             launch(tmp_path / "node1", *common, "--node-rank", "1", data=second_data)]
    return [finish(p) for p in procs]


@pytest.mark.slow
def test_ranks_whose_dumps_differ_in_format_are_refused(tmp_path: Path) -> None:
    results = two_nodes(tmp_path, demo().root / "data_pt")
    for code, text in results:
        message = error_of(text)
        assert code == 3, text[-3000:]
        assert "The ranks' dumps differ in format" in message and "rank 1 (host" in message
        assert "format safetensors" in message and "format pt" in message and "Fix: give every host" in message
    assert not any((tmp_path / n / "report.json").exists() for n in ("node0", "node1"))


def test_a_rank_whose_data_folder_is_missing_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "absent"
    results = two_nodes(tmp_path, missing)
    for code, text in results:
        message = error_of(text)
        assert code == 3, text[-3000:]
        assert f"Rank 1 of 2 (host {socket.gethostname()}, --data {missing})" in message
        assert "The data path does not exist" in message
    assert not (tmp_path / "node0" / "report.json").exists()


def test_more_ranks_than_the_host_runs_is_refused_before_starting(tmp_path: Path) -> None:
    code, text = finish(launch(tmp_path / "run", "--gpus", "999"), timeout=60)
    message = error_of(text)
    assert code == 3
    assert "--gpus 999 asks for more" in message and "Fix: pass --gpus" in message
    assert "drafter: loading" not in text     # no rank started


def test_the_plan_is_the_batches_one_process_makes() -> None:
    lengths = [5, 9, 9, 3, 1, 17, 4, 4, 30, 2]
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    planned = plan(order, [lengths[i] for i in order], token_budget=24, max_len=12)

    class Fake:
        def __init__(self, n: int) -> None:
            self.token_ids = torch.zeros(n, dtype=torch.long)
            self.hidden = torch.zeros(n, 2, 4)
            self.loss_mask = None
            self.slots = None
            self.slot_count = 2
            self.path = Path("x")

    made = list(iter_batches(lambda i: Fake(lengths[i]), order, 24, max_len=12, readers=1))  # type: ignore[arg-type, return-value]
    assert [[order[p] for p in b.positions.tolist()] for b in made] == [[i for _, i in b] for b in planned]
    world = [World(rank, 3) for rank in range(3)]
    shared = [batch for w in world for batch in w.shard(planned)]
    assert sorted(shared) == sorted(planned) and len(shared) == len(planned)
    assert [len(w.chunk(list(range(10)))) for w in world] == [4, 3, 3]


def test_per_sample_counts_go_back_in_position_order() -> None:
    parts = []
    for places in ([0, 2], [1, 3]):
        sc = StepCounts(1)
        correct = torch.tensor([[p] for p in places])
        sc._samples.append((torch.tensor(places), correct, correct + 10))
        sc.full_correct[0] = int(correct.sum())
        parts.append(sc)
    merged = counts(parts)
    assert merged.per_sample().correct[:, 0].tolist() == [0, 1, 2, 3]
    assert merged.full_correct == [6]


def test_a_node_alone_at_the_rendezvous_ends_within_its_timeout(tmp_path: Path) -> None:
    started = time.monotonic()
    code, text = finish(launch(tmp_path / "run", "--gpus", "1", "--nnodes", "2", "--node-rank", "0", "--endpoint",
                               f"127.0.0.1:{free_port()}", "--rdzv-timeout", "3"), timeout=90)
    message = error_of(text)
    assert code == 3, text[-3000:]
    assert "Node 0 of 2" in message and "did not meet the other nodes" in message and "within 3 s" in message
    assert time.monotonic() - started < 60
