"""Benchmark prompts in the demo's own language (the tool: ``python -m remote.bench.demo_prompts DEMO OUT.jsonl``).

test-drafter predicts the demo draft's accept length on the demo's dump sequences, so a benchmark
that is to be held against that prediction must decode the same kind of text. Each prompt here is
the opening of one dump sequence (its first ``--prefix-len`` tokens, by default the demo's own
prompt length, the part the target did not generate), written as the word-level tokenizer's text
(``w05 w17 ...``), one ``{"prompt": ...}`` JSON line per sequence (what ``invoke bench --dataset``
reads). Prompts holding a special token are left out (it has no plain-text form).

The demo build writes them to ``<demo>/bench-prompts.jsonl`` (``IN_DEMO``), the file that
`invoke bench --dataset demo` reads. They are written once per demo: ``OUT.key`` records the demo's
DEMO.json digest and the prefix length, and while both still match the file is reused without reading
a dump (no torch import, which costs seconds on a CPU host before every `invoke bench --dataset demo`).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ...fileio import atomic_write_text
from ..demo_spec import MARKER
from . import wordtokenizer

IN_DEMO = "bench-prompts.jsonl"   # where the demo build leaves them: <demo>/bench-prompts.jsonl


def prompts(demo: Path, prefix_len: int) -> list[str]:
    """The prompt texts of the demo's dump sequences, in file order."""
    from safetensors import safe_open  # torch: only when the prompts are (re)made
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


def _key(demo: Path, prefix_len: int) -> str:
    """What the prompts depend on: the demo (its completion marker, rewritten by every build) and
    the prefix length."""
    if not (demo / MARKER).is_file():
        raise FileNotFoundError(f"{demo} holds no complete demo (no {MARKER}); generate the demo first "
                                "(`invoke test-drafter` does it once per host).")
    marker = hashlib.sha256((demo / MARKER).read_bytes()).hexdigest()
    return json.dumps({"demo": marker, "prefix_len": prefix_len}, sort_keys=True)


def write(demo: Path, dest: Path, prefix_len: int) -> tuple[int, bool]:
    """Write the prompts to ``dest`` unless they are there for this demo already; returns (count, reused)."""
    key = _key(demo, prefix_len)
    stamp = dest.with_name(dest.name + ".key")
    try:
        if stamp.read_text() == key and not dest.is_symlink():
            return sum(1 for line in dest.read_text().splitlines() if line.strip()), True
    except OSError:
        pass
    texts = prompts(demo, prefix_len)
    dest.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(dest, "".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    atomic_write_text(stamp, key)   # after the prompts: a crash between the two only costs a rewrite
    return len(texts), False
