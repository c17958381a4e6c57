"""draftops: drive a remote GPU host to evaluate, serve and benchmark EAGLE-3 drafts from a laptop."""

__version__ = "0.1.0"
