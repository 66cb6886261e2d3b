"""Serving: what ``fleet serve`` / ``status`` / ``stop`` need to start and watch ``vllm serve``.

- ``profile``     serve profiles (``playbooks/<name>.yaml``): Jinja2 per host, validated
- ``observed``    the preflight's answer from a host, typed
- ``preflight``   the rules that refuse in seconds what would crash after the load (pure)
- ``supervisor``  which supervisor runs vLLM on a host, and the files it needs (pure)
- ``units``       the launch script, supervisord and systemd files, rendered (pure)
- ``host_calls``  the on-host calls of serve, status and stop
- ``serve``       one host's ``fleet serve``, step by step (preflight, launch, follow,
                  readiness)
- ``multinode``   one model across several hosts (pure): groups, nodes, group preflight
- ``group``       ``fleet serve`` of a group: every node launched, followed and judged
- ``phases``      the load phase tracker: raw log lines (process prefixes, ``\\r``, ANSI)
                  in, phase, weight shards n/N, percent, ETA and phase-change events out
                  (patterns as data per vLLM version family, from vLLM's format strings)
- ``readiness``   readiness through the SSH connection, the acceptance rate
- ``status``      ``fleet status`` and ``fleet stop`` on one host
"""
