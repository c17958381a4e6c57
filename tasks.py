"""draftops tasks. Run `invoke --list`; every task takes --host (default: $DRAFTOPS_HOST, else hosts.yaml)."""
from pathlib import Path

from invoke import Collection

from draftops.cli import core, env

ns = Collection()
for name in ("sync", "runs", "logs", "kill", "pull"):
    ns.add_task(getattr(core, name))
ns.add_collection(Collection.from_module(env, name="env"))
ns.configure({"draftops": {"project_root": str(Path(__file__).resolve().parent)}})
