"""Which config field each serving engine reads for an EAGLE-3 draft's aux layer ids, and what it captures.

One implementation for every tool that reasons about serving: the drafter report's
``serving_convention`` and ``invoke serve``'s range check both use it. Stdlib only.

Everything is expressed in *boundaries*: boundary k is the target's residual stream after k decoder
layers (0 = the embedding output, k = the input of layer k), so a target with n layers has
boundaries 0..n.

* SGLang reads only ``eagle_config.eagle_aux_hidden_state_layer_ids``, as "output of layer id":
  it captures boundary id + 1 (before layer id + 1 runs), so ids -1 .. n-2 are usable and -1 (the
  embedding) needs draftops' capture patch. A missing or null field (including ids placed at the top
  level) silently gives the default boundaries [2, n//2, n-3].
* vLLM reads the top-level ``eagle_aux_hidden_state_layer_ids`` first, then the one in
  ``eagle_config``, as "after k layers": it captures boundary id. vLLM 0.32's models capture the
  embedding and the output of every layer (``_maybe_add_hidden_state``), so ids 0 .. n are usable.
  Absent: the same default [2, n//2, n-3].
* A config's format says which convention its ids were written in: a flat
  (``LlamaForCausalLMEagle3``) config is SGLang's, a speculators config is vLLM's. So are the
  drafter's trainer layouts (``remote/drafter/load/draftformat.py``): SpecForge's exports (flat),
  ModelOpt's HF export (``modelopt``: it captures the output of layer id, SGLang's reading) and the
  EAGLE repository's checkpoints (``eagle``: no ids, the engines' default) are SGLang's.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .formats import IDS_KEY, NESTED_FIELD, SPECULATORS, field_value, is_int

SGLANG, VLLM = "sglang", "vllm"
ENGINES = (SGLANG, VLLM)
ENGINE_NAME = {SGLANG: "SGLang", VLLM: "vLLM"}
#: the fields each engine looks at, in the order it looks
READS = {SGLANG: (NESTED_FIELD,), VLLM: (IDS_KEY, NESTED_FIELD)}
#: boundary = id + OFFSET[engine]
OFFSET = {SGLANG: 1, VLLM: 0}
#: the last boundary an engine captures is n + LAST[engine] (SGLang captures inside its layer loop)
LAST = {SGLANG: -1, VLLM: 0}
CONVENTION_TEXT = {SGLANG: "output of layer id, -1 = the embedding (captures boundary id+1)",
                   VLLM: "state after id layers, 0 = the embedding (captures boundary id)"}


def serving_convention(fmt: str) -> str:
    """The engine whose convention a config of format ``fmt`` is written in: vLLM for "speculators",
    SGLang for "flat" and the drafter's other layouts ("modelopt", "eagle")."""
    return VLLM if fmt == SPECULATORS else SGLANG


def fix_task(engine: str | None, fmt: str | None) -> str:
    """The draftops task that applies a layer-id fix for a draft of format ``fmt`` served by ``engine``:
    ``draft-config`` rewrites the config in place, but SGLang never reads a speculators config's field,
    so where SGLang serves one the fix is a flat-format copy (``draft-flat``)."""
    return "draft-flat" if engine == SGLANG and fmt == SPECULATORS else "draft-config"


#: the name of each convention, as a screen writes it beside (or above) its id lists
NAMED = {SGLANG: "SGLang ids: -1 = embedding", VLLM: "vLLM ids: 0 = embedding"}


def ids_text(ids: Sequence[int | None] | None, engine: str | None) -> str:
    """Layer ids with the engine convention they are written in, named beside them: the one way every
    screen writes an id list (SGLang's and vLLM's ids of one layer differ by one)."""
    if ids is None:
        return "—"
    return f"{list(ids)} ({NAMED.get(engine or '', 'convention unknown')})"


def boundaries_text(boundaries: Sequence[int | None] | None, engine: str) -> str:
    """Boundaries (the states after k layers) written in ``engine``'s own ids, the convention named."""
    if boundaries is None:
        return ids_text(None, engine)
    return ids_text([None if b is None else b - OFFSET[engine] for b in boundaries], engine)


def convert(ids: list[int], source: str, dest: str) -> list[int]:
    """``ids`` written in engine ``source``'s convention, rewritten in ``dest``'s (same order)."""
    return [i + OFFSET[source] - OFFSET[dest] for i in ids]


def sglang_to_file(fmt: str, sglang_ids: list[int]) -> list[int]:
    """SGLang-convention ids as a config of format ``fmt`` stores them (same order)."""
    return convert(sglang_ids, SGLANG, serving_convention(fmt))


def draft_algorithm(config: dict[str, Any]) -> str | None:
    """"eagle3", "eagle" (EAGLE-1/2) or another speculators type the draft config declares; None if unknown.

    A flat draft must say so in ``architectures`` (``LlamaForCausalLMEagle3``): SGLang and vLLM pick
    the draft model class from it, and an EAGLE-3 draft loaded by the EAGLE algorithm silently skips
    its fc layer (accept length 1.0)."""
    declared = config.get("speculators_model_type")
    if isinstance(declared, str):
        return declared.lower()
    archs = [str(a).lower() for a in config.get("architectures") or [] if isinstance(a, str)]
    if any("eagle3" in a for a in archs):
        return "eagle3"
    if any("eagle" in a for a in archs):
        return "eagle"
    return None


def default_boundaries(num_layers: int) -> list[int]:
    """What both engines capture when the draft config has no ids: after layers 2, n//2 and n-3."""
    return [2, num_layers // 2, num_layers - 3]


def default_ids(engine: str, num_layers: int) -> list[int]:
    """The engines' default capture written as ``engine``'s ids (SGLang: [1, n//2-1, n-4])."""
    return from_boundaries(engine, default_boundaries(num_layers))


def to_boundaries(engine: str, ids: list[int]) -> list[int]:
    """Boundaries ``engine`` captures for ``ids`` read in its own convention (ascending)."""
    return sorted(i + OFFSET[engine] for i in ids)


def from_boundaries(engine: str, boundaries: list[int]) -> list[int]:
    """The ids to write so that ``engine`` captures ``boundaries``."""
    return [b - OFFSET[engine] for b in sorted(boundaries)]


def usable_ids(engine: str, num_layers: int) -> tuple[int, int]:
    """Lowest and highest id ``engine`` can capture on a target of ``num_layers`` layers."""
    return -OFFSET[engine], num_layers + LAST[engine] - OFFSET[engine]


@dataclass(frozen=True)
class Reading:
    """What one engine makes of a draft config's aux layer ids."""

    engine: str
    format: str
    field: str | None            # the field the ids came from; None when the engine fell back
    ids: list[int] | None        # as written in that field
    boundaries: list[int] | None  # what the engine captures (None: layer count unknown)
    fallback: bool               # True when the engine uses its default
    out_of_range: list[int]      # ids outside usable_ids(engine, n)
    ignored: dict[str, list[int]]  # fields holding ids that this engine does not read
    malformed: dict[str, Any]    # fields the engine reads that hold something other than int ids

    @property
    def needs_embedding(self) -> bool:
        """Boundary 0 (the embedding output): SGLang needs draftops' capture patch for it."""
        return bool(self.boundaries) and 0 in (self.boundaries or [])

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "needs_embedding": self.needs_embedding}


def _int_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(is_int(v) for v in value)


def read(engine: str, config: dict[str, Any], fmt: str, num_layers: int | None) -> Reading:
    """The ids ``engine`` reads from ``config`` (format ``fmt``) and what it captures on the target."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}")
    found_field, ids = None, None
    malformed: dict[str, Any] = {}
    for field in READS[engine]:
        value = field_value(config, field)
        if _int_list(value):
            found_field, ids = field, list(value)
            break
        if value is not None and not (engine == VLLM and value == []):   # vLLM: `if not layer_ids`
            malformed[field] = value
    ignored = {}
    for field in (IDS_KEY, NESTED_FIELD):
        value = field_value(config, field)
        if field != found_field and _int_list(value):
            ignored[field] = list(value)
    if ids is None:
        boundaries = default_boundaries(num_layers) if num_layers else None
        return Reading(engine, fmt, None, None, boundaries, True, [], ignored, malformed)
    bad: list[int] = []
    if num_layers is not None:
        low, high = usable_ids(engine, num_layers)
        bad = [i for i in ids if i < low or i > high]
    return Reading(engine, fmt, found_field, ids, to_boundaries(engine, ids), False, bad, ignored,
                   malformed)


def explain(reading: Reading, num_layers: int | None) -> str:
    """One paragraph: the field the engine reads, the ids it finds there, and what it captures."""
    name = ENGINE_NAME[reading.engine]
    reads = " then ".join(f"`{f}`" for f in READS[reading.engine])
    default = (boundaries_text(default_boundaries(num_layers), reading.engine) if num_layers
               else "after layers [2, n//2, n-3]")
    if reading.fallback:
        text = (f"{name} reads {reads}; this draft config has no ids there, so {name} silently falls "
                f"back to its default and captures layers {default}.")
    else:
        text = (f"{name} reads {reads} and finds {reading.ids} in `{reading.field}`, read as "
                f"{CONVENTION_TEXT[reading.engine]}: it captures layers "
                f"{boundaries_text(reading.boundaries or [], reading.engine)}.")
    for field, ids in reading.ignored.items():
        text += f" The ids {ids} in `{field}` are not read by {name}."
    native = serving_convention(reading.format)
    if native != reading.engine and not reading.fallback:
        shifted = to_boundaries(native, reading.ids or [])
        if shifted != reading.boundaries:
            text += (f" A {reading.format} config stores ids in {ENGINE_NAME[native]}'s convention, where "
                     f"the same numbers mean layers {boundaries_text(shifted, reading.engine)}: check which layers the "
                     "draft was trained on (`invoke test-drafter`).")
    return text
