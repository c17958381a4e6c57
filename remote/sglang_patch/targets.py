"""The SGLang files the patcher knows, and the model names users may select them by.

Model files hold the capture setter (``*ForCausalLM.set_eagle3_layers_to_capture``) and the capture
site (``*Model.forward``); runner files hold the no-argument setter calls that, up to SGLang 0.5.10,
replace the configured ids by the defaults on the CUDA-graph path. Extend ``TARGETS`` to cover
another model file: the analysis is anchored on class and function names, not on the file.
"""
from __future__ import annotations

from dataclasses import dataclass

MODEL = "model"
RUNNER = "runner"


@dataclass(frozen=True)
class Target:
    """One file relative to the ``sglang/`` package folder."""

    rel: str
    model: str
    kind: str
    serves: str = ""


TARGETS: tuple[Target, ...] = (
    Target("srt/models/deepseek_v2.py", "deepseek_v2", MODEL,
           "DeepSeek V2/V3, Kimi K2/K2.5 (via DeepseekV3ForCausalLM)"),
    Target("srt/models/llama.py", "llama", MODEL, "Llama 2/3"),
    Target("srt/models/qwen2.py", "qwen2", MODEL, "Qwen2/Qwen2.5"),
    Target("srt/models/qwen3.py", "qwen3", MODEL, "Qwen3 (dense)"),
    Target("srt/model_executor/cuda_graph_runner.py", "all", RUNNER, "CUDA-graph capture"),
    Target("srt/model_executor/model_runner.py", "all", RUNNER, "model runner warm-up"),
)

#: names accepted by ``--models`` besides the model keys themselves
ALIASES: dict[str, str] = {
    "deepseek": "deepseek_v2",
    "deepseek_v3": "deepseek_v2",
    "kimi": "deepseek_v2",
    "kimi_k2": "deepseek_v2",
    "kimi_k25": "deepseek_v2",
}

#: target ``architectures`` entries (HF config) mapped to the model file that serves them
ARCHITECTURES: dict[str, str] = {
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v2",
    "KimiK25ForConditionalGeneration": "deepseek_v2",
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


def model_keys() -> list[str]:
    """Model keys of the model files, in catalogue order."""
    return [t.model for t in TARGETS if t.kind == MODEL]


def resolve_models(names: list[str] | None) -> list[str]:
    """Canonical model keys for ``--models`` values; None means every model file."""
    if not names:
        return model_keys()
    known = model_keys()
    out: list[str] = []
    for raw in names:
        key = ALIASES.get(raw.strip().lower(), raw.strip().lower())
        if key not in known:
            raise ValueError(
                f"unknown model {raw!r}: choose from {', '.join(known + sorted(ALIASES))}"
            )
        if key not in out:
            out.append(key)
    return out
