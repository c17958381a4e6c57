"""The advice of an UNKNOWN verdict whose dumps do not say which layer each slot holds (SpecForge and
ModelOpt dumps without a ``data_config.json``): instead of "write data_config.json", the commands
that answer the question. `invoke capture-check` asks the engine itself which boundary each slot
is; the trainer's run config next to the dumps says which ids it captured (trainerconfig.py reads
it). Written here in backticks (`` `invoke …` ``): the laptop rebuilds those with its own program
name, quoting and ``--host`` (draftops/cmdline.py ``commands_in``), so the printed command pastes."""
from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

from ..data import dumpformats, trainerconfig
from .layouts import Verdict

REASON = "no_layer_ids"


def speculators_default(fmt: str, slots: int, num_layers: int | None) -> str:
    """For speculators' safetensors dumps of four slots: the layers its data generation captures by
    default (launch_vllm: [2, n//2, n-3, n] in vLLM ids, the final n included; speculators PR #839), as
    the data_config.json that says so, to write only if the dumps were made without --target-layer-ids."""
    if fmt != dumpformats.SAFETENSORS or slots != 4 or num_layers is None:
        return ""
    n = num_layers
    ids = [2, n // 2, n - 3, n]
    if len(set(ids)) != len(ids):
        return ""
    doc = json.dumps({"layer_ids": ids, "layer_id_convention": "vllm", "final_slot": 3})
    return (f" speculators' launch_vllm captures {ids} by default for this {n}-layer target (vLLM ids, the final "
            f"layer n included): if the dumps were made without --target-layer-ids, data_config.json is {doc}.")


def advice(data: Path, ckpt: Path, fmt: str = "", slots: int = 0, num_layers: int | None = None) -> str:
    """What to run or put next to the dumps so the next evaluation names the slots' layers."""
    folder = data if data.is_dir() else data.parent
    command = f"`invoke capture-check --data {shlex.quote(str(data))} --draft {shlex.quote(str(ckpt))}`"
    yaml = trainerconfig.yaml_next_to(data)
    run_config = (f"the trainer's run config next to them as JSON (the YAML {shlex.quote(str(yaml))} there is not "
                  "read: save it as .json)" if yaml is not None else
                  "the trainer's run config next to them as JSON (SpecForge's run config, or the draft config "
                  f"with eagle_config.{trainerconfig.KEY})")
    return (f"Run {command} to have the engine say which layer each slot holds (its report then feeds test-drafter), "
            f"or put {run_config} in {shlex.quote(str(folder))}, or write data_config.json there with the "
            "layer id of each slot; then rerun." + speculators_default(fmt, slots, num_layers))


def with_commands(verdict: Verdict, data: Path, ckpt: Path, fmt: str = "", slots: int = 0,
                  num_layers: int | None = None) -> Verdict:
    """``verdict`` with the commands as its advice, when the dumps did not name their layers."""
    if verdict.reason != REASON or not verdict.advice:
        return verdict
    new = advice(data, ckpt, fmt, slots, num_layers)
    return dataclasses.replace(verdict, advice=new, message=verdict.message.replace(verdict.advice, new))
