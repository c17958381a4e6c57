"""Loading what is scored: the draft's config and layout, its checkpoint in any trainer's format, its vocabulary
map, and the three tensors of the target (verifier) model."""
