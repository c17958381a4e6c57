"""Host side of ``invoke serve``: read configs, probe ports and HTTP endpoints, keep the server registry.

Run on the host from the synced code folder (``PYTHONPATH=<root>/code python -m remote.serve ...``);
stdlib only, so any python3 runs it. ``inspect`` runs with the engine's own python (it asks that
python which engine it imports and, for SGLang, the capture patcher's status). Every command prints
one JSON object on stdout; the servers themselves listen on the host's 127.0.0.1, so HTTP probes
happen here, never from the laptop.

    inspect --engine E --target T [--draft D] [--sglang-status]   -> schema draftops.serve-inspect/1
    port PORT [--host H] [--wait-free S]                           -> {"port", "in_use", "detail"}
    http PORT PATH [--host H] [--json BODY] [--timeout S]          -> {"status", "body", "error", "seconds"}
    reap PGID RUN_ID [--grace S]                                   -> {"terminated", "killed", "left"}
    servers --state DIR list                                       -> {"servers": [...], "now": host clock}
    servers --state DIR put PORT [--exclusive | --token T] < entry  -> {"written": bool}
    servers --state DIR remove PORT [--run ID] [--token T]          -> {"removed": bool}
"""
