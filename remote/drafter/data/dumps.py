"""Hidden-state dumps in speculators', SpecForge's and ModelOpt's formats, plus the optional
``data_config.json``.

* safetensors (speculators >= 0.5): one file per sample with ``token_ids`` [T] and
  ``hidden_states`` [T, S, H]; an optional ``loss_mask`` [T] is honoured.
* legacy ``.pt`` (speculators <= 0.4): ``{"input_ids": [T], "hidden_states": S x [T, H],
  "loss_mask": [T]}``.
* SpecForge (``rows_*/*.ckpt[.gz]``) and ModelOpt (``*.pt``): see ``dumpformats``; a torch-saved
  file's format is read from its keys, and a folder holds one format.

``data_config.json`` (next to the files, or one folder up) names the layer of each slot; see
``SlotInfo`` and docs/drafter.md for the keys.  Slots are kept in file order; which of them is the
target's final pre-norm state (the source of verifier targets) is resolved in ``final_slot``.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from ... import jsonread
from ...eagle import convention
from ..errors import ConfigError, CorruptFileError, DataError, EmptyDataError, MissingTensorError, ShapeMismatchError
from ..load.config import Fields, is_integral, json_object
from ..store import torchfile
from ..store.tensorstore import TensorStore, read_header, read_slots
from . import dumpformats as fmts
from . import trainerconfig

CONVENTIONS = convention.ENGINES


@dataclass
class Sample:
    """One dumped sequence: tokens, all captured slots, and the loss mask when there is one."""

    token_ids: torch.Tensor  # [T] long
    hidden: torch.Tensor  # [T, S, H], or [T, len(slots), H] when only ``slots`` were read
    loss_mask: torch.Tensor | None  # [T] bool
    path: Path
    slots: tuple[int, ...] | None = None  # the file's slots ``hidden`` holds, in order (None: all of them)
    file_slots: int | None = None  # how many slots the file holds (set when ``slots`` is)

    @property
    def slot_count(self) -> int:
        """The file's slot count, whatever was read of it."""
        return self.file_slots if self.file_slots is not None else int(self.hidden.shape[1])

    def slot_of(self, column: int) -> int:
        """The file's slot held in column ``column`` of ``hidden``."""
        return self.slots[column] if self.slots is not None else column


@dataclass(frozen=True)
class SlotInfo:
    """What ``data_config.json`` says about the slots.

    ``layer_ids`` are stored in the SGLang convention (id = output of decoder layer id, -1 = the
    embedding output), whatever convention the file used (``layer_id_convention``: ``sglang``, the
    default and what speculators' legacy data_config.json means, or ``vllm``: id = after id layers).
    """

    layer_ids: tuple[int, ...] | None = None
    final_slot: int | None = None
    final_slot_given: bool = False
    num_hidden_layers: int | None = None
    path: str | None = None
    convention: str = "sglang"
    final_source: str = "data_config"  # where final_slot came from when final_slot_given
    source: str | None = None  # a trainer config's kind and key, when the ids came from one (trainerconfig)
    aux_layer_ids: tuple[int, ...] | None = None  # a trainer config's aux ids, the final's id not yet known

    def with_layers(self, num_layers: int | None) -> SlotInfo:
        """A trainer config's aux ids completed by the final slot's (the last layer, n - 1) once the
        target's layer count is known (from the verifier)."""
        if self.layer_ids is not None or self.aux_layer_ids is None or num_layers is None:
            return self
        return replace(self, layer_ids=self.aux_layer_ids + (num_layers - 1,), num_hidden_layers=num_layers)

    @classmethod
    def read(cls, folder: Path) -> SlotInfo:
        for candidate in (folder / "data_config.json", folder.parent / "data_config.json"):
            if candidate.is_file():
                return cls.parse(candidate)
        return cls()

    @classmethod
    def parse(cls, file: Path) -> SlotInfo:
        cfg = json_object(file, "data_config.json", "repair the file ({\"layer_ids\": [...], \"final_slot\": "
                          "...}) or remove it (slot layer ids are then unknown)")
        fields = Fields(cfg, file, "", "matching the slots the hidden-state generator wrote (docs/drafter.md, "
                        "data_config.json), or remove the file (slot layer ids are then unknown)")
        conv = (fields.text("layer_id_convention") or "sglang").lower()
        if conv not in CONVENTIONS:
            raise ConfigError("Unknown layer_id_convention in data_config.json", path=file,
                              field="layer_id_convention", expected=" or ".join(CONVENTIONS), found=conv,
                              fix="use 'sglang' (output of layer id, -1 = embedding) or 'vllm'")
        ids = cfg.get("layer_ids")
        # the embedding is -1 in SGLang ids and 0 in vLLM's: nothing lies below it
        lowest = convention.convert([-1], convention.SGLANG, conv)[0]
        if ids is not None and (not isinstance(ids, list) or not ids
                                or not all(is_integral(i) and int(i) >= lowest for i in ids)):
            raise fields.bad("layer_ids", f"a non-empty list of integer layer ids >= {lowest} "
                             f"({conv} convention), one per slot", ids)
        if ids is not None and len({int(i) for i in ids}) != len(ids):
            # two slots cannot hold one layer's output; the verdict would name a layout with a repeat
            raise ConfigError("data_config.json names a layer for two slots", path=file, field="layer_ids",
                              expected="distinct layer ids, one per slot of hidden_states", found=ids,
                              fix="list the layer each slot was captured from, in slot order (the "
                                  "hidden-state generator's layer_ids)")
        layer_ids = (tuple(convention.convert([int(i) for i in ids], conv, convention.SGLANG))
                     if ids is not None else None)
        final = fields.integer("final_slot", minimum=0)
        return cls(layer_ids=layer_ids, final_slot=final, final_slot_given="final_slot" in cfg,
                   num_hidden_layers=fields.integer("num_hidden_layers"), path=str(file), convention=conv)


class DumpSet:
    """The dump files under a path, loaded one sample at a time; one format per set (dumpformats)."""

    def __init__(self, root: Path, files: list[Path], slots: SlotInfo, fmt: str = fmts.SAFETENSORS) -> None:
        self.root = root
        self.files = files
        self.slots = slots
        self.format = fmt

    @classmethod
    def open(cls, path: str | Path) -> DumpSet:
        root = Path(path)
        if root.is_file():
            files = [root]
        elif not root.is_dir():
            raise EmptyDataError("The data path does not exist", path=root,
                                 fix="pass --data the folder of hs_*.safetensors, *.pt or rows_*/*.ckpt files")
        else:
            files = _dump_files(root) or _dump_files(root / "hidden_states") or _rows_files(root)
        if not files:
            raise EmptyDataError(
                "The data folder holds no dump file", path=root,
                expected="*.safetensors or *.pt files (or a hidden_states/ subfolder of them), or SpecForge's "
                         "rows_*/ folders of *.ckpt / *.ckpt.gz",
                found="none", fix="point --data at the folder the hidden-state generator wrote",
            )
        kind = _one_kind(files)
        slots = SlotInfo.read(files[0].parent)
        if kind == fmts.SAFETENSORS:
            return cls(root, files, slots)
        raw = torchfile.load(files[0], _regenerate(fmts.SPECFORGE if _is_ckpt(files[0]) else ""))
        fmt = fmts.classify(raw, files[0])
        if fmt in fmts.TRAINERS:
            count = _decoded(raw, fmt, files[0]).hidden.shape[1]
            slots = _trainer_slots(slots if slots.path is not None else _from_trainer(root, count, fmt), count, fmt)
        return cls(root, files, slots, fmt)

    @property
    def formats(self) -> list[str]:
        return [self.format]

    def lengths(self, count: int | None = None) -> list[int] | None:
        """Token counts of the first ``count`` files from safetensors headers alone (None for the
        torch-saved formats)."""
        return self.lengths_of(range(len(self.files[:count])))

    def lengths_of(self, indices: Sequence[int]) -> list[int] | None:
        """Token counts of the files ``indices`` from safetensors headers alone (None for the
        torch-saved formats): only those headers are read."""
        if self.format != fmts.SAFETENSORS:
            return None
        out = []
        for i in indices:
            header = read_header(self.files[i])
            name = "token_ids" if "token_ids" in header else "input_ids"
            out.append(header[name].shape[0] if name in header else 0)
        return out

    def load(self, index: int, slots: Sequence[int] | None = None) -> Sample:
        """Sample ``index``; with ``slots``, only those slots' states (read alone where the format
        allows: safetensors through a memory map, a legacy list's tensors, a trainer file's columns)."""
        file = self.files[index]
        if self.format == fmts.SAFETENSORS:
            return load_safetensors(file, slots)
        raw = torchfile.load(file, _regenerate(self.format))
        fmt = fmts.classify(raw, file)
        if fmt != self.format:
            raise DataError(
                f"The folder mixes dump formats: {file.name} is {fmts.NAME[fmt]}, {self.files[0].name} is "
                f"{fmts.NAME[self.format]}; one reading of the slots cannot hold for both", path=file,
                expected=f"{fmts.NAME[self.format]} files only (as {self.files[0]})", found=fmts.NAME[fmt],
                fix="keep one trainer's dumps per folder and pass --data that folder")
        return _decoded(raw, fmt, file, slots)


def _regenerate(fmt: str) -> str:
    """How to remake a file of ``fmt`` ("" before a .pt's format is known)."""
    if fmt in fmts.KEYS:
        return fmts.KEYS[fmt].regenerate
    return fmts.LEGACY_FIX if fmt else "regenerate the dump with the tool that wrote it"


def _is_ckpt(file: Path) -> bool:
    return file.suffix == ".ckpt" or file.name.endswith(".ckpt.gz")


def _decoded(raw: dict[Any, Any], fmt: str, file: Path, slots: Sequence[int] | None = None) -> Sample:
    if fmt == fmts.LEGACY_PT:
        return _legacy(raw, file, slots)
    ids, hidden, mask = fmts.decode_trainer(raw, fmt, file, slots)
    return _partial(_checked(ids, hidden, mask, file), slots, fmts.trainer_slots(raw, fmt))


def _partial(sample: Sample, slots: Sequence[int] | None, file_slots: int) -> Sample:
    """``sample`` marked as holding only ``slots`` of the file's ``file_slots``."""
    if slots is None:
        return sample
    return replace(sample, slots=tuple(slots), file_slots=file_slots)


def _wanted(slots: Sequence[int] | None, count: int, file: Path) -> list[int] | None:
    """``slots`` checked against the file's ``count`` slots (None: all of them)."""
    if slots is None:
        return None
    if any(not 0 <= s < count for s in slots):
        raise ShapeMismatchError("A dump file has fewer slots than the layouts being scored read", path=file,
                                 tensor="hidden_states", expected=f"slots {sorted(slots)} (> {max(slots)} slots)",
                                 found=f"{count} slots", fix="dump every sample with the same layers of the same model")
    return list(slots)


def _from_trainer(root: Path, count: int, fmt: str) -> SlotInfo:
    """The slots' layers from the trainer's own config next to the dumps (trainerconfig), when there is one."""
    found = trainerconfig.read(root, count - 1, fmts.NAME[fmt])
    if found is None:
        return SlotInfo()
    info = SlotInfo(path=str(found.path), source=found.source, aux_layer_ids=found.aux_ids)
    return info.with_layers(found.num_hidden_layers)


def _trainer_slots(slots: SlotInfo, count: int, fmt: str) -> SlotInfo:
    """A SpecForge/ModelOpt set's final state is its last slot, whatever data_config.json says."""
    if slots.final_slot_given and slots.final_slot != count - 1:
        raise ConfigError(
            f"data_config.json names another final slot than the {fmts.NAME[fmt]} dumps hold", path=slots.path,
            field="final_slot", expected=f"{count - 1} (the final state, after the {count - 1} aux slots)",
            found=slots.final_slot, fix=f"set \"final_slot\": {count - 1} or remove the key")
    return replace(slots, final_slot=count - 1, final_slot_given=True,
                   final_source=f"{fmts.NAME[fmt]}: {fmts.KEYS[fmt].final}")


def _kind(file: Path) -> str:
    return fmts.SAFETENSORS if file.suffix == ".safetensors" else "torch"


def _one_kind(files: list[Path]) -> str:
    """safetensors or torch-saved; a set with both is refused (files of a torch kind are told apart
    by their keys as they load)."""
    kinds: dict[str, Path] = {}
    for f in files:
        kinds.setdefault(_kind(f), f)
    if len(kinds) > 1:
        a, b = kinds[fmts.SAFETENSORS], kinds["torch"]
        raise DataError(
            f"The folder mixes dump formats: {a.name} is speculators safetensors, {b.name} a torch save; "
            "one reading of the slots cannot hold for both", path=b.parent,
            expected="one trainer's dump files per folder", found=f"{a.name} and {b.name}",
            fix="keep one trainer's dumps per folder and pass --data that folder")
    return next(iter(kinds))


def _is_dump(f: Path) -> bool:
    return f.suffix in (".safetensors", ".pt") or _is_ckpt(f)


def _dump_files(folder: Path) -> list[Path]:
    """The folder's dump files in natural order. A dump-named link whose target is gone is an error:
    skipping it would evaluate fewer samples than the user has, and say nothing."""
    if not folder.is_dir():
        return []
    named = [f for f in folder.iterdir() if _is_dump(f)]
    dangling = sorted((f for f in named if f.is_symlink() and not f.exists()), key=_natural_key)
    if dangling:
        raise CorruptFileError(
            f"{len(dangling)} dump file(s) are links to nothing (first: -> {_link_target(dangling[0])})",
            path=dangling[0], fix="restore what the links point to (a moved or unmounted dump folder), or remove "
                                  "the links to evaluate without those samples")
    special = sorted((f for f in named if f.exists() and not f.is_file() and not f.is_dir()), key=_natural_key)
    if special:
        what = jsonread.kind(special[0].stat().st_mode)
        raise CorruptFileError(
            f"{len(special)} dump file(s) are no regular file (first: {what}), so they are not read: leaving them "
            "out would evaluate fewer samples than the folder names, and say nothing", path=special[0],
            fix="put the dump files themselves there (a FIFO waits for a writer forever, a device such as "
                "/dev/zero never ends), or remove those names to evaluate without them")
    return sorted((f for f in named if f.is_file()), key=_natural_key)


def _rows_files(root: Path) -> list[Path]:
    """SpecForge's layout: the files of every ``rows_{a}-{b}/`` folder, folders in natural order."""
    folders = sorted((d for d in root.iterdir() if d.is_dir() and d.name.startswith("rows_")), key=_natural_key)
    return [f for d in folders for f in _dump_files(d)]


def _link_target(link: Path) -> str:
    try:
        return str(link.readlink())
    except OSError:
        return "?"


def _natural_key(path: Path) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name)]


def load_safetensors(file: Path, slots: Sequence[int] | None = None) -> Sample:
    store = TensorStore.open(file)
    ids_name = "token_ids" if store.has("token_ids") else "input_ids"
    for name in (ids_name, "hidden_states"):
        if not store.has(name):
            raise MissingTensorError(
                "A dump file lacks a tensor", path=file, tensor=name,
                expected="token_ids [T] and hidden_states [T, S, H]", found=store.names(),
                fix="regenerate the dump with speculators' hidden-state generator (or the demo)",
            )
    mask = store.get("loss_mask", finite=False) if store.has("loss_mask") else None
    info = store.info("hidden_states")
    if slots is None or len(info.shape) != 3:
        return _checked(store.get(ids_name), store.get("hidden_states", finite=False), mask, file)
    wanted = _wanted(slots, info.shape[1], file)
    assert wanted is not None
    try:
        hidden = read_slots(info, wanted)
    except (OSError, ValueError, RuntimeError) as exc:
        raise CorruptFileError(f"Reading slots {wanted} of the hidden states failed ({exc})", path=file,
                               tensor="hidden_states", fix="re-copy or re-generate the file") from exc
    if hidden is None:   # a row under a page: every page is read anyway
        hidden = store.get("hidden_states", finite=False)[:, wanted]
    return _partial(_checked(store.get(ids_name), hidden, mask, file), wanted, info.shape[1])


def load_pt(file: Path) -> Sample:
    """One speculators legacy .pt file (DumpSet.load tells the torch-saved formats apart)."""
    raw = torchfile.load(file, fmts.LEGACY_FIX)
    if fmts.classify(raw, file) != fmts.LEGACY_PT:
        raise DataError("The .pt file is not a speculators legacy dump", path=file, fix=fmts.LEGACY_FIX)
    return _legacy(raw, file)


def _legacy(raw: dict[Any, Any], file: Path, slots: Sequence[int] | None = None) -> Sample:
    for name in ("input_ids", "hidden_states"):
        if name not in raw:
            raise MissingTensorError(
                "A .pt dump lacks an entry", path=file, tensor=name,
                expected="input_ids [T], hidden_states list of S x [T, H], loss_mask [T]",
                found=sorted(map(str, raw)), fix="regenerate the dump (legacy speculators format)",
            )
    hs = raw["hidden_states"]
    if isinstance(hs, (list, tuple)):
        if not hs or not all(isinstance(t, torch.Tensor) for t in hs):
            raise DataError("The .pt dump's hidden_states is not a list of tensors", path=file,
                            tensor="hidden_states", expected="S tensors [T, H]",
                            found=[type(t).__name__ for t in hs][:8], fix="regenerate the dump")
        shapes = {tuple(t.shape) for t in hs}
        if len(shapes) != 1:
            raise ShapeMismatchError("The hidden_states list entries differ in shape", path=file,
                                     tensor="hidden_states", expected="S tensors of one shape [T, H]",
                                     found=sorted(shapes), fix="regenerate the dump")
        count = len(hs)
        wanted = _wanted(slots, count, file)
        hs = torch.stack([hs[i] for i in wanted] if wanted is not None else list(hs), dim=1)
    elif isinstance(hs, torch.Tensor) and hs.dim() == 3:
        count = int(hs.shape[1])
        wanted = _wanted(slots, count, file)
        hs = hs[:, wanted] if wanted is not None else hs
    else:
        return _checked(raw["input_ids"], hs, raw.get("loss_mask"), file)
    return _partial(_checked(raw["input_ids"], hs, raw.get("loss_mask"), file), wanted, count)


def _checked(ids: Any, hidden: Any, mask: Any, file: Path) -> Sample:
    """Types, dtypes and shapes of one sample (values are checked by ``check_sample``)."""
    for name, value in (("token ids", ids), ("hidden_states", hidden), ("loss_mask", mask)):
        if value is not None and not isinstance(value, torch.Tensor):
            raise DataError(f"The dump's {name} is not a tensor", path=file, tensor=name,
                            expected="a torch tensor", found=type(value).__name__, fix="regenerate the dump")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise DataError("Token ids must be integers", path=file, tensor="token_ids",
                        expected="an integer dtype (int64)", found=str(ids.dtype).replace("torch.", ""),
                        fix="regenerate the dump; token ids are never stored as floats")
    if not hidden.is_floating_point():
        raise DataError("Hidden states must be floating point", path=file, tensor="hidden_states",
                        expected="float32 / bfloat16 / float16", found=str(hidden.dtype).replace("torch.", ""),
                        fix="regenerate the dump from the target model's hidden states")
    ids = ids.reshape(-1) if ids.dim() == 2 and ids.shape[0] == 1 else ids
    if hidden.dim() != 3 or ids.dim() != 1 or hidden.shape[0] != ids.shape[0]:
        raise ShapeMismatchError(
            "token ids and hidden states disagree", path=file, tensor="hidden_states",
            expected=f"[{ids.shape[0] if ids.dim() == 1 else 'T'}, S, H] with token ids [T]",
            found=f"hidden {list(hidden.shape)}, ids {list(ids.shape)}",
            fix="regenerate the dump; every slot needs one row per token",
        )
    if mask is not None:
        mask = mask.reshape(-1)
        if mask.shape[0] != ids.shape[0]:
            raise ShapeMismatchError("loss_mask length differs from the tokens", path=file,
                                     tensor="loss_mask", expected=[ids.shape[0]], found=list(mask.shape),
                                     fix="regenerate the dump")
        if mask.is_complex() or not bool(((mask == 0) | (mask == 1)).all()):
            raise DataError("loss_mask holds values other than 0 and 1", path=file, tensor="loss_mask",
                            expected="0/1 or true/false per token",
                            found=sorted({float(v) for v in mask.unique()[:6].tolist()}),
                            fix="regenerate the dump; the mask marks the tokens that are scored")
        mask = mask.to(torch.bool)
    return Sample(ids.to(torch.long), hidden, mask, file)


def check_sample(sample: Sample, vocab_size: int) -> str | None:
    """Values of a loaded sample: token ids outside the target vocab are an error (the dump belongs
    to another model); NaN/inf hidden states return the reason the sample cannot be scored."""
    ids = sample.token_ids
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        bad = ids[(ids < 0) | (ids >= vocab_size)]
        raise DataError(
            "Token ids lie outside the draft's target vocabulary", path=sample.path, tensor="token_ids",
            expected=f"ids in [0, {vocab_size})",
            found=f"{bad.numel()} ids out of range, e.g. {int(bad[0])} (min {int(ids.min())}, max {int(ids.max())})",
            fix="use dumps made with the target model (and tokenizer) the draft was trained for",
        )
    finite = torch.isfinite(sample.hidden)
    if bool(finite.all()):
        return None
    bad = ~finite
    token, column, _ = (int(x) for x in bad.nonzero()[0])
    slot = sample.slot_of(column)
    nan = int(torch.isnan(sample.hidden).sum())
    return (f"hidden_states holds {nan} NaN and {int(bad.sum()) - nan} inf of {sample.hidden.numel()} values "
            f"(first at token {token}, slot {slot})")
