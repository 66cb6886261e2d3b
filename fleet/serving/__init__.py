"""Serving: what ``fleet serve`` / ``fleet status`` need to start and watch ``vllm serve``.

- ``phases``  the load phase tracker: raw log lines (process prefixes, ``\\r``, ANSI) in,
              phase, weight shards n/N, percent, ETA and phase-change events out
              (patterns as data per vLLM version family, from vLLM's format strings)
"""
