"""The hidden-state dumps: their formats, the trainer files next to them (slot layers, vocabulary map), the
engine's own states and measured layers that capture-check kept, the chat template, and batching."""
