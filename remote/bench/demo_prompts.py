"""Benchmark prompts in the demo's own language: ``python -m remote.bench.demo_prompts DEMO OUT.jsonl``.

test-drafter predicts the demo draft's accept length on the demo's dump sequences, so a benchmark
that is to be held against that prediction must decode the same kind of text. Each prompt here is
the opening of one dump sequence (its first ``--prefix-len`` tokens, by default the demo's own
prompt length, the part the target did not generate), written as the word-level tokenizer's text
(``w05 w17 ...``), one ``{"prompt": ...}`` JSON line per sequence (what ``invoke bench --dataset``
reads). Prompts holding a special token are left out (it has no plain-text form).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from safetensors import safe_open

from .. import events, exitcodes
from ..drafter import wordtokenizer


def prompts(demo: Path, prefix_len: int) -> list[str]:
    """The prompt texts of the demo's dump sequences, in file order."""
    files = sorted((demo / "data").glob("hs_*.safetensors"), key=lambda p: int(p.stem.split("_")[1]))
    if not files:
        raise FileNotFoundError(f"no hs_*.safetensors dumps under {demo / 'data'}; generate the demo first "
                                "(`invoke test-drafter` does it once per host).")
    out = []
    for path in files:
        with safe_open(str(path), framework="pt") as fh:
            ids = fh.get_tensor("token_ids")[:prefix_len].tolist()
        if any(i < len(wordtokenizer.SPECIALS) for i in ids):
            continue
        out.append(" ".join(wordtokenizer.token(i) for i in ids))
    return out


def write(demo: Path, dest: Path, prefix_len: int) -> int:
    texts = prompts(demo, prefix_len)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    os.replace(tmp, dest)
    return len(texts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m remote.bench.demo_prompts")
    parser.add_argument("demo", type=Path, help="the demo folder (<root>/state/demo)")
    parser.add_argument("out", type=Path, help="prompt JSONL to write")
    parser.add_argument("--prefix-len", type=int, default=4, help="tokens per prompt (the demo's prompt_len)")
    args = parser.parse_args(argv)
    try:
        count = write(args.demo, args.out, args.prefix_len)
    except (OSError, ValueError) as exc:
        events.error(str(exc), kind=type(exc).__name__, exit_code=exitcodes.REFUSED)
        print(f"error: {exc}", file=sys.stderr)
        return exitcodes.REFUSED
    print(json.dumps({"prompts": count, "path": str(args.out)}))
    return exitcodes.OK


if __name__ == "__main__":
    exitcodes.run("demo-prompts", main)
