"""draftops: drive a remote GPU host to evaluate, serve and benchmark EAGLE-3 drafts from a laptop."""
from draftops import timing

__version__ = "0.1.0"
timing.at("draftops-import")   # with DRAFTOPS_TIMING=1: where interpreter and invoke start-up end
