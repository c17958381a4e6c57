"""The EAGLE-3 draft config rules, once, for every tool (stdlib only, so the local side imports it too).

* ``formats``: flat vs speculators, how to tell them apart, where each keeps its ids and decoder fields;
* ``convention``: which field each engine reads, what it captures (boundaries), the default ids, the
  id arithmetic between the SGLang and vLLM conventions, and the usable id range;
* ``weights``: safetensors headers read with json + struct, and the fc layer's aux slot count.

Users: the evaluator (``remote/drafter``), ``draft-config``, ``serve inspect``, the SGLang patch's
template and the local report/serve checks.
"""
