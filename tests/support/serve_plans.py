"""A serve plan made from given facts, and its refusals, without a host."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from draftops.documents import parse
from draftops.documents.serve_inspect import ServeInspect
from draftops.inventory import HostSpec, ServeProfile
from draftops.serve import checks, profiles
from draftops.serve.request import Request, resolve
from remote.serve.configs import inspect

TARGET = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32, "hidden_size": 64,
          "vocab_size": 64, "max_position_embeddings": 4096}


def write(folder: Path, config: dict[str, Any]) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def plan_for(engine: str, *, python: str = sys.executable, **req: Any) -> Any:
    spec = HostSpec(name="box", address="box.example", engine=engine,
                    serve={"p": ServeProfile(python=python, target="/models/target", max_running_requests=8)})
    return resolve(Request(**req), profiles.resolve(spec), "/root/state/demo")


def refusals(plan: Any, facts: ServeInspect | None = None, verdict: Any = None) -> checks.Findings:
    found = checks.Findings()
    checks.flag_checks(plan, found)
    if facts is not None:
        checks.fact_checks(plan, facts, verdict, found)
    return found


# ---------------------------------------------------------------- facts from the host's files
def inspected(engine: str, target: Path, draft: Path | None, sglang_status: bool) -> ServeInspect:
    """What `remote.serve inspect` answers, read as `serve/hosttool.inspect` reads it."""
    return parse(ServeInspect, inspect(engine, target, draft, sglang_status), "the inspect answer")


def facts(tmp_path: Path, engine: str, draft: dict[str, Any] | None, target: dict[str, Any] | None = None,
          ) -> ServeInspect:
    tdir = write(tmp_path / "target", target or TARGET) if target is not False else str(tmp_path / "none")
    ddir = write(tmp_path / "draft", draft) if draft is not None else None
    found = inspected(engine, Path(tdir), Path(ddir) if ddir else None, sglang_status=True)
    # the engine as the profile's python sees it: the SGLang double, or vLLM "installed"
    found.engine.importable = True
    return found
