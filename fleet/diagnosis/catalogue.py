"""Load, validate and compile the rule catalogue (``catalogue.yaml`` in this package).

Validation happens here, at load: every regex compiles (pydantic models), every taxonomy id
has an entry, every pattern has a prefilter literal of at least ``MIN_LITERAL`` characters,
and each literal contains one of the catalogue's gates -- so the fast prefilters (local
``bytes.find`` of the gates, remote ``grep -E`` of the literals) never hide a match.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

from fleet.diagnosis.literals import MIN_LITERAL, literal_runs, quality, required_literals
from fleet.diagnosis.models import Catalogue, ContextSpec, FrameSpec, PatternSpec, Rule
from fleet.errors import FleetError
from fleet.safeyaml import load_yaml


class CatalogueError(FleetError):
    """The shipped (or given) catalogue is invalid -- a bug, caught by the unit tests."""


@dataclass(frozen=True)
class CompiledPattern:
    rule: Rule
    spec: PatternSpec
    regex: re.Pattern[str]
    literals: tuple[str, ...]
    context: re.Pattern[str] | None
    context_within: int
    specificity: int
    severity: str
    role: str
    info: bool
    confidence: str = "high"
    runs: tuple[str, ...] = ()  # literal runs (>= RUN_MIN chars) for template matching
    regex_i: re.Pattern[str] | None = None  # case-insensitive, for lines retyped in lower case
    literals_lower: tuple[str, ...] = ()


@dataclass(frozen=True)
class CompiledFrame:
    rule: Rule
    spec: FrameSpec
    file: re.Pattern[str]
    function: re.Pattern[str]
    code: re.Pattern[str] | None


# A traceback's frame line and the path/function it names.
FRAME_LITERAL = 'File "'
ERROR_LEVEL_LITERALS = ("ERROR", "CRITICAL", "FATAL")


@dataclass(frozen=True)
class CompiledCatalogue:
    catalogue: Catalogue
    patterns: tuple[CompiledPattern, ...]
    gates: tuple[str, ...]
    gates_bytes: tuple[bytes, ...]
    info_gates: tuple[str, ...]
    info_gates_bytes: tuple[bytes, ...]
    exception_line: re.Pattern[str]
    benign: tuple[re.Pattern[str], ...]
    facts: tuple[tuple[str, re.Pattern[str]], ...]
    prefilter_literals: tuple[str, ...]
    context_literals_bytes: tuple[bytes, ...] = ()  # gates within context-regex literals
    rules: dict[str, Rule] = field(default_factory=dict)
    frames: tuple[CompiledFrame, ...] = ()
    fatal_markers: tuple[re.Pattern[str], ...] = ()
    gates_lower: tuple[str, ...] = ()
    exception_line_i: re.Pattern[str] | None = None

    def prefilter_ere(self) -> list[str]:
        """One POSIX ERE per literal (for ``grep -E -f -``): the remote prefilter."""
        return [ere_escape(lit) for lit in self.prefilter_literals]

    def is_candidate(self, text: str) -> bool:
        """The cheap gate: can any rule (or an exception line) match this text?"""
        return any(g in text for g in self.gates)

    def is_lower_candidate(self, text: str) -> bool:
        """The gate for a line retyped in lower case (matched case-insensitively)."""
        return any(g in text for g in self.gates_lower)

    def is_info_candidate(self, text: str) -> bool:
        """The gate for vLLM INFO/DEBUG lines (only ``info: true`` patterns apply)."""
        return any(g in text for g in self.info_gates)


_ROLE_CONFIDENCE = {"cause": "high", "symptom": "medium", "wrapper": "low"}
RUN_MIN = 20  # a literal run this long identifies a message (template matching)
PIECE_MIN = 24  # a literal piece of a template this long is looked up in the runs
DISTINCT_MIN = 12  # characters of non-generic words a run or piece needs to identify a message
DISTINCT_WORDS = 2  # and at least this many of them (one parameter name is not a message)
_PLACEHOLDER = re.compile(r"\{[^{}]*\}")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Words that occur in the messages of many unrelated raise sites ("X is only supported for
# Y", "is not supported", "must be greater than"): a run made of these identifies nothing.
_GENERIC_TEXT = """
a an the this that these those it its is are was were be been being to of in on at for
from by with without and or not no nor only must should can cannot could would will may
has have had do does did than then into onto when while which who whom whose what if so
as but also any all some such other more less same use used using set please try see
supported support supports unsupported failed fail error errors invalid valid found
allowed available required expected value values type types got given provided number
greater smaller larger equal least most currently current yet now instead enabled
disabled enable disable true false none
"""
GENERIC_WORDS = frozenset(_GENERIC_TEXT.split())


def distinctive(text: str) -> bool:
    """Does ``text`` identify a message: at least DISTINCT_WORDS words that are not
    :data:`GENERIC_WORDS`, of DISTINCT_MIN characters together?"""
    words = [w for w in _WORD.findall(text) if w.lower() not in GENERIC_WORDS]
    return len(words) >= DISTINCT_WORDS and sum(len(w) for w in words) >= DISTINCT_MIN


_EXC_PREFIX = re.compile(r"^\s*(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Warning)?:\s*")


def _message_runs(regex: str) -> tuple[str, ...]:
    """Literal runs of a pattern that identify a message (an exception-type prefix such
    as ``AssertionError: `` is not a message, nor is a run of generic words such as
    `` is only supported for ``)."""
    out = []
    for run in literal_runs(regex, RUN_MIN):
        run = _EXC_PREFIX.sub("", run, count=1)
        if len(run.strip()) >= RUN_MIN and distinctive(run):
            out.append(run)
    return tuple(out)


_FILL_VALUES = ("0", "['0']")  # a number or a name; a printed list
MAX_FILLED_FIELDS = 3


def _fills(text: str) -> list[str]:
    """The template as-is and with its ``{...}`` fields filled: every field a number, every
    field a printed list, and (up to MAX_FILLED_FIELDS fields) every mix of the two -- so a
    pattern expecting ``Eagle3 is only supported for ['llama', ...] models`` recognises
    ``{method} is only supported for {supported} models``."""
    parts = _PLACEHOLDER.split(text)
    n = len(parts) - 1
    if n == 0:
        return [text]
    out = [text]
    combos = (
        itertools.product(_FILL_VALUES, repeat=n)
        if n <= MAX_FILLED_FIELDS
        else ((v,) * n for v in _FILL_VALUES)
    )
    for combo in combos:
        filled = parts[0] + "".join(v + rest for v, rest in zip(combo, parts[1:], strict=True))
        out.append(filled)
    return out


def template_patterns(cat: CompiledCatalogue, text: str) -> list[CompiledPattern]:
    """The patterns that recognise a message *template*: the string literal of a ``raise``
    (as shown under a traceback frame, or mined from vLLM's source), whose f-string fields
    ``{...}`` are unknown and which may be cut short.

    A pattern recognises it when its regex matches the text (fields as-is or as ``0``), or
    one of the pattern's distinctive literal runs of >= RUN_MIN characters occurs in the
    text, or a distinctive literal piece of the message (its exception-type prefix
    removed) of >= PIECE_MIN characters occurs in one of the runs."""
    fills = _fills(text)
    message = _EXC_PREFIX.sub("", text, count=1)
    pieces = [p.strip() for p in _PLACEHOLDER.split(message)]
    pieces = [p for p in pieces if len(p) >= PIECE_MIN and distinctive(p)]
    hits: list[CompiledPattern] = []
    for pat in cat.patterns:
        if pat.context is not None:
            continue  # needs log context a template does not have
        by_regex = any(pat.regex.search(t) for t in fills)
        if by_regex or any(
            run in text or any(piece in run for piece in pieces) for run in pat.runs
        ):
            hits.append(pat)
    return hits


_ERE_SPECIAL = set("\\.[]()*+?{}|^$")


def ere_escape(literal: str) -> str:
    return "".join("\\" + ch if ch in _ERE_SPECIAL else ch for ch in literal)


def _minimize(literals: set[str]) -> tuple[str, ...]:
    """Drop literals that contain a shorter one (the shorter already selects the line)."""
    keep: list[str] = []
    for lit in sorted(literals, key=lambda s: (len(s), s)):
        if not any(k in lit for k in keep):
            keep.append(lit)
    return tuple(sorted(keep))


def _gate_in(literal: str, gates: tuple[str, ...]) -> str:
    """The shortest gate contained in ``literal`` (a cheaper needle that still finds it)."""
    return min((g for g in gates if g in literal), key=len)


def _covered(literal: str, gates: tuple[str, ...]) -> bool:
    return any(g in literal for g in gates)


def _literals_for(regex: str, what: str, gates: tuple[str, ...]) -> tuple[str, ...]:
    lits = required_literals(regex, gates)
    if quality(lits) < MIN_LITERAL:
        raise CatalogueError(
            f"{what}: regex {regex!r} has no literal of >= {MIN_LITERAL} characters "
            f"for the prefilter (got {lits})"
        )
    bad = [lit for lit in lits if not _covered(lit, gates)]
    if bad:
        raise CatalogueError(f"{what}: prefilter literal(s) {bad} contain none of the gates")
    return tuple(lits)


def compile_catalogue(cat: Catalogue) -> CompiledCatalogue:
    gates = tuple(cat.gates)
    info_gates = tuple(cat.info_gates)
    if any(len(g) < 3 for g in (*gates, *info_gates)):
        raise CatalogueError("gates must be at least 3 characters long")
    literals: set[str] = set()
    context_literals: set[str] = set()
    compiled: list[CompiledPattern] = []
    for rule in cat.rules:
        for i, spec in enumerate(rule.patterns):
            what = f"rule {rule.id} pattern {i + 1}"
            lits = _literals_for(spec.regex, what, gates)
            if spec.info:
                _literals_for(spec.regex, f"{what} (info)", info_gates)
            literals.update(lits)
            ctx: ContextSpec | None = spec.context
            if ctx is not None:
                ctx_lits = _literals_for(ctx.regex, f"{what} context", gates)
                literals.update(ctx_lits)
                context_literals.update(ctx_lits)
            compiled.append(
                CompiledPattern(
                    rule=rule,
                    spec=spec,
                    regex=re.compile(spec.regex),
                    literals=lits,
                    context=re.compile(ctx.regex) if ctx else None,
                    context_within=ctx.within if ctx else 0,
                    specificity=spec.specificity
                    if spec.specificity is not None
                    else rule.specificity,
                    severity=spec.severity or rule.severity,
                    role=spec.role or rule.role,
                    info=spec.info,
                    confidence=spec.confidence or _ROLE_CONFIDENCE[spec.role or rule.role],
                    runs=_message_runs(spec.regex),
                    regex_i=re.compile(spec.regex, re.IGNORECASE),
                    literals_lower=tuple(lit.lower() for lit in lits),
                )
            )
    literals.update(_literals_for(cat.exception_line, "exception_line", gates))
    literals.add("Traceback (most recent call last)")
    if not _covered(FRAME_LITERAL, gates):
        raise CatalogueError(f"the frame literal {FRAME_LITERAL!r} contains none of the gates")
    literals.add(FRAME_LITERAL)
    # error-level lines (the engine's "not clean" fallback) must reach it from a remote grep
    literals.update(g for g in ERROR_LEVEL_LITERALS if _covered(g, gates))
    markers = []
    for i, sig in enumerate(cat.fatal_markers):
        literals.update(_literals_for(sig.regex, f"fatal marker {i + 1}", gates))
        markers.append(re.compile(sig.regex))
    frames = [
        CompiledFrame(
            rule=rule,
            spec=fr,
            file=re.compile(fr.file),
            function=re.compile(fr.function),
            code=re.compile(fr.code) if fr.code else None,
        )
        for rule in cat.rules
        for fr in rule.frames
    ]
    facts = []
    for fact in cat.facts:
        literals.update(_literals_for(fact.regex, f"fact {fact.name}", gates))
        facts.append((fact.name, re.compile(fact.regex)))
    for rule in cat.rules:
        for tmpl in [*rule.summary, *rule.fix]:
            _check_template(tmpl, f"rule {rule.id}")
    unused = [g for g in gates if not any(g in lit for lit in literals)]
    if unused:
        raise CatalogueError(f"gates that no pattern needs (slow the scan for nothing): {unused}")
    info_lits = [lit for p in compiled if p.info for lit in p.literals]
    unused = [g for g in info_gates if not any(g in lit for lit in info_lits)]
    if unused:
        raise CatalogueError(f"info gates that no info pattern needs: {unused}")
    return CompiledCatalogue(
        catalogue=cat,
        patterns=tuple(compiled),
        gates=gates,
        gates_bytes=tuple(g.encode() for g in gates),
        info_gates=info_gates,
        info_gates_bytes=tuple(g.encode() for g in info_gates),
        exception_line=re.compile(cat.exception_line),
        benign=tuple(re.compile(b.regex) for b in cat.benign),
        facts=tuple(facts),
        prefilter_literals=_minimize(literals),
        context_literals_bytes=tuple(
            sorted({_gate_in(lit, gates).encode() for lit in context_literals})
        ),
        rules={r.id: r for r in cat.rules},
        frames=tuple(frames),
        fatal_markers=tuple(markers),
        gates_lower=tuple(sorted({g.lower() for g in gates})),
        exception_line_i=re.compile(cat.exception_line, re.IGNORECASE),
    )


_FIELD = re.compile(r"\{([^{}]*)\}")


def _check_template(tmpl: str, what: str) -> None:
    for name in _FIELD.findall(tmpl):
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
            raise CatalogueError(f"{what}: template field {{{name}}} is not a plain name")


def parse_catalogue(data: Any) -> CompiledCatalogue:
    from pydantic import ValidationError

    try:
        cat = Catalogue.model_validate(data)
    except ValidationError as exc:
        raise CatalogueError(f"invalid catalogue: {exc}") from None
    return compile_catalogue(cat)


@lru_cache(maxsize=1)
def load_catalogue() -> CompiledCatalogue:
    """The catalogue shipped in the package (cached)."""
    text = resources.files("fleet.diagnosis").joinpath("catalogue.yaml").read_text("utf-8")
    return parse_catalogue(load_yaml(text))
