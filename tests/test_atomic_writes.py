"""Every file draftops and its remote tools replace goes through remote/fileio.py (issue 23): a write
that fails part way (a full disk, an exception in the writer) leaves no temporary file and the old
file as it was. Each writer is run for real on a small tmpfs filled to the last byte."""
from __future__ import annotations

import errno
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import IO

import pytest

from remote import exitcodes
from remote.fileio import atomic_write_text, atomic_write_with
from tests.conftest import REPO, small_tmpfs


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (mounting needs root with CAP_SYS_ADMIN); a test fills it with :func:`fill`."""
    with small_tmpfs(tmp_path / "disk", "1m") as mounted:
        yield mounted


def fill(disk: Path) -> None:
    """Take every free byte of ``disk``, so that the next write of any size fails with ENOSPC."""
    with open(disk / "filler", "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"x" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


def contents(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` but the filler, by its path: what must not change."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "filler"}


def test_a_writer_that_fails_half_way_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "chart.png"
    target.write_bytes(b"the old chart")

    def half_then_fail(fh: IO[bytes]) -> None:
        fh.write(b"half a ch")
        raise ValueError("the writer gave up")

    with pytest.raises(ValueError, match="gave up"):
        atomic_write_with(target, half_then_fail)
    assert contents(tmp_path) == {"chart.png": b"the old chart"}
    atomic_write_text(target, "ünïcode, whatever the locale")
    assert target.read_bytes() == "ünïcode, whatever the locale".encode()


def test_the_bench_runners_record_on_a_full_disk(disk: Path) -> None:
    from remote.bench.runner import RUNNER_FILE, Runner
    runner = Runner({"server": {"base_url": "http://127.0.0.1:1", "pid": None}}, disk)
    runner.save()
    before = contents(disk)
    assert list(before) == [RUNNER_FILE]
    fill(disk)
    runner.doc["status"] = "failed"
    with pytest.raises(OSError, match="No space left"):
        runner.save()
    assert contents(disk) == before


def test_envcheck_on_a_full_disk(disk: Path) -> None:
    (disk / "env.json").write_text('{"schema": "draftops.env/1", "old": true}\n')
    before = contents(disk)
    fill(disk)
    proc = subprocess.run([sys.executable, "-m", "remote.envcheck", "--out", str(disk)], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == exitcodes.INTERNAL and "No space left" in proc.stdout, proc.stderr
    assert contents(disk) == before


def _demo(folder: Path) -> Path:
    """The least of a demo that demo_prompts reads: its marker and one real dump."""
    import torch
    from safetensors.torch import save_file

    from remote.drafter.demo_spec import MARKER
    (folder / "data").mkdir(parents=True)
    (folder / MARKER).write_text('{"version": "test"}')
    save_file({"token_ids": torch.tensor([5, 17, 33, 40, 8], dtype=torch.int64)},
              str(folder / "data" / "hs_0.safetensors"))
    return folder


def test_demo_prompts_on_a_full_disk_refuse_and_keep_the_old_prompts(tmp_path: Path, disk: Path) -> None:
    from remote.bench import demo_prompts
    demo = _demo(tmp_path / "demo")
    dest = disk / "bench-prompts.jsonl"
    dest.write_text('{"prompt": "the old prompt"}\n')
    (disk / "bench-prompts.jsonl.key").write_text("an older demo")
    before = contents(disk)
    fill(disk)
    assert demo_prompts.main([str(demo), str(dest)]) == exitcodes.REFUSED
    assert contents(disk) == before


def test_the_sharegpt_conversion_on_a_full_disk(tmp_path: Path, disk: Path) -> None:
    from remote.bench.datasets import write_sharegpt
    src = tmp_path / "prompts.jsonl"
    src.write_text('{"prompt": "hello"}\n')
    (disk / "prompts.sharegpt.json").write_text("[]")
    before = contents(disk)
    fill(disk)
    with pytest.raises(OSError, match="No space left"):
        write_sharegpt(src, disk / "prompts.sharegpt.json")
    assert contents(disk) == before


def _night(folder: Path, hist_file: Path):
    """A night of one host with a history of nine nights (the report draws four trend plots)."""
    from draftops import history
    from draftops.nightly import detect
    from draftops.nightly.night import HostNightReport, Night
    from draftops.nightly.playbook import Playbook, Step
    from draftops.nightly.results import baseline_nights
    from draftops.nightly.runner import OK, HostOutcome, StepResult
    book = Playbook(name="nightly", hosts=["box"], steps=[Step(name="drafter", task="test-drafter")], setup="s")
    hist = history.History(hist_file)
    start = datetime(2026, 11, 1, tzinfo=timezone.utc)
    for n in range(9):
        hist.record(history.RunRecord(run_id=f"n{n}", kind="nightly", host="box",
                                      time=history.to_iso(start + timedelta(days=n)), settings={"setup": "s"},
                                      metrics={"speculative.tok_s": 100.0 + n, "speedup": 1.5}))
    nights = baseline_nights(hist, "box", "s", 20)
    verdicts = detect.judge_all([r.metrics for r in nights], threshold=book.threshold,
                                lower_better=book.lower_better, window=7, min_nights=3)
    box = HostOutcome("box", steps=[StepResult("drafter", "test-drafter", OK)], metrics=nights[-1].metrics)
    folder.mkdir(parents=True)
    return Night(folder.name, folder, book, Path("playbooks/p.yaml"), history.now_iso(), "abc123",
                 [HostNightReport(box, verdicts, nights)])


def test_the_nightly_report_on_a_full_disk(tmp_path: Path, disk: Path) -> None:
    from draftops.nightly import report
    night = _night(disk / "nightly-2026-11-09", tmp_path / "history.sqlite")
    report.write(night)
    before = contents(disk)
    names = {Path(name).name for name in before}
    assert {"report.md", "report.html"} <= names and any(name.endswith(".png") for name in names)
    fill(disk)
    with pytest.raises(report.ReportError, match="No space left"):   # one paragraph naming the folder
        report.write(night)
    assert contents(disk) == before


def test_the_compare_chart_on_a_full_disk(tmp_path: Path, disk: Path) -> None:
    from draftops.bench import chart
    from draftops.history import History
    from tests.support import bench_runs as runs
    from tests.support.comparisons import compare as _compare
    hist = History(tmp_path / "history.sqlite")
    cmp = _compare(hist, runs.vllm_run("base", tok_s=[90.0, 91.0, 89.0]),
                   runs.vllm_run("spec", tok_s=[46.7, 47.0, 46.1], accept=1.55))
    chart.draw(cmp, disk / "compare.png")
    before = contents(disk)
    fill(disk)
    with pytest.raises(OSError, match="No space left"):
        chart.draw(cmp, disk / "compare.png")
    assert contents(disk) == before


def test_no_hand_made_atomic_write_is_left() -> None:
    """The writers above are every one there was: a temporary file renamed into place by hand is
    found by its pieces (``.tmp`` names, os.replace, Path.replace/rename) outside the places that
    own a different kind of swap (folders in jobs.pull_run, the keeper's socket, the host agent)."""
    owners = {"remote/fileio.py", "draftops/runs/jobs.py", "draftops/link/keeper.py"}
    found = []
    for folder in ("draftops", "remote", "benchmarks"):
        for path in sorted((REPO / folder).rglob("*.py")):
            name = str(path.relative_to(REPO))
            if name in owners or name.startswith("draftops/onhost/"):
                continue
            text = path.read_text()
            for piece in ('.tmp"', ".tmp'", '".tmp', "os.replace(", "os.rename(", "tmp.replace(", ".rename("):
                if piece in text:
                    found.append(f"{name}: {piece}")
    assert found == []
