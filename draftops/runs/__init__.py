"""Runs on a host: code sync, detached jobs (start, follow, pull) and the one runner of remote tools."""
