"""``algorithm-eagle-not-eagle3`` on the serving side: `invoke serve` refuses a serve profile whose
extra_args run the EAGLE-3 draft as EAGLE (SGLang's flag, vLLM's speculative-config method) under that
id, and `invoke test-drafter` hands the drafter that launch algorithm and the engine's installed
version, read on a real local host from a real venv's package metadata."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from draftops.inventory import HostSpec, Inventory, ServeProfile
from draftops.runs.sync import sync
from draftops.serve import checks, launch_algorithm, profiles
from draftops.serve.host_engine import HostEngine, host_engine
from draftops.serve.request import Request, resolve
from tests.conftest import copy_remote_package


def plan(engine: str, extra_args: list[str], draft: str | None = "/d") -> object:
    spec = HostSpec(name="box", address="box.example", engine=engine, serve={"p": ServeProfile(
        python="/x/python", target="/t", extra_args=extra_args)})
    request = Request(draft=draft) if draft else Request(baseline=True)
    return resolve(request, profiles.resolve(spec), "/demo")


def refused(p: object) -> list[str]:
    found = checks.Findings()
    checks.flag_checks(p, found)  # type: ignore[arg-type]
    return found.refusals


@pytest.mark.parametrize("engine,args", [
    ("sglang", ["--speculative-algorithm", "EAGLE"]),
    ("sglang", ["--speculative-algorithm=NEXTN"]),
    ("vllm", ["--speculative-config", json.dumps({"method": "eagle", "num_speculative_tokens": 3})]),
])
def test_extra_args_that_run_the_draft_as_eagle_are_refused_under_the_finding_id(engine, args):
    text = refused(plan(engine, args))
    assert len(text) == 1 and text[0].startswith(launch_algorithm.ALGORITHM_ID + ":")
    assert "accept length exactly 1.0" in text[0] and "#21272" in text[0] and "extra_args" in text[0]


def test_other_extra_args_keep_their_own_refusal_and_a_baseline_has_no_algorithm_to_judge():
    owned = refused(plan("sglang", ["--speculative-algorithm", "EAGLE3"]))
    assert len(owned) == 1 and launch_algorithm.ALGORITHM_ID not in owned[0] and "use --draft" in owned[0]
    assert launch_algorithm.ALGORITHM_ID not in " ".join(refused(plan("sglang", ["--speculative-algorithm",
                                                                                   "EAGLE"], draft=None)))


def test_the_launch_algorithm_is_read_as_the_engine_reads_it():
    read = launch_algorithm.from_extra_args
    assert read("sglang", ["--speculative-algorithm", "EAGLE3", "--speculative-algorithm", "EAGLE"]) == "EAGLE"
    assert read("sglang", ["--disable-cuda-graph"]) is None
    assert read("vllm", ["--speculative-config", "{not json"]) is None
    assert read("vllm", ["--speculative-config={\"method\": \"eagle3\"}"]) == "eagle3"
    assert not launch_algorithm.runs_as_eagle("EAGLE3") and launch_algorithm.runs_as_eagle("eagle")


def test_host_engine_reads_the_installed_version_and_the_profiles_algorithm(tmp_path):
    from draftops.link.host import open_host

    venv = tmp_path / "engine venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    info = site / "sglang-0.5.13.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.13\n")
    copy_remote_package(tmp_path)
    spec = HostSpec(name="local", transport="local", root=str(tmp_path / ".draftops"), python=sys.executable,
                    engine="sglang", serve={"p": ServeProfile(python=str(venv / "bin" / "python"), target="/t",
                                                              extra_args=["--speculative-algorithm", "EAGLE"])})
    host = open_host("local", tmp_path, Inventory(hosts={"local": spec}))
    sync(host)
    found = host_engine(host)
    assert found == HostEngine("sglang", "0.5.13", "EAGLE")
    assert found.eval_args() == ["--engine", "sglang", "--engine-version", "0.5.13", "--serve-algorithm", "EAGLE"]
    assert HostEngine("vllm", None, None).eval_args() == ["--engine", "vllm"]
