"""A target served in a rotated basis (remote/drafter/causes/rotation.py; QuaRot, vllm-ascend #5974): the
capture check's engine states are the lab target's states times one random orthogonal matrix at every
boundary, as a rotation-quantized target computes them; the dumps are the unrotated target's."""
from __future__ import annotations

from pathlib import Path

import torch

from remote.capture.engine_states import Keeper

from .healthy import Healthy, Variant

#: engine-state samples the case keeps (a capture check sends 24 by default)
SAMPLES = 24


def engine_states(out: Path, rotation: torch.Tensor | None) -> Path:
    """The lab target's states at every boundary for the first SAMPLES dump samples, as the capture
    check keeps them (``hs_{i}.safetensors`` + data_config.json), right-multiplied by ``rotation``."""
    from tests.support.drafter_lab import lab

    the_lab = lab()
    keeper = Keeper(out / "engine-states", the_lab.spec.layers)
    for i in range(SAMPLES):
        states = the_lab.states[i]
        keeper.add(i, the_lab.ids[i], states @ rotation if rotation is not None else states)
    keeper.finish()
    return keeper.folder


def rotated_engine(base: Healthy, out: Path) -> Variant:
    """The served target rotates its residual stream by a random orthogonal Q (norms kept exactly)."""
    from tests.support.drafter_lab import lab

    h = lab().spec.hidden
    q, _ = torch.linalg.qr(torch.randn(h, h, generator=torch.Generator().manual_seed(17)))
    return Variant(base.draft, options={"engine_states": engine_states(out, q)})
