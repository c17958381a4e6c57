"""Patch the installed SGLang so an EAGLE-3 draft can use layer id -1 (the embedding output).

Stdlib only: it runs under the host's ml-env python as ``python -m remote.sglang_patch``.
See ``shapes`` for what is patched per SGLang version and why, ``template`` for the injected code.

patch.json (``--out DIR``), schema ``draftops.sglang-patch/1``::

    {
      "schema": "draftops.sglang-patch/1",
      "action": "status" | "apply" | "verify" | "revert",
      "ok": bool,                      # false on refusal, failed verify or internal error
      "error": str | null,             # the one-paragraph message printed on stderr
      "error_type": str | null,        # PatchError subclass name, or "InternalError"
      "patch_version": int,
      "sglang_version": str | null, "sglang_dir": str | null, "version_source": str | null,
      "state_dir": str,                # <state root>/<sglang version>
      "models": [str] | null,          # --models as given (null: all)
      "files": [{
          "file": "srt/models/llama.py",   # relative to sglang_dir
          "model": "llama" | "qwen2" | "qwen3" | "deepseek_v2" | "all" (runner files),
          "serves": str,
          "state": "native" | "patched" | "needs-patch" | "unsupported" | "modified",
          "sha256": str | null,            # null when the file is absent
          "detail": str,
          "known_shape": bool,             # false: unrecognised code, apply refuses
          "parts": {"setter"|"capture"|"cuda_graph"|"file": state},
          "backup": str | null             # saved original, when draftops patched the file
      }],
      "changed": [str],                # files written by this action
      "checks": [{"file", "check", "ok", "detail"}],   # verify only
      "notes": [str]
    }

Exit status: 0 ok, 1 verify failed, 2 refused (nothing changed), 3 internal error.
"""
from .template import ENV_LAYER_IDS, PATCH_VERSION

__all__ = ["ENV_LAYER_IDS", "PATCH_VERSION"]
