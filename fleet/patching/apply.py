"""``fleet patch`` on one host: fetch, plan with the pure engine, then write or revert.

Each function takes an open :class:`~fleet.transport.HostConnection` and returns a
:class:`HostReport` (the per-host part of ``fleet patch --json``). Conflicts are results,
not exceptions: the report says ``ok: false`` and nothing was written on that host.
Transport faults raise (``ConnectError`` -> unreachable, ``OperationFailed`` -> failed).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from fleet.errors import OperationFailed
from fleet.localfiles import atomic_write
from fleet.onhost.client import Conversation
from fleet.patching import host_calls
from fleet.patching.engine import (
    Conflict,
    FilePlan,
    HostPlan,
    PatchStatus,
    plan_host,
    sha256_text,
    unified_diff,
)
from fleet.patching.manifest import PatchSet
from fleet.transport.outcome import Verdict

if TYPE_CHECKING:
    from fleet.transport import Runner

log = logging.getLogger(__name__)

Mode = Literal["apply", "check", "revert", "revert-check"]

# Worst first: the status that sums up a host is the first of these that any file has.
HOST_STATUS_ORDER: tuple[PatchStatus, ...] = (
    "conflict",
    "would-apply",
    "would-revert",
    "applied",
    "reverted",
    "already-applied",
    "not-needed",
)


@dataclass
class FileReport:
    path: str
    status: PatchStatus
    sha256_before: str | None
    sha256_after: str | None
    note: str | None = None
    conflict: Conflict | None = None
    diff: str | None = None
    edits: list[str] = field(default_factory=list)

    def to_json(self, with_diff: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "path": self.path,
            "status": self.status,
            "sha256_before": self.sha256_before,
            "sha256_after": self.sha256_after,
        }
        if self.edits:
            out["edits"] = self.edits
        if self.note:
            out["note"] = self.note
        if self.conflict is not None:
            out["conflict"] = self.conflict.to_json()
        if with_diff:
            out["diff"] = self.diff or ""
        return out


@dataclass
class HostReport:
    host: str
    patch_set: str
    mode: Mode
    vllm_version: str
    package_dir: str
    files: list[FileReport]
    ok: bool
    message: str | None = None
    backup_dir: str | None = None
    facts: dict[str, str | None] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return any(f.status in ("applied", "reverted") for f in self.files)

    @property
    def status(self) -> PatchStatus:
        """One word for the host: its worst file status (``not-needed`` when every file
        is)."""
        seen = {f.status for f in self.files}
        return next((s for s in HOST_STATUS_ORDER if s in seen), "not-needed")

    def verdict(self) -> Verdict:
        """failed/patch-conflict when nothing could be written, changed when a file was
        written or restored, else ok."""
        if not self.ok:
            return Verdict("failed", "patch-conflict", self.message or "conflict")
        return Verdict("changed" if self.changed else "ok")

    def to_json(self, with_diff: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ok": self.ok,
            "vllm_version": self.vllm_version,
            "patch": self.patch_set,
            "mode": self.mode,
            "package_dir": self.package_dir,
            "files": [f.to_json(with_diff) for f in self.files],
        }
        if self.backup_dir:
            out["backup_dir"] = self.backup_dir
        if self.facts:
            out["facts"] = self.facts
        if self.message:
            out["message"] = self.message
        return out


_PLAN_CACHE: dict[tuple[str, str, str, tuple[tuple[str, str | None], ...]], HostPlan] = {}
_PLAN_LOCKS: dict[tuple[str, str, str, tuple[tuple[str, str | None], ...]], threading.Lock] = {}
_PLAN_GUARD = threading.Lock()


def _plan_cache_key(
    patch_set: PatchSet, fetched: host_calls.Fetched
) -> tuple[str, str, str, tuple[tuple[str, str | None], ...]]:
    return (
        str(patch_set.directory),
        patch_set.name,
        fetched.vllm_version,
        tuple(sorted((p, f.sha256 if f.exists else None) for p, f in fetched.files.items())),
    )


def _plan_lock(key: tuple[Any, ...]) -> threading.Lock:
    with _PLAN_GUARD:
        return _PLAN_LOCKS.setdefault(key, threading.Lock())


def _faithful(fetched: host_calls.Fetched) -> bool:
    """Every text is the one its sha256 names: only such a plan may be kept, since a later
    host that reports the same sha256 is planned by it without sending its text."""
    return all(
        f.text is not None and f.sha256 == sha256_text(f.text)
        for f in fetched.files.values()
        if f.exists and not f.error
    )


def _kept(patch_set: PatchSet, key: tuple[Any, ...]) -> HostPlan | None:
    """The plan kept under ``key`` (this run's, else a stored one); the caller holds the
    key's lock."""
    plan = _PLAN_CACHE.get(key)
    if plan is None:
        plan = _stored_plan(patch_set, key)
        if plan is not None:
            _PLAN_CACHE[key] = plan
    return plan


def known_plan(patch_set: PatchSet, fetched: host_calls.Fetched) -> HostPlan | None:
    """The plan of these files (by their sha256 alone: ``fetched`` may have no texts) if
    this run or an earlier one made it, else None."""
    key = _plan_cache_key(patch_set, fetched)
    with _plan_lock(key):
        plan = _kept(patch_set, key)
    log.debug("%s on vLLM %s: %s", patch_set.name, fetched.vllm_version,
              "plan of these files kept: their texts are not fetched" if plan is not None
              else "no plan of these files yet: fetching their texts")  # fmt: skip
    return plan.copy() if plan is not None else None


def cached_plan(patch_set: PatchSet, fetched: host_calls.Fetched) -> HostPlan:
    """``plan_host`` once per distinct (patch set, vLLM version, file contents) in this
    process: a fleet of identical hosts is planned once, not once per host. ``fetched``
    has the texts; a plan of texts that do not match their sha256 is not kept."""
    key = _plan_cache_key(patch_set, fetched)
    with _plan_lock(key):
        plan = _kept(patch_set, key)
        if plan is None:
            plan = plan_host(patch_set, fetched.vllm_version, fetched.texts())
            log.debug("%s on vLLM %s: planned %d files", patch_set.name, fetched.vllm_version,
                      len(plan.files))  # fmt: skip
            if not _faithful(fetched):
                log.info("%s: a fetched text does not match its sha256: plan not kept",
                         patch_set.name)  # fmt: skip
                return plan
            _store_plan(patch_set, key, plan)
            _PLAN_CACHE[key] = plan
        else:
            log.debug("%s on vLLM %s: plan of these files kept: reused (%d files)",
                      patch_set.name, fetched.vllm_version, len(plan.files))  # fmt: skip
    return plan.copy()


# Plans kept across runs (``fleet patch --check`` then an apply then a no-op apply plan
# the same files three times): DIR/plans/<sha256>.pickle in fleet's cache, keyed by the
# patch set's files (manifest and templates), the engine's own source, the vLLM version
# and the sha256 of every fetched file. Written by rename; read only when ours and 0600.
PLAN_CACHE_FORMAT = 1
_ENGINE_MODULES = ("engine.py", "manifest.py", "versions.py", "apply.py")


def _plan_key(patch_set: PatchSet, key: tuple[Any, ...]) -> str | None:
    import hashlib
    from pathlib import Path

    digest = hashlib.sha256(repr((PLAN_CACHE_FORMAT, key[1:])).encode())
    try:
        here = Path(__file__).resolve().parent
        for name in _ENGINE_MODULES:
            digest.update(name.encode() + b"\0" + (here / name).read_bytes())
        for path in sorted(p for p in Path(patch_set.directory).rglob("*") if p.is_file()):
            rel = str(path.relative_to(patch_set.directory)).encode()
            digest.update(rel + b"\0" + path.read_bytes())
    except OSError:
        return None
    return digest.hexdigest()


def _plan_path(digest: str) -> Any:
    from fleet.paths import cache_dir

    return cache_dir() / "plans" / f"{digest}.pickle"


def _stored_plan(patch_set: PatchSet, key: tuple[Any, ...]) -> HostPlan | None:
    import os
    import pickle

    digest = _plan_key(patch_set, key)
    if digest is None:
        return None
    path = _plan_path(digest)
    try:
        st = os.lstat(path)
        if st.st_uid != os.getuid() or st.st_mode & 0o077 or not (st.st_mode & 0o100000):
            return None
        with open(path, "rb") as fh:
            plan = pickle.load(fh)
    except Exception:
        return None
    return plan if isinstance(plan, HostPlan) else None


def _store_plan(patch_set: PatchSet, key: tuple[Any, ...], plan: HostPlan) -> None:
    import pickle

    digest = _plan_key(patch_set, key)
    if digest is None:
        return
    try:
        atomic_write(_plan_path(digest), pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL))
    except OSError:  # a read-only cache costs a new plan next time, nothing else
        pass


def _from_plan(f: FilePlan, with_diff: bool) -> FileReport:
    return FileReport(
        path=f.path,
        status=f.status,
        sha256_before=f.sha256_before,
        sha256_after=f.sha256_after,
        note=f.note,
        conflict=f.conflict,
        diff=f.diff() if with_diff else None,
        edits=list(f.edits),
    )


def _undecodable(fetched: host_calls.Fetched, plan: HostPlan) -> None:
    for f in plan.files:
        remote_file = fetched.files.get(f.path)
        if remote_file is not None and remote_file.error:
            f.status, f.new_text = "conflict", None
            f.conflict = Conflict(f.path, remote_file.error)


def apply_host(
    conn: Runner,
    patch_set: PatchSet,
    *,
    check: bool = False,
    with_diff: bool = False,
    backup_root: str = host_calls.BACKUP_ROOT,
) -> HostReport:
    """Plan the patch set on the host's real files and, unless ``check``, write it: one
    on-host process reads the files, waits while they are planned here, then writes."""
    with Conversation(conn, host_calls.SCRIPT) as talk:
        return _apply_host(talk, patch_set, check, with_diff, backup_root)


def _apply_host(
    talk: Conversation, patch_set: PatchSet, check: bool, with_diff: bool, backup_root: str
) -> HostReport:
    conn = talk.conn
    paths = [f.path for f in patch_set.manifest.files]
    # the files' sha256 first: when they name a plan already made (another host of this
    # run, or an earlier run), the texts need not cross the network; else ask for them
    fetched = host_calls.fetch(talk, patch_set.name, paths, backup_root=backup_root, texts=False)
    plan = known_plan(patch_set, fetched)
    if plan is None:
        fetched = host_calls.fetch(talk, patch_set.name, paths, backup_root=backup_root)
        plan = cached_plan(patch_set, fetched)
    _undecodable(fetched, plan)
    # the sha256 the host reported must be the text the engine saw
    for f in plan.files:
        rf = fetched.files[f.path]
        if rf.text is not None and rf.sha256 != sha256_text(rf.text):
            f.status, f.new_text = "conflict", None
            f.conflict = Conflict(f.path, "the file is not stored as plain UTF-8 text")
    report = HostReport(
        host=conn.host.name,
        patch_set=patch_set.name,
        mode="check" if check else "apply",
        vllm_version=fetched.vllm_version,
        package_dir=fetched.package_dir,
        files=[_from_plan(f, with_diff) for f in plan.files],
        ok=plan.ok,
        facts=plan.facts,
    )
    if fetched.backup_manifest is not None:
        report.backup_dir = fetched.backup_dir
    if not plan.ok:
        report.message = "; ".join(c.describe() for c in plan.conflicts) + " (nothing written)"
        return report
    if check or not plan.to_write:
        return report

    items = plan.write_items()
    result = host_calls.apply(talk, fetched, patch_set.name, items, backup_root=backup_root)
    if result.write_error:
        raise write_failed(conn.host.name, result)
    by_path = {r.path: r for r in report.files}
    if result.ok:
        report.backup_dir = result.backup_dir or fetched.backup_dir
        for path in result.written:
            by_path[path].status = "applied"
        for path in result.already:  # a concurrent run applied the same patch meanwhile
            by_path[path].status = "already-applied"
        return report
    report.ok = False
    for c in result.conflicts:
        r = by_path[c["path"]]
        r.status = "conflict"
        r.conflict = Conflict(c["path"], "the file changed on the host while it was patched")
        r.sha256_after = r.sha256_before
    for e in result.compile_errors:
        r = by_path[e["path"]]
        r.status = "conflict"
        r.conflict = Conflict(
            e["path"], f"the host's Python cannot compile the new text: {e['error']}"
        )
    for r in report.files:
        if r.status == "would-apply":
            r.sha256_after = r.sha256_before  # not written
    if result.restore_errors:
        raise write_failed(conn.host.name, result)
    what = "the originals were restored" if result.restored else "nothing written"
    report.message = (
        "; ".join(r.conflict.describe() for r in report.files if r.conflict is not None)
        + f" ({what})"
    )
    return report


def write_failed(host: str, result: host_calls.ApplyAnswer) -> OperationFailed:
    """The one-line failure of an apply the host had to undo (or could not fully undo)."""
    why = result.write_error or "; ".join(
        f"{e['path']}: the host's Python cannot compile it: {e['error']}"
        for e in result.compile_errors
    )
    unrestored = result.restore_errors
    if not unrestored:
        return OperationFailed(
            f"{host}: writing the patch failed ({why}); every file was put back as it was, "
            "nothing is patched",
            code="patch-write-failed",
        )
    names = ", ".join(f"{e['path']} ({e['error']})" for e in unrestored)
    return OperationFailed(
        f"{host}: writing the patch failed ({why}) and could not restore {names}; "
        f"the originals are kept in {result.backup_dir}",
        hint="fix the cause on the host, then run 'fleet patch --revert' on it",
        code="patch-write-failed",
    )


def revert_host(
    conn: Runner,
    patch_set: PatchSet,
    *,
    force: bool = False,
    check: bool = False,
    with_diff: bool = False,
    backup_root: str = host_calls.BACKUP_ROOT,
) -> HostReport:
    """Restore the byte-identical originals kept on the host by an earlier apply (one
    on-host process reads, then restores)."""
    paths = [f.path for f in patch_set.manifest.files]
    with Conversation(conn, host_calls.SCRIPT) as talk:
        fetched = host_calls.fetch(
            talk, patch_set.name, paths, with_backups=with_diff, backup_root=backup_root
        )
        result = host_calls.revert(
            talk,
            fetched,
            patch_set.name,
            force=force,
            check=check or with_diff,
            backup_root=backup_root,
        )
    done: dict[str, dict[str, Any]] = result.files
    files: list[FileReport] = []
    for path in [*paths, *sorted(set(done) - set(paths))]:
        rf = fetched.files.get(path)
        current = rf.sha256 if rf is not None and rf.exists else None
        entry = done.get(path)
        if entry is None:
            note = result.note or "not patched by fleet on this host"
            files.append(FileReport(path, "not-needed", current, current, note=note))
            continue
        status: PatchStatus = entry["status"]
        after = entry["sha256_before"] if status in ("reverted", "would-revert") else current
        report_file = FileReport(path, status, current, after, note=entry.get("reason"))
        if status == "conflict":
            report_file.conflict = Conflict(path, entry.get("reason") or "cannot revert")
        if entry.get("forced"):
            report_file.note = "forced: the file had changed since it was patched"
        if entry.get("compile_error"):
            report_file.note = (
                f"restored, but the host's Python cannot compile it: {entry['compile_error']}"
            )
        if with_diff and status in ("reverted", "would-revert") and rf and rf.text is not None:
            original = fetched.backups.get(path)
            report_file.diff = unified_diff(path, rf.text, original) if original else ""
        files.append(report_file)
    ok = result.ok
    report = HostReport(
        host=conn.host.name,
        patch_set=patch_set.name,
        mode="revert-check" if (check or with_diff) else "revert",
        vllm_version=fetched.vllm_version,
        package_dir=fetched.package_dir,
        files=files,
        ok=ok,
        backup_dir=fetched.backup_dir if fetched.backup_manifest is not None else None,
    )
    if not ok:
        report.message = (
            "; ".join(f.conflict.describe() for f in files if f.conflict is not None)
            + " (nothing reverted)"
        )
    return report
