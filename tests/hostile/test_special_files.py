"""Special files for every command that reads one: FIFOs, devices made with mknod under a
temporary directory (never the system's /dev/zero), directories, sockets, symlinks to
them, and a huge sparse file (one 600 MiB line of NUL bytes).

Remote (real sshd hosts): ``logs --path`` (shown, ``--diagnose``, ``--follow``), ``source
show`` and ``source grep`` over a directory holding them all. Local: ``logs --file``.
Each is refused at once (one line, no hang, no traceback) or, for the huge file, bounded
in time and output; the special file is still what it was; nothing keeps running on the
host.
"""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path
from typing import Any

import pytest
from hostile_support import (
    Hung,
    Tally,
    leftovers,
    one_line_error,
    run_fleet,
    usage_error,
    within,
)

HANG_SECONDS = 30.0
SPARSE = 600 * 2**20
KINDS = [
    "fifo",
    "null-device",
    "zero-device",
    "directory",
    "socket",
    "symlink-to-fifo",
    "symlink-to-zero-device",
]


def make(where: Path, kind: str) -> Path:
    """A special file of ``kind`` under ``where`` (devices: mknod, under a temp dir)."""
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"{kind}.py"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind in ("null-device", "zero-device"):
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3 if kind == "null-device" else 5))
    elif kind == "directory":
        path.mkdir()
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        cwd = os.getcwd()
        os.chdir(where)  # a socket path is limited to 107 bytes: bind it relative
        try:
            sock.bind(path.name)
        finally:
            os.chdir(cwd)
            sock.close()
    elif kind.startswith("symlink-to-"):
        target = where / f"{kind}-target"
        make(target, kind.removeprefix("symlink-to-")).rename(target.with_suffix(".py"))
        target.rmdir()
        path.symlink_to(target.with_suffix(".py"))
    elif kind.startswith("sparse"):
        with open(path, "wb") as fh:
            fh.truncate(SPARSE if kind == "sparse" else SPARSE // 8)
    return path


def _kind_of(path: Path) -> tuple[int, int]:
    st = os.lstat(path)
    return stat.S_IFMT(st.st_mode), st.st_size


def _mknod_allowed(tmp: Path) -> bool:
    try:
        os.mknod(tmp / "probe", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        return False
    (tmp / "probe").unlink()
    return True


@pytest.fixture(scope="module")
def box(sandbox_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    if not _mknod_allowed(tmp_path_factory.mktemp("probe")):
        pytest.skip("mknod not permitted")
    sandbox = sandbox_factory(1, ("0.17.0",), name="special")
    host = sandbox.hosts[0]
    home = Path(host.home)
    tree = next(home.glob("ml-env/lib/python3*/site-packages/vllm"))
    for kind in KINDS:
        make(home / "special", kind)
        make(tree / "hostile_special", kind)
    make(home / "special", "sparse")  # over the hosts' memory limit for one line
    make(home / "special", "sparse-small")  # shown (cut), to bound the output
    make(tree / "hostile_special", "sparse")
    (home / "special" / "real.log").write_text("INFO ok\n")
    (home / "special" / "link-to-real.log").symlink_to(home / "special" / "real.log")
    return sandbox


def _check(tally: Tally, category: str, label: str, args: list[str]) -> Any:
    tally.attempt(category)
    try:
        run = within(HANG_SECONDS, lambda: run_fleet(args))
    except Hung as exc:
        tally.bad(category, "hangs", f"{label}: {exc}")
        raise
    if run.traceback:
        tally.bad(category, "tracebacks", f"{label}: {run.trace or run.stderr[-300:]}")
    return run


@pytest.mark.integration
def test_remote_special_files_are_refused_at_once(box: Any, tally: Tally) -> None:
    category = "special files (remote)"
    host = box.hosts[0]
    inv = ["--inventory", str(box.inventory_path)]
    special = Path(host.home) / "special"
    tree_dir = next(Path(host.home).glob("ml-env/lib/python3*/site-packages/vllm"))
    before = {
        p: _kind_of(p) for p in [*special.iterdir(), *(tree_dir / "hostile_special").iterdir()]
    }
    for kind in KINDS:
        path = str(special / f"{kind}.py")
        for label, args in (
            ("logs", ["logs", "--host", host.name, "--path", path, "--tail", "5"]),
            ("logs --diagnose", ["logs", "--host", host.name, "--path", path, "--diagnose"]),
            ("logs --follow", ["logs", "--host", host.name, "--path", path, "--follow"]),
            ("source show", ["source", "show", "--host", host.name, f"hostile_special/{kind}.py"]),
        ):
            run = _check(tally, category, f"{label} {kind}", [*inv, *args])
            said = run.stdout + run.stderr
            # a follow's stream has no stderr: it says it cannot read the file
            refused = "not a regular file" in said or (
                label == "logs --follow" and "cannot read" in said
            )
            if run.code != 1 or not refused:
                tally.bad(category, "wrong exit", f"{label} {kind}: {run.code} {run.stdout[-200:]}")
    # grep over the directory holding all of them: the special files are skipped
    run = _check(
        tally,
        category,
        "source grep",
        [*inv, "source", "grep", "--host", host.name, "x", "hostile_special"],
    )
    if run.code != 0 or "no matches" not in run.stderr:
        tally.bad(category, "wrong exit", f"source grep: {run.code} {run.stderr[-200:]}")
    # a symlink to a regular file is read through
    run = _check(
        tally,
        category,
        "logs symlink-to-regular",
        [*inv, "logs", "--host", host.name, "--path", str(special / "link-to-real.log")],
    )
    if run.code != 0 or "INFO ok" not in run.stdout:
        tally.bad(category, "wrong exit", f"symlink to a regular file: {run.code} {run.stdout}")
    for path, identity in before.items():
        if _kind_of(path) != identity:
            tally.bad(category, "data loss", f"{path} changed")
    left = leftovers(box)
    if left:
        tally.bad(category, "leaks", str(left))
    assert not tally.failures(category), tally.categories[category].examples


@pytest.mark.integration
def test_a_huge_one_line_file_is_bounded(box: Any, tally: Tally) -> None:
    """600 MiB of NUL bytes, no newline: bounded output when shown, a clear failure when
    diagnosed or shown from the tree, never the host's memory."""
    category = "huge files"
    host = box.hosts[0]
    inv = ["--inventory", str(box.inventory_path)]
    path = str(Path(host.home) / "special" / "sparse.py")
    small = str(Path(host.home) / "special" / "sparse-small.py")
    shown = _check(tally, category, "logs", [*inv, "logs", "--host", host.name, "--path", small])
    if shown.code != 0 or len(shown.stdout) > 200_000:
        tally.bad(category, "wrong exit", f"logs: {shown.code}, {len(shown.stdout)} chars")
    for label, args, words in (
        (
            "logs --diagnose",
            ["logs", "--host", host.name, "--path", path, "--diagnose"],
            "a line longer",
        ),
        (
            "source show",
            ["source", "show", "--host", host.name, "hostile_special/sparse.py"],
            "has a line of",
        ),
    ):
        run = _check(tally, category, label, [*inv, *args])
        if run.code != 1 or words not in run.stdout + run.stderr:
            tally.bad(
                category, "wrong exit", f"{label}: {run.code} {(run.stdout + run.stderr)[-200:]}"
            )
    left = leftovers(box)
    if left:
        tally.bad(category, "leaks", str(left))
    assert not tally.failures(category), tally.categories[category].examples


@pytest.mark.parametrize("diagnose", [False, True], ids=["show", "diagnose"])
def test_local_special_files_are_refused_at_once(
    tmp_path: Path, diagnose: bool, tally: Tally
) -> None:
    if not _mknod_allowed(tmp_path):
        pytest.skip("mknod not permitted")
    category = "special files (local)"
    for kind in KINDS:
        path = make(tmp_path / "local", kind)
        before = _kind_of(path)
        args = ["logs", "--file", str(path), *(["--diagnose"] if diagnose else [])]
        run = _check(tally, category, f"logs --file {kind}", args)
        if run.code != 2 or not (one_line_error(run) or usage_error(run)):
            tally.bad(category, "wrong exit", f"{kind}: {run.code} {run.stderr[-200:]}")
        if _kind_of(path) != before:
            tally.bad(category, "data loss", f"{kind} changed")
    assert not tally.failures(category), tally.categories[category].examples


def _run_measured(argv: list[str], out: Path) -> tuple[int, float]:
    """Exit code and max RSS (MiB) of a process, its stdout into ``out``."""
    import subprocess

    with open(out, "wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.DEVNULL)
        _pid, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss / 1024


def test_a_huge_local_one_line_file_is_shown_cut_in_bounded_memory(tmp_path: Path) -> None:
    """``logs --file`` (shown, not diagnosed) of 512 MiB of NUL bytes without a newline
    (sparse: no disk used) prints the line cut as a host cuts it, and costs fleet no more
    memory than a 4 KiB file does."""
    import sys

    from fleet.diagnosis.host_logs import MAX_LINE_BYTES

    huge, small = tmp_path / "huge.log", tmp_path / "small.log"
    with open(huge, "wb") as fh:
        fh.truncate(512 * 1024 * 1024)
    small.write_bytes(b"\0" * 4096)
    fleet = [sys.executable, "-m", "fleet", "logs", "--file"]
    code_small, rss_small = _run_measured([*fleet, str(small)], tmp_path / "small.out")
    code_huge, rss_huge = _run_measured([*fleet, str(huge)], tmp_path / "huge.out")
    assert code_small == code_huge == 0
    assert rss_huge < rss_small + 64, (rss_small, rss_huge)
    shown = (tmp_path / "huge.out").read_bytes()
    # one line of MAX_LINE_BYTES NULs, each shown as the 4 characters \x00
    assert shown.count(b"\\x00") == MAX_LINE_BYTES, len(shown)
