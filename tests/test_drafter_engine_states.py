"""``eval --engine-states``: the engine's own states that a capture check kept (here through the vLLM
test double, tests/doubles/vllm_hs, which computes the demo target's states with the reference forward)
score the draft on the layout the engine feeds, the one training used and the best, next to the
dumps' figures; SpecForge-format dumps holding only training's four slots get the served layout's
figure only from them; a folder of other tokens or another width is refused in one paragraph."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from remote.drafter.data.dumps import DumpSet
from remote.drafter.errors import ConfigError, DataError, ShapeMismatchError
from tests.conftest import REPO
from tests.support.drafter_support import SPEC, demo, run_eval
from tests.support.trainer_dumps import write_data_config, write_specforge

DOUBLE = REPO / "tests" / "doubles" / "vllm_hs"
N = 48
HELD = {"layer_ids": [-1, SPEC.layer_a, SPEC.layer_b, SPEC.num_layers - 1], "layer_id_convention": "sglang",
        "final_slot": 3, "num_hidden_layers": SPEC.num_layers}
SERVED = SPEC.buggy_ids   # SGLang ids the engine feeds for the demo draft's configured ids


def _capture(data: Path, out: Path, python: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "FAKE_VLLM_FAULT": ""}
    done = subprocess.run([sys.executable, "-m", "remote.capture", "check", "--python", str(python), "--target",
                           str(demo().target), "--data", str(data), "--samples", "8", "--out", str(out),
                           "--ready-timeout", "60"], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "capture-check.json").read_text())


@pytest.fixture(scope="module")
def engine_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    script = tmp_path_factory.mktemp("engine") / "python"
    script.write_text(f'#!/bin/sh\nPYTHONPATH="{DOUBLE}:{REPO}" exec "{sys.executable}" "$@"\n')
    script.chmod(0o755)
    return script


@pytest.fixture(scope="module")
def specforge(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first N demo samples as SpecForge writes them: aux slots -1, 1, 3 and the final one."""
    dumps = DumpSet.open(demo().data)
    samples = [dumps.load(i) for i in range(N)]
    folder = tmp_path_factory.mktemp("specforge") / "dumps"
    write_specforge(folder, torch.stack([s.token_ids for s in samples]), torch.stack([s.hidden for s in samples]),
                    [0, 1, 2], 4, per_folder=16)
    write_data_config(folder, HELD)
    return folder


@pytest.fixture(scope="module")
def demo_states(tmp_path_factory: pytest.TempPathFactory, engine_python: Path) -> Path:
    doc = _capture(demo().data, tmp_path_factory.mktemp("cc-demo") / "run", engine_python)
    return Path(doc["engine_states"]["path"])


@pytest.fixture(scope="module")
def specforge_states(tmp_path_factory: pytest.TempPathFactory, engine_python: Path, specforge: Path) -> Path:
    doc = _capture(specforge, tmp_path_factory.mktemp("cc-sf") / "run", engine_python)
    assert doc["status"] == "MATCHED" and doc["engine_states"]["slots"] == SPEC.num_layers + 1
    return Path(doc["engine_states"]["path"])


def _rows(report: dict) -> dict[str, dict]:
    return {row["role"]: row for row in report["engine_states"]["layouts"]}


def test_the_demo_draft_is_scored_on_the_engines_states_and_each_figure_says_whose(demo_states, tmp_path):
    report = run_eval(tmp_path, limit=64, layout_samples=32, engine_states=demo_states)
    es = report["engine_states"]
    assert (es["states"], es["samples"], es["slots"], es["basis"]) == ("engine", 8, SPEC.num_layers + 1, "verifier")
    assert es["scanned_layouts"] == 35      # every choice of 3 of the 7 boundaries
    rows = _rows(report)
    assert rows["served"]["layer_ids"] == SERVED and rows["trained"]["layer_ids"] == SPEC.trained_ids
    assert rows["trained"]["layer_ids_vllm"] == [0, 2, 4]
    assert rows["best"]["layer_ids"] == SPEC.trained_ids           # the scan over every boundary finds it
    assert all(r["states"] == "engine" for r in rows.values())
    assert rows["trained"]["step0_acc"] > rows["served"]["step0_acc"] + 0.2
    assert rows["trained"]["accept_length"] > rows["served"]["accept_length"]
    # today's figures on the dumps, labelled as such
    assert report["metrics"]["states"] == "dumps" and report["predicted_accept_length"]["states"] == "dumps"
    assert report["metrics"]["best"]["states"] == "dumps" and {r["states"] for r in report["layouts"]} == {"dumps"}


def test_specforge_dumps_get_the_served_figure_only_from_the_engines_states(specforge, specforge_states, tmp_path):
    plain = run_eval(tmp_path / "plain", data=specforge, layout_samples=16)
    assert plain["metrics"]["served"] is None and plain["engine_states"] is None   # layer 4 is not in the dumps
    report = run_eval(tmp_path / "engine", data=specforge, layout_samples=16, engine_states=specforge_states)
    rows = _rows(report)
    assert report["metrics"]["served"] is None                     # the dumps still cannot say it ...
    assert rows["served"]["layer_ids"] == SERVED                   # ... the engine's states do
    assert rows["served"]["step0_acc"] is not None and rows["served"]["accept_length"] >= 1.0
    assert rows["trained"]["layer_ids"] == SPEC.trained_ids
    assert "SpecForge" in report["engine_states"]["trained_from"]
    assert rows["trained"]["step0_acc"] > rows["served"]["step0_acc"]


def _copy(states: Path, dest: Path) -> Path:
    shutil.copytree(states, dest)
    return dest


def _refused(tmp_path: Path, states: Path, error: type[Exception], *words: str) -> None:
    out = tmp_path / "out"
    with pytest.raises(error) as exc:
        run_eval(out, limit=16, layout_samples=8, engine_states=states)
    msg = str(exc.value)
    assert "\n" not in msg and "Fix:" in msg and "--engine-states" in msg
    for word in words:
        assert word in msg, (word, msg)
    assert not (out / "report.json").exists()


def test_states_of_other_tokens_are_refused_naming_the_file(demo_states, tmp_path):
    states = _copy(demo_states, tmp_path / "states")
    file = sorted(states.glob("hs_*.safetensors"))[-1]
    tensors = load_file(str(file))
    tensors["token_ids"] = tensors["token_ids"].flip(0).contiguous()
    save_file(tensors, str(file))
    _refused(tmp_path, states, DataError, str(file), "other tokens than dump sample")


def test_states_of_another_width_are_refused(demo_states, tmp_path):
    states = _copy(demo_states, tmp_path / "states")
    file = sorted(states.glob("hs_*.safetensors"))[0]
    tensors = load_file(str(file))
    tensors["hidden_states"] = tensors["hidden_states"][..., :-8].contiguous()
    save_file(tensors, str(file))
    _refused(tmp_path, states, ShapeMismatchError, str(file), "width")


def test_a_second_name_for_a_sample_is_refused(demo_states, tmp_path):
    """hs_01 beside hs_1 would score sample 1 twice: only the capture check's own names are samples."""
    states = _copy(demo_states, tmp_path / "states")
    first = next(f for f in sorted(states.glob("hs_*.safetensors")) if f.name != "hs_0.safetensors")
    twin = states / first.name.replace("hs_", "hs_0")
    shutil.copy(first, twin)
    _refused(tmp_path, states, DataError, twin.name, "names no sample")


def test_an_unfinished_folder_without_its_data_config_is_refused(demo_states, tmp_path):
    states = _copy(demo_states, tmp_path / "states")
    (states / "data_config.json").unlink()
    _refused(tmp_path, states, ConfigError, "data_config.json", "unfinished")


def test_the_local_view_shows_the_engine_figures_next_to_the_dumps_labelled(specforge, specforge_states, tmp_path):
    import io

    from rich.console import Console

    from draftops import report as rich_report
    from draftops.documents import parse
    from draftops.documents.drafter_report import DrafterReport

    report = run_eval(tmp_path, data=specforge, layout_samples=16, engine_states=specforge_states)
    read = parse(DrafterReport, json.loads(json.dumps(report)), "report.json")
    out = io.StringIO()
    rich_report.show(read, Console(file=out, width=300, color_system=None))
    text = out.getvalue()
    assert "on the dumps' states" in text and "on the engine's own states (8 samples" in text
    shown = [i + 1 for i in SERVED]     # the screen names vLLM ids (its host engine), SERVED is in SGLang ids
    assert "vLLM ids" in text
    line = next(x for x in text.splitlines() if x.strip("│ ").startswith("served") and str(shown) in x)
    served = _rows(report)["served"]
    assert f"{100 * served['step0_acc']:.1f}%" in line and f"{served['accept_length']:.2f}" in line


def test_test_drafter_passes_the_kept_states_of_the_capture_check_it_takes(specforge_states, tmp_path):
    """`invoke test-drafter` reads the pulled capture-check.json: kept states (vLLM) are passed on,
    a check that kept none (SGLang, or a report older than the key) passes none."""
    from draftops.serve.verdicts import kept_engine_states

    runs = tmp_path / "runs"
    doc = json.loads((specforge_states.parent / "capture-check.json").read_text())
    for run, states in (("20260101-000000-capture-check-a", doc["engine_states"]),
                        ("20260101-000001-capture-check-b", {"path": None, "absent": "SGLang: final only"}),
                        ("20260101-000002-capture-check-c", None)):
        (runs / run).mkdir(parents=True)
        body = {k: v for k, v in doc.items() if k != "engine_states"}
        (runs / run / "capture-check.json").write_text(json.dumps({**body, **({"engine_states": states}
                                                                              if states else {})}))
    assert kept_engine_states(runs, "20260101-000000-capture-check-a") is True
    assert kept_engine_states(runs, "20260101-000001-capture-check-b") is False
    assert kept_engine_states(runs, "20260101-000002-capture-check-c") is False
