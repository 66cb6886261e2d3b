"""``fleet patch`` against hostile trees and racing runs, on a real sshd host:

- a symlinked ``deepseek_v2.py`` inside the tree is patched through the link (the link
  stays, its target changes) and revert restores exactly what was there (issue 10,
  defect 11);
- a symlink that leaves the tree is refused, and nothing is written anywhere;
- two ``fleet patch`` (and two ``--revert``) at once on one host: one writes, the other
  finds it done or the host busy; every file is exactly once-patched or original, never
  half-written, no temp file left.

Files are observed directly (sha256 of the bytes on the host), never through fleet.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hostile_support import SCALE, Tally, leftovers

pytestmark = pytest.mark.integration

DS = "model_executor/models/deepseek_v2.py"
FILES = [DS, "model_executor/models/kimi_k25.py", "v1/spec_decode/eagle.py"]


@pytest.fixture(scope="module")
def box(sandbox_factory: Any) -> Any:
    return sandbox_factory(1, ("0.17.0",), name="patch-hostile")


def _tree(box: Any) -> Path:
    return next(Path(box.hosts[0].home).glob("ml-env/lib/python3*/site-packages/vllm"))


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _state(box: Any) -> dict[str, str]:
    tree = _tree(box)
    return {f: _sha(tree / f) for f in FILES}


def _temps(box: Any) -> list[Path]:
    return list(_tree(box).rglob(".*.fleet-tmp-*"))


def _patch(box: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return box.run_fleet("--json", "patch", "--host", box.hosts[0].name, *args, timeout=300)


def _popen(box: Any, *args: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "fleet", "--inventory", str(box.inventory_path), "--json"]
    return subprocess.Popen(
        [*cmd, "patch", "--host", box.hosts[0].name, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=box.fleet_env(),
    )


def test_a_symlinked_target_is_patched_through_and_restored_exactly(box: Any, tally: Tally) -> None:
    category = "patch symlinked targets"
    tree = _tree(box)
    ds = tree / DS
    store = ds.parent / "_hostile_store"
    store.mkdir()
    real = store / "deepseek_v2.py"
    shutil.move(ds, real)
    ds.symlink_to(Path("_hostile_store") / "deepseek_v2.py")
    original = _sha(real)
    try:
        tally.attempt(category)
        applied = _patch(box)
        entry = json.loads(applied.stdout)["hosts"][box.hosts[0].name]
        if applied.returncode != 0 or not entry["changed"]:
            tally.bad(
                category, "wrong exit", f"apply: {applied.returncode} {applied.stdout[-300:]}"
            )
        if not ds.is_symlink() or os.readlink(ds) != "_hostile_store/deepseek_v2.py":
            tally.bad(category, "data loss", "apply replaced the link")
        after = {f["path"]: f["sha256_after"] for f in entry.get("files", [])}
        if _sha(real) == original or _sha(real) != after.get(DS):
            tally.bad(category, "wrong exit", "the link's target was not the file patched")
        tally.attempt(category)
        reverted = _patch(box, "--revert")
        if reverted.returncode != 0:
            tally.bad(
                category, "wrong exit", f"revert: {reverted.returncode} {reverted.stdout[-300:]}"
            )
        if not ds.is_symlink() or os.readlink(ds) != "_hostile_store/deepseek_v2.py":
            tally.bad(category, "data loss", "revert did not restore the link")
        if _sha(real) != original:
            tally.bad(category, "data loss", "revert did not restore the bytes")
        if _temps(box):
            tally.bad(category, "data loss", f"temp files left: {_temps(box)}")
    finally:
        ds.unlink()
        shutil.move(real, ds)
        store.rmdir()
    assert not tally.failures(category), tally.categories[category].examples


def test_a_symlink_leaving_the_tree_is_refused_and_nothing_is_written(
    box: Any, tally: Tally
) -> None:
    category = "patch symlinked targets"
    tree = _tree(box)
    ds = tree / DS
    outside = Path(box.hosts[0].home) / "outside" / "deepseek_v2.py"
    outside.parent.mkdir()
    shutil.move(ds, outside)
    ds.symlink_to(outside)
    before = {**_state(box), "outside": _sha(outside)}
    try:
        tally.attempt(category)
        run = _patch(box)
        if run.returncode not in (1, 2) or "outside" not in run.stdout + run.stderr:
            tally.bad(category, "wrong exit", f"exit {run.returncode}: {run.stdout[-300:]}")
        if {**_state(box), "outside": _sha(outside)} != before or not ds.is_symlink():
            tally.bad(category, "data loss", "a refused patch wrote something")
    finally:
        ds.unlink()
        shutil.move(outside, ds)
    assert not tally.failures(category), tally.categories[category].examples


def test_two_patches_at_once_write_once(box: Any, tally: Tally) -> None:
    category = "patch concurrency"
    original = _state(box)
    once: dict[str, str] | None = None
    for round_ in range(2 * SCALE):
        for mode in ("apply", "revert"):
            args = ("--revert",) if mode == "revert" else ()
            procs = [_popen(box, *args) for _ in range(2)]
            results = [(p, *p.communicate(timeout=300)) for p in procs]
            tally.attempt(category)
            changed = 0
            for proc, out, err in results:
                if "Traceback" in err:
                    tally.bad(category, "tracebacks", err[-300:])
                entry = json.loads(out)["hosts"][box.hosts[0].name] if out.strip() else {}
                changed += bool(entry.get("changed"))
                # the loser finds the patch done (ok) or the host busy (nothing written)
                lost = entry.get("code") == "host-busy"
                if proc.returncode != 0 and not (proc.returncode == 1 and lost):
                    code = entry.get("code")
                    tally.bad(category, "wrong exit", f"{mode}: exit {proc.returncode} ({code})")
            state = _state(box)
            if mode == "apply":
                once = once or state
                if state != once:
                    tally.bad(category, "data loss", f"round {round_}: not exactly once-patched")
            elif state != original:
                tally.bad(category, "data loss", f"round {round_}: revert left {state}")
            if changed != 1:
                tally.bad(category, "wrong exit", f"round {round_} {mode}: {changed} runs wrote")
            if _temps(box):
                tally.bad(category, "data loss", f"temp files left: {_temps(box)}")
    assert once is not None and once != original
    left = leftovers(box)
    if left:
        tally.bad(category, "leaks", str(left))
    assert not tally.failures(category), tally.categories[category].examples
