"""Plans kept across runs (fleet/patching/apply.py): a second ``fleet patch`` on the same
files plans nothing, and any change of the files, the patch set or the version plans
again."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from fleet.patching import apply, host_calls
from fleet.patching.engine import sha256_text
from fleet.patching.manifest import load_patch_set, patches_root
from fleet.sandbox.vllm_source import vllm_file

VERSION = "0.17.0"


def _fetched(texts: dict[str, str | None]) -> host_calls.Fetched:
    files = {
        p: host_calls.RemoteFile(p, t is not None, t, sha256_text(t) if t is not None else None)
        for p, t in texts.items()
    }
    return host_calls.Fetched(VERSION, "/pkg", "/py", "3.11", "/b", files)


@pytest.fixture()
def counted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[int]:
    monkeypatch.setenv("FLEET_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(apply, "_PLAN_CACHE", {})
    calls: list[int] = []
    real = apply.plan_host

    def plan(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(apply, "plan_host", plan)
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
    first = apply.cached_plan(ps, _fetched(texts))
    monkeypatch.setattr(apply, "_PLAN_CACHE", {})  # a new process
    second = apply.cached_plan(ps, _fetched(texts))
    assert len(counted) == 1
    assert [f.new_text for f in second.files] == [f.new_text for f in first.files]
    # another file content: planned again
    path = next(p for p, t in texts.items() if t)
    changed = {**texts, path: texts[path] + "\n# local edit\n"}  # type: ignore[operator]
    monkeypatch.setattr(apply, "_PLAN_CACHE", {})
    apply.cached_plan(ps, _fetched(changed))
    assert len(counted) == 2


def test_a_changed_template_plans_again(
    counted: list[int], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    root = tmp_path / "patches"
    shutil.copytree(patches_root(), root)
    ps = load_patch_set(root=root)
    texts = _texts(ps)
    apply.cached_plan(ps, _fetched(texts))
    template = next((root / ps.name).glob("*.j2"))
    template.write_text(template.read_text() + "\n")
    monkeypatch.setattr(apply, "_PLAN_CACHE", {})
    apply.cached_plan(load_patch_set(root=root), _fetched(texts))
    assert len(counted) == 2


def test_a_plan_file_others_may_write_is_not_read(
    counted: list[int], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ps = load_patch_set()
    texts = _texts(ps)
    apply.cached_plan(ps, _fetched(texts))
    (stored,) = (tmp_path / "cache" / "plans").glob("*.pickle")
    assert stored.stat().st_mode & 0o777 == 0o600
    stored.chmod(0o666)
    monkeypatch.setattr(apply, "_PLAN_CACHE", {})
    apply.cached_plan(ps, _fetched(texts))
    assert len(counted) == 2


def _without_texts(fetched: host_calls.Fetched) -> host_calls.Fetched:
    files = {
        p: host_calls.RemoteFile(p, f.exists, None, f.sha256, f.error)
        for p, f in fetched.files.items()
    }
    return host_calls.Fetched(VERSION, "/pkg", "/py", "3.11", "/b", files)


def test_a_known_plan_is_found_by_the_files_sha256_alone(
    counted: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    ps = load_patch_set()
    fetched = _fetched(_texts(ps))
    assert apply.known_plan(ps, _without_texts(fetched)) is None
    made = apply.cached_plan(ps, fetched)
    same = apply.known_plan(ps, _without_texts(fetched))
    monkeypatch.setattr(apply, "_PLAN_CACHE", {})  # a new process: from the stored plan
    stored = apply.known_plan(ps, _without_texts(fetched))
    assert same is not None and stored is not None
    assert [f.new_text for f in same.files] == [f.new_text for f in made.files]
    assert [f.new_text for f in stored.files] == [f.new_text for f in made.files]
    assert len(counted) == 1
    # each host gets its own copy: one host's report never changes another's plan
    same.files[0].status = "conflict"
    again = apply.known_plan(ps, _without_texts(fetched))
    assert again is not None and again.files[0].status == made.files[0].status


def test_a_text_that_its_sha256_does_not_name_is_planned_but_never_kept(
    counted: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    ps = load_patch_set()
    texts = _texts(ps)
    honest = _fetched(texts)
    path = next(p for p, t in texts.items() if t)
    lying = _fetched({**texts, path: texts[path] + "\n# not what the sha256 says\n"})  # type: ignore[operator]
    lying.files[path].sha256 = honest.files[path].sha256
    apply.cached_plan(ps, lying)
    # a later host reporting the same sha256 must not get the plan of the other text
    assert apply.known_plan(ps, _without_texts(honest)) is None
    monkeypatch.setattr(apply, "_PLAN_CACHE", {})
    assert apply.known_plan(ps, _without_texts(honest)) is None
    plan = apply.cached_plan(ps, honest)
    assert len(counted) == 2
    assert plan.files == apply.cached_plan(ps, honest).files


def test_the_plans_made_and_kept_are_logged_at_vv(
    counted: list[int], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``-vv`` (DEBUG) says for each host whether its plan was made or a kept one reused."""
    ps = load_patch_set()
    texts = _texts(ps)
    caplog.set_level(logging.DEBUG, logger="fleet.patching.apply")

    def said() -> list[str]:
        out = [r.getMessage() for r in caplog.records if r.name == "fleet.patching.apply"]
        assert all(r.levelno == logging.DEBUG for r in caplog.records if r.name.endswith("apply"))
        caplog.clear()
        return out

    apply.cached_plan(ps, _fetched(texts))
    made = said()
    assert any("planned" in m and VERSION in m for m in made), made
    apply.cached_plan(ps, _fetched(texts))  # the same files on the next host
    assert any("kept: reused" in m for m in said())
    monkeypatch.setattr(apply, "_PLAN_CACHE", {})  # a new process: the stored plan
    apply.cached_plan(ps, _fetched(texts))
    assert any("kept: reused" in m for m in said())
    assert len(counted) == 1
