"""``fleet hosts``, ``fleet ping`` and ``fleet trust``."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import click

from fleet.cli.context import AppContext, host_option, pass_app
from fleet.cli.render import console, emit_json, hosts_json, print_outcomes
from fleet.errors import EXIT_OK, EXIT_UNREACHABLE


@click.command()
@click.option("--host", "hosts", multiple=True, metavar="PATTERN", help="Only these hosts.")
@pass_app
def hosts(app: AppContext, hosts: tuple[str, ...]) -> int:
    """List the inventory: hosts, groups and how fleet reaches them."""
    inventory = app.inventory()
    selected = app.select(hosts) if hosts else list(inventory.hosts.values())
    if app.json_output:
        emit_json(
            {
                "inventory": inventory.path,
                "hosts": {h.name: h.model_dump(mode="json") for h in selected},
                "groups": inventory.groups,
            }
        )
        return EXIT_OK
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(f"{inventory.path}: {len(selected)} hosts"), title_justify="left")
    for col in ("host", "address", "user", "groups", "python", "jump"):
        table.add_column(col)
    for h in selected:
        addr = f"{h.target}:{h.port}" if h.port else h.target
        groups = ", ".join(g for g in h.groups if g != "all")
        cells = (h.name, addr, h.user or "-", groups or "-", h.python, h.jump or "-")
        table.add_row(*(escape(c) for c in cells))
    console().print(table)
    return EXIT_OK


@dataclass
class PingResult:
    connect_ms: float
    latency_ms: float
    host_key: str = "pinned"


@click.command()
@host_option()
@pass_app
def ping(app: AppContext, hosts: tuple[str, ...]) -> int:
    """Connect to each host: connect time, round-trip latency and host-key status."""
    from fleet.transport import exit_code, fan_out

    selected = app.select(hosts)
    session = app.session()

    def one(conn: Any) -> PingResult:
        started = time.monotonic()
        conn.run("true", timeout=30).check("true")
        rtt = (time.monotonic() - started) * 1000
        return PingResult(connect_ms=session.connect_ms.get(conn.host.name, 0.0), latency_ms=rtt)

    outcomes = fan_out(session, selected, one, forks=app.forks)
    if app.json_output:
        doc = hosts_json(
            outcomes,
            lambda v: {
                "connect_ms": round(v.connect_ms, 1),
                "latency_ms": round(v.latency_ms, 1),
                "host_key": v.host_key,
            },
        )
        for o in outcomes:
            if not o.ok:
                doc["hosts"][o.host]["host_key"] = _key_status(o.error)
        emit_json(doc)
    else:
        print_outcomes(
            outcomes,
            ["connect", "latency", "host key"],
            lambda v: [f"{v.connect_ms:.0f} ms", f"{v.latency_ms:.1f} ms", v.host_key],
        )
    return exit_code(outcomes)


def _key_status(error: str | None) -> str:
    if not error:
        return "pinned"
    if "not pinned" in error:
        return "unknown"
    if "CHANGED" in error:
        return "changed"
    return "-"


@click.command()
@host_option()
@click.option(
    "--accept-new",
    is_flag=True,
    help="Pin keys seen for the first time (a changed key is never replaced).",
)
@pass_app
def trust(app: AppContext, hosts: tuple[str, ...], accept_new: bool) -> int:
    """Check and pin host keys into each host's known_hosts (OpenSSH accept-new rules).

    Without --accept-new nothing is written: unknown keys are listed with their
    fingerprints so they can be checked first.
    """
    from concurrent.futures import ThreadPoolExecutor

    from fleet.errors import ConnectError
    from fleet.transport.connection import scan_host_key
    from fleet.transport.hostkeys import check_key, pin_key

    selected = app.select(hosts)
    session = app.session()

    def one(spec: Any) -> dict[str, Any]:
        try:
            name, key = scan_host_key(spec, session.options, session.gateway_for(spec))
        except ConnectError as exc:
            error = exc.message.removeprefix(f"{spec.name}: ")
            return {"host": spec.name, "status": "unreachable", "error": error}
        path = spec.known_hosts_path()
        check = check_key(path, name, key)
        status = check.status
        if status == "unknown" and accept_new:
            pin_key(path, name, key)
            status = "added"
        return {
            "host": spec.name,
            "status": status,
            "name": name,
            "key_type": check.key_type,
            "fingerprint": check.fingerprint,
            "pinned_fingerprint": check.pinned_fingerprint,
            "known_hosts": str(path),
        }

    with ThreadPoolExecutor(max_workers=min(app.forks, len(selected))) as pool:
        rows = list(pool.map(one, selected))

    if app.json_output:
        emit_json({"hosts": {r["host"]: {k: v for k, v in r.items() if k != "host"} for r in rows}})
    else:
        from rich.markup import escape
        from rich.table import Table

        table = Table(title="host keys", title_justify="left")
        for col in ("host", "status", "key", "fingerprint", "known_hosts"):
            table.add_column(col, overflow="fold")
        style = {"pinned": "green", "added": "green", "unknown": "yellow", "changed": "bold red"}
        for r in rows:
            st = r["status"]
            table.add_row(
                escape(r["host"]),
                f"[{style.get(st, 'red')}]{st}[/]",
                r.get("key_type", "-"),
                escape(r.get("fingerprint") or r.get("error", "")),
                escape(r.get("known_hosts", "-")),
            )
        console().print(table)
        if any(r["status"] == "unknown" for r in rows):
            console().print(
                "Unknown keys were not pinned. Check the fingerprints, then re-run with "
                "--accept-new."
            )
        for r in rows:
            if r["status"] == "changed":
                console().print(
                    f"[bold red]{escape(r['host'])}: host key CHANGED[/] (pinned "
                    f"{r['pinned_fingerprint']}, offered {r['fingerprint']}). Not replaced: if "
                    f"the host was reinstalled, delete its line for {escape(r['name'])} from "
                    f"{escape(r['known_hosts'])} and run trust again.",
                    soft_wrap=True,
                )
    bad = [r for r in rows if r["status"] in ("unknown", "changed", "unreachable")]
    if bad:
        return EXIT_UNREACHABLE
    return EXIT_OK
