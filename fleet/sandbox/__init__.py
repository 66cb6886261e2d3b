"""Rehearsal hosts on this machine: real OpenSSH sshd processes and the real vLLM source.

``fleet sandbox up`` and the pytest fixtures (``tests/conftest.py``) both use
:class:`fleet.sandbox.core.Sandbox`. Each host is an sshd started as the current user on
127.0.0.1 with its own port, host key (pinned in ``DIR/known_hosts``) and home:

    <home>/ml-env/bin/python            the host's ``python`` (a venv)
    <home>/ml-env/lib/pythonX.Y/site-packages/vllm, vllm-<v>.dist-info
                                        the real wheel's Python files and metadata
    <home>/ml-env/bin/vllm              the rehearsal vLLM (``fleet/onhost/rehearsal/vllm_sim.py``)
    <home>/models/                      checkpoints (``fleet.sandbox.checkpoints``)
    <home>/bin/nvidia-smi               stand-in: 8 x B200 (``fleet.onhost.rehearsal.nvidia_smi``)
    <home>/.fleet-sandbox/host.json     {"host", "vllm", "load_seconds", "gpu_name", ...}
    <home>/.fleet-sandbox/gpu-state.json  optional: memory/processes nvidia-smi reports
    <home>/.fleet-sandbox/sim.json      optional: the rehearsal vLLM's knobs (``set_sim``)
    <home>/.fleet-sandbox/run/*.pid     processes a host starts for itself (e.g. a simulated
                                        vLLM server) register here; ``down`` stops them

Every session starts in ``<home>`` with ``HOME=<home>`` (so ``~`` is the host's own), and
``PATH`` begins with ``<home>/bin``. Modules:

- ``model``       pure: state file, sshd_config, inventory, known_hosts, sshd log reading
- ``procs``       processes identified by pid + start time (never by name)
- ``local``       the local sshd backend (default)
- ``docker``      the docker-sshd backend (``FLEET_SANDBOX_BACKEND=docker``, tests/docker)
- ``core``        ``Sandbox``: up / down / status and the knobs tests turn
- ``models``      the model and drafter directories of a host
- ``vllm_source`` the vLLM wheel cache
"""
