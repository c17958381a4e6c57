"""Engine causes (failure-modes.md #1-#4; remote/drafter/causes/layer_ids.py, algorithm.py,
config_keys.py): the healthy draft's config as a real mistake leaves it, or a launch, or a draft
trained with a key the engine ignores. The healthy draft is a speculators config, read by vLLM, whose
top-level ids are boundaries (0 = the embedding): it was trained on boundaries [0, 2, 3]."""
from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from remote.drafter.demo import train
from remote.drafter.demo.build import save_draft
from remote.drafter.model.layers import Weights
from remote.eagle.formats import IDS_KEY

from .healthy import Healthy, Variant


def _config(base: Healthy, out: Path, edit: Any) -> Variant:
    return Variant(base.draft_with(out / "draft", lambda w: None, edit))


def sglang_ids_in_a_speculators_config(base: Healthy, out: Path) -> Variant:
    """The trainer wrote SGLang's output-of-layer ids [-1, 1, 2] where vLLM reads boundaries: vLLM
    feeds [-1, 1, 2] (the +1 convention would give the trained [0, 2, 3])."""
    def edit(cfg: dict[str, Any]) -> None:
        cfg[IDS_KEY] = [-1, 1, 2]
    return _config(base, out, edit)


def wrong_ids(base: Healthy, out: Path) -> Variant:
    """Boundaries [0, 2, 5]: the final layer's output in place of layer 2's; no convention explains it."""
    def edit(cfg: dict[str, Any]) -> None:
        cfg[IDS_KEY] = [0, 2, 5]
    return _config(base, out, edit)


def ids_missing(base: Healthy, out: Path) -> Variant:
    """No ids: vLLM captures its default [2, n//2, n-3] = [2, 2, 2] of the 5-layer lab target."""
    def edit(cfg: dict[str, Any]) -> None:
        del cfg[IDS_KEY]
    return _config(base, out, edit)


def algorithm_eagle_in_config(base: Healthy, out: Path) -> Variant:
    """speculators_config.algorithm "eagle" on an EAGLE-3 draft (SGLang #21272)."""
    def edit(cfg: dict[str, Any]) -> None:
        cfg["speculators_config"]["algorithm"] = "eagle"
    return _config(base, out, edit)


def algorithm_eagle_at_launch(base: Healthy, out: Path) -> Variant:
    """A serve profile launching --speculative-algorithm EAGLE (what test-drafter passes along)."""
    return Variant(base.draft, options={"serve_algorithm": "EAGLE"})


@functools.lru_cache(maxsize=1)
def residual_normed() -> Weights:
    """A lab draft trained with norm_before_residual=true on the healthy layers, cached on disk as the
    lab's drafts are (tests/support/drafter_lab.py)."""
    from tests.support import drafter_lab as L

    cached = L.CACHE / f"norm-before-residual-{L.cache_key('norm_before_residual', L.WELL_TRAINED)}.safetensors"
    if cached.is_file():
        return load_file(str(cached))
    the_lab = L.lab()
    spec = the_lab.spec
    keep, to_draft = L.draft_vocab(the_lab)
    arch = dataclasses.replace(L.draft_arch(spec), norm_before_residual=True)
    gen = torch.Generator().manual_seed(5)
    target = L.target_weights(spec)
    w = train.init_draft(arch, target["model.embed_tokens.weight"], target["lm_head.weight"][keep],
                         keep - torch.arange(spec.draft_vocab), gen)
    aux = the_lab.slots()[:, :-1, [L.SLOT_IDS.index(i) for i in L.TRAINED]].flatten(2)
    train.fit(arch, w, aux, the_lab.ids[:, 1:], to_draft[the_lab.logits[:, 1:].argmax(-1)], 3, L.WELL_TRAINED,
              32, 5e-3, gen)
    w["t2d"] = to_draft >= 0
    w = {k: v.detach().contiguous() for k, v in w.items()}
    L.CACHE.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".{os.getpid()}.tmp")
    save_file(w, str(tmp))
    os.replace(tmp, cached)
    return w


def save_residual_normed(out: Path, fmt: str) -> Path:
    """That draft in ``fmt`` with norm_before_residual true in its config (the flat writer omits it)."""
    import json

    from tests.support.drafter_lab import TRAINED, draft_arch, lab

    arch = dataclasses.replace(draft_arch(lab().spec), norm_before_residual=True)
    save_draft(out, residual_normed(), arch, TRAINED, fmt)
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, "norm_before_residual": True}))
    return out


def key_sglang_ignores(base: Healthy, out: Path) -> Variant:
    """Trained with norm_before_residual, served by SGLang (which never reads it): a flat config, the
    one SGLang reads its ids from."""
    return Variant(save_residual_normed(out / "draft", "flat"), options={"engine": "sglang",
                                                                        "engine_version": "0.5.23"})
