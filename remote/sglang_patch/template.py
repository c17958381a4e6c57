"""The text the patch puts into SGLang files, and the names the analysis recognises it by.

Bump ``PATCH_VERSION`` whenever this text changes; files carrying another version are then
reported with that version in their detail (revert and re-apply to upgrade).
"""
from __future__ import annotations

import re
import textwrap

from ..eagle.formats import EAGLE_CONFIG, IDS_KEY, NESTED_FIELD

PATCH_VERSION = 1
MARKER = f"draftops sglang-patch v{PATCH_VERSION}"
MARKER_RE = re.compile(rb"# draftops sglang-patch v(\d+)")

SETTER = "set_eagle3_layers_to_capture"
ORIGINAL_SETTER = "_draftops_orig_set_eagle3_layers_to_capture"
SET_HELPER = "_draftops_set_eagle3_layers"
CONFIG_HELPER = "_draftops_configured_eagle3_ids"
RUNNER_HELPER = "_draftops_runner_eagle3_ids"
HELPERS = (CONFIG_HELPER, SET_HELPER, RUNNER_HELPER)

#: environment variable the serve side exports (comma-separated ids, output-of-layer convention)
ENV_LAYER_IDS = "DRAFTOPS_EAGLE3_LAYER_IDS"

SETTER_COMMENT = (
    f"{MARKER}: ids < 0 use the output-of-layer convention (-1 = embedding), ids are sorted and "
    f"de-duplicated, and a call without ids reuses the draft's configured ids; the upstream "
    f"method is kept below as {ORIGINAL_SETTER}."
)
CAPTURE_COMMENT = f"{MARKER}: residual is None before the first layer; capture the embedding."
CALL_COMMENT = (
    f"{MARKER}: pass the draft's configured ids so CUDA-graph capture matches eager mode."
)


def wrapper_method(indent: str) -> str:
    """The replacement ``set_eagle3_layers_to_capture`` method, indented like the original."""
    comment = "".join(f"# {line}\n" for line in textwrap.wrap(SETTER_COMMENT, 92))
    body = (
        comment +
        f"def {SETTER}(self, layer_ids=None):\n"
        f"    return {SET_HELPER}(self, layer_ids, self.{ORIGINAL_SETTER})\n"
        "\n"
    )
    return "".join(indent + line if line.strip() else line for line in body.splitlines(True))


def guarded_capture(hidden: str, residual: str) -> str:
    """Replacement for the bare ``hidden + residual`` capture expression."""
    return f"({hidden} if {residual} is None else {hidden} + {residual})"


def runner_call(func: str, runner: str) -> str:
    """Replacement for a no-argument ``<runner>.model.set_eagle3_layers_to_capture()`` call."""
    return f"{func}({RUNNER_HELPER}({runner}))"


HELPER_BLOCK = f'''

# >>> {MARKER} helpers; `python -m remote.sglang_patch revert` restores the original file
def {CONFIG_HELPER}(draft_path=None, use_env=True):
    """The draft's EAGLE-3 layer ids (output-of-layer convention), or None when unknown.

    Read from <draft_path>/config.json ({NESTED_FIELD}, the field
    SGLang itself reads), then ${ENV_LAYER_IDS} when use_env. Without draft_path the running
    server's --speculative-draft-model-path is used when its server args are already loaded.
    """
    import json
    import logging
    import os
    import sys

    if draft_path is None:
        server_args = sys.modules.get("sglang.srt.server_args")
        try:
            draft_path = server_args.get_global_server_args().speculative_draft_model_path
        except Exception:
            draft_path = None
    ids = None
    if draft_path:
        try:
            with open(os.path.join(str(draft_path), "config.json"), encoding="utf-8") as handle:
                eagle_config = json.load(handle).get("{EAGLE_CONFIG}") or {{}}
            ids = eagle_config.get("{IDS_KEY}")
        except (OSError, ValueError, AttributeError):
            ids = None
    if not ids and use_env:
        raw = os.environ.get("{ENV_LAYER_IDS}", "").replace(" ", "")
        try:
            ids = [int(v) for v in raw.split(",") if v]
        except ValueError:
            logging.getLogger(__name__).warning("ignoring {ENV_LAYER_IDS}=%r", raw)
            ids = None
    return [int(v) for v in ids] if ids else None


def {SET_HELPER}(model, layer_ids, original):
    """set_eagle3_layers_to_capture as patched by draftops (see the comment on the method)."""
    if layer_ids is None:
        layer_ids = getattr(model, "_draftops_eagle3_layer_ids", None)
        layer_ids = layer_ids or {CONFIG_HELPER}()
    if layer_ids is not None:
        layer_ids = sorted({{int(v) for v in layer_ids}})
        model._draftops_eagle3_layer_ids = list(layer_ids)
    if layer_ids and layer_ids[0] < 0:
        if not model.pp_group.is_last_rank:
            return None
        model.capture_aux_hidden_states = True
        indices = [v + 1 for v in layer_ids]
        inner = model.model
        if hasattr(inner, "{SETTER}"):
            for layer in getattr(inner, "layers", None) or []:
                if getattr(layer, "_is_layer_to_capture", False):
                    layer._is_layer_to_capture = False
            inner.{SETTER}(indices)
        else:
            inner.layers_to_capture = indices
        return None
    result = original(layer_ids)
    inner = getattr(model, "model", None)
    captured = getattr(inner, "layers_to_capture", None)
    if isinstance(captured, list) and captured != sorted(set(captured)):
        inner.layers_to_capture = sorted(set(captured))
    return result


def {RUNNER_HELPER}(runner):
    """Ids for the runner's no-argument setter calls: exactly the ones eager mode passes.

    None leaves the choice to the model's setter, as it does in eager mode.
    """
    ids = getattr(runner, "eagle_aux_hidden_state_layer_ids", None)
    if ids is None:
        server_args = getattr(runner, "server_args", None)
        path = getattr(server_args, "speculative_draft_model_path", None)
        ids = {CONFIG_HELPER}(path, use_env=False) if path else None
    return ids
# <<< {MARKER}
'''
