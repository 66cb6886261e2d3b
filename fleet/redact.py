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
    {
        "token",
        "secret",
        "password",
        "passwd",
        "credential",
        "credentials",
        "auth",
        "apikey",
        "authorization",
    }
)

_COUNTING_SUFFIXES = frozenset(
    {"id", "ids", "len", "length", "count", "num", "size", "type", "limit", "file", "path"}
)

# NAME<sep> followed by a value: --api-key=V, HF_TOKEN=V, api_key: V, 'api_key': ['V'].
# Only NAME<sep> is consumed (the value sits in a lookahead), so a value that itself holds
# an assignment (``env: HF_TOKEN=x``) is still looked at. Names are matched loosely and
# checked in Python, which keeps this linear.
_ASSIGN_RE = re.compile(r"""(?<![\w.-])(?P<name>-{0,2}[\w.-]+)['"]?[ \t]*[=:][ \t]*(?=\S)""")
# --api-key VALUE (option and value as separate words)
_OPTION_SPACE_RE = re.compile(r"(?<![\w.-])(?P<name>--[\w.-]+)[ \t]+(?=[^\s,;-])")
# The value after a secret name: a list, a quoted string, an auth scheme and its
# credentials, or one bare word.
_VALUE_RE = re.compile(
    r"""\[[^\]]*\]|'[^']*'|"[^"]*"|(?:Bearer|Basic|Token)[ \t]+[^\s,;}'"]+|[^\s,;}'"]+""",
    re.IGNORECASE,
)
_TOKEN_RE = re.compile(
    r"\b(?:hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,})\b"
    r"|(?<=Bearer )[A-Za-z0-9._~+/=-]{8,}"
    r"|(?<=://)[^/\s:@]+:[^/\s@]+(?=@)"  # user:password@ in a URL
)


def is_secret_name(name: str) -> bool:
    """``--api-key``, ``HF_TOKEN``, ``api_key``... (an option or variable name): one of
    its parts (split on ``_ . -``) is a secret word; ``tokenizer`` or
    ``max_num_batched_tokens`` are not."""
    parts = [p for p in re.split(r"[_.-]+", name.split("=", 1)[0].lower()) if p]
    if parts and parts[-1] in _COUNTING_SUFFIXES:  # eos_token_id, auth_type: not secrets
        return False
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
    spans: list[tuple[int, int, str]] = []  # (start, end, replacement)
    for pattern in (_ASSIGN_RE, _OPTION_SPACE_RE):
        for m in pattern.finditer(text):
            if not is_secret_name(m["name"]):
                continue
            value = _VALUE_RE.match(text, m.end())
            if value is None:
                continue
            spans.append((value.start(), value.end(), _masked(value[0])))
    if spans:
        spans.sort()
        out: list[str] = []
        pos = 0
        for start, end, replacement in spans:
            if start < pos:  # overlapping: already hidden
                continue
            out += [text[pos:start], replacement]
            pos = end
        out.append(text[pos:])
        text = "".join(out)
    return _TOKEN_RE.sub(MASK, text)


def _masked(value: str) -> str:
    if value.startswith("["):
        return f"['{MASK}']"
    if value[:1] in ("'", '"'):
        return f"{value[0]}{MASK}{value[0]}"
    return MASK
