"""Findings seen in the states, the target and the vocab map (issue 25): embedding-scale, target-differs,
vocab-map-missing and vocab-map-differs. Each broken copy of the demo (a real tiny Llama target, which
the evaluator recomputes) is evaluated for real and gets exactly its finding; the healthy demo none.
The draft is draft_fixed/ (the demo's draft with the ids it was trained on): its verdict is MATCH."""
from __future__ import annotations

import argparse
import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console
from safetensors.torch import load_file, save_file

from draftops.documents import load
from draftops.documents.drafter_report import DrafterReport
from draftops.report import show
from remote.capture import cli as capture_cli
from remote.capture import matching
from remote.capture.dumps import Picked
from remote.capture.target import Target
from remote.drafter.data.dumps import DumpSet
from remote.drafter.errors import ConfigError, ShapeMismatchError
from remote.drafter.model import tinyllama
from remote.drafter.scoring import slotstats
from tests.support.drafter_support import SPEC, demo, run_eval
from tests.support.trainer_dumps import write_data_config, write_modelopt, write_specforge

SAMPLES = 48  # evaluated samples per case (the layout scan takes them all)


def ids(report: dict[str, Any]) -> list[str]:
    return [f["id"] for f in report["findings"]]


def data_copy(tmp: Path, name: str, change: Any = None) -> Path:
    """The first SAMPLES demo dumps (and data_config.json), each hidden_states passed through ``change``."""
    folder = tmp / name
    folder.mkdir(parents=True)
    src = demo().data
    shutil.copy(src / "data_config.json", folder / "data_config.json")
    for f in DumpSet.open(src).files[:SAMPLES]:
        if change is None:
            shutil.copy(f, folder / f.name)
            continue
        t = load_file(f)
        t["hidden_states"] = change(t["hidden_states"]).contiguous()
        save_file(t, folder / f.name)
    return folder


def draft_copy(tmp: Path, name: str, change: Any) -> Path:
    folder = tmp / name
    shutil.copytree(demo().draft_fixed, folder)
    w = load_file(folder / "model.safetensors")
    change(w)
    save_file(w, folder / "model.safetensors")
    return folder


def scaled_slot(slot: int, factor: float) -> Any:
    def change(h: torch.Tensor) -> torch.Tensor:
        h = h.clone()
        h[:, slot] *= factor
        return h
    return change


def rotated_slot(slot: int) -> Any:
    q, _ = torch.linalg.qr(torch.randn(64, 64, generator=torch.Generator().manual_seed(3)))

    def change(h: torch.Tensor) -> torch.Tensor:
        h = h.clone()
        h[:, slot] = h[:, slot] @ q
        return h
    return change


def capture_check(tmp: Path, data: Path) -> Path:
    """A real capture-check report (remote/capture's own matching and differences) of ``data`` against
    the demo target's states, computed here as an engine would serve them."""
    cfg, w = tinyllama.load(demo().target)
    dumps = DumpSet.open(data)
    tally = matching.Tally(dumps.load(0).hidden.shape[1], cfg.num_hidden_layers + 1)
    for i in range(8):
        sample = dumps.load(i)
        served, _ = tinyllama.forward(cfg, w, sample.token_ids[None])
        tally.add(sample.hidden, served[0], rows_per_sample=64)
    target = Target(demo().target, cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size, None, {})
    doc = capture_cli.build_report(argparse.Namespace(draft=None), target, Picked(dumps, list(range(8)), dumps.slots),
                                   tally)
    path = tmp / "cc-run" / "capture-check.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(doc, default=float))
    return path


def spec_map(d2t: torch.Tensor, t2d: torch.Tensor, folder: Path) -> Path:
    """SpecForge 0.2.0's vocab map file, written as its generate_vocab_mapping_file writes it."""
    path = folder / "vocab_mapping" / "vocab_mapping.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"d2t": d2t, "t2d": t2d}, path)
    return path


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("state-causes")
    healthy = data_copy(tmp, "healthy")
    w = load_file(demo().draft_fixed / "model.safetensors")
    own = spec_map(w["d2t"], w["t2d"], data_copy(tmp, "own-map"))
    other = w["d2t"].clone()
    other[-6:] = other[-6:] - 1  # six draft ids one target id lower: a map regenerated on other data
    other_t2d = torch.zeros_like(w["t2d"])
    other_t2d[other + torch.arange(other.shape[0])] = True
    spec_map(other, other_t2d, data_copy(tmp, "other-map"))
    rotated = data_copy(tmp, "rotated", rotated_slot(3))  # layer 4: dumped, not fed to the draft
    cases = {
        "healthy": {"data": healthy},
        "own-map": {"data": own.parent.parent},
        "embed-dump": {"data": data_copy(tmp, "embed-dump", scaled_slot(0, 0.02))},
        "embed-draft": {"data": healthy, "ckpt": draft_copy(
            tmp, "embed-draft", lambda w: w.update({"embed_tokens.weight": w["embed_tokens.weight"] * 8}))},
        "rotated": {"data": rotated},
        "measured": {"data": rotated, "measured": capture_check(tmp, rotated)},
        "no-d2t": {"data": healthy, "ckpt": draft_copy(tmp, "no-d2t", lambda w: w.pop("d2t"))},
        "other-map": {"data": tmp / "other-map"},
    }
    return {name: run_eval(tmp / "runs" / name, limit=SAMPLES, **{"ckpt": demo().draft_fixed, **kw})
            for name, kw in cases.items()}


def test_the_healthy_demo_gets_no_finding_and_its_slots_equal_the_recomputed_target(reports):
    for name in ("healthy", "own-map"):
        assert ids(reports[name]) == [] and reports[name]["verdict"]["status"] == "MATCH", name
    stats = reports["healthy"]["data"]["slot_statistics"]
    assert stats["recomputed"] is True and [s["layer_id"] for s in stats["slots"]] == [-1, 1, 3, 4, 5]
    for s in stats["slots"] + [stats["draft_embedding"]]:
        assert s["differs"] is False and abs(s["norm_ratio"] - 1) < 1e-5 and s["relative_rms_diff"] < 1e-5
    mapping = reports["own-map"]["data"]["vocab_mapping"]
    assert mapping["agrees"] is True and mapping["files"][0]["draft_ids_differing"] == 0


def test_an_embedding_slot_at_another_scale_is_embedding_scale_with_its_ratio(reports):
    report = reports["embed-dump"]
    assert ids(report) == ["embedding-scale"]
    f = report["findings"][0]
    ev = f["evidence"]["slot_0"]
    assert f["severity"] == "bad" and abs(ev["norm_ratio"] - 0.02) < 1e-4 and abs(ev["scale_factor"] - 0.02) < 1e-4
    assert ev["scale_residual"] < 1e-4 and "0.02x the norm" in f["text"] and "regenerate the dumps" in f["fix"].lower()
    assert "draft_embedding" not in f["evidence"]


def test_a_draft_embedding_at_another_scale_is_embedding_scale_too(reports):
    report = reports["embed-draft"]
    assert ids(report) == ["embedding-scale"]
    f = report["findings"][0]
    assert abs(f["evidence"]["draft_embedding"]["norm_ratio"] - 8) < 1e-3 and "slot_0" not in f["evidence"]
    assert "embed_tokens" in f["text"] and "embed_tokens" in f["fix"]


def test_a_layer_slot_unlike_the_recomputed_target_is_target_differs(reports):
    report = reports["rotated"]
    assert ids(report) == ["target-differs"]
    f = report["findings"][0]
    ev = f["evidence"]
    assert list(ev) == ["slot_3"] and ev["slot_3"]["relative_rms_diff"] > slotstats.LAYER_NOISE
    assert abs(ev["slot_3"]["norm_ratio"] - 1) < 1e-4  # a rotation keeps the norm: only the difference shows it
    assert "layer 4" in f["text"] and "capture-check" in f["fix"]


def test_a_capture_checks_differences_are_target_differs_and_its_layers_are_not_used(reports):
    report = reports["measured"]
    assert ids(report) == ["target-differs"]
    cc = report["findings"][0]["evidence"]["capture_check"]
    assert cc["kinds"] == ["rotation"] and [d["slot"] for d in cc["differences"]] == [3]
    assert "the capture check cc-run found 1 slot(s)" in report["findings"][0]["text"]
    assert not report["slot_layers_from"].startswith("capture-check")
    assert not report["verdict"]["message"].startswith("Measured from the engine")


def test_a_reduced_vocab_draft_without_d2t_is_vocab_map_missing(reports):
    report = reports["no-d2t"]
    assert ids(report) == ["vocab-map-missing"]
    f = report["findings"][0]
    assert f["evidence"]["draft_vocab"] == 48 and f["evidence"]["d2t_stored"] is False
    assert f["evidence"]["share"] < reports["healthy"]["data"]["vocab_coverage"]["share"]
    assert "target ids 0..47" in f["text"] and "nonzero(t2d)" in f["fix"]  # its t2d is kept: d2t follows from it
    assert report["checkpoint"]["vocab_map"]["d2t_stored"] is False


def test_a_draft_whose_map_differs_from_specforges_vocab_mapping_is_vocab_map_differs(reports):
    report = reports["other-map"]
    assert ids(report) == ["vocab-map-differs"]
    ev = report["findings"][0]["evidence"]
    assert ev["draft_ids_differing"] == 6 and ev["file"].endswith("vocab_mapping/vocab_mapping.pt")
    assert report["findings"][0]["severity"] == "bad"


def test_a_vocab_mapping_of_the_wrong_length_is_one_paragraph_naming_it(tmp_path):
    w = load_file(demo().draft_fixed / "model.safetensors")
    data = data_copy(tmp_path, "short-map")
    path = spec_map(w["d2t"][:40], w["t2d"], data)
    with pytest.raises(ShapeMismatchError) as err:
        run_eval(tmp_path / "run", data=data, limit=8)
    text = str(err.value)
    assert str(path) in text and "[48]" in text and "[40]" in text and "Fix:" in text


@pytest.mark.parametrize("name", ["embed-dump", "measured", "no-d2t", "other-map"])
def test_the_local_report_view_reads_each_finding_with_its_fix(reports, name, tmp_path):
    path = tmp_path / "report.json"
    path.write_text(json.dumps(reports[name]))
    doc = load(DrafterReport, path)
    assert [f.id for f in doc.findings] == ids(reports[name]) and doc.findings[0].severity == "bad"
    console = Console(file=io.StringIO(), width=400, record=True)
    show(doc, console)
    text = console.export_text()
    assert f"bad {ids(reports[name])[0]}" in text and "fix: " in text


@pytest.mark.parametrize("fmt", ["specforge", "modelopt"])
def test_the_same_cases_in_a_trainers_format_get_the_same_findings(reports, fmt, tmp_path):
    """SpecForge/ModelOpt dumps hold the aux slots [-1, 1, 3] and the final one: the same states, the same ids."""
    write = write_specforge if fmt == "specforge" else write_modelopt
    held = {"layer_ids": [-1, SPEC.layer_a, SPEC.layer_b, SPEC.num_layers - 1], "final_slot": 3,
            "num_hidden_layers": SPEC.num_layers}
    dumps = DumpSet.open(demo().data)
    samples = [dumps.load(i) for i in range(24)]
    ids_ = torch.stack([x.token_ids for x in samples])
    slots = torch.stack([x.hidden for x in samples])
    scaled = slots.clone()
    scaled[:, :, 0] *= 0.02  # the embedding slot, as in the embed-dump case
    for name, states in (("healthy", slots), ("embed-dump", scaled)):
        folder = tmp_path / name
        write(folder, ids_, states, [0, 1, 2], 4)
        write_data_config(folder, held)
        report = run_eval(tmp_path / "runs" / name, data=folder, ckpt=demo().draft_fixed, limit=24)
        assert ids(report) == ids(reports[name]), name


def test_a_capture_check_with_unmatched_slots_and_no_differences_is_still_refused(tmp_path):
    """An SGLang check measures the final slot only: its unmatched aux slots say nothing of the target."""
    data = data_copy(tmp_path, "rotated", rotated_slot(3))
    path = capture_check(tmp_path, data)
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "differences": []}))
    with pytest.raises(ConfigError) as err:
        run_eval(tmp_path / "run", data=data, limit=8, measured=path)
    assert str(path) in str(err.value) and "unmatched" in str(err.value)
