"""The host side of draftops' plumbing: a stdlib-only script copied to ``<root>/state/`` on first use.

It runs under any python3 on the host (no ml-env needed) and does the work that must happen next to
the files: resolve and check ``root``, list and apply code syncs atomically, start detached jobs and
record their state, follow logs, pack run folders. The local side talks to it only through
``draftops.link.agent.AgentClient``.

It is one file on the wire and seven in the tree: :data:`PARTS`, assembled in that order by
:func:`source` into the one script whose hash names it (``agent-<sha12>.py``). Each part is also an
importable module, so the laptop takes the protocol's names (markers, exit codes, flags) from
``draftops.onhost.wire`` and ruff and mypy read every part; the block that imports one part's names
into another exists only in the tree and is dropped (the assembled script is one namespace), and the
one constant whose source is ``remote/events.py`` (``EVENT_PREFIX``) is written into it as its value.
The protocol itself is in docs/protocol.md.
"""
from __future__ import annotations

import ast
import functools
import importlib
import sys
import types
from pathlib import Path

PARTS = ("wire", "slurm", "runs", "logs", "sync", "apply", "main")
HEADER = ('"""draftops host agent: assembled from draftops/onhost/ ({parts}); stdlib only, run with any '
          'python3 (docs/protocol.md)."""\n')


def _values(statement: str) -> str:
    """``from remote.M import A as A``: the names as ``A = <value>`` lines, the values the laptop's M holds."""
    node = ast.parse(statement).body[0]
    assert isinstance(node, ast.ImportFrom) and node.module
    module = importlib.import_module(node.module)
    return "".join(f"{a.asname or a.name} = {getattr(module, a.name)!r}\n" for a in node.names)


def assemble_part(text: str) -> str:
    """One part's text as it goes into the script. A top-level ``from draftops.onhost.* import`` exists
    only in the tree (the script is one namespace) and is dropped; a ``from remote.* import`` names a
    constant whose one source is there, and becomes its value. Any other draftops import is an error:
    the script runs alone on the host."""
    out: list[str] = []
    statement: list[str] = []
    for line in text.splitlines(keepends=True):
        if statement or line.startswith(("from draftops", "from remote", "import draftops", "import remote")):
            statement.append(line)
            if "(" in statement[0] and ")" not in line:
                continue
            joined = "".join(statement)
            statement = []
            if joined.startswith("from draftops.onhost"):
                continue
            if joined.startswith("from remote."):
                out.append(_values(joined))
                continue
            raise ValueError(f"draftops/onhost: a part may import only the stdlib, draftops.onhost and remote "
                             f"constants, not {joined.strip()!r}")
        else:
            out.append(line)
    return "".join(out)


@functools.cache
def source() -> str:
    """The agent script as it is installed on the host: the parts, in order, with a one-line header."""
    folder = Path(__file__).resolve().parent
    texts = [assemble_part((folder / f"{part}.py").read_text()) for part in PARTS]
    return HEADER.format(parts=", ".join(PARTS)) + "\n\n".join(texts)


SCRIPT_MODULE = "draftops.onhost.script"


def script() -> types.ModuleType:
    """The assembled script as one module (one namespace, as on the host), for tests of its internals:
    a name patched here is the name every part's code sees."""
    module = sys.modules.get(SCRIPT_MODULE)
    if module is None:
        module = types.ModuleType(SCRIPT_MODULE)
        module.__file__ = str(Path(__file__).resolve().parent / "script.py")   # never read: no such file
        exec(compile(source(), "<draftops host agent>", "exec"), module.__dict__)   # noqa: S102 - our own parts
        sys.modules[SCRIPT_MODULE] = module
    return module


def __getattr__(name: str) -> types.ModuleType:
    """``from draftops.onhost import agent``: the assembled script as a module (see :func:`script`)."""
    if name == "agent":
        return script()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
