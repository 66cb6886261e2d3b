"""fleet: inspect, patch, serve and diagnose vLLM on fleets of multi-GPU hosts over SSH.

Layout (pure core first, remote effects around it, CLI on top):

- ``fleet.inventory``   Ansible-style YAML inventory, host selection (pure).
- ``fleet.transport``   one SSH connection per host per run, strict host keys, retries,
                        a bounded parallel map over hosts.
- ``fleet.facts``       each fact = remote script + pure parser; one round trip per host.
- ``fleet.source``      remote ``sed``/``grep`` over the installed vLLM tree.
- ``fleet.patching``    patch sets as data + templates, pure edit engine, safe remote write.
- ``fleet.diagnosis``   crash-log rule catalogue and ranking engine (pure).
- ``fleet.sandbox``     rehearsal hosts on this machine: real sshd + real vLLM source.
- ``fleet.cli``         thin click layer; rich for people, ``--json`` for programs.
"""

__version__ = "0.1.0"
