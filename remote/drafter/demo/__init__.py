"""The embedded demo: the generator (``build``), its tiny draft's training (``train``), the word-level tokenizer
and the bench prompts in the demo's language (``prompts``). What a complete demo is lives in ``demo_spec``
(stdlib only, asked by the local side)."""
