"""Fixtures of the hostile suite: the session tally (printed as a table at the end of the
run) and a canary path that payloads try to create. Helpers: hostile_support.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hostile_support import TALLY, Tally


@pytest.fixture(scope="session")
def tally() -> Tally:
    return TALLY


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if not TALLY.categories:
        return
    terminalreporter.write_sep("-", "fleet hostile suite: attempts and failures")
    for row in TALLY.table():
        terminalreporter.write_line(row)


@pytest.fixture
def canary(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A path that must never come to exist: payloads try to create it."""
    path = tmp_path_factory.mktemp("canary") / "PWNED"
    yield str(path)
    assert not path.exists(), "an injection payload ran"
