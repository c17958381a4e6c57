"""draft-config on both config formats, with hand-made checkpoints (config.json + safetensors)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from remote import exitcodes
from remote.draft_config import rewrite
from remote.eagle import weights
from tests.support.draft_configs import FLAT_CONFIG, HIDDEN, make_ckpt, make_target, run_cli, write_safetensors
from tests.support.sglang_wheels import REPO, extract, run_patcher

SPECULATORS_CONFIG = {
    "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
    "draft_vocab_size": 100, "eagle_aux_hidden_state_layer_ids": [2, 30, 58],
    "norm_before_residual": True, "target_hidden_size": None,
    "transformer_layer_config": {"model_type": "llama", "hidden_size": HIDDEN,
                                 "num_hidden_layers": 1, "vocab_size": 1000},
}


def _backups(ckpt: Path) -> list[Path]:
    return sorted(ckpt.glob("config.json.draftops-bak-*"))


def test_flat_format_rewrites_eagle_config_and_keeps_a_backup(tmp_path):
    ckpt = make_ckpt(tmp_path / "draft", FLAT_CONFIG)
    original = (ckpt / "config.json").read_bytes()
    target = make_target(tmp_path / "target")
    proc, result = run_cli("--ckpt", str(ckpt), "--layer-ids", "-1,2,30", "--target", str(target),
                           out=tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    config = json.loads((ckpt / "config.json").read_text())
    assert config["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [-1, 2, 30],
                                      "use_aux_hidden_state": True}
    assert {k: v for k, v in config.items() if k != "eagle_config"} == \
        {k: v for k, v in FLAT_CONFIG.items() if k != "eagle_config"}
    assert (ckpt / "config.json").read_text().startswith('{\n    "architectures"')  # indent kept
    [backup] = _backups(ckpt)
    assert backup.read_bytes() == original and result["backup"] == str(backup)
    assert result["schema"] == "draftops.draft-config/1" and result["ok"] is True
    assert (result["format"], result["file_convention"]) == ("flat", "sglang-output-of-layer")
    assert (result["old_ids"], result["new_ids"], result["written_ids"]) == \
        ([1, 29, 57], [-1, 2, 30], [-1, 2, 30])
    assert result["changed"] is True and result["fc_aux_slots"] == 3
    assert result["needs_capture_patch"] is True
    assert result["target"]["num_hidden_layers"] == 61
    assert any("capture patch" in w for w in result["warnings"])


def test_speculators_format_rewrites_the_top_level_field_in_its_own_convention(tmp_path):
    ckpt = make_ckpt(tmp_path / "draft", SPECULATORS_CONFIG)
    proc, result = run_cli("--ckpt", str(ckpt), "--layer-ids", "-1,2,30", "--target",
                           str(make_target(tmp_path / "target")), out=tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    config = json.loads((ckpt / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == [0, 3, 31]
    assert "eagle_config" not in config
    assert config["transformer_layer_config"] == SPECULATORS_CONFIG["transformer_layer_config"]
    assert (result["format"], result["file_convention"]) == ("speculators", "vllm-after-k-layers")
    assert (result["old_ids"], result["new_ids"], result["written_ids"]) == \
        ([2, 30, 58], [-1, 2, 30], [0, 3, 31])
    assert any("never reads this field" in w for w in result["warnings"])
    assert len(_backups(ckpt)) == 1


@pytest.mark.parametrize("ids, why", [
    ("-1,2,60", "above 59"), ("-2,2,30", "below -1"), ("-1,2,2", "repeated"),
    ("-1,2", "fc.weight takes 3"),
])
def test_invalid_ids_are_refused_and_nothing_is_written(tmp_path, ids, why):
    ckpt = make_ckpt(tmp_path / "draft", FLAT_CONFIG)
    original = (ckpt / "config.json").read_bytes()
    proc, result = run_cli("--ckpt", str(ckpt), "--layer-ids", ids, "--target",
                           str(make_target(tmp_path / "target")), out=tmp_path / "out")
    assert proc.returncode == exitcodes.REFUSED
    assert result["ok"] is False and result["error_type"] == "InvalidLayerIds"
    assert why in proc.stderr and "eagle_config.eagle_aux_hidden_state_layer_ids" in proc.stderr
    assert str(ckpt / "config.json") in proc.stderr
    assert (ckpt / "config.json").read_bytes() == original and not _backups(ckpt)


def test_nested_target_config_and_sharded_weights_are_read(tmp_path):
    ckpt = make_ckpt(tmp_path / "draft", FLAT_CONFIG, aux=4, sharded=True)
    target = make_target(tmp_path / "target", layers=30, nested=True)
    proc, result = run_cli("--ckpt", str(ckpt), "--layer-ids", "-1,2,14,28", "--target",
                           str(target), out=tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    assert result["fc_aux_slots"] == 4 and result["target"]["num_hidden_layers"] == 30
    assert any("supports exactly 3" in w for w in result["warnings"])
    proc, result = run_cli("--ckpt", str(ckpt), "--layer-ids", "-1,2,14,29", "--target",
                           str(target), out=tmp_path / "out2")
    assert proc.returncode == exitcodes.REFUSED and "above 28" in proc.stderr


def _report(path: Path, status: str, fix: list[int] | None, patch: bool = True) -> Path:
    path.write_text(json.dumps({"verdict": {"status": status, "fix_layer_ids": fix,
                                            "needs_capture_patch": patch}, "details": {}}))
    return path


@pytest.mark.parametrize("status, fix, why", [
    ("MATCH", None, "says MATCH"), ("MATCH", [1, 29, 57], "says MATCH"),
    ("MISMATCH", None, "fix_layer_ids is null"),
])
def test_report_without_a_fix_is_refused(tmp_path, status, fix, why):
    ckpt = make_ckpt(tmp_path / "draft", FLAT_CONFIG)
    original = (ckpt / "config.json").read_bytes()
    report = _report(tmp_path / "report.json", status, fix)
    proc, result = run_cli("--ckpt", str(ckpt), "--from-report", str(report), out=tmp_path / "o")
    assert proc.returncode == exitcodes.REFUSED and result["error_type"] == "ReportError"
    assert why in proc.stderr and str(report) in proc.stderr
    assert (ckpt / "config.json").read_bytes() == original and not _backups(ckpt)


def test_report_fix_is_applied(tmp_path):
    ckpt = make_ckpt(tmp_path / "draft", FLAT_CONFIG)
    report = _report(tmp_path / "report.json", "MISMATCH", [30, -1, 2])
    proc, result = run_cli("--ckpt", str(ckpt), "--from-report", str(report), out=tmp_path / "o")
    assert proc.returncode == 0, proc.stderr
    assert result["source"] == {"kind": "report", "path": str(report), "status": "MISMATCH"}
    assert result["written_ids"] == [-1, 2, 30] and result["needs_capture_patch"] is True
    assert any("out of order" in w for w in result["warnings"])
    assert json.loads((ckpt / "config.json").read_text())["eagle_config"][
        "eagle_aux_hidden_state_layer_ids"] == [-1, 2, 30]


def test_repeated_runs_never_overwrite_a_backup(tmp_path):
    ckpt = make_ckpt(tmp_path / "draft", FLAT_CONFIG)
    contents = [(ckpt / "config.json").read_bytes()]
    for ids in ("-1,2,30", "0,2,30", "-1,2,30"):
        proc, _ = run_cli("--ckpt", str(ckpt), "--layer-ids", ids, out=tmp_path / "o")
        assert proc.returncode == 0, proc.stderr
        contents.append((ckpt / "config.json").read_bytes())
    backups = _backups(ckpt)
    assert len(backups) == 3
    assert sorted(b.read_bytes() for b in backups) == sorted(contents[:3])


def test_same_ids_again_writes_nothing_and_dry_run_writes_nothing(tmp_path):
    ckpt = make_ckpt(tmp_path / "draft", FLAT_CONFIG)
    proc, result = run_cli("--ckpt", str(ckpt), "--layer-ids", "1,29,57", out=tmp_path / "o")
    assert proc.returncode == 0 and result["changed"] is False and not _backups(ckpt)
    assert result["needs_capture_patch"] is False
    proc, result = run_cli("--ckpt", str(ckpt), "--layer-ids", "-1,2,30", "--dry-run",
                           out=tmp_path / "o2")
    assert proc.returncode == 0 and result["changed"] is False and result["dry_run"] is True
    assert result["written_ids"] == [-1, 2, 30] and not _backups(ckpt)
    assert json.loads((ckpt / "config.json").read_text()) == FLAT_CONFIG


def test_backup_name_skips_existing_backups(tmp_path):
    config = tmp_path / "config.json"
    config.write_text("{}")
    (tmp_path / "config.json.draftops-bak-X").write_text("old")
    (tmp_path / "config.json.draftops-bak-X-2").write_text("older")
    assert rewrite.backup_path(config, "X").name == "config.json.draftops-bak-X-3"


def test_a_target_config_is_not_taken_for_a_draft(tmp_path):
    target = make_target(tmp_path / "target")
    proc, result = run_cli("--ckpt", str(target), "--layer-ids", "-1,2,30", out=tmp_path / "o")
    assert proc.returncode == exitcodes.REFUSED and result["error_type"] == "ConfigFormatError"
    assert "not an EAGLE-3 draft config" in proc.stderr


def test_safetensors_header_is_read_without_torch(tmp_path):
    path = tmp_path / "m.safetensors"
    write_safetensors(path, {"model.fc.weight": [8, 24]})
    assert weights.find_shape(tmp_path, "fc.weight") == ([8, 24], path)
    assert weights.aux_slots([8, 24], 8) == 3 and weights.aux_slots([8, 24], 7) is None


def test_sglang_status_warns_until_the_capture_patch_is_applied(tmp_path):
    root = extract("0.5.13", tmp_path / "site")
    ckpt = make_ckpt(tmp_path / "draft", FLAT_CONFIG)
    target = make_target(tmp_path / "target")
    args = ("--ckpt", str(ckpt), "--layer-ids", "-1,2,30", "--target", str(target),
            "--sglang-status", "--dry-run")
    env = {"DRAFTOPS_STATE_DIR": str(tmp_path / "draftops")}
    proc, result = run_cli(*args, out=tmp_path / "o1", env=env, pythonpath=root)
    assert proc.returncode == 0, proc.stderr
    assert result["sglang"]["version"] == "0.5.13"
    flagged = [w for w in result["warnings"] if "SGLang 0.5.13's srt/models/deepseek_v2.py" in w]
    assert flagged and "needs-patch" in flagged[0]
    assert not any("llama.py" in w for w in result["warnings"]), "only the target's model file"
    assert run_patcher(root, "apply", "--models", "deepseek_v2",
                       state_dir=tmp_path / "draftops" / "sglang-patch").returncode == 0
    proc, result = run_cli(*args, out=tmp_path / "o2", env=env, pythonpath=root)
    assert result["sglang"]["files"]["srt/models/deepseek_v2.py"] == "patched"
    assert not any("SGLang 0.5.13" in w for w in result["warnings"])


def test_sglang_status_flags_the_cuda_graph_override(tmp_path):
    root = extract("0.5.10", tmp_path / "site")
    ckpt = make_ckpt(tmp_path / "draft", FLAT_CONFIG)
    target = make_target(tmp_path / "target", arch="Qwen3ForCausalLM")
    proc, result = run_cli("--ckpt", str(ckpt), "--layer-ids", "-1,2,30", "--target", str(target),
                           "--sglang-status", "--dry-run", out=tmp_path / "o", pythonpath=root)
    assert proc.returncode == 0, proc.stderr
    graph = [w for w in result["warnings"] if "CUDA-graph mode" in w]
    assert len(graph) == 2 and "--disable-cuda-graph" in graph[0]
    assert not any("qwen3.py is" in w for w in result["warnings"]), "qwen3 captures -1 natively"


def _file_size_limit(limit: int) -> Any:
    """preexec_fn: files this process writes stop at ``limit`` bytes (EFBIG, like a full disk)."""
    def apply() -> None:
        import resource
        import signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_backup_cut_off_by_a_full_disk_is_not_left_behind(tmp_path):
    config = {**FLAT_CONFIG, "pad": "x" * 20000}
    ckpt = make_ckpt(tmp_path / "draft", config)
    original = (ckpt / "config.json").read_bytes()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTOPS_")}
    proc = subprocess.run([sys.executable, "-m", "remote.draft_config", "--ckpt", str(ckpt),
                           "--layer-ids", "-1,2,30"], cwd=REPO, env={**env, "PYTHONDONTWRITEBYTECODE": "1"},
                          capture_output=True, text=True, timeout=120, preexec_fn=_file_size_limit(8192))
    assert proc.returncode == exitcodes.REFUSED and "Cannot write the backup" in proc.stderr
    assert (ckpt / "config.json").read_bytes() == original
    # a half-written backup would pass for the original later (and a rerun would name its own -2)
    assert not _backups(ckpt)
    proc, result = run_cli("--ckpt", str(ckpt), "--layer-ids", "-1,2,30", out=tmp_path / "o")
    assert proc.returncode == 0, proc.stderr
    assert [b.read_bytes() for b in _backups(ckpt)] == [original]


def test_a_report_on_another_checkpoint_says_so(tmp_path):
    # the fix holds for the draft the report evaluated; written into another folder (a copy is
    # fine: the seed loop fixes copies) it must not pass for a checked draft
    evaluated = make_ckpt(tmp_path / "evaluated", FLAT_CONFIG)
    other = make_ckpt(tmp_path / "other", FLAT_CONFIG)
    report = _report(tmp_path / "report.json", "MISMATCH", [-1, 2, 30])
    data = json.loads(report.read_text())
    data["checkpoint"] = {"path": str(evaluated), "config_path": str(evaluated / "config.json")}
    report.write_text(json.dumps(data))
    proc, result = run_cli("--ckpt", str(other), "--from-report", str(report), out=tmp_path / "o")
    assert proc.returncode == 0, proc.stderr
    assert result["written_ids"] == [-1, 2, 30]
    warning = result["warnings"][0]
    assert str(evaluated) in warning and str(other) in warning and "copy" in warning
    # the same folder by another name (a symlink, its config.json) is the evaluated draft
    (tmp_path / "link").symlink_to(evaluated)
    proc, result = run_cli("--ckpt", str(tmp_path / "link" / "config.json"), "--from-report", str(report),
                           out=tmp_path / "o2")
    assert proc.returncode == 0, proc.stderr
    assert not any("evaluated the draft at" in w for w in result["warnings"])


@pytest.mark.parametrize("text, needle", [
    ("-1,,2,30", "empty entry (entry 2)"), ("-1,2,30,", "empty entry (entry 4)"), ("", "is empty"),
    (" , ", "is empty"), ("-1,two,30", "not a comma-separated"),
    # int() takes these; the config must hold only ids the user typed as plain digits
    ("-1,\uff12,30", "entry '\uff12' is not an integer"), ("-1,1_0,30", "entry '1_0' is not an integer"),
    ("-1,+2,30", "entry '+2'"), ("-1,2.0,30", "entry '2.0'")])
def test_layer_ids_text_with_a_gap_or_a_word_is_refused(text: str, needle: str) -> None:
    from remote.draft_config.errors import InvalidLayerIds
    from remote.draft_config.validate import parse_ids
    with pytest.raises(InvalidLayerIds, match=re.escape(needle)):
        parse_ids(text)
    assert parse_ids(" -1, 2 ,30 ") == [-1, 2, 30]


_AT = ("import sys, time\n"
       "from remote.draft_config.__main__ import main\n"
       "time.sleep(max(0.0, float(sys.argv[1]) - time.time()))\n"
       "sys.exit(main(sys.argv[2:]))\n")


def test_concurrent_runs_on_one_checkpoint_serialize_and_each_reports_what_it_did(tmp_path):
    """Eight real processes rewrite one config at the same instant: every update lands (each run read
    the ids the run before it wrote), and a run's 'changed' and backup are true to what it did."""
    ckpt = make_ckpt(tmp_path / "ckpt", FLAT_CONFIG)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTOPS_")}
    start = time.time() + 3.0                      # after every process has imported the tool
    procs = [subprocess.Popen([sys.executable, "-c", _AT, str(start), "--ckpt", str(ckpt),
                               f"--layer-ids=-1,2,{k}", "--out", str(tmp_path / f"o{k}")],
                              cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for k in range(3, 11)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errors
    results = [json.loads((tmp_path / f"o{k}" / "draft_config.json").read_text()) for k in range(3, 11)]
    assert all(r["changed"] for r in results)
    olds = [tuple(r["old_ids"]) for r in results]
    assert len(set(olds)) == len(olds), olds         # no two runs read the same ids: none was lost
    written = {tuple(r["written_ids"]) for r in results}
    chain = set(olds) - written
    assert chain == {(1, 29, 57)}                   # only the first run read the original ids
    final = tuple(json.loads((ckpt / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    assert final in written and final not in olds   # the last writer's ids are what the file holds
    assert len(_backups(ckpt)) == len(results)


def test_a_config_locked_by_another_run_is_refused_after_the_wait_with_nothing_changed(tmp_path):
    import fcntl

    from remote.draft_config.lock import lock_path
    ckpt = make_ckpt(tmp_path / "ckpt", FLAT_CONFIG)
    before = (ckpt / "config.json").read_bytes()
    with open(lock_path(ckpt), "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        proc, result = run_cli("--ckpt", str(ckpt), "--layer-ids", "-1,2,30", "--lock-timeout", "0.3",
                               out=tmp_path / "o")
    assert proc.returncode == exitcodes.BUSY and result["error_type"] == "ConfigBusy"
    assert str(ckpt) in result["error"] and "did not finish within 0.3 s" in result["error"]
    assert (ckpt / "config.json").read_bytes() == before and not _backups(ckpt)
