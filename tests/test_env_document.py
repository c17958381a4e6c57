"""env.json (``draftops.env/1``) read once into its model: the env.check table and a night's report
header from the file `remote.envcheck` writes, its GPU rows as nvidia-smi prints them (a stand-in
nvidia-smi on PATH: no GPU here), and a broken file leaves the header to what the runs say."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from draftops.cli.env import show_env
from draftops.documents import load
from draftops.documents.env_check import EnvCheck
from draftops.nightly import results

SMI = """#!/bin/sh
case "$1" in
  --query-gpu=*) printf '0, NVIDIA H200, 143771 MiB, 580.159.04\\n1, NVIDIA H200, 143771 MiB, 580.159.04\\n' ;;
  *) echo "| NVIDIA-SMI 580.159.04   Driver Version: 580.159.04   CUDA Version: 13.0 |" ;;
esac
"""


@pytest.fixture()
def env_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The env.json `python -m remote.envcheck --out DIR` writes, with two GPUs listed by nvidia-smi."""
    from remote import envcheck
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(SMI)
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}:/usr/bin:/bin")
    with monkeypatch.context() as m:
        m.setattr("sys.stdout", io.StringIO())
        assert envcheck.main(["--out", str(tmp_path / "out")]) == 0
    return tmp_path / "out" / "env.json"


def test_env_check_shows_the_gpu_rows_in_nvidia_smis_order(env_json: Path) -> None:
    out = io.StringIO()
    show_env(load(EnvCheck, env_json), "ml-env on box", Console(file=out, width=200, color_system=None))
    text = out.getvalue()
    assert "index=0, name=NVIDIA H200, memory.total=143771 MiB, driver_version=580.159.04" in text
    assert "index=1, name=NVIDIA H200" in text


def test_the_night_header_reads_gpu_driver_and_torch_from_env_json(env_json: Path) -> None:
    doc = json.loads(env_json.read_text())
    facts = results.describe([], env_json)
    assert facts["gpu"] == "NVIDIA H200" and facts["driver"] == "580.159.04"
    assert facts.get("torch") == doc["torch"].get("version")
    env_json.write_text(json.dumps({**doc, "nvidia_smi": None}))
    assert results.describe([], env_json)["gpu"] == "none (nvidia-smi not found)"


@pytest.mark.parametrize("change", [{"schema": "draftops.env/2"}, {"nvidia_smi": "H200"}, {"torch": []},
                                    {"packages": {"torch": float("nan")}}])
def test_a_broken_env_json_leaves_the_header_to_the_runs(env_json: Path, change: dict) -> None:
    env_json.write_text(json.dumps({**json.loads(env_json.read_text()), **change}))
    assert results.describe([], env_json) == {}
    env_json.write_text("{")
    assert results.describe([], env_json) == {}
