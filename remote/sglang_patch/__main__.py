"""CLI: ``python -m remote.sglang_patch {status,apply,verify,revert} [options]``.

Run with the python that serves SGLang, from the synced code folder. Prints a readable table plus
``@@draftops`` progress events on stdout, writes ``--out DIR/patch.json`` (schema in
``remote/sglang_patch/__init__.py``) and, on refusal, prints one paragraph on stderr and as an
``error`` event. Exit codes (remote/exitcodes.py): 0 ok, 1 when ``verify`` finds a file that does not
capture the embedding, 2 usage, 3 refused, 4 internal error.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .. import events, exitcodes
from ..fileio import write_json
from . import actions
from .errors import VerifyFailed
from .locate import SglangInstall, locate
from .state import StateStore, default_state_dir
from .targets import model_keys
from .template import PATCH_VERSION

SCHEMA = "draftops.sglang-patch/1"
ACTIONS = ("status", "apply", "verify", "revert")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m remote.sglang_patch",
        description="Make SGLang's EAGLE-3 target capture honour layer id -1 (the embedding) and "
                    "the draft's configured ids in CUDA-graph mode.")
    parser.add_argument("action", choices=ACTIONS)
    parser.add_argument("--models", default=None,
                        help=f"comma-separated model files to act on (default all: "
                             f"{', '.join(model_keys())}; aliases deepseek, kimi); the CUDA-graph "
                             "runner files are always included")
    parser.add_argument("--state-dir", type=Path, default=None,
                        help="where originals and records live (default $DRAFTOPS_STATE_DIR/"
                             "sglang-patch or ~/.draftops/sglang-patch)")
    parser.add_argument("--out", type=Path, default=None, help="folder for patch.json")
    parser.add_argument("--import-check", action="store_true",
                        help="verify: also import every patched module in a fresh python")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    models = [m for m in args.models.split(",") if m.strip()] if args.models else None
    state_root = args.state_dir or default_state_dir()
    payload: dict[str, Any] = {
        "schema": SCHEMA, "action": args.action, "ok": False, "error": None, "error_type": None,
        "patch_version": PATCH_VERSION, "sglang_version": None, "sglang_dir": None,
        "version_source": None, "state_dir": str(state_root), "models": models,
        "files": [], "changed": [], "checks": [], "notes": [],
    }
    events.emit("start", tool="sglang-patch", action=args.action)

    def body() -> int:
        install = locate()
        store = StateStore(state_root, install.version)
        payload.update(sglang_version=install.version, sglang_dir=str(install.root),
                       version_source=install.version_source, state_dir=str(store.dir))
        outcome = _run(args.action, install, store, models, args.import_check)
        payload.update(ok=outcome.ok, files=[r.to_json() for r in outcome.rows],
                       changed=outcome.changed, checks=outcome.checks, notes=outcome.notes)
        _print_table(install, payload)
        if not outcome.ok:
            failed = [c for c in outcome.checks if not c["ok"]]
            raise VerifyFailed("verify failed: " + "; ".join(
                f"{c['file']}: {c['check']}: {c['detail']}" for c in failed))
        return exitcodes.OK

    def finish(ending: exitcodes.Ending) -> None:
        """Leave a patch.json for the local side whatever happened (a refusal, a bug)."""
        if ending.error is not None:
            payload.update(ok=False, error=ending.error,
                           error_type=None if ending.error_type == VerifyFailed.__name__ else ending.error_type)
        if args.out is not None:
            path = write_json(args.out / "patch.json", payload)
            events.result(str(path), ok=payload["ok"], action=args.action,
                          changed=len(payload["changed"]))
        events.emit("done", ok=payload["ok"], exit_code=ending.code)

    return exitcodes.main("sglang-patch", body, heading=f"sglang-patch {args.action} refused", finish=finish)


def _run(action: str, install: SglangInstall, store: StateStore, models: list[str] | None,
         import_check: bool) -> actions.Outcome:
    if action == "apply":
        return actions.apply(install, store, models)
    if action == "revert":
        return actions.revert(install, store, models)
    if action == "verify":
        return actions.verify(install, store, models, import_check=import_check)
    return actions.status(install, store, models)


def _print_table(install: SglangInstall, payload: dict[str, Any]) -> None:
    print(f"SGLang {install.version} at {install.root} (version from {install.version_source})")
    for row in payload["files"]:
        events.emit("file", **{k: row[k] for k in ("file", "model", "state", "sha256", "detail")})
        print(f"  {row['model']:12s} {row['file']:42s} {row['state']:12s} {row['detail']}")
    for check in payload["checks"]:
        print(f"  [{'ok' if check['ok'] else 'FAIL':4s}] {check['file']}: {check['check']}: "
              f"{check['detail']}")
    for note in payload["notes"]:
        print(f"  note: {note}")
    changed = payload["changed"]
    print(f"changed: {', '.join(changed) if changed else 'nothing'}")


if __name__ == "__main__":
    exitcodes.run("sglang-patch", main)
