"""The host's ml-env: create the venv and install its requirements once, skipping when nothing changed.

Named ``mlenv`` (not ``env``) so it never shadows ``os.environ`` idioms; the invoke namespace is ``env``.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from draftops import jobs
from draftops.errors import InventoryError
from draftops.host import Host
from draftops.jobs import shell_path

HASH_FILE = ".draftops-env-hash"
REQ_FILE = ".draftops-requirements.txt"


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
        if not path.is_file():
            raise InventoryError(f"Host {host.name!r}: env.requirements {path} does not exist; fix the path "
                                 "in hosts.yaml (relative paths are taken from hosts.yaml's folder).")
        requirements = path.read_bytes()
    digest = hashlib.sha256(b"\0".join([env.venv.encode(), env.base_python.encode(),
                                        str(env.system_site_packages).encode(), requirements])).hexdigest()
    venv = shell_path(env.venv)
    probe = f"[ -x {venv}/bin/python ] && cat {venv}/{HASH_FILE} 2>/dev/null || true"
    current = host.transport.run(probe).text.strip()
    return EnvPlan(env.venv, digest, requirements, current == digest)


def setup_command(host: Host, env_plan: EnvPlan) -> str:
    """The shell script of the setup job: venv if missing, pip install, then record the hash."""
    env = host.spec.env
    assert env is not None
    venv = shell_path(env_plan.venv)
    flags = " --system-site-packages" if env.system_site_packages else ""
    req = f"{venv}/{REQ_FILE}"
    return " && ".join([
        "set -e",
        f"if [ ! -x {venv}/bin/python ]; then echo 'creating venv {env_plan.venv}'; "
        f"{shell_path(env.base_python)} -m venv{flags} {venv}; fi",
        f"if grep -qvE '^[[:space:]]*(#.*)?$' {req}; then "
        f"{venv}/bin/python -m pip install --disable-pip-version-check -r {req}; "
        "else echo 'no requirements to install'; fi",
        f"printf %s {env_plan.digest} > {venv}/{HASH_FILE}",
        "echo 'env ready'",
    ])


def start_setup(host: Host, env_plan: EnvPlan) -> jobs.Job:
    """Upload the requirements next to the venv and start the setup job."""
    venv = shell_path(env_plan.venv)
    host.transport.run(f"mkdir -p {venv} && cat > {venv}/{REQ_FILE}", input=env_plan.requirements)
    return jobs.start(host, "env-setup", setup_command(host, env_plan), cwd=".")


def check_command(host: Host) -> str:
    return jobs.python_module_command(host, "remote.envcheck", ["--out", jobs.RUN_DIR])


