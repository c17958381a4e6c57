"""The draft's config.json, read and validated in one place.

The weights decide the structure (checkpoint.py); the config supplies what they cannot show
(heads, eps, rope, the norm flags, the aux layer ids).  Every such value is checked here for type
and range, so a bad one ends as one ConfigError naming the file, the field and the fix, instead of
a traceback or a silent NaN deep in the forward pass.

The formats, their detection, the ids fields and which engine reads which field are
``remote.eagle``'s (one rule for the evaluator, draft-config and serve inspect). The configured ids
are the ones the format's own engine reads (SGLang for flat: ``eagle_config`` only; vLLM for
speculators: top level, then ``eagle_config``); ids in a field that engine ignores are checked all
the same, since the other engine may read them, and reported as a warning.
Absent values get transformers' LlamaConfig defaults, as speculators does.
"""
from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import jsonread
from ...eagle import convention, formats
from ...eagle.formats import EAGLE_CONFIG, IDS_KEY, LAYER_CONFIG, SPECULATORS
from ..errors import ConfigError, UnsupportedError
from ..model.rope import SUPPORTED_TYPES, RopeSpec

DEFAULT_HEADS = 32  # transformers LlamaConfig
DEFAULT_EPS = 1e-6
LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass(frozen=True)
class DraftConfig:
    """The validated values the loader takes from the config (None: absent, the weights decide)."""

    path: Path
    format: str
    layer_ids: list[int] | None
    layer_ids_key: str | None
    unread_ids: dict[str, list[int]]   # ids in fields the format's own engine does not read
    ids_by_engine: dict[str, list[int] | None]   # the ids each engine reads (None: it uses its default)
    hidden_size: int | None
    target_hidden_size: int | None
    num_attention_heads: int | None
    head_dim: int | None
    hidden_act: str
    rms_norm_eps: float
    rope: RopeSpec
    layer_types: tuple[str, ...]
    sliding_window: int | None
    vocab_size: int | None
    norm_before_fc: bool
    norm_before_residual: bool
    norm_output: bool
    algorithm: str | None = None   # "eagle3", "eagle" (EAGLE-1/2) ...: what the config declares (None: nothing)
    algorithm_source: str = ""     # the field and value that declare it, for messages

    def layer_field(self, key: str) -> str:
        """The dotted name of a decoder-layer field in this config's format (for error messages)."""
        return formats.layer_prefix(self.format) + key


def read(path: Path, config_file: str | Path | None = None) -> DraftConfig:
    """Read and validate ``config_file``, else ``path/config.json``."""
    raw, cfg_path = read_json(path, config_file)
    return parse(raw, cfg_path)


def read_json(path: Path, config_file: str | Path | None) -> tuple[dict[str, Any], Path]:
    """The JSON object of the draft config and where it came from."""
    cfg_path = locate(path, config_file)
    return json_object(cfg_path, "The draft config", "repair it or pass --config with a good copy"), cfg_path


def locate(path: Path, config_file: str | Path | None) -> Path:
    """Where the draft config is (``config_file``, else ``config.json`` in the draft's folder); a missing
    one is a ConfigError that says what a draft folder holds. Checked before anything is loaded."""
    if not config_file and not path.exists():
        raise ConfigError("The draft checkpoint does not exist", path=path,
                          fix="pass --ckpt with the draft's folder (config.json and its .safetensors) or one "
                              "of its weight files; on a remote host the path is the host's")
    cfg_path = Path(config_file) if config_file else (path / "config.json" if path.is_dir()
                                                      else path.parent / "config.json")
    if config_file and not cfg_path.exists():
        raise ConfigError("The --config file does not exist", path=cfg_path, field="--config",
                          fix="check the path (on a remote host it is the host's), or leave --config out to "
                              "read config.json in the draft's folder")
    if not cfg_path.exists() and not cfg_path.is_symlink():
        raise ConfigError(
            "This is not a draft checkpoint folder: it has no config.json", path=cfg_path.parent,
            expected=DRAFT_FOLDER, found=_listing(cfg_path.parent),
            fix="point --ckpt at the draft's own folder (the one the trainer saved, or draft-config and "
                "draft-flat wrote); a config saved under another name is given with --config FILE")
    return cfg_path


#: what a draft checkpoint folder holds (the text of a folder that is not one)
DRAFT_FOLDER = ("config.json (an EAGLE-3 draft config: speculators or flat format) beside model.safetensors, "
                "or its shards with model.safetensors.index.json (or the EAGLE repository's pytorch_model.bin)")


def _listing(folder: Path, most: int = 6) -> str:
    """A few names in ``folder``, for an error (bounded: a folder of millions is not listed whole)."""
    try:
        names = sorted(itertools.islice((p.name for p in folder.iterdir()), 200))
    except OSError as exc:
        return f"a folder that cannot be listed ({exc.strerror})"
    if not names:
        return "an empty folder"
    more = f" and more ({len(names)}{'+' if len(names) == 200 else ''} entries)" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def json_object(file: Path, what: str, fix: str) -> dict[str, Any]:
    """The JSON object in ``file``; anything else (unreadable, not a regular file, too large, not JSON, a
    list) is a ConfigError."""
    try:
        cfg = jsonread.load(file)
    except (jsonread.NotRegular, jsonread.TooLarge) as exc:
        raise ConfigError(f"{what} is refused: {exc}", path=file, fix=fix) from exc
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{what} is not valid JSON ({exc})", path=file, fix=fix) from exc
    if not isinstance(cfg, dict):
        raise ConfigError(f"{what} is not a JSON object", path=file, found=type(cfg).__name__, fix=fix)
    return cfg


def detect_format(cfg: dict[str, Any], cfg_path: Path) -> str:
    """``remote.eagle.formats.detect``; a config in neither format is a ConfigError."""
    fmt = formats.detect(cfg)
    if fmt is None:
        raise ConfigError(
            f"The config is not an EAGLE-3 draft config: {formats.NOT_A_DRAFT}", path=cfg_path,
            expected=f"'speculators_model_type', '{EAGLE_CONFIG}' or '{IDS_KEY}' at top level",
            found=sorted(cfg)[:8],
            fix="point --ckpt at the draft checkpoint, not the target, or pass --config with the draft's "
                "own config.json",
        )
    return fmt


def parse(cfg: dict[str, Any], cfg_path: Path, layout: str | None = None) -> DraftConfig:
    """Validate every field the drafter reads; the first bad one raises ConfigError. ``layout``: the
    one ``draftformat.detect`` found from config and weights (None: from the config alone); every
    layout but speculators keeps the decoder fields at the top level."""
    fmt = layout or detect_format(cfg, cfg_path)
    top = Fields(cfg, cfg_path, "")
    if fmt == SPECULATORS:
        tlc = top.mapping(LAYER_CONFIG)
        layer = Fields(tlc, cfg_path, formats.layer_prefix(fmt))
    else:
        layer = top
    ids, key, unread, by_engine = _layer_ids(top, fmt)
    act = layer.text("hidden_act") or "silu"
    if act != "silu":
        raise UnsupportedError("Only SiLU-gated MLP drafts are implemented", path=cfg_path,
                               field=layer.name("hidden_act"), expected="silu", found=repr(act),
                               fix="extend remote/drafter/model/layers.py:mlp")
    types = layer.get("layer_types")
    if types is not None and (not isinstance(types, list) or any(t not in LAYER_TYPES for t in types)):
        raise layer.bad("layer_types", f"a list of {' / '.join(LAYER_TYPES)}", types)
    target_hidden = top.integer("target_hidden_size")
    algorithm, algorithm_source = declared_algorithm(cfg)
    return DraftConfig(
        algorithm=algorithm, algorithm_source=algorithm_source,
        path=cfg_path, format=fmt, layer_ids=ids, layer_ids_key=key, unread_ids=unread, ids_by_engine=by_engine,
        hidden_size=layer.integer("hidden_size"),
        target_hidden_size=target_hidden if target_hidden is not None else layer.integer("target_hidden_size"),
        num_attention_heads=layer.integer("num_attention_heads"), head_dim=layer.integer("head_dim"),
        hidden_act=act, rms_norm_eps=layer.number("rms_norm_eps", DEFAULT_EPS, above=0.0, below=1.0),
        rope=_rope(layer), layer_types=tuple(types or ()),
        sliding_window=layer.integer("sliding_window"), vocab_size=layer.integer("vocab_size"),
        norm_before_fc=top.flag("norm_before_fc"), norm_before_residual=top.flag("norm_before_residual"),
        norm_output=top.flag("norm_output"),
    )


def check_layer_ids(config: DraftConfig, num_aux: int, fc_shape: tuple[int, ...], fc_file: str) -> None:
    """The config must name exactly one aux layer per fc input slot."""
    if config.layer_ids is not None and len(config.layer_ids) != num_aux:
        raise ConfigError(
            f"The config lists {len(config.layer_ids)} aux layer ids but the draft's fc.weight "
            f"{list(fc_shape)} (in {fc_file}) takes {num_aux} slots of hidden states",
            path=config.path, field=config.layer_ids_key, expected=f"{num_aux} ids",
            found=config.layer_ids,
            fix=f"list exactly {num_aux} distinct ids, the layers the draft was trained on (a drafter "
                "report's layout scan shows which), or pass --config with the draft's own config",
        )


#: where a bad value's right one comes from, per file (an error's Fix names the draft's own config
#: only for the draft's config: --config replaces neither data_config.json nor the verifier's)
DRAFT_SOURCE = "the value the draft was trained with (or pass --config with the draft's own config)"


class Fields:
    """Typed, range-checked reads from one JSON object; errors name ``prefix + key``."""

    def __init__(self, obj: dict[str, Any], path: Path, prefix: str, source: str = DRAFT_SOURCE) -> None:
        self.obj, self.path, self.prefix, self.source = obj, path, prefix, source

    def name(self, key: str) -> str:
        return self.prefix + key

    def get(self, key: str) -> Any:
        return self.obj.get(key)

    def bad(self, key: str, expected: str, found: Any, problem: str | None = None) -> ConfigError:
        return ConfigError(
            problem or f"The config value {self.name(key)} is invalid", path=self.path, field=self.name(key),
            expected=expected, found=_show(found),
            fix=f"set {self.name(key)} to {expected}, {self.source}",
        )

    def mapping(self, key: str) -> dict[str, Any]:
        value = self.obj.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.bad(key, "a JSON object", value)
        return value

    def integer(self, key: str, minimum: int = 1) -> int | None:
        value = self.obj.get(key)
        if value is None:
            return None
        if not is_integral(value) or int(value) < minimum:
            raise self.bad(key, f"an integer >= {minimum}", value)
        return int(value)

    def number(self, key: str, default: float, above: float | None = None,
               below: float | None = None) -> float:
        """A finite number in the open interval (above, below); ``default`` when absent."""
        value = self.obj.get(key)
        if value is None:
            return default
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or (above is not None and value <= above) or (below is not None and value >= below):
            bounds = " and ".join(b for b in (f"> {above}" if above is not None else "",
                                              f"< {below}" if below is not None else "") if b)
            raise self.bad(key, f"a finite number {bounds}".strip(), value)
        return float(value)

    def flag(self, key: str, default: bool = False) -> bool:
        value = self.obj.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.bad(key, "true or false", value)
        return value

    def text(self, key: str) -> str | None:
        value = self.obj.get(key)
        if value is not None and not isinstance(value, str):
            raise self.bad(key, "a string", value)
        return value


def is_integral(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, float) and math.isfinite(value) and value == int(value)


def _show(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (str, list, dict)) else str(value)


def declared_algorithm(cfg: dict[str, Any]) -> tuple[str | None, str]:
    """The speculative algorithm the config declares and where: ``speculators_config.algorithm`` first
    (what speculators and vLLM dispatch on), then ``convention.draft_algorithm``."""
    spec = cfg.get("speculators_config")
    declared = spec.get("algorithm") if isinstance(spec, dict) else None
    if isinstance(declared, str) and declared.lower() != "eagle3":
        return declared.lower(), f"speculators_config.algorithm {declared!r}"
    algorithm = convention.draft_algorithm(cfg)
    if isinstance(cfg.get("speculators_model_type"), str):
        return algorithm, f"speculators_model_type {cfg['speculators_model_type']!r}"
    return algorithm, f"architectures {cfg.get('architectures')}"


def _layer_ids(top: Fields, fmt: str) -> tuple[list[int] | None, str | None, dict[str, list[int]],
                                               dict[str, list[int] | None]]:
    """Aux ids as the format's own engine reads them, the field they came from, the ids in fields
    that engine does not read, and the ids each engine reads (``convention.READS``). Every ids field
    is validated: the other engine may read it."""
    eagle = Fields(top.mapping(EAGLE_CONFIG), top.path, f"{EAGLE_CONFIG}.", top.source)
    found: dict[str, list[int]] = {}
    for fields in (top, eagle):
        raw = fields.get(IDS_KEY)
        if raw is None:
            continue
        if not isinstance(raw, list) or not raw or not all(is_integral(i) for i in raw):
            raise fields.bad(IDS_KEY, "a non-empty list of integer layer ids (or null)", raw)
        ids = [int(i) for i in raw]
        if len(set(ids)) != len(ids):
            raise fields.bad(IDS_KEY, "distinct layer ids", raw,
                             problem=f"The config lists a layer twice in {fields.name(IDS_KEY)}")
        found[fields.name(IDS_KEY)] = ids
    read = next((f for f in convention.READS[convention.serving_convention(fmt)] if f in found), None)
    unread = {f: ids for f, ids in found.items() if f != read}
    by_engine = {engine: next((found[f] for f in fields if f in found), None)
                 for engine, fields in convention.READS.items()}
    return (found[read] if read else None), read, unread, by_engine


def _rope(layer: Fields) -> RopeSpec:
    """Check the rope fields transformers would read, then normalise them with RopeSpec."""
    key, params, dotted = RopeSpec.source(layer.obj)
    if key is not None and not isinstance(params, dict):
        raise layer.bad(key, "a JSON object (or null)", params)
    sub = Fields(params, layer.path, layer.prefix + dotted, layer.source)
    rope_type = params.get("rope_type", params.get("type")) or "default"
    type_key = "rope_type" if "rope_type" in params else "type"
    if rope_type not in SUPPORTED_TYPES:
        raise UnsupportedError(f"Rope type {rope_type!r} is not implemented", path=layer.path,
                               field=sub.name(type_key), expected=" / ".join(SUPPORTED_TYPES),
                               found=_show(rope_type),
                               fix="add it to remote/drafter/model/rope.py (copy transformers' init function)")
    sub.number("rope_theta", 10000.0, above=0.0)
    layer.number("rope_theta", 10000.0, above=0.0)
    layer.integer("max_position_embeddings")
    layer.integer("original_max_position_embeddings")
    sub.integer("original_max_position_embeddings")
    required = {"linear": ("factor",), "dynamic": ("factor",),
                "llama3": ("factor", "low_freq_factor", "high_freq_factor")}.get(rope_type, ())
    for name in required:
        if params.get(name) is None:
            raise ConfigError(f"{rope_type} rope needs {name}, which the config does not give",
                              path=layer.path, field=sub.name(name), expected="a finite number > 0",
                              found="absent",
                              fix=f"add {sub.name(name)} (the value the draft was trained with; for a "
                                  "Llama-3.1 draft: factor 8.0, low_freq_factor 1.0, high_freq_factor 4.0)")
    for name in ("factor", "low_freq_factor", "high_freq_factor", "attention_factor"):
        sub.number(name, 1.0, above=0.0)
    for name in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
        sub.number(name, 1.0)
    if rope_type == "llama3" and float(params["high_freq_factor"]) <= float(params["low_freq_factor"]):
        raise sub.bad("high_freq_factor", f"a number > low_freq_factor ({params['low_freq_factor']})",
                      params["high_freq_factor"])
    if params.get("truncate") is not None:
        sub.flag("truncate")
    partial = sub.number("partial_rotary_factor", 1.0, above=0.0)
    if partial != 1.0:
        raise UnsupportedError("Partial rotary embeddings are not implemented for EAGLE-3 Llama drafts",
                               path=layer.path, field=sub.name("partial_rotary_factor"), expected="1.0",
                               found=partial, fix="remove partial_rotary_factor (speculators drops it for "
                                                  "Llama drafts)")
    return RopeSpec.from_config(layer.obj)
