"""fleet: inspect, patch, serve and diagnose vLLM on fleets of multi-GPU hosts over SSH.

Layout (a pure core, thin remote effects around it, a thin CLI on top; the rooms and
their rules are in CONTRIBUTING.md, the layers in ``tests/unit/test_layout.py``):

- ``fleet.errors``, ``redact``, ``paths``, ``sizes``, ``safeyaml``
                        error codes, secrets kept out of output, data directories, byte
                        sizes for people, bounded YAML (the low layer everything uses).
- ``fleet.inventory``   Ansible-style YAML inventory, host selection (pure).
- ``fleet.transport``   the only shell quoting, one SSH connection per host per run, the
                        link that reconnects a long operation, the resumable log follow,
                        strict host keys, the bounded fan-out and the per-host outcome.
- ``fleet.onhost``      everything that runs ON a host (Python 3.8+, stdlib only) and its
                        local client; ``onhost/rehearsal/`` runs on sandbox hosts only.
- ``fleet.facts``       pure parsers of the facts script's answer -> ``HostFacts``.
- ``fleet.source``      ``fleet source``: ``sed``/``grep`` over the installed vLLM tree.
- ``fleet.patching``    patch sets as data + templates, the pure edit engine, the write.
- ``fleet.diagnosis``   the rule catalogue, the normaliser and ranking engine (pure), the
                        one Diagnosis factory, and logs filtered on a host (``host_logs``).
- ``fleet.wheels``      wheels fleet needs locally (vLLM, supervisor), cached.
- ``fleet.serving``     ``fleet serve``/``status``/``stop``: profiles, preflight, the
                        supervisor seam, one host's serve and a group's across hosts.
- ``fleet.sandbox``     rehearsal hosts on this machine: real sshd + real vLLM source.
- ``fleet.cli``         thin click layer; rich for people, ``--json`` for programs.
"""

__version__ = "0.1.0"
