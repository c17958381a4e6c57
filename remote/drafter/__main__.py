"""Entry point of ``python -m remote.drafter``."""
from ..exitcodes import run
from ..stackcheck import require

require("drafter")      # before .cli, which imports torch: one paragraph, not a traceback
from .cli import main  # noqa: E402

run("drafter", main)
