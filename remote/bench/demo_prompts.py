"""``python -m remote.bench.demo_prompts DEMO OUT.jsonl``: the demo's benchmark prompts, for
`invoke bench --dataset demo`.

What they are and when they are reused: remote/drafter/demo/prompts.py (the demo build writes them too,
so they live with the demo; this tool only parses the flags and refuses in one paragraph).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from .. import exitcodes
from ..drafter.demo.prompts import IN_DEMO, prompts, write

__all__ = ["IN_DEMO", "main", "prompts", "write"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m remote.bench.demo_prompts")
    parser.add_argument("demo", type=Path, help="the demo folder (<root>/state/demo)")
    parser.add_argument("out", type=Path, help="prompt JSONL to write")
    parser.add_argument("--prefix-len", type=int, default=4, help="tokens per prompt (the demo's prompt_len)")
    args = parser.parse_args(argv)
    if args.prefix_len < 1:
        parser.error(f"--prefix-len must be at least 1, not {args.prefix_len}")
    return exitcodes.main("demo-prompts", lambda: _write(args))


def _write(args: argparse.Namespace) -> int:
    """A demo that is missing or cannot be read, or a destination that cannot be written, refuses."""
    try:
        count, reused = write(args.demo, args.out, args.prefix_len)
    except (OSError, ValueError) as exc:
        raise exitcodes.ToolError(str(exc), kind=type(exc).__name__) from exc
    print(json.dumps({"prompts": count, "path": str(args.out), "reused": reused}))
    return exitcodes.OK


if __name__ == "__main__":
    exitcodes.run("demo-prompts", main)
