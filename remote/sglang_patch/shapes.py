"""Recognise the code shapes SGLang has shipped (0.4.6 .. 0.5.23) and plan the edits each needs.

A file is split into parts, each anchored on a class or function, never on a line number:

* ``setter``: ``set_eagle3_layers_to_capture`` on every class that defines it. ``[v + 1 for v in
  ids]`` alone maps -1 to loop index 0 (native); the >=0.5.13 ``layer_ids[0] == 1`` heuristic
  (DeepSeek) drops the +1 for -1 and needs the patch; a setter without an ids parameter (0.4.6)
  ignores the draft config altogether (unsupported).
* ``capture``: the ``if i in self.layers_to_capture:`` block of ``*Model.forward``. A bare
  ``hidden_states + residual`` crashes at loop index 0 where residual is None (needs the patch);
  an upstream ``... if residual is not None else ...`` guard, a helper call, or a capture delegated
  to the layer (``captured_last_layer_outputs=`` / ``capture_output=``) works natively.
* ``cuda_graph``: argument-less ``<runner>.model.set_eagle3_layers_to_capture()`` calls (<=0.5.10),
  which install the default ids before the CUDA graphs are captured.

Anything else is ``unknown``: the patcher refuses rather than guess.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field

from . import template as T
from .edits import Edit, Source, enclosing_statement, parents

NATIVE = "native"
PATCHED = "patched"
NEEDS_PATCH = "needs-patch"
UNSUPPORTED = "unsupported"
UNKNOWN = "unknown"
MODIFIED = "modified"

#: most severe first; a file takes the state of its most severe part
SEVERITY = (UNKNOWN, UNSUPPORTED, NEEDS_PATCH, PATCHED, NATIVE)


@dataclass
class Part:
    """One patchable concern of a file."""

    name: str
    state: str
    detail: str
    edits: list[Edit] = field(default_factory=list)
    needs_helpers: bool = False
    #: edits of a native part that ride along when the file is patched anyway (uniform setter)
    optional: bool = False


@dataclass
class Analysis:
    """Everything the patcher knows about one file's code."""

    parts: list[Part]
    marker_versions: list[int]
    source: Source | None = None

    @property
    def state(self) -> str:
        """State of the file (before comparing against the state folder's records)."""
        states = [p.state for p in self.parts]
        return next((s for s in SEVERITY if s in states), NATIVE)

    @property
    def detail(self) -> str:
        """One line per part, worst first."""
        parts = sorted(self.parts, key=lambda p: SEVERITY.index(p.state))
        return "; ".join(f"{p.name}: {p.detail}" for p in parts)

    def planned_edits(self) -> list[Edit]:
        """Edits that bring every needs-patch part to patched (helpers appended once).

        A file that needs patching also gets its natively working setter wrapped, so every
        patched file sorts/de-duplicates ids and reuses configured ids on argument-less calls.
        """
        pending = [p for p in self.parts if p.state == NEEDS_PATCH]
        if pending:
            pending += [p for p in self.parts if p.optional and p.state == NATIVE]
        edits = [e for p in pending for e in p.edits]
        if any(p.needs_helpers for p in pending) and not _has_helpers(self.source):
            assert self.source is not None
            edits.append(self.source.append(T.HELPER_BLOCK))
        return edits


def missing(detail: str) -> Analysis:
    """Analysis of a file that does not exist in this SGLang."""
    return Analysis(parts=[Part("file", UNSUPPORTED, detail)], marker_versions=[])


def analyze_model(src: Source) -> Analysis:
    """Analyse a model file (setter + capture site)."""
    setter = _setter_part(src)
    parts = [setter]
    markers = _markers(src)
    if setter.state != UNSUPPORTED:
        capture = _capture_part(src)
        if capture.state == PATCHED and not markers:
            # draftops' guard form written by hand: it works, but draftops did not patch the file
            capture = Part("capture", NATIVE, "guards residual None (by hand, no draftops marker)")
        parts.append(capture)
    return Analysis(parts=parts, marker_versions=markers, source=src)


def analyze_runner(src: Source, passes_ids: bool) -> Analysis:
    """Analyse a runner file; ``passes_ids``: does this SGLang ever pass the draft's ids?"""
    return Analysis(parts=[_graph_part(src, passes_ids)], marker_versions=_markers(src), source=src)


def passes_configured_ids(src: Source) -> bool:
    """True when ``src`` calls the setter with an argument that is not draftops' own helper."""
    for call in _setter_calls(src.tree):
        if (call.args or call.keywords) and not _is_runner_helper_call(call):
            return True
    return False


# --------------------------------------------------------------------------------------- setter
def _setter_part(src: Source) -> Part:
    classes = [node for node in ast.walk(src.tree) if isinstance(node, ast.ClassDef)
               and (T.SETTER in _methods(node) or T.ORIGINAL_SETTER in _methods(node))]
    if not classes:
        return Part("setter", UNSUPPORTED,
                    f"no {T.SETTER} in this file: this SGLang has no EAGLE-3 capture for the model")
    parts = [_class_setter(src, cls) for cls in classes]
    worst = min(parts, key=lambda p: SEVERITY.index(p.state))
    edits = [e for p in parts if p.state == NEEDS_PATCH or p.optional for e in p.edits]
    details = sorted({p.detail for p in parts if p.state == worst.state})
    return Part("setter", worst.state, " / ".join(details), edits, needs_helpers=bool(edits),
                optional=worst.state == NATIVE)


def _class_setter(src: Source, cls: ast.ClassDef) -> Part:
    methods = _methods(cls)
    if T.ORIGINAL_SETTER in methods:
        wrapper = methods.get(T.SETTER)
        kind = _classify_setter(methods[T.ORIGINAL_SETTER])
        if wrapper is not None and _calls_name(wrapper, T.SET_HELPER) and _has_helpers(src) \
                and kind in ("plus-one", "heuristic"):
            return Part("setter", PATCHED, f"{cls.name}: patched (-1 maps to loop index 0)")
        return Part("setter", UNKNOWN, f"{cls.name}: partially patched or edited draftops code")
    fn = methods[T.SETTER]
    kind = _classify_setter(fn)
    if kind == "no-ids":
        return Part("setter", UNSUPPORTED,
                    f"{cls.name}.{T.SETTER}() takes no layer ids: this SGLang ignores the draft's "
                    "configured ids (upgrade to >= 0.4.10)")
    if kind == "plus-one":
        return Part("setter", NATIVE, f"{cls.name}: ids + 1 (-1 maps to loop index 0)",
                    _setter_edits(src, fn), optional=True)
    if kind == "heuristic":
        return Part("setter", NEEDS_PATCH,
                    f"{cls.name}: adds 1 only when the first id is 1 (SGLang PR #25454), so -1 is "
                    "never captured", _setter_edits(src, fn))
    return Part("setter", UNKNOWN, f"{cls.name}.{T.SETTER}: unrecognised body")


def _classify_setter(fn: ast.FunctionDef) -> str:
    params = fn.args.posonlyargs + fn.args.args
    if len(params) < 2:
        return "no-ids"
    ids = params[1].arg
    plus_one = heuristic = False
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and any(_is_self_attr(t, "model", "layers_to_capture")
                                                for t in node.targets):
            plus_one = plus_one or _is_plus_one(node.value, ids)
        if isinstance(node, ast.Compare) and _is_first_id_is_one(node, ids):
            heuristic = True
    if plus_one:
        return "heuristic" if heuristic else "plus-one"
    return "unknown"


def _setter_edits(src: Source, fn: ast.FunctionDef) -> list[Edit]:
    first = fn.decorator_list[0] if fn.decorator_list else fn
    at = src.line_start(first)
    def_at = src.offset(fn.lineno, fn.col_offset)
    name_at = src.data.index(T.SETTER.encode(), def_at)
    return [Edit(at, at, T.wrapper_method(src.indent(first))),
            Edit(name_at, name_at + len(T.SETTER), T.ORIGINAL_SETTER)]


def _is_plus_one(value: ast.expr, ids: str) -> bool:
    if not (isinstance(value, ast.ListComp) and len(value.generators) == 1):
        return False
    gen = value.generators[0]
    elt = value.elt
    return (isinstance(gen.iter, ast.Name) and gen.iter.id == ids and not gen.ifs
            and isinstance(gen.target, ast.Name) and isinstance(elt, ast.BinOp)
            and isinstance(elt.op, ast.Add) and isinstance(elt.left, ast.Name)
            and elt.left.id == gen.target.id and isinstance(elt.right, ast.Constant)
            and elt.right.value == 1)


def _is_first_id_is_one(node: ast.Compare, ids: str) -> bool:
    left = node.left
    return (isinstance(left, ast.Subscript) and isinstance(left.value, ast.Name)
            and left.value.id == ids and isinstance(left.slice, ast.Constant)
            and left.slice.value == 0 and len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq)
            and isinstance(node.comparators[0], ast.Constant) and node.comparators[0].value == 1)


# -------------------------------------------------------------------------------------- capture
def capture_sites(tree: ast.AST) -> list[tuple[str, ast.AST]]:
    """Every ``i in self.layers_to_capture`` test in a ``forward`` method, with its kind.

    Kinds: ``if`` (the node is the ``ast.If`` whose body captures), ``delegated`` (an ``IfExp``
    choosing what the layer captures into) and ``unknown`` (the bare ``ast.Compare``).
    """
    parent_of = parents(tree)
    sites: list[tuple[str, ast.AST]] = []
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        forward = _methods(cls).get("forward")
        for node in ast.walk(forward) if forward is not None else ():
            if isinstance(node, ast.Compare) and _is_capture_test(node):
                parent = parent_of[node]
                kind = ("if" if isinstance(parent, ast.If) and parent.test is node else
                        "delegated" if isinstance(parent, ast.IfExp) else "unknown")
                sites.append((kind, parent if kind != "unknown" else node))
    return sites


def _capture_part(src: Source) -> Part:
    parent_of = parents(src.tree)
    sites = capture_sites(src.tree)
    if not sites:
        heir = _inherited_model(src)
        if heir:
            return Part("capture", NATIVE, f"capture loop inherited: {heir}")
        return Part("capture", UNKNOWN, "no `i in self.layers_to_capture` test in any forward()")
    results = [_capture_site(src, kind, node, parent_of) for kind, node in sites]
    worst = min(results, key=lambda p: SEVERITY.index(p.state))
    edits = [e for p in results for e in p.edits]
    details = sorted({p.detail for p in results if p.state == worst.state})
    return Part("capture", worst.state, " / ".join(details), _dedupe(edits))


def _capture_site(src: Source, kind: str, node: ast.AST,
                  parent_of: dict[ast.AST, ast.AST]) -> Part:
    if kind == "delegated":
        return Part("capture", NATIVE, "captured by the layer (residual stream, embedding at 0)")
    if kind != "if":
        return Part("capture", UNKNOWN, "unrecognised use of self.layers_to_capture in forward()")
    assert isinstance(node, ast.If)
    sums = [n for stmt in node.body for n in ast.walk(stmt) if _is_residual_sum(n)]
    if not sums:
        if any(isinstance(n, ast.Call) for stmt in node.body for n in ast.walk(stmt)):
            return Part("capture", NATIVE, "captured through a helper call")
        return Part("capture", UNKNOWN, "capture block without a capture call")
    bare = [n for n in sums if _guard_of(n, parent_of) is None]
    if not bare:
        ours = all(_guard_of(n, parent_of) == "draftops" for n in sums)
        return (Part("capture", PATCHED, "guarded for residual None (draftops)") if ours else
                Part("capture", NATIVE, "upstream guards residual None"))
    edits: list[Edit] = []
    statements: list[ast.stmt] = []
    for binop in bare:
        assert isinstance(binop, ast.BinOp)
        start, end = src.span(binop)
        edits.append(Edit(start, end, T.guarded_capture(binop.left.id, binop.right.id)))  # type: ignore[attr-defined]
        stmt = enclosing_statement(binop, parent_of)
        if stmt not in statements:
            statements.append(stmt)
    edits += [src.comment_before(stmt, T.CAPTURE_COMMENT) for stmt in statements]
    return Part("capture", NEEDS_PATCH,
                "`hidden_states + residual` fails at loop index 0 (residual is None)", edits)


def _is_capture_test(node: ast.Compare) -> bool:
    return (len(node.ops) == 1 and isinstance(node.ops[0], ast.In)
            and _is_self_attr(node.comparators[0], "layers_to_capture"))


def _is_residual_sum(node: ast.AST) -> bool:
    return (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add)
            and isinstance(node.left, ast.Name) and isinstance(node.right, ast.Name)
            and "residual" in node.right.id)


def _guard_of(binop: ast.AST, parent_of: dict[ast.AST, ast.AST]) -> str | None:
    """'draftops' / 'upstream' when ``binop`` sits under an IfExp testing residual for None."""
    assert isinstance(binop, ast.BinOp) and isinstance(binop.right, ast.Name)
    residual = binop.right.id
    node: ast.AST = binop
    while node in parent_of and not isinstance(node, ast.stmt):
        parent = parent_of[node]
        if isinstance(parent, ast.IfExp) and _tests_none(parent.test, residual):
            ours = (isinstance(parent.test, ast.Compare) and isinstance(parent.test.ops[0], ast.Is)
                    and parent.orelse is node)
            return "draftops" if ours else "upstream"
        node = parent
    return None


def _tests_none(test: ast.expr, name: str) -> bool:
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
            and test.left.id == name and len(test.ops) == 1
            and isinstance(test.ops[0], (ast.Is, ast.IsNot))
            and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None)


def _inherited_model(src: Source) -> str | None:
    """'Child(Base)' for a ``*Model`` class that reuses its base's forward (qwen3 <= 0.5.20)."""
    for cls in src.tree.body:
        if isinstance(cls, ast.ClassDef) and cls.name.endswith("Model") \
                and "forward" not in _methods(cls):
            bases = [b.id for b in cls.bases if isinstance(b, ast.Name) and b.id.endswith("Model")]
            if bases:
                return f"{cls.name}({bases[0]})"
    return None


# ----------------------------------------------------------------------------------- cuda graph
def _graph_part(src: Source, passes_ids: bool) -> Part:
    calls = list(_setter_calls(src.tree))
    bare = [c for c in calls if not c.args and not c.keywords]
    ours = [c for c in calls if _is_runner_helper_call(c)]
    if not bare:
        if ours:
            ok = _has_helpers(src)
            return Part("cuda_graph", PATCHED if ok else UNKNOWN,
                        "argument-less setter calls pass the configured ids (draftops)" if ok
                        else "draftops call without its helpers")
        return Part("cuda_graph", NATIVE, "no argument-less set_eagle3_layers_to_capture() call")
    if not passes_ids:
        return Part("cuda_graph", UNSUPPORTED,
                    "this SGLang never passes the draft's layer ids (upgrade to >= 0.4.10)")
    parent_of = parents(src.tree)
    edits: list[Edit] = []
    for call in bare:
        func = call.func
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Attribute)
                and func.value.attr == "model"):
            return Part("cuda_graph", UNKNOWN, f"unrecognised setter call at line {call.lineno}")
        start, end = src.span(call)
        runner = src.segment(func.value.value)
        edits.append(Edit(start, end, T.runner_call(src.segment(func), runner)))
        edits.append(src.comment_before(enclosing_statement(call, parent_of), T.CALL_COMMENT))
    lines = ", ".join(str(c.lineno) for c in bare)
    return Part("cuda_graph", NEEDS_PATCH,
                f"argument-less setter call(s) at line {lines} install the default ids before "
                "CUDA-graph capture", _dedupe(edits), needs_helpers=True)


def _setter_calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == T.SETTER:
            yield node


def _is_runner_helper_call(call: ast.Call) -> bool:
    return (len(call.args) == 1 and isinstance(call.args[0], ast.Call)
            and isinstance(call.args[0].func, ast.Name) and call.args[0].func.id == T.RUNNER_HELPER)


# -------------------------------------------------------------------------------------- helpers
def _methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}


def _is_self_attr(node: ast.AST, *attrs: str) -> bool:
    """True for ``self.<attrs[0]>.<attrs[1]>...``."""
    for attr in reversed(attrs):
        if not (isinstance(node, ast.Attribute) and node.attr == attr):
            return False
        node = node.value
    return isinstance(node, ast.Name) and node.id == "self"


def _calls_name(fn: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name
               for n in ast.walk(fn))


def _has_helpers(src: Source | None) -> bool:
    if src is None:
        return False
    names = {n.name for n in src.tree.body if isinstance(n, ast.FunctionDef)}
    return all(h in names for h in T.HELPERS)


def _markers(src: Source) -> list[int]:
    return sorted({int(m) for m in T.MARKER_RE.findall(src.data)})


def _dedupe(edits: list[Edit]) -> list[Edit]:
    out: list[Edit] = []
    for edit in edits:
        if edit not in out:
            out.append(edit)
    return out
