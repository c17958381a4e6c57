"""What every tune step is given: the host, the state (tune.json) and its folder, how to tell the user,
and the view that remembers the job being followed (an interrupted tune stops it)."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from draftops import cmdline
from draftops.documents.tune import TuneDoc
from draftops.link.host import Host
from draftops.runs.steps import Tracker as Tracker
from draftops.runs.steps import ran as ran
from draftops.serve.request import DEMO, DEMO_DRAFT, demo_dir
from draftops.tune import state


@dataclasses.dataclass
class Ctx:
    host: Host
    doc: TuneDoc
    folder: Path
    say: Callable[[str], None]
    tracker: Tracker

    @property
    def runs_dir(self) -> Path:
        return self.host.project_root / "runs"

    @property
    def demo(self) -> bool:
        return self.doc.args.draft == DEMO

    def draft_path(self) -> str:
        return f"{demo_dir(self.host.state_dir)}/{DEMO_DRAFT}" if self.demo else self.doc.args.draft

    def warn(self, text: str) -> None:
        self.say(f"warning: {text}")

    def save(self) -> None:
        state.save(self.doc, self.folder)

    def command(self, *words: str) -> str:
        return cmdline.command(*words, host=self.host.name)
