"""Entry point of ``python -m remote.drafter``."""
from ..exitcodes import run
from .cli import main

run("drafter", main)
