"""Secrets corpus: no token in any output form fleet prints.

Secrets (generated and well-known shapes) are written in every form a command line, a
setting or a header takes in vLLM's and fleet's output, and sent down every path that
prints them:

- ``redact_argv`` / ``redact_text`` themselves;
- ``fleet inspect --json``'s server entries (``parse_servers`` over /proc command lines);
- ``fleet logs --file LOG`` and ``--json`` (log lines shown);
- ``fleet logs --file LOG --diagnose`` and ``--json`` (evidence and context of diagnoses).

A secret found in any output counts as a leak.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import pytest
from hostile_support import SCALE, Tally, run_fleet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.facts.parsers import parse_servers
from fleet.redact import redact_argv, redact_text

CATEGORY = "secrets corpus"
CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "logs"
KV_LOG = CORPUS / "kv-cache-too-small--kv-v1--v1.log"

WELL_KNOWN = [
    "hf_" + "Ab1" * 12,
    "sk-proj-" + "Xy9_" * 10,
    "sk-ant-api03-" + "Q" * 40,
    "ghp_" + "z" * 36,
    "github_pat_11" + "A" * 40,
    "glpat-" + "k" * 20,
    "xoxb-1234567890-abcdefghij",
    "AKIA" + "Q" * 16,
    "AIza" + "B" * 35,
    "npm_" + "n" * 36,
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.sig-nature_x",
]
ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._~+/=-"


def _secret() -> st.SearchStrategy[str]:
    # A distinctive prefix keeps a secret from also being an ordinary word of the form.
    return st.text(ALPHABET, min_size=8, max_size=40).map(lambda s: "Zq7" + s)


Form = Callable[[str, str], str]


def _url(secret: str) -> str:
    """A secret as a URL's userinfo holds it (percent-encoded, as a client writes it)."""
    return quote(secret, safe="-._~")


def written(secret: str) -> list[str]:
    """Every spelling of ``secret`` that must not appear (raw and percent-encoded)."""
    return list(dict.fromkeys([secret, _url(secret)]))


# How a command line or a setting holding a secret is printed (s1, s2: two secrets).
TEXT_FORMS: dict[str, Form] = {
    "option space": lambda a, b: f"vllm serve /m --api-key {a} --port 8000",
    "option two values": lambda a, b: f"vllm serve /m --api-key {a} {b} --port 8000",
    "option two values at end": lambda a, b: f"vllm serve /m --api-key {a} {b}",
    "option equals": lambda a, b: f"vllm serve /m --api-key={a}",
    "option quoted": lambda a, b: f"vllm serve /m --api-key '{a}' \"{b}\"",
    "argv python list": lambda a, b: str(["vllm", "serve", "/m", "--api-key", a, b, "--port", "1"]),
    "argv python tuple": lambda a, b: str(("--api-key", a)),
    "argv json list": lambda a, b: json.dumps(["vllm", "serve", "--api-key", a, b]),
    "shell quoted": lambda a, b: shlex.join(["vllm", "serve", "/m", "--api-key", a, b]),
    "bash -c": lambda a, b: "bash -c " + shlex.quote(f"exec vllm serve /m --api-key {a} {b}"),
    "non-default args": lambda a, b: (
        f"non-default args: {{'model': '/m', 'api_key': ['{a}', '{b}'], 'port': 8001}}"
    ),
    "namespace": lambda a, b: f"Namespace(model='/m', api_key=['{a}', '{b}'], port=8001)",
    "namespace str": lambda a, b: f"Namespace(api_key='{a}', hf_token='{b}')",
    "dict repr tuple": lambda a, b: f"{{'api_key': ('{a}', '{b}')}}",
    "json object": lambda a, b: json.dumps({"api_key": [a, b], "hf_token": a}),
    "json compact": lambda a, b: json.dumps({"api_key": a}, separators=(",", ":")),
    "env": lambda a, b: f"HF_TOKEN={a} VLLM_API_KEY={b} vllm serve /m",
    "env export quoted": lambda a, b: f"export HF_TOKEN='{a}'; export OPENAI_API_KEY=\"{b}\"",
    "env comma list": lambda a, b: f"VLLM_API_KEY={a},{b}",
    "yaml-ish": lambda a, b: f"api_key: {a}",
    "bearer": lambda a, b: f"Authorization: Bearer {a}",
    "x-api-key header": lambda a, b: f"X-Api-Key: {a}",
    "url credentials": lambda a, b: f"https://user:{_url(a)}@registry.example/v2/",
    "query string": lambda a, b: f"GET /v1/models?api_key={a}&token={b} HTTP/1.1",
    "log line": lambda a, b: (
        f"(APIServer pid=1) INFO 11-02 10:14:01 [utils.py:1] args: --api-key {a} {b} --port 1"
    ),
}


class Leaks:
    def __init__(self, tally: Tally) -> None:
        self.tally = tally

    def check(self, where: str, output: str, secrets: list[str]) -> None:
        self.tally.attempt(CATEGORY)
        leaked = [s for s in secrets if s in output]
        if leaked:
            self.tally.bad(CATEGORY, "leaks", f"{where}: {output[:200]!r}")
        assert not leaked, (where, output)


@pytest.fixture
def leaks(tally: Tally) -> Leaks:
    return Leaks(tally)


SECRETS = settings(
    max_examples=60 * SCALE,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_every_text_form_is_redacted(leaks: Leaks) -> None:
    @SECRETS
    @given(_secret(), _secret())
    def one(a: str, b: str) -> None:
        for name, form in TEXT_FORMS.items():
            leaks.check(name, redact_text(form(a, b)), [*written(a), *written(b)])

    one()
    for token in WELL_KNOWN:
        for name, form in TEXT_FORMS.items():
            leaks.check(f"{name} (well-known)", redact_text(form(token, token)), [token])
        leaks.check("bare token", redact_text(f"using {token} for downloads"), [token])
        leaks.check("bare token in quotes", redact_text(f"token '{token}' ok"), [token])


def test_argv_and_inspect_json(leaks: Leaks) -> None:
    @SECRETS
    @given(_secret(), _secret())
    def one(a: str, b: str) -> None:
        argvs = [
            ["/env/bin/python", "/env/bin/vllm", "serve", "/m", "--api-key", a, b, "--port", "1"],
            ["vllm", "serve", "/m", f"--api-key={a}", "--hf-token", b],
            ["python", "-m", "vllm.entrypoints.openai.api_server", "--api-key", a, b],
            ["vllm", "serve", "/m", "--api-key", a, b],
        ]
        for argv in argvs:
            leaks.check("redact_argv", " ".join(redact_argv(argv)), [a, b])
            procs = [
                {"pid": 10, "ppid": 1, "uid": 0, "argv": argv},
                {"pid": 11, "ppid": 10, "uid": 0, "argv": [f"VLLM::EngineCore --api-key {a} {b}"]},
            ]
            doc = json.dumps([s.model_dump(mode="json") for s in parse_servers(procs)])
            leaks.check("inspect --json servers", doc, [a, b])

    one()


def _evidence_lines(log: Path) -> list[int]:
    run = run_fleet(["--json", "logs", "--file", str(log), "--diagnose"])
    doc = json.loads(run.stdout)
    return sorted({e["line"] for d in doc["diagnoses"] for e in d["evidence"]})


def test_fleet_logs_output_paths(tmp_path: Path, leaks: Leaks) -> None:
    lines = KV_LOG.read_text().splitlines()
    evidence = _evidence_lines(KV_LOG)
    assert evidence, "the corpus log must produce evidence lines"
    a, b = "Zq7logsecretAAAA1111", "Zq7logsecretBBBB2222"
    forms = list(TEXT_FORMS.values())
    for i, n in enumerate(evidence):
        lines[n - 1] = f"{lines[n - 1]} {forms[i % len(forms)](a, b)}"
    # and every form on lines of their own, next to the evidence (diagnosis context)
    extra = [form(a, b) for form in forms]
    at = evidence[0]
    lines[at:at] = extra
    log = tmp_path / "vllm.log"
    log.write_text("\n".join(lines) + "\n")
    for args in (
        ["logs", "--file", str(log), "--tail", str(len(lines))],
        ["--json", "logs", "--file", str(log), "--tail", str(len(lines))],
        ["logs", "--file", str(log), "--diagnose"],
        ["--json", "logs", "--file", str(log), "--diagnose"],
    ):
        run = run_fleet(args, env={"COLUMNS": "400"})
        assert run.code in (0, 1), (args, run.stderr)
        leaks.check(" ".join(args[:4]), run.stdout + run.stderr, [a, b])
    shown = run_fleet(["--json", "logs", "--file", str(log), "--tail", str(len(lines))])
    texts = [entry["text"] for entry in json.loads(shown.stdout)["lines"]]
    assert sum("***" in t for t in texts) >= len(extra)  # redacted, not dropped
