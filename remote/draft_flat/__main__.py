"""CLI: ``python -m remote.draft_flat --ckpt SPECULATORS_CKPT --dest NEW_FOLDER [--layer-ids IDS] [--out DIR]``.

Ids (``--layer-ids``) are given in SGLang's output-of-layer convention (-1 = the embedding), as a
drafter report's fix; without them, the speculators config's own ids are converted. Writes
``--out DIR/draft_flat.json`` (schema in ``__init__``); a refusal is one paragraph on stderr and an
``error`` event, exit 3 (REFUSED), with nothing written.
"""
from __future__ import annotations

import argparse
import errno
import json
import math
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from .. import events, exitcodes, jsonread
from ..draft_config import config_file, validate
from ..draft_config.report import read_fix
from ..eagle import weights
from ..eagle.formats import FLAT, NESTED_FIELD
from ..eagle.weights import INDEX_NAME
from ..fileio import new_folder
from . import flat_config, tensors
from .errors import NotConvertible, OutputError

SCHEMA = "draftops.draft-flat/1"
#: files of the source that are not carried over: its own config and weights are rewritten, and
#: draft-config's backups belong to the source
_NOT_COPIED_SUFFIXES = (".safetensors",)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m remote.draft_flat",
        description="Write a flat-format (LlamaForCausalLMEagle3) copy of a speculators EAGLE-3 draft for SGLang.")
    parser.add_argument("--ckpt", type=Path, required=True, help="speculators-format draft checkpoint folder")
    parser.add_argument("--dest", type=Path, required=True, help="new folder for the copy (must not exist)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--layer-ids", help="ids to write, SGLang convention: -1,2,30 (default: the config's own)")
    source.add_argument("--from-report", type=Path, help="drafter report JSON holding the fix: its ids")
    parser.add_argument("--out", type=Path, help="folder for draft_flat.json")
    return parser.parse_args(validate.join_negative_values(argv))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    payload: dict[str, Any] = {
        "schema": SCHEMA, "ok": False, "error": None, "error_type": None, "ckpt": str(args.ckpt), "dest": None,
        "source_ids": None, "layer_ids": None, "ids_from": None, "tensors": 0, "renamed": 0, "bytes": 0,
        "files": [], "warnings": [],
    }
    return exitcodes.main_with_result("draft-flat", (lambda: _run(args, payload), lambda: _print_summary(payload)),
                                      payload, args.out, "draft_flat.json",
                                      lambda done: {"headline": f"flat copy {done['dest']}" if done["ok"]
                                                    else "refused"}, ckpt=str(args.ckpt))


def _run(args: argparse.Namespace, payload: dict[str, Any]) -> None:
    ckpt = args.ckpt
    cfg = config_file.load(ckpt)
    if ckpt.is_file():
        raise NotConvertible(f"--ckpt {ckpt} is a file: give the checkpoint folder (config.json and its "
                             "*.safetensors), which is copied whole.")
    if cfg.format == FLAT:
        raise NotConvertible(f"{cfg.path} is already in the flat format, which SGLang reads: serve {ckpt} as it is "
                             f"(`invoke draft-config --ckpt {ckpt} --layer-ids IDS` changes its ids in place).")
    ids, warnings = _ids(args, cfg, payload)
    out = _checked_dest(args.dest, ckpt)
    try:
        with new_folder(out) as tmp:
            _write(ckpt, cfg.data, tmp, ids, warnings, payload)
    except FileExistsError:
        raise OutputError(f"--dest {out} already exists; draftops never replaces a folder it did not make. Give "
                          "--dest a new name (or remove that folder yourself).") from None
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise OutputError(f"No room left on the disk of {out.parent} while writing the copy ({exc}); the copy "
                              f"needs about the size of {ckpt}. Nothing was left behind: free space, or give --dest "
                              "a folder on another disk.") from None
        raise OutputError(f"Cannot write the copy into {out.parent} ({exc}). Nothing was left behind: give "
                          "--dest a new folder in a place you can write.") from None
    payload.update(dest=str(out), warnings=warnings)


def _ids(args: argparse.Namespace, cfg: config_file.DraftConfig, payload: dict[str, Any]
         ) -> tuple[list[int], list[str]]:
    """The SGLang ids to write (checked against fc.weight as draft-config checks them), and warnings."""
    own = flat_config.source_ids(cfg.data)
    payload["source_ids"] = own
    if args.layer_ids is not None:
        requested, payload["ids_from"] = validate.parse_ids(args.layer_ids), "cli"
    elif args.from_report is not None:
        requested, payload["ids_from"] = read_fix(args.from_report).ids, "report"
    elif own is not None:
        requested, payload["ids_from"] = flat_config.to_sglang(own), "config"
    else:
        raise NotConvertible(f"{cfg.path} has no aux layer ids ({cfg.field} is absent or null, as speculators <= 0.4 "
                             "wrote it), and SGLang would serve its default layers. Pass --layer-ids: the ids of "
                             "`invoke test-drafter`'s fix (SGLang convention, e.g. -1,2,30).")
    checked = validate.check(requested, cfg, None)
    payload["layer_ids"] = checked.ids
    return checked.ids, [w for w in checked.warnings if not w.startswith("no --target given")]


def _checked_dest(out: Path, ckpt: Path) -> Path:
    """``out`` as an absolute path, outside the source, in a folder that exists."""
    out = Path(os.path.abspath(out))
    source = ckpt.resolve()
    if out == source or source in out.parents:
        raise OutputError(f"--dest {out} is inside the checkpoint {ckpt}; the source is never written. Give --dest a "
                          f"folder beside it, e.g. {source}-flat.")
    if not out.parent.is_dir():
        raise OutputError(f"--dest {out}: its folder {out.parent} does not exist. Create it, or give --dest a new "
                          "folder in an existing one.")
    return out


def _write(ckpt: Path, config: dict[str, Any], tmp: Path, ids: list[int], warnings: list[str],
           payload: dict[str, Any]) -> None:
    files, weight_map = tensors.weight_files(ckpt)
    headers = {name: tensors.read(ckpt / name) for name in files}       # every header checked first
    dtype = next((d for _, h in headers.values() if (d := tensors.dtype_of(h))), None)
    _strict_json(config, ckpt / "config.json")                         # names the source's own field
    flat, notes = flat_config.build(config, ckpt / "config.json", ids, dtype)
    warnings += notes
    config_text = _strict_json(flat, ckpt / "config.json")
    index_text = None
    if weight_map is not None:
        index = jsonread.load(ckpt / INDEX_NAME)
        index["weight_map"] = {tensors.renamed(k): v for k, v in weight_map.items()}
        index_text = _strict_json(index, ckpt / INDEX_NAME)
    for name in files:
        n, header = headers[name]
        body, changed = tensors.new_header(ckpt / name, header)
        payload["bytes"] += tensors.copy(ckpt / name, tmp / name, n, body)
        payload["tensors"] += sum(1 for k in header if k != "__metadata__")
        payload["renamed"] += changed
    if index_text is not None:
        _write_like(ckpt / INDEX_NAME, tmp / INDEX_NAME, index_text)
    _write_like(ckpt / "config.json", tmp / "config.json", config_text)
    payload["files"] = sorted([*files, "config.json", *([INDEX_NAME] if weight_map is not None else [])])
    payload["files"] += _copy_others(ckpt, tmp, set(payload["files"]), warnings)


def _strict_json(document: Any, source: Path) -> str:
    """``document`` as JSON every parser reads: a NaN or Infinity (which Python's json reads and writes as
    bare tokens no other parser accepts) is refused, naming the field."""
    bad = _non_finite(document, "")
    if bad is not None:
        raise NotConvertible(f"{source}: `{bad[0]}` is {bad[1]}, which is not a JSON number (strict parsers, "
                             "SGLang's included, refuse the file) and no valid setting. Write the number the "
                             "draft was trained with into that field, then run draft-flat again.")
    return json.dumps(document, indent=2, allow_nan=False) + "\n"


def _non_finite(value: Any, where: str, depth: int = 0) -> tuple[str, float] | None:
    """The first (dotted field, value) holding NaN or an infinity in a parsed JSON document."""
    if isinstance(value, float) and not math.isfinite(value):
        return where or "(the document)", value
    items = (value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ())
    for key, item in items if depth < 64 else ():
        found = _non_finite(item, f"{where}.{key}" if where else str(key), depth + 1)
        if found is not None:
            return found
    return None


def _write_like(source: Path, dest: Path, text: str) -> None:
    """``dest`` written with ``text``, with the permission bits of the file it is made from."""
    dest.write_text(text)
    os.chmod(dest, source.stat().st_mode & 0o777)


def _copy_others(ckpt: Path, tmp: Path, done: set[str], warnings: list[str]) -> list[str]:
    """The checkpoint's other plain files (tokenizer, generation config, README), byte for byte, with their
    permission bits."""
    copied = []
    for entry in sorted(ckpt.iterdir()):
        name = entry.name
        if name in done or name.endswith(_NOT_COPIED_SUFFIXES) or ".draftops-bak-" in name:
            continue
        if not entry.is_file():
            warnings.append(f"{entry} is not a plain file: not copied")
            continue
        try:
            weights.check_inside(ckpt, entry)
        except weights.HeaderError:
            warnings.append(f"{entry} is a link to {os.path.realpath(entry)}, outside the checkpoint folder: not "
                            "copied (copy that file in yourself if the draft needs it)")
            continue
        shutil.copyfile(entry, tmp / name)
        os.chmod(tmp / name, entry.stat().st_mode & 0o777)
        copied.append(name)
    return copied


def _print_summary(payload: dict[str, Any]) -> None:
    print(f"flat copy: {payload['dest']} ({flat_config.ARCHITECTURE}): {payload['tensors']} tensors, "
          f"{payload['renamed']} renamed to midlayer.*, ids {payload['layer_ids']} in {NESTED_FIELD} "
          f"(SGLang convention, from the {payload['ids_from']})")
    for warning in payload["warnings"]:
        events.emit("warning", message=warning)
        print(f"warning: {warning}")


if __name__ == "__main__":
    exitcodes.run("draft-flat", main)
