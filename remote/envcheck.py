"""What the host's ml-env can do: python, torch, CUDA, GPUs, SGLang and speculators versions.

Run with the ml-env python (``python -m remote.envcheck --out DIR``); stdlib only, torch if present.
Writes ``env.json`` into ``--out`` and prints it.
"""
from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from . import distinfo
from .fileio import write_json

NVIDIA_SMI_TIMEOUT_S = 30.0
# torch is listed for env.json's package versions; the env.check table shows it once, in its own row
PACKAGES = ("torch", "safetensors", "numpy", "sglang", "speculators", "transformers", "flashinfer-python")


def _torch_info() -> dict[str, Any]:
    try:
        import torch
    except Exception as exc:  # torch missing or broken: report, don't crash
        return {"available": False, "error": f"{type(exc).__name__}: {exc}"}
    info: dict[str, Any] = {"available": True, "version": torch.__version__,
                            "cuda_build": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
    if info["cuda_available"]:
        info["devices"] = [{"index": i, "name": torch.cuda.get_device_name(i),
                            "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1),
                            "capability": ".".join(map(str, torch.cuda.get_device_capability(i)))}
                           for i in range(torch.cuda.device_count())]
    return info


def _nvidia_smi() -> list[dict[str, str]] | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    fields = "index,name,memory.total,driver_version"
    try:
        proc = subprocess.run([exe, f"--query-gpu={fields}", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=NVIDIA_SMI_TIMEOUT_S)
    except subprocess.TimeoutExpired:   # a GPU in a bad state hangs it: report that, keep the rest
        return [{"error": f"nvidia-smi did not answer within {NVIDIA_SMI_TIMEOUT_S:g} s (a GPU or driver in a "
                          "bad state?); run it by hand on the host"}]
    except OSError as exc:
        return [{"error": f"nvidia-smi at {exe} cannot run: {exc}"}]
    if proc.returncode != 0:
        return [{"error": proc.stderr.strip()[:300]}]
    rows = []
    for line in proc.stdout.strip().splitlines():
        values = [v.strip() for v in line.split(",")]
        rows.append(dict(zip(fields.split(","), values, strict=False)))
    return rows


def collect() -> dict[str, Any]:
    return {"schema": "draftops.env/1", "python": sys.version.split()[0], "executable": sys.executable,
            "platform": platform.platform(), "hostname": platform.node(),
            "packages": {name: distinfo.version(name) for name in PACKAGES},
            "torch": _torch_info(), "nvidia_smi": _nvidia_smi()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m remote.envcheck")
    parser.add_argument("--out", default=".")
    args = parser.parse_args(argv)
    report = collect()
    write_json(Path(args.out) / "env.json", report)    # atomic, creating the folder
    print(json.dumps(report, indent=2))
    from remote import events, exitcodes
    events.result("env.json")
    return exitcodes.OK


if __name__ == "__main__":
    from remote import exitcodes
    exitcodes.run("envcheck", main)
