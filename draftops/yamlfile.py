"""YAML for hand-edited config files: duplicate keys are an error and every node keeps its line.

PyYAML keeps the last of two equal keys without a word, so a host defined twice in hosts.yaml would
silently replace the first; this loader refuses that and says on which two lines the key appears.
"""
from __future__ import annotations

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


def load(path: Path) -> tuple[Any, yaml.Node | None]:
    """Parse ``path``; returns (data, root node) so callers can point at the line of any key."""
    loader = _NoDuplicatesLoader(path.read_text(encoding="utf-8"))
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except YamlFileError:
        raise
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
