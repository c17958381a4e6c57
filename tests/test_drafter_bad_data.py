"""Bad values in dumps and weights: NaN/inf, out-of-range or negative token ids, wrong dtypes,
nothing to score.  Either a clear error or an UNKNOWN verdict that says why, never a confident
MATCH/MISMATCH built on them."""
from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from remote.drafter import DataError, NonFiniteError, load_checkpoint
from remote.drafter.cli import main
from tests.support.drafter_lab import NEIGHBOUR, TRAINED, WELL_TRAINED, lab, run, save, trained_weights

N = 32  # samples per run (the lab has 192): enough for a verdict, quick
FAST = {"limit": N, "layout_samples": 16}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save(tmp_path_factory.mktemp("ckpt") / "draft", trained_weights(WELL_TRAINED), NEIGHBOUR)


def _dumps(tmp: Path, edit: Callable[[int, dict[str, torch.Tensor]], None] | None = None) -> Path:
    """The first N lab dumps, each passed through ``edit(i, tensors)`` before saving."""
    data = tmp / "data"
    data.mkdir()
    shutil.copy(lab().data / "data_config.json", data)
    for i in range(N):
        tensors = load_file(str(lab().data / f"hs_{i}.safetensors"))
        if edit:
            edit(i, tensors)
        save_file(tensors, str(data / f"hs_{i}.safetensors"))
    return data


def _set(i_bad: int, name: str, make: Callable[[torch.Tensor], torch.Tensor]):
    def edit(i: int, tensors: dict[str, torch.Tensor]) -> None:
        if i == i_bad or i_bad < 0:
            tensors[name] = make(tensors[name])
    return edit


def test_a_dump_full_of_nan_is_unknown_not_a_match(ckpt: Path, tmp_path: Path) -> None:
    data = _dumps(tmp_path, _set(-1, "hidden_states", lambda h: torch.full_like(h, float("nan"))))
    report = run(tmp_path / "out", ckpt, data=data, **FAST)
    v = report["verdict"]
    assert (v["status"], v["reason"], v["fix_layer_ids"]) == ("UNKNOWN", "non_finite", None)
    assert len(report["data"]["skipped"]) == N and "NaN" in v["message"]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_one_non_finite_value_in_one_sample_is_unknown_and_named(ckpt: Path, tmp_path: Path, value: float) -> None:
    def poke(h: torch.Tensor) -> torch.Tensor:
        h = h.clone()
        h[5, 2, 7] = value
        return h
    data = _dumps(tmp_path, _set(9, "hidden_states", poke))
    report = run(tmp_path / "out", ckpt, data=data, **FAST)
    v = report["verdict"]
    assert (v["status"], v["reason"]) == ("UNKNOWN", "non_finite")
    skipped = report["data"]["skipped"]
    assert [s["path"] for s in skipped] == [str(data / "hs_9.safetensors")]
    assert "token 5, slot 2" in skipped[0]["reason"] and "hs_9.safetensors" in v["message"]
    # the other samples were still scored: the report keeps their numbers
    assert report["metrics"]["served"]["verifier"]["positions"] > 0


def test_finite_values_that_overflow_in_the_forward_are_unknown(ckpt: Path, tmp_path: Path) -> None:
    data = _dumps(tmp_path, _set(3, "hidden_states", lambda h: torch.full_like(h, 3e38)))  # fp32 max 3.4e38
    report = run(tmp_path / "out", ckpt, data=data, **FAST)
    v = report["verdict"]
    assert (v["status"], v["reason"]) == ("UNKNOWN", "non_finite")
    assert report["data"]["skipped"] == [] and "logits were NaN or inf" in v["message"]


@pytest.mark.parametrize("make,found", [
    (lambda ids: torch.where(torch.arange(ids.shape[0]) == 4, 96, ids), "e.g. 96"),
    (lambda ids: torch.where(torch.arange(ids.shape[0]) == 4, 10**6, ids), "e.g. 1000000"),
    (lambda ids: torch.where(torch.arange(ids.shape[0]) == 0, -1, ids), "e.g. -1"),
])
def test_token_ids_outside_the_vocab_are_a_clear_error(ckpt: Path, tmp_path: Path, make, found: str) -> None:
    data = _dumps(tmp_path, _set(6, "token_ids", make))
    with pytest.raises(DataError) as exc:
        run(tmp_path / "out", ckpt, data=data, **FAST)
    msg = str(exc.value)
    assert str(data / "hs_6.safetensors") in msg and "token_ids" in msg and "[0, 96)" in msg and found in msg
    assert "Fix:" in msg and "\n" not in msg


@pytest.mark.parametrize("name,make,expected", [
    ("token_ids", lambda t: t.float(), "integer"),
    ("hidden_states", lambda t: (t * 100).to(torch.int32), "float"),
    ("loss_mask", None, "0 and 1"),
])
def test_wrong_dtypes_and_mask_values_are_clear_errors(ckpt: Path, tmp_path: Path, name: str, make,
                                                       expected: str) -> None:
    def edit(i: int, tensors: dict[str, torch.Tensor]) -> None:
        if name == "loss_mask":
            tensors["loss_mask"] = torch.full_like(tensors["token_ids"], 2)
        else:
            tensors[name] = make(tensors[name])
    data = _dumps(tmp_path, edit)
    with pytest.raises(DataError) as exc:
        run(tmp_path / "out", ckpt, data=data, **FAST)
    assert expected in str(exc.value) and "hs_0.safetensors" in str(exc.value)


def test_limit_zero_scores_nothing_and_says_so(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code = main(["eval", "--ckpt", str(ckpt), "--data", str(lab().data), "--verifier", str(lab().target),
                 "--limit", "0", "--out", str(tmp_path)])
    assert code == 0
    report = json.loads((tmp_path / "report.json").read_text())
    v = report["verdict"]
    assert (v["status"], v["reason"], v["fix_layer_ids"]) == ("UNKNOWN", "nothing_scored", None)
    assert "verdict: UNKNOWN" in capsys.readouterr().out


def test_an_all_zero_loss_mask_scores_nothing(ckpt: Path, tmp_path: Path) -> None:
    data = _dumps(tmp_path, lambda i, t: t.update({"loss_mask": torch.zeros_like(t["token_ids"])}))
    v = run(tmp_path / "out", ckpt, data=data, **FAST)["verdict"]
    assert (v["status"], v["reason"]) == ("UNKNOWN", "nothing_scored")


def test_samples_too_short_to_score_give_nothing_scored(ckpt: Path, tmp_path: Path) -> None:
    data = _dumps(tmp_path, lambda i, t: t.update({"token_ids": t["token_ids"][:1],
                                                   "hidden_states": t["hidden_states"][:1]}))
    v = run(tmp_path / "out", ckpt, data=data, **FAST)["verdict"]
    assert (v["status"], v["reason"]) == ("UNKNOWN", "nothing_scored")


def test_rope_theta_zero_is_a_clear_error_not_a_match(ckpt: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    config = json.loads((ckpt / "config.json").read_text())
    config["transformer_layer_config"]["rope_parameters"]["rope_theta"] = 0
    (tmp_path / "config.json").write_text(json.dumps(config))
    code = main(["eval", "--ckpt", str(ckpt), "--config", str(tmp_path / "config.json"), "--data",
                 str(lab().data), "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 3 and "rope_theta" in err and not (tmp_path / "report.json").exists()


@pytest.mark.parametrize("tensor", ["fc.weight", "lm_head.weight", "layers.0.self_attn.q_proj.weight"])
def test_non_finite_draft_weights_are_a_clear_error(ckpt: Path, tmp_path: Path, tensor: str) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(ckpt, bad)
    weights = load_file(str(bad / "model.safetensors"))
    weights[tensor] = weights[tensor].clone()
    weights[tensor][0, 0] = float("nan")
    save_file(weights, str(bad / "model.safetensors"))
    with pytest.raises(NonFiniteError) as exc:
        load_checkpoint(bad)
    assert tensor in str(exc.value) and "1 NaN" in str(exc.value) and str(bad / "model.safetensors") in str(exc.value)


def test_non_finite_verifier_head_is_a_clear_error(ckpt: Path, tmp_path: Path) -> None:
    target = tmp_path / "target"
    shutil.copytree(lab().target, target)
    weights = load_file(str(target / "model.safetensors"))
    weights["lm_head.weight"][3] = float("inf")
    save_file(weights, str(target / "model.safetensors"))
    with pytest.raises(NonFiniteError) as exc:
        run(tmp_path / "out", ckpt, verifier=target, **FAST)
    assert "lm_head.weight" in str(exc.value) and str(target / "model.safetensors") in str(exc.value)


def test_a_legacy_dump_whose_ids_are_not_a_tensor_is_a_clear_error(ckpt: Path, tmp_path: Path) -> None:
    data = tmp_path / "pt"
    data.mkdir()
    shutil.copy(lab().data / "data_config.json", data)
    st = load_file(str(lab().data / "hs_0.safetensors"))
    torch.save({"input_ids": st["token_ids"].tolist(), "hidden_states": list(st["hidden_states"].unbind(1))},
               data / "data_0.pt")
    with pytest.raises(DataError) as exc:
        run(tmp_path / "out", ckpt, data=data, limit=1, layout_samples=1)
    assert "not a tensor" in str(exc.value) and "data_0.pt" in str(exc.value)


def test_a_dump_link_to_nothing_is_named_not_skipped(tmp_path: Path) -> None:
    from remote.drafter.data.dumps import DumpSet
    from remote.drafter.errors import CorruptFileError
    data = tmp_path / "data"
    data.mkdir()
    for i in range(3):
        (data / f"hs_{i}.safetensors").symlink_to(lab().data / f"hs_{i}.safetensors")
    (data / "hs_3.safetensors").symlink_to(tmp_path / "unmounted" / "hs_3.safetensors")
    (data / "notes.txt").symlink_to(tmp_path / "gone.txt")          # not a dump: not our business
    with pytest.raises(CorruptFileError) as exc:
        DumpSet.open(data)
    text = str(exc.value)
    assert "1 dump file(s) are links to nothing" in text and "hs_3.safetensors" in text and "unmounted" in text
    (data / "hs_3.safetensors").unlink()
    assert [f.name for f in DumpSet.open(data).files] == [f"hs_{i}.safetensors" for i in range(3)]


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_dump_that_is_a_fifo_or_a_device_is_named_not_silently_left_out(tmp_path: Path, kind: str) -> None:
    """A FIFO or a link to /dev/zero named like a dump was left out of the sample set without a word, even
    with --full: the verdict then covered fewer samples than the folder named. It is an error naming it."""
    import os

    from remote.drafter.data.dumps import DumpSet
    from remote.drafter.errors import CorruptFileError
    data = tmp_path / "data"
    data.mkdir()
    for i in range(2):
        (data / f"hs_{i}.safetensors").symlink_to(lab().data / f"hs_{i}.safetensors")
    odd = data / "hs_2.safetensors"
    os.mkfifo(odd) if kind == "fifo" else odd.symlink_to("/dev/zero")
    with pytest.raises(CorruptFileError) as exc:
        DumpSet.open(data)
    text = str(exc.value)
    assert "1 dump file(s) are no regular file" in text and str(odd) in text
    assert ("a FIFO" if kind == "fifo" else "a device") in text


def test_the_trained_layout_on_clean_dumps_is_still_a_verdict(tmp_path: Path) -> None:
    """Control for the tests above: the same draft and data, unmodified, give a real verdict."""
    ck = save(tmp_path / "ck", trained_weights(WELL_TRAINED), TRAINED)
    report = run(tmp_path / "out", ck, data=_dumps(tmp_path), **FAST)
    assert report["verdict"]["status"] == "MATCH" and report["data"]["skipped"] == []
