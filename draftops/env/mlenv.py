"""The host's ml-env: create the venv and install its requirements once, skipping when nothing changed.

Named ``mlenv`` (not ``env``) so it never shadows ``os.environ`` idioms; the invoke namespace is ``env``.
"""
from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass
from pathlib import Path

from draftops.errors import HostFileError, InventoryError
from draftops.link.host import Host
from draftops.runs.jobs import shell_path

HASH_FILE = ".draftops-env-hash"
REQ_FILE = ".draftops-requirements.txt"
MAX_HASH = 4096                      # a stored hash is 64 hex digits; a bigger file is not one
MAX_REQUIREMENTS = 96 << 10          # the list travels inside the setup job's command line (128 KiB a word)


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
    requirements = _requirements(host, Path(env.requirements)) if env.requirements else b""
    digest = hashlib.sha256(b"\0".join([env.venv.encode(), env.base_python.encode(),
                                        str(env.system_site_packages).encode(), requirements])).hexdigest()
    current = stored_hash(host, _in_venv(env.venv, "bin/python"), _in_venv(env.venv, HASH_FILE))
    return EnvPlan(env.venv, digest, requirements, current == digest)


def _requirements(host: Host, path: Path) -> bytes:
    """The requirements file's bytes; a missing, unreadable, binary or oversized one is refused, naming it."""
    what = "is a folder, not a requirements file" if path.is_dir() else "does not exist"
    read: bytes | None = None
    try:
        read = path.read_bytes() if path.is_file() else None
    except OSError as exc:
        what = f"cannot be read ({exc.strerror or exc})"
    if read is not None and not _text(read):
        what, read = f"is not a requirements list (over {MAX_REQUIREMENTS >> 10} KiB, or not UTF-8 text)", None
    if read is None:
        raise InventoryError(f"Host {host.name!r}: env.requirements {path} {what}; fix the path "
                             "in hosts.yaml (relative paths are taken from hosts.yaml's folder).")
    return read


def _text(data: bytes) -> bool:
    """Whether ``data`` can travel in the setup job's command line: UTF-8 text, no NUL, not too long."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return len(data) <= MAX_REQUIREMENTS and b"\0" not in data


def stored_hash(host: Host, python: str, hash_file: str) -> str:
    """The install hash a venv keeps in ``hash_file`` when its ``python`` exists and runs (host paths,
    ``~/`` allowed), else "". The agent reads both (no shell: a host whose start-up files print a
    banner still reads as current, and a hash file that became a FIFO is not waited on)."""
    try:
        if not host.agent.read(python, "size").executable:
            return ""
        return host.agent.read(hash_file, cap=MAX_HASH).data.decode("utf-8", "replace").strip()
    except HostFileError:
        return ""


def _in_venv(venv: str, rel: str) -> str:
    return venv.rstrip("/") + "/" + rel


def _words(*argv: str) -> str:
    """One shell command from argv; every word is quoted (a leading ``~/`` stays expandable)."""
    return " ".join(shell_path(word) for word in argv)


def setup_command(host: Host, env_plan: EnvPlan) -> str:
    """The shell script of the setup job: write the requirements next to the venv, venv if missing,
    pip install, then record the hash. The list travels inside the script (the agent's framed `start`
    call), written under its content hash's name: a second setup started meanwhile writes its own.

    Every user value (venv, base_python, the list) reaches the shell only quoted (``_words``,
    ``shell_path``, ``shlex.quote``)."""
    env = host.spec.env
    assert env is not None
    venv = env_plan.venv
    python = _in_venv(venv, "bin/python")
    req = _in_venv(venv, requirements_file(env_plan.digest))
    text = env_plan.requirements.decode("utf-8")
    flags = ["--system-site-packages"] if env.system_site_packages else []
    return " && ".join([
        "set -e",
        _words("mkdir", "-p", venv),
        f"printf %s {shlex.quote(text)} > {shell_path(req + '.tmp-')}$$",
        f"mv -f {shell_path(req + '.tmp-')}$$ {shell_path(req)}",
        # a venv cut off before its pip was installed (bin/python comes first) is made again over itself
        f"if [ ! -x {shell_path(python)} ] || ! {_words(python, '-c', 'import pip')} >/dev/null 2>&1; then "
        f"{_words('echo', 'creating venv ' + venv)}; {_words(env.base_python, '-m', 'venv', *flags, venv)}; fi",
        f"if grep -qvE '^[[:space:]]*(#.*)?$' {shell_path(req)}; then "
        f"{_words(python, '-m', 'pip', 'install', '--disable-pip-version-check', '-r', req)}; "
        "else echo 'no requirements to install'; fi",
        f"printf %s {_words(env_plan.digest)} > {shell_path(_in_venv(venv, HASH_FILE))}",
        "echo 'env ready'",
    ])


def prepare_setup(host: Host, env_plan: EnvPlan) -> str:
    """The setup job's script (run from the host's root: ``draftops.runs.tools.run_job(..., cwd=".")``);
    it writes the requirements itself, so nothing is uploaded ahead of it."""
    return setup_command(host, env_plan)
