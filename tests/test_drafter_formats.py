"""Both config formats, both dump formats, sharded checkpoints, and the verifier-target metric."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from remote.drafter import Verifier, load_checkpoint
from remote.drafter.data.batching import collate
from remote.drafter.data.dumps import DumpSet
from remote.drafter.evaluation import _verifier_head
from remote.drafter.model import tinyllama
from remote.drafter.store.tensorstore import TensorStore
from tests.support.drafter_support import SPEC, demo, run_eval

FAST = {"limit": 96, "layout_samples": 48, "full": True}  # every sample: the counts are checked exactly


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_eval(tmp_path_factory.mktemp("ref"), **FAST)


def _scan(report: dict) -> dict[tuple[int, ...], float]:
    return {tuple(r["layer_ids"]): r["acc"] for r in report["layouts"]}


def test_flat_format_needs_and_uses_the_verifier_embedding(reference: dict, tmp_path: Path) -> None:
    report = run_eval(tmp_path, ckpt=demo().draft_flat, **FAST)
    ck = report["checkpoint"]
    assert ck["format"] == "flat" and ck["embed_source"] == "verifier"
    assert ck["layer_ids_key"] == "eagle_config.eagle_aux_hidden_state_layer_ids"
    assert report["verdict"]["fix_layer_ids"] == reference["verdict"]["fix_layer_ids"]
    assert "eagle_config.eagle_aux_hidden_state_layer_ids" in report["verdict"]["message"]
    assert _scan(report) == pytest.approx(_scan(reference), abs=1e-9)  # same weights, same numbers


def test_config_override_reads_the_speculators_backup(tmp_path: Path) -> None:
    flat = demo().draft_flat
    report = run_eval(tmp_path, ckpt=flat, config=flat / "config_speculators.json", **FAST)
    assert report["checkpoint"]["format"] == "speculators"
    assert report["checkpoint"]["config_path"].endswith("config_speculators.json")
    assert report["verdict"]["status"] == "MISMATCH"


def test_legacy_pt_dumps_with_loss_mask(reference: dict, tmp_path: Path) -> None:
    report = run_eval(tmp_path, data=demo().data_pt, **FAST)
    assert report["data"]["formats"] == ["pt"]
    assert report["verdict"]["fix_layer_ids"] == reference["verdict"]["fix_layer_ids"]
    # rows t < prompt_len are masked out (loss_mask 0), so fewer positions are scored
    rows = FAST["limit"] * (SPEC.seq_len - 1)
    ref_v = reference["metrics"]["best"]["verifier"]["positions"]
    pt_v = report["metrics"]["best"]["verifier"]["positions"]
    assert ref_v == rows and pt_v == FAST["limit"] * (SPEC.seq_len - SPEC.prompt_len)


def test_dump_formats_load_the_same_sample() -> None:
    st, pt = DumpSet.open(demo().data).load(3), DumpSet.open(demo().data_pt).load(3)
    assert torch.equal(st.token_ids, pt.token_ids) and torch.equal(st.hidden, pt.hidden)
    assert st.loss_mask is None and int(pt.loss_mask.sum()) == SPEC.seq_len - SPEC.prompt_len
    assert DumpSet.open(demo().data).slots.layer_ids == tuple(SPEC.slot_ids)


def write_two_shards(src: Path, dest: Path) -> None:
    """Copy the single-file checkpoint ``src`` into ``dest`` as two shards plus a weight-map index."""
    tensors = load_file(str(src / "model.safetensors"))
    names = sorted(tensors)
    weight_map = {}
    for i, part in enumerate((names[::2], names[1::2])):
        fname = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, str(dest / fname))
        weight_map.update({n: fname for n in part})
    (dest / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    shutil.copy(src / "config.json", dest / "config.json")


def test_sharded_checkpoint_loads_identically(tmp_path: Path) -> None:
    src = demo().draft
    write_two_shards(src, tmp_path)
    single, _ = load_checkpoint(src)
    sharded, info = load_checkpoint(tmp_path)
    assert len(info.weight_files) == 2
    batch = collate([DumpSet.open(demo().data).load(i) for i in range(4)])
    with torch.inference_mode():
        a = single.forward(batch.aux([0, 1, 2]), batch.input_ids, 3, batch.lengths)
        b = sharded.forward(batch.aux([0, 1, 2]), batch.input_ids, 3, batch.lengths)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_tensor_in_two_shards_is_read_from_the_one_the_index_names(tmp_path: Path) -> None:
    write_two_shards(demo().draft, tmp_path)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    name = sorted(index)[0]
    named, other = index[name], next(f for f in set(index.values()) if f != index[name])
    stale = load_file(str(tmp_path / other))
    stale[name] = torch.zeros_like(load_file(str(tmp_path / named))[name])      # an old copy in the other shard
    save_file(stale, str(tmp_path / other))
    assert named < other                            # the stale copy is in the shard read last
    store = TensorStore.open(tmp_path)
    assert store.info(name).path == tmp_path / named
    assert torch.equal(store.get(name), load_file(str(tmp_path / named))[name])


@pytest.mark.parametrize("shard", ["../elsewhere/model-00001-of-00002.safetensors", "/etc/model.safetensors", ""])
def test_an_index_naming_a_shard_outside_the_folder_is_refused(tmp_path: Path, shard: str) -> None:
    """The engines join each shard name to the folder: a climbing or absolute one reads another file."""
    from remote.drafter.errors import DrafterError
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    write_two_shards(demo().draft, ckpt)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.copy(ckpt / "model-00001-of-00002.safetensors", outside)
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    index["weight_map"][sorted(index["weight_map"])[0]] = shard
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(DrafterError, match="outside the checkpoint folder") as exc:
        TensorStore.open(ckpt)
    assert "model.safetensors.index.json" in str(exc.value) and "plain shard file names" in str(exc.value)


def test_a_weights_path_that_does_not_exist_says_so(tmp_path: Path) -> None:
    from remote.drafter.errors import ConfigError
    with pytest.raises(ConfigError, match="does not exist.*nothing there"):
        TensorStore.open(tmp_path / "no-such-model")
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    with pytest.raises(ConfigError, match=r"a link to nothing"):
        TensorStore.open(tmp_path / "link")


def test_verifier_reads_only_what_it_needs_from_shards(tmp_path: Path) -> None:
    write_two_shards(demo().target, tmp_path)
    v = Verifier(tmp_path)
    assert len(v.store.files) == 2 and v.num_hidden_layers == SPEC.num_layers
    assert (v.embed_name, v.norm_name, v.head_name) == ("model.embed_tokens.weight", "model.norm.weight",
                                                        "lm_head.weight")
    rows = torch.tensor([1, 5, 9000 % 64, 63])
    assert torch.equal(v.lm_head_rows(rows.sort().values), v.store.get("lm_head.weight")[rows.sort().values])


def test_verifier_targets_are_the_targets_own_argmax_over_the_draft_vocab() -> None:
    """Independent check: run the tiny target itself and restrict its logits to the draft vocab."""
    paths = demo()
    draft, _ = load_checkpoint(paths.draft)
    head = _verifier_head(Verifier(paths.target), draft, torch.device("cpu"), torch.float32)
    samples = [DumpSet.open(paths.data).load(i) for i in range(8)]
    batch = collate(samples)
    store = TensorStore.open(paths.target)
    weights = {n: store.get(n) for n in store.names()}
    cfg, _ = tinyllama.load(paths.target)
    _, logits = tinyllama.forward(cfg, weights, torch.stack([s.token_ids for s in samples]))
    keep = draft.draft_to_target(torch.arange(SPEC.draft_vocab_size))
    expected = logits[:, 1:, keep].argmax(-1)  # positions 1..T-1, draft-vocab index
    assert torch.equal(head.targets(batch.final(4)), expected)


def test_verifier_metric_counts_match_a_direct_computation(reference: dict) -> None:
    """full_acc_0 against verifier targets == share of rows where the draft's argmax equals them."""
    paths = demo()
    draft, _ = load_checkpoint(paths.draft)
    head = _verifier_head(Verifier(paths.target), draft, torch.device("cpu"), torch.float32)
    batch = collate([DumpSet.open(paths.data).load(i) for i in range(FAST["limit"])])
    with torch.inference_mode():
        logits = draft.forward(batch.aux([0, 1, 2]), batch.input_ids, 1, batch.lengths)[0]
    right = (logits.argmax(-1) == head.targets(batch.final(4))) & batch.scored
    direct = float(right.sum() / batch.scored.sum())
    assert reference["metrics"]["best"]["verifier"]["full_acc"][0] == pytest.approx(direct)
