"""The tests' fault harness for ``fleet patch``: stop, pause or fail an on-host write at
one of its named points, in the bundle fleet sends, without a knob in fleet itself.

The on-host patch script names the points of a write with ``checkpoint(point)`` (a no-op
in fleet). :func:`inject` makes every bundle this process sends carry, before its call,
a definition that rebinds ``checkpoint`` (and, for ``compile-error``, the compile step):

    "<point>"                 exit at once at that point (as if killed)
    "<point>:sleep=<seconds>" pause there
    "<point>:raise"           raise OSError(ENOSPC) there
    "compile-error"           the host's compile step refuses every new text

``python -m tests.faults SPEC -- FLEET ARGS...`` runs fleet's command line with the fault
(for tests that run fleet as a process).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

CALL = b"\nraise SystemExit("


def fault_code(spec: str) -> str:
    """Python that rebinds the patch script's fault points for ``spec``."""
    items = [item.strip() for item in spec.split(",") if item.strip()]
    lines = [
        "import errno as _f_errno, os as _f_os, time as _f_time",
        f"_F_SPEC = {items!r}",
        "def checkpoint(point):",
        "    for item in _F_SPEC:",
        "        name, _, action = item.partition(':')",
        "        if name != point:",
        "            continue",
        "        if action.startswith('sleep='):",
        "            _f_time.sleep(float(action[6:]))",
        "        elif action == 'raise':",
        "            raise OSError(_f_errno.ENOSPC, 'injected fault at ' + point)",
        "        else:",
        "            _f_os._exit(97)",
    ]
    if "compile-error" in items:
        lines.append("_compile = lambda data, path: 'injected compile error'")
    return "\n".join(lines) + "\n"


def _wrap(original: Callable[..., bytes], spec: str) -> Callable[..., bytes]:
    code = ("\n" + fault_code(spec)).encode("utf-8")

    def with_request(name: str, request: dict[str, Any], *, entry: str = "serve") -> bytes:
        text = original(name, request, entry=entry)
        if name != "patch":
            return text
        at = text.rfind(CALL)
        return text[:at] + code + text[at:]

    with_request.__wrapped_original__ = original  # type: ignore[attr-defined]
    return with_request


@contextmanager
def inject(spec: str) -> Iterator[None]:
    """Every patch bundle sent inside the block carries the fault ``spec``."""
    from fleet.onhost import client

    original = client.with_request
    client.with_request = _wrap(_original(), spec)  # type: ignore[assignment]
    try:
        yield
    finally:
        client.with_request = original  # type: ignore[assignment]


def set_fault(monkeypatch: Any, spec: str) -> None:
    """:func:`inject` for the rest of a test (``monkeypatch``: pytest's fixture)."""
    from fleet.onhost import client

    monkeypatch.setattr(client, "with_request", _wrap(_original(), spec))


def clear_fault(monkeypatch: Any) -> None:
    from fleet.onhost import client

    monkeypatch.setattr(client, "with_request", _original())


def _original() -> Callable[..., bytes]:
    from fleet.onhost import client

    found = client.with_request
    return getattr(found, "__wrapped_original__", found)


def main(argv: list[str]) -> None:
    spec, sep, rest = argv[0], argv[1], argv[2:]
    assert sep == "--", "usage: python -m tests.faults SPEC -- FLEET ARGS..."
    from fleet.console import main as fleet_main

    with inject(spec):
        sys.argv = ["fleet", *rest]
        fleet_main()


if __name__ == "__main__":
    main(sys.argv[1:])
