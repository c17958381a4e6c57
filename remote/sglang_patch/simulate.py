"""Run SGLang's capture code on stand-ins, without torch: proof that a (patched) file behaves.

``verify`` and the tests use this to execute the real ``set_eagle3_layers_to_capture`` of a file
on a fake ``self`` and the real ``if i in self.layers_to_capture:`` block on plain numbers, so a
claim like "-1 maps to loop index 0" is checked by running the code, not by reading it.
"""
from __future__ import annotations

import ast
import os
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

from . import template as T
from .shapes import capture_sites

_TYPING = {name: getattr(typing, name) for name in ("Any", "Dict", "Iterable", "List",
                                                    "Optional", "Sequence", "Tuple", "Union")}


def setter_classes(source: bytes) -> list[str]:
    """Names of the classes in ``source`` that define the capture setter."""
    tree = ast.parse(source)
    return [n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
            and any(isinstance(f, ast.FunctionDef) and f.name == T.SETTER for f in n.body)]


def run_setter(source: bytes, class_name: str, layer_ids: list[int] | None, *,
               num_layers: int = 61, env_ids: str | None = None) -> list[int]:
    """``model.layers_to_capture`` after ``class_name.set_eagle3_layers_to_capture(layer_ids)``.

    The class's setter methods and draftops' module-level helpers are exec'd on their own; the
    stand-in ``self`` has ``pp_group.is_last_rank``, ``config.num_hidden_layers`` and
    ``model.layers_to_capture``. ``env_ids`` sets $DRAFTOPS_EAGLE3_LAYER_IDS during the call.
    """
    tree = ast.parse(source)
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == class_name)
    methods = [f for f in cls.body if isinstance(f, ast.FunctionDef)
               and f.name in (T.SETTER, T.ORIGINAL_SETTER)]
    helpers = [f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name in T.HELPERS]
    namespace: dict[str, Any] = {"__name__": "draftops_simulation", **_TYPING}
    body: list[ast.stmt] = [*helpers, *methods]
    module = ast.Module(body=body, type_ignores=[])
    exec(compile(module, f"<{class_name} setter>", "exec"), namespace)  # noqa: S102
    stand_in_cls = type(class_name, (), {f.name: namespace[f.name] for f in methods})
    stand_in = stand_in_cls()
    stand_in.pp_group = SimpleNamespace(is_last_rank=True)
    stand_in.config = SimpleNamespace(num_hidden_layers=num_layers)
    stand_in.model = SimpleNamespace(layers_to_capture=[])
    stand_in.capture_aux_hidden_states = False
    with _env(T.ENV_LAYER_IDS, env_ids):
        if layer_ids is None:
            stand_in.set_eagle3_layers_to_capture()
        else:
            stand_in.set_eagle3_layers_to_capture(list(layer_ids))
    if not stand_in.capture_aux_hidden_states:
        raise AssertionError(f"{class_name}: capture_aux_hidden_states was not switched on")
    return list(stand_in.model.layers_to_capture)


def run_capture_blocks(source: bytes, *, index: int, hidden: float, residual: float | None,
                       a2a: bool = False) -> list[list[Any]]:
    """Execute every ``if i in self.layers_to_capture:`` block at loop index ``index``.

    Returns what each block appended to ``aux_hidden_states``; exceptions (the TypeError of an
    unpatched ``hidden_states + residual`` with residual None) propagate. ``a2a`` takes
    DeepSeek's all-gather branch.
    """
    tree = ast.parse(source)
    out: list[list[Any]] = []
    for kind, node in capture_sites(tree):
        if kind != "if":
            continue
        aux: list[Any] = []
        namespace: dict[str, Any] = {
            "self": SimpleNamespace(layers_to_capture=[index], enable_a2a_moe=a2a,
                                    first_k_dense_replace=-1),
            "i": index, "hidden_states": hidden, "residual": residual,
            "aux_hidden_states": aux, "get_attention_tp_group": _Echo(),
        }
        assert isinstance(node, ast.stmt)
        block = ast.Module(body=[node], type_ignores=[])
        exec(compile(block, "<capture block>", "exec"), namespace)  # noqa: S102
        out.append(aux)
    return out


class _Echo:
    """Stand-in for a process group: any attribute is itself, a call returns its first arg."""

    def __getattr__(self, name: str) -> _Echo:
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return args[0] if args else self


@contextmanager
def _env(name: str, value: str | None) -> Iterator[None]:
    old = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old
