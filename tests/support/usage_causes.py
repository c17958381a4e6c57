"""Builders for the usage and training cause cases on tests/support/drafter_lab.py's small target: a copy of its
target folder with a ChatML-style tokenizer (role markers as special tokens), its dumps rewritten to
open with the marker as a chat-formatted data set would, and a training record next to a draft."""
from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

from remote.drafter.demo.build import write_dumps
from tests.support import drafter_lab

EOS = "<|im_end|>"
OPEN = "<|im_start|>"
CHATML = ("{% for message in messages %}" + OPEN + "{{ message['role'] }}\n{{ message['content'] }}" + EOS
          + "\n{% endfor %}{% if add_generation_prompt %}" + OPEN + "assistant\n{% endif %}")


def marker_ids() -> tuple[int, int]:
    """(role marker, end of turn): two lab ids that no lab sample opens with, so the raw dumps open with
    no marker (a real tokenizer never makes a special token from text; the lab's ids are random)."""
    lab = drafter_lab.lab()
    firsts = set(lab.ids[:, 0].tolist())
    free = [i for i in range(lab.spec.vocab - 1, -1, -1) if i not in firsts]
    return free[0], free[1]


def chat_target(folder: Path) -> Path:
    """The lab target with tokenizer files whose chat template opens each message with a role marker."""
    shutil.copytree(drafter_lab.lab().target, folder)
    opener, end = marker_ids()
    added = [{"id": i, "content": t, "special": True, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False} for i, t in ((opener, OPEN), (end, EOS))]
    vocab = {f"w{i:02d}": i for i in range(drafter_lab.lab().spec.vocab) if i not in (opener, end)}
    (folder / "tokenizer.json").write_text(json.dumps({"version": "1.0", "added_tokens": added,
                                                       "model": {"type": "WordLevel", "vocab": vocab}}))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, "chat_template": CHATML,
        "added_tokens_decoder": {str(a["id"]): a for a in added}}))
    return folder


def chat_dumps(folder: Path, share: float = 1.0) -> Path:
    """The lab dumps with the first ``share`` of samples opening with the role marker (their first
    token replaced; the hidden states stay, so only position 0 differs)."""
    lab = drafter_lab.lab()
    ids = lab.ids.clone()
    ids[: round(share * ids.shape[0]), 0] = marker_ids()[0]
    cfg = json.loads((lab.data / "data_config.json").read_text())
    with contextlib.redirect_stdout(io.StringIO()):
        write_dumps(folder, ids, lab.slots(), None, cfg, "safetensors")
    return folder


def with_training_record(ckpt: Path, samples: int, epochs: int) -> Path:
    """A trainer's record of its run next to the draft (what HF-style trainers write as training_args.json)."""
    (ckpt / "training_args.json").write_text(json.dumps({"num_train_samples": samples, "num_train_epochs": epochs}))
    return ckpt


def well_trained(folder: Path) -> Path:
    return drafter_lab.save(folder, drafter_lab.trained_weights(drafter_lab.WELL_TRAINED), drafter_lab.TRAINED)


def barely_trained(folder: Path) -> Path:
    return drafter_lab.save(folder, drafter_lab.trained_weights(drafter_lab.BARELY), drafter_lab.TRAINED)
