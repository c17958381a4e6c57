"""status / apply / verify / revert on an SGLang install.

Every action first surveys all files and checks every refusal condition; only then does it save
originals and write. Writes are transactional across files: a failure after the first replacement
restores the files already written, so SGLang is never left half patched.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import py_compile
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from .. import events
from ..fileio import atomic_write_bytes, sha256_bytes, writable
from . import shapes, simulate
from .errors import (
    Busy,
    CompileFailed,
    ModifiedFile,
    NotWritable,
    PatchError,
    StateError,
    UnknownShape,
    UnsupportedVersion,
)
from .locate import SglangInstall
from .state import StateStore
from .survey import FileRow, survey
from .targets import MODEL, RUNNER, resolve_models
from .template import ENV_LAYER_IDS, PATCH_VERSION

#: ids the verify simulation feeds the setter (output-of-layer convention) and what it expects
PROBE_IDS = [-1, 2, 30]
PROBE_LOOP_INDICES = [0, 3, 31]
PROBE_NUM_LAYERS = 61
#: how long apply/revert wait for another run on the same install before refusing
LOCK_WAIT_S = 120.0


@dataclass
class Outcome:
    """What an action found and did."""

    rows: list[FileRow]
    changed: list[str] = field(default_factory=list)
    ok: bool = True
    checks: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def status(install: SglangInstall, store: StateStore, models: list[str] | None = None) -> Outcome:
    """Survey only."""
    rows = survey(install, store)
    _select(rows, models)  # validates --models
    return Outcome(rows)


def apply(install: SglangInstall, store: StateStore, models: list[str] | None = None) -> Outcome:
    """Patch every selected file that needs it; a second run changes nothing."""
    with install_lock(install):
        return _apply(install, store, models)


def _apply(install: SglangInstall, store: StateStore, models: list[str] | None) -> Outcome:
    rows = survey(install, store)
    selected = _select(rows, models)
    _refuse_unknown(selected, install)
    _refuse_modified(selected, store)
    _refuse_unsupported(selected, install, explicit=bool(models))
    todo = [r for r in selected if r.state == shapes.NEEDS_PATCH]
    if not todo:
        return Outcome(rows, notes=["nothing to patch: every selected file is native or patched"])
    plans = [(row, _patched_bytes(row)) for row in todo]
    _refuse_symlinked([row for row, _ in plans], install)
    _refuse_unwritable([row for row, _ in plans], install)
    records = {}
    for row, _ in plans:
        keep = row.record if row.record and row.record.patched_sha256 == row.sha256 else None
        records[row.target.rel] = keep or store.save_original(
            row.target.rel, row.data or b"", sglang_dir=install.root, version=install.version,
            mode=row.path.stat().st_mode & 0o7777)
    # records name the patched sha256 before any file changes: a run killed between two writes
    # leaves each file either original (record ignored) or exactly as recorded (revertable)
    for row, new in plans:
        record = records[row.target.rel]
        record.patched_sha256 = sha256_bytes(new)
        record.patch_version = PATCH_VERSION
        store.write(record)
    _replace_files(plans, progress_label="apply")
    return Outcome(survey(install, store), changed=[row.target.rel for row, _ in plans])


def revert(install: SglangInstall, store: StateStore, models: list[str] | None = None) -> Outcome:
    """Restore every selected file draftops patched, byte for byte."""
    with install_lock(install):
        return _revert(install, store, models)


def _revert(install: SglangInstall, store: StateStore, models: list[str] | None) -> Outcome:
    rows = survey(install, store)
    selected = _select(rows, models)
    plans: list[tuple[FileRow, bytes]] = []
    problems: list[str] = []
    forget: list[str] = []
    notes: list[str] = []
    for row in selected:
        rel, record, sha = row.target.rel, row.record, row.sha256
        if row.data is None:
            continue
        if record is None:
            if row.analysis.marker_versions:
                problems.append(f"{row.path} carries draftops code but {store.dir} holds no "
                                "record or backup of its original")
            continue
        if sha == record.original_sha256:
            forget.append(rel)
        elif sha == record.patched_sha256:
            plans.append((row, store.original(record)))
        elif row.analysis.marker_versions:
            problems.append(f"{row.path} has sha256 {sha[:12] if sha else '?'} but draftops wrote "
                            f"{(record.patched_sha256 or '?')[:12]}")
        else:
            notes.append(f"{rel}: no draftops code in it any more (reinstalled?); record dropped")
            forget.append(rel)
    if problems:
        raise ModifiedFile(
            "Refusing to revert because files changed after draftops patched them: "
            + "; ".join(problems) + ". Restoring the saved originals would throw those edits "
            f"away. Reinstall the pristine files (pip install --force-reinstall --no-deps "
            f"sglang=={install.version}) or restore them by hand from the backups under "
            f"{store.dir}. Nothing was changed."
        )
    _refuse_unwritable([row for row, _ in plans], install)
    _replace_files(plans, progress_label="revert")
    for rel in forget + [row.target.rel for row, _ in plans]:
        store.forget(rel)
    return Outcome(survey(install, store), changed=[row.target.rel for row, _ in plans],
                   notes=notes)


def verify(install: SglangInstall, store: StateStore, models: list[str] | None = None,
           import_check: bool = False) -> Outcome:
    """Check that every selected model file captures the embedding for id -1, by running it."""
    rows = survey(install, store)
    selected = _select(rows, models)
    checks: list[dict[str, Any]] = []
    for row in selected:
        checks.extend(_row_checks(row, store, explicit=bool(models)))
    if not any(r.target.kind == MODEL and r.state in (shapes.NATIVE, shapes.PATCHED)
               for r in selected):
        checks.append(_check("*", "supported", False,
                             f"no selected model file of SGLang {install.version} can capture -1"))
    if import_check:
        checks.extend(_import_checks(install, selected))
    return Outcome(rows, ok=all(c["ok"] for c in checks), checks=checks)


@contextlib.contextmanager
def install_lock(install: SglangInstall, wait_s: float | None = None) -> Iterator[None]:
    """Hold an exclusive flock on the ``sglang/`` folder itself for one apply or revert.

    Two runs on one install would otherwise survey, save originals and write records over each
    other (a patched file saved as the "original", a record lost). Locking the folder (not a file
    in the state dir) covers runs with different state dirs and writes nothing into site-packages.
    """
    wait_s = LOCK_WAIT_S if wait_s is None else wait_s
    fd = os.open(install.root, os.O_RDONLY)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise Busy(
                        f"Another sglang-patch apply/revert has held {install.root} for over "
                        f"{wait_s:.0f} s. Wait for it to finish (or stop it), then run this "
                        "again. Nothing was changed."
                    ) from None
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------ refusals
def _select(rows: list[FileRow], models: list[str] | None) -> list[FileRow]:
    try:
        keys = resolve_models(models)
    except ValueError as exc:
        raise PatchError(f"--models: {exc}.") from exc
    return [r for r in rows if r.target.kind == RUNNER or r.target.model in keys]


def _refuse_unknown(rows: list[FileRow], install: SglangInstall) -> None:
    unknown = [r for r in rows if not r.known_shape]
    if unknown:
        listing = "; ".join(f"{r.path}: {r.detail}" for r in unknown)
        raise UnknownShape(
            f"SGLang {install.version} at {install.root} has code that sglang-patch "
            f"v{PATCH_VERSION} does not recognise ({listing}). Patching it blindly could break "
            "the server, so nothing was changed. Update draftops (or extend "
            "remote/sglang_patch/shapes.py for this version), or select other files with --models."
        )


def _refuse_modified(rows: list[FileRow], store: StateStore) -> None:
    modified = [r for r in rows if r.state == shapes.MODIFIED]
    if modified:
        listing = "; ".join(f"{r.path}: {r.detail}" for r in modified)
        raise ModifiedFile(
            f"Refusing to patch files that were edited after draftops patched them ({listing}). "
            f"Reinstall sglang to get pristine files, or restore the originals saved under "
            f"{store.dir}, then apply again. Nothing was changed."
        )


def _refuse_unsupported(rows: list[FileRow], install: SglangInstall, explicit: bool) -> None:
    models = [r for r in rows if r.target.kind == MODEL]
    unsupported = [r for r in models if r.state == shapes.UNSUPPORTED]
    if unsupported and (explicit or len(unsupported) == len(models)):
        listing = "; ".join(f"{r.target.model} ({r.target.rel}): {r.detail}" for r in unsupported)
        raise UnsupportedVersion(
            f"SGLang {install.version} cannot capture configured EAGLE-3 layer ids for the "
            f"requested model(s): {listing}. Install an SGLang that supports EAGLE-3 for this "
            "model (0.4.10 or later; DeepSeek/Kimi need 0.5.5 or later) and run "
            "`python -m remote.sglang_patch apply` again. Nothing was changed."
        )


def _refuse_symlinked(rows: list[FileRow], install: SglangInstall) -> None:
    """Refuse files reached through a symlink below the package folder.

    Replacing a linked file cuts the link (revert writes back a plain file, not the link); a linked
    folder would have the patch land in the shared copy every other environment imports.
    """
    root = install.root.resolve()
    linked = [(r, r.path.resolve()) for r in rows if r.path.resolve() != root / r.target.rel]
    if linked:
        listing = "; ".join(f"{r.path} -> {real}" for r, real in linked)
        raise NotWritable(
            f"Refusing to patch through a symlink ({listing}): the patch would either replace the "
            "link by a plain file or change the shared copy other environments use. Patch the "
            "install the link points into (with that environment's python), or replace the link "
            "by a copy of its target (cp --remove-destination TARGET LINK). Nothing was changed."
        )


def _refuse_unwritable(rows: list[FileRow], install: SglangInstall) -> None:
    blocked = [r for r in rows if not writable(r.path)]
    if blocked:
        listing = ", ".join(str(r.path) for r in blocked)
        raise NotWritable(
            f"Cannot replace {listing}: this user (uid {os.getuid()}) may not write the file or "
            f"its folder under {install.root}. Run the patcher as the owner of the environment "
            "(or with sudo), or patch a writable copy of sglang. Nothing was changed."
        )


# -------------------------------------------------------------------------------------- writes
def _patched_bytes(row: FileRow) -> bytes:
    source = row.analysis.source
    assert source is not None
    new = source.apply(row.analysis.planned_edits())
    _compile(new, row.path, "patched ")
    return new


def _compile(data: bytes, path: Path, what: str) -> None:
    try:
        compile(data, str(path), "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        raise CompileFailed(
            f"The {what}{path} does not compile ({exc}); the file was left untouched. This is a "
            "draftops bug for this SGLang version: report it with `python -m remote.sglang_patch "
            "status` output."
        ) from exc


def _replace_files(plans: list[tuple[FileRow, bytes]], progress_label: str) -> None:
    """Replace each file atomically; on any failure put back every file already replaced."""
    written: list[FileRow] = []
    try:
        for done, (row, new) in enumerate(plans, start=1):
            try:
                atomic_write_bytes(row.path, new)
            except OSError as exc:  # a full disk, a quota, a file-size limit
                raise NotWritable(
                    f"Cannot write {row.path} ({exc}); every file was put back as it was. Free "
                    f"space on that filesystem (or fix what the error names) and run "
                    f"{progress_label} again."
                ) from exc
            written.append(row)
            _byte_compile(row.path)
            events.progress(done, len(plans), f"{progress_label} {row.target.rel}")
    except BaseException as exc:
        stuck = _put_back(written)
        if stuck:
            raise NotWritable(
                f"{exc} Putting back {', '.join(stuck)} failed as well; each holds exactly what "
                f"{progress_label} wrote, which `status` reports and `revert` undoes once the "
                "filesystem accepts writes again."
            ) from exc
        raise


def _put_back(rows: list[FileRow]) -> list[str]:
    """Restore each row's previous bytes, newest first; the paths that could not be restored."""
    stuck = []
    for row in reversed(rows):
        try:
            atomic_write_bytes(row.path, row.data or b"")
        except OSError as err:
            stuck.append(f"{row.path} ({err})")
    return stuck


def _byte_compile(path: Path) -> None:
    """Byte-compile the file as written (into a throwaway .pyc, site-packages stays as is)."""
    with tempfile.TemporaryDirectory(prefix="draftops-pyc-") as tmp:
        try:
            py_compile.compile(str(path), cfile=str(Path(tmp) / "check.pyc"), doraise=True)
        except py_compile.PyCompileError as exc:
            raise CompileFailed(
                f"{path} does not byte-compile after the write ({exc.msg}); every file was put "
                "back as it was."
            ) from exc


# -------------------------------------------------------------------------------------- checks
def _check(file: str, name: str, ok: bool, detail: str) -> dict[str, Any]:
    return {"file": file, "check": name, "ok": ok, "detail": detail}


def _row_checks(row: FileRow, store: StateStore, explicit: bool) -> list[dict[str, Any]]:
    rel = row.target.rel
    if row.state in (shapes.NEEDS_PATCH, shapes.MODIFIED):
        return [_check(rel, "state", False, f"{row.state}: {row.detail}")]
    if row.state == shapes.UNSUPPORTED:
        ok = row.known_shape and not (explicit and row.target.kind == MODEL)
        return [_check(rel, "state", ok, f"unsupported: {row.detail}")]
    checks = [_check(rel, "state", True, f"{row.state}: {row.detail}")]
    if row.data is None:
        return checks
    checks.append(_guarded(rel, "compiles", partial(_compile, row.data, row.path, "")))
    if row.target.kind != MODEL:
        return checks
    original = None
    if row.state == shapes.PATCHED and row.record is not None:
        try:
            original = store.original(row.record)
            checks.append(_check(rel, "backup", True, row.record.backup))
        except StateError as exc:
            checks.append(_check(rel, "backup", False, str(exc)))
    for cls in simulate.setter_classes(row.data):
        for name, got, want in _setter_probes(row.data, cls, row.state, original):
            checks.append(_guarded(rel, name, partial(_expect, got, want)))
    for a2a in (False, True):
        checks.append(_guarded(rel, f"capture at loop index 0 (a2a={a2a})",
                               partial(_expect_captures, row.data, a2a)))
    return checks


Thunk = Callable[[], Any]


def _setter_probes(data: bytes, cls: str, state: str,
                   original: bytes | None) -> list[tuple[str, Thunk, Thunk]]:
    """(check name, what the file does, what it should do) for one class's setter."""
    run = partial(simulate.run_setter, data, cls, num_layers=PROBE_NUM_LAYERS)
    probes: list[tuple[str, Thunk, Thunk]] = [(f"{cls}: {PROBE_IDS} -> {PROBE_LOOP_INDICES}", partial(run, PROBE_IDS),
               partial(list, PROBE_LOOP_INDICES))]
    if state == shapes.PATCHED:
        env = ",".join(map(str, PROBE_IDS))
        probes.append((f"{cls}: no ids + ${ENV_LAYER_IDS}={env}",
                       partial(run, None, env_ids=env), partial(list, PROBE_LOOP_INDICES)))
    if original is not None:
        upstream = [1, 29, 57]
        probes.append((f"{cls}: {upstream} as upstream", partial(run, upstream),
                       partial(simulate.run_setter, original, cls, upstream,
                               num_layers=PROBE_NUM_LAYERS)))
    return probes


def _expect(got: Thunk, want: Thunk) -> str:
    value, expected = got(), want()
    if value != expected:
        raise AssertionError(f"got {value}, expected {expected}")
    return f"{value}"


def _expect_captures(data: bytes, a2a: bool) -> str:
    blocks = simulate.run_capture_blocks(data, index=0, hidden=1.5, residual=None, a2a=a2a)
    if any(block != [1.5] for block in blocks):
        raise AssertionError(f"captured {blocks}, expected the embedding (1.5) in every block")
    if not blocks:
        return "no capture block in this file (inherited, or delegated to the layers)"
    return f"{len(blocks)} capture block(s) store the embedding"


def _guarded(file: str, name: str, fn: Thunk) -> dict[str, Any]:
    try:
        detail = fn()
    except Exception as exc:  # noqa: BLE001 - any failure is a failed check, reported verbatim
        return _check(file, name, False, f"{type(exc).__name__}: {exc}")
    return _check(file, name, True, detail if isinstance(detail, str) else "ok")


def _import_checks(install: SglangInstall, rows: list[FileRow]) -> list[dict[str, Any]]:
    """Import each patched module in a fresh interpreter (needs SGLang's own dependencies)."""
    out = []
    paths = [str(install.root.parent)] + os.environ.get("PYTHONPATH", "").split(os.pathsep)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))
    for row in rows:
        if row.state != shapes.PATCHED:
            continue
        module = "sglang." + row.target.rel[:-3].replace("/", ".")
        proc = subprocess.run([sys.executable, "-c", f"import {module}"], env=env,
                              capture_output=True, text=True, timeout=900)
        tail = (proc.stderr.strip().splitlines() or ["ok"])[-1]
        out.append(_check(row.target.rel, f"import {module}", proc.returncode == 0, tail))
    return out
