"""``python -m remote.drafter {eval,demo}``: argument parsing and the human-readable summary.

Exit codes (remote/exitcodes.py): 0 done (whatever the verdict: a MISMATCH is a finding, read it
from report.json), 2 bad usage (argparse: an unknown flag or a value of the wrong type), 3 a
DrafterError, including out-of-range options and running out of memory (its one-paragraph message
on stderr and as an ``error`` event on stdout, both written by ``exitcodes.main``), 4 a bug.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import exitcodes, fileio, jsonread
from .demo.build import MARKER, ensure_demo
from .demo_spec import demo_root_of
from .errors import DrafterError, ResourceError
from .evaluation import evaluate
from .launch import distributed
from .options import EvalOptions

DEMO_ENV = "DRAFTOPS_DEMO_DIR"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m remote.drafter",
                                     description="Evaluate an EAGLE-3 draft against hidden-state dumps.")
    sub = parser.add_subparsers(dest="command", required=True)
    ev = sub.add_parser("eval", help="evaluate a draft (the demo when --ckpt/--data are omitted)")
    EvalOptions.add_arguments(ev)      # the flags are declared once, in options.FLAGS (the laptop builds them too)
    demo = sub.add_parser("demo", help="generate the demo (tiny target, dumps, buggy draft)")
    demo.add_argument("--out", type=Path, default=None, help=f"folder (default ${DEMO_ENV} or ./demo)")
    demo.add_argument("--force", action="store_true", help="regenerate even when complete")
    return parser


def default_demo_dir() -> Path:
    return Path(os.environ.get(DEMO_ENV) or "demo")


def options_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> EvalOptions:
    """EvalOptions for the flags; without --ckpt/--data, the demo (generated on first use)."""
    opts = EvalOptions.from_namespace(args, parser)
    if not opts.demo:
        return opts
    paths = ensure_demo(opts.demo_dir or default_demo_dir())
    expected = opts.expected_acc
    if expected is None:
        expected = jsonread.load(paths.root / MARKER).get("val_full_acc_0")
    return dataclasses.replace(opts, ckpt=paths.draft, data=paths.data, verifier=opts.verifier or paths.target,
                               expected_acc=expected)


def summary(report: dict[str, Any]) -> list[str]:
    """A few plain lines for the job log (the full story is in report.json)."""
    v = report["verdict"]
    lines = [f"verdict: {v['status']}", v["message"]]
    scanned = report["data"].get("layout_scan_samples")
    lines.append(f"layout scan (step-0 acc on the first {scanned} samples; it only picks the best layout):")
    for row in sorted(report["layouts"], key=lambda r: -(r["acc"] or 0.0)):
        tags = f"  <- {', '.join(row['tags'])}" if row["tags"] else ""
        lines.append(f"  layout {row['layer_ids'] or row['slots']}: step-0 acc {_num(row['acc'])}{tags}")
    pal = report["predicted_accept_length"]
    lines.append(f"predicted accept length (K={pal['steps']}, {pal['basis']} targets, all "
                 f"{report['data']['samples']} samples): served {_num(pal['served'])}, best {_num(pal['best'])}")
    lines.append(f"  (accept length = {pal['definition']})")
    for row in (report.get("temperature") or {}).get("predictions", []):
        lines.append(f"predicted accept length at temperature {row['temperature']:g}: "
                     + ", ".join(f"{m} draft {_num(row[m]['accept_length'])} (95% CI {_ci(row[m]['ci'])})"
                                 for m in ("greedy", "probabilistic")))
    es = report.get("engine_states")
    if es:
        lines.append(f"on the engine's own states ({es['samples']} samples of {es['path']}, {es['basis']} targets):")
        for row in es["layouts"]:
            lines.append(f"  {row['role']} {row['layer_ids']}: step-0 acc {_num(row['step0_acc'])}, "
                         f"predicted accept length {_num(row['accept_length'])}")
    if v.get("expected_accept"):
        e = v["expected_accept"]
        lines.append(f"expected accept length {e['given']} ({e['source']}) = {e['value']:.3f} as 1 + accepted/drafts; "
                     f"predicted {_num(e['predicted'])}{': gap flagged' if e['flagged'] else ''}")
    if v.get("expected_acc") and v["expected_acc"]["flagged"]:
        e = v["expected_acc"]
        lines.append(f"expected acc {e['expected']:.3f} vs measured {_num(e['served'])}: gap flagged")
    return lines


def _ci(ci: list[float] | None) -> str:
    return "n/a" if not ci else f"{ci[0]:.3f}-{ci[1]:.3f}"


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    rank = os.environ.get("RANK") if os.environ.get(distributed.MARK) == "1" else None
    if rank not in (None, "0"):   # a torchrun's other ranks: rank 0 alone reports (their errors go to stderr)
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (for the life of the process)
    return exitcodes.main("drafter", lambda: _command(args, parser), finish=_error_file if rank else None)


def _error_file(ending: exitcodes.Ending) -> None:
    """A rank that failed leaves its paragraph in torchrun's error file for the launcher to name."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if ending.code == exitcodes.OK or not path or not ending.error:
        return
    fileio.write_json(Path(path), {"message": ending.error, "timestamp": int(time.time()),
                                   "exit_code": ending.code, "error_type": ending.error_type})


def _command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """The demo build or an evaluation; a DrafterError (running out of memory included) names the
    demo's folder when the file at fault is one of the demo's."""
    try:
        try:
            if args.command == "demo":
                paths = ensure_demo(args.out or default_demo_dir(), force=args.force)
                print(f"demo ready in {paths.root}")
                return exitcodes.OK
            report = evaluate(options_from_args(args, parser))
        except (MemoryError, RuntimeError) as exc:
            if isinstance(exc, RuntimeError) and not _out_of_memory(exc):
                raise
            raise ResourceError(f"The evaluation ran out of memory ({type(exc).__name__})",
                                fix="lower --batch-tokens (padded tokens per forward), --steps or --max-len, "
                                    "or use a machine with more memory") from exc
    except DrafterError as exc:
        _name_the_demo(exc)
        raise
    for line in summary(report) if report else ():   # {}: a rank of a torchrun other than 0
        print(line)
    return exitcodes.OK


def _name_the_demo(exc: DrafterError) -> None:
    """A damaged file of the generated demo (a cut-off copy, a full disk while it was built) is fixed
    by building the demo again: say how, in the error's fix."""
    root = demo_root_of(exc.path.split(", ")[0]) if exc.path else None
    if root is None:
        return
    exc.fix = (f"{exc.fix.rstrip('.')}; " if exc.fix else "") + (
        f"this file is part of the generated demo in {root}: remove that folder on the host "
        f"(rm -r {shlex.quote(str(root))}) and the next `invoke test-drafter` builds the demo again")
    exc.args = (exc._compose(),)


def _out_of_memory(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "out of memory" in text or "can't allocate memory" in text or "not enough memory" in text
