"""`invoke doctor`: from a draft to a verified fix in one command (docs/doctor.md).

``plan`` says which steps a doctor runs, ``state`` keeps ``runs/<id>/doctor.json`` (written after every
step, so ``--resume`` can continue), ``steps`` runs each step (``checking``, ``serving``,
``comparing``; ``context`` what they share) with the library functions the single tasks use, ``flow``
runs the plan (signals, clean-up), ``report`` and ``chart`` write the story.
"""
