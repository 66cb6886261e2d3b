"""The docker-sshd variant's build context (no engine needed to check it is complete)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from fleet.errors import UsageError
from fleet.sandbox import docker
from fleet.sandbox.core import BACKEND_ENV, default_backend
from fleet.sandbox.vllm_source import vllm_tree


def _copy_sources(dockerfile: str) -> list[str]:
    sources = []
    for line in dockerfile.splitlines():
        if line.startswith("COPY "):
            parts = shlex.split(line)[1:]
            sources.extend(p for p in parts[:-1] if not p.startswith("--"))
    return sources


def test_staged_context_holds_everything_the_dockerfile_copies(tmp_path: Path) -> None:
    context = docker.stage_context(tmp_path / "ctx", vllm_tree("0.17.0"))
    dockerfile = (context / "Dockerfile").read_text()
    sources = _copy_sources(dockerfile)
    assert sources, "the Dockerfile copies nothing?"
    for source in sources:
        assert (context / source).exists(), source
    # the real vLLM files and metadata, and nothing compiled
    tree = context / "vllm-tree"
    assert (tree / "vllm" / "model_executor" / "models" / "deepseek_v2.py").is_file()
    assert (tree / "vllm-0.17.0.dist-info" / "METADATA").is_file()
    assert not list(tree.rglob("*.so"))
    # the stand-in is this repository's, byte for byte
    from fleet.onhost import nvidia_smi

    assert (context / "nvidia_smi.py").read_bytes() == Path(nvidia_smi.__file__).read_bytes()


def test_dockerfile_builds_the_same_host_as_the_local_backend() -> None:
    text = (docker.docker_dir() / "Dockerfile").read_text()
    assert re.search(r"^FROM debian:", text, re.M)
    assert "openssh-server" in text
    assert f"python3 -m venv --without-pip {docker.HOME}/ml-env" in text
    assert "/usr/local/bin/nvidia-smi" in text
    assert 'CMD ["/usr/sbin/sshd", "-D", "-e"]' in text
    snippet = (docker.docker_dir() / "sshd_config").read_text().splitlines()
    assert "PasswordAuthentication no" in snippet
    assert "LogLevel VERBOSE" in snippet  # connections are counted from the container log
    assert docker.PYTHON == "/root/ml-env/bin/python"


def test_backend_selected_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    assert default_backend() == "local"
    monkeypatch.setenv(BACKEND_ENV, "docker")
    assert default_backend() == "docker"
    monkeypatch.setenv(BACKEND_ENV, "podman")
    with pytest.raises(UsageError, match="expected 'local' or 'docker'"):
        default_backend()


def test_image_tag_per_version() -> None:
    assert docker.image_tag("0.18.0") == "fleet-sandbox-host:vllm-0.18.0"
