"""Required literals of a regex: the prefilter is derived from the catalogue, not hand-kept.

``required_literals(r)`` returns strings such that every match of ``r`` contains at least one
of them (a disjunction). The union over all patterns is a necessary condition for any rule
to match a line: it becomes the ``grep`` prefilter run on a remote host, and the loader
checks each of them contains one of the catalogue's short *gates*, which the local scanner
looks for with ``bytes.find`` (fast, no regex).
"""

from __future__ import annotations

import sys
from typing import Any

if sys.version_info >= (3, 11):
    import re._constants as _c
    import re._parser as _p
else:  # pragma: no cover - Python 3.10
    import sre_constants as _c
    import sre_parse as _p

MIN_LITERAL = 4


def _score(alts: list[str] | None) -> int:
    return min((len(a) for a in alts), default=0) if alts else 0


def _gated(alts: list[str], gates: tuple[str, ...]) -> bool:
    return all(any(g in lit for g in gates) for lit in alts)


def _best(cands: list[list[str]], gates: tuple[str, ...] = ()) -> list[str] | None:
    """The most selective disjunction, preferring those whose literals all contain a gate."""
    best: list[str] | None = None
    for alts in cands:
        if not alts or _score(alts) < MIN_LITERAL:
            continue
        if best is None:
            best = alts
            continue
        key = (bool(gates) and _gated(alts, gates), _score(alts))
        if key > (bool(gates) and _gated(best, gates), _score(best)):
            best = alts
    return best


def _seq(items: Any, gates: tuple[str, ...] = ()) -> list[str] | None:
    """Best disjunction of required literals for a parsed sequence."""
    return _best(_conjuncts(items, gates), gates)


def _conjuncts(items: Any, gates: tuple[str, ...] = ()) -> list[list[str]]:
    """Every disjunction of literals a match of the sequence must satisfy (all of them)."""
    cands: list[list[str]] = []
    run: list[str] = []

    def close() -> None:
        if run:
            cands.append(["".join(run)])
            run.clear()

    for op, av in items:
        if op is _c.LITERAL:
            run.append(chr(av))
            continue
        close()
        if op is _c.SUBPATTERN:
            if av[1] & (_c.SRE_FLAG_IGNORECASE | _c.SRE_FLAG_VERBOSE):
                continue  # (?i:...) literals are not case-exact
            sub = _seq(av[-1], gates)
            if sub:
                cands.append(sub)
        elif op is _c.BRANCH:
            alts: list[str] = []
            ok = True
            for branch in av[1]:
                got = _seq(branch, gates)
                if not got:
                    ok = False
                    break
                alts.extend(got)
            if ok and alts:
                cands.append(sorted(set(alts)))
        elif op in (_c.MAX_REPEAT, _c.MIN_REPEAT) or (
            hasattr(_c, "POSSESSIVE_REPEAT") and op is _c.POSSESSIVE_REPEAT
        ):
            lo, _hi, sub_items = av
            if lo >= 1:
                got = _seq(sub_items, gates)
                if got:
                    cands.append(got)
        # AT, IN, ANY, NOT_LITERAL, GROUPREF, ASSERT...: no literal, break the run
    close()
    return cands


def required_literals(pattern: str, gates: tuple[str, ...] = ()) -> list[str]:
    """Literals of which every match of ``pattern`` contains one ([] when none is found).

    With ``gates``, prefer (among the pattern's required disjunctions) the most selective
    one whose every literal contains a gate.
    """
    parsed = _p.parse(pattern, 0)
    if parsed.state.flags & (_c.SRE_FLAG_IGNORECASE | _c.SRE_FLAG_VERBOSE):
        return []
    return _seq(parsed, gates) or []


def quality(literals: list[str]) -> int:
    """Length of the shortest literal (0 when none): how selective the prefilter is."""
    return _score(literals)


def literal_runs(pattern: str, min_len: int = 12) -> list[str]:
    """Every run of consecutive literal characters (at least ``min_len`` long) that a match
    of ``pattern`` must contain, in pattern order (groups are entered, branches skipped).

    Used to recognise a message *template* (a ``raise`` line's string literal, with its
    f-string fields cut out) whose full text the regex cannot match."""
    try:
        parsed = _p.parse(pattern, 0)
    except Exception:  # the catalogue validates regexes elsewhere
        return []
    if parsed.state.flags & (_c.SRE_FLAG_IGNORECASE | _c.SRE_FLAG_VERBOSE):
        return []
    out: list[str] = []

    def walk(items: Any) -> None:
        run: list[str] = []

        def close() -> None:
            if len(run) >= min_len:
                out.append("".join(run))
            run.clear()

        for op, av in items:
            if op is _c.LITERAL:
                run.append(chr(av))
                continue
            close()
            if op is _c.SUBPATTERN and not av[1] & (_c.SRE_FLAG_IGNORECASE | _c.SRE_FLAG_VERBOSE):
                walk(av[-1])
            elif op in (_c.MAX_REPEAT, _c.MIN_REPEAT) and av[0] >= 1:
                walk(av[2])
        close()

    walk(parsed)
    return out
