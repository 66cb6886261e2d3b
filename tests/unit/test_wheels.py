"""fleet.wheels: pinned wheels cached by name; pip's own error is what the user sees."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet import wheels
from fleet.errors import OperationFailed


def test_a_requirement_must_be_pinned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_CACHE", str(tmp_path))
    for bad in ("vllm", "vllm>=0.17", "==0.17.0", "vllm=="):
        with pytest.raises(ValueError, match="pinned requirement"):
            wheels.wheel(bad)


def test_pips_error_line_reaches_the_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pip refuses a malformed version before any download (no network needed): the message
    is pip's ERROR line, not the caret line pip prints under the requirement."""
    monkeypatch.setenv("FLEET_CACHE", str(tmp_path))
    with pytest.raises(OperationFailed) as info:
        wheels.wheel("vllm==0.0.0.not-a-version")
    message = str(info.value)
    assert message.startswith("could not download vllm==0.0.0.not-a-version with pip: ")
    assert "Invalid requirement" in message and "~" not in message
    assert not list((tmp_path / "wheels").glob("*.whl"))


def test_a_cached_wheel_is_found_without_pip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_CACHE", str(tmp_path))

    def no_pip(*args: object, **kwargs: object) -> None:
        raise AssertionError("pip ran although the wheel is cached")

    monkeypatch.setattr(wheels.subprocess, "run", no_pip)
    cached = tmp_path / "wheels" / "supervisor-4.3.0-py2.py3-none-any.whl"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"PK")
    assert wheels.wheel("supervisor==4.3.0") == cached


@pytest.mark.parametrize(
    ("stderr", "expected"),
    [
        ("", "no output"),
        (
            "WARNING: x\nERROR: first\n  detail\nERROR: No matching distribution\n",
            "No matching distribution",
        ),
        ("Traceback (most recent call last):\n  boom\nOSError: disk full\n", "OSError: disk full"),
    ],
)
def test_pip_error_picks_the_line_that_says_what_went_wrong(stderr: str, expected: str) -> None:
    assert wheels.pip_error(stderr) == expected
