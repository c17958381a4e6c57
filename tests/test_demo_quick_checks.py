"""The quick "is the demo there?" answers behind `--draft demo`, `--ckpt demo` and `--dataset demo`
(issue 10: what draftops adds around the engine). Each used to start a job that imported torch (about
3 s on this machine) only to find the demo complete; now a stdlib-only tool answers, and the demo's
benchmark prompts are written once per demo. Real demo files, real interpreters."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from draftops.drafter.demo import ensure_demo
from draftops.link.host import open_host
from draftops.runs.sync import sync
from draftops.serve.request import demo_dir
from remote.bench import demo_prompts
from remote.drafter.demo_spec import DEMO_VERSION, MARKER, DemoSpec
from tests.conftest import REPO, copy_remote_package
from tests.support.drafter_support import demo


def imported_modules(*args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run ``python -X importtime ARGS`` from the repo; its output and the modules it imported."""
    done = subprocess.run([sys.executable, "-X", "importtime", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False)
    modules = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    return done, modules


@pytest.fixture
def demo_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "demo"
    shutil.copytree(demo().root, folder)
    return folder


def test_demo_spec_says_complete_only_for_this_version_without_importing_torch(demo_copy: Path):
    done, modules = imported_modules("-m", "remote.drafter.demo_spec", str(demo_copy))
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["complete"] is True
    assert "torch" not in modules and "safetensors" not in modules

    meta = json.loads((demo_copy / MARKER).read_text())
    (demo_copy / MARKER).write_text(json.dumps({**meta, "version": DEMO_VERSION - 1}))
    done, _ = imported_modules("-m", "remote.drafter.demo_spec", str(demo_copy))
    assert json.loads(done.stdout)["complete"] is False
    (demo_copy / MARKER).write_text("[3]")                  # JSON, but not the marker's object
    done, _ = imported_modules("-m", "remote.drafter.demo_spec", str(demo_copy))
    assert done.returncode == 0 and json.loads(done.stdout)["complete"] is False
    (demo_copy / MARKER).unlink()
    done, _ = imported_modules("-m", "remote.drafter.demo_spec", str(demo_copy))
    assert done.returncode == 0 and json.loads(done.stdout)["complete"] is False


def test_demo_prompts_are_written_once_per_demo_and_prefix_length(demo_copy: Path, tmp_path: Path):
    out = tmp_path / "prompts" / "demo.jsonl"
    count, reused = demo_prompts.write(demo_copy, out, 4)
    texts = [json.loads(line)["prompt"] for line in out.read_text().splitlines()]
    assert count == len(texts) > 0 and not reused
    assert all(len(t.split()) == 4 for t in texts)

    # reused without reading a dump: the dumps can be gone, and torch is not imported
    shutil.move(demo_copy / "data", tmp_path / "data-aside")
    assert demo_prompts.write(demo_copy, out, 4) == (count, True)
    code = ("import sys; from pathlib import Path; from remote.bench import demo_prompts as d; "
            f"print(d.write(Path({str(demo_copy)!r}), Path({str(out)!r}), 4)[1], 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.stdout.split() == ["True", "False"], done.stderr[-2000:]

    # another prefix length needs the dumps again (it is part of the key)
    with pytest.raises(FileNotFoundError, match="hs_"):
        demo_prompts.write(demo_copy, out, 3)
    shutil.move(tmp_path / "data-aside", demo_copy / "data")
    count3, reused = demo_prompts.write(demo_copy, out, 3)
    assert not reused and all(len(json.loads(line)["prompt"].split()) == 3 for line in out.read_text().splitlines())

    # a rebuilt demo (a new DEMO.json) makes them again
    (demo_copy / MARKER).write_text((demo_copy / MARKER).read_text() + " ")
    assert demo_prompts.write(demo_copy, out, 3) == (count3, False)


def test_the_demo_build_leaves_the_benchmark_prompts_in_the_demo(demo_copy: Path):
    built = demo_copy / demo_prompts.IN_DEMO
    count, reused = demo_prompts.write(demo_copy, built, DemoSpec().prompt_len)
    assert reused and count == len(built.read_text().splitlines()) > 0


def test_a_prefix_length_below_one_is_refused(demo_copy: Path, tmp_path: Path):
    done = subprocess.run([sys.executable, "-m", "remote.bench.demo_prompts", str(demo_copy), str(tmp_path / "p"),
                           "--prefix-len", "0"], cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "--prefix-len must be at least 1" in done.stderr
    assert not (tmp_path / "p").exists()


def test_demo_prompts_without_a_demo_say_how_to_make_one(tmp_path: Path):
    (tmp_path / "demo").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no complete demo .*invoke test-drafter"):
        demo_prompts.write(tmp_path / "demo", tmp_path / "p.jsonl", 4)
    assert not (tmp_path / "p.jsonl").exists()


def test_a_complete_demo_on_the_host_starts_no_job(make_project, no_inventory_env):
    project = make_project()
    copy_remote_package(project)
    box = open_host(None, project)
    sync(box)
    shutil.copytree(demo().root, demo_dir(box.state_dir))
    ensure_demo(box)
    runs = Path(box.runs_dir)
    assert not runs.exists() or not any(runs.iterdir()), sorted(p.name for p in runs.iterdir())
