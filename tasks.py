"""draftops tasks. Run `invoke --list`; every task takes --host (default: $DRAFTOPS_HOST, else hosts.yaml).

One `--host X` anywhere on the command line applies to every task of that call.
"""
import atexit
import gc
import sys
from pathlib import Path

from invoke import Collection

from draftops.cli import bench, capture, collect, core, doctor, drafter, env, history, nightly, serve, sglang, tune
from draftops.cli.common import (
    adopt_callwide_host,
    first_paragraph_as_summary,
    honest_option_help,
)
from draftops.cli.parsing import teach_parser

adopt_callwide_host(sys.argv)
honest_option_help()
teach_parser()
# At exit, the interpreter's last garbage collection walks every object of every imported library
# (pydantic, paramiko, rich): ~0.1 s of each call. Frozen, they are skipped; connections are closed by
# their own atexit hook and draftops leaves no file open for the collector to flush.
atexit.register(gc.freeze)

ns = Collection()
for name in ("sync", "logs", "kill", "pull", "disconnect"):
    ns.add_task(getattr(core, name))
runs = Collection("runs")                       # `invoke runs` lists runs; `invoke runs.export` sends them to MLflow
runs.add_task(core.runs, name="list", default=True)
runs.add_task(history.export)
ns.add_collection(runs)
ns.add_task(drafter.test_drafter)
ns.add_task(capture.capture_check)
ns.add_task(collect.collect)
ns.add_collection(Collection("patch-sglang", sglang.status, sglang.apply, sglang.verify, sglang.revert))
ns.add_task(sglang.draft_config)
ns.add_task(sglang.draft_flat)
ns.add_task(doctor.doctor)
ns.add_task(tune.tune)
ns.add_collection(Collection.from_module(env, name="env"))
ns.add_collection(Collection.from_module(bench, name="bench"))
ns.add_collection(Collection("serve", serve.start, serve.status, serve.stop, serve.logs))
ns.add_collection(Collection("nightly", nightly.run, nightly.schedule, nightly.unschedule))
first_paragraph_as_summary([*ns.tasks.values(), *(t for sub in ns.collections.values() for t in sub.tasks.values())])
# task_names, task_options: what a playbook step may name and pass (checked when a playbook loads)
ns.configure({"draftops": {"project_root": str(Path(__file__).resolve().parent),
                           "task_names": sorted({*ns.task_names, *(a for al in ns.task_names.values() for a in al)}),
                           "task_options": nightly.task_options(ns)}})
