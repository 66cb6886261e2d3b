"""The remote side of ``fleet patch``: one on-host call per operation, one round trip each;
given a :class:`~fleet.onhost.client.Conversation`, the calls of one host share one
on-host process (fetch, then write).

The on-host script is ``fleet/onhost/patch.py`` (run by :func:`fleet.onhost.client.run_onhost`
with the host's own interpreter); see it for the write protocol (sha256 guard, every new
text compiled by the host's Python first, backups and manifest, temp + fsync + rename,
restore on failure). The answers are validated here with pydantic models.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from fleet.onhost.client import Conversation, M, run_onhost

if TYPE_CHECKING:
    from fleet.transport import Runner

BACKUP_ROOT = "~/.fleet/patches"
FETCH_TIMEOUT = 120.0
WRITE_TIMEOUT = 300.0
# Tests only: fleet copies this LOCAL variable into each write request ("fault"); the
# script honours the request alone, never the host's environment (see onhost/patch.py).
SCRIPT = "patch"


class _Answer(BaseModel):
    model_config = ConfigDict(extra="allow")


class FileAnswer(_Answer):
    exists: bool
    sha256: str | None = None
    text: str | None = None
    error: str | None = None


class FetchAnswer(_Answer):
    package_dir: str
    version: str
    python: str
    python_version: str
    backup_dir: str
    files: dict[str, FileAnswer]
    backup_manifest: dict[str, Any] | None = None
    backups: dict[str, str] = Field(default_factory=dict)


class ApplyAnswer(_Answer):
    ok: bool
    written: list[str] = Field(default_factory=list)
    already: list[str] = Field(default_factory=list)  # written by a concurrent run
    conflicts: list[dict[str, Any]] = Field(default_factory=list)
    compile_errors: list[dict[str, str]] = Field(default_factory=list)
    write_error: str | None = None
    restored: bool | None = None
    restore_errors: list[dict[str, str]] = Field(default_factory=list)
    backup_dir: str | None = None
    pycache_removed: dict[str, list[str]] = Field(default_factory=dict)


class RevertAnswer(_Answer):
    ok: bool
    files: dict[str, dict[str, Any]] = Field(default_factory=dict)
    note: str | None = None


@dataclass
class RemoteFile:
    path: str
    exists: bool
    text: str | None = None
    sha256: str | None = None
    error: str | None = None


@dataclass
class Fetched:
    """What one ``fetch`` round trip learnt about a host."""

    vllm_version: str
    package_dir: str
    python: str
    python_version: str
    backup_dir: str
    files: dict[str, RemoteFile]
    backup_manifest: dict[str, Any] | None = None
    backups: dict[str, str] = field(default_factory=dict)

    def texts(self) -> dict[str, str | None]:
        return {p: (f.text if f.exists else None) for p, f in self.files.items()}


def _ask(via: Runner | Conversation, request: dict[str, Any], answer: type[M], timeout: float) -> M:
    if isinstance(via, Conversation):
        return via.ask(request, answer, timeout=timeout)
    return run_onhost(via, SCRIPT, request, answer, timeout=timeout)


def fetch(
    via: Runner | Conversation,
    patch_set: str,
    paths: list[str],
    *,
    with_backups: bool = False,
    backup_root: str = BACKUP_ROOT,
    texts: bool = True,
) -> Fetched:
    """The files' sha256 (and, with ``texts``, their texts), vLLM's location, the backup
    manifest (and, ``with_backups``, the saved originals)."""
    answer = _ask(
        via,
        {
            "op": "fetch",
            "patch_set": patch_set,
            "files": paths,
            "backup_root": backup_root,
            "with_backups": with_backups,
            "texts": texts,
        },
        FetchAnswer,
        timeout=FETCH_TIMEOUT,
    )
    files = {p: RemoteFile(p, f.exists, f.text, f.sha256, f.error) for p, f in answer.files.items()}
    return Fetched(
        vllm_version=answer.version,
        package_dir=answer.package_dir,
        python=answer.python,
        python_version=answer.python_version,
        backup_dir=answer.backup_dir,
        files=files,
        backup_manifest=answer.backup_manifest,
        backups=answer.backups,
    )


def apply(
    via: Runner | Conversation,
    fetched: Fetched,
    patch_set: str,
    items: list[dict[str, str]],
    *,
    backup_root: str = BACKUP_ROOT,
) -> ApplyAnswer:
    """Write ``items`` (path, sha256_before, text_after, sha256_after): all or none."""
    return _ask(
        via,
        {
            "op": "apply",
            "patch_set": patch_set,
            "files": items,
            "backup_root": backup_root,
            "package_dir": fetched.package_dir,
            "version": fetched.vllm_version,
        },
        ApplyAnswer,
        timeout=WRITE_TIMEOUT,
    )


def revert(
    via: Runner | Conversation,
    fetched: Fetched,
    patch_set: str,
    *,
    force: bool,
    check: bool,
    backup_root: str = BACKUP_ROOT,
) -> RevertAnswer:
    return _ask(
        via,
        {
            "op": "revert",
            "patch_set": patch_set,
            "force": force,
            "check": check,
            "backup_root": backup_root,
            "package_dir": fetched.package_dir,
            "version": fetched.vllm_version,
        },
        RevertAnswer,
        timeout=WRITE_TIMEOUT,
    )
