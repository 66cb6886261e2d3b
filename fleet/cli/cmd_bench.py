"""``fleet bench``: the served profile measured on its host, with and without the drafter."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from fleet.cli.context import AppContext, Seconds, pass_app
from fleet.errors import EXIT_FAILED, EXIT_OK, UsageError

if TYPE_CHECKING:
    from rich.console import Console

    from fleet.serving.bench import BenchReport, Side


@click.command()
@click.argument("profile")
@click.option("--host", "host", required=True, metavar="HOST", help="The host serving PROFILE.")
@click.option("--baseline-host", metavar="HOST",
              help="A second host serving PROFILE without the drafter: the baseline.")  # fmt: skip
@click.option("--baseline", "baseline_mode", type=click.Choice(["restart"]),
              help="restart: the same host restarted without the drafter, then restored "
              "(two full loads).")  # fmt: skip
@click.option("--num-prompts", type=click.IntRange(1, 100000), default=64, show_default=True)
@click.option("--input-len", type=click.IntRange(1, 1 << 20), default=256, show_default=True,
              help="Tokens per random prompt.")  # fmt: skip
@click.option("--output-len", type=click.IntRange(1, 1 << 20), default=128, show_default=True,
              help="Tokens generated per request (ignore_eos).")  # fmt: skip
@click.option("--concurrency", type=click.IntRange(1, 4096), default=8, show_default=True,
              help="Requests in flight at most.")  # fmt: skip
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False), default=None,
              help="A file of real prompts, one per line (instead of random ones).")  # fmt: skip
@click.option("--tool", type=click.Choice(["auto", "vllm", "fleet"]), default="auto",
              show_default=True,
              help="vllm: `vllm bench serve` on the host; fleet: fleet's own load generator; "
              "auto: vLLM's where the host has it.")  # fmt: skip
@click.option("--time-limit", type=Seconds(), default=3600.0, show_default=True, metavar="S")
@pass_app
def bench(
    app: AppContext,
    profile: str,
    host: str,
    baseline_host: str | None,
    baseline_mode: str | None,
    num_prompts: int,
    input_len: int,
    output_len: int,
    concurrency: int,
    seed: int,
    prompts_file: str | None,
    tool: str,
    time_limit: float,
) -> int:
    """Load PROFILE's server on HOST from the host itself (`vllm bench serve` where the
    host's vLLM has it, else fleet's own load generator; no traffic through this machine)
    and report request throughput, output tokens/s, TTFT, TPOT, ITL (median, p99), the
    acceptance rate and length, and the speed-up against a baseline without the drafter.

    Exit 0 when every side completed requests, 1 otherwise (2 bad input, 3 unreachable).
    """
    from fleet.cli.cmd_serve import Display
    from fleet.serving.bench import BenchSpec, read_prompts, run
    from fleet.serving.profile import profile_path

    profile_path(profile)
    if baseline_host and baseline_mode:
        raise UsageError("give --baseline-host or --baseline restart, not both")
    main = _one(app, host, "--host")
    other = _one(app, baseline_host, "--baseline-host") if baseline_host else None
    if other is not None and other.name == main.name:
        raise UsageError("--baseline-host must be another host (or use --baseline restart)")
    spec = BenchSpec(
        num_prompts=num_prompts, input_len=input_len, output_len=output_len,
        concurrency=concurrency, seed=seed,
        prompts=read_prompts(prompts_file) if prompts_file else None,
        tool=tool,  # type: ignore[arg-type]
        time_limit=time_limit,
    )  # fmt: skip
    session = app.session()
    names = [main.name] + ([other.name] if other is not None else [])
    with Display(app, names, events=False) as display:
        report = run(session, main, profile, spec, baseline_host=other,
                     restart=baseline_mode == "restart", events=display)  # fmt: skip
    if app.json_output:
        from fleet.cli.render import emit_json

        emit_json(report.to_json())
    else:
        _render(app.console, report)
    return EXIT_OK if report.ok else EXIT_FAILED


def _one(app: AppContext, pattern: str, option: str) -> Any:
    matches = app.select([pattern])
    if len(matches) != 1:
        raise UsageError(f"{option} {pattern!r} matches {len(matches)} hosts; give one host")
    return matches[0]


def _stat(name: str, which: str) -> Callable[[Side], float | None]:
    return lambda side: side.stat(name, which)


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _render(out: Console, report: BenchReport) -> None:
    from rich.markup import escape
    from rich.table import Table

    main, base = report.speculative, report.baseline
    load = report.spec
    what = (f"{load.num_prompts} {load.dataset} prompts, {load.output_len} tokens out each, "
            f"{load.concurrency} at once, seed {load.seed}; {main.tool}")  # fmt: skip
    table = Table(title=f"fleet bench {report.profile}: {what}", title_justify="left")
    table.add_column("metric")
    table.add_column(f"EAGLE-3 ({main.host})", justify="right")
    if base is not None:
        how = "same host, restarted" if report.baseline_how == "restart" else base.host
        table.add_column(f"no drafter ({how})", justify="right")
        table.add_column("speed-up", justify="right")
    speed = report.speedup

    def row(
        label: str, pick: Callable[[Side], float | None], key: str | None, digits: int = 1
    ) -> None:
        cells = [label, _fmt(pick(main), digits)]
        if base is not None:
            gain = speed.get(key) if key else None
            cells += [_fmt(pick(base), digits), f"{gain:.2f}x" if gain else ""]
        table.add_row(*cells)

    row("requests/s", lambda s: s.number("request_throughput"), "request_throughput", 2)
    row("output tokens/s", lambda s: s.number("output_throughput"), "output_throughput")
    for name, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"),
                        ("e2el_ms", "end-to-end")):  # fmt: skip
        key = name.replace("_ms", "_median")
        row(f"{label} median (ms)", _stat(name, "median"), key)
        row(f"{label} p99 (ms)", _stat(name, "p99"), None)
    row("completed", lambda s: s.number("completed"), None, 0)
    row("failed", lambda s: s.number("failed"), None, 0)

    def acc(s: Side) -> float | None:
        return s.spec_decode.acceptance_rate if s.spec_decode else None

    def length(s: Side) -> float | None:
        return s.spec_decode.mean_acceptance_length if s.spec_decode else None

    row("acceptance rate", acc, None, 2)
    row("mean acceptance length", length, None, 2)
    out.print(table)
    for note in report.notes:
        out.print(f"note: {escape(note)}", soft_wrap=True)
    for warning in report.warnings:
        out.print(f"[yellow]warning:[/] {escape(warning)}", soft_wrap=True)
    if base is None:
        out.print("no baseline: --baseline-host HOST or --baseline restart gives the speed-up")
