"""The bench's pulled files (server metrics, log slices, the client's output, the job's JSON) are read
with bounds: a FIFO or a link to /dev/zero in a run folder reads as absent, never as a read that
waits for a writer or fills memory."""
from __future__ import annotations

import os
from pathlib import Path

from draftops.bench import runner


def test_a_regular_file_is_read(tmp_path: Path) -> None:
    (tmp_path / "m.prom").write_text("vllm:spec_decode_num_drafts_total 3\n")
    (tmp_path / "r.json").write_text('{"a": 1}')
    assert runner._text(tmp_path / "m.prom") == "vllm:spec_decode_num_drafts_total 3\n"
    assert runner._read_json(tmp_path / "r.json") == {"a": 1}


def test_a_fifo_and_dev_zero_read_as_absent(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.prom")
    (tmp_path / "zero.prom").symlink_to("/dev/zero")
    for name in ("fifo.prom", "zero.prom"):
        assert runner._text(tmp_path / name) is None
        assert runner._read_json(tmp_path / name) is None

