"""GPU-side code of draftops.

Everything under ``remote/`` is synced to ``<root>/code`` on the host and run there with the host's
ml-env python (``python -m remote.<module>``), so it may import only the standard library, torch and
safetensors.
"""
