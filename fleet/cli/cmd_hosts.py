"""``fleet hosts``, ``fleet ping`` and ``fleet trust``."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import click

from fleet.cli.context import AppContext, host_option, pass_app
from fleet.cli.render import emit_json, escape, failure_lines, host_table, styled_status
from fleet.errors import EXIT_OK
from fleet.transport.outcome import hosts_json


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
    from rich.table import Table

    table = Table(title=escape(f"{inventory.path}: {len(selected)} hosts"), title_justify="left")
    for col in ("host", "address", "user", "groups", "python", "jump"):
        table.add_column(col)
    for h in selected:
        addr = f"{h.target}:{h.port}" if h.port else h.target
        groups = ", ".join(g for g in h.groups if g != "all")
        cells = (h.name, addr, h.user or "-", groups or "-", h.python, h.jump or "-")
        table.add_row(*(escape(c) for c in cells))
    app.console.print(table)
    return EXIT_OK


@dataclass
class PingResult:
    connect_ms: float
    latency_ms: float
    host_key: str = "pinned"


# ``host_key`` of a host that could not be reached, by its error code
KEY_STATUS_OF_CODE = {
    "host-key-unknown": "unknown",
    "host-key-changed": "changed",
    "host-key-revoked": "revoked",
}


@click.command()
@host_option()
@pass_app
def ping(app: AppContext, hosts: tuple[str, ...]) -> int:
    """Connect to each host: connect time, round-trip latency and host-key status."""
    from fleet.transport import exit_code

    selected = app.select(hosts)
    session = app.session()

    def one(conn: Any) -> PingResult:
        started = time.monotonic()
        conn.run(["true"], timeout=30).check("true")
        rtt = (time.monotonic() - started) * 1000
        return PingResult(connect_ms=session.connect_ms.get(conn.host.name, 0.0), latency_ms=rtt)

    outcomes = app.fan_out(selected, one, session)
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
                doc["hosts"][o.host]["host_key"] = KEY_STATUS_OF_CODE.get(o.code or "", "-")
        emit_json(doc)
    else:
        host_table(
            app.console,
            outcomes,
            ["connect", "latency", "host key"],
            lambda v: [f"{v.connect_ms:.0f} ms", f"{v.latency_ms:.1f} ms", v.host_key],
        )
    return exit_code(outcomes)


TRUST_STYLE = {"pinned": "green", "added": "green", "unknown": "yellow", "changed": "bold red"}


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
    from fleet.transport import exit_code
    from fleet.transport.trust import TrustReport, trust_host

    selected = app.select(hosts)
    session = app.session()
    outcomes = app.map_hosts(
        selected, lambda spec: trust_host(session, spec, accept_new=accept_new), session
    )
    if app.json_output:
        emit_json(hosts_json(outcomes, TrustReport.to_json))
        return exit_code(outcomes)
    from rich.table import Table

    out = app.console
    table = Table(title="host keys", title_justify="left")
    for col in ("host", "status", "key", "fingerprint", "known_hosts"):
        table.add_column(col, overflow="fold")
    for o in outcomes:
        r = o.value
        if r is None:
            table.add_row(escape(o.host), styled_status(o.status), "-", escape(o.error), "-")
            continue
        table.add_row(
            escape(o.host),
            f"[{TRUST_STYLE.get(r.status, 'red')}]{r.status}[/]",
            escape(r.key_type),
            escape(r.fingerprint),
            escape(r.known_hosts),
        )
    out.print(table)
    if any(o.value is not None and o.value.status == "unknown" for o in outcomes):
        out.print(
            "Unknown keys were not pinned. Check the fingerprints, then re-run with --accept-new."
        )
    failure_lines(out, [o for o in outcomes if o.value is None or o.value.status == "changed"])
    return exit_code(outcomes)
