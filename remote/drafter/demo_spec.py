"""What a complete demo is, without torch: its version, parameters, layout and completion marker.

The local side asks "is the demo there?" before every `--draft demo` / `--ckpt demo` / `--dataset demo`
task; answering it must not cost a torch import on the host (seconds on a CPU box), so this module is
stdlib only, and ``python -m remote.drafter.demo_spec DIR`` prints ``{"complete": true|false, ...}``.
The builder is ``remote.drafter.demo.build``.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from .. import exitcodes, jsonread

DEMO_VERSION = 3  # 2: speculators-format ids in the vLLM convention; 3: a standard, servable target
MARKER = "DEMO.json"
SERVE_INFO = "SERVE.json"
SERVE_SCHEMA = "draftops.demo-serve/1"


@dataclass(frozen=True)
class DemoSpec:
    """Every knob of the demo (a cached demo is reused only when they all match)."""

    seed: int = 0
    vocab_size: int = 64
    draft_vocab_size: int = 48
    num_layers: int = 6
    hidden_size: int = 64
    samples: int = 256
    seq_len: int = 40
    prompt_len: int = 4
    temperature: float = 0.35
    target_proj_std: float = 0.2
    max_current_token_share: float = 0.60  # redraw the target above this (see _draw_target)
    max_target_draws: int = 8
    layer_a: int = 1  # SGLang ids: output of decoder layer a
    layer_b: int = 3
    layer_c: int = 4
    draft_intermediate: int = 128
    train_steps: int = 3
    train_iters: int = 300
    train_batch: int = 16
    lr: float = 2e-2
    val_fraction: float = 0.1
    precondition: bool = True  # scale fc's init by each aux feature's spread (train.init_draft)
    threads: int = 1  # torch threads while building: tiny ops lose more to thread hand-offs than they gain

    @property
    def slot_ids(self) -> list[int]:
        """SGLang ids of the dumped slots: embedding, l_a, l_b, l_c, final."""
        return [-1, self.layer_a, self.layer_b, self.layer_c, self.num_layers - 1]

    @property
    def trained_ids(self) -> list[int]:
        return [-1, self.layer_a, self.layer_b]

    @property
    def buggy_ids(self) -> list[int]:
        return [self.layer_a, self.layer_b, self.layer_c]


@dataclass(frozen=True)
class DemoPaths:
    """Where each piece of a demo lives."""

    root: Path

    @property
    def target(self) -> Path:
        return self.root / "target"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def data_pt(self) -> Path:
        return self.root / "data_pt"

    @property
    def draft(self) -> Path:
        return self.root / "draft"

    @property
    def draft_flat(self) -> Path:
        return self.root / "draft_flat"

    @property
    def draft_fixed(self) -> Path:
        return self.root / "draft_fixed"

    @property
    def parts(self) -> list[Path]:
        return [self.target, self.data, self.data_pt, self.draft, self.draft_flat, self.draft_fixed]


def is_complete(out: Path, spec: DemoSpec = DemoSpec()) -> bool:
    """True when ``out`` holds a finished demo of this version and these parameters."""
    marker = Path(out) / MARKER
    try:
        meta = jsonread.load(marker)
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("version") == DEMO_VERSION and meta.get("spec") == asdict(spec)


def demo_root_of(path: str | Path) -> Path | None:
    """The generated demo folder holding ``path`` (a folder up the path with the demo's marker), if any:
    an error in the demo's files is fixed by generating it again, not by repairing them."""
    here = Path(path).absolute()
    for folder in [here, *here.parents][:6]:
        if (folder / MARKER).is_file():
            return folder
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m remote.drafter.demo_spec",
                                     description="say whether DIR holds a complete demo of this version")
    parser.add_argument("dir", type=Path, help="the demo folder (<root>/state/demo)")
    args = parser.parse_args(argv)
    print(json.dumps({"complete": is_complete(args.dir), "path": str(args.dir), "version": DEMO_VERSION}))
    return exitcodes.OK


if __name__ == "__main__":
    exitcodes.run("demo-spec", main)
