"""``fleet inspect``: facts about each host in one round trip (see fleet.facts)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from fleet.cli.context import AppContext, host_option, pass_app
from fleet.sizes import human_bytes

if TYPE_CHECKING:
    from rich.console import Console

    from fleet.facts import HostFacts
    from fleet.transport import HostOutcome

SHORT_CLASS = {
    "DeepseekV2ForCausalLM": "V2",
    "DeepseekV3ForCausalLM": "V3",
    "KimiK25ForConditionalGeneration": "K2.5",
}


@click.command()
@host_option()
@click.option(
    "--details/--no-details",
    default=None,
    help="One panel per host after the table [default: on for a single host or with -v].",
)
@pass_app
def inspect(app: AppContext, hosts: tuple[str, ...], details: bool | None) -> int:
    """Facts per host: GPUs, driver, Python, vLLM version and path, EAGLE-3 support per
    model class, the config-time EAGLE-3 allowlist, supervisors, running vLLM servers and
    free disk. One SSH command per host; vLLM is never imported."""
    from fleet.facts import gather_facts
    from fleet.transport import exit_code

    selected = app.select(hosts)
    session = app.session()
    outcomes = app.fan_out(selected, gather_facts, session)
    if app.json_output:
        from fleet.cli.render import emit_json

        emit_json(inspect_json(outcomes))
    else:
        show_details = details if details is not None else (len(selected) == 1 or app.verbose > 0)
        render_outcomes(app.console, outcomes, show_details)
    return exit_code(outcomes)


def inspect_json(outcomes: list[HostOutcome[HostFacts]]) -> dict[str, Any]:
    """``{"hosts": {name: {"ok": true, ...facts} | {"ok": false, "error": ...}}}``."""
    from fleet.transport import hosts_json

    return hosts_json(outcomes, lambda facts: facts.model_dump(mode="json"))


# -- for people -------------------------------------------------------------------------


def _mark(value: bool | None) -> str:
    if value is None:
        return "[dim]–[/]"
    return "[green]✓[/]" if value else "[red]✗[/]"


def eagle3_cell(facts: HostFacts) -> str:
    """One mark per class of EAGLE3_CLASSES, in order (V2 V3 K2.5)."""
    if not facts.vllm.installed or not facts.vllm.eagle3:
        return "-"
    return " ".join(_mark(value) for value in facts.vllm.eagle3.values())


def allowlist_cell(facts: HostFacts) -> str:
    allow = facts.vllm.eagle3_allowlist
    if allow is None:
        return "-"
    if not allow.present:
        return "[dim]no check[/]"
    if allow.deepseek == allow.kimi:
        return _mark(allow.deepseek)
    return "deepseek only" if allow.deepseek else "kimi only"


_DISK = ("GiB", "MiB")  # a disk in whole GiB (or MiB when it is that small)


def servers_cell(facts: HostFacts) -> str:
    if not facts.servers:
        return "none"
    return ", ".join(f"pid {s.pid}" + (f" :{s.port}" if s.port else "") for s in facts.servers)


def vllm_cell(facts: HostFacts) -> str:
    from rich.markup import escape

    if not facts.vllm.installed:
        return "[red]not installed[/]"
    return escape(facts.vllm.version or "?")


def gpu_cell(facts: HostFacts) -> str:
    from rich.markup import escape

    from fleet.facts import gpu_summary

    if facts.nvidia_smi == "missing":
        return "[dim]no nvidia-smi[/]"
    if facts.nvidia_smi == "failed":
        return "[red]nvidia-smi failed[/]"
    return escape(gpu_summary(facts.gpus))


def render_outcomes(out: Console, outcomes: list[HostOutcome[HostFacts]], details: bool) -> None:
    """A table (one row per host; the key facts never truncated), a legend, one line per
    failed host with its error and next step, then with ``details`` a panel per host."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    from fleet.cli.render import STATUS_STYLE, failure_lines

    table = Table(title="fleet inspect", title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("host", no_wrap=True)
    table.add_column("GPUs / driver", overflow="fold", min_width=12)
    table.add_column("Python", no_wrap=True)
    table.add_column("vLLM", no_wrap=True)
    table.add_column("EAGLE-3", no_wrap=True)
    table.add_column("allowlist", no_wrap=True)
    table.add_column("servers", overflow="fold")
    for o in outcomes:
        name = f"[{STATUS_STYLE[o.status]}]{escape(o.host)}[/]"
        f = o.value
        if o.ok and f is not None:
            gpus = gpu_cell(f) + (f"\n[dim]{escape(f.driver)}[/]" if f.driver else "")
            table.add_row(
                name,
                gpus,
                escape(f.python or "-"),
                vllm_cell(f),
                eagle3_cell(f),
                allowlist_cell(f),
                servers_cell(f),
            )
        else:
            table.add_row(name, f"[{STATUS_STYLE[o.status]}]{o.status}[/]", *(["-"] * 5))
    ok = sum(o.ok for o in outcomes)
    table.caption = f"{ok}/{len(outcomes)} ok"
    out.print(table)
    if ok:
        out.print(
            "[dim]EAGLE-3: " + " ".join(SHORT_CLASS) + "; allowlist: whether the "
            "config-time EAGLE-3 check admits DeepSeek/Kimi. Details: --details or -v.[/]"
        )
    failure_lines(out, outcomes)
    if details:
        for o in outcomes:
            if o.ok and o.value is not None:
                render_host(out, o.host, o.value)


def render_host(out: Console, name: str, facts: HostFacts) -> None:
    from rich.markup import escape
    from rich.panel import Panel
    from rich.table import Table

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row("hostname", escape(facts.hostname or "-"))
    gpus = gpu_cell(facts)
    if facts.gpus:
        used = [g.memory_used_mib for g in facts.gpus if g.memory_used_mib is not None]
        if used:
            gpus += f", {sum(used)} MiB used"
    grid.add_row("GPUs", gpus)
    if "gpus" in facts.errors:
        grid.add_row("", f"[red]{escape(facts.errors['gpus'])}[/]")
    grid.add_row("driver", escape(facts.driver or "-"))
    grid.add_row("Python", escape(f"{facts.python or '-'} ({facts.python_executable or '?'})"))
    vllm = facts.vllm
    if vllm.installed:
        grid.add_row("vLLM", escape(f"{vllm.version or '?'}  {vllm.path}"))
        for i, (cls, value) in enumerate(vllm.eagle3.items()):
            info = vllm.eagle3_classes.get(cls)
            if info is None:
                note = "[dim]class not in this version[/]"
            elif info.supported:
                note = escape(f"{info.file}:{info.line} via {' -> '.join(info.via)}")
            else:
                note = escape(f"{info.file}:{info.line} no SupportsEagle3 base")
            label = "EAGLE-3" if i == 0 else ""
            grid.add_row(label, f"{_mark(value)} {escape(cls)}  [dim]{note}[/]")
        allow = vllm.eagle3_allowlist
        if allow is not None and allow.present:
            where = escape(f"{allow.name} ({allow.file}:{allow.line})")
            admits = " ".join(f"{escape(t)} {_mark(v)}" for t, v in allow.admits.items())
            grid.add_row("allowlist", f"{where}: {admits}")
        elif allow is not None:
            grid.add_row("allowlist", "none (no config-time EAGLE-3 model check)")
    else:
        grid.add_row("vLLM", "[red]not installed for this python[/]")
    sup = facts.supervisors
    supervisors = ", ".join(sup.available) or "none"
    if not sup.systemd:
        supervisors += f"  [dim](PID 1 is {escape(sup.pid1 or '?')}, not systemd)[/]"
    grid.add_row("supervisors", supervisors)
    if facts.servers:
        for i, s in enumerate(facts.servers):
            desc = f"pid {s.pid}" + (f" port {s.port}" if s.port else "")
            desc += f" {s.model}" if s.model else ""
            if s.descendants:
                desc += f" ({len(s.descendants)} child processes)"
            grid.add_row("servers" if i == 0 else "", escape(desc))
    else:
        grid.add_row("servers", "none")
    for i, (key, d) in enumerate(facts.disk.items()):
        free, total = (
            human_bytes(n, spec=".0f", units=_DISK) for n in (d.free_bytes, d.total_bytes)
        )
        grid.add_row("disk" if i == 0 else "", escape(f"{key}: {free} free of {total} ({d.path})"))
    for part, error in facts.errors.items():
        if part != "gpus":
            grid.add_row("[red]error[/]", escape(f"{part}: {error}"))
    out.print(Panel(grid, title=escape(name), title_align="left", expand=False))
