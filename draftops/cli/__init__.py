"""Invoke tasks, grouped by area; ``tasks.py`` only assembles them into a collection."""
