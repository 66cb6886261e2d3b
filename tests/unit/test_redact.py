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
