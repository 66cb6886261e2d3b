"""The docker-sshd variant's build context and image cache key (no engine needed)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from fleet.errors import UsageError
from fleet.sandbox import docker
from fleet.sandbox.core import BACKEND_ENV, Sandbox, default_backend
from fleet.sandbox.vllm_source import vllm_tree

ROOT = Path(__file__).resolve().parents[2]


def _copy_sources(dockerfile: str) -> list[str]:
    sources = []
    for line in dockerfile.splitlines():
        if line.startswith("COPY "):
            parts = shlex.split(line)[1:]
            sources.extend(p for p in parts[:-1] if not p.startswith("--"))
    return sources


def _stages(dockerfile: str) -> list[tuple[str, str]]:
    """(image, stage name) of every FROM line."""
    found = []
    for line in dockerfile.splitlines():
        m = re.match(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?\s*$", line, re.I)
        if m:
            found.append((m.group(1), m.group(2) or ""))
    return found


def test_staged_context_holds_everything_the_dockerfile_copies(tmp_path: Path) -> None:
    context = docker.stage_context(tmp_path / "ctx", vllm_tree("0.17.0"), "0.17.0")
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
    from fleet.onhost.rehearsal import nvidia_smi

    assert (context / "nvidia_smi.py").read_bytes() == Path(nvidia_smi.__file__).read_bytes()
    # the rehearsal vLLM run by the image's env python, and the checkpoints it serves
    vllm = context / "overlay" / "root" / "ml-env" / "bin" / "vllm"
    assert vllm.read_text().startswith(f"#!{docker.PYTHON}\n") and vllm.stat().st_mode & 0o111
    models = context / "overlay" / "root" / "models"
    assert sorted(p.name for p in models.iterdir()) == [
        "DeepSeek-V3",
        "DeepSeek-V3-eagle3",
        "Kimi-K2-Instruct",
        "Kimi-K2.5",
        "Kimi-K25-eagle3",
        "mismatched-eagle3",
    ]


def test_nothing_is_pulled_every_from_is_the_local_base_or_a_stage() -> None:
    text = (docker.docker_dir() / "Dockerfile").read_text()
    stages = _stages(text)
    assert stages[0][0] == docker.BASE_IMAGE
    names = {name for _, name in stages if name}
    for image, _name in stages[1:]:
        assert image in names, f"FROM {image}: neither the base image nor an earlier stage"
    assert {
        docker.TARGET_WITH_SUPERVISOR, docker.TARGET_WITHOUT_SUPERVISOR, docker.TARGET_SYSTEMD
    } <= names  # fmt: skip
    # stages build in order up to --target: the host with supervisord needs no other
    order = [name for _, name in stages]
    assert order.index(docker.TARGET_WITH_SUPERVISOR) < order.index(
        docker.TARGET_WITHOUT_SUPERVISOR
    )
    # no package manager reaches out during the build (the base image has the packages)
    assert "apt-get install" not in text and "pip install" not in text
    # and the engine script builds that very image with debootstrap
    script = (ROOT / docker.ENGINE_SCRIPT).read_text()
    assert "BASE_IMAGE=fleet-sandbox-base:$SUITE" in script and "SUITE=bookworm" in script
    assert "debootstrap --variant=" in script and "docker import" in script
    for package in ("openssh-server", "python3-venv", "supervisor", "systemd-sysv"):
        assert package in script


def test_dockerfile_builds_a_host_like_a_real_gpu_host() -> None:
    text = (docker.docker_dir() / "Dockerfile").read_text()
    assert f"python3 -m venv --without-pip {docker.HOME}/ml-env" in text
    assert "/usr/local/bin/nvidia-smi" in text
    assert 'CMD ["/usr/local/sbin/fleet-sandbox-init"]' in text
    assert "dpkg --purge supervisor" in text  # the variant without supervisord
    init = (docker.docker_dir() / "init.sh").read_text().splitlines()
    assert init[-1] == "exec /usr/sbin/sshd -D -e"  # sshd's log is the container's output
    assert any("supervisord -c /etc/supervisor/supervisord.conf" in line for line in init)
    snippet = (docker.docker_dir() / "sshd_config").read_text().splitlines()
    assert "PasswordAuthentication no" in snippet
    assert "PermitRootLogin prohibit-password" in snippet
    assert "LogLevel VERBOSE" in snippet  # connections are counted from the container log
    assert docker.PYTHON == "/root/ml-env/bin/python"


def test_image_key_changes_with_every_input(tmp_path: Path) -> None:
    tree = vllm_tree("0.17.0")
    context = docker.stage_context(tmp_path / "ctx", tree, "0.17.0")
    base = docker.context_digest(context, "version=0.17.0", "target=host", "base=sha256:aa")
    again = docker.stage_context(tmp_path / "ctx2", tree, "0.17.0")
    assert docker.context_digest(again, "version=0.17.0", "target=host", "base=sha256:aa") == base
    # another version, target or base image
    assert docker.context_digest(context, "version=0.18.0", "target=host", "base=sha256:aa") != base
    assert (
        docker.context_digest(
            context, "version=0.17.0", "target=host-without-supervisor", "base=sha256:aa"
        )
        != base
    )
    assert docker.context_digest(context, "version=0.17.0", "target=host", "base=sha256:bb") != base
    # one byte of the Dockerfile, of a vLLM file, a file's mode, a new overlay file
    changes = [
        lambda c: (c / "Dockerfile").write_text((c / "Dockerfile").read_text() + "\n"),
        lambda c: (c / "vllm-tree" / "vllm" / "__init__.py").write_text("# edited\n"),
        lambda c: (c / "init.sh").chmod(0o700),
        lambda c: (c / "overlay" / "etc").mkdir(),
        lambda c: (c / "overlay" / "root" / "models" / "Kimi-K2.5" / "config.json").write_text(
            "{}"
        ),
    ]
    for n, change in enumerate(changes):
        ctx = docker.stage_context(tmp_path / f"c{n}", tree, "0.17.0")
        change(ctx)
        assert (
            docker.context_digest(ctx, "version=0.17.0", "target=host", "base=sha256:aa") != base
        ), n


def test_backend_selected_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    assert default_backend() == "local"
    monkeypatch.setenv(BACKEND_ENV, "docker")
    assert default_backend() == "docker"
    monkeypatch.setenv(BACKEND_ENV, "podman")
    with pytest.raises(UsageError, match="expected 'local' or 'docker'"):
        default_backend()


def test_image_tag_per_version_and_variant() -> None:
    assert docker.image_tag("0.18.0") == "fleet-sandbox-host:vllm-0.18.0"
    assert (
        docker.image_tag("0.18.0", supervisor=False)
        == "fleet-sandbox-host:vllm-0.18.0-nosupervisor"
    )


def test_no_supervisor_names_must_be_hosts(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such host"):
        Sandbox.up(tmp_path / "box", hosts=2, no_supervisor=["sandbox-09"])
    assert not (tmp_path / "box" / "sandbox.json").exists()


def test_home_files_stay_inside_the_home(tmp_path: Path) -> None:
    backend = docker.DockerBackend(tmp_path, "root")
    assert backend._home_path(".fleet-sandbox/sim.json") == "/root/.fleet-sandbox/sim.json"
    for bad in ("/etc/passwd", "../etc/passwd", ".fleet-sandbox/../../x", "a//b", ""):
        with pytest.raises(UsageError, match="not a path inside the host's home"):
            backend._home_path(bad)
