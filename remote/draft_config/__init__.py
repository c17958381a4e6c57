"""Rewrite an EAGLE-3 draft's aux layer ids in its config.json, on the host that holds it.

Stdlib only (safetensors headers are read with json + struct). Ids are always given in SGLang's
output-of-layer convention (-1 = embedding), the convention of a drafter report's
``fix_layer_ids``; the formats, their ids fields and the conversion are ``remote.eagle``'s.

draft_config.json (``--out DIR``), schema ``draftops.draft-config/1``::

    {
      "schema": "draftops.draft-config/1",
      "ok": bool, "error": str | null, "error_type": str | null,
      "ckpt": str, "config": str | null,          # checkpoint folder, its config.json
      "format": "flat" | "speculators" | null,
      "field": "eagle_config.eagle_aux_hidden_state_layer_ids" | "eagle_aux_hidden_state_layer_ids",
      "file_convention": "sglang-output-of-layer" | "vllm-after-k-layers",
      "old_ids": [int] | null,                    # as stored in the file (file convention)
      "new_ids": [int] | null,                    # requested, SGLang convention, ascending
      "written_ids": [int] | null,                # what the file holds now (file convention)
      "changed": bool, "dry_run": bool,
      "backup": str | null,                       # config.json.draftops-bak-<UTC stamp>[-n]
      "source": {"kind": "cli" | "report", "path": str | null, "status": str | null},
      "target": {"path", "num_hidden_layers", "hidden_size", "architectures",
                 "max_position_embeddings"} | null,
      "fc_aux_slots": int | null,                 # from fc.weight's shape, when readable
      "needs_capture_patch": bool | null,         # any id -1, or the report says so
      "sglang": {"version", "dir", "files": {file: state}} | null,   # with --sglang-status
      "warnings": [str]
    }

Exit status: 0 ok (warnings included), 2 refused (nothing written), 3 internal error.
"""
