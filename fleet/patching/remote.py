"""The remote side of ``fleet patch``: one command per operation, one round trip each.

The script ``remote_patch.py`` (a package resource, Python 3.8+, stdlib only) is sent on
stdin to the host's own interpreter (``HostSpec.python``) as ``sh -c 'exec PY -'``, the
interpreter written as by ``fleet inspect`` (a leading ``~/`` is the host's home); the request is
appended to it as one base64 literal, and the answer comes back as one base64 JSON
document between marker lines. See that script for the write protocol (sha256 guard,
backups and manifest first, temp + fsync + rename, py_compile, restore on failure).
"""

from __future__ import annotations

import base64
import json
import os
import zlib
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from fleet.errors import OperationFailed
from fleet.facts.gather import EXIT_COMMAND_NOT_FOUND, EXIT_NOT_EXECUTABLE, python_word
from fleet.source import sh_command

if TYPE_CHECKING:
    from fleet.transport import HostConnection

BEGIN = "----- fleet-patch begin -----"
END = "----- fleet-patch end -----"
BACKUP_ROOT = "~/.fleet/patches"
FETCH_TIMEOUT = 120.0
WRITE_TIMEOUT = 300.0
# Tests only: fleet copies this LOCAL variable into each write request ("fault"); the
# script honours the request alone, never the host's environment (see remote_patch.py).
FAULT_ENV = "FLEET_PATCH_FAULT"


@lru_cache(maxsize=1)
def script_text() -> str:
    return resources.files("fleet.patching").joinpath("remote_patch.py").read_text("utf-8")


def encode_request(request: dict[str, Any]) -> str:
    raw = json.dumps(request, separators=(",", ":")).encode("utf-8")
    return base64.b64encode(zlib.compress(raw, 6)).decode("ascii")


def script_with_request(request: dict[str, Any]) -> bytes:
    """The script plus its one call: ``raise SystemExit(main("<base64>"))``."""
    call = f"\nraise SystemExit(main({encode_request(request)!r}))\n"
    return (script_text() + call).encode("utf-8")


def decode_answer(host: str, stdout: str, exit_code: int, stderr: str) -> dict[str, Any]:
    """The JSON answer between the markers; a missing one means the script died."""
    start = stdout.find(BEGIN)
    end = stdout.find(END, start + 1) if start >= 0 else -1
    if start < 0 or end < 0:
        tail = (stderr.strip().splitlines() or ["no output"])[-1]
        raise OperationFailed(
            f"{host}: the patch script ended without an answer (exit {exit_code}): {tail}"
        )
    payload = stdout[start + len(BEGIN) : end].strip()
    try:
        doc = json.loads(zlib.decompress(base64.b64decode(payload)).decode("utf-8"))
    except (ValueError, zlib.error) as exc:
        raise OperationFailed(f"{host}: unreadable answer from the patch script: {exc}") from None
    if "refused" in doc:
        raise OperationFailed(f"{host}: {doc['refused']}")
    if "error" in doc:
        raise OperationFailed(f"{host}: the patch script failed: {doc['error']}")
    result = doc.get("result")
    if not isinstance(result, dict):
        raise OperationFailed(f"{host}: the patch script gave no result")
    return result


def patch_command(python: str) -> str:
    """``PY -`` run by ``sh`` whatever the login shell is, ``PY`` as ``fleet inspect`` and
    ``fleet source`` write it (quoted; a leading ``~/`` expanded on the host)."""
    return sh_command(f"exec {python_word(python)} -")


def run_op(conn: HostConnection, request: dict[str, Any], *, timeout: float) -> dict[str, Any]:
    python = conn.host.python or "python3"
    res = conn.run(patch_command(python), stdin=script_with_request(request), timeout=timeout)
    if res.exit_code in (EXIT_NOT_EXECUTABLE, EXIT_COMMAND_NOT_FOUND) and BEGIN not in res.stdout:
        problem = "not found" if res.exit_code == EXIT_COMMAND_NOT_FOUND else "not executable"
        raise OperationFailed(
            f"{conn.host.name}: python interpreter {python!r} {problem} on the host",
            hint="set the host's 'python' in the inventory to the vLLM environment's python",
        )
    return decode_answer(conn.host.name, res.stdout, res.exit_code, res.stderr)


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


def fetch(
    conn: HostConnection,
    patch_set: str,
    paths: list[str],
    *,
    with_backups: bool = False,
    backup_root: str = BACKUP_ROOT,
) -> Fetched:
    result = run_op(
        conn,
        {
            "op": "fetch",
            "patch_set": patch_set,
            "files": paths,
            "backup_root": backup_root,
            "with_backups": with_backups,
        },
        timeout=FETCH_TIMEOUT,
    )
    files = {
        p: RemoteFile(p, bool(f.get("exists")), f.get("text"), f.get("sha256"), f.get("error"))
        for p, f in result["files"].items()
    }
    return Fetched(
        vllm_version=result["version"],
        package_dir=result["package_dir"],
        python=result["python"],
        python_version=result["python_version"],
        backup_dir=result["backup_dir"],
        files=files,
        backup_manifest=result.get("backup_manifest"),
        backups=result.get("backups") or {},
    )


def _fault() -> str | None:
    return os.environ.get(FAULT_ENV) or None


def apply(
    conn: HostConnection,
    fetched: Fetched,
    patch_set: str,
    items: list[dict[str, str]],
    *,
    backup_root: str = BACKUP_ROOT,
) -> dict[str, Any]:
    """Write ``items`` (path, sha256_before, text_after, sha256_after): all or none."""
    return run_op(
        conn,
        {
            "op": "apply",
            "patch_set": patch_set,
            "files": items,
            "backup_root": backup_root,
            "package_dir": fetched.package_dir,
            "version": fetched.vllm_version,
            "fault": _fault(),
        },
        timeout=WRITE_TIMEOUT,
    )


def revert(
    conn: HostConnection,
    fetched: Fetched,
    patch_set: str,
    *,
    force: bool,
    check: bool,
    backup_root: str = BACKUP_ROOT,
) -> dict[str, Any]:
    return run_op(
        conn,
        {
            "op": "revert",
            "patch_set": patch_set,
            "force": force,
            "check": check,
            "backup_root": backup_root,
            "package_dir": fetched.package_dir,
            "version": fetched.vllm_version,
            "fault": _fault(),
        },
        timeout=WRITE_TIMEOUT,
    )
