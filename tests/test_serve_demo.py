"""`invoke serve --draft demo` serves the demo draft as it is configured: the seed's wrong layer ids
(so the measured accept length is the low one the drafter report predicts), and after `draft-config
--from-report` rewrites that config, the fixed ids. Real files throughout: the generated demo, the
drafter's own report, the real config rewrite and the host tool's reading of the draft config."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from draftops.documents import parse
from draftops.documents.serve_inspect import ServeInspect
from draftops.inventory import HostSpec, ServeProfile
from draftops.serve import checks, profiles, verdicts
from draftops.serve.request import Request, demo_dir, resolve
from remote.draft_config.__main__ import main as draft_config_main
from remote.drafter.demo.build import read_serve_info
from remote.serve.configs import inspect
from tests.conftest import REPO, copy_remote_package, ssh_entry
from tests.support.drafter_support import demo, run_eval
from tests.support.tasks import invoke

RUN_ID = "20261130-000000-test-drafter-demo"


def host_state(tmp_path: Path) -> Path:
    """A host's state folder holding a copy of this process's demo (same parameters: complete)."""
    state = tmp_path / "state"
    shutil.copytree(demo().root, state / "demo")
    return state


def served(state: Path, force: bool = False) -> tuple[str, list[int] | None, checks.Findings]:
    """What `serve --draft demo` on a vLLM profile would give vLLM: the draft folder in its
    --speculative-config, the ids vLLM reads from that folder's config, and the pre-start findings."""
    spec = HostSpec(name="box", address="box.example", engine="vllm",
                    serve={"p": ServeProfile(python=sys.executable, max_running_requests=8)})
    plan = resolve(Request(draft="demo", force=force), profiles.resolve(spec), demo_dir(str(state)))
    argv = plan.engine.command(plan.launch)
    folder = json.loads(argv[argv.index("--speculative-config") + 1])["model"]
    answer = inspect("vllm", Path(plan.launch.target), Path(folder), sglang_status=False)
    facts = parse(ServeInspect, answer, "the inspect answer")
    facts.engine.importable = True            # as the profile's engine python would see it
    found = checks.Findings()
    checks.fact_checks(plan, facts, verdicts.latest(state.parent / "runs", folder), found)
    return folder, facts.draft.ids_by_engine["vllm"] if facts.draft else None, found


def test_demo_is_served_as_configured_then_with_the_ids_draft_config_wrote(tmp_path):
    state = host_state(tmp_path)
    info = read_serve_info(state / "demo")
    folder, ids, found = served(state)
    assert folder == str(state / "demo" / "draft")
    assert ids == info["buggy_layer_ids_vllm"] != info["draft_layer_ids_vllm"]
    assert not found.refusals

    # the drafter's verdict on that draft: MISMATCH, with the fix; the demo is served anyway (it
    # exists to show the bug), with the verdict and the command that fixes it shown
    run = tmp_path / "runs" / RUN_ID
    report = run_eval(run, ckpt=Path(folder), data=demo().data, verifier=demo().target)
    assert report["verdict"]["status"] == "MISMATCH"
    _, _, found = served(state)
    assert not found.refusals
    warning = next(w for w in found.warnings if "is MISMATCH" in w)
    assert f"invoke draft-config --ckpt demo --from-report {RUN_ID}" in warning

    # draft-config --from-report: backup first, then the new ids; the next serve gives them to vLLM
    config = Path(folder) / "config.json"
    before = config.read_bytes()
    assert draft_config_main(["--ckpt", folder, "--from-report", str(run / "report.json"),
                              "--out", str(tmp_path / "dc")]) == 0
    backups = list(config.parent.glob("config.json.draftops-bak-*"))
    assert [b.read_bytes() for b in backups] == [before]
    folder_after, ids_after, found = served(state)
    assert folder_after == folder and ids_after == info["draft_layer_ids_vllm"]
    assert not found.refusals and not any("is MISMATCH" in w for w in found.warnings)
    assert any(f"for ids {info['buggy_layer_ids_vllm']}" in n and "no longer applies" in n for n in found.notes)


def test_a_mismatch_verdict_still_refuses_a_draft_that_is_not_the_demo(tmp_path):
    state = host_state(tmp_path)
    mine = tmp_path / "mine"
    shutil.copytree(state / "demo" / "draft", mine)
    run_eval(tmp_path / "runs" / RUN_ID, ckpt=mine, data=demo().data, verifier=demo().target)
    spec = HostSpec(name="box", address="box.example", engine="vllm",
                    serve={"p": ServeProfile(python=sys.executable, max_running_requests=8)})
    plan = resolve(Request(draft=str(mine), target=str(state / "demo" / "target")), profiles.resolve(spec),
                   demo_dir(str(state)))
    answer = inspect("vllm", Path(plan.launch.target), mine, sglang_status=False)
    facts = parse(ServeInspect, answer, "the inspect answer")
    facts.engine.importable = True
    found = checks.Findings()
    checks.fact_checks(plan, facts, verdicts.latest(tmp_path / "runs", str(mine)), found)
    assert any("is MISMATCH" in r and "--force" in r for r in found.refusals)


@pytest.mark.ssh
@pytest.mark.parametrize("where", ["box", "local"])
def test_draft_config_ckpt_demo_rewrites_the_hosts_demo_draft_with_a_backup(make_project, sshd, tmp_path,
                                                                             no_inventory_env, where):
    root = make_project({"box": ssh_entry(sshd, tmp_path, python=sys.executable)}, default=where)
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    copy_remote_package(root)
    host_root = tmp_path / "hostroot" if where == "box" else root / ".draftops"
    shutil.copytree(demo().root, host_root / "state" / "demo")
    info = read_serve_info(host_root / "state" / "demo")
    config = host_root / "state" / "demo" / "draft" / "config.json"
    before = config.read_bytes()
    out = invoke(root, "draft-config", "--ckpt", "demo", "--layer-ids=-1,1,3")
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(config.read_text())["eagle_aux_hidden_state_layer_ids"] == info["draft_layer_ids_vllm"]
    assert [b.read_bytes() for b in config.parent.glob("config.json.draftops-bak-*")] == [before]
    # checked against the demo's own target: an id past its layers is refused, nothing written
    out = invoke(root, "draft-config", "--ckpt", "demo", "--layer-ids=-1,1,9")
    text = " ".join((out.stdout + out.stderr).split())
    assert out.returncode == 1 and "id(s) [9] above 4: the target" in text and "has 6 layers" in text, text
    assert json.loads(config.read_text())["eagle_aux_hidden_state_layer_ids"] == info["draft_layer_ids_vllm"]


@pytest.mark.ssh
def test_draft_config_ckpt_demo_as_the_first_command_generates_the_demo(make_project, tmp_path, no_inventory_env):
    """`--ckpt demo` on a host that has no demo yet builds it (as `serve --draft demo` does) instead of
    failing to read a config that is not there."""
    root = make_project({}, default="local")
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    copy_remote_package(root)
    config = root / ".draftops" / "state" / "demo" / "draft" / "config.json"
    assert not config.exists()
    out = invoke(root, "draft-config", "--ckpt", "demo", "--layer-ids=-1,1,3", "--dry-run")
    text = " ".join((out.stdout + out.stderr).split())
    assert out.returncode == 0, text
    assert config.is_file() and "would write" in text
    assert not list(config.parent.glob("config.json.draftops-bak-*"))     # a dry run writes nothing
