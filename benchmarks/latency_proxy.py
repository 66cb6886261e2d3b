"""A latency-injecting TCP proxy for the peers benchmark (loopback only; not shipped).

    python benchmarks/latency_proxy.py --map MAP.json --delay-ms 20 [--ready FILE]

``MAP.json`` is a list of ``[listen_address, listen_port, target_address, target_port]``;
every address must be a loopback one (127.0.0.0/8 or ::1), so nothing leaves this
machine. Each accepted connection models a link with ``delay`` one way:

- the TCP handshake costs one round trip: the proxy waits ``2 * delay`` before it opens
  the connection to the target (a client's first bytes wait with it);
- every chunk read from one side is written to the other ``delay`` after it arrived, in
  order (a queue per direction, so a slow writer never reorders or drops bytes);
- an end of stream (EOF) travels with the same delay; a reset closes both sides.

Bandwidth is not limited: only latency is modelled. When every listener is bound the
proxy writes its pid to ``--ready`` (the benchmark waits for it); SIGTERM/SIGINT stop it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import os
import signal
import sys
from pathlib import Path

CHUNK = 65536


def loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


async def _pipe(
    src: asyncio.StreamReader, dst: asyncio.StreamWriter, delay: float, on_close: asyncio.Event
) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def feed() -> None:
        try:
            while True:
                data = await src.read(CHUNK)
                queue.put_nowait((loop.time() + delay, data))
                if not data:
                    return
        except (ConnectionError, OSError):
            queue.put_nowait((loop.time(), b""))

    async def drain() -> None:
        try:
            while True:
                due, data = await queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    if dst.can_write_eof():
                        dst.write_eof()
                    return
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            return

    feeder = asyncio.ensure_future(feed())
    try:
        await drain()
    finally:
        feeder.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await feeder
        on_close.set()


async def _serve_one(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    target: tuple[str, int],
    delay: float,
) -> None:
    upstream_writer: asyncio.StreamWriter | None = None
    try:
        await asyncio.sleep(2 * delay)  # SYN, SYN-ACK
        try:
            up_reader, upstream_writer = await asyncio.open_connection(*target)
        except OSError:
            return
        done_a, done_b = asyncio.Event(), asyncio.Event()
        await asyncio.gather(
            _pipe(reader, upstream_writer, delay, done_a),
            _pipe(up_reader, writer, delay, done_b),
        )
    finally:
        for w in (writer, upstream_writer):
            if w is not None:
                w.close()
                with contextlib.suppress(Exception):
                    await w.wait_closed()


async def run(mapping: list[tuple[str, int, str, int]], delay: float, ready: Path | None) -> None:
    servers = []
    for listen_addr, listen_port, target_addr, target_port in mapping:
        target = (target_addr, target_port)

        async def handler(
            r: asyncio.StreamReader, w: asyncio.StreamWriter, target: tuple[str, int] = target
        ) -> None:
            await _serve_one(r, w, target, delay)

        servers.append(await asyncio.start_server(handler, listen_addr, listen_port, backlog=512))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        tmp = ready.with_name(ready.name + ".tmp")
        tmp.write_text(f"{os.getpid()}\n")
        os.replace(tmp, ready)
    await stop.wait()
    for server in servers:
        server.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--map", required=True, type=Path)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--ready", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        raw = json.loads(args.map.read_text())
        mapping = [(str(a), int(p), str(ta), int(tp)) for a, p, ta, tp in raw]
    except (OSError, ValueError, TypeError) as exc:
        print(f"latency_proxy: --map {args.map}: {exc}", file=sys.stderr)
        return 2
    bad = [a for m in mapping for a in (m[0], m[2]) if not loopback(a)]
    if bad:
        print(f"latency_proxy: not a loopback address: {bad[0]}", file=sys.stderr)
        return 2
    if args.delay_ms < 0:
        print("latency_proxy: --delay-ms must not be negative", file=sys.stderr)
        return 2
    asyncio.run(run(mapping, args.delay_ms / 1000.0, args.ready))
    return 0


if __name__ == "__main__":
    sys.exit(main())
