"""Environments on a host: the ml-env venv the remote tools run in, and serving engines in venvs of their own."""
