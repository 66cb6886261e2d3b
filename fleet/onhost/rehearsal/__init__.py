"""The rehearsal stand-ins that run ON a sandbox host, and only there: the simulated vLLM
(``vllm_sim*.py``: the start-up, the decisions read from the installed source, the faults,
the HTTP API), the source mining it reads vLLM with (``source_mining.py``), the
``nvidia-smi`` stand-in, the multi-node rendezvous. Bundled like every on-host script
(Python 3.8+, standard library only), but never into a production bundle: the bundles
fleet sends to a real host (facts, patch, source, serve) hold no module of this room
(``tests/unit/test_layout.py`` checks it)."""
