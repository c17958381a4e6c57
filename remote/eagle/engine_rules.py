"""What a given engine *version* does with an EAGLE-3 draft config: how it turns the aux layer ids
into captured boundaries, the last boundary it can capture, and which of the draft's config keys it
reads. Data, read from the engines' own sources, so that the drafter's findings and ``invoke serve``
agree on it; convention.py holds the version-independent part. Stdlib only.

SGLang (``set_eagle3_layers_to_capture`` in ``srt/models/<target>.py``, wheels 0.4.6.post5-0.5.23,
../shared/reference/sglang-eagle3.md):

* up to 0.4.6 the setter takes no ids: the config's ids are ignored, the default is captured;
* Llama, Qwen and the rest add 1 to every id (output-of-layer ids -> loop index);
* DeepSeek V2/V3 (and Kimi through them) and GLM4-MoE-Lite from 0.5.13 (PR #25454) add 1 only
  when the first id is 1, else keep the ids as loop indices ("input-to-layer" ids);
* GPT-OSS from 0.5.20 keeps the ids when the largest is n (the final boundary), else adds 1;
* it captures inside the decoder loop, so boundary n (the final layer's output) is out of reach,
  except for GPT-OSS from 0.5.20, which also captures at ``end_layer``.

vLLM 0.32 (``model_executor/models/llama_eagle3.py``, ``transformers_utils/configs/speculators``)
passes ids through as boundaries 0..n and reads every norm key the drafter knows.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .convention import ENGINE_NAME, SGLANG, VLLM, default_boundaries

#: the drafter's findings about the config's aux layer ids (remote/drafter/causes/layer_ids.py): a
#: MISMATCH verdict tells their story, and new ids retire them until the draft is evaluated again
LAYER_FINDINGS = ("layer-convention-shift", "layer-ids-wrong", "ids-missing-engine-default",
                  "final-boundary-uncapturable")
#: the newest version whose sources were read: what a finding assumes without --engine-version
ASSUMED = {SGLANG: "0.5.23", VLLM: "0.32.0"}

PLUS1, FIRST_IS_1, KEEP_IF_FINAL, IGNORED, THROUGH = "plus1", "plus1-if-first-is-1", "keep-if-final", \
    "ignored", "through"
RULE_TEXT = {
    PLUS1: "adds 1 to every id (output of layer id -> the state before layer id+1)",
    FIRST_IS_1: "adds 1 only when the first id is 1 (PR #25454), else takes the ids as boundaries",
    KEEP_IF_FINAL: "keeps the ids as boundaries when the largest is the layer count, else adds 1",
    IGNORED: "ignores the config's ids (its setter takes none) and captures its default",
    THROUGH: "takes the ids as boundaries (the state after id layers)",
}
#: target model_type families whose SGLang setter has its own rule
_HEURISTIC_TYPES = ("deepseek_v2", "deepseek_v3", "kimi_k2", "kimi_k25", "glm4_moe_lite")
_GPT_OSS = ("gpt_oss",)


def parse(version: str | None) -> tuple[int, ...] | None:
    """``"0.5.13.post1"`` -> (0, 5, 13); None for None or a string without a leading number."""
    if not version:
        return None
    m = re.match(r"v?(\d+(?:\.\d+)*)", version.strip())
    return tuple(int(p) for p in m.group(1).split(".")) if m else None


def effective(engine: str, version: str | None) -> tuple[str, bool]:
    """(the version a rule is judged for, whether it was assumed because none was given)."""
    return (version, False) if version and parse(version) else (ASSUMED[engine], True)


def _at_least(version: str, floor: tuple[int, ...]) -> bool:
    v = parse(version) or ()
    return v[:len(floor)] >= floor


def id_rule(engine: str, version: str | None, model_type: str | None) -> str:
    """How ``engine`` at ``version`` turns configured ids into boundaries for a ``model_type`` target."""
    if engine == VLLM:
        return THROUGH
    v, _ = effective(engine, version)
    kind = (model_type or "").lower()
    if not _at_least(v, (0, 4, 10)):
        return IGNORED
    if kind in _HEURISTIC_TYPES and _at_least(v, (0, 5, 13)):
        return FIRST_IS_1
    if kind in _GPT_OSS and _at_least(v, (0, 5, 20)):
        return KEEP_IF_FINAL
    return PLUS1


def boundaries(rule: str, ids: list[int], num_layers: int) -> list[int]:
    """The boundaries a setter following ``rule`` captures for ``ids`` (ascending)."""
    if rule == IGNORED:
        return default_boundaries(num_layers)
    keep = rule == THROUGH or (rule == FIRST_IS_1 and ids[:1] != [1]) or (
        rule == KEEP_IF_FINAL and max(ids) == num_layers)
    return sorted(i if keep else i + 1 for i in ids)


def last_boundary(engine: str, version: str | None, model_type: str | None, num_layers: int) -> int:
    """The deepest boundary ``engine`` can capture: n for vLLM and GPT-OSS on SGLang >= 0.5.20, n-1 for
    the rest of SGLang (it captures at the top of the decoder loop, before layer i runs)."""
    return num_layers if id_rule(engine, version, model_type) in (THROUGH, KEEP_IF_FINAL) else num_layers - 1


def captures_embedding(engine: str, version: str | None, model_type: str | None) -> bool:
    """Whether stock ``engine`` feeds boundary 0 (the embedding, SGLang id -1) without draftops' capture
    patch: vLLM does; SGLang's Llama-style loop does from 0.5.22 (the layer-boundary refactor), the
    others (and older versions) crash on it or never match it."""
    if engine == VLLM:
        return True
    v, _ = effective(engine, version)
    return id_rule(engine, v, model_type) == PLUS1 and (model_type or "") not in _GPT_OSS and _at_least(v, (0, 5, 22))


@dataclass(frozen=True)
class KeyRead:
    """Whether an engine reads one draft-config key: from ``since`` on, or never (None)."""

    key: str
    since: tuple[int, ...] | None
    what: str  # what the key does in the draft


#: the draft-config keys that change the draft's forward, and from which version each engine reads them
KEYS: dict[str, tuple[KeyRead, ...]] = {
    SGLANG: (
        KeyRead("norm_before_residual", None, "the residual is the normed hidden (SGLang always adds the raw one)"),
        KeyRead("norm_before_fc", (0, 5, 20), "one RMSNorm (input_norm) over the aux features before fc"),
        KeyRead("fc_norm", (0, 5, 12), "one RMSNorm per aux slot before fc"),
        KeyRead("norm_output", (0, 5, 12), "the draft's next aux state is the normed hidden"),
    ),
    VLLM: (
        KeyRead("norm_before_residual", (0,), "the residual is the normed hidden"),
        KeyRead("norm_before_fc", (0,), "one RMSNorm (input_norm) over the aux features before fc"),
        KeyRead("fc_norm", (0,), "one RMSNorm per aux slot before fc"),
        KeyRead("norm_output", (0,), "the draft's next aux state is the normed hidden"),
    ),
}


def ignored_keys(engine: str, version: str | None, set_keys: list[str]) -> list[KeyRead]:
    """The keys among ``set_keys`` (true in the draft) that ``engine`` at ``version`` does not read."""
    v, _ = effective(engine, version)
    return [k for k in KEYS[engine] if k.key in set_keys and (k.since is None or not _at_least(v, k.since))]


def since_text(key: KeyRead, engine: str) -> str:
    """"SGLang reads norm_before_fc from 0.5.20" or "no SGLang version up to 0.5.23 reads ..."."""
    name = ENGINE_NAME[engine]
    if key.since is None:
        return f"no {name} version up to {ASSUMED[engine]} reads {key.key}"
    return f"{name} reads {key.key} from {'.'.join(map(str, key.since))}"
