"""``python -m remote.capture check``: start the engine in hidden-state mode, send dump samples,
match every slot, stop the engine, write ``capture-check.json``.

Exit codes (remote/exitcodes.py): 0 the check ran (whatever it found: "not this target" is a
finding), 3 a refusal in one paragraph (bad dumps, a port in use, an engine that died or hung, a
full disk), 4 a bug. The engine is stopped and its hidden-state files removed in every case,
SIGTERM and Ctrl-C included (``exitcodes.run`` unwinds through the ``finally``). With vLLM, the
engine's states for the samples sent are kept in ``<out>/engine-states/`` (engine_states.py) when the
check runs to its end; a check that fails keeps none.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .. import events, exitcodes, fileio
from . import (
    differences,
    draft,
    dumps,
    engine_states,
    instance,
    matching,
    report,
    sglang_check,
    sglang_engine,
    target,
    vllm_engine,
)
from .errors import CaptureError, DumpMismatchError, EngineError, StorageError

RESULT = "capture-check.json"
SCHEMA = "draftops.capture-check/1"
CODE_ROOT = Path(__file__).resolve().parents[2]
#: room kept free beyond the largest hidden-state file (the engine writes one per request)
DISK_MARGIN = 64 << 20


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m remote.capture")
    sub = parser.add_subparsers(dest="command", required=True)
    ck = sub.add_parser("check", help="match the dumps' slots against the engine's own hidden states")
    ck.add_argument("--engine", choices=("vllm", "sglang"), default="vllm")
    ck.add_argument("--python", required=True, help="the engine's python (the serve profile's)")
    ck.add_argument("--target", type=Path, required=True)
    ck.add_argument("--data", type=Path, required=True)
    ck.add_argument("--draft", type=Path)
    ck.add_argument("--samples", type=int, default=dumps.DEFAULT_SAMPLES)
    ck.add_argument("--port", type=int)
    ck.add_argument("--tp", type=int, default=1)
    ck.add_argument("--max-model-len", type=int)
    ck.add_argument("--extra-args", default="[]", help="JSON list: the profile's extra engine arguments")
    ck.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ck.add_argument("--ready-timeout", type=float, default=900.0)
    ck.add_argument("--request-timeout", type=float, default=120.0)
    ck.add_argument("--storage", type=Path, help="folder for the engine's hidden-state files (default: the run's)")
    ck.add_argument("--out", type=Path, default=Path("."))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return exitcodes.main("capture", lambda: check(args))


def _extra(text: str) -> tuple[str, ...]:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CaptureError("--extra-args must be a JSON list of strings", field="--extra-args", found=text[:200])
    return tuple(value)


def _cuda(device: str) -> bool:
    return torch.cuda.is_available() if device == "auto" else device == "cuda"


def engine_version(python: str, engine: str) -> str | None:
    try:
        done = subprocess.run([python, "-c", f"import importlib.metadata as m; print(m.version({engine!r}))"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip()[:80] or None if done.returncode == 0 else None


def _check_inputs(picked: dumps.Picked, tgt: target.Target, context: int) -> tuple[int, int, int]:
    """Every sample sent is checked before the engine starts; (slots, longest, tokens in all)."""
    slots, longest, tokens = None, 0, 0
    for sample in dumps.load(picked):
        dumps.check(sample, tgt.vocab, context, str(tgt.path))
        t, s, h = sample.hidden.shape
        if h != tgt.hidden:
            raise DumpMismatchError(
                f"The dump's hidden states are {h} wide but the target {tgt.path} has hidden_size {tgt.hidden}, "
                "so these dumps were not made by this target", path=sample.path, tensor="hidden_states",
                fix="check --target (or the profile's target) against the model the dumps were made with")
        if slots is not None and s != slots:
            raise CaptureError(f"Dump samples hold different slot counts ({slots} and {s})", path=sample.path,
                               tensor="hidden_states", fix="use one dump folder made by one generator run")
        slots, longest, tokens = s, max(longest, t), tokens + t
    assert slots is not None
    return slots, longest, tokens


def _check_disk(storage: Path, longest: int, tgt: target.Target, kept: Path | None = None, tokens: int = 0) -> None:
    """Room for one engine file in ``storage`` and, when ``kept`` is given, for the engine states kept there
    (every sample sent, every boundary: engine_states.kept_bytes), both counted where they share a disk."""
    boundaries = tgt.num_layers + 1
    need = engine_states.kept_bytes(longest, boundaries, tgt.hidden) + DISK_MARGIN
    keep = engine_states.kept_bytes(tokens, boundaries, tgt.hidden) if kept is not None else 0
    shared = kept is not None and os.stat(storage).st_dev == os.stat(kept).st_dev
    free = shutil.disk_usage(storage).free
    if free < need + (keep if shared else 0):
        kept_txt = (f", plus {keep >> 20} MiB for the engine states kept ({tokens} tokens of the samples sent)"
                    if shared else "")
        raise StorageError(f"The folder for the engine's hidden-state files has {free >> 20} MiB free, less than "
                           f"one file needs ({need >> 20} MiB: {longest} tokens x {boundaries} boundaries x "
                           f"{tgt.hidden} x 4 bytes, plus a margin){kept_txt}", path=str(storage),
                           fix="free space there, or pass --storage DIR on a disk with room, or fewer --samples")
    if kept is not None and not shared:
        free = shutil.disk_usage(kept).free
        if free < keep + DISK_MARGIN:
            raise StorageError(f"The run folder has {free >> 20} MiB free, less than the engine states kept there "
                               f"need ({keep >> 20} MiB: {tokens} tokens x {boundaries} boundaries x {tgt.hidden} "
                               "x 4 bytes, plus a margin)", path=str(kept),
                               fix="free space on the run folder's disk, or pass fewer --samples")


def check(args: argparse.Namespace) -> int:
    started = time.monotonic()
    tgt = target.read(args.target)
    picked = dumps.pick(args.data, args.samples)
    context = args.max_model_len or tgt.context or 4096
    slots, longest, tokens = _check_inputs(picked, tgt, context)
    out = Path(args.out)
    if args.port is not None:
        instance.check_port(args.port)
    port = args.port or instance.free_port()
    version = engine_version(args.python, args.engine)
    label = "vLLM" if args.engine == "vllm" else "SGLang"
    print(f"capture check: {label} {version or '?'} on {tgt.path} ({tgt.num_layers} layers, hidden {tgt.hidden}); "
          f"{len(picked.indices)} samples of {picked.dumps.root}; port {port}", flush=True)
    timing: dict[str, float] = {}
    if args.engine == "vllm":
        result = _run_vllm(args, tgt, picked, (slots, longest, tokens), port, out, timing)
    else:
        result = _run_sglang(args, tgt, picked, slots, port, out, timing)
    timing["total_s"] = round(time.monotonic() - started, 2)
    result.update(schema=SCHEMA, tool="capture-check", seconds=timing,
                  engine={"name": args.engine, "version": version, "python": args.python, "tp": args.tp,
                          "max_model_len": args.max_model_len, "extra_args": list(_extra(args.extra_args)),
                          "port": port, "convention": "vLLM boundary ids: 0 = embedding, k = after k layers"},
                  target={"num_hidden_layers": tgt.num_layers, "hidden_size": tgt.hidden, "vocab_size": tgt.vocab,
                          **tgt.identity},
                  checkpoint={"path": str(args.draft)} if args.draft else None)
    result["data"].update(path=str(picked.dumps.root), files=len(picked.dumps.files), slots=slots,
                          sent=[str(f) for f in picked.files], sent_indices=list(picked.indices),
                          data_config=picked.slots.path)
    fileio.atomic_write_text(out / RESULT, json.dumps(_finite(result), indent=2, default=str) + "\n")
    for line in result["lines"]:
        print(line)
    events.result(RESULT, status=result["status"], headline=result["headline"])
    return exitcodes.OK


def _sent(engine: instance.Instance, timing: dict[str, float], picked: dumps.Picked, ready_within: float,
          one: Any) -> None:
    """Wait for the engine, then ``one(sample)`` for every sample sent, with progress events."""
    timing["engine_ready_s"] = round(engine.wait_ready("/health", ready_within), 2)
    print(f"engine ready after {timing['engine_ready_s']:.0f} s", flush=True)
    sent = time.monotonic()
    for done, sample in enumerate(dumps.load(picked), 1):
        one(sample)
        events.progress(done, len(picked.indices), "samples")
    timing["requests_s"] = round(time.monotonic() - sent, 2)


def _run_vllm(args: argparse.Namespace, tgt: target.Target, picked: dumps.Picked, sizes: tuple[int, int, int],
              port: int, out: Path, timing: dict[str, float]) -> dict[str, Any]:
    slots, longest, tokens = sizes
    storage = (args.storage or out / "hidden-states").resolve()
    storage.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    _check_disk(storage, longest, tgt, out.resolve(), tokens)
    setup = vllm_engine.Setup(args.python, str(args.target), port, args.tp, args.max_model_len,
                              _extra(args.extra_args), storage, tgt.num_layers, _cuda(args.device))
    tally = matching.Tally(slots, tgt.num_layers + 1)
    rows = matching.rows_to_keep(tgt.num_layers + 1, tgt.hidden, len(picked.indices))
    keeper = engine_states.Keeper(out.resolve() / engine_states.FOLDER, tgt.num_layers)
    indices = iter(picked.indices)
    engine = instance.Instance.start(vllm_engine.command(setup), vllm_engine.environment(dict(os.environ), CODE_ROOT),
                                     port, out / "engine.log", "vLLM")

    def one(sample: Any) -> None:
        served_ids, served = vllm_engine.fetch_states(engine, setup, sample.token_ids.tolist(),
                                                      args.request_timeout, args.request_timeout)
        _same_tokens(sample, served_ids, served, tgt)
        tally.add(sample.hidden, served, rows)
        keeper.add(next(indices), served_ids, served)
    kept = False
    try:
        _sent(engine, timing, picked, args.ready_timeout, one)
        kept = True
    finally:
        stopped = engine.stop()
        _remove_storage(storage, owned=args.storage is None)
        if not kept:
            keeper.discard()
        print(f"engine stopped (status {stopped})", flush=True)
    try:
        result = build_report(args, tgt, picked, tally)
        result["engine_states"] = keeper.finish()
        result["lines"].append(f"Kept the engine's states for {keeper.samples} samples (every boundary, "
                               f"{keeper.bytes >> 20} MiB) in {keeper.folder}: `invoke test-drafter` on these dumps "
                               "scores the draft on them too, the layout the engine feeds included.")
    except BaseException:
        keeper.discard()
        raise
    return result


def _run_sglang(args: argparse.Namespace, tgt: target.Target, picked: dumps.Picked, slots: int, port: int,
                out: Path, timing: dict[str, float]) -> dict[str, Any]:
    setup = sglang_engine.Setup(args.python, str(args.target), port, args.tp, args.max_model_len,
                                _extra(args.extra_args))
    tally = matching.PostNormTally(slots, tgt.hidden)
    engine = instance.Instance.start(sglang_engine.command(setup), dict(os.environ), port, out / "engine.log",
                                     "SGLang")

    def one(sample: Any) -> None:
        tally.add(sample.hidden, sglang_engine.fetch_final(engine, sample.token_ids.tolist(), tgt.hidden,
                                                           args.request_timeout))
    try:
        _sent(engine, timing, picked, args.ready_timeout, one)
    finally:
        print(f"engine stopped (status {engine.stop()})", flush=True)
    entries, final = sglang_check.slot_entries(tally, tgt.num_layers)
    said = sglang_check.lines(entries, final, tgt.num_layers)
    status = sglang_check.FINAL_ONLY if final is not None else report.NOT_THIS_TARGET
    feed = None
    if args.draft is not None:
        feed, more = sglang_check.draft_side(args.draft, tgt.num_layers)
        said += more
    headline = (f"final state in slot {final}; aux slots not measurable with SGLang" if final is not None
                else "not this target: no slot is the final state SGLang computes")
    return {"status": status, "headline": headline, "lines": said, "slots": entries, "final_slot": final,
            "errors": [[e["relative_error"]] for e in entries], "neighbour_distance": [],
            "differences": [], "draft": feed, "verdict": {"status": status},
            "match_rule": f"a slot is the final state when, RMS-normalized and fitted per channel, it is within "
                          f"{matching.MATCH_CEILING:g} of SGLang's post-norm state and the next-best slot is over "
                          "twice as far",
            "data": {"samples": tally.samples, "tokens": tally.tokens},
            "engine_states": engine_states.absent(
                "SGLang returns only the final layer's state after the final norm, not every layer boundary, "
                "so no engine states were kept; run the check with vLLM to score the draft on them")}


def _finite(value: Any) -> Any:
    """The document with null for every value that is not a finite number (JSON has no infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _same_tokens(sample: Any, served_ids: torch.Tensor, served: torch.Tensor, tgt: target.Target) -> None:
    expected = (sample.token_ids.shape[0], tgt.num_layers + 1, tgt.hidden)
    if tuple(served.shape) != expected or not torch.equal(served_ids.to(torch.long).reshape(-1), sample.token_ids):
        raise EngineError(f"The engine returned states for other tokens or of another shape than sent "
                          f"({list(served.shape)} for {list(expected)})", path=str(sample.path),
                          fix="report this with the engine's version; the capture check cannot use the answer")


def _remove_storage(storage: Path, owned: bool) -> None:
    """The hidden-state files (and their locks) are removed; the folder too when the run made it."""
    if not storage.is_dir():
        return
    for entry in storage.iterdir():
        if entry.suffix in (".safetensors", ".lock") and entry.is_file() and not entry.is_symlink():
            entry.unlink(missing_ok=True)
    if owned:
        try:
            storage.rmdir()
        except OSError:
            pass


def build_report(args: argparse.Namespace, tgt: target.Target, picked: dumps.Picked,
                 tally: matching.Tally) -> dict[str, Any]:
    matches = matching.match(tally)
    declared = _declared(picked, len(matches))
    entries = [report.slot_entry(m, tgt.num_layers, declared[m.slot]) for m in matches]
    status = report.status_of(matches)
    final = next((m.slot for m in matches if m.matched and m.boundary == tgt.num_layers), None)
    diffs = [differences.explain(tally, m) for m in matches if not m.matched]
    lines = [report.slot_line(e) for e in entries]
    verdict: dict[str, Any] = {"status": status}
    if status == report.NOT_THIS_TARGET:
        lines.append(report.not_target_words(diffs, status))
        headline = "not this target: " + ", ".join(sorted({d["kind"] for d in diffs}))
    else:
        lines.append(report.final_words(final, len(matches), tgt.num_layers))
        if diffs:
            lines.append(report.not_target_words(diffs, status))
        headline = f"{sum(m.matched for m in matches)} of {len(matches)} slots matched"
    feed = None
    if args.draft is not None and status != report.NOT_THIS_TARGET:
        boundaries = [m.boundary if m.matched else None for m in matches]
        feed = draft.feeding(args.draft, args.engine, tgt.num_layers, tgt.hidden, boundaries, final)
        diagnosis, advice = report.draft_words(feed, tgt.num_layers)
        lines += [diagnosis, advice]
        verdict.update(_draft_verdict(feed))
        headline = f"draft {feed['status']}; " + headline
    elif status != report.NOT_THIS_TARGET:
        lines.append(report.needs_words(entries, final, tgt.num_layers))
    return {"status": status, "headline": headline, "lines": lines,
            "data": {"samples": tally.samples, "tokens": tally.tokens},
            "match_rule": f"a slot matches boundary b when its relative error there is under "
                          f"{matching.MATCH_FRACTION:g} x the relative distance from b to its nearest neighbouring "
                          f"boundary on the engine's own states, and under {matching.MATCH_CEILING:g}",
            "slots": entries, "final_slot": final, "errors": matching.error_table(tally),
            "neighbour_distance": [round(float(x), 6) for x in tally.neighbour_distance()],
            "differences": diffs, "draft": feed, "verdict": verdict}


def _declared(picked: dumps.Picked, slots: int) -> list[int | None]:
    """The boundary data_config.json says each slot holds (None: it does not say)."""
    ids = picked.slots.layer_ids
    if ids is None or len(ids) != slots:
        return [None] * slots
    return [i + 1 for i in ids]     # SlotInfo keeps SGLang ids: boundary = id + 1


def _draft_verdict(feed: dict[str, Any]) -> dict[str, Any]:
    """The fields `invoke draft-config --from-report` reads (remote/draft_config/report.py)."""
    fix = feed.get("fix") or {}
    return {"status": feed["status"], "fix_layer_ids": fix.get("sglang_ids"),
            "fix_layer_ids_vllm": fix.get("vllm_ids"), "needs_capture_patch": bool(fix.get("needs_capture_patch")),
            "measured_from_engine": True}

