"""``vocab-size-mismatch``: the draft's vocabulary sizes disagree with each other. The weights
(the lm_head's rows, the ``d2t`` length and ``t2d``'s true entries, which the loader holds equal)
are what the draft was trained with; the engines size the draft's lm_head and its map from the
config's ``draft_vocab_size`` (vLLM and SGLang's ``llama_eagle3``), and the target side from its
``vocab_size`` / ``t2d``'s length. A config written for another vocabulary, or a cached map reused
after ``draft_vocab_size`` changed (SpecForge PR #602: the mapping cache was keyed on the data
alone), leaves them apart: the server refuses the checkpoint, or drafts through the wrong rows."""
from __future__ import annotations

import shlex
from typing import Any

from . import draft_fields
from .facts import Facts

ID = "vocab-size-mismatch"


def _sizes(facts: Facts) -> dict[str, tuple[str, int | None]]:
    """Each size, by what it is, with where it was read."""
    arch, info = facts.ctx.draft.arch, facts.ctx.info
    fields = draft_fields.read(facts)
    vmap = info.vocab_map
    verifier = facts.ctx.verifier
    embed_rows = None
    if verifier is not None and verifier.embed_name is not None:
        shape = verifier.store.shape(verifier.embed_name)
        embed_rows = int(shape[0]) if len(shape) == 2 else None
    return {
        "draft_config": ("draft_vocab_size in the draft config", fields.draft_vocab_size),
        "lm_head_rows": ("the draft lm_head's rows", arch.draft_vocab_size),
        "d2t_length": ("d2t's length", vmap.draft_vocab if vmap is not None and vmap.stored else None),
        "config_vocab": (f"{fields.prefix}vocab_size in the draft config", fields.vocab_size),
        "t2d_length": ("the draft's target vocabulary (its embed_tokens rows, else t2d's length)", arch.vocab_size),
        "target_vocab": ("the target embedding's rows", embed_rows),
    }


def check(facts: Facts) -> list[dict[str, Any]]:
    sizes = _sizes(facts)
    draft_side = ("draft_config", "lm_head_rows", "d2t_length")
    target_side = ("config_vocab", "t2d_length", "target_vocab")
    apart = [side for side in (draft_side, target_side)
             if len({sizes[k][1] for k in side if sizes[k][1] is not None}) > 1]
    if not apart:
        return []
    fields = draft_fields.read(facts)
    listed = "; ".join(", ".join(f"{sizes[k][0]} {sizes[k][1]:,}" for k in side if sizes[k][1] is not None)
                       for side in apart)
    trained = sizes["lm_head_rows"][1]
    text = (f"The draft's vocabulary sizes disagree ({listed}): the engine sizes the draft's lm_head and "
            f"d2t from draft_vocab_size and the target vocabulary from vocab_size, so it refuses the "
            f"checkpoint or drafts through a map of the wrong size (SpecForge PR #602: a cached vocab mapping "
            f"reused after draft_vocab_size changed); the weights were trained with {trained:,} draft tokens.")
    fixes = []
    if draft_side in apart:
        fixes.append(f"set draft_vocab_size to {trained} in {shlex.quote(fields.path)} (the lm_head's rows), or, "
                     "if the trainer's draft_vocab_size was meant, rebuild the vocab mapping for it (delete the "
                     "trainer's cached mapping) and retrain")
    if target_side in apart:
        want = sizes["target_vocab"][1] or sizes["t2d_length"][1]
        fixes.append(f"set {fields.prefix}vocab_size to {want} (the target's vocabulary) in "
                     f"{shlex.quote(fields.path)}")
    fix = "; ".join(fixes)
    evidence = {key: value for key, (_, value) in sizes.items()}
    return [{"id": ID, "severity": "bad", "text": text, "evidence": evidence, "fix": fix[0].upper() + fix[1:] + "."}]
