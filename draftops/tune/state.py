"""``runs/<tune-id>/tune.json``: a tune's state and its findings, one typed model
(``documents/tune.TuneDoc``), written whole (remote/fileio.py) after every change; read back bounded,
refused in one paragraph naming the file when it is not what tune writes. The lock (``.tune.lock``,
flock) lets one process run a tune at a time, so two ``--resume`` never both serve."""
from __future__ import annotations

import contextlib
from pathlib import Path

from draftops import cmdline
from draftops.documents import parse
from draftops.documents.tune import Args, Step, TuneDoc
from draftops.errors import DocumentError, TuneError
from draftops.history import json_safe, now_iso
from draftops.runs import jobs
from draftops.runs.steps import held as held_lock
from remote.fileio import write_json
from remote.jsonread import loads

STATE_NAME = "tune.json"
LOCK_NAME = ".tune.lock"
MAX_STATE_BYTES = 4 << 20


def resume_command(tune_id: str, host: str, *more: object) -> str:
    """The pasteable `invoke tune --resume ID [MORE…]` (``--host`` last, when not the default)."""
    return cmdline.command("tune", "--resume", tune_id, *more, host=host)


def save(doc: TuneDoc, folder: Path) -> None:
    """tune.json, whole or not at all; a disk that cannot take it is one paragraph."""
    try:
        write_json(folder / STATE_NAME, json_safe({**doc.model_dump(mode="json"), "schema": TuneDoc.SCHEMA}))
    except OSError as exc:
        raise TuneError(f"cannot write {folder / STATE_NAME}: {exc.strerror or exc}. Free disk space there and run "
                        f"`{resume_command(doc.tune_id, doc.host)}`: it continues from the last step the file "
                        "recorded.") from None


def new(runs_dir: Path, host: str, args: Args, steps: list[str]) -> tuple[TuneDoc, Path]:
    tune_id = jobs.new_run_id("tune")
    doc = TuneDoc(tune_id=tune_id, host=host, args=args, created=now_iso(), steps=[Step(name=n) for n in steps])
    folder = runs_dir / tune_id
    folder.mkdir(parents=True, exist_ok=True)
    save(doc, folder)
    return doc, folder


def load(folder: Path) -> TuneDoc:
    """A tune's state, bounded and through its model; anything else one paragraph naming the file."""
    path = folder / STATE_NAME
    again = "start a new tune without --resume"
    try:
        if path.is_symlink() or not path.is_file():
            raise TuneError(f"{path} is not a tune's state file (missing, or not a regular file); `invoke tune "
                            f"--resume` takes the id of a tune run (runs/*-tune-*), or {again}.")
        with path.open("rb") as fh:
            raw = fh.read(MAX_STATE_BYTES + 1)
        if len(raw) > MAX_STATE_BYTES:
            raise TuneError(f"{path} is over {MAX_STATE_BYTES} bytes, far more than a tune writes; {again}.")
        data = loads(raw.decode("utf-8"))
    except (OSError, ValueError) as exc:
        raise TuneError(f"{path} cannot be read as a tune's state ({type(exc).__name__}: {exc}); {again}.") from None
    try:
        return parse(TuneDoc, data, path)
    except DocumentError as exc:
        raise TuneError(f"{exc} ({again}.)") from None


def find(runs_dir: Path, tune_id: str | None) -> Path:
    """The folder of tune ``tune_id`` (default: the latest)."""
    if tune_id is not None:
        if not jobs.is_run_id(tune_id):
            raise TuneError(f"--resume {tune_id!r} is not a run id; give the id of a tune run (runs/*-tune-*) or "
                            "--resume alone for the latest.")
        return runs_dir / tune_id
    found = sorted(p for p in runs_dir.glob("*-tune-*") if (p / STATE_NAME).is_file()) if runs_dir.is_dir() else []
    if not found:
        raise TuneError(f"no tune to resume in {runs_dir} (no runs/*-tune-*/{STATE_NAME}); run `invoke tune --draft "
                        "CKPT` first.")
    return found[-1]


def held(folder: Path) -> contextlib.AbstractContextManager[None]:
    """Hold ``<folder>/.tune.lock`` for the block (the tool's own file, never deleted; runs.steps.held)."""
    path = folder / LOCK_NAME
    return held_lock(
        path,
        missing=lambda: TuneError(
            f"there is no tune {folder.name} (no folder {folder}); `invoke tune --resume` takes the id "
            "of a tune run (runs/*-tune-*)."),
        unopenable=lambda exc: TuneError(
            f"cannot open the tune's lock {path} ({exc.strerror or exc}); the folder must be writable."),
        busy=lambda fd: TuneError(
            f"tune {folder.name} is being run by another `invoke tune` (it holds {path}); two at "
            "once would both serve and bench. Nothing was run: wait for that one to end, then "
            "resume it if it did not finish."))
