"""Patch sets as data, a pure edit engine, and a safe remote write with backups.

- :mod:`fleet.patching.manifest` – ``templates/patches/<name>/manifest.yaml`` (pydantic);
- :mod:`fleet.patching.engine` – (texts, patch set, vLLM version) -> new texts or conflicts;
- :mod:`fleet.patching.host_calls` – fetch/write/revert on a host in one round trip each.
"""
