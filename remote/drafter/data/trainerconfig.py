"""The slots' layers of SpecForge and ModelOpt dumps from the trainer's own config files next to them,
when no ``data_config.json`` says (their dump files never record the layers).

Read as each trainer writes or reads them (JSON only: the remote side has no YAML parser):

* SpecForge 0.2.0's run config (``Config.from_file``: ``{"model": {...}, "data": {...}, ...}``): the
  ids are resolved as ``algorithms.model_providers.resolve_eagle_capture_layers`` does: the run's
  ``model.aux_hidden_state_layer_ids``, else the draft config's (``model.draft_model_config``: a JSON
  file or a folder with config.json) ``eagle_config.eagle_aux_hidden_state_layer_ids``, else its
  default ``[1, n//2 - 1, n - 4]`` from the target's config.json (``model.target_model_path``).
* A draft config with ``eagle_config.eagle_aux_hidden_state_layer_ids`` (SpecForge's draft config,
  ModelOpt's HF export ``config.json``), or ModelOpt's eagle config file (``--eagle_config``: the key
  at top level).

Both trainers' ids mean "output of decoder layer id" (SGLang's convention, failure-modes.md: ModelOpt
captures the inputs of layers 2, N/2, N-3, i.e. the outputs of 1, N/2-1, N-4). The final slot is the
target's last layer (n - 1), known from ``num_hidden_layers`` of the target config when it is found.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import jsonread
from ..errors import ConfigError
from ..load.config import is_integral

KEY = "eagle_aux_hidden_state_layer_ids"
TARGET_FILE = "model.target_model_path's config.json num_hidden_layers"
MAX_BYTES = 1 << 20  # a config is small; a large JSON next to dumps is something else
MAX_LAYERS = 1 << 16  # no target has this many layers: an id past it (2**70) is no layer, target known or not


@dataclass(frozen=True)
class TrainerIds:
    """What a trainer config says of the aux slots (SGLang ids) and the target's layer count."""

    path: Path
    aux_ids: tuple[int, ...]
    num_hidden_layers: int | None
    source: str  # the file kind and the key the ids were read from


def read(root: Path, aux: int, trainer: str) -> TrainerIds | None:
    """The ids of the ``aux`` aux slots a trainer config next to the dumps gives, or None."""
    base = root if root.is_dir() else root.parent
    for folder in (base, base.parent):
        for file in sorted(folder.glob("*.json")):
            if file.name == "data_config.json" or not file.is_file() or file.stat().st_size > MAX_BYTES:
                continue   # a FIFO would block the read and a link to /dev/zero read without end: no config
            doc = _json(file)
            found = _ids(doc, file) if isinstance(doc, dict) else None
            if found is not None:
                ids, layers, how = found
                return _info(file, ids, layers, how, aux, trainer)
    return None


def _json(file: Path) -> Any:
    try:
        if not file.is_file() or file.stat().st_size > MAX_BYTES:
            return None   # a draft or target config.json this names is small and a regular file too
        return jsonread.load(file)
    except (OSError, ValueError):
        return None


def _ids(doc: dict[str, Any], file: Path) -> tuple[Any, int | None, str] | None:
    """(ids, num_hidden_layers or None, where the ids were read) of one config, or None when it names none."""
    model = doc.get("model")
    if isinstance(model, dict) and "target_model_path" in model:  # a SpecForge run config
        layers = _target_layers(model.get("target_model_path"), file)
        if model.get("aux_hidden_state_layer_ids") is not None:
            return model["aux_hidden_state_layer_ids"], layers, "SpecForge run config, model.aux_hidden_state_layer_ids"
        draft = _draft_config(model.get("draft_model_config"), file)
        eagle = draft.get("eagle_config") if isinstance(draft, dict) else None
        if isinstance(eagle, dict) and eagle.get(KEY) is not None:
            return eagle[KEY], layers, f"SpecForge run config's draft config, eagle_config.{KEY}"
        if layers is not None:
            return ([1, layers // 2 - 1, layers - 4], layers,
                    "SpecForge run config: its default [1, n//2-1, n-4] for the target's num_hidden_layers")
        return None
    eagle = doc.get("eagle_config")
    if isinstance(eagle, dict) and eagle.get(KEY) is not None:
        return eagle[KEY], None, f"draft config eagle_config.{KEY} (SpecForge draft config / ModelOpt export)"
    if doc.get(KEY) is not None:
        return doc[KEY], None, f"ModelOpt eagle config {KEY}"
    return None


def _near(value: Any, file: Path) -> Path | None:
    if not isinstance(value, str) or not value:
        return None
    path = Path(value)
    return path if path.is_absolute() else file.parent / path


def _target_layers(value: Any, file: Path) -> int | None:
    path = _near(value, file)
    cfg = _json(path / "config.json") if path is not None and path.is_dir() else None
    if isinstance(cfg, dict) and isinstance(cfg.get("text_config"), dict):
        cfg = cfg["text_config"]
    n = cfg.get("num_hidden_layers") if isinstance(cfg, dict) else None
    if n is None or not is_integral(n) or int(n) <= 0:
        return None
    if int(n) > MAX_LAYERS:   # 1e308 or 2**63 became SpecForge's default ids of hundreds of digits
        raise ConfigError(f"The target config a trainer config next to the dumps points at names more layers "
                          f"than any target has ({MAX_LAYERS})", path=path / "config.json" if path else None,
                          field="num_hidden_layers", expected=f"1..{MAX_LAYERS}", found=n,
                          fix=f"correct the target's config.json, or model.target_model_path in {file}, or put a "
                              "data_config.json next to the dumps")
    return int(n)


def _draft_config(value: Any, file: Path) -> Any:
    path = _near(value, file)
    if path is None:
        return None
    return _json(path / "config.json" if path.is_dir() else path)


def _info(file: Path, ids: Any, layers: int | None, how: str, aux: int, trainer: str) -> TrainerIds:
    if not isinstance(ids, list) or not all(is_integral(i) and int(i) >= 0 for i in ids) \
            or len({int(i) for i in ids}) != len(ids):
        raise ConfigError("The trainer config next to the dumps names its aux layers wrongly", path=file,
                          field=how, expected="distinct non-negative integer layer ids, one per aux slot",
                          found=ids, fix="correct the ids, or put a data_config.json next to the dumps")
    limit = layers if layers is not None else MAX_LAYERS
    if any(int(i) >= limit for i in ids):
        told = f"the target's {layers} layers ({TARGET_FILE})" if layers is not None else f"{MAX_LAYERS} layers"
        raise ConfigError(f"The trainer config next to the dumps names aux layers past {told}", path=file,
                          field=how, expected=f"layer ids in 0..{limit - 1}", found=ids,
                          fix="correct the ids (or the target_model_path), or put a data_config.json next to "
                              "the dumps")
    if len(ids) != aux:
        raise ConfigError(f"The trainer config next to the dumps names {len(ids)} aux layers, but the {trainer} "
                          f"dumps hold {aux} aux slots", path=file, field=how, expected=f"{aux} ids", found=ids,
                          fix="pass --data the dumps this config made, or put a data_config.json next to them")
    return TrainerIds(file, tuple(int(i) for i in ids), layers, how)


def yaml_next_to(root: Path) -> Path | None:
    """A YAML file next to the dumps (or one folder up): SpecForge's run configs are often YAML, which
    this side cannot parse, so the report names the file instead of staying silent about it."""
    base = root if root.is_dir() else root.parent
    for folder in (base, base.parent):
        found = sorted(f for f in folder.glob("*.y*ml") if f.suffix in (".yaml", ".yml") and f.is_file())
        if found:
            return found[0]
    return None
