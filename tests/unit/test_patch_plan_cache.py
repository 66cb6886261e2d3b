"""Plans kept across runs (fleet/patching/service.py): a second ``fleet patch`` on the same
files plans nothing, and any change of the files, the patch set or the version plans
again."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fleet.patching import remote, service
from fleet.patching.engine import sha256_text
from fleet.patching.manifest import load_patch_set, patches_root
from fleet.sandbox.vllm_source import vllm_file

VERSION = "0.17.0"


def _fetched(texts: dict[str, str | None]) -> remote.Fetched:
    files = {
        p: remote.RemoteFile(p, t is not None, t, sha256_text(t) if t is not None else None)
        for p, t in texts.items()
    }
    return remote.Fetched(VERSION, "/pkg", "/py", "3.11", "/b", files)


@pytest.fixture()
def counted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[int]:
    monkeypatch.setenv("FLEET_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(service, "_PLAN_CACHE", {})
    calls: list[int] = []
    real = service.plan_host

    def plan(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(service, "plan_host", plan)
    return calls


def _texts(ps: object) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for f in ps.manifest.files:  # type: ignore[attr-defined]
        path = vllm_file(VERSION, f.path)
        out[f.path] = path.read_text("utf-8") if path.exists() else None
    return out


def test_a_second_run_reads_the_plan(counted: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    ps = load_patch_set()
    texts = _texts(ps)
    first = service.cached_plan(ps, _fetched(texts))
    monkeypatch.setattr(service, "_PLAN_CACHE", {})  # a new process
    second = service.cached_plan(ps, _fetched(texts))
    assert len(counted) == 1
    assert [f.new_text for f in second.files] == [f.new_text for f in first.files]
    # another file content: planned again
    path = next(p for p, t in texts.items() if t)
    changed = {**texts, path: texts[path] + "\n# local edit\n"}  # type: ignore[operator]
    monkeypatch.setattr(service, "_PLAN_CACHE", {})
    service.cached_plan(ps, _fetched(changed))
    assert len(counted) == 2


def test_a_changed_template_plans_again(
    counted: list[int], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    root = tmp_path / "patches"
    shutil.copytree(patches_root(), root)
    ps = load_patch_set(root=root)
    texts = _texts(ps)
    service.cached_plan(ps, _fetched(texts))
    template = next((root / ps.name).glob("*.j2"))
    template.write_text(template.read_text() + "\n")
    monkeypatch.setattr(service, "_PLAN_CACHE", {})
    service.cached_plan(load_patch_set(root=root), _fetched(texts))
    assert len(counted) == 2


def test_a_plan_file_others_may_write_is_not_read(
    counted: list[int], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ps = load_patch_set()
    texts = _texts(ps)
    service.cached_plan(ps, _fetched(texts))
    (stored,) = (tmp_path / "cache" / "plans").glob("*.pickle")
    assert stored.stat().st_mode & 0o777 == 0o600
    stored.chmod(0o666)
    monkeypatch.setattr(service, "_PLAN_CACHE", {})
    service.cached_plan(ps, _fetched(texts))
    assert len(counted) == 2
