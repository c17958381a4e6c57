from .. import exitcodes
from ..stackcheck import require

if __name__ == "__main__":
    require("capture")      # before .cli, which imports torch: one paragraph, not a traceback
from .cli import main  # noqa: E402

if __name__ == "__main__":
    exitcodes.run("capture", main)
