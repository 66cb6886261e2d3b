"""Shared fixtures: rehearsal hosts (real OpenSSH sshd on loopback) for integration tests.

The hosts come from ``fleet.sandbox.core.Sandbox`` -- the same code as ``fleet sandbox up``.
By default each host is a local sshd run as the current user; with
``FLEET_SANDBOX_BACKEND=docker`` (and a Docker engine) each is a docker-sshd container
built from ``tests/docker``. The header and the summary of the test run say which ran.

Fixtures
--------
``sandbox``
    A fresh fleet for one test, torn down after it. Configure with the marker
    ``@pytest.mark.sandbox(hosts=3, vllm=("0.17.0", "0.18.0"), pinned=True,
    load_seconds=2.0)`` (all optional; the values shown are the defaults). Use it when a
    test changes hosts: patches files, stops/kills/re-keys a host, unpins keys.
``shared_sandbox``
    One fleet for the whole session (3 hosts: 0.17.0, 0.18.0, 0.17.0). Read-only use only:
    inspect, source show/grep, ping. Never modify it.
``sandbox_factory``
    ``sandbox_factory(hosts=..., vllm=..., pinned=..., load_seconds=...)`` for tests that
    need several fleets or a size decided at run time; each is torn down at session end.

What a ``Sandbox`` offers (see ``fleet/sandbox/core.py``)::

    box.inventory_path, box.known_hosts_path, box.client_key_path, box.dir
    box.hosts -> [SandboxHost(name, vllm, address, port, home, python)]
    box.run_fleet("inspect", "--host", "all", "--json") -> CompletedProcess (real process)
    box.stop_host(name) / box.start_host(name)   host down (connection refused) / back up
    box.kill_host(name)          SIGKILL its sshd and live sessions (a crash mid-run)
    box.rotate_host_key(name)    new host key, known_hosts keeps the old one
    box.unpin() / box.pin([names])   empty known_hosts / pin current keys
    box.connection_count(name, since=box.log_marks()[name])   from the sshd log
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from fleet.sandbox.core import BACKEND_ENV, Sandbox, default_backend, make_backend
from tests.versions import SANDBOX_DEFAULT

DEFAULT_VERSIONS = SANDBOX_DEFAULT
DEFAULT_LOAD_SECONDS = 2.0

_SANDBOX_KEY = pytest.StashKey["SandboxFactory"]()


def _backend_label() -> str:
    """Which rehearsal hosts this run uses, for the report header and summary."""
    try:
        kind = default_backend()
        return make_backend(kind, Path(os.devnull), "nobody").describe()
    except Exception as exc:  # a header must never break the run
        return f"{os.environ.get(BACKEND_ENV, 'local')} (unavailable: {exc})"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "sandbox(hosts=3, vllm=('0.17.0', '0.18.0'), pinned=True, load_seconds=2.0): "
        "configure the `sandbox` fixture (real sshd rehearsal hosts)",
    )


REAL_ENGINE = "FLEET_REAL_ENGINE"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``real`` (the real vLLM CPU engine: minutes and gigabytes) run only in
    the real-engine stage (scripts/test-real.sh sets FLEET_REAL_ENGINE=1); elsewhere they
    are deselected, not skipped."""
    if os.environ.get(REAL_ENGINE) == "1":
        return
    kept = [item for item in items if item.get_closest_marker("real") is None]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = kept


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [
        f"fleet sandbox hosts: {_backend_label()}",
        f"  (set {BACKEND_ENV}=docker to use docker-sshd containers where a Docker engine runs)",
    ]


class SandboxFactory:
    """Starts rehearsal fleets under a session temp dir and stops them all at the end."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self._tmp = tmp_path_factory
        self.started: list[Sandbox] = []
        self.host_count = 0
        self.label: str | None = None

    def __call__(
        self,
        hosts: int = 3,
        vllm: Sequence[str] = DEFAULT_VERSIONS,
        *,
        pinned: bool = True,
        load_seconds: float = DEFAULT_LOAD_SECONDS,
        name: str = "sandbox",
        **options: Any,
    ) -> Sandbox:
        directory = self._tmp.mktemp(name)
        box = Sandbox.up(
            directory,
            hosts=hosts,
            versions=list(vllm),
            load_seconds=load_seconds,
            pinned=pinned,
            **options,
        )
        self.started.append(box)
        self.host_count += hosts
        if self.label is None:
            self.label = box.describe()
        return box

    def stop_all(self) -> None:
        errors = []
        for box in self.started:
            try:
                box.down()
            except Exception as exc:  # keep stopping the others
                errors.append(f"{box.dir}: {exc}")
        if errors:
            raise RuntimeError("sandbox teardown failed: " + "; ".join(errors))


@pytest.fixture(scope="session")
def sandbox_factory(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[SandboxFactory]:
    factory = SandboxFactory(tmp_path_factory)
    pytestconfig.stash[_SANDBOX_KEY] = factory
    try:
        yield factory
    finally:
        factory.stop_all()


@pytest.fixture(scope="session")
def shared_sandbox(sandbox_factory: SandboxFactory) -> Sandbox:
    """Three hosts (0.17.0, 0.18.0, 0.17.0) shared by the session: read-only use."""
    return sandbox_factory(3, DEFAULT_VERSIONS, name="shared-sandbox")


@pytest.fixture
def sandbox(request: pytest.FixtureRequest, sandbox_factory: SandboxFactory) -> Iterator[Sandbox]:
    """A fresh fleet for this test (``@pytest.mark.sandbox(...)`` configures it)."""
    marker = request.node.get_closest_marker("sandbox")
    options: dict[str, Any] = dict(marker.kwargs) if marker else {}
    if marker and marker.args:
        options.setdefault("hosts", marker.args[0])
    box = sandbox_factory(
        int(options.pop("hosts", 3)),
        tuple(options.pop("vllm", DEFAULT_VERSIONS)),
        pinned=bool(options.pop("pinned", True)),
        load_seconds=float(options.pop("load_seconds", DEFAULT_LOAD_SECONDS)),
    )
    if options:
        raise pytest.UsageError(f"unknown @pytest.mark.sandbox options: {sorted(options)}")
    try:
        yield box
    finally:
        box.down()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    factory = config.stash.get(_SANDBOX_KEY, None)
    if factory is None or not factory.started:
        return
    terminalreporter.write_sep("-", "fleet sandbox")
    terminalreporter.write_line(
        f"{len(factory.started)} sandbox fleet(s), {factory.host_count} host(s) on "
        f"{factory.label or default_backend()}"
    )
