"""EAGLE-3 facts shared by every tool that reasons about serving a draft (stdlib only)."""
