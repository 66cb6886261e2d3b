"""The control machine's one atomic writer and one lock (fleet.localfiles)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from fleet.localfiles import atomic_write, locked


def test_a_write_is_whole_private_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "cache" / "deep" / "plan.bin"
    atomic_write(target, b"one")
    atomic_write(target, "two")
    assert target.read_text() == "two"
    assert target.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in target.parent.iterdir()) == ["plan.bin"]
    atomic_write(target, b"three", durable=True, mode=0o644)
    assert target.read_bytes() == b"three" and target.stat().st_mode & 0o777 == 0o644


def test_a_planted_symlink_is_never_followed(tmp_path: Path) -> None:
    """The temp name is new each time (mkstemp, O_EXCL): a link planted under the name an
    earlier writer used (``.<name>.<pid>.<thread>.tmp``) redirects nothing."""
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    target = tmp_path / "bundle.json"
    planted = tmp_path / f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp"
    planted.symlink_to(victim)
    atomic_write(target, "{}")
    assert victim.read_text() == "keep me" and target.read_text() == "{}"


def test_a_failed_write_keeps_the_old_file_and_removes_its_temp(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    target.write_text("old")
    with pytest.raises(TypeError):
        atomic_write(target, 42)  # type: ignore[arg-type]
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_the_lock_is_exclusive_across_threads(tmp_path: Path) -> None:
    lock = tmp_path / "locks" / "x.lock"
    inside: list[int] = []
    overlaps: list[int] = []

    def holder(n: int) -> None:
        with locked(lock):
            if inside:
                overlaps.append(n)
            inside.append(n)
            time.sleep(0.05)
            inside.remove(n)

    threads = [threading.Thread(target=holder, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == [] and lock.is_file()
