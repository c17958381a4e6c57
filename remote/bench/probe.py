"""Which benchmark client the host's engine has, and which of its flags exist.

Run with the engine's own python (``python -m remote.bench.probe sglang|vllm``); it prints one JSON
object. It reads the client's source instead of importing it (importing SGLang or vLLM takes
seconds and may need a GPU), so the answer is instant and version-independent:

* SGLang: ``sglang.benchmark.serving`` where it exists (the newest; ``sglang.bench_serving`` is a
  deprecated alias there), else ``sglang.bench_serving``; ``--temperature`` appeared in 0.5.1x
  (older clients hard-code temperature 0.0), ``--flush-cache`` and ``--warmup-requests`` earlier.
* vLLM: ``vllm bench serve`` (``vllm/benchmarks/serve.py``); ``--temperature`` exists since the
  client stopped sending temperature 0 by default.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from .. import distinfo, exitcodes

FLAGS = ("--temperature", "--flush-cache", "--warmup-requests", "--num-warmups", "--seed",
         "--ignore-eos", "--disable-ignore-eos", "--save-result", "--output-file", "--apply-chat-template",
         "--endpoint", "--save-detailed", "--output-details")
CLIENTS = {"sglang": (("sglang.benchmark.serving", "benchmark/serving.py"),
                      ("sglang.bench_serving", "bench_serving.py")),
           "vllm": (("vllm bench serve", "benchmarks/serve.py"),)}


def probe(engine: str) -> dict[str, Any]:
    """The client module or command, its source file and the flags it accepts."""
    if engine not in CLIENTS:
        raise ValueError(f"unknown engine {engine!r}: expected one of {', '.join(CLIENTS)}")
    spec = importlib.util.find_spec(engine)          # top-level: locates without importing
    out: dict[str, Any] = {"engine": engine, "version": distinfo.version(engine) or distinfo.version(f"{engine}-cpu"),
                           "client": None, "source": None, "flags": {}}
    if spec is None or not spec.submodule_search_locations:
        out["error"] = f"{engine} is not importable by {sys.executable}"
        return out
    root = Path(next(iter(spec.submodule_search_locations)))
    for client, rel in CLIENTS[engine]:
        source = root / rel
        if source.is_file():
            text = source.read_text(errors="replace")
            out.update(client=client, source=str(source),
                       flags={flag: f'"{flag}"' in text for flag in FLAGS})
            return out
    out["error"] = f"no benchmark client found under {root}"
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m remote.bench.probe ENGINE``: one JSON line (exit codes: remote/exitcodes.py)."""
    args = sys.argv[1:] if argv is None else argv
    return exitcodes.main("bench-probe", lambda: _answer(args[0] if args else "sglang"))


def _answer(engine: str) -> int:
    try:
        found = probe(engine)
    except ValueError as exc:       # an engine it does not know: the command line's fault
        raise exitcodes.ToolError(str(exc), kind="ValueError", exit_code=exitcodes.USAGE) from exc
    print(json.dumps(found))
    return exitcodes.OK


if __name__ == "__main__":
    exitcodes.run("bench-probe", main)
