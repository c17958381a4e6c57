"""The evaluator under torchrun: ``python -m remote.drafter.launch`` (``launcher``), its command lines
(``launch_line``, also imported by the local side) and the ranks' process group (``distributed``)."""
