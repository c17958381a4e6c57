"""CLI: ``python -m remote.draft_config --ckpt PATH (--layer-ids IDS | --from-report FILE) ...``.

Ids are given in SGLang's output-of-layer convention (-1 = embedding), like a drafter report's
``fix_layer_ids``. Writes ``--out DIR/draft_config.json`` (schema in ``__init__``); on refusal
prints one paragraph on stderr and as an ``error`` event and exits 3 (REFUSED in
remote/exitcodes.py) without touching the checkpoint.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from .. import events, exitcodes
from ..eagle.formats import IDS_KEY, SPECULATORS
from . import config_file, validate
from .capture import sglang_warnings
from .lock import config_lock
from .report import ReportFix, other_checkpoint_warning, read_fix
from .rewrite import write_config
from .target import load_target

SCHEMA = "draftops.draft-config/1"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m remote.draft_config",
        description="Rewrite an EAGLE-3 draft's aux layer ids in its config.json (with a backup).")
    parser.add_argument("--ckpt", type=Path, required=True, help="draft checkpoint folder")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--layer-ids", help="new ids, SGLang output-of-layer convention: -1,2,30")
    source.add_argument("--from-report", type=Path, help="drafter report JSON holding the fix")
    parser.add_argument("--target", type=Path, help="target model folder: checks the id range")
    parser.add_argument("--sglang-status", action="store_true",
                        help="warn when the host's SGLang cannot capture the new ids yet")
    parser.add_argument("--dry-run", action="store_true", help="validate only; write nothing")
    parser.add_argument("--out", type=Path, help="folder for draft_config.json")
    parser.add_argument("--engine", choices=("sglang", "vllm"),
                        help="the engine the host serves with: advice for it only (default: both)")
    parser.add_argument("--lock-timeout", type=float, default=60.0,
                        help="seconds to wait for another draft-config on the same config (default 60)")
    return parser.parse_args(validate.join_negative_values(argv))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    payload: dict[str, Any] = {
        "schema": SCHEMA, "ok": False, "error": None, "error_type": None,
        "ckpt": str(args.ckpt), "config": None, "format": None, "field": None,
        "file_convention": None, "old_ids": None, "new_ids": None, "written_ids": None,
        "changed": False, "dry_run": args.dry_run, "backup": None,
        "source": {"kind": "report" if args.from_report else "cli",
                   "path": str(args.from_report) if args.from_report else None, "status": None},
        "target": None, "fc_aux_slots": None, "needs_capture_patch": None, "sglang": None,
        "warnings": [],
    }
    return exitcodes.main_with_result("draft-config", (lambda: _run(args, payload), lambda: _print_summary(payload)),
                                      payload, args.out, "draft_config.json", lambda done: {"changed": done["changed"]},
                                      ckpt=str(args.ckpt))


def _run(args: argparse.Namespace, payload: dict[str, Any]) -> None:
    fix: ReportFix | None = None
    if args.from_report:
        fix = read_fix(args.from_report)
        requested, report_patch = fix.ids, fix.needs_capture_patch
        payload["source"]["status"] = fix.status
    else:
        requested, report_patch = validate.parse_ids(args.layer_ids), False
    if args.dry_run:
        _rewrite(args, payload, fix, requested, report_patch)
        return
    with config_lock(args.ckpt, args.lock_timeout):     # read-modify-write: one run at a time
        _rewrite(args, payload, fix, requested, report_patch)


def _rewrite(args: argparse.Namespace, payload: dict[str, Any], fix: ReportFix | None, requested: list[int],
             report_patch: bool) -> None:
    cfg = config_file.load(args.ckpt)
    target = load_target(args.target) if args.target else None
    payload.update(config=str(cfg.path), format=cfg.format, field=cfg.field,
                   file_convention=cfg.convention, old_ids=cfg.file_ids(),
                   target=target.to_json() if target else None)
    checked = validate.check(requested, cfg, target)
    warnings = list(checked.warnings)
    elsewhere = other_checkpoint_warning(fix, cfg.path) if fix is not None else None
    if elsewhere:
        warnings.insert(0, elsewhere)
    written = cfg.to_file(checked.ids)
    needs_patch = validate.needs_capture_patch(checked.ids) or report_patch
    if cfg.format == SPECULATORS and args.engine != "vllm":
        warnings.append(f"speculators format: {cfg.field} is in the vLLM convention, so SGLang ids "
                        f"{checked.ids} are written as {written}; SGLang's target never reads this "
                        "field (it reads eagle_config only), so serve a flat-format copy with "
                        f"SGLang (`invoke draft-flat --ckpt {shlex.quote(str(args.ckpt))} --layer-ids "
                        f"{','.join(str(i) for i in checked.ids)}` writes one)")
    stray = cfg.stray_top_level_ids()
    if stray is not None:
        warnings.append(f"top-level {IDS_KEY}={stray} left as is: SGLang ignores it but "
                        "vLLM prefers it over eagle_config")
    if args.sglang_status:
        payload["sglang"], sglang_notes = sglang_warnings(checked.ids, target)
        warnings += sglang_notes
    elif needs_patch and args.engine != "vllm":      # vLLM captures the embedding natively
        warnings.append("the ids include -1 (embedding): SGLang needs the draftops capture patch "
                        "(python -m remote.sglang_patch apply) unless its `status` says native; "
                        "--sglang-status checks the host's SGLang")
    payload.update(new_ids=checked.ids, written_ids=written, fc_aux_slots=checked.fc_aux_slots,
                   needs_capture_patch=needs_patch, warnings=warnings)
    if written == payload["old_ids"] or args.dry_run:
        return
    backup = write_config(cfg.path, cfg.raw, cfg.with_ids(checked.ids))
    payload.update(changed=True, backup=str(backup))


def _print_summary(payload: dict[str, Any]) -> None:
    if payload["changed"]:
        state = "changed"
    elif payload["written_ids"] == payload["old_ids"]:
        state = "already set, nothing written"
    else:
        state = "dry run, nothing written"
    print(f"{payload['config']} ({payload['format']}, {payload['field']}): "
          f"{payload['old_ids']} -> {payload['written_ids']} [{state}]")
    if payload["backup"]:
        print(f"backup: {payload['backup']}")
    for warning in payload["warnings"]:
        events.emit("warning", message=warning)
        print(f"warning: {warning}")


if __name__ == "__main__":
    exitcodes.run("draft-config", main)
