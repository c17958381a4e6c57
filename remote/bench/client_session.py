"""One benchmark client process for a whole bench: ``python -m remote.bench.client_session ENGINE [MODULE]``.

Why: starting the engine's client (``vllm bench serve``, ``python -m sglang.bench_serving``) costs
26-33 s of imports on a small CPU host, and a bench ran it once per step (warm-up + repeats) for
1-4 s of traffic each. This process imports the engine's own bench module once and calls it for
every step, so the numbers are still the engine client's own and each step writes its result file
exactly as the CLI does (vLLM: ``--save-result``; SGLang: ``--output-file``).

Run with the engine's python; stdlib only (the engine is imported only inside :func:`load_entry`).
Protocol (one JSON object per line): on stdout first ``{"ready": true, "entry": ..., "seconds": ...}``
or ``{"ready": false, "why": ...}`` (no library entry: the runner falls back to one process per
step); then for each line ``{"argv": [...], "log": PATH}`` on stdin (argv: the client's own
arguments, without its command), the step's stdout and stderr go to ``log`` and one reply comes:
``{"ok": bool, "exit": int, "seconds": float, "error": str | null}``. End of stdin ends the process.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, TextIO

#: vLLM's library entry: ``main(args)`` of its bench module, the parser built once with ``add_cli_args``
VLLM_MODULE = "vllm.benchmarks.serve"
#: SGLang's client modules, newest first, as remote.bench.probe names them
SGLANG_MODULES = ("sglang.benchmark.serving", "sglang.bench_serving")

Entry = Callable[[list[str]], None]


def _vllm_entry() -> tuple[Entry, str]:
    import importlib
    serve = importlib.import_module(VLLM_MODULE)
    if not (callable(getattr(serve, "main", None)) and callable(getattr(serve, "add_cli_args", None))):
        raise ImportError(f"{VLLM_MODULE} has no main(args) / add_cli_args(parser)")
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser as Parser  # type: ignore[import-not-found]
    except ImportError:
        from argparse import ArgumentParser as Parser
    try:        # as `vllm bench serve` does: a bench on a host without an accelerator uses the CPU platform
        from vllm import platforms  # type: ignore[import-not-found]
        if platforms.current_platform.is_unspecified():
            from vllm.platforms.cpu import CpuPlatform  # type: ignore[import-not-found]
            platforms.current_platform = CpuPlatform()
    except (ImportError, AttributeError):
        pass
    parser = Parser(prog="vllm bench serve")
    serve.add_cli_args(parser)

    def run(argv: list[str]) -> None:
        serve.main(parser.parse_args(argv))     # a fresh namespace per step: main() mutates it
    return run, f"{VLLM_MODULE}.main"


def _sglang_entry(first: str | None = None) -> tuple[Entry, str]:
    """SGLang's parser is built inside its ``__main__`` block (0.5.10) or ``cli_main()`` (0.5.2x), which
    then calls ``run_benchmark(args)``; running that block per step in this process (``runpy``) is the
    CLI exactly, with the module's heavy imports paid once."""
    import importlib
    import runpy
    why = []
    for name in [first] if first else SGLANG_MODULES:   # the plan's module: the one its CLI would run
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            why.append(f"{name}: {exc}")
            continue
        if not callable(getattr(module, "run_benchmark", None)):
            why.append(f"{name} has no run_benchmark(args)")
            continue

        def run(argv: list[str], name: str = name) -> None:
            saved = sys.argv
            sys.argv = [name, *argv]
            try:
                runpy.run_module(name, run_name="__main__", alter_sys=False)
            finally:
                sys.argv = saved
        return run, f"{name}.run_benchmark"
    raise ImportError("; ".join(why))


def load_entry(engine: str, module: str | None = None) -> tuple[Entry, str]:
    """The engine's bench entry as a function of the client's arguments, and its name for the log;
    ImportError when the engine has none (an older engine: the runner then starts the CLI per step)."""
    if engine == "vllm":
        return _vllm_entry()
    if engine == "sglang":
        return _sglang_entry(module)
    raise ImportError(f"unknown engine {engine!r}")


def _reply(out: TextIO, doc: dict[str, Any]) -> None:
    out.write(json.dumps(doc) + "\n")
    out.flush()


def _redirect(path: str) -> tuple[int, int]:
    """Point fds 1 and 2 at ``path`` (appending): everything the client prints, logging included, goes
    to the step's log as the CLI's output did. Returns the saved fds."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    return saved


def _restore(saved: tuple[int, int]) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(saved[0], 1)
    os.dup2(saved[1], 2)
    os.close(saved[0])
    os.close(saved[1])


def run_step(entry: Entry, argv: list[str], log: str) -> dict[str, Any]:
    """One client run; an exception or a SystemExit other than 0 is the step's failure, its traceback in the log."""
    saved = _redirect(log)
    started = time.monotonic()
    code, error = 0, None
    try:
        entry(argv)
    except SystemExit as exc:           # argparse errors and clients that exit with a status
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        error = None if code == 0 else f"exited {code}"
    except BaseException as exc:        # noqa: BLE001 - any failure is this step's, reported with its type
        traceback.print_exc()
        code, error = 1, f"{type(exc).__name__}: {exc}"
        if isinstance(exc, KeyboardInterrupt):
            raise
    finally:
        seconds = time.monotonic() - started
        _restore(saved)
    return {"ok": code == 0, "exit": code, "seconds": round(seconds, 3), "error": error}


def _drop_code_path() -> None:
    """The engine's client must not see draftops' code folder (it is on the path only to start this module)."""
    code = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != code]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    engine = args[0] if args else ""
    out = os.fdopen(os.dup(1), "w")       # the protocol's channel; fd 1 itself is each step's log
    os.dup2(2, 1)                         # what the import prints goes to the session's log, not the channel
    _drop_code_path()
    started = time.monotonic()
    try:
        entry, name = load_entry(engine, args[1] if len(args) > 1 else None)
    except Exception as exc:  # noqa: BLE001 - any import failure means: no library entry, use the CLI
        _reply(out, {"ready": False, "why": f"{type(exc).__name__}: {exc}"})
        return 0
    _reply(out, {"ready": True, "entry": name, "seconds": round(time.monotonic() - started, 3)})
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        _reply(out, run_step(entry, [str(a) for a in request["argv"]], str(request["log"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
