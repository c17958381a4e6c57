"""Selective, validated reads from (possibly sharded) safetensors files, or a draft's torch ``.bin``.

A verifier such as Kimi-K2 is hundreds of GB; the drafter needs three of its tensors.  The store
reads only the headers up front (which is also where a truncated or corrupt file is caught, with the
tensor whose bytes are missing named), and loads a tensor, or a subset of its rows, on demand.
A ``pytorch_model.bin`` (the original EAGLE repository's checkpoints) has no header: it is loaded
whole, always with ``weights_only=True`` (``torchfile``), so a pickle that would run code is refused
unread. A folder holding both kinds is two saves, and which one is the draft is not guessed.
"""
from __future__ import annotations

import mmap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from ...eagle import weights as headers
from ...eagle.weights import INDEX_NAME, SINGLE_NAME, HeaderError
from ..errors import ConfigError, CorruptFileError, MissingTensorError, NonFiniteError, ShapeMismatchError
from . import torchfile

BIN_NAME = "pytorch_model.bin"
BIN_INDEX_NAME = "pytorch_model.bin.index.json"
#: how to remake a refused .bin (the fix of its error)
BIN_REGENERATE = ("re-export the draft from the trainer, or convert it once, where you trust it, with "
                  "safetensors.torch.save_file(torch.load(FILE), 'model.safetensors')")


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives and what it looks like, from the file header alone."""

    name: str
    path: Path
    shape: tuple[int, ...]
    dtype: str
    end: int = 0  # absolute byte offset of its last byte + 1 (safetensors; 0 for a torch .bin)


def read_header(path: Path) -> dict[str, TensorInfo]:
    """Parse and check a safetensors header (``remote.eagle.weights``); raise CorruptFileError naming
    what is wrong."""
    try:
        entries = headers.read_header(path)
    except HeaderError as exc:
        raise _corrupt(exc) from exc
    return {name: TensorInfo(name, path, e.shape, e.dtype, e.end) for name, e in entries.items()}


def _inside(folder: Path, file: Path) -> None:
    """``remote.eagle.weights.check_inside`` as a CorruptFileError."""
    try:
        headers.check_inside(folder, file)
    except HeaderError as exc:
        raise _corrupt(exc) from exc


def _corrupt(exc: HeaderError) -> CorruptFileError:
    return CorruptFileError(exc.problem, path=exc.path, tensor=exc.tensor, expected=exc.expected,
                            found=exc.found, fix=exc.fix)


class TensorStore:
    """All tensors of one checkpoint (single file, index-sharded, or a folder of shards)."""

    def __init__(self, infos: dict[str, TensorInfo], files: list[Path],
                 loaded: dict[str, torch.Tensor] | None = None) -> None:
        self._infos = infos
        self.files = files
        self._loaded = loaded or {}   # tensors of torch .bin files, read whole at open

    @classmethod
    def open(cls, path: Path) -> TensorStore:
        """Open a file or folder; with an index, trust its weight map but check every shard."""
        path = Path(path)
        if not path.exists():
            raise ConfigError(
                "The weights path does not exist", path=path, expected="a checkpoint folder or weight file",
                found="nothing there" + (" (a link to nothing)" if path.is_symlink() else ""),
                fix="check the path for a typo, and that the checkpoint was copied to this host")
        if _torch_files(path):
            return cls._open_torch(path)
        return cls._open_safetensors(path)

    @classmethod
    def _open_safetensors(cls, path: Path) -> TensorStore:
        weight_map: dict[str, str] = {}
        if path.is_file():
            files = [path]
        elif (path / INDEX_NAME).is_file():
            files, weight_map = _files_from_index(path / INDEX_NAME)
        elif (path / SINGLE_NAME).is_file():
            files = [path / SINGLE_NAME]
        else:
            files = sorted(path.glob("*.safetensors")) if path.is_dir() else []
        if not files:
            raise ConfigError(
                "No safetensors weights found", path=path,
                expected=f"{SINGLE_NAME}, {INDEX_NAME} with its shards, or *.safetensors",
                found="none", fix="point at the checkpoint folder that holds the weights",
            )
        infos: dict[str, TensorInfo] = {}
        for file in files:
            if path.is_dir():
                _inside(path, file)
            header = read_header(file)
            if not weight_map:
                _refuse_duplicates(infos, header, path)
            for name, info in header.items():
                # with an index, a tensor in two shards is read from the one the index names
                if name not in weight_map or path / weight_map[name] == file or name not in infos:
                    infos[name] = info
        return cls(infos, files)

    @classmethod
    def _open_torch(cls, path: Path) -> TensorStore:
        """A ``.bin`` file, or a folder of them (with or without their index), loaded whole."""
        files = _torch_files(path)
        infos: dict[str, TensorInfo] = {}
        loaded: dict[str, torch.Tensor] = {}
        for file in files:
            state = torchfile.load(file, BIN_REGENERATE)
            if not isinstance(state, dict):
                raise CorruptFileError("The weight file does not hold a state dict", path=file,
                                       expected="a dict of tensor name -> tensor", found=type(state).__name__,
                                       fix=BIN_REGENERATE)
            for name, tensor in state.items():
                if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
                    raise CorruptFileError("The weight file holds something other than named tensors",
                                           path=file, tensor=str(name), expected="a tensor",
                                           found=type(tensor).__name__, fix=BIN_REGENERATE)
                if name in infos:
                    raise ConfigError("Two weight files in the checkpoint folder hold the same tensor",
                                      path=f"{infos[name].path}, {file}", tensor=name,
                                      expected="each tensor in one file", found="the tensor in both files",
                                      fix="keep one save per folder, or pass --ckpt the weight file itself")
                infos[name] = TensorInfo(name, file, tuple(tensor.shape), str(tensor.dtype).replace("torch.", ""))
                loaded[name] = tensor
        return cls(infos, files, loaded)

    def names(self) -> list[str]:
        return sorted(self._infos)

    def has(self, name: str) -> bool:
        return name in self._infos

    def info(self, name: str) -> TensorInfo:
        try:
            return self._infos[name]
        except KeyError:
            raise MissingTensorError(
                "A required tensor is missing from the checkpoint",
                path=", ".join(str(f) for f in self.files), tensor=name,
                expected="present", found="absent",
                fix="use a complete checkpoint (or pass --verifier for tensors shared with the target)",
            ) from None

    def shape(self, name: str) -> tuple[int, ...]:
        return self.info(name).shape

    def get(self, name: str, finite: bool = True) -> torch.Tensor:
        """Load one tensor (only its bytes are read); a float tensor must hold only finite values
        unless ``finite`` is False (the caller then decides what a NaN means)."""
        info = self.info(name)
        if name in self._loaded:
            tensor = self._loaded[name]
            return require_finite(tensor, info.path, name) if finite else tensor
        try:
            with safe_open(str(info.path), framework="pt") as f:
                tensor = f.get_tensor(name)
        except Exception as exc:  # safetensors raises its own Rust-side error types
            raise CorruptFileError(f"Reading the tensor failed ({exc})", path=info.path, tensor=name,
                                   fix="re-copy or re-generate the file") from exc
        return require_finite(tensor, info.path, name) if finite else tensor

    def get_rows(self, name: str, rows: torch.Tensor, chunk: int = 8192) -> torch.Tensor:
        """Load only ``rows`` (ascending indices) of a 2-D tensor, ``chunk`` rows at a time."""
        info = self.info(name)
        rows = rows.to(torch.long).cpu()
        if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= info.shape[0]):
            raise ShapeMismatchError(
                "The draft's vocabulary maps to rows the verifier tensor does not have", path=info.path, tensor=name,
                expected=f"row ids in [0, {info.shape[0]})", found=f"[{int(rows.min())}, {int(rows.max())}]",
                fix="pass the verifier whose vocabulary the draft's d2t maps into")
        if name in self._loaded:
            return require_finite(self._loaded[name][rows], info.path, name)
        parts: list[torch.Tensor] = []
        try:
            with safe_open(str(info.path), framework="pt") as f:
                sl = f.get_slice(name)
                for start in range(0, info.shape[0], chunk):
                    stop = min(start + chunk, info.shape[0])
                    sel = rows[(rows >= start) & (rows < stop)]
                    if sel.numel():
                        parts.append(sl[start:stop][sel - start])
        except Exception as exc:
            raise CorruptFileError(f"Reading rows of the tensor failed ({exc})", path=info.path,
                                   tensor=name, fix="re-copy or re-generate the file") from exc
        return require_finite(torch.cat(parts, 0), info.path, name)


#: safetensors dtypes a dump's hidden states may have, for the memory-mapped slot reader
_FLOATS = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}


def read_slots(info: TensorInfo, slots: Sequence[int]) -> torch.Tensor | None:
    """Only ``slots`` of axis 1 of a ``[T, S, H]`` safetensors tensor, read through a memory map with the
    kernel's readahead off (``MADV_RANDOM``) and each needed run of bytes asked for ahead
    (``MADV_WILLNEED``), so the pages of the other slots stay on disk.  None when that saves nothing:
    a slot's row shorter than a page (every page would be touched anyway), or a layout the map cannot
    view (the caller then reads the tensor whole)."""
    dtype = _FLOATS.get(info.dtype)
    if dtype is None or len(info.shape) != 3 or info.end <= 0:
        return None
    t, s, h = info.shape
    size = dtype.itemsize
    row = h * size
    start = info.end - t * s * row
    if row < mmap.PAGESIZE or start % size or not slots or max(slots) >= s or t == 0:
        return None
    runs = _runs(sorted(set(slots)))
    with open(info.path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY) as mapped:
        mapped.madvise(mmap.MADV_RANDOM)
        for token in range(t):
            for first, last in runs:
                lo = start + (token * s + first) * row
                hi = start + (token * s + last + 1) * row
                page = lo - lo % mmap.PAGESIZE
                mapped.madvise(mmap.MADV_WILLNEED, page, hi - page)
        view = torch.frombuffer(mapped, dtype=dtype, count=t * s * h, offset=start).view(t, s, h)
        try:
            out = view[:, list(slots)]   # advanced indexing: a copy, so the map can close
        finally:
            del view
    return out


def _runs(slots: list[int]) -> list[tuple[int, int]]:
    """Ascending slots as (first, last) runs of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for slot in slots:
        if runs and runs[-1][1] == slot - 1:
            runs[-1] = (runs[-1][0], slot)
        else:
            runs.append((slot, slot))
    return runs


def require_finite(tensor: torch.Tensor, path: Path | str, name: str) -> torch.Tensor:
    """``tensor`` itself when it holds no NaN/inf (always for integer/bool tensors)."""
    if not tensor.is_floating_point() or bool(torch.isfinite(tensor).all()):
        return tensor
    nan, inf = int(torch.isnan(tensor).sum()), int(torch.isinf(tensor).sum())
    raise NonFiniteError(
        "A weight tensor holds NaN or inf values, so every score computed with it would be meaningless",
        path=path, tensor=name, expected="finite values", found=f"{nan} NaN and {inf} inf of {tensor.numel()}",
        fix="the training diverged or the file is damaged: use another checkpoint (e.g. an earlier "
            "one) or re-copy the file")


def _torch_files(path: Path) -> list[Path]:
    """The torch ``.bin`` weight files at ``path`` (none: read it as safetensors). A folder with
    both kinds holds two saves, and one of them would be ignored unseen: refused, naming both."""
    if path.is_file():
        return [path] if path.name.endswith(".bin") else []
    if not path.is_dir():
        return []
    bins = sorted(path.glob("*.bin"))
    if not bins:
        return []
    safetensors = sorted(path.glob("*.safetensors"))
    if safetensors:
        raise ConfigError(
            "The checkpoint folder holds both safetensors and torch .bin weights, so it has two readings",
            path=path, expected="one kind of weight file",
            found=f"{', '.join(f.name for f in safetensors[:3])} and {', '.join(f.name for f in bins[:3])}",
            fix="move the save that is not the draft aside, or pass --ckpt the weight file itself "
                "(with --config for its config)")
    if (path / BIN_INDEX_NAME).is_file():
        try:
            weight_map = headers.index_map(path / BIN_INDEX_NAME)
        except HeaderError as exc:
            raise _corrupt(exc) from exc
        return sorted({path / f for f in weight_map.values()})
    return bins


def _files_from_index(index: Path) -> tuple[list[Path], dict[str, str]]:
    """The shards an index names, each checked to be there, and its map (tensor name -> shard)."""
    try:
        weight_map = headers.index_map(index)
    except HeaderError as exc:
        raise _corrupt(exc) from exc
    files = sorted({index.parent / f for f in weight_map.values()})
    for file in files:
        if not file.exists() and not file.is_symlink():
            raise CorruptFileError(
                "A shard listed in the index is missing", path=file,
                expected="file present", found="absent", fix="copy every shard named in the index",
            )
    return files, dict(weight_map)


def _refuse_duplicates(seen: dict[str, TensorInfo], header: dict[str, TensorInfo], folder: Path) -> None:
    """Without an index every file is taken for a shard: one tensor in two files means two saves
    (e.g. two training steps) in one folder, and merging them would evaluate neither."""
    name = next((n for n in header if n in seen), None)
    if name is None:
        return
    first, second = seen[name].path, header[name].path
    raise ConfigError(
        "Two weight files in the checkpoint folder hold the same tensor", path=f"{first}, {second}",
        tensor=name, expected="each tensor in one file (shards of one save)", found="the tensor in both files",
        fix=f"keep one save per folder (move the others aside) or pass --ckpt the weight file itself; "
            f"{folder} has no {SINGLE_NAME} or {INDEX_NAME} to say which file is the draft")
