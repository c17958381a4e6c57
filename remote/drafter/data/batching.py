"""Padding many samples into one forward, and keeping the device fed.

A batch keeps every captured slot ([B, T, S, H]) so the layout scan can try each choice of aux
slots on the same tensors.  On CUDA, batches are built in pinned host memory by a background
thread and copied on a side stream one batch ahead, so disk reads, host-to-device copies and the
forward overlap.
"""
from __future__ import annotations

import itertools
import queue
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, fields

import torch

from ..errors import ShapeMismatchError
from .dumps import Sample


@dataclass
class Batch:
    """B samples padded to the longest; row t of the draft pairs token x_t with features g_{t-1}."""

    states: torch.Tensor  # [B, T, S, H] all slots, positions 0..T-1 (zero padded)
    input_ids: torch.Tensor  # [B, N=T-1] x_1..x_{T-1}, 0 on padding
    next_ids: torch.Tensor  # [B, N] x_2..x_T, -1 where there is no next token
    scored: torch.Tensor  # [B, N] bool: loss_mask[t] on valid rows
    lengths: torch.Tensor  # [B] valid rows per sample
    first_ids: torch.Tensor  # [B] x_0, the token of position 0 (slotstats recomputes a tiny target from it)
    positions: torch.Tensor  # [B] each sample's place in the pass's order (reduce.py puts ranks' rows back by it)

    @property
    def rows(self) -> int:
        return int(self.lengths.sum())

    def aux(self, slots: Sequence[int]) -> torch.Tensor:
        """[B, N, A*H]: the chosen slots of positions 0..N-1, concatenated in the given order."""
        b, t, _, h = self.states.shape
        return self.states[:, :-1, list(slots)].reshape(b, t - 1, len(slots) * h)

    def final(self, slot: int) -> torch.Tensor:
        """[B, N, H]: slot ``slot`` (the target's last hidden state) at positions 1..N."""
        return self.states[:, 1:, slot]

    def to(self, device: torch.device, non_blocking: bool = False) -> Batch:
        return Batch(*(getattr(self, f.name).to(device, non_blocking=non_blocking) for f in fields(self)))

    def pin(self) -> Batch:
        """Page-locked copies of the tensors that are not pinned yet."""
        return Batch(*(t if t.is_pinned() else t.pin_memory()
                       for t in (getattr(self, f.name) for f in fields(self))))


def collate(samples: Sequence[Sample], max_len: int | None = None, pin: bool = False,
            positions: Sequence[int] | None = None) -> Batch:
    """Pad ``samples`` (truncated to ``max_len`` tokens) into one Batch on the host, in pinned
    memory when ``pin`` (so the device copy can run asynchronously); ``positions``: their places in
    the pass's order (default 0..B-1).  A sample that holds only some
    of its file's slots (``Sample.slots``) gets zeros in the others: nothing reads them."""
    trimmed = [(s.token_ids[:max_len], s.hidden[:max_len],
                None if s.loss_mask is None else s.loss_mask[:max_len]) for s in samples]
    t = max(ids.shape[0] for ids, _, _ in trimmed)
    s, h = samples[0].slot_count, int(trimmed[0][1].shape[2])
    b = len(samples)
    states = torch.empty(b, t, s, h, dtype=trimmed[0][1].dtype, pin_memory=pin)  # each row written once
    tokens = torch.zeros(b, t + 1, dtype=torch.long)
    mask = torch.zeros(b, t, dtype=torch.bool)
    has_next = torch.zeros(b, t, dtype=torch.bool)
    lengths = torch.zeros(b, dtype=torch.long)
    for i, (ids, hid, lm) in enumerate(trimmed):
        n = ids.shape[0]
        kept = samples[i].slots
        if kept is None:
            states[i, :n] = hid
        else:
            states[i, :n, list(kept)] = hid
            unread = [slot for slot in range(s) if slot not in kept]
            if unread:
                states[i, :n, unread] = 0
        states[i, n:] = 0
        tokens[i, :n] = ids
        mask[i, :n] = True if lm is None else lm
        has_next[i, : n - 1] = True
        lengths[i] = n - 1
    next_ids = torch.where(has_next[:, 1:], tokens[:, 2:t + 1], torch.full_like(tokens[:, 2:t + 1], -1))
    rows = torch.arange(t - 1)[None, :] < lengths[:, None]
    places = torch.tensor(list(positions) if positions is not None else range(b), dtype=torch.long)
    batch = Batch(states, tokens[:, 1:t], next_ids, mask[:, 1:] & rows, lengths, tokens[:, 0].clone(), places)
    return batch.pin() if pin else batch


def iter_batches(load: Callable[[int], Sample], order: Sequence[int], token_budget: int,
                 max_len: int | None = None, pin: bool = False,
                 shape: tuple[int, int] | None = None, readers: int = 4,
                 max_samples: int | None = None, start: int = 0) -> Iterator[Batch]:
    """Read samples in ``order`` (``readers`` files at a time) and yield a Batch whenever the next
    sample would push B * longest past ``token_budget`` (a longer-than-budget sample gets a batch
    of its own) or B past ``max_samples`` (the sequential verdict's blocks).  Every sample's file must
    have ``shape`` = (slots, hidden) (default: the first one read).  Sample ``order[i]`` has position
    ``start + i`` (``Batch.positions``)."""
    current: list[Sample] = []
    places: list[int] = []
    longest = 0
    for place, sample in enumerate(_read_ahead(load, order, readers), start):
        shape = _check_shape(sample, shape)
        n = kept_length(int(sample.token_ids.shape[0]), max_len)
        if n < 2:
            continue  # no (token, next token) pair to score
        if current and not fits(len(current), longest, n, token_budget, max_samples):
            yield collate(current, max_len, pin, places)
            current, places, longest = [], [], 0
        current.append(sample)
        places.append(place)
        longest = max(longest, n)
    if current:
        yield collate(current, max_len, pin, places)


def kept_length(tokens: int, max_len: int | None) -> int:
    """The tokens of a sample that a pass reads (``max_len`` truncates); under 2, nothing is scored (no
    (token, next token) pair): the one length rule of :func:`iter_batches`, :func:`plan` and the planned read."""
    return min(tokens, max_len or tokens)


def fits(count: int, longest: int, n: int, token_budget: int, max_samples: int | None) -> bool:
    """Whether a sample of ``n`` tokens joins a batch of ``count`` samples whose longest has ``longest``:
    the one packing rule of :func:`iter_batches` and :func:`plan`."""
    full = max_samples is not None and count >= max_samples
    return not full and max(longest, n) * (count + 1) <= token_budget


def plan(order: Sequence[int], lengths: Sequence[int], token_budget: int, max_len: int | None = None
         ) -> list[list[tuple[int, int]]]:
    """The batches :func:`iter_batches` would make of ``order``, from the samples' token counts alone
    (safetensors headers): each a list of (position in ``order``, sample index).  Planned up front so
    that the ranks of a torchrun (distributed.py) can share the batches out and every sample is scored
    in the same padded batch as in one process (padding changes fp32 summation order, docs/drafter.md)."""
    batches: list[list[tuple[int, int]]] = []
    current: list[tuple[int, int]] = []
    longest = 0
    for place, (index, length) in enumerate(zip(order, lengths, strict=True)):
        n = kept_length(length, max_len)
        if n < 2:
            continue
        if current and not fits(len(current), longest, n, token_budget, None):
            batches.append(current)
            current, longest = [], 0
        current.append((place, index))
        longest = max(longest, n)
    if current:
        batches.append(current)
    return batches


def iter_planned(load: Callable[[int], Sample], batches: Sequence[Sequence[tuple[int, int]]],
                 max_len: int | None = None, pin: bool = False, shape: tuple[int, int] | None = None,
                 readers: int = 4) -> Iterator[Batch]:
    """The planned ``batches`` (:func:`plan`), read ahead across batch boundaries; a sample that loads
    as a stand-in (NaN/inf, ``EvalContext.load``) leaves its batch, which is not repacked."""
    flat = [entry for batch in batches for entry in batch]
    samples = _read_ahead(load, [index for _, index in flat], readers)
    try:
        yield from _planned(samples, batches, max_len, pin, shape)
    finally:
        samples.close()   # stops the read-ahead's pool when the consumer stops early


def _planned(samples: Iterator[Sample], batches: Sequence[Sequence[tuple[int, int]]], max_len: int | None,
             pin: bool, shape: tuple[int, int] | None) -> Iterator[Batch]:
    for batch in batches:
        current: list[Sample] = []
        places: list[int] = []
        for place, _ in batch:
            sample = next(samples)
            shape = _check_shape(sample, shape)
            if kept_length(int(sample.token_ids.shape[0]), max_len) >= 2:
                current.append(sample)
                places.append(place)
        if current:
            yield collate(current, max_len, pin, places)


def _check_shape(sample: Sample, shape: tuple[int, int] | None) -> tuple[int, int]:
    found = (sample.slot_count, int(sample.hidden.shape[2]))
    if shape is not None and found != shape:
        raise ShapeMismatchError(
            "A dump file has a different number of slots or hidden size than the others",
            path=sample.path, tensor="hidden_states", expected=f"[T, {shape[0]}, {shape[1]}]",
            found=[int(sample.hidden.shape[0]), *found],
            fix="dump every sample with the same layers of the same model")
    return shape or found


def _read_ahead(load: Callable[[int], Sample], order: Sequence[int], readers: int) -> Generator[Sample, None, None]:
    """``load(i)`` for i in ``order``, in order, with up to 2 * ``readers`` reads in flight on a
    thread pool (so reads overlap; torch copies release the GIL); errors are raised in order."""
    if readers <= 1:
        yield from (load(i) for i in order)
        return
    with ThreadPoolExecutor(readers, thread_name_prefix="drafter-read") as pool:
        pending: deque[Future[Sample]] = deque()
        todo = iter(order)
        for i in itertools.islice(todo, 2 * readers):
            pending.append(pool.submit(load, i))
        try:
            while pending:
                sample = pending.popleft().result()
                for i in itertools.islice(todo, 1):
                    pending.append(pool.submit(load, i))
                yield sample
        finally:
            for future in pending:
                future.cancel()


def background(items: Iterable[Batch], depth: int = 2) -> Iterator[Batch]:
    """Run ``items`` (disk reads + collate) in a thread, ``depth`` batches ahead.  When the consumer
    stops early (an error, or closing this generator) the thread is stopped and joined, so no loader
    is left inside torch when the program exits (which aborts the process: exit 134)."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for item in items:
                if not put(item):
                    return
        except BaseException as exc:  # noqa: BLE001 (re-raised in the consumer)
            put(exc)
        put(done)

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    try:
        while (item := q.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()


def to_device(batches: Iterable[Batch], device: torch.device) -> Generator[Batch, None, None]:
    """Move batches to ``device``; on CUDA copy from pinned memory on a side stream, one batch
    ahead, so the copy of batch i+1 overlaps the forward of batch i."""
    if device.type != "cuda":
        yield from (b.to(device) for b in batches)
        return
    stream = torch.cuda.Stream(device)
    pending: tuple[Batch, torch.cuda.Event] | None = None
    for host in batches:
        host = host.pin()
        with torch.cuda.stream(stream):
            dev = host.to(device, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(stream)
        if pending is not None:
            yield _ready(*pending)
        pending = (dev, ready)
    if pending is not None:
        yield _ready(*pending)


def _ready(batch: Batch, event: torch.cuda.Event) -> Batch:
    torch.cuda.current_stream().wait_event(event)
    for f in fields(batch):  # the caching allocator must not reuse these while the copy stream runs
        getattr(batch, f.name).record_stream(torch.cuda.current_stream())
    return batch
