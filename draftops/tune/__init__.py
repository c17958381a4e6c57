"""`invoke tune`: the fastest speculative settings for a draft, predicted from its acceptance profile
and the measured cost of a round, then confirmed (docs/tune.md)."""
