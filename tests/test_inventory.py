"""hosts.yaml validation: defaults, overrides and errors that name file, line, host and field."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from draftops.errors import InventoryError
from draftops.inventory import load_inventory

REPO = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    return path


def refused(path: Path, tmp_path: Path, match: str) -> None:
    """Loading the inventory at ``path`` fails with an InventoryError matching ``match``."""
    with pytest.raises(InventoryError, match=match):
        load_inventory(path, tmp_path)


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
    assert [hop.name for hop in inv.jump_chain(gpu)] == ["bastion"]


def test_host_env_var_overrides_default(tmp_path, monkeypatch):
    path = write(tmp_path, "hosts:\n  gpu:\n    address: gpu.example\n")
    monkeypatch.setenv("DRAFTOPS_HOST", "gpu")
    assert load_inventory(path, tmp_path).get().name == "gpu"
    assert load_inventory(path, tmp_path).get("local").name == "local"   # --host beats the variable


def test_malformed_yaml_names_file_and_line(tmp_path, no_inventory_env):
    path = write(tmp_path, "hosts:\n  gpu:\n    address: gpu.example\n   port: 22\n")
    refused(path, tmp_path, rf"{path}:4: hosts.yaml is not valid YAML")


def test_bad_field_names_host_field_and_line(tmp_path, no_inventory_env):
    path = write(tmp_path, "hosts:\n  gpu:\n    address: gpu.example\n    port: seventy\n    hostkey: strict\n")
    with pytest.raises(InventoryError) as err:
        load_inventory(path, tmp_path)
    text = str(err.value)
    assert f"{path}:4: host 'gpu', field `port`" in text
    assert (f"{path}:5: host 'gpu', field `hostkey`: unknown field (did you mean `host_key`?); "
            "valid fields are") in text
    assert "host_key" in text


def test_host_key_policy_must_be_known(tmp_path, no_inventory_env):
    path = write(tmp_path, "hosts:\n  gpu:\n    address: gpu.example\n    host_key: yolo\n")
    refused(path, tmp_path, r":4: host 'gpu', field `host_key`.*'strict' or 'accept-new'")


@pytest.mark.parametrize(("text", "match"), [
    ("hosts:\n  gpu:\n    user: root\n", r"{path}:2: host 'gpu': an ssh host needs `address`"),
    ("default: nowhere\nhosts:\n  gpu:\n    address: g.example\n",
     r":1: default host 'nowhere' is not defined; known hosts: gpu, local"),
    ("default: local\nhosts:\n  gpu:\n    address: g.example\nhost:\n  x: 1\n",
     r"{path}:5: unknown top-level key `host` \(did you mean `hosts`\?\)"),
    ("defaults: gpu\nhosts: {}\n", r"{path}:1: unknown top-level key `defaults`"),
], ids=["ssh-host-without-address", "bad-default", "unknown-top-level-key-near-miss", "unknown-top-level-key"])
def test_a_refused_inventory_names_file_line_and_what(tmp_path, no_inventory_env, text, match):
    """An ssh host without an address, a default host not defined, an unknown top-level key (and the
    key it nearly is): each refused with the file, the line and what is wrong."""
    path = write(tmp_path, text)
    refused(path, tmp_path, match.replace("{path}", str(path)))


def test_relative_local_paths_resolve_from_inventory_folder(tmp_path, no_inventory_env):
    path = write(tmp_path, "hosts:\n  gpu:\n    address: g.example\n    key: keys/id\n"
                           "    env:\n      venv: ~/ml-env\n      requirements: req.txt\n")
    gpu = load_inventory(path, tmp_path).get("gpu")
    assert gpu.key == str(tmp_path / "keys/id")
    assert gpu.env.requirements == str(tmp_path / "req.txt")
    assert gpu.interpreter == "~/ml-env/bin/python"


@pytest.mark.parametrize("jump", ["'a b@c'", "'a[/b]'", "'u@h:99999'", "'u@h:'", "'@h'", "'x,'"])
def test_bad_jump_spec_is_refused_at_load_with_its_line(tmp_path, no_inventory_env, jump):
    path = write(tmp_path, f"hosts:\n  gpu:\n    address: g.example\n    jump: {jump}\n")
    refused(path, tmp_path, rf"{path}:4: Host 'gpu': jump hop .* is neither a host")


# --- R13: names, unknown keys, duplicates, env field errors -------------------------------------

@pytest.mark.parametrize("name", ["../x", "a/b", "a[/b]", ".hidden", "-flag", "sp ace", "new\\nline",
                                  "a" * 65, "''", "'[bold]x'", "true"])
def test_host_names_outside_the_safe_pattern_are_refused(tmp_path, no_inventory_env, name):
    path = write(tmp_path, f"hosts:\n  ok:\n    address: g.example\n  \"{name}\":\n    address: h.example\n"
                 if not name.startswith("'") and name != "true" else
                 f"hosts:\n  ok:\n    address: g.example\n  {name}:\n    address: h.example\n")
    refused(path, tmp_path, rf"{path}:4: host name .* is not allowed: use 1-64 letters")


@pytest.mark.parametrize("name", ["gpu-1", "gpu_2.lab", "B200", "7"])
def test_ordinary_host_names_are_accepted(tmp_path, no_inventory_env, name):
    path = write(tmp_path, f"hosts:\n  {name}:\n    address: g.example\n")
    assert load_inventory(path, tmp_path).get(name).name == name


def test_duplicate_host_names_both_lines(tmp_path, no_inventory_env):
    path = write(tmp_path, "hosts:\n  gpu:\n    address: first.example\n  other:\n    address: o.example\n"
                           "  gpu:\n    address: second.example\n")
    refused(path, tmp_path, rf"{path}:6: .*`gpu` appears twice in the same mapping "
                            r"\(lines 2 and 6\)")


@pytest.mark.parametrize("text,lines", [
    ("hosts:\n  gpu:\n    address: a.example\n    port: 22\n    port: 2222\n", (4, 5)),
    ("default: local\nhosts: {}\ndefault: gpu\n", (1, 3)),
    ("hosts:\n  gpu:\n    address: a.example\n    env:\n      venv: ~/a\n      venv: ~/b\n", (5, 6)),
    ("hosts: {gpu: {address: a.example}, gpu: {address: b.example}}\n", (1, 1)),
])
def test_duplicate_keys_anywhere_are_refused(tmp_path, no_inventory_env, text, lines):
    path = write(tmp_path, text)
    refused(path, tmp_path, rf"appears twice .*\(lines {lines[0]} and {lines[1]}\)")


def test_yaml_merge_keys_are_not_duplicates(tmp_path, no_inventory_env):
    path = write(tmp_path, "hosts:\n  base: &base\n    address: a.example\n    user: root\n"
                           "  gpu:\n    <<: *base\n    address: b.example\n")
    gpu = load_inventory(path, tmp_path).get("gpu")
    assert gpu.address == "b.example" and gpu.user == "root"


def test_bad_env_field_lists_env_fields_not_host_fields(tmp_path, no_inventory_env):
    path = write(tmp_path, "hosts:\n  gpu:\n    address: g.example\n    env:\n      venv: ~/ml\n"
                           "      requirement: r.txt\n")
    with pytest.raises(InventoryError) as err:
        load_inventory(path, tmp_path)
    text = str(err.value)
    assert f"{path}:6: host 'gpu', field `env.requirement`: unknown field (did you mean `requirements`?)" in text
    assert "valid `env` fields are venv, requirements, base_python, system_site_packages" in text
    assert "address" not in text and "host_key" not in text


def test_name_field_inside_an_entry_is_refused(tmp_path, no_inventory_env):
    path = write(tmp_path, "hosts:\n  gpu:\n    address: g.example\n    name: other\n")
    refused(path, tmp_path, rf"{path}:4: host 'gpu', field `name`")


@pytest.mark.parametrize("text", ["", "# only a comment\n", "hosts:\n"])
def test_empty_inventory_means_local_only(tmp_path, no_inventory_env, text):
    assert load_inventory(write(tmp_path, text), tmp_path).names() == ["local"]


# --- R3 at the schema: values that reach a host shell must be host paths --------------------------

@pytest.mark.parametrize("field,value", [
    ("env.venv", "ml-env"), ("env.venv", "~"), ("env.venv", "/"), ("env.venv", "~other/ml"),
    ("env.venv", "-rf"), ("env.venv", "/a\0b"), ("python", "bin/python"), ("python", "python3 -X dev"),
    ("python", "$(id)"), ("python", "`id`"), ("env.base_python", "py;id"), ("env.base_python", "./py"),
])
def test_host_paths_must_be_absolute_home_relative_or_a_command(tmp_path, no_inventory_env, field, value):
    env = {"venv": "~/ml"}
    entry: dict = {"address": "g.example", "env": env}
    if field.startswith("env."):
        env[field[4:]] = value
    else:
        entry[field] = value
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump({"hosts": {"gpu": entry}}))
    with pytest.raises(InventoryError, match=rf"host 'gpu', field `{field}`: .*(must be|NUL|home directory)"):
        load_inventory(path, tmp_path)


@pytest.mark.parametrize("venv", ["/opt/ml env'$(touch x)`id`", "~/a\nb", "/x/\"q\";y"])
def test_odd_but_absolute_host_paths_are_accepted_verbatim(tmp_path, no_inventory_env, venv):
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump({"hosts": {"gpu": {"address": "g.example", "env": {"venv": venv}}}}))
    gpu = load_inventory(path, tmp_path).get("gpu")
    assert gpu.env.venv == venv and gpu.interpreter == venv + "/bin/python"


# --- R7 at the schema: chains, loops -------------------------------------------------------------

def test_jump_chain_follows_every_hop_outermost_first(tmp_path, no_inventory_env):
    path = write(tmp_path, "hosts:\n  a:\n    address: a.example\n    jump: b\n"
                           "  b:\n    address: b.example\n    jump: c\n"
                           "  c:\n    address: c.example\n    jump: 'u@d.example:2200,e.example'\n")
    inv = load_inventory(path, tmp_path)
    chain = inv.jump_chain(inv.get("a"))
    assert [(h.name, h.address, h.port) for h in chain] == [
        ("u@d.example:2200", "d.example", 2200), ("e.example", "e.example", 22),
        ("c", "c.example", 22), ("b", "b.example", 22)]
    assert chain[0].user == "u" and chain[1].user is None


@pytest.mark.parametrize("hosts,line,loop", [
    ({"a": "a"}, 4, "a -> a"),
    ({"a": "b", "b": "a"}, 4, "a -> b -> a"),
    ({"a": "b", "b": "c", "c": "b"}, 4, "a -> b -> c -> b"),
    ({"a": "x.example,b", "b": "a"}, 4, "a -> b -> a"),
])
def test_jump_loops_are_refused_naming_the_loop(tmp_path, no_inventory_env, hosts, line, loop):
    text = "hosts:\n" + "".join(f"  {name}:\n    address: {name}.example\n    jump: '{jump}'\n"
                                for name, jump in hosts.items())
    path = write(tmp_path, text)
    refused(path, tmp_path, rf"{path}:{line}: .*jump chain {loop} loops back")


def test_jump_through_the_local_host_is_refused(tmp_path, no_inventory_env):
    path = write(tmp_path, "hosts:\n  a:\n    address: a.example\n    jump: local\n")
    refused(path, tmp_path, rf"{path}:4: Host 'a': jump host 'local' is not an ssh host")


@pytest.mark.parametrize("value", ["-1", ".nan", "soon", "90000"])
def test_persist_is_a_number_of_seconds_up_to_a_day(tmp_path, no_inventory_env, value):
    path = write(tmp_path, f"hosts:\n  gpu:\n    address: gpu.example\n    persist: {value}\n")
    refused(path, tmp_path, rf"{path}:4: host 'gpu', field `persist`")
    ok = write(tmp_path, "hosts:\n  gpu:\n    address: gpu.example\n    persist: 0\n")
    assert load_inventory(ok, tmp_path).get("gpu").persist == 0


@pytest.mark.parametrize("field, value", [("port", "true"), ("connect_timeout", "yes"), ("persist", "on"),
                                          ("serve.p.port", "true"), ("serve.p.tp", "true")])
def test_a_boolean_is_not_taken_for_a_number(tmp_path, no_inventory_env, field, value):
    """YAML's true/yes/on are booleans; pydantic alone would read `port: true` as port 1."""
    if field.startswith("serve."):
        text = f"hosts:\n  gpu:\n    address: gpu.example\n    serve:\n      p:\n        {field[8:]}: {value}\n"
        where = f":6: host 'gpu', serve profile 'p', field `{field[8:]}`"
    else:
        text = f"hosts:\n  gpu:\n    address: gpu.example\n    {field}: {value}\n"
        where = f":4: host 'gpu', field `{field}`"
    with pytest.raises(InventoryError, match=rf"{where}: write a number, not true"):
        load_inventory(write(tmp_path, text), tmp_path)
