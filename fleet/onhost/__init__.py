"""Everything that runs ON a host, and the one local client that sends it there.

Shipped (Python 3.8+, standard library only, never importing vLLM; bundled per run by
:func:`fleet.onhost.client.bundle` with only the modules a script imports, see
``_common.py`` for the bundle and its envelope):

- ``_common.py``     the runtime in front of every script: sys.path without the working
                     directory, find vLLM, its version, the request and answer envelope,
                     ``converse`` (several requests to one process)
- ``facts.py``       ``fleet inspect``'s observations (one round trip)
- ``patch.py``       ``fleet patch``'s fetch / atomic apply / revert
- ``source.py``      ``fleet source``: locate, contain, then ``sed -n`` / ``grep -rn``
- ``serve.py``       ``fleet serve``/``status``/``stop``: preflight, launch, state, stop
- ``supervisors.py`` the supervisors serve runs vLLM under (supervisord, systemd)
- ``files.py``       the one atomic writer and the one lock on a host
- ``layout.py``      where serve keeps a host's files, and the profile name check
- ``families.py``    the vLLM version families (start-up lines, patch-set ranges)
- ``probes.py``      observations shared by facts and serve (GPUs, disks, supervisors)
- ``vllm_tree.py``   EAGLE-3 support and the config-time allowlist, judged with ``ast``
- ``rehearsal/``     sandbox hosts only, never in a production bundle: the simulated
                     ``vllm serve`` (``vllm_sim*.py``, installed as ``<env>/bin/vllm`` by
                     :func:`fleet.onhost.client.executable`; no envelope: it talks like
                     the tool it stands in for), its source mining, ``nvidia-smi``

Local only: ``client.py`` (:func:`~fleet.onhost.client.run_onhost`, ``Conversation``).
Nothing outside this package ships code to a host (``tests/unit/test_onhost_contract.py``
checks every shipped script: 3.8 syntax, stdlib-only imports, envelope and schema, a decoy
``vllm/`` package in the working directory ignored, ``~/`` interpreter paths).
"""
