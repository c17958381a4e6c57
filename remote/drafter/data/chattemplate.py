"""The target's chat template against the dumps' token sequences: the report's ``data.chat_format``
and the ``chat-template`` finding (failure-modes.md #8, docs/drafter.md § Findings).

A chat-trained draft saw every sequence open with the template's role marker (``<|im_start|>``,
``<|start_header_id|>``, ``<start_of_turn>``, after an optional BOS); one trained on raw text never
saw them, and a chat client sends nothing else (InferenceX #1116: benchmarking without the template
drops acceptance to about 1, and the converse costs the same). Read with the standard library only
(the host has no ``transformers``): the template from ``tokenizer_config.json`` (``chat_template``,
a string or a list of named templates), ``chat_template.jinja`` or ``chat_template.json``; the
special tokens from ``tokenizer.json`` ``added_tokens`` and ``tokenizer_config.json``
``added_tokens_decoder``. A role marker is a special token that the template text names, other
than BOS, EOS, UNK and PAD (those open or close a sequence, not a message).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ... import jsonread
from ..errors import ConfigError

CHAT_SHARE = 0.9    # at least this share of samples opening with a role marker: the dumps are chat-formatted
DOUBLE_BOS_WARN = 0.1   # more than this share of samples opening with two BOS: the template's BOS was doubled
MAX_TEMPLATE = 1 << 20  # characters: real chat templates are a few KB; each special token is searched in it
MAX_ID = (1 << 63) - 1  # token ids are int64 in the dumps: a larger one overflowed the marker tensor
TEMPLATE_FLAGS = ("speculators' data generation and SpecForge's prepare_hidden_states / prepare_data take "
                  "--chat-template")


def _json(path: Path) -> Any:
    try:
        return jsonread.load(path)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError("A tokenizer file of the verifier cannot be read as JSON", path=path,
                          expected="the tokenizer file the target was saved with", found=f"{type(exc).__name__}: {exc}",
                          fix="copy the target's tokenizer files again (save_pretrained writes them), or remove the "
                              "broken file") from None


def _content(value: Any) -> str | None:
    """A special token as tokenizer_config.json names it: a string, or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


@dataclass
class Template:
    """The target's chat template and the special tokens it names."""

    source: str                          # the file (and field) the template came from
    text: str
    markers: dict[int, str]              # role-marker token id -> its text
    bos_id: int | None

    @classmethod
    def read(cls, folder: Path) -> Template | None:
        """The template of the tokenizer saved in ``folder``; None when it has none."""
        config_path = folder / "tokenizer_config.json"
        config = _json(config_path) if config_path.is_file() else {}
        if not isinstance(config, dict):
            raise ConfigError("tokenizer_config.json is not a JSON object", path=config_path,
                              expected="an object with the tokenizer's settings", found=type(config).__name__,
                              fix="copy the target's tokenizer_config.json again")
        text, source = _template(folder, config, config_path)
        if text is None:
            return None
        specials = _specials(folder, config)
        named = {_content(config.get(k)) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
        markers = {i: t for i, t in specials.items() if t not in named and t in text}
        bos = _content(config.get("bos_token"))
        bos_id = next((i for i, t in specials.items() if t == bos), None) if bos else None
        return cls(source, text, dict(sorted(markers.items())), bos_id)


def _template(folder: Path, config: dict[str, Any], config_path: Path) -> tuple[str | None, str]:
    value = config.get("chat_template")
    where = f"{config_path} chat_template"
    if isinstance(value, list):      # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {e.get("name"): e.get("template") for e in value if isinstance(e, dict)}
        value = named.get("default", next(iter(named.values()), None))
        where += " (default)"
    if value is not None and not isinstance(value, str):
        raise ConfigError("The chat template in tokenizer_config.json is neither text nor a list of named templates",
                          path=config_path, field="chat_template", expected="a Jinja string",
                          found=type(value).__name__, fix="copy the target's tokenizer_config.json again")
    if value:
        return _sized(value, config_path, "chat_template"), where
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        size = jinja.stat().st_size
        if size > 4 * MAX_TEMPLATE:   # read no more than a template can hold (UTF-8: up to 4 bytes a character)
            raise _too_large(jinja, None, size)
        return _sized(jinja.read_text(errors="replace"), jinja, None), str(jinja)
    as_json = folder / "chat_template.json"
    if as_json.is_file():
        doc = _json(as_json)
        got = doc.get("chat_template") if isinstance(doc, dict) else None
        if isinstance(got, str) and got:
            return _sized(got, as_json, "chat_template"), f"{as_json} chat_template"
    return None, ""


def _sized(text: str, path: Path, field_name: str | None) -> str:
    """The template text, or one paragraph when it is far larger than any chat template (each special
    token is searched for in it: a 50 MB one took 42 s for 2000 tokens)."""
    if len(text) <= MAX_TEMPLATE:
        return text
    raise _too_large(path, field_name, len(text))


def _too_large(path: Path, field_name: str | None, size: int) -> ConfigError:
    found = f"{size / 1e6:.1f} MB"
    return ConfigError("The target's chat template is far larger than a chat template is", path=path,
                      field=field_name, expected=f"at most {MAX_TEMPLATE // 1024} KB (real ones are a few KB)",
                      found=found, fix="copy the target's tokenizer files again (save_pretrained writes them)")


def _specials(folder: Path, config: dict[str, Any]) -> dict[int, str]:
    """Special token id -> text, from tokenizer.json and tokenizer_config.json's added_tokens_decoder."""
    out: dict[int, str] = {}
    decoder = config.get("added_tokens_decoder")
    if isinstance(decoder, dict):
        for key, entry in decoder.items():
            if isinstance(entry, dict) and entry.get("special", True) and _content(entry):
                token_id = int(key) if str(key).isascii() and str(key).isdigit() else -1  # "²".isdigit() too
                out[_token_id(token_id, folder / "tokenizer_config.json", f"added_tokens_decoder[{key!r}]")] = \
                    str(_content(entry))
    path = folder / "tokenizer.json"
    doc = _json(path) if path.is_file() else None
    entries = doc.get("added_tokens") if isinstance(doc, dict) else None
    for n, entry in enumerate(entries if isinstance(entries, list) else []):
        if isinstance(entry, dict) and entry.get("special") and _content(entry):
            out[_token_id(entry.get("id"), path, f"added_tokens[{n}].id")] = str(entry["content"])
    return out


def _token_id(value: Any, path: Path, field: str) -> int:
    """A special token's id as a tokenizer file gives it, or one paragraph naming the entry: an id that is
    no int64 token id can be no role marker in the dumps, and a guessed one would miscount them."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_ID:
        return value
    raise ConfigError("A special token of the target's tokenizer has no usable token id", path=path, field=field,
                      expected=f"a token id in 0..{MAX_ID}", found=repr(value)[:80],
                      fix="copy the target's tokenizer files again (save_pretrained writes them)")


@dataclass
class Scan:
    """Counts, over the evaluated samples (each once), where the role markers sit."""

    template: Template
    seen: set[int] = field(default_factory=set)
    samples: int = 0
    opens_with_marker: int = 0     # first token after an optional BOS is a role marker
    contains_marker: int = 0       # a role marker anywhere in the sequence
    double_bos: int = 0            # the sequence opens with BOS twice
    first_tokens: dict[int, int] = field(default_factory=dict)  # the opening token (after BOS) -> samples
    # per sample seen: (opens with a marker, contains one, double BOS, its opening token)
    facts: dict[int, tuple[int, int, int, int | None]] = field(default_factory=dict)
    # the batcher's reader threads load samples at once (batching.py): counting without the lock lost updates
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def see(self, index: int, ids: torch.Tensor) -> None:
        with self.lock:
            self._see(index, ids)

    def _see(self, index: int, ids: torch.Tensor) -> None:
        if index in self.seen or ids.numel() == 0:
            return
        bos = self.template.bos_id
        start = 1 if bos is not None and int(ids[0]) == bos else 0
        double = 0
        if start and ids.numel() > 1 and int(ids[1]) == bos:
            double = 1
            start = 2
        markers = torch.tensor(sorted(self.template.markers), dtype=ids.dtype)
        first = int(ids[start]) if ids.numel() > start else None
        contains = int(bool(torch.isin(ids, markers).any())) if markers.numel() else 0
        self._add(index, (int(first is not None and first in self.template.markers), contains, double, first))

    def _add(self, index: int, fact: tuple[int, int, int, int | None]) -> None:
        opens, contains, double, first = fact
        self.seen.add(index)
        self.facts[index] = fact
        self.samples += 1
        self.double_bos += double
        if first is not None:
            self.first_tokens[first] = self.first_tokens.get(first, 0) + 1
        self.opens_with_marker += opens
        self.contains_marker += contains

    def absorb(self, facts: dict[int, tuple[int, int, int, int | None]]) -> None:
        """Another scan's samples (a torchrun's other rank: reduce.py), each sample counted once."""
        with self.lock:
            for index, fact in facts.items():
                if index not in self.seen:
                    self._add(index, fact)

    def to_dict(self) -> dict[str, Any]:
        t = self.template
        share = self.opens_with_marker / self.samples if self.samples else None
        if not t.markers:
            status = "no-role-markers"
        elif share is None:
            status = "unknown"
        else:
            status = "chat" if share >= CHAT_SHARE else "raw" if self.opens_with_marker == 0 else "mixed"
        common = sorted(self.first_tokens.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
        return {"template": True, "template_source": t.source,
                "role_markers": [{"id": i, "token": s} for i, s in t.markers.items()], "bos_id": t.bos_id,
                "samples": self.samples, "opens_with_marker": self.opens_with_marker,
                "contains_marker": self.contains_marker, "double_bos": self.double_bos,
                "share_opening_with_marker": share, "threshold": CHAT_SHARE, "status": status,
                "chat_formatted": None if status in ("no-role-markers", "unknown") else status == "chat",
                "common_first_tokens": [{"id": i, "samples": n} for i, n in common]}


def no_template(folder: Path) -> dict[str, Any]:
    """``data.chat_format`` for a verifier whose tokenizer has no chat template (or no tokenizer)."""
    return {"template": False, "template_source": None, "status": "no-template", "chat_formatted": None,
            "checked": str(folder)}


def finding(chat: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The ``chat-template`` finding: role markers missing from the dumps, applied to some samples only,
    or BOS doubled; none for chat-formatted dumps and for targets without role markers."""
    if not chat or not chat.get("template") or chat["status"] in ("no-role-markers", "unknown"):
        return []
    n, opens, doubled = chat["samples"], chat["opens_with_marker"], chat["double_bos"]
    markers = ", ".join(f"{m['token']} (id {m['id']})" for m in chat["role_markers"][:4])
    evidence = {k: chat[k] for k in ("samples", "opens_with_marker", "contains_marker", "double_bos",
                                     "share_opening_with_marker", "threshold", "status", "bos_id")}
    evidence["role_markers"] = chat["role_markers"][:8]
    head = f"The target's chat template ({chat['template_source']}) opens every message with a role marker ({markers})"
    if chat["status"] == "raw":
        text = (f"{head}, but none of the {n} evaluated samples opens with one ({chat['contains_marker']} contain one "
                "anywhere): the dumps are raw text. A draft trained on such data never saw the role markers that open "
                "every prompt a chat client sends, and its acceptance there drops toward 1; a draft trained with the "
                "template is not measured here on what it will be served.")
        fix = ("Regenerate the dumps (and retrain the draft) with the target's chat template applied ("
               f"{TEMPLATE_FLAGS}); a draft meant for raw completions should be benchmarked with raw prompts only.")
    elif chat["status"] == "mixed":
        text = (f"{head}, but only {opens} of the {n} evaluated samples open with one "
                f"({opens / n:.0%}, below {chat['threshold']:.0%}): the template was applied to part of the data only.")
        fix = f"Apply the chat template to every sample when generating the data ({TEMPLATE_FLAGS}), then retrain."
    elif n and doubled / n > DOUBLE_BOS_WARN:
        text = (f"{head}, and {doubled} of the {n} evaluated samples open with BOS twice (id {chat['bos_id']}): the "
                "template writes the BOS and the tokenizer added another, so every training position is shifted "
                "against what the server tokenizes.")
        fix = ("Tokenize the rendered template without adding special tokens (add_special_tokens=False), regenerate "
               "the dumps and retrain.")
    else:
        return []
    return [{"id": "chat-template", "severity": "warn", "text": text, "evidence": evidence, "fix": fix}]
