# fleet patch script: runs ON THE HOST in a bundle (see _common.py); never imports vllm.
#
# Operations (request["op"]):
#   fetch   locate vLLM (find_spec / importlib.metadata, no import), read the target
#           files: sha256 + text (the text only if request["texts"], default true: fleet
#           asks for the sha256 first and for the texts only when it has no plan for
#           them); the backup manifest of this patch set if any.
#   apply   write new texts, all files or none: check every sha256 first and compile
#           every new text with this interpreter (the host's), or write nothing; back up
#           each original and a manifest (sha256 before/after, patch set, vLLM version,
#           time) in ~/.fleet/patches/<patch set>/<vLLM version>-<id of the package dir>/;
#           write a temp file in the target's directory, fsync, rename; drop stale
#           __pycache__.
#   revert  restore the byte-identical originals from the backup; refuses a file that
#           changed since the patch unless "force".
#
# A dropped SSH connection must not leave a half-written host: SIGHUP is ignored while
# writing, every replacement is a rename of a complete, fsynced file, and the backup and
# manifest are written before the first target is touched. A target that is a symlink
# (inside the vLLM tree) is written through: the file it points to is replaced, the link
# stays, and revert restores that file.
# Any exception while writing, compiling or recording (a rename fails, the disk or /tmp is
# full) restores every file already replaced, the same way, and answers a clear failure.
# The named points of a write (`checkpoint`) do nothing in fleet; the tests' fault harness
# (tests/faults.py) rebinds them in the bundle it sends to stop a write there. Neither the
# request nor the host's environment can inject a fault.
import hashlib
import json
import os
import time
from typing import Any, Dict, List, Optional, Tuple

from fleet.onhost._common import Refused, hold_on_hangup, inside, loads, locate_vllm
from fleet.onhost.files import (
    FileLock,
    drop_stale_temps,
    fsync_dir,
    rename_temp,
    replace_file,
    unlink_quietly,
    write_temp,
)

PATCH_SCHEMA = 1
LOCK_TIMEOUT = 120.0


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        return None


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def checkpoint(point: str) -> None:
    """A named point of a write (after-lock, after-backup, after-temp, after-first-rename,
    after-rename, before-manifest): nothing happens here. The tests' fault harness
    (tests/faults.py) rebinds this name in the bundle it sends, to stop, pause or fail a
    write at that point; fleet itself never does."""


# -- locating files ------------------------------------------------------------------


def target_path(package_dir: str, relpath: str) -> str:
    """The file to read and replace for `relpath`: inside the vLLM package (symlinks
    followed, and refused when they leave it), a .py file."""
    if not relpath.endswith(".py"):
        raise Refused("bad path " + repr(relpath), "path-escapes-tree")
    inside(package_dir, relpath)
    return os.path.realpath(os.path.join(package_dir, *relpath.split("/")))


def backup_dir(root: str, patch_set: str, version: str, package_dir: str) -> str:
    if not patch_set or "/" in patch_set or patch_set.startswith("."):
        raise Refused("bad patch set name " + repr(patch_set), "bad-request")
    safe_version = "".join(c if c.isalnum() or c in ".+-_" else "_" for c in version)
    env_id = hashlib.sha256(package_dir.encode("utf-8")).hexdigest()[:12]
    return os.path.join(os.path.expanduser(root), patch_set, f"{safe_version}-{env_id}")


def _load_manifest(directory: str) -> Optional[Dict[str, Any]]:
    data = _read(os.path.join(directory, "manifest.json"))
    if data is None:
        return None
    return loads(data)


def _write_json(path: str, obj: Any) -> None:
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    replace_file(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8"))


def _history(root: str, record: Dict[str, Any]) -> None:
    path = os.path.join(os.path.expanduser(root), "history.jsonl")
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def _patch_lock(root: str) -> FileLock:
    """One fleet write of vLLM's files per host at a time (the lock under the backup root)."""
    path = os.path.join(os.path.expanduser(root), ".lock")
    return FileLock(path, LOCK_TIMEOUT, "another fleet patch holds the lock on this host")


def _compile(data: bytes, path: str) -> Optional[str]:
    """Compile ``data`` (the text of ``path``) as this interpreter (the host's) imports it,
    as py_compile does, without writing byte code; the error in one line, or None."""
    try:
        compile(data, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return "%s: %s (line %s)" % (type(exc).__name__, exc.msg, exc.lineno)
    except Exception as exc:  # ValueError (a NUL byte), RecursionError, MemoryError
        return "%s: %s" % (type(exc).__name__, exc)
    return None


def _drop_pycache(path: str) -> List[str]:
    directory, name = os.path.split(path)
    stem = name[:-3]
    removed = []
    cache = os.path.join(directory, "__pycache__")
    try:
        entries = os.listdir(cache)
    except OSError:
        entries = []
    for entry in entries:
        if entry.startswith(stem + ".") and entry.endswith((".pyc", ".pyo")):
            try:
                os.unlink(os.path.join(cache, entry))
                removed.append(os.path.join("__pycache__", entry))
            except OSError:
                pass
    for legacy in (path + "c", path + "o"):
        if os.path.exists(legacy):
            try:
                os.unlink(legacy)
                removed.append(os.path.basename(legacy))
            except OSError:
                pass
    return removed


# -- operations ---------------------------------------------------------------------------


def op_fetch(request: Dict[str, Any]) -> Dict[str, Any]:
    where = locate_vllm()
    package_dir = where["package_dir"]
    files = {}
    for relpath in request.get("files", []):
        path = target_path(package_dir, relpath)
        data = _read(path)
        if data is None:
            files[relpath] = {"exists": False}
            continue
        entry: Dict[str, Any] = {"exists": True, "sha256": _sha(data)}
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            entry["error"] = f"not UTF-8: {exc}"
        else:
            if request.get("texts", True):  # fleet may know the text by its sha256
                entry["text"] = text
        files[relpath] = entry
    directory = backup_dir(
        request["backup_root"], request["patch_set"], where["version"], package_dir
    )
    manifest = _load_manifest(directory)
    backups = {}
    if manifest is not None and request.get("with_backups"):
        for relpath in manifest.get("files", {}):
            data = _read(os.path.join(directory, "originals", *relpath.split("/")))
            if data is not None:
                backups[relpath] = data.decode("utf-8", errors="replace")
    return dict(where, files=files, backup_dir=directory, backup_manifest=manifest, backups=backups)


def _check_location(request: Dict[str, Any]) -> Dict[str, Any]:
    where = locate_vllm()
    if where["package_dir"] != request["package_dir"] or where["version"] != request["version"]:
        raise Refused(
            "vLLM changed since it was read: now %s at %s"
            % (where["version"], where["package_dir"]),
            "vllm-changed",
        )
    return where


def op_apply(request: Dict[str, Any]) -> Dict[str, Any]:
    hold_on_hangup()
    where = _check_location(request)
    package_dir = where["package_dir"]
    root = request["backup_root"]
    directory = backup_dir(root, request["patch_set"], where["version"], package_dir)
    items = request["files"]
    with _patch_lock(root):
        checkpoint("after-lock")
        for item in items:  # temp files left by a run that was killed
            drop_stale_temps(target_path(package_dir, item["path"]))
        # 1. every file still has the sha256 that was read, or nothing is written
        originals: Dict[str, bytes] = {}
        news: Dict[str, bytes] = {}
        conflicts = []
        for item in items:
            path = target_path(package_dir, item["path"])
            data = _read(path)
            actual = _sha(data) if data is not None else None
            if actual != item["sha256_before"]:
                conflicts.append(
                    {"path": item["path"], "expected": item["sha256_before"], "actual": actual}
                )
            elif data is not None:
                originals[item["path"]] = data
            new = item["text_after"].encode("utf-8")
            if _sha(new) != item["sha256_after"]:
                raise Refused(item["path"] + ": the new text was damaged in transit", "bad-request")
            news[item["path"]] = new
        if conflicts:
            after = {item["path"]: item["sha256_after"] for item in items}
            if all(c["actual"] == after[c["path"]] for c in conflicts) and len(conflicts) == len(
                items
            ):
                # another fleet run wrote exactly this patch meanwhile (it held the lock)
                return {"ok": True, "written": [], "already": sorted(after)}
            return {"ok": False, "conflicts": conflicts, "written": []}
        # the host's interpreter must compile every new text, or nothing is written
        errors = []
        for item in items:
            path = target_path(package_dir, item["path"])
            message = _compile(news[item["path"]], path)
            if message:
                errors.append({"path": item["path"], "error": message})
        if errors:
            return {"ok": False, "compile_errors": errors, "written": []}

        # 2. backups of the originals and the manifest, before any target is touched
        manifest = _load_manifest(directory) or {
            "schema": PATCH_SCHEMA,
            "patch_set": request["patch_set"],
            "vllm_version": where["version"],
            "package_dir": package_dir,
            "python": where["python"],
            "created": _now(),
            "files": {},
        }
        for item in items:
            relpath = item["path"]
            backup = os.path.join(directory, "originals", *relpath.split("/"))
            os.makedirs(os.path.dirname(backup), mode=0o700, exist_ok=True)
            existing = _read(backup)
            if existing is None or _sha(existing) != item["sha256_before"]:
                replace_file(backup, originals[relpath])
            manifest["files"][relpath] = {
                "sha256_before": item["sha256_before"],
                "sha256_after": item["sha256_after"],
                "state": "pending",
                "time": _now(),
            }
        manifest["updated"] = _now()
        _write_json(os.path.join(directory, "manifest.json"), manifest)
        checkpoint("after-backup")

        # 3.-4. from the first temp file to the history line, any exception (a rename
        # fails, the disk is full) restores every file already replaced
        replaced: List[str] = []
        try:
            dropped = _write_and_record(request, where, directory, manifest, news, replaced)
        except BaseException as exc:
            failed = _undo(package_dir, directory, manifest, items, replaced, originals)
            if not isinstance(exc, Exception):
                raise
            return {
                "ok": False,
                "written": [],
                "write_error": f"{type(exc).__name__}: {exc}",
                "restored": not failed,
                "restore_errors": failed,
                "backup_dir": directory,
            }
    return {
        "ok": True,
        "written": [i["path"] for i in items],
        "pycache_removed": dropped,
        "backup_dir": directory,
    }


def _write_and_record(
    request: Dict[str, Any],
    where: Dict[str, Any],
    directory: str,
    manifest: Dict[str, Any],
    news: Dict[str, bytes],
    replaced: List[str],
) -> Dict[str, List[str]]:
    """Steps 3-4 of ``apply``; appends to ``replaced`` each path as soon as it is renamed.
    Returns the stale byte code removed, by path."""
    package_dir = where["package_dir"]
    root = request["backup_root"]
    items = request["files"]
    # 3. complete, fsynced temp files next to every target; then the renames
    temps: List[Tuple[str, str, str]] = []
    try:
        for item in items:
            path = target_path(package_dir, item["path"])
            tmp = write_temp(path, news[item["path"]], path)
            temps.append((item["path"], tmp, path))
        checkpoint("after-temp")
        for relpath, tmp, path in temps:
            rename_temp(tmp, path)
            replaced.append(relpath)
            fsync_dir(os.path.dirname(path))
            if len(replaced) == 1:
                checkpoint("after-first-rename")
    finally:
        for relpath, tmp, _path in temps:
            if relpath not in replaced:
                unlink_quietly(tmp)
    checkpoint("after-rename")

    # 4. stale bytecode, the manifest, the history
    dropped = {}
    for item in items:
        path = target_path(package_dir, item["path"])
        dropped[item["path"]] = _drop_pycache(path)
        manifest["files"][item["path"]]["state"] = "applied"
    checkpoint("before-manifest")
    manifest["updated"] = _now()
    _write_json(os.path.join(directory, "manifest.json"), manifest)
    _history(
        root,
        {
            "time": _now(),
            "op": "apply",
            "patch_set": request["patch_set"],
            "vllm_version": where["version"],
            "package_dir": package_dir,
            "files": {i["path"]: [i["sha256_before"], i["sha256_after"]] for i in items},
        },
    )
    return dropped


def _undo(
    package_dir: str,
    directory: str,
    manifest: Dict[str, Any],
    items: List[Dict[str, Any]],
    replaced: List[str],
    originals: Dict[str, bytes],
) -> List[Dict[str, str]]:
    """Put back every original in ``replaced`` (temp + fsync + rename, like any write),
    drop their bytecode, and forget this apply in the manifest. Returns the files that
    could not be restored: they stay in the manifest (pending), so --revert finds them."""
    failed: List[Dict[str, str]] = []
    for relpath in replaced:
        path = target_path(package_dir, relpath)
        try:
            replace_file(path, originals[relpath], path)
        except Exception as exc:
            failed.append({"path": relpath, "error": f"{type(exc).__name__}: {exc}"})
        _drop_pycache(path)
    unrestored = {f["path"] for f in failed}
    for item in items:
        if item["path"] not in unrestored:
            manifest["files"].pop(item["path"], None)
    try:
        _finish_manifest(directory, manifest)
    except Exception:
        pass  # the manifest on disk still lists these files as pending: --revert copes
    return failed


def _finish_manifest(directory: str, manifest: Dict[str, Any]) -> None:
    """Write the manifest, or remove the backup directory when no file is left in it."""
    if manifest["files"]:
        manifest["updated"] = _now()
        _write_json(os.path.join(directory, "manifest.json"), manifest)
        return
    import shutil

    shutil.rmtree(directory, ignore_errors=True)
    parent = os.path.dirname(directory)
    try:
        os.rmdir(parent)  # the patch set's directory, if empty
    except OSError:
        pass


def _revert_plan(
    directory: str, package_dir: str, manifest: Dict[str, Any], force: bool
) -> Tuple[Dict[str, Dict[str, Any]], List[Tuple[str, str, bytes]]]:
    results: Dict[str, Dict[str, Any]] = {}
    restore: List[Tuple[str, str, bytes]] = []
    for relpath, entry in sorted(manifest["files"].items()):
        path = target_path(package_dir, relpath)
        current = _read(path)
        current_sha = _sha(current) if current is not None else None
        backup = _read(os.path.join(directory, "originals", *relpath.split("/")))
        result: Dict[str, Any] = {
            "sha256_current": current_sha,
            "sha256_before": entry["sha256_before"],
            "sha256_after": entry["sha256_after"],
        }
        results[relpath] = result
        if backup is None or _sha(backup) != entry["sha256_before"]:
            result.update(status="conflict", reason="the backup is missing or damaged")
        elif current_sha == entry["sha256_before"]:
            result.update(status="not-needed", reason="already the original")
        elif current_sha == entry["sha256_after"] or force:
            result.update(status="reverted")
            if current_sha != entry["sha256_after"]:
                result["forced"] = True
            restore.append((relpath, path, backup))
        else:
            result.update(
                status="conflict",
                reason="changed since it was patched (use --force to restore anyway)",
            )
    return results, restore


def op_revert(request: Dict[str, Any]) -> Dict[str, Any]:
    hold_on_hangup()
    where = _check_location(request)
    package_dir = where["package_dir"]
    root = request["backup_root"]
    force = bool(request.get("force"))
    directory = backup_dir(root, request["patch_set"], where["version"], package_dir)
    if _load_manifest(directory) is None:
        return {"ok": True, "files": {}, "note": "no backup of this patch set on this host"}
    if request.get("check"):  # read-only: no lock, nothing written
        results, _ = _revert_plan(directory, package_dir, _load_manifest(directory) or {}, force)
        for r in results.values():
            if r["status"] == "reverted":
                r["status"] = "would-revert"
        return {
            "ok": not any(r["status"] == "conflict" for r in results.values()),
            "files": results,
        }
    with _patch_lock(root):
        checkpoint("after-lock")
        manifest = _load_manifest(directory)
        if manifest is None:
            return {"ok": True, "files": {}, "note": "no backup of this patch set on this host"}
        results, restore = _revert_plan(directory, package_dir, manifest, force)
        if any(r["status"] == "conflict" for r in results.values()):
            for r in results.values():  # all files or none
                if r["status"] == "reverted":
                    r["status"] = "would-revert"
            return {"ok": False, "files": results}
        for n, (_relpath, path, data) in enumerate(restore):
            replace_file(path, data, path if os.path.exists(path) else None)
            if n == 0:
                checkpoint("after-first-rename")
        for relpath, path, data in restore:
            message = _compile(data, path)
            if message:
                results[relpath]["compile_error"] = message
            results[relpath]["pycache_removed"] = _drop_pycache(path)
        for relpath, result in results.items():
            if result["status"] in ("reverted", "not-needed"):
                del manifest["files"][relpath]
        _finish_manifest(directory, manifest)
        _history(
            root,
            {
                "time": _now(),
                "op": "revert",
                "patch_set": request["patch_set"],
                "vllm_version": where["version"],
                "package_dir": package_dir,
                "files": {p: r["status"] for p, r in results.items()},
            },
        )
    return {"ok": True, "files": results}


OPS = {"fetch": op_fetch, "apply": op_apply, "revert": op_revert}
