"""SpecForge 0.2.0's and ModelOpt's own EAGLE-3 draft code, imported with only what their forward needs.

Both are installed ``--no-deps`` from the registry (requirements-parity.txt, scripts/setup.sh --test);
in CI a missing package is a failure, not a skip, as with speculators (tests/support/drafter_support.py).

* SpecForge imports cleanly with transformers alone (its heavy dependencies, sglang and flash-attn,
  are imported lazily or optionally). Its RMSNorm and rotary helpers are ``@torch.compile``d:
  ``eager()`` runs them uncompiled (CPU, no compiler needed, same arithmetic).
* ModelOpt's package ``__init__`` pulls its whole toolkit (requests, pulp, ...): the three modules an
  EAGLE-3 draft needs (``plugins/modeling_eagle.py``: EagleModule; ``utils.py``: the TTT mask;
  ``export/plugins/hf_spec_export.py``: the HF exporter with its config template) import only torch,
  transformers, huggingface_hub and safetensors, so they are loaded from their files by path.
"""
from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

SPECFORGE_VERSION = "0.2.0"
MODELOPT_VERSION = "0.47.0"


def _missing(what: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{what} is not installed (scripts/setup.sh --test installs it; see docs/drafter.md)")
    pytest.skip(f"{what} not installed")


def load_specforge() -> types.SimpleNamespace:
    """SpecForge's LlamaForCausalLMEagle3, its padding helper and both exporters."""
    if importlib.util.find_spec("specforge") is None or importlib.util.find_spec("transformers") is None:
        _missing(f"specforge=={SPECFORGE_VERSION} and transformers")
    assert importlib.metadata.version("specforge") == SPECFORGE_VERSION
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # "flash_attn is not found, falling back to flex_attention"
        from specforge.export.to_hf import export_to_hf
        from specforge.export.to_sglang import export_to_sglang
        from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3
        from specforge.utils import padding
    return types.SimpleNamespace(model=LlamaForCausalLMEagle3, padding=padding,
                                 export_to_sglang=export_to_sglang, export_to_hf=export_to_hf)


def load_modelopt() -> types.SimpleNamespace:
    """ModelOpt's EagleModule, get_ttt_msk_func and EagleExporter, loaded by path."""
    spec = importlib.util.find_spec("modelopt")
    if spec is None or not spec.submodule_search_locations or importlib.util.find_spec("transformers") is None:
        _missing(f"nvidia-modelopt=={MODELOPT_VERSION} and transformers")
    assert importlib.metadata.version("nvidia-modelopt") == MODELOPT_VERSION
    root = Path(next(iter(spec.submodule_search_locations))) / "torch"
    eagle = _by_path("_modelopt_peer.modeling_eagle", root / "speculative/plugins/modeling_eagle.py")
    utils = _by_path("_modelopt_peer.utils", root / "speculative/utils.py")
    export = _by_path("_modelopt_peer.hf_spec_export", root / "export/plugins/hf_spec_export.py")
    return types.SimpleNamespace(EagleModule=eagle.EagleModule, ttt_mask=utils.get_ttt_msk_func,
                                 EagleExporter=export.EagleExporter)


def _by_path(name: str, file: Path) -> Any:
    """Module ``name`` from ``file``, its relative imports resolved in ``file``'s folder."""
    if name in sys.modules:
        return sys.modules[name]
    package = name.rsplit(".", 1)[0]
    folder = str(file.parent)
    parent = sys.modules.get(package)
    if parent is None:
        parent = types.ModuleType(package)
        parent.__path__ = []
        sys.modules[package] = parent
    if folder not in parent.__path__:
        parent.__path__.append(folder)
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def eager() -> Iterator[None]:
    """Run ``@torch.compile``d helpers as plain Python (the same ops, no inductor build on CPU)."""
    import torch._dynamo

    with torch._dynamo.config.patch(disable=True):
        yield


def random_like(state: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """Random weights of every float tensor: norms around 1 (so a norm's weight matters), matrices
    scaled by 1/sqrt(fan-in)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in state.items():
        if not t.dtype.is_floating_point:
            continue
        scale = 0.1 if t.dim() == 1 else t.shape[-1] ** -0.5
        out[name] = torch.randn(t.shape, generator=gen) * scale + (1.0 if t.dim() == 1 else 0.0)
    return out
