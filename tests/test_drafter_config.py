"""Bad config values and options end in the evaluator's clear-error exit (code 3, one paragraph that
names the file or flag, the field and the fix), never a traceback, a crash or a confident verdict."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from remote import events
from remote.drafter.cli import main
from tests.support.drafter_lab import TRAINED, WELL_TRAINED, lab, save, trained_weights

REPO = Path(__file__).resolve().parent.parent
LLAMA3_NO_FACTOR = {"rope_type": "llama3", "rope_theta": 500000.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
TLC = "transformer_layer_config"

# (dotted path in a speculators-format config, bad value, field named in the message)
SPECULATORS_CASES = [
    (f"{TLC}.num_attention_heads", 0, f"{TLC}.num_attention_heads"),
    (f"{TLC}.num_attention_heads", "abc", f"{TLC}.num_attention_heads"),
    (f"{TLC}.num_attention_heads", -4, f"{TLC}.num_attention_heads"),
    (f"{TLC}.num_attention_heads", 2.5, f"{TLC}.num_attention_heads"),
    (f"{TLC}.num_attention_heads", True, f"{TLC}.num_attention_heads"),
    (f"{TLC}.num_attention_heads", 3, f"{TLC}.num_attention_heads"),  # q_proj rows 32 not divisible
    (f"{TLC}.num_attention_heads", 32, f"{TLC}.num_attention_heads"),  # head_dim 1: odd
    (f"{TLC}.head_dim", 0, f"{TLC}.head_dim"),
    (f"{TLC}.rms_norm_eps", "abc", f"{TLC}.rms_norm_eps"),
    (f"{TLC}.rms_norm_eps", 0, f"{TLC}.rms_norm_eps"),
    (f"{TLC}.rms_norm_eps", -1e-6, f"{TLC}.rms_norm_eps"),
    (f"{TLC}.rms_norm_eps", float("nan"), f"{TLC}.rms_norm_eps"),
    (f"{TLC}.hidden_size", "big", f"{TLC}.hidden_size"),
    (f"{TLC}.max_position_embeddings", 0, f"{TLC}.max_position_embeddings"),
    (f"{TLC}.hidden_act", 5, f"{TLC}.hidden_act"),
    (f"{TLC}.hidden_act", "gelu", f"{TLC}.hidden_act"),
    (f"{TLC}.sliding_window", -5, f"{TLC}.sliding_window"),
    (f"{TLC}.layer_types", "sliding", f"{TLC}.layer_types"),
    (f"{TLC}.rope_parameters", LLAMA3_NO_FACTOR, f"{TLC}.rope_parameters.factor"),
    (f"{TLC}.rope_parameters", {"rope_type": "default", "rope_theta": 0}, f"{TLC}.rope_parameters.rope_theta"),
    (f"{TLC}.rope_parameters", {"rope_type": "default", "rope_theta": "abc"}, f"{TLC}.rope_parameters.rope_theta"),
    (f"{TLC}.rope_parameters", {"rope_type": "linear", "rope_theta": 1e4}, f"{TLC}.rope_parameters.factor"),
    (f"{TLC}.rope_parameters", {"rope_type": "linear", "factor": 0}, f"{TLC}.rope_parameters.factor"),
    (f"{TLC}.rope_parameters", {"rope_type": "fancy"}, f"{TLC}.rope_parameters.rope_type"),
    (f"{TLC}.rope_parameters", {**LLAMA3_NO_FACTOR, "factor": 8.0, "high_freq_factor": 0.5},
     f"{TLC}.rope_parameters.high_freq_factor"),
    (f"{TLC}.rope_parameters", {"rope_type": "default", "partial_rotary_factor": 0.5},
     f"{TLC}.rope_parameters.partial_rotary_factor"),
    (f"{TLC}.rope_parameters", "abc", f"{TLC}.rope_parameters"),
    (f"{TLC}.rope_parameters", {"rope_type": "default", "rope_theta": 1e-300}, "rope"),  # frequencies overflow
    (TLC, "abc", TLC),
    ("eagle_aux_hidden_state_layer_ids", ["a"], "eagle_aux_hidden_state_layer_ids"),
    ("eagle_aux_hidden_state_layer_ids", "0,2,3", "eagle_aux_hidden_state_layer_ids"),
    ("eagle_aux_hidden_state_layer_ids", [0, 2.5, 3], "eagle_aux_hidden_state_layer_ids"),
    ("eagle_aux_hidden_state_layer_ids", [0, 0, 3], "eagle_aux_hidden_state_layer_ids"),
    ("eagle_aux_hidden_state_layer_ids", [], "eagle_aux_hidden_state_layer_ids"),
    ("eagle_aux_hidden_state_layer_ids", [0, 2], "eagle_aux_hidden_state_layer_ids"),
    ("norm_before_fc", "yes", "norm_before_fc"),
    ("target_hidden_size", 0, "target_hidden_size"),
]

OPTION_CASES = [
    (["--steps", "0"], "--steps"), (["--steps", "1000"], "--steps"), (["--steps", "-1"], "--steps"),
    (["--limit", "-1"], "--limit"), (["--layout-samples", "0"], "--layout-samples"),
    (["--batch-tokens", "0"], "--batch-tokens"), (["--max-len", "1"], "--max-len"),
    (["--expected-acc", "-1"], "--expected-acc"), (["--expected-acc", "250"], "--expected-acc"),
    (["--expected-acc", "nan"], "--expected-acc"), (["--alpha", "0"], "--alpha"), (["--alpha", "0.9"], "--alpha"),
    (["--layout-tolerance", "-0.1"], "--layout-tolerance"), (["--layout-tolerance", "nan"], "--layout-tolerance"),
    (["--min-skill", "1"], "--min-skill"), (["--acc-tolerance", "inf"], "--acc-tolerance"),
]


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save(tmp_path_factory.mktemp("good") / "ckpt", trained_weights(WELL_TRAINED), TRAINED)


def _with(config: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    config = json.loads(json.dumps(config))
    *parents, key = dotted.split(".")
    node = config
    for p in parents:
        node = node[p]
    node[key] = value
    return config


def _eval(ckpt: Path, out: Path, *extra: str) -> list[str]:
    return ["eval", "--ckpt", str(ckpt), "--data", str(lab().data), "--verifier", str(lab().target),
            "--out", str(out), "--limit", "16", "--layout-samples", "8", *extra]


def _clear_error(code: int, captured: pytest.CaptureFixture, *parts: str) -> str:
    out, err = captured.readouterr()
    assert code == 3, err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert "Fix: " in err, err
    for part in parts:
        assert part in err, (part, err)
    error = [e for e in map(events.parse, out.splitlines()) if e and e["event"] == "error"]
    assert len(error) == 1 and error[0]["message"] in err
    return err


@pytest.mark.parametrize("dotted,value,field", SPECULATORS_CASES, ids=[f"{c[0]}={c[1]!r}" for c in SPECULATORS_CASES])
def test_bad_speculators_config_values(good: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                       dotted: str, value: Any, field: str) -> None:
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(_with(json.loads((good / "config.json").read_text()), dotted, value)))
    code = main(_eval(good, tmp_path / "out", "--config", str(config_file)))
    _clear_error(code, capsys, str(config_file), field)
    assert not (tmp_path / "out" / "report.json").exists()


@pytest.mark.parametrize("dotted,value", [
    ("num_attention_heads", "abc"), ("rms_norm_eps", "abc"), ("eagle_config", "x"),
    ("eagle_config.eagle_aux_hidden_state_layer_ids", ["a"]), ("rope_theta", 0),
    ("rope_scaling", {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0}),
])
def test_bad_flat_config_values(tmp_path: Path, capsys: pytest.CaptureFixture, dotted: str, value: Any) -> None:
    ckpt = save(tmp_path / "flat", trained_weights(WELL_TRAINED), TRAINED, fmt="flat")
    (ckpt / "config.json").write_text(json.dumps(_with(json.loads((ckpt / "config.json").read_text()),
                                                      dotted, value)))
    code = main(_eval(ckpt, tmp_path / "out"))
    field = dotted if dotted != "rope_scaling" else "rope_scaling.factor"
    _clear_error(code, capsys, str(ckpt / "config.json"), field)


@pytest.mark.parametrize("args,flag", OPTION_CASES, ids=[" ".join(c[0]) for c in OPTION_CASES])
def test_out_of_range_options(good: Path, tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str],
                              flag: str) -> None:
    code = main(_eval(good, tmp_path / "out", *args))
    _clear_error(code, capsys, f"Field: {flag}", flag)


@pytest.mark.parametrize("content,field", [
    ({"layer_ids": ["a", 1, 2, 3, 4]}, "layer_ids"), ({"layer_ids": [-1, 1, 2, 3, 4], "final_slot": "x"}, "final_slot"),
    ({"layer_ids": [-1, 1, 2, 3, 4], "num_hidden_layers": 0}, "num_hidden_layers"),
    ({"layer_ids": [-1, 1, 2, 3, 4], "layer_id_convention": 5}, "layer_id_convention"),
    ({"layer_ids": [-3, 1, 2, 3, 4]}, "layer_ids"), ([1, 2], "data_config.json"),
])
def test_bad_data_config_values(tmp_path: Path, capsys: pytest.CaptureFixture, good: Path, content: Any,
                                field: str) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for i in range(4):
        (data / f"hs_{i}.safetensors").write_bytes((lab().data / f"hs_{i}.safetensors").read_bytes())
    (data / "data_config.json").write_text(json.dumps(content))
    args = _eval(good, tmp_path / "out")
    args[args.index("--data") + 1] = str(data)
    _clear_error(main(args), capsys, str(data / "data_config.json"), field)


def test_bad_verifier_config(tmp_path: Path, capsys: pytest.CaptureFixture, good: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (target / "model.safetensors").write_bytes((lab().target / "model.safetensors").read_bytes())
    (target / "config.json").write_text(json.dumps({"num_hidden_layers": "abc"}))
    args = _eval(good, tmp_path / "out")
    args[args.index("--verifier") + 1] = str(target)
    _clear_error(main(args), capsys, str(target / "config.json"), "num_hidden_layers")


@pytest.mark.parametrize("dotted,value,extra", [
    (f"{TLC}.num_attention_heads", "abc", []),
    (f"{TLC}.rope_parameters", LLAMA3_NO_FACTOR, []),
    (f"{TLC}.rms_norm_eps", 0.0, ["--steps", "1000"]),
])
def test_the_cli_process_exits_3_without_a_traceback(good: Path, tmp_path: Path, dotted: str, value: Any,
                                                     extra: list[str]) -> None:
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(_with(json.loads((good / "config.json").read_text()), dotted, value)))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "remote.drafter", *_eval(good, tmp_path / "out", "--config",
                                                                            str(config_file), *extra)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1 and "Fix:" in proc.stderr


def test_an_error_raised_mid_run_still_exits_3(good: Path, tmp_path: Path) -> None:
    """Dynamic rope beyond its length is refused at the first forward, while the loader thread is
    still reading ahead: the process must end with the clean exit, not abort (exit 134)."""
    config = json.loads((good / "config.json").read_text())
    config[TLC].update(rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0},
                       max_position_embeddings=8)
    (tmp_path / "config.json").write_text(json.dumps(config))
    args = _eval(good, tmp_path / "out", "--config", str(tmp_path / "config.json"), "--batch-tokens", "30")
    args[args.index("--limit"):args.index("--layout-samples") + 2] = ["--layout-samples", "192"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for _ in range(3):
        proc = subprocess.run([sys.executable, "-m", "remote.drafter", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 3 and "Dynamic-NTK" in proc.stderr, (proc.returncode, proc.stderr[-300:])
