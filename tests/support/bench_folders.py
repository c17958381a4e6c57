"""A bench run's folder and prompts file, as the bench tests build them."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.support.serving import draft_config, ok, profile, project, refused, write_model  # noqa: F401


def prompts_file(tmp: Path, n: int = 5) -> str:
    path = tmp / "prompt's file.jsonl"             # a quote in the path
    path.write_text("".join(json.dumps({"prompt": f"w{5 + i:02d} w17 w33 \"q\" $(x)"}) + "\n" for i in range(n)))
    return str(path)


def bench_folder(root: Path, output: str) -> Path:
    run_id = output.split("result: ", 1)[1].split()[0]
    return Path(run_id).parent if run_id.endswith("bench-result.json") else root / "runs" / run_id


def bench_a_faulty_double(make: Any, tmp_path: Path, double: dict[str, str], *, prompts: int, repeats: int,
                          output_len: int) -> tuple[Path, subprocess.CompletedProcess]:
    """The SGLang double with a fault of its own (``double``: its ``DRAFTOPS_SGLANG_DOUBLE_*`` settings) as
    the default profile of the local host, the bench tests' draft served on it (``serve_draft``), then one
    `invoke bench` of the prompts file; the project and the bench call."""
    from tests.support.serving import serve_draft
    from tests.support.tasks import invoke

    root = make("loc", default=profile(tmp_path, double=double))
    serve_draft(root, tmp_path)
    return root, invoke(root, "bench", "--prompts", str(prompts), "--repeats", str(repeats), "--output-len",
                        str(output_len), "--dataset", prompts_file(tmp_path))
