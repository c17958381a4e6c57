"""A number longer than Python reads (int max-str-digits) in a hand-edited YAML file is one paragraph
naming file, line and field, in hosts.yaml and in a playbook alike (the shared loader), not the
ValueError of int() as a traceback."""
from __future__ import annotations

import sys

import pytest

from draftops.errors import InventoryError, PlaybookError
from draftops.inventory import load_inventory
from draftops.nightly import playbook

LONG = "9" * (sys.get_int_max_str_digits() + 700)


@pytest.mark.parametrize("number", [LONG, "-" + LONG, "+" + LONG, "1_" + LONG])
def test_long_integer_in_hosts_yaml_names_line_and_field(tmp_path, no_inventory_env, number):
    path = tmp_path / "hosts.yaml"
    path.write_text(f"hosts:\n  gpu:\n    address: g.example\n    port: {number}\n")
    with pytest.raises(InventoryError) as info:
        load_inventory(path, tmp_path)
    text = str(info.value)
    assert text.startswith(f"{path}:4: field `hosts.gpu.port`: a number "), text
    assert "quote it" in text and "\n" not in text


def test_long_integer_in_a_list_in_a_playbook(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(f"hosts: [box]\nsteps:\n  - name: sync\n    task: sync\n    args: {{n: [1, {LONG}]}}\n")
    with pytest.raises(PlaybookError) as info:
        playbook.load(path)
    text = str(info.value)
    assert f"{path}:5:" in text and "field `steps[0].args.n[1]`" in text, text


def test_long_integer_as_a_key(tmp_path, no_inventory_env):
    path = tmp_path / "hosts.yaml"
    path.write_text(f"hosts:\n  ? {LONG}\n  : {{address: g.example}}\n")   # a long plain key needs `?`
    with pytest.raises(InventoryError, match=rf"{path}:2: field `hosts.\(key\)`"):
        load_inventory(path, tmp_path)
