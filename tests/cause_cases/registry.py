"""Every cause case: its name, the finding ids it must produce (exactly, in report order), and its
builder.  One line per case; a new cause family adds its builders in a module of its own here."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import engine, head, policy, positions_vocab, rotation, states, usage, vocab
from .healthy import Healthy, Variant


def _healthy(base: Healthy, out: Path) -> Variant:
    return base.variant()


@dataclass(frozen=True)
class Case:
    name: str
    findings: tuple[str, ...]  # the finding ids the case's report must hold, exactly, in order
    build: Callable[[Healthy, Path], Variant]  # writes the case's folders under the given folder


CASES: tuple[Case, ...] = (
    Case("healthy", (), _healthy),
    Case("vocab-map-identity-zeros", ("vocab-map-identity",), vocab.identity_zeros),
    Case("vocab-map-identity-arange", ("vocab-map-identity",), vocab.identity_arange),
    Case("vocab-map-coverage", ("vocab-map-coverage",), vocab.coverage),
    Case("vocab-map-missing", ("vocab-map-missing",), vocab.missing_d2t),
    Case("vocab-map-differs", ("vocab-map-differs",), vocab.differs_from_data_map),
    Case("embedding-scale-dumps", ("embedding-scale",), states.embedding_scale_dumps),
    Case("embedding-scale-draft", ("embedding-scale",), states.embedding_scale_draft),
    Case("target-differs", ("target-differs",), states.target_differs),
    Case("target-differs-measured", ("target-differs",), states.target_differs_measured),
    Case("layer-convention-shift", ("layer-convention-shift",), engine.sglang_ids_in_a_speculators_config),
    Case("layer-ids-wrong", ("layer-ids-wrong",), engine.wrong_ids),
    Case("ids-missing-engine-default", ("ids-missing-engine-default",), engine.ids_missing),
    Case("algorithm-eagle-in-config", ("algorithm-eagle-not-eagle3",), engine.algorithm_eagle_in_config),
    Case("algorithm-eagle-at-launch", ("algorithm-eagle-not-eagle3",), engine.algorithm_eagle_at_launch),
    Case("config-key-ignored", ("config-key-ignored",), engine.key_sglang_ignores),
    Case("chat-template-raw-dumps", ("chat-template",), usage.chat_template_raw),
    Case("undertrained", ("undertrained",), usage.undertrained),
    Case("rope-differs", ("rope-differs",), positions_vocab.rope_differs),
    Case("context-beyond-training", ("context-beyond-training",), positions_vocab.context_beyond_training),
    Case("vocab-size-mismatch", ("vocab-size-mismatch",), positions_vocab.vocab_size_mismatch),
    Case("multi-layer-draft", ("multi-layer-draft",), positions_vocab.multi_layer_draft),
    Case("engine-known-regression", ("engine-known-regression",), positions_vocab.engine_known_regression),
    Case("off-policy-data", ("off-policy-data",), policy.off_policy_text),
    Case("target-rotated", ("target-rotated",), rotation.rotated_engine),
    Case("draft-head-replaced", ("draft-head-replaced",), head.embedding_replaced),
    Case("draft-kv-dtype", ("draft-kv-dtype",), head.fp8_kv_inherited),
)


def by_name(name: str) -> Case:
    return next(c for c in CASES if c.name == name)
