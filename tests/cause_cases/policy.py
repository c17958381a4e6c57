"""Off-policy data (remote/drafter/causes/policy.py, speculators #725): the dumps hold text the target did
not write (a fifth of the tokens another writer's choices), with the target's own states on that text,
as dumping a dataset's original responses through the target gives."""
from __future__ import annotations

from pathlib import Path

import torch

from .healthy import Healthy, Variant

#: share of the lab text's tokens replaced by another writer's
REPLACED = 0.2


def off_policy_text(base: Healthy, out: Path) -> Variant:
    """The lab's text with every fifth token or so drawn uniformly from the draft vocabulary (so the draft
    vocabulary still covers the data), the lab target run over it for the states."""
    from tests.support.drafter_lab import SLOT_IDS, draft_vocab, lab, target_forward, target_weights

    the_lab = lab()
    keep, _ = draft_vocab(the_lab)
    gen = torch.Generator().manual_seed(7)
    ids = the_lab.ids.clone()
    swap = torch.rand(ids.shape, generator=gen) < REPLACED
    swap[:, : the_lab.spec.prompt_len] = False
    ids[swap] = keep[torch.randint(0, keep.numel(), (int(swap.sum()),), generator=gen)]
    with torch.no_grad():
        states, _ = target_forward(the_lab.spec, target_weights(the_lab.spec), ids)
    slots = states[:, :, [i + 1 for i in SLOT_IDS]]
    return Variant(base.draft, base.dumps_with(out / "data", ids, slots))

