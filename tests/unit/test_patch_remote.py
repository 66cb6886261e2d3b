"""The host_calls patch script, run as a real process (no SSH) on a copy of real vLLM files.

A "host" here is a directory: ``site/`` holding the vLLM package files the patch set
touches plus the real ``.dist-info``, and ``home/`` for fleet's backups. The script is
started exactly as over SSH (``sh -c 'exec <python> -'`` with the script on stdin) by a
local stand-in for ``HostConnection.run``; the SSH path itself is covered by
tests/integration. Faults are injected by the tests' harness (tests/faults.py), which
rebinds the script's named points in the bundle sent; fleet has no fault knob.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from fleet.errors import OperationFailed
from fleet.inventory import HostSpec
from fleet.patching import apply, host_calls
from fleet.patching.apply import HostReport, apply_host, revert_host, write_failed
from fleet.patching.engine import plan_host
from fleet.patching.manifest import PatchSet, load_patch_set
from fleet.sandbox.vllm_source import vllm_tree
from fleet.transport import LocalRunner
from tests.faults import clear_fault, set_fault

PY38 = Path("/root/.pyenv/versions/3.8.18/bin/python3.8")


def LocalConn(root: Path, python: str = sys.executable) -> LocalRunner:
    """This machine as the host whose files live under ``root`` (site/ and home/)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(root / "home"),
        "PYTHONPATH": str(root / "site"),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    return LocalRunner(HostSpec(name="local", python=python), env=env)


def make_host(tmp: Path, version: str, patch_set: PatchSet) -> Path:
    tree = vllm_tree(version)
    site = tmp / "site"
    (site / "vllm").mkdir(parents=True)
    shutil.copy(tree / "vllm" / "__init__.py", site / "vllm" / "__init__.py")
    for spec in patch_set.manifest.files:
        src = tree / "vllm" / spec.path
        if src.exists():
            dst = site / "vllm" / spec.path
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dst)
    for info in tree.glob("*.dist-info"):
        shutil.copytree(info, site / info.name)
    (tmp / "home").mkdir()
    return site / "vllm"


def shas(pkg: Path, patch_set: PatchSet) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for spec in patch_set.manifest.files:
        p = pkg / spec.path
        out[spec.path] = hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else None
    return out


@pytest.fixture(scope="module")
def patch_set() -> PatchSet:
    return load_patch_set()


@pytest.fixture()
def host(tmp_path: Path, patch_set: PatchSet) -> tuple[LocalRunner, Path]:
    pkg = make_host(tmp_path, "0.15.0", patch_set)
    return LocalConn(tmp_path), pkg


def expected_after(patch_set: PatchSet, version: str, pkg: Path) -> dict[str, str | None]:
    texts = {
        s.path: (pkg / s.path).read_text("utf-8") if (pkg / s.path).exists() else None
        for s in patch_set.manifest.files
    }
    plan = plan_host(patch_set, version, texts)
    return {f.path: f.sha256_after for f in plan.files}


def statuses(report: HostReport) -> dict[str, str]:
    return {f.path: f.status for f in report.files}


def test_fetch_locates_vllm_without_importing_it(
    host: tuple[LocalRunner, Path], patch_set: PatchSet
) -> None:
    conn, pkg = host
    fetched = host_calls.fetch(conn, patch_set.name, [s.path for s in patch_set.manifest.files])
    assert fetched.vllm_version == "0.15.0"
    assert fetched.package_dir == str(pkg.resolve())
    assert all(f.exists for f in fetched.files.values())
    want = shas(pkg, patch_set)
    assert {p: f.sha256 for p, f in fetched.files.items()} == want
    assert fetched.backup_manifest is None
    assert not (Path(conn.env["HOME"]) / ".fleet").exists()  # reading writes nothing


def test_texts_stay_on_the_host_when_their_plan_is_known(
    host: tuple[LocalRunner, Path], patch_set: PatchSet, monkeypatch: pytest.MonkeyPatch
) -> None:

    conn, pkg = host
    monkeypatch.setattr(apply, "_PLAN_CACHE", {})
    monkeypatch.setenv("FLEET_CACHE", str(pkg.parent.parent / "cache"))
    asked: list[tuple[bool, int]] = []  # (texts asked for, texts received) per fetch
    real = host_calls.fetch

    def fetch(*args: Any, **kwargs: Any) -> host_calls.Fetched:
        got = real(*args, **kwargs)
        asked.append(
            (kwargs.get("texts", True), sum(f.text is not None for f in got.files.values()))
        )
        return got

    monkeypatch.setattr(host_calls, "fetch", fetch)
    first = apply_host(conn, patch_set, check=True)
    second = apply_host(conn, patch_set, check=True)
    present = sum(1 for s in patch_set.manifest.files if (pkg / s.path).exists())
    # the first host's sha256 name no plan: its texts are asked for; then they are not
    assert asked == [(False, 0), (True, present), (False, 0)]
    assert second.to_json(with_diff=True) == first.to_json(with_diff=True)
    assert "would-apply" in statuses(second).values()
    applied = apply_host(conn, patch_set)  # the write, from the plan the sha256 named
    assert asked[-1] == (False, 0)
    assert applied.changed
    assert shas(pkg, patch_set) == {f.path: f.sha256_after for f in first.files}


def test_apply_again_revert_apply(host: tuple[LocalRunner, Path], patch_set: PatchSet) -> None:
    conn, pkg = host
    original = shas(pkg, patch_set)
    original_bytes = {p: (pkg / p).read_bytes() for p, s in original.items() if s}
    want = expected_after(patch_set, "0.15.0", pkg)
    cache = pkg / "model_executor" / "models" / "__pycache__"
    cache.mkdir(parents=True)
    stale = cache / "deepseek_v2.cpython-311.pyc"
    stale.write_bytes(b"stale")
    keep = cache / "llama.cpython-311.pyc"
    keep.write_bytes(b"other")

    first = apply_host(conn, patch_set)
    assert first.ok, first.message
    assert statuses(first)["model_executor/models/deepseek_v2.py"] == "applied"
    assert statuses(first)["config/__init__.py"] == "not-needed"
    assert shas(pkg, patch_set) == want
    assert not stale.exists() and keep.exists()
    backup = Path(first.backup_dir or "")
    assert backup.is_dir() and backup.is_relative_to(Path(conn.env["HOME"]) / ".fleet" / "patches")
    for p, data in original_bytes.items():
        if want[p] != original[p]:
            assert (backup / "originals" / p).read_bytes() == data
    import json

    manifest = json.loads((backup / "manifest.json").read_text())
    assert manifest["patch_set"] == "eagle3-deepseek" and manifest["vllm_version"] == "0.15.0"
    entry = manifest["files"]["model_executor/models/deepseek_v2.py"]
    assert entry["sha256_before"] == original["model_executor/models/deepseek_v2.py"]
    assert entry["sha256_after"] == want["model_executor/models/deepseek_v2.py"]
    assert entry["state"] == "applied"
    assert not list(pkg.rglob(".*fleet-tmp-*"))

    mtimes = {p: (pkg / p).stat().st_mtime_ns for p, s in want.items() if s}
    second = apply_host(conn, patch_set)
    assert second.ok and not second.changed
    assert set(statuses(second).values()) == {"already-applied", "not-needed"}
    assert {p: (pkg / p).stat().st_mtime_ns for p in mtimes} == mtimes

    reverted = revert_host(conn, patch_set)
    assert reverted.ok, reverted.message
    assert statuses(reverted)["model_executor/models/deepseek_v2.py"] == "reverted"
    assert shas(pkg, patch_set) == original
    assert {p: (pkg / p).read_bytes() for p in original_bytes} == original_bytes
    assert not backup.exists()

    again = revert_host(conn, patch_set)
    assert again.ok and set(statuses(again).values()) == {"not-needed"}

    third = apply_host(conn, patch_set)
    assert third.ok and shas(pkg, patch_set) == want


def test_check_and_diff_write_nothing(host: tuple[LocalRunner, Path], patch_set: PatchSet) -> None:
    conn, pkg = host
    before = shas(pkg, patch_set)
    report = apply_host(conn, patch_set, check=True, with_diff=True)
    assert report.ok
    assert statuses(report)["v1/spec_decode/eagle.py"] == "would-apply"
    diff = next(f.diff for f in report.files if f.path == "v1/spec_decode/eagle.py")
    assert diff and "+                    target_model.config.media_placeholder_token_id" in diff
    assert shas(pkg, patch_set) == before
    assert not (Path(conn.env["HOME"]) / ".fleet").exists()


def test_file_changed_between_read_and_write_is_a_conflict(
    host: tuple[LocalRunner, Path], patch_set: PatchSet
) -> None:
    conn, pkg = host
    fetched = host_calls.fetch(conn, patch_set.name, [s.path for s in patch_set.manifest.files])
    plan = plan_host(patch_set, fetched.vllm_version, fetched.texts())
    items = plan.write_items()
    touched = pkg / "config" / "speculative.py"
    touched.write_text(touched.read_text() + "\n# edited by hand meanwhile\n")
    before = shas(pkg, patch_set)
    result = host_calls.apply(conn, fetched, patch_set.name, items)
    assert result.ok is False and result.written == []
    assert [c["path"] for c in result.conflicts] == ["config/speculative.py"]
    assert shas(pkg, patch_set) == before  # all or none: nothing written
    assert not list((Path(conn.env["HOME"]) / ".fleet" / "patches").glob("eagle3-deepseek/*"))


POINTS = [
    "after-lock",
    "after-backup",
    "after-temp",
    "after-first-rename",
    "after-rename",
    "before-manifest",
]


@pytest.mark.parametrize("point", POINTS)
def test_killed_at_any_point_leaves_each_file_original_or_patched(
    host: tuple[LocalRunner, Path],
    patch_set: PatchSet,
    point: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    conn, pkg = host
    original = shas(pkg, patch_set)
    want = expected_after(patch_set, "0.15.0", pkg)
    set_fault(monkeypatch, point)
    with pytest.raises(OperationFailed, match="without an answer"):
        apply_host(conn, patch_set)
    now = shas(pkg, patch_set)
    for path, sha in now.items():
        assert sha in (original[path], want[path]), f"{path} half-written after {point}"
    patched = [p for p in now if now[p] == want[p] != original[p]]
    if point in ("after-lock", "after-backup", "after-temp"):
        assert patched == []
    if point == "after-first-rename":
        assert len(patched) == 1
    if point in ("after-rename", "before-manifest"):
        assert sorted(patched) == sorted(p for p in want if want[p] != original[p])
    # the next run completes the job, and the originals can still be restored
    clear_fault(monkeypatch)
    report = apply_host(conn, patch_set)
    assert report.ok and shas(pkg, patch_set) == want
    assert not list(pkg.rglob(".*fleet-tmp-*"))
    back = revert_host(conn, patch_set)
    assert back.ok and shas(pkg, patch_set) == original


def test_a_text_the_hosts_python_cannot_compile_is_never_written(
    host: tuple[LocalRunner, Path], patch_set: PatchSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn, pkg = host
    original = shas(pkg, patch_set)
    touched = {p: (pkg / p).stat().st_mtime_ns for p in original if (pkg / p).exists()}
    set_fault(monkeypatch, "compile-error")
    report = apply_host(conn, patch_set)
    assert not report.ok
    assert "the host's Python cannot compile the new text" in (report.message or "")
    assert "nothing written" in (report.message or "")
    assert shas(pkg, patch_set) == original
    assert {p: (pkg / p).stat().st_mtime_ns for p in touched} == touched  # never replaced
    assert not list((Path(conn.env["HOME"]) / ".fleet" / "patches").glob("eagle3-deepseek/*"))


def test_revert_refuses_a_file_changed_since_the_patch(
    host: tuple[LocalRunner, Path], patch_set: PatchSet
) -> None:
    conn, pkg = host
    original = shas(pkg, patch_set)
    assert apply_host(conn, patch_set).ok
    edited = pkg / "model_executor" / "models" / "kimi_k25.py"
    edited.write_text(edited.read_text() + "# local change\n")
    patched = shas(pkg, patch_set)
    refused = revert_host(conn, patch_set)
    assert not refused.ok
    assert statuses(refused)["model_executor/models/kimi_k25.py"] == "conflict"
    assert statuses(refused)["model_executor/models/deepseek_v2.py"] == "would-revert"
    assert shas(pkg, patch_set) == patched  # nothing reverted
    forced = revert_host(conn, patch_set, force=True)
    assert forced.ok and shas(pkg, patch_set) == original


def test_revert_check_and_diff_write_nothing(
    host: tuple[LocalRunner, Path], patch_set: PatchSet
) -> None:
    conn, pkg = host
    assert apply_host(conn, patch_set).ok
    patched = shas(pkg, patch_set)
    report = revert_host(conn, patch_set, check=True, with_diff=True)
    assert report.ok and statuses(report)["config/speculative.py"] == "would-revert"
    diff = next(f.diff for f in report.files if f.path == "config/speculative.py")
    assert diff and '-            "kimi_k25",' in diff
    assert shas(pkg, patch_set) == patched


def test_host_without_vllm_fails_in_one_line(tmp_path: Path, patch_set: PatchSet) -> None:
    (tmp_path / "site").mkdir()
    (tmp_path / "home").mkdir()
    conn = LocalConn(tmp_path)
    with pytest.raises(OperationFailed, match="vLLM is not installed for"):
        apply_host(conn, patch_set)


@pytest.mark.skipif(not PY38.exists(), reason="no Python 3.8 interpreter here")
def test_the_script_runs_on_python_3_8(tmp_path: Path, patch_set: PatchSet) -> None:
    pkg = make_host(tmp_path, "0.11.0", patch_set)
    conn = LocalConn(tmp_path, python=str(PY38))
    original = shas(pkg, patch_set)
    fetched = host_calls.fetch(conn, patch_set.name, [s.path for s in patch_set.manifest.files])
    assert fetched.python_version.startswith("3.8.")
    assert fetched.files["model_executor/models/kimi_k25.py"].exists is False
    report = apply_host(conn, patch_set)
    assert report.ok, report.message
    assert statuses(report)["config/speculative.py"] == "applied"
    assert revert_host(conn, patch_set).ok and shas(pkg, patch_set) == original


# -- an exception while writing: every file already replaced is restored ------------------

RAISES = ["after-temp", "after-first-rename", "after-rename", "before-manifest"]


@pytest.mark.parametrize("point", RAISES)
def test_exception_while_writing_restores_every_file(
    host: tuple[LocalRunner, Path],
    patch_set: PatchSet,
    point: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An OSError (as from a failing rename, or mkstemp on a full /tmp) at ``point``: the
    host ends with every original, no temp file, no pending manifest, a clear failure."""
    conn, pkg = host
    original = shas(pkg, patch_set)
    want = expected_after(patch_set, "0.15.0", pkg)
    to_write = sorted(p for p in want if want[p] != original[p])
    assert len(to_write) > 1
    set_fault(monkeypatch, f"{point}:raise")
    with pytest.raises(OperationFailed) as info:
        apply_host(conn, patch_set)
    assert shas(pkg, patch_set) == original
    assert not list(pkg.rglob(".*fleet-tmp-*"))
    assert not list((Path(conn.env["HOME"]) / ".fleet" / "patches").glob("eagle3-deepseek/*"))
    message = str(info.value)
    assert "writing the patch failed" in message and f"injected fault at {point}" in message
    assert "every file was put back as it was, nothing is patched" in message
    # the host is clean: the next run applies, and revert restores
    clear_fault(monkeypatch)
    report = apply_host(conn, patch_set)
    assert report.ok and sorted(statuses(report)[p] for p in to_write) == ["applied"] * len(
        to_write
    )
    assert revert_host(conn, patch_set).ok and shas(pkg, patch_set) == original


def test_exception_after_renames_drops_the_bytecode_of_restored_files(
    host: tuple[LocalRunner, Path], patch_set: PatchSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn, pkg = host
    cache = pkg / "model_executor" / "models" / "__pycache__"
    cache.mkdir(parents=True)
    stale = cache / "deepseek_v2.cpython-311.pyc"
    stale.write_bytes(b"compiled from the patched text")
    set_fault(monkeypatch, "after-rename:raise")
    with pytest.raises(OperationFailed, match="writing the patch failed"):
        apply_host(conn, patch_set)
    assert not stale.exists()


def test_the_answer_of_a_failed_write_says_what_was_restored(
    host: tuple[LocalRunner, Path], patch_set: PatchSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn, _pkg = host
    fetched = host_calls.fetch(conn, patch_set.name, [s.path for s in patch_set.manifest.files])
    plan = plan_host(patch_set, fetched.vllm_version, fetched.texts())
    items = plan.write_items()
    set_fault(monkeypatch, "after-first-rename:raise")
    result = host_calls.apply(conn, fetched, patch_set.name, items)
    assert result.ok is False and result.written == []
    assert result.write_error.startswith("OSError: [Errno 28]")
    assert result.restored is True and result.restore_errors == []


def test_a_file_that_cannot_be_restored_stays_listed_for_revert(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The undo itself fails for one file: the others are restored, and the manifest keeps
    the one left patched (pending) so that ``fleet patch --revert`` can finish the job."""
    import json

    from fleet.onhost import patch as script

    pkg = tmp_path / "vllm"
    pkg.mkdir()
    (pkg / "a.py").write_text("a = 2\n")
    (pkg / "b.py").write_text("b = 2\n")
    originals = {"a.py": b"a = 1\n", "b.py": b"b = 1\n"}
    directory = tmp_path / "backup"
    entry = {"sha256_before": "x", "sha256_after": "y", "state": "pending"}
    manifest: dict[str, Any] = {"files": {"a.py": dict(entry), "b.py": dict(entry)}}
    real_replace = script.replace_file

    def failing_replace(path: str, data: bytes, like: str | None = None) -> None:
        if path.endswith("b.py"):
            raise OSError(28, "No space left on device")
        real_replace(path, data, like)

    monkeypatch.setattr(script, "replace_file", failing_replace)
    items = [{"path": "a.py"}, {"path": "b.py"}]
    failed = script._undo(str(pkg), str(directory), manifest, items, ["a.py", "b.py"], originals)
    assert failed == [{"path": "b.py", "error": "OSError: [Errno 28] No space left on device"}]
    assert (pkg / "a.py").read_bytes() == originals["a.py"]
    kept = json.loads((directory / "manifest.json").read_text())
    assert list(kept["files"]) == ["b.py"]

    message = str(
        write_failed(
            "h1",
            host_calls.ApplyAnswer(
                ok=False, write_error="OSError: boom", restore_errors=failed, backup_dir="/b"
            ),
        )
    )
    assert "could not restore b.py (OSError: [Errno 28]" in message
    assert "/b" in message and "fleet patch --revert" in message


def test_the_compile_check_is_the_interpreters_own() -> None:
    """What the host's Python refuses to import is refused before anything is written."""
    from fleet.onhost import patch as script

    assert script._compile(b"def f(x):\n    return x\n", "/v/m.py") is None
    assert script._compile(b"# -*- coding: latin-1 -*-\nname = '\xe9'\n", "/v/m.py") is None
    bad = script._compile(b"def f(x):\n    return x +\n", "/v/m.py")
    assert bad is not None and bad.startswith("SyntaxError: ") and "(line 2)" in bad
    indent = script._compile(b"if True:\nx = 1\n", "/v/m.py")
    assert indent is not None and indent.startswith("IndentationError: ")
    nul = script._compile(b"x = 1\0\n", "/v/m.py")
    assert nul is not None and "null" in nul.lower()
    # the check is made without the caller's future imports (dont_inherit)
    assert script._compile(b"def f(x: undefined_name) -> None: ...\n", "/v/m.py") is None


# -- the fault hook: only from the request, never from the host's environment -------------


def test_the_hosts_environment_cannot_inject_a_fault(
    host: tuple[LocalRunner, Path], patch_set: PatchSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn, pkg = host
    conn.env["FLEET_PATCH_FAULT"] = "after-lock"  # the old knob: nothing reads it
    report = apply_host(conn, patch_set)
    assert report.ok, report.message
    # nor can a request: a "fault" in it is ignored
    fetched = host_calls.fetch(conn, patch_set.name, [s.path for s in patch_set.manifest.files])
    answer = host_calls._ask(
        conn,
        {"op": "revert", "patch_set": patch_set.name, "force": False, "check": False,
         "backup_root": host_calls.BACKUP_ROOT, "package_dir": fetched.package_dir,
         "version": fetched.vllm_version, "fault": "after-lock"},
        host_calls.RevertAnswer,
        timeout=60,
    )  # fmt: skip
    assert answer.ok, answer
    report = apply_host(conn, patch_set)
    assert report.ok, report.message
    assert shas(pkg, patch_set) == expected_after(patch_set, "0.15.0", Path(str(pkg)))


# -- temp files: unique, exclusive, never through a symlink, removed on failure -----------


def test_write_temp_never_follows_a_planted_symlink(tmp_path: Path) -> None:
    from fleet.onhost import patch as script

    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    target = tmp_path / "pkg" / "mod.py"
    target.parent.mkdir()
    target.write_text("x = 1\n")
    # the names an attacker could guess: the old scheme used the pid as the only suffix
    for guess in (os.getpid(), 0, 1):
        (target.parent / f".mod.py.fleet-tmp-{guess}").symlink_to(victim)
    tmp = script.write_temp(str(target), b"x = 2\n", str(target))
    assert victim.read_bytes() == b"precious"
    assert not Path(tmp).is_symlink() and Path(tmp).read_bytes() == b"x = 2\n"
    assert Path(tmp).parent == target.parent and Path(tmp).name.startswith(".mod.py.fleet-tmp-")
    other = script.write_temp(str(target), b"x = 3\n", str(target))
    assert other != tmp and Path(tmp).read_bytes() == b"x = 2\n"


def test_write_temp_removes_its_file_when_it_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleet.onhost import patch as script

    target = tmp_path / "mod.py"
    target.write_text("x = 1\n")

    def no_space(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(script.os, "fsync", no_space)
    with pytest.raises(OSError, match="No space left"):
        script.write_temp(str(target), b"x = 2\n", str(target))
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mod.py"]


# -- the interpreter: written as inspect and source write it ------------------------------


def test_a_home_relative_python_runs(tmp_path: Path, patch_set: PatchSet) -> None:
    pkg = make_host(tmp_path, "0.15.0", patch_set)
    env_bin = tmp_path / "home" / "my env" / "bin"
    env_bin.mkdir(parents=True)
    (env_bin / "python").symlink_to(sys.executable)
    conn = LocalConn(tmp_path, python="~/my env/bin/python")
    fetched = host_calls.fetch(conn, patch_set.name, [s.path for s in patch_set.manifest.files])
    assert fetched.package_dir == str(pkg.resolve())
    assert apply_host(conn, patch_set).ok


def test_a_missing_python_fails_in_one_clear_line(tmp_path: Path, patch_set: PatchSet) -> None:
    make_host(tmp_path, "0.15.0", patch_set)
    conn = LocalConn(tmp_path, python="~/nowhere/bin/python")
    with pytest.raises(OperationFailed) as info:
        apply_host(conn, patch_set)
    assert "python interpreter '~/nowhere/bin/python' not found on the host" in str(info.value)
    assert info.value.hint and "inventory" in info.value.hint
