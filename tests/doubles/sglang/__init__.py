"""Test double of SGLang (see tests/doubles/README.md). Importing it is cheap, like real sglang is not."""
try:
    from sglang.version import __version__
except ImportError:  # pragma: no cover - version.py is part of the double
    __version__ = "0.5.10"
