"""Everything that runs ON a host, and the one local runner that sends it there.

Shipped (Python 3.8+, standard library only, never importing vLLM; bundled per run by
:func:`fleet.onhost.client.bundle`, see ``_common.py`` for the bundle and its envelope):

- ``_common.py``   the runtime in front of every script: sys.path without the working
                   directory, find vLLM, its version, the request and the answer envelope
- ``vllm_tree.py`` EAGLE-3 support and the config-time allowlist, judged with ``ast``
- ``facts.py``     ``fleet inspect``'s observations (one round trip)
- ``patch.py``     ``fleet patch``'s fetch / atomic apply / revert
- ``source.py``    ``fleet source``: locate, contain, then ``sed -n`` / ``grep -rn``
- ``vllm_sim*.py`` the rehearsal vLLM of sandbox hosts: a simulated ``vllm serve``
                   installed as ``<env>/bin/vllm`` (:func:`fleet.onhost.client.executable`;
                   no envelope: it talks like the tool it stands in for)

Local only: ``client.py`` (:func:`~fleet.onhost.client.run_onhost`). Nothing outside this
package ships code to a host (``tests/unit/test_onhost_contract.py`` checks every shipped
script: 3.8 syntax, stdlib-only imports, envelope and schema, a decoy ``vllm/`` package in
the working directory ignored, ``~/`` interpreter paths).
"""
