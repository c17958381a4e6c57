"""A word-level tokenizer for the demo target, written by hand in the ``tokenizers`` JSON format.

The GPU host's ml-env has neither ``tokenizers`` nor ``transformers``, so the files that
``PreTrainedTokenizerFast.save_pretrained`` would write are produced here directly: one token per
id (``<unk>``, ``<s>``, ``</s>``, then ``w03`` ... ``wNN``), split on whitespace, decoded by joining
with spaces.  vLLM and SGLang load the folder with ``AutoTokenizer`` and every model id decodes.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SPECIALS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2: unk, bos, eos
#: plain prompt concatenation, so the chat endpoints work too (the demo is no chat model)
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }} {% endfor %}"


def token(i: int) -> str:
    """The text of id ``i``."""
    return SPECIALS[i] if i < len(SPECIALS) else f"w{i:02d}"


def vocabulary(size: int) -> dict[str, int]:
    if size <= len(SPECIALS):
        raise ValueError(f"a vocabulary of {size} leaves no room for words after {list(SPECIALS)}")
    return {token(i): i for i in range(size)}


def tokenizer_json(size: int) -> dict[str, Any]:
    """tokenizer.json of a ``WordLevel`` model with whitespace splitting (tokenizers format 1.0)."""
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, t in enumerate(SPECIALS)]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
            "decoder": None, "model": {"type": "WordLevel", "vocab": vocabulary(size), "unk_token": SPECIALS[0]}}


def tokenizer_config(max_length: int) -> dict[str, Any]:
    return {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": SPECIALS[0], "bos_token": SPECIALS[1],
            "eos_token": SPECIALS[2], "model_max_length": max_length, "clean_up_tokenization_spaces": False,
            "chat_template": CHAT_TEMPLATE}


def save(folder: Path, size: int, max_length: int) -> None:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    specials = {"unk_token": SPECIALS[0], "bos_token": SPECIALS[1], "eos_token": SPECIALS[2]}
    for name, payload in (("tokenizer.json", tokenizer_json(size)),
                          ("tokenizer_config.json", tokenizer_config(max_length)),
                          ("special_tokens_map.json", specials)):
        (folder / name).write_text(json.dumps(payload, indent=2) + "\n")


def encode(text: str, size: int) -> list[int]:
    """What the saved tokenizer gives for ``text`` (unknown words become ``<unk>``)."""
    vocab = vocabulary(size)
    return [vocab.get(word, 0) for word in text.split()]


def decode(ids: list[int]) -> str:
    return " ".join(token(i) for i in ids)
