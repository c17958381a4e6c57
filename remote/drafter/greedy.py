"""The project's own greedy decode of a target folder: what a server at temperature 0 must return.

``python -m remote.drafter.greedy --target DIR --prompt-ids 5,17,33 --max-tokens 32`` prints one
JSON object ``{"prompt_ids": [...], "token_ids": [...], "text": ...}``; ``--prompt TEXT`` tokenizes
with the demo's word-level vocabulary instead.  Stdlib + torch + safetensors (runs on the GPU host
with the ml-env python), computing the full-prefix forward of ``tinyllama`` in fp32 at every step.
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import exitcodes
from .demo import wordtokenizer
from .model import tinyllama


def greedy_decode(target: str | Path, prompt_ids: Sequence[int], max_tokens: int) -> list[int]:
    """The ``max_tokens`` ids a temperature-0 server appends to ``prompt_ids`` (no early stop)."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    cfg, weights = tinyllama.load(target)
    return tinyllama.greedy(cfg, weights, list(prompt_ids), max_tokens)


def _ids(text: str) -> list[int]:
    try:
        return [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prompt-ids takes comma-separated integers, got {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m remote.drafter.greedy", description=__doc__.split("\n")[0])
    parser.add_argument("--target", type=Path, required=True, help="target model folder (HF Llama layout)")
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt-ids", type=_ids, help="comma-separated token ids")
    prompt.add_argument("--prompt", help="text in the demo's word vocabulary, e.g. 'w05 w17 w33'")
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args(argv)
    return exitcodes.main("greedy", lambda: _decode(args, parser))


def _decode(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Decode and print; a bad value (a prompt word outside the vocabulary) is a usage error."""
    try:
        cfg, weights = tinyllama.load(args.target)
        ids = args.prompt_ids if args.prompt is None else wordtokenizer.encode(args.prompt, cfg.vocab_size)
        out = tinyllama.greedy(cfg, weights, ids, args.max_tokens)
    except ValueError as exc:
        parser.error(str(exc))
    result: dict[str, Any] = {"target": str(args.target), "prompt_ids": ids, "token_ids": out,
                              "text": wordtokenizer.decode(out)}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    exitcodes.run("greedy", main)
