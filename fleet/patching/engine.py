"""The pure patch engine: (original texts, patch set, vLLM version) -> new texts or conflicts.

No I/O happens here: the remote layer fetches the files, this module decides, the remote
layer writes. Rules:

- every edit's anchor must match exactly once inside its scope; zero or several matches
  is a conflict naming the file, the edit, the anchor and the closest candidate lines;
- an edit is recognised as already applied by its marker (``fleet: <set>/<edit id>``)
  occurring exactly once; a file with some edits applied and others not is a conflict;
- the new text must parse (``ast.parse``) and carry every marker exactly once, so that a
  second run finds the file ``already-applied`` and changes nothing;
- any conflict on a host means nothing is written on that host (the caller enforces it
  with :attr:`HostPlan.ok`).
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from itertools import pairwise
from typing import TYPE_CHECKING, Any, Literal

from fleet.errors import UsageError
from fleet.onhost._common import parse_python
from fleet.patching.manifest import Edit, FileSpec, PatchSet
from fleet.patching.versions import Version, VersionRange


def _literal_eval(text: str) -> Any:
    """``ast.literal_eval`` through fleet's one parse lock (see ``parse_python``)."""
    return ast.literal_eval(parse_python(text.lstrip(" \t"), mode="eval"))


if TYPE_CHECKING:
    import jinja2

PatchStatus = Literal[
    "would-apply",
    "applied",
    "already-applied",
    "not-needed",
    "conflict",
    "would-revert",
    "reverted",
]


@lru_cache(maxsize=64)
def sha256_text(text: str) -> str:
    """The sha256 of ``text`` as UTF-8, remembered for the last few texts: a fleet run
    meets the same few files on every host, and each file's digest is asked for several
    times (plan, report, write request)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass
class Candidate:
    """A line of the file that resembles what an anchor expected (1-based line number)."""

    line: int
    text: str
    score: float

    def to_json(self) -> dict[str, Any]:
        return {"line": self.line, "text": self.text, "score": round(self.score, 2)}


@dataclass
class Conflict:
    path: str
    reason: str
    edit: str | None = None
    anchor: str | None = None
    scope: str | None = None
    matches: int | None = None
    candidates: list[Candidate] = field(default_factory=list)
    expected: str | None = None

    def describe(self) -> str:
        where = f"{self.path}"
        if self.edit:
            where += f" [edit {self.edit}"
            where += f" in {self.scope}]" if self.scope else "]"
        text = f"{where}: {self.reason}"
        if self.expected:
            text += f"; expected a line like {self.expected!r}"
        elif self.anchor:
            text += f"; anchor {self.anchor!r}"
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "edit": self.edit,
            "anchor": self.anchor,
            "expected": self.expected,
            "scope": self.scope,
            "matches": self.matches,
            "candidates": [c.to_json() for c in self.candidates],
        }


@dataclass
class FilePlan:
    path: str
    status: PatchStatus
    original: str | None
    new_text: str | None = None
    conflict: Conflict | None = None
    note: str | None = None
    edits: list[str] = field(default_factory=list)

    @property
    def sha256_before(self) -> str | None:
        return sha256_text(self.original) if self.original is not None else None

    @property
    def sha256_after(self) -> str | None:
        if self.new_text is not None:
            return sha256_text(self.new_text)
        return self.sha256_before

    @property
    def changes(self) -> bool:
        return self.new_text is not None and self.new_text != self.original

    def diff(self) -> str:
        """A unified diff (``a/vllm/<path>`` -> ``b/vllm/<path>``); empty if no change."""
        if not self.changes or self.original is None or self.new_text is None:
            return ""
        return unified_diff(self.path, self.original, self.new_text)


def unified_diff(path: str, before: str, after: str) -> str:
    lines = difflib.unified_diff(
        before.splitlines(keepends=True),
        after.splitlines(keepends=True),
        fromfile=f"a/vllm/{path}",
        tofile=f"b/vllm/{path}",
    )
    out = []
    for line in lines:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


@dataclass
class HostPlan:
    patch_set: str
    vllm_version: str
    files: list[FilePlan]
    facts: dict[str, str | None] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(f.status == "conflict" for f in self.files)

    @property
    def conflicts(self) -> list[Conflict]:
        return [f.conflict for f in self.files if f.conflict is not None]

    @property
    def to_write(self) -> list[FilePlan]:
        return [f for f in self.files if f.status == "would-apply" and f.changes]

    def copy(self) -> HostPlan:
        """A copy whose files may be given another status, text or conflict (as one
        host's report does) without changing this plan; the texts are shared."""
        return HostPlan(
            self.patch_set,
            self.vllm_version,
            [replace(f, edits=list(f.edits)) for f in self.files],
            dict(self.facts),
        )

    def write_items(self) -> list[dict[str, str]]:
        """What the remote write script needs per file: new text and both sha256s."""
        return [
            {
                "path": f.path,
                "sha256_before": f.sha256_before or "",
                "text_after": f.new_text or "",
                "sha256_after": f.sha256_after or "",
            }
            for f in self.to_write
        ]


class _Render:
    """The Jinja2 environment shared by every template of a patch set."""

    def __init__(self) -> None:
        import jinja2  # only when a plan is made (a plan kept in the cache needs none)

        env = jinja2.Environment(
            undefined=jinja2.StrictUndefined,
            keep_trailing_newline=True,
            trim_blocks=True,
            lstrip_blocks=True,
            autoescape=False,
        )
        env.filters["csv"] = _csv
        env.filters["literal_eval"] = _literal_eval
        env.filters["pyrepr"] = repr
        env.filters["pystr"] = json.dumps
        self.env = env
        self._templates: dict[tuple[str, str], jinja2.Template] = {}

    def template(self, patch_set: PatchSet, name: str) -> jinja2.Template:
        key = (str(patch_set.directory), name)
        found = self._templates.get(key)
        if found is None:
            found = self._templates[key] = self.env.from_string(patch_set.template_text(name))
        return found

    def condition(self, expr: str, context: Mapping[str, Any]) -> bool:
        import jinja2

        try:
            return bool(self.env.compile_expression(expr)(**context))
        except jinja2.TemplateError as exc:
            raise UsageError(f"bad condition {expr!r} in patch set: {exc}") from None


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


_RENDERS: list[_Render] = []


def _render() -> _Render:
    if not _RENDERS:
        _RENDERS.append(_Render())
    return _RENDERS[0]


# -- scopes and anchors -----------------------------------------------------------------


@lru_cache(maxsize=32)
def _line_starts(text: str) -> list[int]:
    return [0, *(m.end() for m in re.finditer("\n", text))]


@lru_cache(maxsize=32)
def _parse(text: str) -> ast.Module:
    tree: ast.Module = parse_python(text)
    return tree


def _find_scope(tree: ast.Module, dotted: str) -> tuple[ast.AST | None, ast.AST | None, str]:
    """(the node, the deepest enclosing node found, the first missing part)."""
    body: list[ast.stmt] = tree.body
    parent: ast.AST | None = None
    for part in dotted.split("."):
        node: ast.AST | None = None
        for stmt in body:
            if (
                isinstance(stmt, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                and stmt.name == part
            ):
                node = stmt
        if node is None:
            return None, parent, part
        parent = node
        body = node.body  # type: ignore[attr-defined]
    return parent, parent, ""


def _node_span(text: str, node: ast.AST | None) -> tuple[int, int]:
    if node is None:
        return 0, len(text)
    starts = _line_starts(text)
    first = node.lineno  # type: ignore[attr-defined]
    last = node.end_lineno or first  # type: ignore[attr-defined]
    end = starts[last] if last < len(starts) else len(text)
    return starts[first - 1], end


def _scope_span(text: str, scope: str | None) -> tuple[int, int] | Conflict:
    """Character offsets of ``scope`` (from its ``class``/``def`` line to its last line)."""
    if scope is None:
        return 0, len(text)
    node, parent, missing = _find_scope(_parse(text), scope)
    if node is None:
        kind = "class" if missing[:1].isupper() else "def"
        return Conflict(
            "",
            f"scope {scope} not found ({kind} {missing} is missing)",
            scope=scope,
            candidates=closest_lines(text, f"{kind} {missing}(", _node_span(text, parent)),
        )
    return _node_span(text, node)


def _matches(edit: Edit, text: str, start: int, end: int) -> list[re.Match[str] | tuple[int, int]]:
    if edit.anchor_kind == "literal":
        found: list[re.Match[str] | tuple[int, int]] = []
        pos = start
        while True:
            i = text.find(edit.anchor, pos, end)
            if i < 0:
                return found
            found.append((i, i + len(edit.anchor)))
            pos = i + len(edit.anchor)
    pattern = re.compile(edit.anchor, re.MULTILINE)
    return list(pattern.finditer(text, start, end))


def _hint(edit: Edit) -> str:
    if edit.hint:
        return edit.hint
    if edit.anchor_kind == "literal":
        lines = [ln.strip() for ln in edit.anchor.splitlines() if ln.strip()]
        return lines[0] if lines else edit.anchor
    # a readable approximation of a regex: drop groups' names and escapes
    text = re.sub(r"\(\?P<\w+>[^)]*\)", "", edit.anchor)
    text = re.sub(r"\\(.)", r"\1", text)
    return re.sub(r"[\^$]|\[[^\]]*\][*+?]?|\\[sn]", "", text).strip()


def closest_lines(
    text: str, hint: str, span: tuple[int, int] | None = None, n: int = 3
) -> list[Candidate]:
    """The ``n`` lines of ``text`` (inside ``span``) most similar to ``hint`` (difflib)."""
    start, end = span or (0, len(text))
    first_line = text.count("\n", 0, start) + 1
    target = hint.strip()
    scored: list[Candidate] = []
    for offset, line in enumerate(text[start:end].splitlines()):
        stripped = line.strip()
        if not stripped:
            continue
        matcher = difflib.SequenceMatcher(None, target, stripped, autojunk=False)
        if matcher.real_quick_ratio() < 0.3:
            continue
        score = matcher.ratio()
        scored.append(Candidate(first_line + offset, line.rstrip(), score))
    scored.sort(key=lambda c: (-c.score, c.line))
    return scored[:n]


# -- planning ---------------------------------------------------------------------------


def _facts(
    patch_set: PatchSet, texts: Mapping[str, str | None]
) -> tuple[dict[str, str | None], dict[str, Conflict]]:
    facts: dict[str, str | None] = {}
    conflicts: dict[str, Conflict] = {}
    for probe in patch_set.manifest.facts:
        text = texts.get(probe.file)
        if text is None:
            facts[probe.name] = None
            continue
        hits = [
            name for name, regex in probe.choices.items() if re.search(regex, text, re.MULTILINE)
        ]
        if len(hits) == 1:
            facts[probe.name] = hits[0]
            continue
        facts[probe.name] = None
        known = "; ".join(f"{k}: {v}" for k, v in probe.choices.items())
        reason = (
            f"cannot tell the shape of this file for fact {probe.name!r}: "
            + ("none of the known shapes matched" if not hits else f"several matched {hits}")
            + f" ({known})"
        )
        hint = next(iter(probe.choices.values()))
        conflicts[probe.file] = Conflict(
            probe.file,
            reason,
            candidates=closest_lines(text, re.sub(r"\\(.)", r"\1", hint)),
        )
    return facts, conflicts


def _context(version: str, facts: Mapping[str, str | None]) -> dict[str, Any]:
    def version_in(spec: str) -> bool:
        return Version(version) in VersionRange(spec)

    return {"version": version, "facts": dict(facts), "version_in": version_in}


def plan_host(patch_set: PatchSet, vllm_version: str, texts: Mapping[str, str | None]) -> HostPlan:
    """Decide, for every file of the patch set, what applying it would do.

    ``texts`` maps each manifest path to the file's current text, or ``None`` if the file
    does not exist on the host.
    """
    manifest = patch_set.manifest
    plan = HostPlan(patch_set.name, vllm_version, [])
    try:
        version = Version(vllm_version)
    except ValueError:
        return _every_file_conflicts(
            plan, texts, f"cannot parse the vLLM version {vllm_version!r}", files=manifest.files
        )

    if manifest.upstream_since and version in VersionRange(f">={manifest.upstream_since}"):
        note = f"vLLM {vllm_version} has this upstream (since {manifest.upstream_since})"
        for spec in manifest.files:
            plan.files.append(FilePlan(spec.path, "not-needed", texts.get(spec.path), note=note))
        return plan
    if version not in manifest.version_range:
        reason = (
            f"vLLM {vllm_version} is outside the versions this patch set supports "
            f"({manifest.versions})"
        )
        return _every_file_conflicts(plan, texts, reason, files=manifest.files)

    facts, fact_conflicts = _facts(patch_set, texts)
    plan.facts = facts
    context = _context(vllm_version, facts)
    for spec in manifest.files:
        text = texts.get(spec.path)
        if spec.path in fact_conflicts:
            plan.files.append(
                FilePlan(spec.path, "conflict", text, conflict=fact_conflicts[spec.path])
            )
            continue
        plan.files.append(plan_file(patch_set, spec, text, vllm_version, context))
    return plan


def _every_file_conflicts(
    plan: HostPlan, texts: Mapping[str, str | None], reason: str, *, files: list[FileSpec]
) -> HostPlan:
    """The plan with every file of the patch set in conflict for one reason."""
    for spec in files:
        plan.files.append(
            FilePlan(
                spec.path, "conflict", texts.get(spec.path), conflict=Conflict(spec.path, reason)
            )
        )
    return plan


def _selected(edit: Edit | FileSpec, version: str, context: Mapping[str, Any]) -> bool:
    if edit.versions and Version(version) not in VersionRange(edit.versions):
        return False
    return not (edit.when and not _render().condition(edit.when, context))


def plan_file(
    patch_set: PatchSet,
    spec: FileSpec,
    text: str | None,
    vllm_version: str,
    context: Mapping[str, Any],
) -> FilePlan:
    path = spec.path
    if not _selected(spec, vllm_version, context):
        why = f"versions {spec.versions}" if spec.versions else f"condition {spec.when}"
        return FilePlan(path, "not-needed", text, note=f"not needed on vLLM {vllm_version} ({why})")
    if text is None:
        if spec.optional:
            return FilePlan(path, "not-needed", None, note="file absent in this vLLM version")
        return FilePlan(path, "conflict", None, conflict=Conflict(path, "file not found"))
    edits = [e for e in spec.edits if _selected(e, vllm_version, context)]
    if not edits:
        return FilePlan(path, "not-needed", text, note="no edit applies to this version")

    present: list[str] = []
    missing: list[Edit] = []
    for edit in edits:
        recogniser = edit.applied or patch_set.marker(edit)
        count = text.count(recogniser)
        if count > 1:
            return FilePlan(
                path,
                "conflict",
                text,
                conflict=Conflict(
                    path,
                    f"the applied marker {recogniser!r} occurs {count} times",
                    edit=edit.id,
                    scope=edit.scope,
                    candidates=_marker_lines(text, recogniser),
                ),
            )
        if count == 1:
            present.append(edit.id)
        else:
            missing.append(edit)
    if present and missing:
        reason = (
            f"partially applied: edits {', '.join(present)} are present but "
            f"{', '.join(e.id for e in missing)} are not (edited by hand, or another "
            "version of this patch set)"
        )
        return FilePlan(path, "conflict", text, conflict=Conflict(path, reason, edit=missing[0].id))
    if not missing:
        return FilePlan(path, "already-applied", text, edits=present)

    # every anchor is located in the ORIGINAL text (so a conflict names the file's own
    # line numbers); the edits must not overlap, and are spliced in one pass
    splices: list[tuple[int, int, int, str]] = []  # (start, end, manifest order, text)
    for order, edit in enumerate(missing):
        located = _locate(path, edit, text)
        if isinstance(located, Conflict):
            return FilePlan(path, "conflict", text, conflict=located)
        splices.append(_splice(patch_set, edit, text, located, context, order))
    splices.sort(key=lambda s: (s[0], s[1], s[2]))
    for (_, e1, _, _), (s2, _, _, _) in pairwise(splices):
        if s2 < e1:
            raise UsageError(
                f"patch set {patch_set.name}: two edits of {path} overlap (fix the manifest)"
            )
    pieces: list[str] = []
    pos = 0
    for start, end, _, rendered in splices:
        pieces.append(text[pos:start])
        pieces.append(rendered)
        pos = end
    pieces.append(text[pos:])
    new = "".join(pieces)
    try:
        parse_python(new)
    except SyntaxError as exc:
        return FilePlan(
            path,
            "conflict",
            text,
            conflict=Conflict(
                path, f"the patched file would not parse: line {exc.lineno}: {exc.msg}"
            ),
        )
    for edit in missing:
        recogniser = edit.applied or patch_set.marker(edit)
        if new.count(recogniser) != 1:
            raise UsageError(
                f"patch set {patch_set.name}: edit {edit.id} of {path} does not leave exactly "
                f"one {recogniser!r} behind (fix its template)"
            )
    return FilePlan(path, "would-apply", text, new_text=new, edits=[e.id for e in missing])


def _marker_lines(text: str, marker: str) -> list[Candidate]:
    return [
        Candidate(i + 1, line.rstrip(), 1.0)
        for i, line in enumerate(text.splitlines())
        if marker in line
    ][:5]


def _locate(path: str, edit: Edit, text: str) -> re.Match[str] | tuple[int, int] | Conflict:
    """The one match of ``edit``'s anchor inside its scope, or a conflict."""
    try:
        span = _scope_span(text, edit.scope)
    except SyntaxError as exc:
        return Conflict(
            path,
            f"the file does not parse: line {exc.lineno}: {exc.msg}",
            edit=edit.id,
            scope=edit.scope,
        )
    if isinstance(span, Conflict):
        span.path, span.edit, span.anchor = path, edit.id, edit.anchor
        return span
    found = _matches(edit, text, *span)
    if len(found) == 1:
        return found[0]
    if found:
        candidates = [
            Candidate(text.count("\n", 0, _start(m)) + 1, _line_at(text, _start(m)), 1.0)
            for m in found
        ][:5]
        reason = f"anchor matched {len(found)} times (must match exactly once)"
    else:
        candidates = closest_lines(text, _hint(edit), span)
        reason = "anchor not found"
    return Conflict(
        path,
        reason,
        edit=edit.id,
        anchor=edit.anchor,
        scope=edit.scope,
        matches=len(found),
        candidates=candidates,
        expected=_hint(edit),
    )


def _splice(
    patch_set: PatchSet,
    edit: Edit,
    text: str,
    match: re.Match[str] | tuple[int, int],
    context: Mapping[str, Any],
    order: int,
) -> tuple[int, int, int, str]:
    """(start, end, order, replacement) for one located edit."""
    groups: dict[str, str] = {}
    if isinstance(match, re.Match):
        groups = {k: (v or "") for k, v in match.groupdict().items()}
        start, end, matched = match.start(), match.end(), match.group(0)
    else:
        start, end = match
        matched = text[start:end]
    marker = patch_set.marker(edit)
    rendered = (
        _render()
        .template(patch_set, edit.template)
        .render(**context, m=groups, matched=matched, marker=marker, edit_id=edit.id)
    )
    if edit.applied is None and marker not in rendered:
        raise UsageError(
            f"patch set {patch_set.name}: template {edit.template} does not contain "
            f"its marker {marker!r}"
        )
    if edit.action == "insert_before":
        return start, start, order, rendered
    if edit.action == "insert_after":
        return end, end, order, rendered
    return start, end, order, rendered


def _start(match: re.Match[str] | tuple[int, int]) -> int:
    return match.start() if isinstance(match, re.Match) else match[0]


def _line_at(text: str, offset: int) -> str:
    begin = text.rfind("\n", 0, offset) + 1
    end = text.find("\n", offset)
    return text[begin : end if end >= 0 else len(text)].rstrip()
