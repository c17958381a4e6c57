"""The host's ml-env: create the venv and install its requirements once, skipping when nothing changed.

Named ``mlenv`` (not ``env``) so it never shadows ``os.environ`` idioms; the invoke namespace is ``env``.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from draftops.errors import InventoryError
from draftops.link.host import Host
from draftops.runs.jobs import shell_path

HASH_FILE = ".draftops-env-hash"
REQ_FILE = ".draftops-requirements.txt"
HASH_MARK = "@@draftops-env-hash:"


def requirements_file(digest: str) -> str:
    """The uploaded requirements' name in the venv, one per content hash: a second setup started
    meanwhile must not replace the list the first one's pip is about to read."""
    return REQ_FILE.replace(".txt", f"-{digest[:16]}.txt")


@dataclass
class EnvPlan:
    """What env.setup decided: the content hash, and whether the venv is already current."""

    venv: str
    digest: str
    requirements: bytes
    up_to_date: bool


def plan(host: Host) -> EnvPlan:
    """Hash the env inputs and compare with the hash stored in the venv (one round trip)."""
    env = host.spec.env
    if env is None:
        raise InventoryError(f"Host {host.name!r} has no `env:` entry in hosts.yaml; add one with `venv:` "
                             "(and `requirements:`) to let draftops manage its ml-env.")
    requirements = b""
    if env.requirements:
        path = Path(env.requirements)
        what = "is a folder, not a requirements file" if path.is_dir() else "does not exist"
        read: bytes | None = None
        try:
            read = path.read_bytes() if path.is_file() else None
        except OSError as exc:
            what = f"cannot be read ({exc.strerror or exc})"
        if read is None:
            raise InventoryError(f"Host {host.name!r}: env.requirements {path} {what}; fix the path "
                                 "in hosts.yaml (relative paths are taken from hosts.yaml's folder).")
        requirements = read
    digest = hashlib.sha256(b"\0".join([env.venv.encode(), env.base_python.encode(),
                                        str(env.system_site_packages).encode(), requirements])).hexdigest()
    current = stored_hash(host, shell_path(_in_venv(env.venv, "bin/python")), shell_path(_in_venv(env.venv, HASH_FILE)))
    return EnvPlan(env.venv, digest, requirements, current == digest)


def stored_hash(host: Host, python: str, hash_file: str) -> str:
    """The install hash a venv keeps in ``hash_file`` when its ``python`` exists (both shell-quoted), else
    "". A marker comes before it: a host whose shell start-up files print (a banner) still reads as
    current."""
    probe = f"[ -x {python} ] && {{ printf '\\n%s' {HASH_MARK}; cat {hash_file}; }} 2>/dev/null || true"
    text = host.transport.run(probe).text
    return text.rpartition(HASH_MARK)[2].strip() if HASH_MARK in text else ""


def _in_venv(venv: str, rel: str) -> str:
    return venv.rstrip("/") + "/" + rel


def _words(*argv: str) -> str:
    """One shell command from argv; every word is quoted (a leading ``~/`` stays expandable)."""
    return " ".join(shell_path(word) for word in argv)


def setup_command(host: Host, env_plan: EnvPlan) -> str:
    """The shell script of the setup job: venv if missing, pip install, then record the hash.

    Every user value (venv, base_python) reaches the shell only through ``_words``/``shell_path``."""
    env = host.spec.env
    assert env is not None
    venv = env_plan.venv
    python = _in_venv(venv, "bin/python")
    req = _in_venv(venv, requirements_file(env_plan.digest))
    flags = ["--system-site-packages"] if env.system_site_packages else []
    return " && ".join([
        "set -e",
        # a venv cut off before its pip was installed (bin/python comes first) is made again over itself
        f"if [ ! -x {shell_path(python)} ] || ! {_words(python, '-c', 'import pip')} >/dev/null 2>&1; then "
        f"{_words('echo', 'creating venv ' + venv)}; {_words(env.base_python, '-m', 'venv', *flags, venv)}; fi",
        f"if grep -qvE '^[[:space:]]*(#.*)?$' {shell_path(req)}; then "
        f"{_words(python, '-m', 'pip', 'install', '--disable-pip-version-check', '-r', req)}; "
        "else echo 'no requirements to install'; fi",
        f"printf %s {_words(env_plan.digest)} > {shell_path(_in_venv(venv, HASH_FILE))}",
        "echo 'env ready'",
    ])


def upload_requirements(host: Host, env_plan: EnvPlan) -> None:
    """Put the requirements file next to the venv (creating its folder), where the setup job reads it."""
    req = shell_path(_in_venv(env_plan.venv, requirements_file(env_plan.digest)))
    upload = f"{_words('mkdir', '-p', env_plan.venv)} && cat > {req}"
    host.transport.run(upload, input=env_plan.requirements)


def prepare_setup(host: Host, env_plan: EnvPlan) -> str:
    """Upload the requirements next to the venv; returns the setup job's script (run from the
    host's root: ``draftops.runs.tools.run_job(..., cwd=".")``)."""
    upload_requirements(host, env_plan)
    return setup_command(host, env_plan)
