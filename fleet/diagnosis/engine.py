"""The diagnosis engine: numbered log lines in, ranked :class:`Diagnosis` list out.

Pure (no I/O): ``fleet logs --diagnose`` feeds it a local file, the candidate lines a remote
``grep`` returned, or a live ``tail -F``; ``fleet serve`` feeds it the log of a crashed load.

Per line: fold terminal-wrapped lines back together, skip lines without a gate (cheap
substring test), strip prefixes, recognise traceback exception lines, and try the rules
whose literals occur in the line. Matches are grouped per rule and ranked:

1. role: a specific cause, then a symptom (worker/engine/actor died), then an exception no
   rule explains (``unrecognized-error``), then generic wrappers ("See root cause above");
2. severity (fatal, error, warning);
3. the earliest *incident* -- a match on a continuation line of an exception (pydantic's
   "Value error, ..." under "ValidationError") counts at that exception's line, so two
   rules describing the same exception compare by
4. specificity.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from itertools import islice

from fleet.diagnosis.catalogue import (
    CompiledCatalogue,
    CompiledPattern,
    load_catalogue,
    template_patterns,
)
from fleet.diagnosis.factory import build, render
from fleet.diagnosis.models import (
    ROLE_TIER,
    SEVERITY_ORDER,
    Diagnosis,
    Evidence,
)
from fleet.diagnosis.normalize import (
    Normalized,
    fold_width,
    looks_like_record_start,
    newest_first,
    normalize,
    visible,
)
from fleet.redact import redact_text

MAX_EVIDENCE = 5
CONTEXT_LINES = 2
HISTORY = 400
# A non-exception line this close after an exception line of the same process belongs to it
# (continuation lines of the message: pydantic details, Ray's indented fields...).
CONTINUATION = 12
MAX_LINE = 16384  # characters of one logical line that are matched (a 10 MB line is cut)
MAX_EXCEPTIONS = 2000  # distinct unexplained exception lines remembered
FOLD_SAMPLE = 5000


# A traceback frame line; the line after it is source code (``raise ValueError("...`` can
# quote a message), which is never a message -- but a ``raise``/``assert`` whose exception
# line is missing (an excerpt cut inside the traceback) still names the cause by its
# string literal, at medium confidence.
_FRAME = re.compile(
    r'File ["\u201c](?P<path>[^"\u201d]*)["\u201d], line (?P<no>\d+)(?:, in (?P<func>\S+))?'
)
_RAISE = re.compile(r"\s*(?:raise\s+(?P<exc>[A-Za-z_][\w.]*)?|assert\b)")
_STRING = re.compile(r"""(?<![\w])[rbuRBUfF]{0,2}(?:"((?:[^"\\]|\\.)*)"?|'((?:[^'\\]|\\.)*)'?)""")
ERROR_LEVELS = frozenset({"ERROR", "CRITICAL", "FATAL"})
# Header shapes whose INFO/DEBUG level is the runtime's own (vLLM, uvicorn, Ray's and torch's
# C++ logs): such a line is healthy output, matched only by ``info: true`` patterns (the
# local scanner skips vLLM's). An INFO level from anything else is a wrapper's -- a launcher
# (olmocr, verl, a job runner) re-logging a child's output line by line at INFO -- and says
# nothing about the line: an exception line or a fatal marker it relays still counts.
OWN_LEVEL_SHAPES = frozenset(
    {
        "vllm-logger",
        "vllm-logger-no-file",
        "uvicorn-python-default",
        "ray-cpp",
        "glog",
        "glog-torch-c10",
        "nccl-debug",
    }
)
_LETTERS = re.compile(r"[a-z]{3}")


def _maybe_lower(raw: str) -> bool:
    """Could ``raw`` be a line retyped in lower case (no capital letter at all)?"""
    return raw == raw.lower() and _LETTERS.search(raw) is not None


def _retyped_lower(text: str) -> bool:
    """A message a poster retyped in lower case ("valueerror: no available memory for
    the cache blocks"): matched case-insensitively. Lines with any capital are exact."""
    return len(text) >= 12 and text == text.lower() and _LETTERS.search(text) is not None


# A warning that relays an exception (``Failed to import from vllm._C with ImportError(...)``)
# is not "merely error words": it reports the failure itself.
_CARRIES_EXCEPTION = re.compile(r"\b[A-Z]\w*(?:Error|Exception)(?:\(|: )")
_EXC_PARTS = re.compile(r"(?:[A-Za-z_]\w*\.)*(?P<type>[A-Za-z_]\w*): ?(?P<msg>.*)")
MAX_TRACES = 200  # truncated tracebacks remembered
FRAME_DEPTH = 12  # frames of a truncated traceback (deepest first) tried against frame rules


def same_message(exc_line: str, template: str) -> bool:
    """Is ``exc_line`` the exception a ``raise`` with message ``template`` (its
    ``raise_text``) produces, possibly cut short? Types agree and the shown message starts
    like the template's literal head (up to its first f-string field)."""
    em, tm = _EXC_PARTS.fullmatch(exc_line.strip()), _EXC_PARTS.fullmatch(template.strip())
    if em is None:
        return False
    if tm is not None:
        if em.group("type") != tm.group("type"):
            return False
        lit = tm.group("msg")
    else:
        lit = template.strip()
    shown = " ".join(em.group("msg").split())
    head = " ".join(lit.split("{", 1)[0].split())
    n = min(len(shown), len(head))
    return n >= 8 and shown[:n] == head[:n]


def raise_text(code: str) -> str | None:
    """``ExcType: literal`` of a ``raise``/``assert`` source line (None if no literal)."""
    m = _RAISE.match(code)
    if m is None:
        return None
    lits = [a or b for a, b in _STRING.findall(code[m.end() :])]
    lit = "".join(lits).strip()
    if len(lit) < 8:
        return None
    exc = m.group("exc") or ("AssertionError" if code.lstrip().startswith("assert") else "")
    return f"{exc.rsplit('.', 1)[-1]}: {lit}" if exc else lit


# --------------------------------------------------------------------------- engine state


@dataclass
class _Match:
    pattern: CompiledPattern | None  # None for unrecognized-error
    rule_id: str
    line: int
    text: str
    anchor: int
    values: dict[str, str]
    tier: int
    severity: str
    specificity: int
    context: list[Evidence] = field(default_factory=list)
    open_after: int = 0
    weak: bool = False  # a frame or raise-line literal, not the message (medium confidence)
    extra: list[Evidence] = field(default_factory=list)  # more evidence lines (frames)
    confidence: str | None = None  # a frame rule's own (low for broad frames)
    quiet: bool = False  # matched on an INFO/WARNING line of the runtime's own logger

    def key(self) -> tuple[int, int, int, int, int]:
        return (
            self.tier,
            int(self.weak),
            SEVERITY_ORDER[self.severity],
            self.anchor,
            -self.specificity,
        )


@dataclass
class _Frame:
    line: int
    text: str
    path: str
    func: str
    seq: int = 0  # the logical line's sequence number (records joined by ^M share a line)
    code: str | None = None
    code_line: int = 0


@dataclass
class _Trace:
    """An open traceback of one process: closed by its exception line."""

    start: int
    header: str | None
    frames: list[_Frame] = field(default_factory=list)


@dataclass
class _Exc:
    line: int
    text: str
    proc: str | None
    covered: bool = False


class Engine:
    """Incremental diagnosis: :meth:`feed` numbered raw lines, then :meth:`results`."""

    def __init__(
        self,
        catalogue: CompiledCatalogue | None = None,
        *,
        host: str | None = None,
        fold: int | None = None,
        max_evidence: int = MAX_EVIDENCE,
    ) -> None:
        self.cat = catalogue or load_catalogue()
        self.host = host
        self.fold = fold
        self.max_evidence = max_evidence
        self._history: deque[tuple[int, str, list[str | None]]] = deque(maxlen=HISTORY)
        self._pending: tuple[int, int, list[str]] | None = None  # (first no, last no, parts)
        self._matches: dict[str, list[_Match]] = {}
        self._exceptions: dict[int, _Exc] = {}
        self._last_exc: dict[str | None, int] = {}
        self._covered_texts: set[str] = set()
        self._facts: dict[str, str] = {}
        self._open: list[_Match] = []
        self._last_frame = -2  # sequence number of the last frame line
        self._seq = 0  # logical lines seen
        self._exception_texts: set[str] = set()
        self._traces: dict[str | None, _Trace] = {}
        self._orphans: list[_Trace] = []  # tracebacks that ended without an exception line
        self._last_error: tuple[int, str] | None = None  # last error-level line
        self._last_exc_line: tuple[int, str] | None = None  # last (non-benign) exception
        self._last_fatal: tuple[int, str] | None = None  # last fatal marker
        self.lines_seen = 0
        self.candidates = 0
        self.findings = 0
        """Grows when :meth:`results` may hold something new: a rule's first match or an
        exception line with a new text that no rule explains (a live follower recomputes
        only then)."""

    # ---------------------------------------------------------------- input
    def feed(self, lineno: int, raw: str) -> None:
        """One physical line (1-based number in the original log)."""
        if "^M" in raw:
            # records joined by a carriage return shown as "^M" (CI logs, `cat -v`): each
            # is a line of its own (the same line number)
            parts = raw.split("^M")
            if any(p.strip() for p in parts[1:]):
                for part in parts:
                    if part.strip():
                        self._feed(lineno, part)
                return
        self._feed(lineno, raw)

    def _feed(self, lineno: int, raw: str) -> None:
        self.lines_seen += 1
        if self.fold is None:
            self._logical(lineno, raw)
            return
        vis = visible(raw)
        if self._pending is not None:
            first, last, parts = self._pending
            if lineno == last + 1 and not looks_like_record_start(vis):
                parts.append(vis)
                if len(vis) == self.fold:
                    self._pending = (first, lineno, parts)
                    return
                self._pending = None
                self._logical(first, "".join(parts))
                return
            self._pending = None
            self._logical(first, "".join(parts))
        if len(vis) == self.fold:
            self._pending = (lineno, lineno, [vis])
        else:
            self._logical(lineno, raw)

    def flush(self) -> None:
        if self._pending is not None:
            first, _last, parts = self._pending
            self._pending = None
            self._logical(first, "".join(parts))

    # ---------------------------------------------------------------- per logical line
    def _logical(self, lineno: int, raw: str) -> None:
        if len(raw) > MAX_LINE:
            raw = raw[:MAX_LINE]
        entry: tuple[int, str, list[str | None]] = (lineno, raw, [None])
        self._history.append(entry)
        if self._open:
            self._fill_context(lineno, raw)
        cat = self.cat
        self._seq += 1
        after_frame = self._seq == self._last_frame + 1
        if "File " in raw:
            fm = _FRAME.search(raw)
            if fm is not None:
                self._last_frame = self._seq
                norm = normalize(raw)
                entry[2][0] = norm.text
                if _FRAME.match(norm.text.lstrip()):
                    self._on_frame(lineno, norm)
                    return  # a frame line is never a message
        if after_frame:
            norm = normalize(raw)
            entry[2][0] = norm.text
            if not cat.exception_line.match(norm.text):
                self._on_source(lineno, norm)
                return  # the source line of a traceback frame
        gated = cat.is_candidate(raw)
        if (
            not gated
            and not cat.is_info_candidate(raw)
            and not (_maybe_lower(raw) and cat.is_lower_candidate(raw))
        ):
            return
        norm = normalize(raw)
        entry[2][0] = norm.text
        for text in norm.text.split("\n") if "\n" in norm.text else (norm.text,):
            lower = _retyped_lower(text)
            self._match_line(lineno, text, norm, gated or lower, lower)

    # ---------------------------------------------------------------- tracebacks
    def _trace(self, proc: str | None, lineno: int, header: str | None) -> _Trace:
        tr = self._traces.get(proc)
        if tr is None:
            tr = self._traces[proc] = _Trace(start=lineno, header=header)
        return tr

    def _orphan(self, proc: str | None) -> None:
        tr = self._traces.pop(proc, None)
        if tr is not None and tr.frames and len(self._orphans) < MAX_TRACES:
            self._orphans.append(tr)

    def _on_frame(self, lineno: int, norm: Normalized) -> None:
        m = _FRAME.match(norm.text.lstrip())
        assert m is not None
        tr = self._trace(norm.proc, lineno, None)
        if len(tr.frames) >= 400:
            del tr.frames[:200]
        path = m.group("path").replace("\\", "/")  # Windows paths
        tr.frames.append(
            _Frame(lineno, norm.text.strip(), path, m.group("func") or "", seq=self._seq)
        )

    def _on_source(self, lineno: int, norm: Normalized) -> None:
        tr = self._traces.get(norm.proc)
        if tr is None or not tr.frames or tr.frames[-1].seq != self._seq - 1:
            return
        code = norm.text.strip()
        if code:
            tr.frames[-1].code = code
            tr.frames[-1].code_line = lineno

    def _match_line(
        self, lineno: int, text: str, norm: Normalized, gated: bool, lower: bool = False
    ) -> None:
        cat = self.cat
        own = norm.level_shape in OWN_LEVEL_SHAPES
        info = own and norm.level in ("INFO", "DEBUG")
        quiet = own and norm.level in ("INFO", "DEBUG", "WARNING")
        if not text.strip():
            return
        self.candidates += 1
        for benign in cat.benign:
            if benign.search(text):
                if cat.exception_line.match(text) is not None:
                    # a traceback that ends in a benign exception (KeyboardInterrupt on
                    # SIGTERM) is complete, not truncated
                    self._traces.pop(norm.proc, None)
                return
        for name, rx in cat.facts:
            m = rx.search(text)
            if m and m.group(name):
                self._facts[name] = m.group(name)
        proc = norm.proc
        if text.startswith("Traceback (most recent call last)"):
            self._orphan(proc)  # a traceback still open here ended without its exception
            self._trace(proc, lineno, text.strip())
            return
        if _FRAME.match(text.lstrip()):
            return  # a frame inside a multi-line (JSON) record
        exc_rx = cat.exception_line_i if lower and cat.exception_line_i else cat.exception_line
        is_exc = (not info) and gated and exc_rx.match(text) is not None
        new_exception = False
        if not info:
            if norm.level in ERROR_LEVELS:
                self._last_error = (lineno, text.strip())
            if not is_exc:
                for rx in cat.fatal_markers:
                    if rx.search(text):
                        self._last_fatal = (lineno, text.strip())
                        break
        closed: _Trace | None = None
        if is_exc:
            anchor = lineno
            self._last_exc_line = (lineno, text.strip())
            closed = self._traces.pop(proc, None)
            if closed is None and proc is not None:
                closed = self._traces.pop(None, None)
            self._last_exc[proc] = lineno
            if len(self._exceptions) < MAX_EXCEPTIONS:
                exc_text = text.strip()
                self._exceptions[lineno] = _Exc(lineno, exc_text, proc)
                if exc_text not in self._exception_texts:
                    self._exception_texts.add(exc_text)
                    new_exception = True
        else:
            last = self._last_exc.get(proc)
            anchor = last if last is not None and 0 <= lineno - last <= CONTINUATION else lineno
        best_here: dict[str, _Match] = {}
        for pat in cat.patterns:
            if info and not pat.info:
                continue
            for lit in pat.literals_lower if lower else pat.literals:
                if lit in text:
                    break
            else:
                continue
            m = (pat.regex_i if lower and pat.regex_i else pat.regex).search(text)
            if m is None:
                continue
            if pat.context is not None and not self._context_ok(pat, lineno):
                continue
            values = {k: v.strip() for k, v in m.groupdict().items() if v is not None}
            match = _Match(
                pattern=pat,
                rule_id=pat.rule.id,
                line=lineno,
                text=text.strip(),
                anchor=anchor,
                values=values,
                tier=ROLE_TIER[pat.role],
                severity=pat.severity,
                specificity=pat.specificity,
                quiet=quiet and not pat.info and not _CARRIES_EXCEPTION.search(text),
            )
            prev = best_here.get(pat.rule.id)
            if prev is None or match.key() < prev.key():
                if prev is not None:
                    match.values = {**prev.values, **match.values}
                best_here[pat.rule.id] = match
            else:
                prev.values = {**values, **prev.values}
        if not best_here and closed is not None:
            cut = self._cut_message(closed, lineno, text.strip())
            if cut is None and closed.frames:
                cut = self._frame_signal(closed, (lineno, text.strip()))
            if cut is not None:
                best_here[cut.rule_id] = cut
        if not best_here:
            if new_exception:
                self.findings += 1  # a new unrecognized-error (no rule explains it)
            return
        exc = self._exceptions.get(anchor)
        if exc is not None:
            exc.covered = True
            self._covered_texts.add(exc.text)
        if is_exc:
            self._covered_texts.add(text.strip())
        for rule_id, match in best_here.items():
            match.values = {**self._facts, **match.values}
            group = self._matches.setdefault(rule_id, [])
            if not group:
                self.findings += 1
                before = list(self._history)[-1 - CONTEXT_LINES : -1]
                match.context = [
                    Evidence(line=n, text=self._display(r, c[0])) for n, r, c in before
                ]
                match.open_after = CONTEXT_LINES
                self._open.append(match)
            group.append(match)

    def _cut_message(self, tr: _Trace, lineno: int, exc_text: str) -> _Match | None:
        """An exception line no rule explains, closing a traceback whose deepest frame shows
        the ``raise`` that produced it: when the line is that raise's message (typically cut
        short by a paste or a terminal), the raise's literal names the cause (medium)."""
        if not tr.frames:
            return None
        deepest = tr.frames[-1]
        if deepest.code is None:
            return None
        msg = raise_text(deepest.code)
        if msg is None or not same_message(exc_text, msg):
            return None
        pats = template_patterns(self.cat, msg)
        if not pats:
            return None
        pat = min(pats, key=lambda p: (ROLE_TIER[p.role], -p.specificity))
        return _Match(
            pattern=pat,
            rule_id=pat.rule.id,
            line=lineno,
            text=exc_text,
            anchor=lineno,
            values={},
            tier=ROLE_TIER[pat.role],
            severity=pat.severity,
            specificity=pat.specificity,
            weak=True,
            extra=[Evidence(line=deepest.code_line, text=deepest.code)],
        )

    def _fill_context(self, lineno: int, raw: str) -> None:
        still: list[_Match] = []
        for match in self._open:
            if lineno > match.line and match.open_after > 0:
                match.context.append(Evidence(line=lineno, text=normalize(raw).text))
                match.open_after -= 1
            if match.open_after > 0:
                still.append(match)
        self._open = still

    @staticmethod
    def _display(raw: str, text: str | None) -> str:
        return text if text is not None else normalize(raw).text

    def _context_ok(self, pat: CompiledPattern, lineno: int) -> bool:
        assert pat.context is not None
        for n, raw, cache in reversed(self._history):
            if n >= lineno:
                continue
            if lineno - n > pat.context_within:
                break
            text = cache[0]
            if text is None:
                text = cache[0] = normalize(raw).text
            if pat.context.search(text):
                return True
        return False

    # ---------------------------------------------------------------- output
    def _trace_signal(self, tr: _Trace) -> _Match | None:
        """What a traceback without its exception line still tells: the string literal of
        the ``raise``/``assert`` it stopped at, else the deepest frame a frame rule knows."""
        deepest = tr.frames[-1]
        if deepest.code is not None:
            msg = raise_text(deepest.code)
            if msg is not None:
                pats = template_patterns(self.cat, msg)
                if pats:
                    pat = min(pats, key=lambda p: (ROLE_TIER[p.role], -p.specificity))
                    return _Match(
                        pattern=pat,
                        rule_id=pat.rule.id,
                        line=deepest.code_line,
                        text=deepest.code,
                        anchor=deepest.code_line,
                        values={},
                        tier=ROLE_TIER[pat.role],
                        severity=pat.severity,
                        specificity=pat.specificity,
                        weak=True,
                        extra=[Evidence(line=deepest.line, text=deepest.text)],
                    )
        return self._frame_signal(tr)

    def _frame_signal(self, tr: _Trace, exc: tuple[int, str] | None = None) -> _Match | None:
        """The deepest frame (of the last FRAME_DEPTH) that a frame rule knows. With
        ``exc`` (the traceback's exception line, which no rule explains) only the rules
        marked ``with_exception`` apply, and the exception line is the evidence."""
        for fr in reversed(tr.frames[-FRAME_DEPTH:]):
            for cf in self.cat.frames:
                if exc is not None and not cf.spec.with_exception:
                    continue
                if not cf.function.fullmatch(fr.func) or not cf.file.search(fr.path):
                    continue
                if cf.code is not None and (fr.code is None or not cf.code.search(fr.code)):
                    continue
                rule = cf.rule
                extra = [Evidence(line=fr.line, text=fr.text)] if exc is not None else []
                if fr.code is not None:
                    extra.append(Evidence(line=fr.code_line, text=fr.code))
                line, text = exc if exc is not None else (fr.line, fr.text)
                values = {"frame": f"{fr.path.rsplit('/', 1)[-1]}:{fr.func}"}
                if exc is not None:
                    values["exception"] = text
                return _Match(
                    pattern=None,
                    rule_id=rule.id,
                    line=line,
                    text=text,
                    anchor=line,
                    values=values,
                    tier=ROLE_TIER[rule.role],
                    severity=rule.severity,
                    specificity=rule.specificity,
                    weak=True,
                    extra=extra,
                    confidence=cf.spec.confidence,
                )
        return None

    def _truncated(self) -> list[_Trace]:
        return [*self._orphans, *(t for t in self._traces.values() if t.frames)]

    def _fallback(self) -> _Match | None:
        """Evidence that the log is not clean although no rule explains it."""
        found: tuple[int, str] | None = None
        for cand in (self._last_exc_line, self._last_error):
            if cand is not None:
                found = cand
                break
        if found is None:
            traces = self._truncated()
            if traces:
                fr = max(traces, key=lambda t: t.frames[-1].line).frames[-1]
                found = (fr.line, fr.text)
            else:
                headers = [(t.start, t.header) for t in self._traces.values() if t.header]
                if headers:
                    found = max((n, h) for n, h in headers if h)
                elif self._last_fatal is not None:
                    found = self._last_fatal
        if found is None:
            return None
        return _Match(
            pattern=None,
            rule_id="unrecognized-error",
            line=found[0],
            text=found[1],
            anchor=found[0],
            values={"exception": found[1]},
            tier=ROLE_TIER["unrecognized"],
            severity="error",
            specificity=0,
        )

    def results(self) -> list[Diagnosis]:
        """The ranked diagnoses so far (safe to call repeatedly, e.g. while following)."""
        groups: list[tuple[tuple[int, int, int, int, int], list[_Match]]] = []
        for matches in self._matches.values():
            best = min(matches, key=_Match.key)
            groups.append((best.key(), matches))
        weak: dict[str, list[_Match]] = {}
        for tr in self._truncated():
            sig = self._trace_signal(tr)
            if sig is not None and sig.rule_id not in self._matches:
                weak.setdefault(sig.rule_id, []).append(sig)
        for matches in weak.values():
            matches.sort(key=lambda m: m.line)
            groups.append((min(m.key() for m in matches), matches))
        unexplained: dict[str, list[_Match]] = {}
        for exc in self._exceptions.values():
            if exc.covered or exc.text in self._covered_texts:
                continue
            unexplained.setdefault(exc.text, []).append(
                _Match(
                    pattern=None,
                    rule_id="unrecognized-error",
                    line=exc.line,
                    text=exc.text,
                    anchor=exc.line,
                    values={"exception": exc.text},
                    tier=ROLE_TIER["unrecognized"],
                    severity="error",
                    specificity=0,
                )
            )
        for matches in unexplained.values():
            groups.append((matches[0].key(), matches))
        if not self._loud():
            # INFO/WARNING lines of the runtime's own loggers (NCCL's plugin loader, vLLM's
            # warnings, uvicorn's access log) are never fatal on their own
            groups = [
                (key, [replace(m, severity="warning") for m in ms])
                if all(m.quiet for m in ms)
                else (key, ms)
                for key, ms in groups
            ]
            groups = [(min(m.key() for m in ms), ms) for _key, ms in groups]
        groups.sort(key=lambda g: (g[0], g[1][0].rule_id))
        # A lower-ranked rule that only matched lines a higher-ranked one already explains
        # (a generic signature of the same message) adds nothing: drop it.
        kept: list[list[_Match]] = []
        explained: set[int] = set()
        for _key, matches in groups:
            lines = {m.line for m in matches}
            if kept and lines <= explained:
                continue
            explained |= lines
            kept.append(matches)
        kept = _causes_before_wrappers(kept)
        if not any(SEVERITY_ORDER[g[0].severity] <= 1 for g in kept):
            fb = self._fallback()
            if fb is not None:
                kept.append([fb])
        return [self._build(matches) for matches in self._explained_first(kept)]

    def _loud(self) -> bool:
        """Has the log shown an error of its own: an error-level line, an exception line,
        a traceback or a fatal marker?"""
        return bool(
            self._last_error
            or self._last_exc_line
            or self._last_fatal
            or self._orphans
            or any(t.frames or t.header for t in self._traces.values())
        )

    def _explained_first(self, groups: list[list[_Match]]) -> list[list[_Match]]:
        """Move a cause above the consequences it ``explains`` (e.g. /dev/shm full -> NCCL)."""
        order = list(groups)
        rules = self.cat.rules
        for _ in range(len(order)):
            moved = False
            for i, group in enumerate(order):
                for j in range(i + 1, len(order)):
                    if order[j][0].severity == "warning":
                        continue  # a warning (a slow broadcast) explains no failure
                    if group[0].rule_id in rules[order[j][0].rule_id].explains:
                        order.insert(i, order.pop(j))
                        moved = True
                        break
                if moved:
                    break
            if not moved:
                break
        return order

    def _build(self, matches: list[_Match]) -> Diagnosis:
        best = min(matches, key=_Match.key)
        rule = self.cat.rules[best.rule_id]
        values: dict[str, str] = {}
        for m in sorted(matches, key=lambda m: m.line):
            for k, v in m.values.items():
                values.setdefault(k, v)
        values.update(best.values)
        values.setdefault("message", best.text[:300])
        if self.host:
            values["host"] = self.host
        summary, fix, values = render(rule, values)
        seen: set[int] = set()
        evidence: list[Evidence] = []
        lines = [(m.line, m.text) for m in [best, *sorted(matches, key=lambda m: m.line)]]
        lines[1:1] = [(e.line, e.text) for e in best.extra]
        for n, text in lines:
            if n in seen:
                continue
            seen.add(n)
            evidence.append(Evidence(line=n, text=redact_text(text)))
            if len(evidence) >= self.max_evidence:
                break
        first = matches[0]
        context = (
            [Evidence(line=e.line, text=redact_text(e.text)) for e in first.context]
            if first.pattern is not None
            else []
        )
        if best.weak:
            role = best.pattern.role if best.pattern is not None else rule.role
            confidence = best.confidence or "medium"
        elif best.pattern is None:
            role, confidence = "unrecognized", "low"
        else:
            role, confidence = best.pattern.role, best.pattern.confidence
        return build(
            rule,
            severity=best.severity,
            summary=summary,
            fix=fix,
            evidence=evidence,
            context=context,
            count=len(matches),
            values=values,
            role=role,
            specificity=best.specificity,
            confidence=confidence,
        )


_FOLLOWERS = (ROLE_TIER["symptom"], ROLE_TIER["wrapper"])


def _causes_before_wrappers(groups: list[list[_Match]]) -> list[list[_Match]]:
    """An exception no rule names (``unrecognized-error``) ranks above the generic
    symptoms and wrappers that follow it (EngineDeadError, "Worker proc died", "WorkerProc
    failed to start"): a wrapper is the answer only when no cause precedes it. A wrapper
    finding is placed by the line that ranks it, not by its earliest line: vLLM's
    multiproc executor prints its "WorkerProc hit an exception." header before the
    worker's traceback and "Worker proc ... died unexpectedly" after it."""
    order = list(groups)
    for group in [g for g in groups if g[0].rule_id == "unrecognized-error"]:
        first = min(m.line for m in group)
        here = order.index(group)
        for i, other in enumerate(order[:here]):
            best = min(other, key=_Match.key)
            if best.tier in _FOLLOWERS and best.line > first:
                order.insert(i, order.pop(here))
                break
    return order


# --------------------------------------------------------------------------- entry points


def _peek_fold(lines: list[str]) -> int | None:
    return fold_width([visible(line) for line in lines[:FOLD_SAMPLE]])


def diagnose_numbered(
    pairs: Iterable[tuple[int, str]],
    *,
    host: str | None = None,
    catalogue: CompiledCatalogue | None = None,
    fold: int | None = None,
) -> list[Diagnosis]:
    """Diagnose (line number, raw line) pairs -- possibly sparse, e.g. grep's candidates.

    A log printed newest line first (:func:`~fleet.diagnosis.normalize.newest_first`) is
    read bottom-up; the evidence keeps the original line numbers."""
    it: Iterator[tuple[int, str]] = iter(pairs)
    head = list(islice(it, FOLD_SAMPLE))
    if newest_first([visible(raw) for _n, raw in head]):
        every = head + list(it)
        top = max(n for n, _raw in every) + 1
        upright = [(top - n, raw) for n, raw in reversed(every)]
        found = _diagnose_upright(upright, host=host, catalogue=catalogue, fold=fold)
        return [_renumber(d, top) for d in found]
    return _diagnose_upright(head, it, host=host, catalogue=catalogue, fold=fold)


def _renumber(diag: Diagnosis, top: int) -> Diagnosis:
    """Line numbers of a log read bottom-up back to the log's own."""
    return diag.model_copy(
        update={
            "evidence": [e.model_copy(update={"line": top - e.line}) for e in diag.evidence],
            "context": [e.model_copy(update={"line": top - e.line}) for e in diag.context],
        }
    )


def _diagnose_upright(
    head: list[tuple[int, str]],
    it: Iterable[tuple[int, str]] = (),
    *,
    host: str | None,
    catalogue: CompiledCatalogue | None,
    fold: int | None,
) -> list[Diagnosis]:
    if fold is None:
        fold = _peek_fold([raw for _n, raw in head])
    engine = Engine(catalogue, host=host, fold=fold)
    for n, raw in head:
        engine.feed(n, raw)
    for n, raw in it:
        engine.feed(n, raw)
    engine.flush()
    return engine.results()


def diagnose(
    lines: Iterable[str],
    *,
    host: str | None = None,
    catalogue: CompiledCatalogue | None = None,
    start: int = 1,
) -> list[Diagnosis]:
    """Diagnose a log given as lines (with or without newlines). An empty list: clean."""
    return diagnose_numbered(enumerate(lines, start), host=host, catalogue=catalogue)


def diagnose_text(
    text: str | bytes, *, host: str | None = None, catalogue: CompiledCatalogue | None = None
) -> list[Diagnosis]:
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    return diagnose(text.split("\n"), host=host, catalogue=catalogue)


def diagnoses_exit_code(diagnoses: Iterable[Diagnosis]) -> int:
    """1 when a fatal/error diagnosis was found, else 0 (the ``fleet logs`` contract)."""
    return 1 if any(d.is_problem for d in diagnoses) else 0
