"""hosts.yaml for a Slurm cluster: `scheduler: slurm` and its `slurm:` settings, validated like the rest
(file, line, host and field named), merged per task and serve profile into sbatch options."""
from __future__ import annotations

from pathlib import Path

import pytest

from draftops.errors import InventoryError
from draftops.inventory import load_inventory
from draftops.slurmspec import resolve, sbatch_args

CLUSTER = """\
hosts:
  cluster:
    address: login.cluster.example
    scheduler: slurm
    slurm:
      partition: gpu
      account: team-draft
      qos: normal
      time: "04:00:00"
      gpus: 4
      cpus: 16
      mem: 256G
      max_pending: 1800
      extra_args: ["--constraint=h100", "--exclusive"]
      tasks:
        bench: {time: "30", gpus: "h100:8"}
    serve:
      kimi:
        target: /models/Kimi-K2.5
        slurm: {time: "1-00:00:00", extra_args: ["--signal=B:TERM@120"]}
"""


def load(tmp_path: Path, text: str):
    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    return load_inventory(path, tmp_path)


def test_a_cluster_entry_becomes_sbatch_options_with_task_and_profile_overrides(tmp_path, no_inventory_env):
    spec = load(tmp_path, CLUSTER).get("cluster")
    assert spec.scheduler == "slurm"
    assert sbatch_args(resolve(spec.slurm, "test-drafter")) == [
        "--partition=gpu", "--account=team-draft", "--qos=normal", "--time=04:00:00", "--gpus=4",
        "--cpus-per-task=16", "--mem=256G", "--constraint=h100", "--exclusive"]
    bench = sbatch_args(resolve(spec.slurm, "bench"))
    assert "--time=30" in bench and "--gpus=h100:8" in bench and "--partition=gpu" in bench
    serve = resolve(spec.slurm, "serve-vllm-8000", spec.serve["kimi"].slurm)
    assert serve.time == "1-00:00:00" and serve.max_pending == 1800
    assert serve.extra_args == ["--constraint=h100", "--exclusive", "--signal=B:TERM@120"]


@pytest.mark.parametrize("field, value, says", [
    ("time", '"1 hour"', "is not a Slurm time limit"),
    ("partition", '"gpu; rm -rf ~"', "is not a Slurm name"),
    ("partition", '"gpu\\n#SBATCH --wrap=x"', "newline or another control character"),
    ("account", '"\\e[31mred"', "control character"),
    ("mem", "lots", "is not a Slurm memory size"),
    ("cpus", "true", "write a number"),
    ("cpus", "100000", "less than or equal to 4096"),
    ("max_pending", "-5", "greater than 0"),
    ("extra_args", '"--exclusive"', "YAML list"),
    ("extra_args", '["-N 2"]', "is not one sbatch option"),
    ("extra_args", '["--output=/etc/passwd"]', "sets an option draftops sets itself"),
    ("extra_args", '["--job-name=x"]', "sets an option draftops sets itself"),
    ("extra_args", '["--comment=a\\nb"]', "control character"),
    ("extra_args", '["--constraint", "h100"]', "is not one sbatch option"),
    ("tasks", "{train: {time: '5'}}", "name no draftops job"),
])
def test_a_bad_slurm_value_names_the_file_line_host_and_field(tmp_path, no_inventory_env, field, value, says):
    text = f"hosts:\n  cluster:\n    address: login.example\n    scheduler: slurm\n    slurm:\n      {field}: {value}\n"
    with pytest.raises(InventoryError) as err:
        load(tmp_path, text)
    message = str(err.value)
    assert "hosts.yaml:6: host 'cluster', field `slurm." in message and says in message, message


def test_an_unknown_slurm_key_lists_the_valid_ones(tmp_path, no_inventory_env):
    text = "hosts:\n  cluster:\n    address: login.example\n    scheduler: slurm\n    slurm:\n      partion: gpu\n"
    with pytest.raises(InventoryError) as err:
        load(tmp_path, text)
    message = str(err.value)
    assert "hosts.yaml:6" in message and "(did you mean `partition`?)" in message and "max_pending" in message


def test_slurm_settings_without_the_scheduler_are_refused(tmp_path, no_inventory_env):
    text = "hosts:\n  cluster:\n    address: login.example\n    slurm: {partition: gpu}\n"
    with pytest.raises(InventoryError, match="add `scheduler: slurm`"):
        load(tmp_path, text)
    with pytest.raises(InventoryError, match="scheduler"):
        load(tmp_path, "hosts:\n  cluster:\n    address: login.example\n    scheduler: pbs\n")


def test_a_bad_serve_profile_slurm_value_names_the_profile(tmp_path, no_inventory_env):
    text = ("hosts:\n  cluster:\n    address: login.example\n    scheduler: slurm\n    serve:\n      big:\n"
            "        slurm: {time: forever}\n")
    with pytest.raises(InventoryError) as err:
        load(tmp_path, text)
    assert "serve profile 'big', field `slurm.time`" in str(err.value), str(err.value)
