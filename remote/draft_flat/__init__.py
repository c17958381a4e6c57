"""A flat-format (``LlamaForCausalLMEagle3``) copy of a speculators-format EAGLE-3 draft, for SGLang.

SGLang reads a draft's aux layer ids only from ``eagle_config`` of a flat config and loads layer 0
only under ``midlayer.*`` (names it does not know are skipped without a word), so a speculators
checkpoint served by SGLang runs on SGLang's default layers whatever its own field says (the
drafter's ``ids-missing-engine-default``). This tool writes the copy SGLang reads as the draft was
trained: the decoder fields flattened to the top level, the ids in ``eagle_config`` in SGLang's
convention, ``layers.0.*`` renamed ``midlayer.*``; every tensor's bytes are copied unchanged (the
safetensors headers are rewritten, the data is streamed: no torch, memory bounded at any size).

Stdlib only. The source is never written; the copy is built in a temporary folder beside ``--dest``
and renamed into place when complete, so a failure (a full disk, a signal) leaves no half copy, and
what a SIGKILL leaves (an empty ``--dest``, the temporary folder) is cleared by the next run
(``remote.fileio.new_folder``). Every header is checked as safetensors checks it before a byte is
written, the configs are written as strict JSON (a NaN or Infinity refused, naming the field), and
each file keeps its source's permission bits.

draft_flat.json (``--out DIR``), schema ``draftops.draft-flat/1``::

    {
      "schema": "draftops.draft-flat/1", "ok": bool, "error": str | null, "error_type": str | null,
      "ckpt": str, "dest": str | null,            # the source checkpoint, the copy written
      "source_ids": [int] | null,                 # the source's own field (vLLM convention) or null
      "layer_ids": [int] | null,                  # written into eagle_config (SGLang convention)
      "ids_from": "config" | "cli" | "report" | null,
      "tensors": int, "renamed": int, "bytes": int, "files": [str],   # what the copy holds
      "warnings": [str]
    }

Exit status: 0 written, 3 refused (nothing written), 4 internal error.
"""
