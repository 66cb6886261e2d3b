"""A conversation: several requests to one on-host script, answered by one process.

``fleet patch`` reads a host's files, plans them on this machine, then writes, all through
one process and one channel (``Conversation`` in fleet/onhost/client.py, ``converse`` in
fleet/onhost/_common.py). Run for real with :class:`LocalRunner` on a real vLLM tree; the
same dialogue over SSH is covered by tests/integration/test_patch.py.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fleet.errors import OperationFailed
from fleet.inventory import HostSpec
from fleet.onhost import client
from fleet.patching import host_calls
from fleet.sandbox.procs import running
from fleet.sandbox.vllm_source import vllm_tree
from fleet.transport import LocalRunner
from tests.faults import set_fault

FETCH = {
    "op": "fetch",
    "patch_set": "eagle3-deepseek",
    "files": ["model_executor/models/deepseek_v2.py"],
    "backup_root": "~/.fleet/patches",
}


@pytest.fixture
def conn(tmp_path: Path) -> LocalRunner:
    home = tmp_path / "home"
    home.mkdir()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "PYTHONPATH": str(vllm_tree("0.17.0"))}
    return LocalRunner(HostSpec(name="h", python=sys.executable), cwd=home, env=env)


def _pid(talk: client.Conversation) -> int:
    dialogue: Any = talk._dialogue
    return int(dialogue.proc.pid)


def _ends(pid: int, within: float) -> float | None:
    """Seconds until process ``pid`` has ended, None if it outlives ``within``."""
    started = time.monotonic()
    while time.monotonic() - started < within:
        if not running(pid):
            return time.monotonic() - started
        time.sleep(0.02)
    return None


def _apply(fetched: dict[str, Any]) -> dict[str, Any]:
    return {
        "op": "apply",
        "patch_set": "eagle3-deepseek",
        "files": [],
        "backup_root": "~/.fleet/patches",
        "package_dir": fetched["package_dir"],
        "version": fetched["version"],
    }


def test_one_process_answers_every_request_and_ends_with_its_stdin(conn: LocalRunner) -> None:
    with client.Conversation(conn, "patch") as talk:
        first = talk.ask_raw(FETCH, timeout=60).result
        pid = _pid(talk)
        # a refusal is an answer: the conversation goes on
        with pytest.raises(client.HostRefusal, match="unknown operation"):
            talk.ask_raw({"op": "no-such-op"}, timeout=60)
        again = talk.ask(FETCH, host_calls.FetchAnswer, timeout=60)
        assert _pid(talk) == pid and running(pid)
        closing = time.monotonic()
    assert conn.commands_run == 1
    assert again.package_dir == first["package_dir"] and again.version == "0.17.0"
    sha = first["files"]["model_executor/models/deepseek_v2.py"]["sha256"]
    assert again.files["model_executor/models/deepseek_v2.py"].sha256 == sha
    # EOF ends the idle script at once (not the runner's 10 s wait before SIGTERM)
    assert _ends(pid, within=5.0) is not None
    assert time.monotonic() - closing < 5.0


def test_a_script_that_dies_mid_conversation_is_an_error_not_a_hang(
    conn: LocalRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_fault(monkeypatch, "after-lock")  # the write exits at once there
    with client.Conversation(conn, "patch") as talk:
        fetched = talk.ask_raw(FETCH, timeout=60).result
        with pytest.raises(client.OnhostError, match=r"without an answer \(exit 97\)"):
            talk.ask_raw(_apply(fetched), timeout=60)
        with pytest.raises(client.OnhostError, match=r"ended \(exit 97\) before the next"):
            talk.ask_raw(FETCH, timeout=60)


def test_a_request_past_its_timeout_fails_and_a_write_still_finishes(
    conn: LocalRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_fault(monkeypatch, "after-lock:sleep=3")
    with client.Conversation(conn, "patch") as talk:
        fetched = talk.ask_raw(FETCH, timeout=60).result
        pid = _pid(talk)
        started = time.monotonic()
        with pytest.raises(OperationFailed, match="timed out after 1s") as info:
            talk.ask_raw(_apply(fetched), timeout=1)
        assert info.value.code == "command-timeout"
        assert time.monotonic() - started < 2.5
    # a write holds (fleet/onhost/_common.py hold_on_hangup): its stdin's end does not cut
    # it; the process ends when it is done (the 3 s pause), not before and not much later
    assert running(pid)
    assert _ends(pid, within=8.0) is not None
    assert 2.5 < time.monotonic() - started < 8.0


def test_an_operation_that_streams_its_output_is_refused_in_a_conversation(
    conn: LocalRunner,
) -> None:
    show = {"op": "show", "path": "_version.py", "start": 1, "end": 2, "time_limit": 30}
    refused = pytest.raises(client.HostRefusal, match="cannot answer in a conversation")
    with client.Conversation(conn, "source") as talk, refused:
        talk.ask_raw(show, timeout=60)


def test_a_missing_interpreter_is_named(tmp_path: Path) -> None:
    conn = LocalRunner(HostSpec(name="h", python=str(tmp_path / "no-python")), cwd=tmp_path)
    missing = pytest.raises(client.PythonMissing, match="not found on the host")
    with client.Conversation(conn, "patch") as talk, missing:
        talk.ask_raw(FETCH, timeout=60)


def test_a_broken_frame_ends_the_conversation(conn: LocalRunner) -> None:
    """Bytes that are not a frame (a length, a newline, the request): the script stops
    reading and ends; fleet reports that it ended, never hangs."""
    with client.Conversation(conn, "patch") as talk:
        talk.ask_raw(FETCH, timeout=60)
        pid = _pid(talk)
        dialogue: Any = talk._dialogue
        dialogue.send(b"not a length\n")
        assert _ends(pid, within=10.0) is not None
        with pytest.raises(client.OnhostError, match="without an answer"):
            talk.ask_raw(FETCH, timeout=10)


def test_leaving_the_block_early_ends_the_script(conn: LocalRunner) -> None:
    """Leaving the block early (an exception here, as on Ctrl-C) ends the script too."""
    with pytest.raises(RuntimeError), client.Conversation(conn, "patch") as talk:
        talk.ask_raw(FETCH, timeout=60)
        pid = _pid(talk)
        raise RuntimeError("the caller failed while the script waited")
    assert _ends(pid, within=5.0) is not None
