"""Prompt files for the benchmark clients.

draftops takes one dataset format, JSONL with a ``prompt`` per line (what ``vllm bench serve
--dataset-name custom`` reads as is). SGLang's client reads ShareGPT JSON (``--dataset-name
sharegpt --dataset-path``, in every version), so the runner converts the file on the host.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from .errors import BenchParseError


def read_prompts(path: str | Path) -> list[str]:
    """The prompts of a JSONL file; any bad line is an error naming the file and line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BenchParseError(f"cannot read the dataset {path}: {exc}. Give a UTF-8 JSONL file with one "
                              '{"prompt": "..."} object per line.') from exc
    prompts = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise BenchParseError(f"{path}:{lineno}: not JSON ({exc}); each line must be one "
                                  '{"prompt": "..."} object.') from exc
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"]:
            raise BenchParseError(f'{path}:{lineno}: no non-empty string "prompt" field; each line must be '
                                  'one {"prompt": "..."} object.')
        prompts.append(row["prompt"])
    if not prompts:
        raise BenchParseError(f'{path}: no prompts; it needs one {{"prompt": "..."}} object per line.')
    return prompts


def to_sharegpt(prompts: list[str]) -> list[dict[str, object]]:
    """ShareGPT conversations SGLang's sampler accepts (≥2 turns; the reply is replaced by the
    fixed ``--sharegpt-output-len``, so it only has to be non-empty)."""
    return [{"id": f"draftops-{i}", "conversations": [{"from": "human", "value": p},
                                                       {"from": "gpt", "value": "."}]}
            for i, p in enumerate(prompts)]


def write_sharegpt(src: str | Path, dest: str | Path) -> int:
    """Convert ``src`` (prompt JSONL) into ``dest`` (ShareGPT JSON); returns the prompt count."""
    prompts = read_prompts(src)
    dest = Path(dest)
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.write_text(json.dumps(to_sharegpt(prompts), ensure_ascii=False))
    tmp.replace(dest)
    return len(prompts)


if __name__ == "__main__":   # python -m remote.bench.datasets PROMPTS.jsonl SHAREGPT.json
    try:
        print(write_sharegpt(sys.argv[1], sys.argv[2]))
    except BenchParseError as err:
        sys.exit(f"error: {err}")
