"""YAML for hand-edited config files: duplicate keys are an error and every node keeps its line.

PyYAML keeps the last of two equal keys without a word, so a host defined twice in hosts.yaml would
silently replace the first; this loader refuses that and says on which two lines the key appears.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml


class YamlFileError(ValueError):
    """The text is not valid YAML, or repeats a key; ``line`` is 1-based."""

    def __init__(self, message: str, line: int | None):
        super().__init__(message)
        self.line = line


class DuplicateKeyError(YamlFileError):
    """A mapping holds the same key twice; ``line`` is the second one."""


class ValueTooLongError(YamlFileError):
    """A number Python refuses to read (more digits than ``sys.get_int_max_str_digits()``)."""


class _NumberTooLong(yaml.YAMLError):
    """Raised while constructing; turned into :class:`ValueTooLongError` once the key path is known."""

    def __init__(self, node: yaml.Node, reason: str):
        super().__init__(reason)
        self.node, self.reason = node, reason


class _NoDuplicatesLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping holding the same key twice (merge keys ``<<`` excepted)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                continue
            key = self.construct_object(key_node)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise DuplicateKeyError(f"`{key}` appears twice in the same mapping (lines {seen[key]} and "
                                    f"{line}); YAML would silently keep only the second. Remove or rename "
                                    "one of them", line)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        """PyYAML's int, but a number too long for Python (a 5,000-digit integer) is a YAML error at
        its line, not the ValueError of ``int()`` escaping as a traceback."""
        try:
            return super().construct_yaml_int(node)
        except ValueError as exc:
            raise _NumberTooLong(node, str(exc)) from None


_NoDuplicatesLoader.add_constructor("tag:yaml.org,2002:int", _NoDuplicatesLoader.construct_yaml_int)


def _path_to(node: yaml.Node | None, target: yaml.Node) -> list[Any] | None:
    """The keys (and list indexes) that lead from ``node`` to ``target``; None when it is not there."""
    if node is target:
        return []
    children: list[tuple[Any, yaml.Node]] = []
    if isinstance(node, yaml.MappingNode):
        children = [(k.value if isinstance(k, yaml.ScalarNode) else "?", v) for k, v in node.value]
        children += [("(key)", k) for k, _ in node.value]
    elif isinstance(node, yaml.SequenceNode):
        children = list(enumerate(node.value))
    for key, child in children:
        found = _path_to(child, target)
        if found is not None:
            return [key, *found]
    return None


def _field_name(path: list[Any]) -> str:
    """``hosts.gpu.port`` / ``steps[0].args``: a key path as the user would look for it."""
    text = ""
    for key in path:
        text += f"[{key}]" if isinstance(key, int) else (f".{key}" if text else str(key))
    return text


def _too_long(exc: _NumberTooLong, root: yaml.Node | None) -> ValueTooLongError:
    path = _path_to(root, exc.node) if root is not None else None
    field = f"field `{_field_name(path)}`: " if path else ""
    digits = len(str(exc.node.value))
    return ValueTooLongError(
        f"{field}a number {digits} characters long, more than the {sys.get_int_max_str_digits()} digits "
        "Python reads; write a shorter number, or quote it if it is meant as text", exc.node.start_mark.line + 1)


def load(path: Path) -> tuple[Any, yaml.Node | None]:
    """Parse ``path``; returns (data, root node) so callers can point at the line of any key."""
    loader = _NoDuplicatesLoader(path.read_text(encoding="utf-8"))
    node = None
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except YamlFileError:
        raise
    except _NumberTooLong as exc:
        raise _too_long(exc, node) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        raise YamlFileError(problem, mark.line + 1 if mark else None) from None
    finally:
        loader.dispose()
    return data, node


def line_of(node: yaml.Node | None, loc: list[Any] | tuple[Any, ...]) -> int:
    """1-based line of the deepest key found along ``loc`` (best effort: 1 when nothing matches)."""
    line = 1
    for key in loc:
        if isinstance(node, yaml.SequenceNode):        # a list item, addressed by its index
            if not isinstance(key, int) or not 0 <= key < len(node.value):
                break
            node = node.value[key]
            line = node.start_mark.line + 1
            continue
        if not isinstance(node, yaml.MappingNode):
            break
        line = node.start_mark.line + 1
        for k, v in node.value:
            if _is_key(k, key):
                line = k.start_mark.line + 1
                node = v
                break
        else:
            break
    return line


def _is_key(node: yaml.Node, key: Any) -> bool:
    """Whether the key node ``node`` stands for ``key`` (a plain ``true`` is the key True)."""
    if not isinstance(node, yaml.ScalarNode):
        return False
    if str(node.value) == str(key) and (isinstance(key, str) or not node.style):
        return True
    if node.style or isinstance(key, str):
        return False
    value = yaml.safe_load(node.value)
    return type(value) is type(key) and value == key
