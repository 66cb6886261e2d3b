"""The remote log commands (fleet.diagnosis.host_logs), run HERE by real shells on real files.

A ``LocalConnection`` runs each command the way a host's login shell would (``<shell> -c
COMMAND``), so the byte caps, the one-snapshot line numbering and the ``sh -c`` wrapping
are checked on the real ``grep``/``awk``/``tail``; nothing of the code under test is mocked.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import stat
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from fleet.diagnosis import Engine
from fleet.diagnosis import host_logs as R
from fleet.inventory import HostSpec
from fleet.transport import LocalRunner
from fleet.transport.follow import follow_command

OOM = (
    "(EngineCore_DP0 pid=7) ERROR 11-02 10:15:01 [core.py:708] torch.OutOfMemoryError: CUDA out "
    "of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
    "1.00 GiB is free."
)
KV = (
    "(EngineCore_DP0 pid=7) ERROR 11-02 10:15:01 [core.py:708] ValueError: No available memory "
    "for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine."
)
INFO = "(APIServer pid=1) INFO 11-02 10:14:01 [api_server.py:1] line {n}"


def LocalConnection(shell: str = "sh", env: dict[str, str] | None = None) -> LocalRunner:
    """This machine as the host: ``<login shell> -c COMMAND``, as sshd runs it."""
    return LocalRunner(
        HostSpec(name="local", python="python3"), env=env, login_shell=str(shutil.which(shell))
    )


def shells() -> list[str]:
    return [s for s in ("sh", "bash", "dash", "fish", "tcsh", "csh", "zsh") if shutil.which(s)]


# --------------------------------------------------------------------------- sh -c (7)


def test_every_remote_command_is_one_sh_word(tmp_path: Path) -> None:
    log = tmp_path / "v.log"
    commands = [
        R.grep_command(str(log)),
        R.grep_command(str(log), tail=5),
        R.tail_command(str(log), 5),
        follow_command(str(log), start=1, pid=0, token="t0"),
        R.grep_command("~/.fleet/run/p/vllm.log"),
    ]
    for cmd in commands:
        assert "\n" not in cmd
        words = shlex.split(cmd)
        assert words[:2] == ["sh", "-c"] and len(words) == 3, cmd
        assert "$((" in words[2] or "awk" in words[2] or "exec" in words[2]


def test_port_holder_runs_under_sh() -> None:
    conn = LocalConnection()
    R.port_holder(conn, "8000")
    assert conn.commands and shlex.split(conn.commands[0])[:2] == ["sh", "-c"]
    assert R.port_holder(conn, "²") is None and R.port_holder(conn, "99999") is None


@pytest.mark.parametrize("shell", shells())
def test_grep_and_tail_commands_under_any_login_shell(shell: str, tmp_path: Path) -> None:
    """The same answer whatever the login shell is (fish and csh cannot run ``$((..))``,
    ``2>/dev/null`` or ``if ...; then`` themselves)."""
    log = tmp_path / 'it\'s a "log" $x.log'
    lines = [INFO.format(n=n) for n in range(1, 40)] + [KV]
    log.write_text("\n".join(lines) + "\n")
    conn = LocalConnection(shell=shell)
    result = R.diagnose_remote(conn, str(log), tail=10)
    assert [d.id for d in result.diagnoses][:1] == ["kv-cache-no-memory"]
    assert result.diagnoses[0].evidence[0].line == 40
    assert result.file_size == log.stat().st_size
    res = conn.run(R.tail_command(str(log), 3))
    header = R.Header()
    numbered = list(R.parse_numbered(res.stdout.splitlines(), header))
    assert numbered == [(n, lines[n - 1]) for n in (38, 39, 40)]


# --------------------------------------------------------------------------- byte cap (4)


def _all_candidates(path: Path, count: int) -> list[str]:
    """``count`` lines that all match the prefilter (and a rule); the last one differs."""
    lines = [f"{OOM} #{n}" for n in range(1, count)] + [KV]
    path.write_text("\n".join(lines) + "\n")
    return lines


def test_every_line_a_candidate_is_capped_in_bytes(tmp_path: Path) -> None:
    log = tmp_path / "all.log"
    lines = _all_candidates(log, 60_000)  # ~11 MiB, every line matches the prefilter
    size = log.stat().st_size
    conn = LocalConnection()
    cap = 32 * 1024
    result = R.diagnose_remote(conn, str(log), head_bytes=cap, tail_bytes=cap)
    assert result.bytes_received < 0.01 * size
    assert result.truncated and result.dropped_lines > 0
    assert any("skipped" in note for note in result.notes)
    # both ends are kept, with their real line numbers
    found = {d.id: d for d in result.diagnoses}
    assert found["cuda-oom"].evidence[0].line == 1
    assert found["kv-cache-no-memory"].evidence[0].line == len(lines)


def test_default_cap_bounds_the_output(tmp_path: Path) -> None:
    log = tmp_path / "all.log"
    _all_candidates(log, 60_000)
    size = log.stat().st_size
    assert size > 2 * R.output_cap()
    res = LocalConnection().run(R.grep_command(str(log)))
    assert res.ok, res.stderr
    assert len(res.stdout_bytes) <= R.output_cap() + 200
    header = R.Header()
    pairs = list(R.parse_grep(res.stdout.splitlines(), header))
    assert header.dropped > 0
    assert pairs[0][0] == 1 and pairs[-1] == (60_000, KV)


# --------------------------------------------------------------------------- one snapshot (5)


def _growing_wc(bin_dir: Path, log: Path) -> dict[str, str]:
    """A ``wc`` that appends 5 lines to ``log`` after each run: the log grows between the
    commands of one remote script, as a live vLLM log does."""
    bin_dir.mkdir()
    real = shutil.which("wc")
    assert real
    wc = bin_dir / "wc"
    wc.write_text(
        f'#!/bin/sh\n{real} "$@"\nrc=$?\n'
        f'for i in 1 2 3 4 5; do echo "grown $i" >> {shlex.quote(str(log))}; done\nexit $rc\n'
    )
    wc.chmod(wc.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "HOME": str(log.parent)}


def test_the_filter_statistics_are_logged_at_v(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``-v`` (INFO) says what the remote filter moved: candidate lines, the log's size,
    the bytes and fraction moved, lines dropped, diagnoses."""
    log = tmp_path / "big.log"
    log.write_text("".join(INFO.format(n=n) + "\n" for n in range(1, 2001)) + KV + "\n")
    caplog.set_level(logging.INFO, logger="fleet.diagnosis.host_logs")
    result = R.diagnose_remote(LocalConnection(), str(log))
    said = [r for r in caplog.records if r.name == "fleet.diagnosis.host_logs"]
    assert len(said) == 1 and said[0].levelno == logging.INFO
    message = said[0].getMessage()
    size = log.stat().st_size
    assert f"{result.candidate_lines} candidate lines of a {size}-byte log" in message
    assert f"{result.bytes_received} bytes moved" in message and "1 diagnoses" in message


def test_tail_numbers_come_from_one_snapshot(tmp_path: Path) -> None:
    log = tmp_path / "live.log"
    log.write_text("".join(INFO.format(n=n) + "\n" for n in range(1, 21)) + KV + "\n")
    conn = LocalConnection(env=_growing_wc(tmp_path / "bin", log))
    res = conn.run(R.tail_command(str(log), 4))
    assert res.ok, res.stderr
    numbered = list(R.parse_numbered(res.stdout.splitlines(), R.Header()))
    final = log.read_text().splitlines()
    assert len(final) > 21  # it did grow meanwhile
    assert [n for n, _ in numbered] == [18, 19, 20, 21]
    for n, text in numbered:
        assert final[n - 1] == text


def test_diagnose_tail_numbers_come_from_one_snapshot(tmp_path: Path) -> None:
    log = tmp_path / "live.log"
    log.write_text("".join(INFO.format(n=n) + "\n" for n in range(1, 21)) + KV + "\n")
    conn = LocalConnection(env=_growing_wc(tmp_path / "bin", log))
    result = R.diagnose_remote(conn, str(log), tail=4)
    assert len(log.read_text().splitlines()) > 21
    assert result.diagnoses[0].id == "kv-cache-no-memory"
    assert result.diagnoses[0].evidence[0].line == 21


def test_tail_counts_a_last_line_without_newline(tmp_path: Path) -> None:
    log = tmp_path / "partial.log"
    log.write_text("a\nb\nc")
    res = LocalConnection().run(R.tail_command(str(log), 2))
    assert list(R.parse_numbered(res.stdout.splitlines(), R.Header())) == [(2, "b"), (3, "c")]


def test_follow_starts_where_the_snapshot_ends(tmp_path: Path) -> None:
    """``tail -n`` of the snapshot, then the follow from the byte after it: the lines
    written meanwhile (by the snapshot's own ``wc``) are neither lost nor shown twice, and
    numbers stay right."""
    log = tmp_path / "f.log"
    log.write_text("".join(f"l{n}\n" for n in range(1, 11)) + "l11-start")
    session = _Session(LocalConnection(env=_growing_wc(tmp_path / "bin", log)))
    got: list[tuple[int, str]] = []
    follow = R.follow_resumable(session, session.runner.host, str(log), lines=3, tick=0.2)
    try:
        for n, text, _fresh in follow:  # l9, l10, l11-start + the grown lines
            got.append((n, text))
            if len(got) == 3 + 4:
                break
    finally:
        follow.close()
    final = log.read_text().split("\n")
    for n, text in got:
        assert final[n - 1] == text, (n, text)
    assert [n for n, _ in got] == list(range(9, 16))
    assert got[0] == (9, "l9") and got[2] == (11, "l11-startgrown 1")


# --------------------------------------------------------------------------- follow cost (6)


def test_follow_recomputes_results_only_for_new_findings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = {"n": 0}
    original = Engine.results

    def counting(self: Engine) -> list[R.Diagnosis]:
        calls["n"] += 1
        return original(self)

    monkeypatch.setattr(Engine, "results", counting)
    body = [INFO.format(n=n) for n in range(1, 50)]
    body += [f"{OOM} repeat {n}" for n in range(3000)]  # one finding, 3000 matching lines
    body += [INFO.format(n=n) for n in range(50, 100)] + [KV]
    log = tmp_path / "x.log"
    log.write_text("".join(f"l{n}\n" for n in range(100)) + "\n".join(body) + "\n")
    fresh_ids: list[tuple[int, str]] = []
    count = 0
    session = _Session(LocalConnection())
    follow = R.follow_resumable(session, session.runner.host, str(log), lines=len(body), tick=0.2)
    try:
        for n, _text, fresh in follow:
            count += 1
            fresh_ids += [(n, d.id) for d in fresh]
            if n == 100 + len(body):  # the log's last line
                break
    finally:
        follow.close()
    assert count == len(body)
    assert fresh_ids == [(150, "cuda-oom"), (100 + len(body), "kv-cache-no-memory")]
    assert calls["n"] <= 4  # one per new finding, not one per matching line


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_special_files_are_refused_at_once(kind: str, tmp_path: Path) -> None:
    """A FIFO or /dev/zero would block or never end on the host: refused, not read."""
    from fleet.errors import OperationFailed

    if kind == "fifo":
        path = tmp_path / "log.fifo"
        os.mkfifo(path)
    elif kind == "device":
        path = Path("/dev/zero")  # only read, never written
    else:
        path = tmp_path
    started = time.monotonic()
    for call in (
        lambda: R.diagnose_remote(LocalConnection(), str(path), timeout=30),
        lambda: R.tail_lines(LocalConnection(), str(path), 5, timeout=30),
    ):
        with pytest.raises(OperationFailed, match=r"not a regular file|cannot read") as info:
            call()
        assert info.value.code == "log-not-found"
    assert time.monotonic() - started < 10


class _DroppingRunner(LocalRunner):
    """This machine as a host whose connection drops: every follow stream it opens breaks
    (``ConnectionLost``) after its first ``keep`` chunks, until ``drops`` have happened."""

    def __init__(self, drops: list[int], keep: int) -> None:
        super().__init__(HostSpec(name="local", python="python3"))
        self.drops = drops
        self.keep = keep

    def stream_bytes(
        self,
        command: Any,
        *,
        timeout: float | None = None,
        tick: bool = False,
    ) -> Generator[bytes, None, None]:
        from fleet.transport import ConnectionLost

        inner = super().stream_bytes(command, timeout=timeout, tick=tick)
        seen = 0
        try:
            for data in inner:
                yield data
                seen += 1 if data else 0
                if self.drops and seen >= self.keep:
                    self.drops.pop()
                    raise ConnectionLost("local", "the connection was lost (test)")
        finally:
            inner.close()


class _Session:
    def __init__(self, runner: LocalRunner) -> None:
        self.runner = runner
        self.reconnects = 0

    def connect(self, host: HostSpec) -> LocalRunner:
        return self.runner

    def reconnect(self, host: HostSpec) -> LocalRunner:
        self.reconnects += 1
        return self.runner


def test_resumable_follow_loses_and_repeats_nothing_across_dropped_connections(
    tmp_path: Path,
) -> None:
    """The snapshot's last lines (its last one still without a newline), then the bytes
    after the snapshot, through three dropped connections while the log grows: every
    line once, numbered as in the file, the unfinished line joined with its end."""
    import threading

    log = tmp_path / "f.log"
    log.write_text("".join(f"l{n}\n" for n in range(1, 11)) + "l11-start")
    session = _Session(_DroppingRunner(drops=[1, 1, 1], keep=1))
    host = session.runner.host

    def grow() -> None:
        with open(log, "a") as fh:
            fh.write("-end\n")
            for n in range(12, 40):
                fh.write(f"l{n}\n")
                fh.flush()
                time.sleep(0.02)

    got: list[tuple[int, str]] = []
    writer = threading.Thread(target=grow)
    follow = R.follow_resumable(session, host, str(log), lines=3, tick=0.2)
    try:
        for n, text, _fresh in follow:
            got.append((n, text))
            if n == 9:
                writer.start()
            if n == 39:
                break
    finally:
        follow.close()
        writer.join()
    assert got == [(9, "l9"), (10, "l10"), (11, "l11-start-end")] + [
        (n, f"l{n}") for n in range(12, 40)
    ]
    assert session.reconnects == 3


def test_resumable_follow_of_an_unreadable_file_fails() -> None:
    from fleet.errors import OperationFailed

    session = _Session(LocalConnection())
    with pytest.raises(OperationFailed, match="cannot read"):
        list(R.follow_resumable(session, session.runner.host, "/no/such/x.log"))
