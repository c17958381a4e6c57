"""Drafts and targets on disk for the draft-config tests, and the tool run as the host runs it."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.sglang_wheels import REPO

HIDDEN = 16


FLAT_CONFIG = {
    "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": HIDDEN,
    "num_hidden_layers": 1, "vocab_size": 1000, "draft_vocab_size": 100,
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 29, 57], "use_aux_hidden_state": True},
}


def write_safetensors(path: Path, tensors: dict[str, list[int]]) -> None:
    """A valid F32 safetensors file of zeros with the given tensor shapes."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in tensors.items():
        size = 4
        for dim in shape:
            size *= dim
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(offset))


def make_ckpt(folder: Path, config: dict[str, Any], aux: int = 3, sharded: bool = False) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config, indent=4) + "\n")
    tensors = {"fc.weight": [HIDDEN, aux * HIDDEN], "norm.weight": [HIDDEN]}
    if sharded:
        write_safetensors(folder / "model-00001-of-00002.safetensors", {"norm.weight": [HIDDEN]})
        write_safetensors(folder / "model-00002-of-00002.safetensors",
                          {"fc.weight": tensors["fc.weight"]})
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
            "norm.weight": "model-00001-of-00002.safetensors",
            "fc.weight": "model-00002-of-00002.safetensors"}}))
    else:
        write_safetensors(folder / "model.safetensors", tensors)
    return folder


def make_target(folder: Path, layers: int = 61, nested: bool = False,
                arch: str = "DeepseekV3ForCausalLM") -> Path:
    folder.mkdir(parents=True)
    body = {"num_hidden_layers": layers, "hidden_size": HIDDEN}
    config = ({"architectures": ["KimiK25ForConditionalGeneration"], "text_config": body}
              if nested else {"architectures": [arch], **body})
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def run_cli(*args: str, out: Path, env: dict[str, str] | None = None,
            pythonpath: Path | None = None) -> tuple[subprocess.CompletedProcess[str], dict]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTOPS_")}
    full_env.update(env or {})
    if pythonpath is not None:
        full_env["PYTHONPATH"] = str(pythonpath)
    proc = subprocess.run([sys.executable, "-m", "remote.draft_config", *args, "--out", str(out)],
                          cwd=REPO, env=full_env, capture_output=True, text=True, timeout=120)
    return proc, json.loads((out / "draft_config.json").read_text())
