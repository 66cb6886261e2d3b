"""Readiness probes on a real socket that is bound first and listens later, as vLLM's is.

vLLM binds its port at start-up and uvicorn calls ``listen()`` only after it printed
``Application startup complete.``: a probe sent on that line can be refused. The probe
here goes through a real :class:`~fleet.transport.runner.LocalRunner` (a TCP connection
on this machine, the way a host's SSH channel reaches its own port).
"""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from fleet.inventory import HostSpec
from fleet.serving import readiness
from fleet.transport.runner import LocalRunner


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


class _LateServer(http.server.HTTPServer):
    """An HTTP server on a socket bound now and listening only when told."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Health, bind_and_activate=False)
        self.server_bind()
        self.serving = threading.Event()

    @property
    def port(self) -> int:
        return int(self.socket.getsockname()[1])

    def listen_after(self, seconds: float) -> threading.Thread:
        def run() -> None:
            time.sleep(seconds)
            self.server_activate()
            self.serving.set()
            self.serve_forever(poll_interval=0.05)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread


@pytest.fixture()
def server() -> Iterator[_LateServer]:
    srv = _LateServer()
    try:
        yield srv
    finally:
        if srv.serving.is_set():
            srv.shutdown()
        srv.server_close()


def _runner() -> LocalRunner:
    return LocalRunner(HostSpec(name="local", python="python3"))


def test_a_bound_port_that_is_not_listening_refuses(server: _LateServer) -> None:
    with pytest.raises(ConnectionRefusedError):
        readiness.request(_runner(), server.port, "GET", "/health", timeout=2.0)


def test_health_is_awaited_until_the_port_listens(server: _LateServer) -> None:
    server.listen_after(0.6)
    started = time.monotonic()
    answer = readiness.wait_listening(_runner(), server.port, timeout=10.0)
    assert answer.status == 200
    assert time.monotonic() - started >= 0.5  # it was refused first, then retried


def test_a_port_that_never_listens_is_refused_after_the_timeout(server: _LateServer) -> None:
    started = time.monotonic()
    with pytest.raises(ConnectionRefusedError):
        readiness.wait_listening(_runner(), server.port, timeout=0.8)
    assert 0.7 <= time.monotonic() - started < 5.0


def test_a_closed_port_is_refused_too() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ConnectionRefusedError):
        readiness.wait_listening(_runner(), port, timeout=0.3)


def test_the_readiness_check_waits_for_the_listen_then_goes_on(server: _LateServer) -> None:
    """check() right on "Application startup complete." gets past /health once the port
    listens (this server has no /v1/models: the next step's answer is the proof)."""
    server.listen_after(0.4)
    with pytest.raises(readiness.NotReady, match="/v1/models answered 404"):
        readiness.check(_runner(), server.port, "kimi-k2.5", listen_timeout=10.0)
