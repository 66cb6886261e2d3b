"""A ``vllm/`` package in the login directory is not the installed vLLM, for any command.

The bug (fixed by the one on-host runtime): ``fleet patch`` found vLLM with the working
directory first on ``sys.path``, so with a regular package ``~/vllm/`` (a user's checkout)
it planned and wrote against that tree while ``inspect`` and ``source`` reported the
installed one. Now every command names the same package directory, and the decoy is left
alone.
"""

from __future__ import annotations

import json

import pytest

from fleet.sandbox.core import Sandbox

pytestmark = pytest.mark.integration

DS = "model_executor/models/deepseek_v2.py"
KIMI = "model_executor/models/kimi_k25.py"
SPEC = "config/speculative.py"


@pytest.mark.sandbox(hosts=1, vllm=("0.17.0",))
def test_inspect_source_and_patch_name_the_installed_vllm(sandbox: Sandbox) -> None:
    (host,) = (h.name for h in sandbox.hosts)
    installed = json.loads(sandbox.run_fleet("--json", "inspect", "--host", host).stdout)["hosts"][
        host
    ]["vllm"]["path"]
    # a copy of the installed files as a regular package in the login directory
    copy = (
        "mkdir -p ~/vllm/model_executor/models ~/vllm/config && : > ~/vllm/__init__.py && "
        f'for f in {DS} {KIMI} {SPEC}; do cp "$1/$f" ~/vllm/$f; done'
    )
    sandbox.on_host(host, ["sh", "-c", copy, "sh", installed])
    before = sandbox.on_host(host, "cd ~/vllm && sha256sum " + " ".join((DS, KIMI, SPEC))).stdout

    inspected = json.loads(sandbox.run_fleet("--json", "inspect", "--host", host).stdout)
    shown = json.loads(
        sandbox.run_fleet("--json", "source", "show", "--host", host, f"{DS}:1").stdout
    )
    patched = sandbox.run_fleet("--json", "patch", "--host", host)
    assert patched.returncode == 0, patched.stdout + patched.stderr
    report = json.loads(patched.stdout)["hosts"][host]

    assert inspected["hosts"][host]["vllm"]["path"] == installed
    assert shown["hosts"][host]["vllm_path"] == installed
    assert report["package_dir"] == installed
    assert {f["status"] for f in report["files"]} >= {"applied"}
    # the installed tree got the patch, the decoy did not
    after = json.loads(sandbox.run_fleet("--json", "inspect", "--host", host).stdout)
    assert all(after["hosts"][host]["vllm"]["eagle3"].values())
    assert (
        sandbox.on_host(host, "cd ~/vllm && sha256sum " + " ".join((DS, KIMI, SPEC))).stdout
        == before
    )
