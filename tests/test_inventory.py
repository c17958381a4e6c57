"""hosts.yaml validation: defaults, overrides and errors that name file, line, host and field."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from draftops.errors import InventoryError
from draftops.inventory import load_inventory

REPO = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    return path


def test_builtin_local_host_is_default_without_inventory(tmp_path, no_inventory_env):
    inv = load_inventory(tmp_path / "missing.yaml", tmp_path)
    local = inv.get()
    assert local.name == "local" and local.transport == "local"
    assert local.root == str(tmp_path / ".draftops") and local.interpreter == sys.executable


def test_repo_inventory_is_valid_and_defaults_to_local(no_inventory_env):
    inv = load_inventory(REPO / "hosts.yaml", REPO)
    assert inv.get().name == "local"
    gpu = inv.get("blackwell")
    assert gpu.address.endswith(".example") and gpu.host_key == "strict"
    assert inv.parse_jump(gpu).name == "bastion"


def test_host_env_var_overrides_default(tmp_path, monkeypatch):
    path = write(tmp_path, "hosts:\n  gpu:\n    address: gpu.example\n")
    monkeypatch.setenv("DRAFTOPS_HOST", "gpu")
    assert load_inventory(path, tmp_path).get().name == "gpu"
    assert load_inventory(path, tmp_path).get("local").name == "local"   # --host beats the variable


def test_malformed_yaml_names_file_and_line(tmp_path, no_inventory_env):
    path = write(tmp_path, "hosts:\n  gpu:\n    address: gpu.example\n   port: 22\n")
    with pytest.raises(InventoryError, match=rf"{path}:4: hosts.yaml is not valid YAML"):
        load_inventory(path, tmp_path)


def test_bad_field_names_host_field_and_line(tmp_path, no_inventory_env):
    path = write(tmp_path, "hosts:\n  gpu:\n    address: gpu.example\n    port: seventy\n    hostkey: strict\n")
    with pytest.raises(InventoryError) as err:
        load_inventory(path, tmp_path)
    text = str(err.value)
    assert f"{path}:4: host 'gpu', field `port`" in text
    assert f"{path}:5: host 'gpu', field `hostkey`: unknown field; valid fields are" in text
    assert "host_key" in text


def test_host_key_policy_must_be_known(tmp_path, no_inventory_env):
    path = write(tmp_path, "hosts:\n  gpu:\n    address: gpu.example\n    host_key: yolo\n")
    with pytest.raises(InventoryError, match=r":4: host 'gpu', field `host_key`.*'strict' or 'accept-new'"):
        load_inventory(path, tmp_path)


def test_ssh_host_without_address_and_bad_default(tmp_path, no_inventory_env):
    path = write(tmp_path, "hosts:\n  gpu:\n    user: root\n")
    with pytest.raises(InventoryError, match="needs `address`"):
        load_inventory(path, tmp_path)
    path = write(tmp_path, "default: nowhere\nhosts:\n  gpu:\n    address: g.example\n")
    with pytest.raises(InventoryError, match=r":1: default host 'nowhere' is not defined; known hosts: gpu, local"):
        load_inventory(path, tmp_path)


def test_relative_local_paths_resolve_from_inventory_folder(tmp_path, no_inventory_env):
    path = write(tmp_path, "hosts:\n  gpu:\n    address: g.example\n    key: keys/id\n"
                           "    env:\n      venv: ~/ml-env\n      requirements: req.txt\n")
    gpu = load_inventory(path, tmp_path).get("gpu")
    assert gpu.key == str(tmp_path / "keys/id")
    assert gpu.env.requirements == str(tmp_path / "req.txt")
    assert gpu.interpreter == "~/ml-env/bin/python"


def test_bad_jump_spec(tmp_path, no_inventory_env):
    path = write(tmp_path, "hosts:\n  gpu:\n    address: g.example\n    jump: 'a b@c'\n")
    inv = load_inventory(path, tmp_path)
    with pytest.raises(InventoryError, match="neither a host"):
        inv.parse_jump(inv.get("gpu"))
