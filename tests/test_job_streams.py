"""The pieces that carry host output home, fed directly: reply framing, the line splitter, the log
tail offset and the outcome scanner. Each must stay correct and bounded on hostile input (banners,
markers cut between chunks, lines without newlines, huge logs)."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from draftops.link.framing import FramingError, Unframer, error_text, split_replies
from draftops.onhost import agent as hostagent
from draftops.runs import jobs

NONCE = "0123456789abcdef"
REPLY = f"\n{hostagent.FRAME_PREFIX}{NONCE}\n".encode()


def test_replies_are_found_after_any_banner_and_other_markers_are_noise():
    banner = (b"hello from bashrc\n{\"root\": \"/fake\"}\n" + f"{hostagent.FRAME_PREFIX}-\n".encode()
              + b'{"runs": []}\nno newline at the end')
    stdout = banner + REPLY + b'{"root": "/real"}\n' + REPLY + b'{"runs": [1]}\ntrailing noise\n'
    replies, noise = split_replies(stdout, NONCE)
    assert replies == [{"root": "/real"}, {"runs": [1]}]
    assert noise == banner


def test_a_marker_followed_by_something_else_than_json_is_an_error():
    with pytest.raises(FramingError, match="not JSON"):
        split_replies(REPLY + b"garbage\n", NONCE)
    with pytest.raises(FramingError, match="not a JSON object"):
        split_replies(REPLY + b"[1, 2]\n", NONCE)


def test_the_error_text_is_what_follows_the_error_marker():
    stderr = (b"err-noise from a start-up file\n" + f"\n{hostagent.ERROR_PREFIX}{NONCE}\n".encode()
              + b"no run folder runs/x\n")
    assert error_text(stderr, NONCE).strip() == "no run folder runs/x"
    assert "Traceback" in error_text(b"Traceback (most recent call last):\n", NONCE)


@pytest.mark.parametrize("cut", range(len(REPLY) + 12))
def test_a_stream_marker_cut_anywhere_between_chunks_is_still_found(cut):
    stream = b"banner line\npartial banner" + REPLY + b'{"offset": 5}\n' + b"payload \x00\xff bytes\n"
    got, headers = [], []
    unframer = Unframer(NONCE, got.append, headers.append)
    for piece in (stream[:cut + 20], stream[cut + 20:]):
        if piece:
            unframer.feed(piece)
    assert headers == [{"offset": 5}]
    assert b"".join(got) == b"payload \x00\xff bytes\n"
    assert unframer.noise == b"banner line\npartial banner"


def test_noise_before_a_stream_marker_is_kept_bounded():
    unframer = Unframer(NONCE, lambda b: None, lambda h: None)
    block = b"x" * 65536
    for _ in range(160):                           # 10 MiB of noise and no marker
        unframer.feed(block)
    assert not unframer.framed
    assert len(unframer.pending) < len(REPLY)
    assert len(unframer.noise) < 3 * Unframer.NOISE_KEPT


def test_line_splitter_passes_long_lines_on_in_bounded_pieces_in_linear_time():
    lines: list[str] = []
    splitter = jobs.LineSplitter(lines.append, max_line=1 << 16)
    chunk = b"x" * 1024
    started = time.perf_counter()
    for _ in range(32 * 1024):                     # 32 MiB without a single newline, in 1 KiB chunks
        splitter.feed(chunk)
        assert len(splitter.partial) < 1 << 16
    splitter.close()
    elapsed = time.perf_counter() - started
    assert sum(len(line) for line in lines) == 32 << 20
    assert max(len(line) for line in lines) == 1 << 16
    assert elapsed < 20, f"32 MiB took {elapsed:.1f}s: the splitter is not linear"


def test_line_splitter_separates_events_text_and_the_end():
    texts, seen = [], []
    splitter = jobs.LineSplitter(texts.append, seen.append)
    payload = (b"one\r\ntwo \x1b[31mred\x1b[0m\n@@draftops {\"event\": \"progress\", \"done\": 1}\n"
               b"@@draftops not json\n" + "ünï".encode() + b"\xff\n"
               b"@@draftops {\"event\": \"job-end\", \"state\": \"succeeded\"}\nlast without newline")
    for i in range(len(payload)):                  # one byte at a time: nothing depends on chunking
        splitter.feed(payload[i:i + 1])
    splitter.close()
    assert texts == ["one", "two red", "@@draftops not json", "ünï\ufffd", "last without newline"]
    assert seen == [{"event": "progress", "done": 1}]
    assert splitter.end == {"event": "job-end", "state": "succeeded"}


def _log(tmp_path: Path, data: bytes) -> str:
    path = tmp_path / "log"
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize("block", [3, 7, 64, 1 << 16])
def test_tail_offset_counts_text_lines_from_the_end(tmp_path, monkeypatch, block):
    monkeypatch.setattr(hostagent, "BLOCK", block)
    event = b'@@draftops {"event": "progress"}\n'
    data = b"first\n" + event + b"second\nthird\n" + event * 3 + b"fourth\n"
    path = _log(tmp_path, data)
    assert data[hostagent._tail_offset(path, 1):] == b"fourth\n"
    assert data[hostagent._tail_offset(path, 2):] == b"third\n" + event * 3 + b"fourth\n"
    assert hostagent._tail_offset(path, 4) == 0
    assert hostagent._tail_offset(path, 100) == 0
    assert hostagent._tail_offset(path, 0) == len(data)
    path = _log(tmp_path, b"a\nb\nno newline")
    assert hostagent._tail_offset(path, 1) == 4
    assert hostagent._tail_offset(str(tmp_path / "missing"), 5) == 0


def test_tail_offset_of_a_log_without_newlines_reads_a_bounded_amount(tmp_path, monkeypatch):
    path = tmp_path / "log"
    with open(path, "wb") as fh:                    # 64 MiB in one line, sparse on disk
        fh.truncate(64 << 20)
    reads = []
    real = os.pread

    def counting(fd, n, offset):
        reads.append(n)
        return real(fd, n, offset)

    monkeypatch.setattr(hostagent.os, "pread", counting)
    offset = hostagent._tail_offset(str(path), 10)
    assert offset == (64 << 20) - 10 * hostagent.MAX_LINE
    assert sum(reads) <= 10 * hostagent.MAX_LINE


@pytest.mark.parametrize("read", [5, 13, 1 << 20])
def test_outcome_scanner_reads_growing_logs_in_blocks(tmp_path, monkeypatch, read):
    monkeypatch.setattr(hostagent._EventScanner, "READ", read)
    path = tmp_path / "log"
    scanner = hostagent._EventScanner(str(path))
    assert scanner.scan() is False                  # no log yet
    result = {"event": "result", "path": "report.json", "status": "MISMATCH", "t": 1.0,
              "nested": {"ignored": True}, "long": "x" * 1000}
    with open(path, "wb") as fh:
        fh.write(b"text @@draftops {\"event\": \"result\", \"status\": \"not at a line start\"}\n")
        fh.write(b"@@draftops " + json.dumps({"event": "progress", "done": 1}).encode() + b"\n")
        fh.write(b"@@draftops " + json.dumps(result).encode()[:20])     # half a line so far
        fh.flush()
        assert scanner.scan() is False
        fh.write(json.dumps(result).encode()[20:] + b"\n")
        fh.flush()
        assert scanner.scan() is True
        assert scanner.outcome == {"path": "report.json", "status": "MISMATCH", "long": "x" * 300}
        fh.write(b"@@draftops " + json.dumps({"event": "error", "message": "bad \x1b[2J"}).encode() + b"\n")
        fh.write(b"@@draftops " + json.dumps({"event": "result", "headline": "412 tok/s"}).encode())
        fh.flush()
    assert scanner.scan(final=True) is True
    assert scanner.outcome == {"headline": "412 tok/s", "error": "bad \x1b[2J"}
