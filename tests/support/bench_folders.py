"""A bench run's folder and prompts file, as the bench tests build them."""
from __future__ import annotations

import json
from pathlib import Path

from tests.support.serving import draft_config, ok, profile, project, refused, write_model  # noqa: F401


def prompts_file(tmp: Path, n: int = 5) -> str:
    path = tmp / "prompt's file.jsonl"             # a quote in the path
    path.write_text("".join(json.dumps({"prompt": f"w{5 + i:02d} w17 w33 \"q\" $(x)"}) + "\n" for i in range(n)))
    return str(path)


def bench_folder(root: Path, output: str) -> Path:
    run_id = output.split("result: ", 1)[1].split()[0]
    return Path(run_id).parent if run_id.endswith("bench-result.json") else root / "runs" / run_id
