"""Entry point of ``python -m remote.drafter.launch`` (the launcher itself is ``launcher.py``)."""
from ...exitcodes import run
from ...stackcheck import require

require("drafter.launch")    # before .launcher, whose .distributed imports torch: one paragraph, not a traceback
from .launcher import build_parser  # noqa: E402
from .launcher import run as launch  # noqa: E402

run("drafter-launch", lambda: launch(build_parser().parse_args()))
