"""Keep secrets out of fleet's output: API keys and tokens in argv, log lines and JSON.

Pure functions. A value is hidden when its option or key name says it is a secret
(``--api-key sk-...``, ``HF_TOKEN=hf_...``, ``'api_key': ['sk-...']``) or when it looks
like a well-known token (``hf_...``, ``sk-...``, ``Bearer ...``).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence

MASK = "***"

_SECRET_WORDS = frozenset(
    {"token", "secret", "password", "passwd", "credential", "credentials", "auth", "apikey"}
)

# NAME<sep>VALUE: --api-key=V, HF_TOKEN=V, api_key: V, 'api_key': 'V' / ['V', ...].
# Names are matched loosely (any word) and checked in Python, which keeps this linear.
_ASSIGN_RE = re.compile(
    r"""(?<![\w.-])(?P<name>-{0,2}[\w.-]+)(?P<sep>['"]?[ \t]*[=:][ \t]*)"""
    r"""(?P<value>\[[^\]]*\]|'[^']*'|"[^"]*"|[^\s,;}'"]+)"""
)
# --api-key VALUE (option and value as separate words)
_OPTION_SPACE_RE = re.compile(
    r"(?<![\w.-])(?P<name>--[\w.-]+)(?P<sep>[ \t]+)(?P<value>[^\s,;-][^\s,;]*)"
)
_TOKEN_RE = re.compile(
    r"\b(?:hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,})\b"
    r"|(?<=Bearer )[A-Za-z0-9._~+/=-]{8,}"
)


def is_secret_name(name: str) -> bool:
    """``--api-key``, ``HF_TOKEN``, ``api_key``... (an option or variable name): one of
    its parts (split on ``_ . -``) is a secret word; ``tokenizer`` or
    ``max_num_batched_tokens`` are not."""
    parts = [p for p in re.split(r"[_.-]+", name.split("=", 1)[0].lower()) if p]
    if any(p in _SECRET_WORDS for p in parts):
        return True
    return any(a == "api" and b == "key" for a, b in itertools.pairwise(parts))


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A copy of ``argv`` with secret option values replaced by ``***``."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next and not arg.startswith("-"):
            out.append(MASK)
            hide_next = False
            continue
        hide_next = False
        if "=" in arg and is_secret_name(arg.split("=", 1)[0]):
            out.append(arg.split("=", 1)[0] + "=" + MASK)
        elif arg.startswith("-") and is_secret_name(arg):
            out.append(arg)
            hide_next = True
        else:
            out.append(redact_text(arg))
    return out


def redact_text(text: str) -> str:
    """``text`` with secret assignments and well-known token shapes replaced by ``***``."""
    if not text:
        return text

    def assign(m: re.Match[str]) -> str:
        if not is_secret_name(m["name"]):
            return m[0]
        value = m["value"]
        quote = value[0] if value[:1] in ("'", '"') else ""
        if value.startswith("["):
            return f"{m['name']}{m['sep']}['{MASK}']"
        return f"{m['name']}{m['sep']}{quote}{MASK}{quote}"

    text = _ASSIGN_RE.sub(assign, text)
    text = _OPTION_SPACE_RE.sub(
        lambda m: f"{m['name']}{m['sep']}{MASK}" if is_secret_name(m["name"]) else m[0], text
    )
    return _TOKEN_RE.sub(MASK, text)
