"""Serve profiles: rendered per host with Jinja2, validated, secrets by reference."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fleet.errors import UsageError
from fleet.inventory import HostSpec
from fleet.serving.profile import Profile, for_host, read_secrets, render, schema


def host(**vars: object) -> HostSpec:
    return HostSpec(name="h1", address="10.0.0.1", python="/env/bin/python", vars=vars)


def test_one_profile_serves_hosts_that_differ() -> None:
    a = for_host("kimi-eagle3", host(models_dir="/data/a", vllm_port=8001))
    b = for_host("kimi-eagle3", host(models_dir="/nvme/b"))
    assert a.model == "/data/a/Kimi-K2.5" and a.port == 8001
    assert b.speculative.model == "/nvme/b/Kimi-K25-eagle3" and b.port == 8000
    assert a.vllm_executable("/env/bin/python") == "/env/bin/vllm"
    args = a.vllm_args()
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec == {
        "method": "eagle3",
        "model": "/data/a/Kimi-K25-eagle3",
        "num_speculative_tokens": 3,
    }


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"speculative": {"model": "d", "num_speculative_tokens": 3, "typo_key": 1}}, "typo_key"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"port": 70000}, "port"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"extra_args": ["--api-key", "x"]}, "secrets env file"),
        ({"env": {"BAD-NAME": "x"}}, "environment variable"),
        ({"model": "{{ undefined_var }}/x"}, "undefined_var"),
        ({"unknown": 1}, "unknown"),
    ],
)
def test_bad_profiles_are_one_line_usage_errors(change: dict[str, object], problem: str) -> None:
    raw = {
        "name": "p", "model": "/m", "served_model_name": "m", "tensor_parallel_size": 8,
        "speculative": {"model": "/d", "num_speculative_tokens": 3},
    }  # fmt: skip
    raw.update(change)
    with pytest.raises(UsageError, match=problem) as info:
        render(raw, {"host": "h1"})
    assert "\n" not in str(info.value) and info.value.code == "profile-invalid"


@pytest.mark.parametrize(
    "name",
    ["kimi-eagle3", "a", "v0.18_pp2", "x" * 64, "Kimi", "x" * 65, ".hidden", "..", "-p", "a/b",
     "p\n", "", "p q"],
)  # fmt: skip
def test_fleet_serve_fleet_logs_and_the_host_accept_the_same_profile_names(name: str) -> None:
    """One name check (fleet.onhost.layout): what ``fleet serve`` refuses, ``fleet logs
    PROFILE`` refuses too, and the host's run directory is the log's directory."""
    from fleet.diagnosis.host_logs import profile_log_path
    from fleet.onhost import layout

    raw = {
        "name": name, "model": "/m", "served_model_name": "m", "tensor_parallel_size": 1,
        "speculative": {"model": "/d", "num_speculative_tokens": 3},
    }  # fmt: skip
    try:
        render(raw, {"host": "h1"})
        serve_ok = True
    except UsageError:
        serve_ok = False
    try:
        log = profile_log_path(name)
    except UsageError as exc:
        assert exc.code == "bad-input"
        log = None
    assert serve_ok == (log is not None) == layout.profile_name_ok(name)
    if log is not None:
        assert log == f"~/.fleet/run/{name}/vllm.log"
        assert layout.run_dir(name) == os.path.join(layout.home(), ".fleet", "run", name)
    else:
        with pytest.raises(layout.Refused):
            layout.run_dir(name)


def test_templates_cannot_reach_python_internals() -> None:
    raw = {
        "name": "p",
        "model": "{{ ''.__class__.__mro__ }}",
        "served_model_name": "m",
        "tensor_parallel_size": 1,
        "speculative": {"model": "d", "num_speculative_tokens": 1},
    }
    with pytest.raises(UsageError):
        render(raw, {})


def test_schema_is_the_models_json_schema() -> None:
    doc = schema()
    assert doc["title"] == "fleet serve profile"
    assert {"model", "tensor_parallel_size"} <= set(doc["required"])
    assert "speculative" not in doc["required"]  # a profile without a drafter is a plain server
    assert doc["properties"]["supervisor"]["enum"] == ["auto", "supervisord", "systemd"]


def test_secrets_env_file(tmp_path: Path) -> None:
    env = tmp_path / "k.env"
    env.write_text("# comment\nexport VLLM_API_KEY='sk-abc'\nHF_TOKEN=hf_x\n\n")
    profile = for_host("kimi-eagle3", host(secrets_env=str(env)))
    assert read_secrets(profile) == {"VLLM_API_KEY": "sk-abc", "HF_TOKEN": "hf_x"}
    env.write_text("not a line\n")
    with pytest.raises(UsageError, match=r"k.env:1: not a KEY=value line"):
        read_secrets(profile)
    import os

    fifo = tmp_path / "fifo.env"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="not a regular file"):
        read_secrets(for_host("kimi-eagle3", host(secrets_env=str(fifo))))


def test_profile_model_round_trips() -> None:
    p = for_host("kimi-eagle3", host())
    assert Profile.model_validate(p.model_dump()) == p
