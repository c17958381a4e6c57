"""A draft or target config nested 10,000 levels deep (issue 22, probe C) is bad input: every reader
of a config reports it as a config error naming the file, never an internal RecursionError."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from draftops.serve import verdicts
from remote import exitcodes
from remote.bench.digest import config_digest
from remote.draft_config import config_file, target
from remote.draft_config.errors import DraftConfigError
from remote.eagle import weights
from remote.serve.configs import draft_facts

REPO = Path(__file__).resolve().parent.parent
DEEP = "[" * 10_000 + "]" * 10_000
DEEP_OBJECT = '{"a": ' * 10_000 + "1" + "}" * 10_000


def _folder(tmp_path: Path, name: str, text: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(text)
    return folder


def _message(exc: BaseException) -> str:
    assert not isinstance(exc, RecursionError)
    return str(exc)


def test_draft_config_tool_refuses_a_deep_draft_config_naming_it(tmp_path: Path) -> None:
    ckpt = _folder(tmp_path, "ckpt", DEEP_OBJECT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTOPS_")}
    proc = subprocess.run([sys.executable, "-m", "remote.draft_config", "--ckpt", str(ckpt), "--layer-ids",
                           "-1,2,30", "--out", str(tmp_path / "out")], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == exitcodes.REFUSED, proc.stderr
    assert str(ckpt / "config.json") in proc.stderr and "nested too deep" in proc.stderr
    assert "Traceback" not in proc.stderr and "RecursionError" not in proc.stderr


def test_every_config_reader_names_the_file(tmp_path: Path) -> None:
    ckpt = _folder(tmp_path, "ckpt", DEEP)
    tgt = _folder(tmp_path, "target", DEEP_OBJECT)
    for read, folder in ((config_file.load, ckpt), (target.load_target, tgt)):
        try:
            read(folder)
        except DraftConfigError as exc:
            assert str(folder / "config.json") in _message(exc) and "nested too deep" in str(exc)
        else:
            raise AssertionError(f"{read} accepted a 10,000-deep config")
    facts = draft_facts("vllm", ckpt, None)
    assert str(ckpt / "config.json") in facts["error"] and "nested too deep" in facts["error"]
    assert config_digest(DEEP.encode()).startswith("sha256:")          # hashed as bytes, not a crash


def test_the_evaluator_refuses_a_deep_draft_config_with_its_clear_error(tmp_path: Path) -> None:
    from remote.drafter.errors import ConfigError
    from remote.drafter.load.config import json_object
    path = _folder(tmp_path, "ckpt", DEEP) / "config.json"
    try:
        json_object(path, "The draft config", "repair it")
    except ConfigError as exc:
        assert str(path) in _message(exc) and "nested too deep" in str(exc)
    else:
        raise AssertionError("a 10,000-deep draft config was read")


def test_a_deep_safetensors_header_is_a_header_error(tmp_path: Path) -> None:
    import struct
    path = tmp_path / "model.safetensors"
    blob = DEEP_OBJECT.encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob)
    try:
        weights.read_header(path)
    except weights.HeaderError as exc:
        assert str(path) in _message(exc)
    else:
        raise AssertionError("a 10,000-deep safetensors header was read")


def test_a_deep_report_is_skipped_by_serves_verdict_lookup(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    (runs / "20261201-100000-test-drafter-aaaa").mkdir(parents=True)
    (runs / "20261201-100000-test-drafter-aaaa" / "report.json").write_text(DEEP_OBJECT)
    (runs / "20261130-100000-test-drafter-bbbb").mkdir()
    (runs / "20261130-100000-test-drafter-bbbb" / "report.json").write_text(json.dumps(
        {"schema": "draftops.drafter-report/1", "checkpoint": {"path": "/d"}, "verdict": {"status": "MATCH"}}))
    found = verdicts.latest(runs, "/d")
    assert found is not None and found.run_id.endswith("bbbb")
