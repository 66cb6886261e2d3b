"""Keep secrets out of fleet's output: API keys and tokens in argv, log lines and JSON.

Pure functions. A value is hidden when its option or key name says it is a secret, in
every form fleet prints a command line or a setting in:

- argv and shell text: ``--api-key V``, ``--api-key V1 V2`` (vLLM's ``--api-key`` takes
  several keys: every word up to the next option is hidden), ``--api-key=V``, ``HF_TOKEN=V``;
- Python and JSON reprs: ``'api_key': ['V1', 'V2']``, ``api_key=('V',)``, ``"hf_token": "V"``,
  and argv printed as a list, ``['--api-key', 'V1', 'V2', '--port', '8000']``;
- headers and URLs: ``Authorization: Bearer V``, ``X-Api-Key: V``, ``https://user:V@host``;

and wherever a well-known token shape appears on its own (``hf_...``, ``sk-...``,
``ghp_...``, ``github_pat_...``, ``glpat-...``, ``xoxb-...``, ``AKIA...``, ``AIza...``,
``npm_...``, ``pypi-...``, JSON Web Tokens, private key blocks).

Every scan is linear in the length of the text (adversarial lines included).
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
        "passphrase",
        "credential",
        "credentials",
        "auth",
        "apikey",
        "authorization",
        "bearer",
    }
)
# name parts that make a secret when they follow each other: api_key, access-key...
_SECRET_PAIRS = frozenset({("api", "key"), ("access", "key"), ("private", "key")})

_COUNTING_SUFFIXES = frozenset(
    {"id", "ids", "len", "length", "count", "num", "size", "type", "limit", "file", "path"}
)

# NAME<sep> followed by a value: --api-key=V, HF_TOKEN=V, api_key: V, 'api_key': ['V'].
# Only NAME<sep> is consumed (the value sits in a lookahead), so a value that itself holds
# an assignment (``env: HF_TOKEN=x``) is still looked at. Names are matched loosely and
# checked in Python, which keeps this linear.
_ASSIGN_RE = re.compile(r"""(?<![\w.-])(?P<name>-{0,2}[\w.-]+)['"]?[ \t]*[=:][ \t]*(?=\S)""")
# --api-key VALUE... (option and values as separate words)
_OPTION_SPACE_RE = re.compile(r"(?<![\w.-])(?P<name>--?[\w.-]+)[ \t]+(?=[^\s,;-])")
# '--api-key', 'VALUE'...: argv printed as a Python or JSON list
_SEQ_OPTION_RE = re.compile(r"""(?P<q>['"])(?P<name>--?[\w.-]+)(?P=q)[ \t]*,[ \t]*(?=['"])""")
_AUTH_SCHEME_RE = re.compile(r"(?:Bearer|Basic|Token)[ \t]+(?=[^\s,;}'\"])", re.IGNORECASE)
_SPACES_RE = re.compile(r"[ \t]*")
_BARE_STOP_RE = re.compile(r"""[\s,;}'"\])]""")
# after a bare assigned value, ",more" (no space) continues it: KEY=k1,k2 is two keys, and
# "k2=x" may be a key with "=" in it as well as another setting; hiding both is the safe side
_COMMA_MORE_RE = re.compile(r""",(?=[^\s,;}'"\])])""")
_LIST_SEP_RE = re.compile(r"[ \t]*,[ \t]*")
_CLOSE = {"[": "]", "(": ")", "{": "}", "'": "'", '"': '"'}

_TOKEN_RE = re.compile(
    r"\b(?:"
    r"hf_[A-Za-z0-9]{20,}"
    r"|api_org_[A-Za-z0-9]{20,}"
    r"|sk-[A-Za-z0-9_-]{16,}"
    r"|[sr]k_(?:live|test)_[A-Za-z0-9]{16,}"
    r"|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_[A-Za-z0-9_]{20,}"
    r"|glpat-[A-Za-z0-9_-]{20,}"
    r"|xox[abprs]-[A-Za-z0-9-]{10,}"
    r"|AKIA[0-9A-Z]{16}"
    r"|AIza[0-9A-Za-z_-]{35}"
    r"|npm_[A-Za-z0-9]{36}"
    r"|pypi-[A-Za-z0-9_-]{50,}"
    r"|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"
    r")"
    r"|(?<=Bearer )[A-Za-z0-9._~+/=-]{8,}"
    r"|(?<=://)[^/\s:@]+:[^/\s@]+(?=@)"  # user:password@ in a URL
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----[^-]*(?:-----END [A-Z ]*PRIVATE KEY-----)?"
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
    return any(pair in _SECRET_PAIRS for pair in itertools.pairwise(parts))


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A copy of ``argv`` with secret option values replaced by ``***``: every word after
    a secret option up to the next option (``--api-key K1 K2``), and ``--name=V``."""
    out: list[str] = []
    hiding = False
    for arg in argv:
        if hiding and not arg.startswith("-"):
            out.append(MASK)
            continue
        hiding = False
        if "=" in arg and is_secret_name(arg.split("=", 1)[0]):
            out.append(arg.split("=", 1)[0] + "=" + MASK)
        elif arg.startswith("-") and is_secret_name(arg):
            out.append(arg)
            hiding = True
        else:
            out.append(redact_text(arg))
    return out


class _Finder:
    """``str.find``/``re.search`` from increasing positions, each answer reused while it
    lies ahead: every scan of one pass over a text is linear in total."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._found: dict[object, tuple[int, int]] = {}  # what -> (searched from, found at)

    def find(self, what: str, start: int) -> int:
        hit = self._found.get(what)
        if hit is not None and hit[0] <= start and (hit[1] >= start or hit[1] < 0):
            return hit[1]
        pos = self.text.find(what, start)
        self._found[what] = (start, pos)
        return pos

    def search(self, pattern: re.Pattern[str], start: int) -> int:
        hit = self._found.get(pattern)
        if hit is not None and hit[0] <= start and hit[1] >= start:
            return hit[1]
        m = pattern.search(self.text, start)
        pos = m.start() if m else len(self.text)
        self._found[pattern] = (start, pos)
        return pos


def _value_end(text: str, start: int, finder: _Finder, *, commas: bool = False) -> int:
    """Where the value starting at ``start`` ends: a bracketed list/tuple/set or a quoted
    string (closed on the same line), an auth scheme and its credentials, or a bare word
    (``commas``: continued over ``,more``)."""
    opener = text[start]
    close = _CLOSE.get(opener)
    if close is not None:
        end = finder.find(close, start + 1)
        newline = finder.find("\n", start + 1)
        if end >= 0 and (newline < 0 or end < newline):
            return end + 1
    scheme = _AUTH_SCHEME_RE.match(text, start)
    if scheme is not None:
        start = scheme.end()
    end = max(start + 1, finder.search(_BARE_STOP_RE, start + 1))
    while commas:
        more = _COMMA_MORE_RE.match(text, end)
        if more is None:
            break
        end = max(more.end() + 1, finder.search(_BARE_STOP_RE, more.end() + 1))
    return end


def _masked(value: str) -> str:
    opener = value[:1]
    if opener in ("[", "(", "{") and value.endswith(_CLOSE[opener]):
        return f"{opener}'{MASK}'{_CLOSE[opener]}"
    if opener in ("'", '"') and len(value) > 1 and value.endswith(opener):
        return f"{opener}{MASK}{opener}"
    return MASK


def _secret_spans(text: str) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    for pattern in (_ASSIGN_RE, _OPTION_SPACE_RE, _SEQ_OPTION_RE):
        finder = _Finder(text)
        covered = -1
        for m in pattern.finditer(text):
            if m.start() < covered or not is_secret_name(m["name"]):
                continue
            pos = m.end()
            if pattern is _ASSIGN_RE:
                end = _value_end(text, pos, finder, commas=True)
                spans.append((pos, end))
            elif pattern is _OPTION_SPACE_RE:
                # --api-key K1 K2 ...: every word up to the next option or separator
                while True:
                    end = _value_end(text, pos, finder)
                    spans.append((pos, end))
                    gap = _SPACES_RE.match(text, end)
                    nxt = gap.end() if gap else end
                    if (
                        nxt == end
                        or nxt >= len(text)
                        or text[nxt] in "-,;\n\r"
                        or (text[nxt] in "}])")
                    ):
                        break
                    pos = nxt
            else:
                # '--api-key', 'K1', 'K2', ...: quoted items up to one starting with '-'
                while True:
                    end = _value_end(text, pos, finder)
                    spans.append((pos, end))
                    sep = _LIST_SEP_RE.match(text, end)
                    if sep is None or sep.end() >= len(text):
                        break
                    nxt = sep.end()
                    if text[nxt] not in "'\"" or text[nxt + 1 : nxt + 2] == "-":
                        break
                    pos = nxt
            covered = max(covered, spans[-1][1])
    return spans


def redact_text(text: str) -> str:
    """``text`` with secret values and well-known token shapes replaced by ``***``."""
    if not text:
        return text
    spans = _secret_spans(text)
    if spans:
        spans.sort()
        out: list[str] = []
        pos = 0
        for start, end in spans:
            if start < pos:  # overlapping: already hidden
                if end > pos:
                    out.append(MASK)
                    pos = end
                continue
            out += [text[pos:start], _masked(text[start:end])]
            pos = end
        out.append(text[pos:])
        text = "".join(out)
    return _TOKEN_RE.sub(MASK, text)
