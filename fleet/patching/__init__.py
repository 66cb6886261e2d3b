"""Patch sets as data, a pure edit engine, and a safe remote write with backups.

- :mod:`fleet.patching.manifest` – ``templates/patches/<name>/manifest.yaml`` (pydantic);
- :mod:`fleet.patching.versions` – the PEP 440 subset a manifest's ``versions:`` needs;
- :mod:`fleet.patching.engine` – (texts, patch set, vLLM version) -> new texts or conflicts;
- :mod:`fleet.patching.host_calls` – fetch/write/revert on a host in one round trip each;
- :mod:`fleet.patching.apply` – ``fleet patch`` on one host: fetch, plan (the plans kept
  in a local cache), then write, check or revert.
"""
