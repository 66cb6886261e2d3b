"""A tiny PEP 440 subset: enough to compare vLLM versions and check ``>=0.10.2,<0.18``.

fleet does not depend on ``packaging``; vLLM versions seen in the wild are
``0.11.0``, ``0.11.0+cu128``, ``0.17.1rc1``, ``0.18.0.dev12+g1a2b3c``. Local labels
(``+...``) are ignored; pre-releases sort before their release (dev < a < b < rc < final <
post), as in PEP 440.
"""

from __future__ import annotations

import re
from functools import total_ordering

from fleet.errors import UsageError

_VERSION_RE = re.compile(
    r"""^\s*v?
    (?P<release>\d+(?:\.\d+)*)
    (?:[-_.]?(?P<pre>a|alpha|b|beta|c|rc|pre|preview)[-_.]?(?P<pre_n>\d*))?
    (?:[-_.]?(?:post|rev|r)[-_.]?(?P<post>\d*))?
    (?:[-_.]?dev[-_.]?(?P<dev>\d*))?
    (?:\+(?P<local>[a-z0-9.]+))?
    \s*$""",
    re.IGNORECASE | re.VERBOSE,
)
_PRE_RANK = {"a": 1, "alpha": 1, "b": 2, "beta": 2, "c": 3, "rc": 3, "pre": 3, "preview": 3}


@total_ordering
class Version:
    """A parsed version; compares like PEP 440 (trailing zeros do not matter)."""

    def __init__(self, text: str) -> None:
        m = _VERSION_RE.match(text)
        if not m:
            raise ValueError(f"not a version: {text!r}")
        self.text = text.strip()
        release = [int(p) for p in m.group("release").split(".")]
        while len(release) > 1 and release[-1] == 0:
            release.pop()
        self.release = tuple(release)
        pre = m.group("pre")
        # (phase, number): dev-only < a < b < rc < final < post
        if pre:
            self.phase: tuple[int, int] = (_PRE_RANK[pre.lower()], int(m.group("pre_n") or 0))
        elif m.group("post") is not None:
            self.phase = (5, int(m.group("post") or 0))
        elif m.group("dev") is not None:
            self.phase = (0, 0)
        else:
            self.phase = (4, 0)
        dev = m.group("dev")
        self.dev = int(dev or 0) if dev is not None else None

    @property
    def key(self) -> tuple[tuple[int, ...], tuple[int, int], float]:
        return (self.release, self.phase, float("inf") if self.dev is None else self.dev)

    @property
    def is_prerelease(self) -> bool:
        return self.phase[0] < 4 or self.dev is not None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Version) and self.key == other.key

    def __lt__(self, other: Version) -> bool:
        return self.key < other.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return f"Version({self.text!r})"

    def __str__(self) -> str:
        return self.text


_CLAUSE_RE = re.compile(r"^\s*(>=|<=|==|!=|>|<)\s*([^\s,]+)\s*$")


class VersionRange:
    """A comma-separated conjunction of ``>=``, ``>``, ``<=``, ``<``, ``==``, ``!=`` clauses.

    Unlike full PEP 440, ``<0.18`` also excludes ``0.18.0rc1`` and ``0.18.0.dev3`` (a
    pre-release of the excluded version already has what the release has, which is what
    a patch set's range is about).
    """

    def __init__(self, text: str) -> None:
        self.text = text.strip()
        self.clauses: list[tuple[str, Version]] = []
        if not self.text:
            return
        for part in self.text.split(","):
            m = _CLAUSE_RE.match(part)
            if not m:
                raise UsageError(f"bad version range {text!r}: clause {part.strip()!r}")
            try:
                self.clauses.append((m.group(1), Version(m.group(2))))
            except ValueError as exc:
                raise UsageError(f"bad version range {text!r}: {exc}") from None

    def __contains__(self, version: Version | str) -> bool:
        v = version if isinstance(version, Version) else Version(version)
        for op, bound in self.clauses:
            # compare releases only against the bound's own phase semantics: a bare bound
            # like ``0.18`` means "0.18 and its pre-releases" for < and >=.
            if op == "<":
                ok = v.release < bound.release if not bound.is_prerelease else v < bound
            elif op == ">=":
                ok = v.release >= bound.release if not bound.is_prerelease else v >= bound
            elif op == ">":
                ok = v > bound
            elif op == "<=":
                ok = v <= bound
            elif op == "==":
                ok = v.release == bound.release if not bound.is_prerelease else v == bound
            else:  # !=
                ok = v.release != bound.release if not bound.is_prerelease else v != bound
            if not ok:
                return False
        return True

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"VersionRange({self.text!r})"
