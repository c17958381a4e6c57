"""The speculative algorithm a serve profile's ``extra_args`` set, read the way the engine reads them
(SGLang ``--speculative-algorithm NAME``; vLLM ``--speculative-config JSON`` with ``method``), so that
`invoke serve`'s checks and `invoke test-drafter` name the same launch. An EAGLE-3 draft under
EAGLE skips its fc and accepts nothing (SGLang #21272): the finding ``algorithm-eagle-not-eagle3``."""
from __future__ import annotations

import json
import re
from collections.abc import Sequence

ALGORITHM_ID = "algorithm-eagle-not-eagle3"
#: algorithms that run a draft as EAGLE-1/2 (SGLang turns NEXTN into EAGLE)
EAGLE_ONE = ("eagle", "nextn")
_FLAG = {"sglang": "--speculative-algorithm", "vllm": "--speculative-config"}


def _value(args: Sequence[str], flag: str) -> str | None:
    """The last value given to ``flag`` (``--flag v`` or ``--flag=v``): the engine keeps the last."""
    found = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith(flag + "="):
            found = arg.split("=", 1)[1]
    return found


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """The last value ``args`` give ``flag`` (the engine keeps the last); other readers of extra_args use it."""
    return _value(args, flag)


def from_extra_args(engine: str, args: Sequence[str]) -> str | None:
    """The algorithm ``args`` set for ``engine`` (as written), or None when they set none."""
    value = _value(args, _FLAG.get(engine, ""))
    if value is None or engine != "vllm":
        return value
    try:
        config = json.loads(value)
    except ValueError:
        return None
    method = config.get("method") if isinstance(config, dict) else None
    return method if isinstance(method, str) else None


def runs_as_eagle(algorithm: str | None) -> bool:
    return (algorithm or "").lower() in EAGLE_ONE


#: a KV dtype as the evaluator accepts it (remote/drafter/options.KV_DTYPE); anything else is not passed on
_KV = re.compile(r"[A-Za-z0-9_]{1,32}")


def kv_dtypes(engine: str, args: Sequence[str]) -> tuple[str | None, str | None]:
    """(the target's, the draft's) KV cache dtypes a vLLM profile's ``extra_args`` set: ``--kv-cache-dtype``,
    and ``kv_cache_dtype`` in ``--speculative-config JSON`` or ``--speculative_config.kv_cache_dtype``."""
    if engine != "vllm":
        return None, None
    target = flag_value(args, "--kv-cache-dtype")
    draft = (flag_value(args, "--speculative_config.kv_cache_dtype")
             or flag_value(args, "--speculative-config.kv_cache_dtype"))
    try:
        config = json.loads(flag_value(args, "--speculative-config") or "null")
    except ValueError:
        config = None
    if isinstance(config, dict) and isinstance(config.get("kv_cache_dtype"), str):
        draft = config["kv_cache_dtype"]
    return _kv_ok(target), _kv_ok(draft)


def _kv_ok(value: str | None) -> str | None:
    return value if value is not None and _KV.fullmatch(value) else None
