"""The verdict: which aux layout the draft was trained on against the one it is served (``layouts``), and what
the two passes measured (``results``), read by the report and the cause checks."""
