"""Speed judgments with a small margin need a quiet machine: while one of those engine tests runs, no test
of the check group (tests/conftest.py) runs beside it.

Seen beside the check group's server (bound to the other core): the shipped demo against its baseline,
a true ×0.75, came out ×0.76 (95% CI ×0.53-×1.10), undecided instead of slower. The quiet tests take
an exclusive lock, each check-group test a shared one; a turnstile in front gives the waiting quiet
test the next turn (flock itself would let the check group's tests, one after the other, keep it out).
The locks live in the run's temporary folder, which every xdist worker of the run shares.
"""
from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: engine test files whose speed judgments have a margin that a second server beside them can erase:
#: ×0.75 called slower (comparison), the chosen K within 10% of the best measured (tune), K=15 against a
#: better K about 30% apart (over-drafting)
QUIET = frozenset({"test_comparison_engine.py", "test_tune_engine.py", "test_tune_overdraft_engine.py"})


@contextmanager
def turn(folder: Path, exclusive: bool) -> Iterator[None]:
    """Hold the run's engine lock in ``folder``: alone (``exclusive``) or with the other check tests."""
    with open(folder / "engine-quiet.turnstile", "a+b") as gate, open(folder / "engine-quiet.lock", "a+b") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
