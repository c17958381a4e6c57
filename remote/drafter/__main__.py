"""Entry point of ``python -m remote.drafter``."""
import sys

from .cli import main

sys.exit(main())
