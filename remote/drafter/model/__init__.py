"""The networks: rotary tables (``rope``), the functional Llama blocks (``layers``), the EAGLE-3 draft forward
with its TTT unroll (``draft``) and a tiny standard Llama for targets (``tinyllama``)."""
