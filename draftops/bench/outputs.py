"""Write a comparison into a local run folder: compare.json, compare.md and compare.png."""
from __future__ import annotations

import json
from pathlib import Path

from draftops.bench import render
from draftops.bench.compare import Comparison
from draftops.errors import BenchError
from draftops.history import json_safe
from remote.fileio import atomic_write_bytes


def _atomic(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def write(cmp: Comparison, out_dir: Path) -> dict[str, Path]:
    """The three files, each replaced atomically; returns them by kind. A file that cannot be written
    (a full disk) is a BenchError naming the folder, not a traceback."""
    paths = {"json": out_dir / "compare.json", "markdown": out_dir / "compare.md", "chart": out_dir / "compare.png"}
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        _atomic(paths["json"], json.dumps(json_safe(cmp.to_dict()), indent=2, allow_nan=False) + "\n")
        from draftops.bench import chart  # matplotlib costs ~0.5 s to import: only when a chart is drawn
        chart.draw(cmp, paths["chart"])
        _atomic(paths["markdown"], render.markdown(cmp, paths["chart"].name))
    except OSError as exc:
        raise BenchError(f"cannot write the comparison into {out_dir}: {exc.strerror or exc}. Free disk space "
                         "there (or fix its permissions) and run `invoke bench.compare` again; what was written "
                         "is in that folder.") from None
    return paths
