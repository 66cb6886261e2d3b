"""Secrets never reach fleet's output (pure)."""

from __future__ import annotations

import pytest

from fleet.redact import MASK, is_secret_name, redact_argv, redact_text


def test_argv_option_values_are_hidden() -> None:
    argv = [
        "vllm",
        "serve",
        "/models/k2",
        "--api-key",
        "sk-abcdefghijklmnopqrst",
        "--hf-token=hf_abcdefghijklmnopqrstuvwx",
        "--port",
        "8000",
        "--tensor-parallel-size",
        "8",
    ]
    out = redact_argv(argv)
    assert out == [
        "vllm",
        "serve",
        "/models/k2",
        "--api-key",
        MASK,
        f"--hf-token={MASK}",
        "--port",
        "8000",
        "--tensor-parallel-size",
        "8",
    ]
    assert argv[4].startswith("sk-")  # the input is not modified


@pytest.mark.parametrize(
    ("line", "secret"),
    [
        (
            "non-default args: {'model': 'x', 'api_key': ['sk-live-1234567890abcdef'], "
            "'port': 8001}",
            "sk-live-1234567890abcdef",
        ),
        ("HF_TOKEN=hf_ABCDEFGHIJKLMNOPQRSTUVWXYZ vllm serve x", "hf_ABCDEFGHIJKLMNOPQRSTUVWXYZ"),
        ("args: --api-key topsecretvalue --port 8000", "topsecretvalue"),
        ('{"hf_token": "abcdefgh12345678"}', "abcdefgh12345678"),
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.abc", "eyJhbGciOiJIUzI1NiJ9.abc"),
        ("using token hf_abcdefghijklmnopqrstuvwx for download", "hf_abcdefghijklmnopqrstuvwx"),
        ("VLLM_API_KEY: plainvalue", "plainvalue"),
        ("Args: --api-key=mysecretvalue", "mysecretvalue"),
        ("env: HF_TOKEN=abcd1234", "abcd1234"),
        ("INFO: VLLM_API_KEY=abc123", "abc123"),
        ("x=HF_TOKEN=abc123", "abc123"),
        ('serve --api-key "my secret words" --port 1', "secret words"),
        ("Authorization: Basic dXNlcjpwYXNz", "dXNlcjpwYXNz"),
        ("pulling https://alice:s3cr3tpw@registry.example/model", "s3cr3tpw"),
    ],
)
def test_text_secrets_are_hidden(line: str, secret: str) -> None:
    out = redact_text(line)
    assert secret not in out
    assert MASK in out


@pytest.mark.parametrize(
    "line",
    [
        "RuntimeError: Model does not support EAGLE3 interface but aux_hidden_state_outputs "
        "was requested",
        "max_num_batched_tokens=8192, max_seq_len=262144, tensor_parallel_size=8",
        "Loading safetensors checkpoint shards: 45% Completed | 29/64 [01:02<01:15]",
        "tokenizer='/models/Kimi-K2.5', skip_tokenizer_init=False",
        "bos_token_id=1, eos_token_id=2, pad_token_id=None, image_token_ids: [5, 6]",
    ],
)
def test_ordinary_lines_are_untouched(line: str) -> None:
    assert redact_text(line) == line


def test_secret_names() -> None:
    assert is_secret_name("--api-key") and is_secret_name("HF_TOKEN") and is_secret_name("api_key")
    assert not is_secret_name("--port") and not is_secret_name("--tokenizer")


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "line",
    ["token_" * 30000 + "x", "--api-key " * 30000, "'api_key':" * 30000, "a=b " * 50000],
)
def test_adversarial_lines_stay_linear(line: str) -> None:
    # a backtracking pattern would take minutes here; the timeout bounds the test
    out = redact_text(line)
    assert len(out) <= len(line) + 10


S1, S2 = "token-abc123", "token-def456"


@pytest.mark.parametrize(
    "line",
    [
        f"--api-key {S1} {S2}",  # vLLM's --api-key takes several keys
        f"vllm serve /m --api-key {S1} {S2} --port 8000",
        f"--api-key '{S1}' \"{S2}\"",
        f"['vllm', 'serve', '/m', '--api-key', '{S1}', '{S2}', '--port', '1']",
        f'["--api-key", "{S1}", "{S2}"]',
        f"('--api-key', '{S1}')",
        f"{{'api_key': ('{S1}', '{S2}')}}",
        f"{{'api_key': {{'{S1}'}}}}",
        f"VLLM_API_KEY={S1},{S2}",
        f"HF_TOKEN={S1} OPENAI_API_KEY={S2}",
        f"cmd: vllm serve m --api-key {S1} {S2}; echo done",
        f"GET /v1/models?api_key={S1}&x=1",
        f"AWS_SECRET_ACCESS_KEY={S1} aws_access_key={S2}",
    ],
)
def test_every_value_of_a_secret_option_is_hidden(line: str) -> None:
    out = redact_text(line)
    assert S1 not in out and S2 not in out, out
    assert MASK in out


def test_argv_hides_every_value_up_to_the_next_option() -> None:
    argv = ["vllm", "serve", "/m", "--api-key", S1, S2, "--port", "8000"]
    assert redact_argv(argv) == ["vllm", "serve", "/m", "--api-key", MASK, MASK, "--port", "8000"]
    # --api-key=K takes one value: the next word is a positional again
    assert redact_argv(["--api-key=" + S1, "/m"]) == [f"--api-key={MASK}", "/m"]


@pytest.mark.parametrize(
    "token",
    [
        "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
        "glpat-abcdefghij0123456789",
        "xoxb-1234567890-abcdefghij",
        "AKIAIOSFODNN7EXAMPLE",
        "AIzaSyA-abcdefghijklmnopqrstuvwxyz01234",
        "npm_abcdefghijklmnopqrstuvwxyz0123456789",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJl",
        "sk-ant-api03-abcdefghijklmnopqrstuvwxyz",
    ],
)
def test_bare_well_known_tokens(token: str) -> None:
    assert token not in redact_text(f"downloading with {token} now")


def test_private_key_blocks() -> None:
    text = "-----BEGIN OPENSSH PRIVATE KEY-----b3BlbnNzaC1rZXk-----END OPENSSH PRIVATE KEY-----"
    assert "b3BlbnNzaC1rZXk" not in redact_text(f"key: {text}")


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "line",
    ["api_key: [" * 30000, "'--api-key', " * 30000, "--api-key a " * 30000, "api_key=a," * 30000],
)
def test_multi_value_forms_stay_linear(line: str) -> None:
    out = redact_text(line)  # a quadratic scan would take minutes: the timeout bounds it
    assert MASK in out and len(out) <= 2 * len(line)
