"""``python -m remote.drafter {eval,demo}``: argument parsing and the human-readable summary.

Exit codes (remote/exitcodes.py): 0 done (whatever the verdict: a MISMATCH is a finding, read it
from report.json), 2 bad usage (argparse: an unknown flag or a value of the wrong type), 3 a
DrafterError, including out-of-range options and running out of memory (its one-paragraph message
on stderr and as an ``error`` event on stdout, both written by ``exitcodes.main``), 4 a bug.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import exitcodes, fileio, jsonread
from ..eagle import acceptlength
from . import distributed
from .demo import MARKER, ensure_demo
from .demo_spec import demo_root_of
from .errors import DrafterError, ResourceError
from .evaluation import evaluate
from .options import EvalOptions

DEMO_ENV = "DRAFTOPS_DEMO_DIR"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m remote.drafter",
                                     description="Evaluate an EAGLE-3 draft against hidden-state dumps.")
    sub = parser.add_subparsers(dest="command", required=True)
    ev = sub.add_parser("eval", help="evaluate a draft (the demo when --ckpt/--data are omitted)")
    ev.add_argument("--ckpt", type=Path, help="draft checkpoint folder (config.json + safetensors)")
    ev.add_argument("--data", type=Path, help="dump folder or file (*.safetensors or legacy *.pt)")
    ev.add_argument("--verifier", type=Path, help="target model folder (HF layout) for verifier targets")
    ev.add_argument("--config", type=Path, help="use this config file instead of <ckpt>/config.json")
    ev.add_argument("--steps", type=int, default=3, help="TTT steps = num_steps you serve with (3)")
    ev.add_argument("--limit", type=int, help="evaluate at most N samples")
    ev.add_argument("--expected-acc", type=float,
                    help="training-reported step-0 accuracy (0-1 or percent) to compare with")
    ev.add_argument("--expected-accept-length", type=float,
                    help="an accept length reported by training or a server, compared with the prediction")
    ev.add_argument("--expected-from", choices=tuple(acceptlength.SOURCES), default="vllm",
                    help="whose definition --expected-accept-length follows (specforge: simulated_acc_len, no +1)")
    ev.add_argument("--accept-tolerance", type=float, default=0.10,
                    help="flag a prediction this fraction below --expected-accept-length (0.10)")
    ev.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ev.add_argument("--engine", choices=("sglang", "vllm"),
                    help="the engine the host serves with: the verdict's advice is for it (default: both)")
    ev.add_argument("--engine-version",
                    help="that engine's version (e.g. 0.5.13): the findings apply its rules (default: the "
                         "newest version read, said in each finding)")
    ev.add_argument("--serve-algorithm",
                    help="the speculative algorithm the host's serve profile launches with, when it sets one "
                         "(e.g. EAGLE): an EAGLE-3 draft under EAGLE is a finding")
    ev.add_argument("--measured", type=Path, help="capture-check.json: slot layers measured from the engine")
    ev.add_argument("--engine-states", type=Path,
                    help="a capture check's engine-states/ folder (the engine's own states at every layer "
                         "boundary for some of these dumps' samples): the draft is scored there too")
    ev.add_argument("--out", type=Path, default=Path("."), help="folder for report.json (cwd)")
    ev.add_argument("--demo-dir", type=Path, help=f"demo cache (default ${DEMO_ENV} or ./demo)")
    ev.add_argument("--layout-samples", type=int, default=64, help="samples for the layout scan (64)")
    ev.add_argument("--layout-tolerance", type=float, default=0.01,
                    help="the best layout counts as the same as the served one when it raises the "
                         "predicted accept length by less than this fraction (0.01 = 1%%)")
    ev.add_argument("--alpha", type=float, default=0.05,
                    help="significance level of the paired served-vs-best comparison (0.05)")
    ev.add_argument("--min-skill", type=float, default=0.1,
                    help="UNKNOWN when no layout closes this share of the gap between always guessing "
                         "the most frequent target and perfect (0.1)")
    ev.add_argument("--acc-tolerance", type=float, default=0.05,
                    help="flag --expected-acc gaps larger than this (0.05)")
    ev.add_argument("--full", action="store_true",
                    help="score every sample (the complete metrics) instead of stopping once the verdict is "
                         "decided (the sequential verdict, the default)")
    ev.add_argument("--seed", type=int, default=0,
                    help="seed of the random order the sequential verdict scores samples in (0)")
    ev.add_argument("--temperature", type=_temperatures, default=(),
                    help="also predict the accept length at these sampling temperatures (comma-separated, e.g. "
                         "0.7 or 0.7,1), for a greedy and a probabilistic draft (needs --verifier)")
    ev.add_argument("--batch-tokens", type=int, help="padded tokens per forward (8192 CPU, 16384 GPU)")
    ev.add_argument("--max-len", type=int, help="truncate samples to this many tokens")
    demo = sub.add_parser("demo", help="generate the demo (tiny target, dumps, buggy draft)")
    demo.add_argument("--out", type=Path, default=None, help=f"folder (default ${DEMO_ENV} or ./demo)")
    demo.add_argument("--force", action="store_true", help="regenerate even when complete")
    return parser


def default_demo_dir() -> Path:
    return Path(os.environ.get(DEMO_ENV) or "demo")


def options_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> EvalOptions:
    """EvalOptions for the flags; without --ckpt/--data, the demo (generated on first use)."""
    ckpt, data, verifier, expected = args.ckpt, args.data, args.verifier, args.expected_acc
    if ckpt is None and data is None:
        paths = ensure_demo(args.demo_dir or default_demo_dir())
        ckpt, data = paths.draft, paths.data
        verifier = verifier or paths.target
        if expected is None:
            expected = jsonread.load(paths.root / MARKER).get("val_full_acc_0")
    elif ckpt is None or data is None:
        parser.error("eval: give both --ckpt and --data, or neither (to run the demo)")
    return EvalOptions(ckpt=ckpt, data=data, verifier=verifier, config=args.config, steps=args.steps,
                       limit=args.limit, expected_acc=expected, device=args.device, out=args.out,
                       layout_samples=args.layout_samples, layout_tolerance=args.layout_tolerance,
                       acc_tolerance=args.acc_tolerance, batch_tokens=args.batch_tokens, max_len=args.max_len,
                       alpha=args.alpha, min_skill=args.min_skill, engine=args.engine, measured=args.measured,
                       engine_states=args.engine_states,
                       engine_version=args.engine_version, serve_algorithm=args.serve_algorithm,
                       expected_accept_length=args.expected_accept_length, expected_from=args.expected_from,
                       accept_tolerance=args.accept_tolerance, full=args.full, seed=args.seed,
                       temperatures=args.temperature)


def _temperatures(text: str) -> tuple[float, ...]:
    """``--temperature 0.7`` or ``0,0.7,1``: the values in order, each once (ranges: EvalOptions)."""
    try:
        values = [float(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--temperature takes numbers such as 0.7 or 0.7,1, got {text!r}") from None
    return tuple(dict.fromkeys(values))


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
