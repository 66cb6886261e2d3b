"""Patch sets as data: ``templates/patches/<name>/manifest.yaml`` plus Jinja2 templates.

A manifest names the vLLM versions it targets, the version from which upstream vLLM has
the change itself (the patch set is then "not needed"), facts to read from the files
(shapes that differ between versions), and per file an ordered list of anchored edits.
See ``templates/patches/eagle3-deepseek/manifest.yaml`` for the reference example.
"""

from __future__ import annotations

import re
from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fleet.errors import UsageError
from fleet.patching.versions import Version, VersionRange
from fleet.paths import templates_dir
from fleet.safeyaml import InputFileError, load_yaml_file

DEFAULT_PATCH_SET = "eagle3-deepseek"
MAX_MANIFEST_BYTES = 1024 * 1024
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_range(value: str | None) -> str | None:
    """A version range, or the name of one in the table of version families
    (``fleet/onhost/families.py`` ``RANGES``), resolved to its range."""
    from fleet.onhost.families import RANGES

    if value is not None:
        value = RANGES.get(value, value)
        VersionRange(value)  # raises UsageError on a bad range
    return value


def _check_regex(value: str) -> str:
    try:
        re.compile(value, re.MULTILINE)
    except re.error as exc:
        raise ValueError(f"bad regular expression {value!r}: {exc}") from None
    return value


class FactProbe(_Model):
    """A fact read from one file: the name of the one choice whose regex matches.

    The fact is ``None`` when the file does not exist (optional files); when the file
    exists and no choice or several choices match, every file of the host conflicts.
    """

    name: str
    file: str
    description: str = ""
    choices: dict[str, str]

    @field_validator("choices")
    @classmethod
    def _choices(cls, value: dict[str, str]) -> dict[str, str]:
        if not value:
            raise ValueError("a fact needs at least one choice")
        for regex in value.values():
            _check_regex(regex)
        return value


class Edit(_Model):
    """One anchored edit.

    ``anchor`` is a regex (``anchor_kind: regex``, the default, compiled with
    re.MULTILINE) or exact text (``literal``) that must match exactly once inside
    ``scope`` (a dotted class/function path such as ``DeepseekV2Model.forward``, or the
    whole file). ``action`` inserts the rendered ``template`` before or after the match,
    or replaces it. The edit counts as already applied when its marker
    ``fleet: <patch set>/<id>`` (or the ``applied`` text, when given) occurs exactly once.
    ``when`` is a Jinja2 expression over ``facts`` and ``version``; ``versions`` a range.
    """

    id: str
    description: str = ""
    scope: str | None = None
    anchor: str
    anchor_kind: Literal["regex", "literal"] = "regex"
    hint: str | None = None
    action: Literal["insert_before", "insert_after", "replace"]
    template: str
    applied: str | None = None
    when: str | None = None
    versions: str | None = None

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not _NAME_RE.match(value):
            raise ValueError(f"bad edit id {value!r}")
        return value

    @field_validator("versions")
    @classmethod
    def _versions(cls, value: str | None) -> str | None:
        return _check_range(value)

    @model_validator(mode="after")
    def _anchor(self) -> Edit:
        if self.anchor_kind == "regex":
            _check_regex(self.anchor)
        if not self.anchor:
            raise ValueError("empty anchor")
        return self


class FileSpec(_Model):
    """A file of the vLLM package (path relative to the ``vllm/`` directory)."""

    path: str
    description: str = ""
    optional: bool = False
    versions: str | None = None
    when: str | None = None
    edits: list[Edit] = Field(min_length=1)

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        parts = value.split("/")
        if value.startswith("/") or ".." in parts or not value.endswith(".py"):
            raise ValueError(f"bad vLLM file path {value!r}")
        return value

    @field_validator("versions")
    @classmethod
    def _versions(cls, value: str | None) -> str | None:
        return _check_range(value)

    @model_validator(mode="after")
    def _unique_ids(self) -> FileSpec:
        ids = [e.id for e in self.edits]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"duplicate edit ids in {self.path}: {', '.join(dupes)}")
        return self


class Manifest(_Model):
    name: str
    description: str
    versions: str
    upstream_since: str | None = None
    facts: list[FactProbe] = []
    files: list[FileSpec] = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME_RE.match(value):
            raise ValueError(f"bad patch set name {value!r}")
        return value

    @field_validator("versions")
    @classmethod
    def _range(cls, value: str) -> str:
        resolved = _check_range(value)
        assert resolved is not None
        return resolved

    @field_validator("upstream_since")
    @classmethod
    def _since(cls, value: str | None) -> str | None:
        if value is not None:
            Version(value)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        paths = [f.path for f in self.files]
        if len(set(paths)) != len(paths):
            raise ValueError("a file is listed twice")
        names = [f.name for f in self.facts]
        if len(set(names)) != len(names):
            raise ValueError("a fact is listed twice")
        return self

    @cached_property
    def version_range(self) -> VersionRange:
        return VersionRange(self.versions)


class PatchSet:
    """A loaded patch set: the validated manifest and the directory of its templates."""

    def __init__(self, manifest: Manifest, directory: Path) -> None:
        self.manifest = manifest
        self.directory = directory

    @property
    def name(self) -> str:
        return self.manifest.name

    def template_text(self, name: str) -> str:
        path = (self.directory / name).resolve()
        if self.directory.resolve() not in path.parents or not path.is_file():
            raise UsageError(f"patch set {self.name}: template {name!r} not found")
        return path.read_text(encoding="utf-8")

    def marker(self, edit: Edit) -> str:
        return f"fleet: {self.name}/{edit.id}"


def patches_root() -> Path:
    return templates_dir() / "patches"


def available_patch_sets(root: Path | None = None) -> list[str]:
    base = root or patches_root()
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if (p / "manifest.yaml").is_file())


def load_patch_set(name: str = DEFAULT_PATCH_SET, root: Path | None = None) -> PatchSet:
    """Load and validate ``<root>/<name>/manifest.yaml``; an unknown name is a UsageError."""
    base = root or patches_root()
    if not _NAME_RE.match(name) or not (base / name / "manifest.yaml").is_file():
        known = ", ".join(available_patch_sets(base)) or "none"
        raise UsageError(f"unknown patch set {name!r} (available: {known})")
    directory = base / name
    path = directory / "manifest.yaml"
    try:
        data = load_yaml_file(path, max_bytes=MAX_MANIFEST_BYTES, what="patch set manifest")
    except InputFileError as exc:
        raise UsageError(str(exc)) from None
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise UsageError(f"{path}: {where}: {first.get('msg')}") from None
    if manifest.name != name:
        raise UsageError(f"{path}: name {manifest.name!r} differs from its directory {name!r}")
    patch_set = PatchSet(manifest, directory)
    for spec in manifest.files:
        for edit in spec.edits:
            patch_set.template_text(edit.template)  # every template exists
    return patch_set
