"""An injection corpus over every place a user string reaches a host, with a canary that
must never appear.

Places: remote log paths and profile names (``fleet logs``), ``source show`` files,
``source grep`` patterns, paths and ``--include`` globs, the inventory's ``python`` (run
by the host's shell), host patterns, inventory host names and free variables, argv of
any command, and serve profile values (from the profile or from inventory variables)
rendered into the launch script, the secrets file, the supervisord program and the
systemd unit. Every payload tries to create the canary file (by a command, a
substitution, a redirection or a new line in a unit); each place is exercised through
fleet's own code over a real SSH connection, and a sample end to end through the CLI.
The launch script is run for real with a stand-in ``vllm`` that records its argv and
environment, which must be exactly the profile's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hostile_support import Tally, run_fleet

from fleet.errors import FleetError

CANARY_NAME = "PWNED-canary"
SMALL = "_version.py"  # grep one small file of the tree: the payload is what is tested
PAYLOADS = [
    "; touch {c}",
    "$(touch {c})",
    "`touch {c}`",
    "| touch {c}",
    "&& touch {c}",
    "|| touch {c} ||",
    "'; touch {c}; '",
    '"; touch {c}; "',
    "\\'; touch {c}; #",
    "\\\\'; touch {c} #",
    "$(IFS=_;c=touch_{c};$c)",
    "${{IFS}}touch${{IFS}}{c}",
    "\ntouch {c}",
    "\r\ntouch {c}",
    "x\x00; touch {c}",
    "!touch {c}",
    "-e; touch {c}",
    "--help; touch {c}",
    "*; touch {c}",
    "~root/x; touch {c}",
    "{{a,b}}; touch {c}",
    "$((1+1)); touch {c}",
    "<(touch {c})",
    "x > {c}",
    ">{c}",
    "\\\ntouch {c}",
    "\u2028touch {c}",
    "\x1b]0;x\x07; touch {c}",
    "%0atouch {c}",
    "set -e; eval 'touch {c}'",
    "{{{{ 'x' }}}}; touch {c}",
    "{{% if true %}}$(touch {c}){{% endif %}}",
]


@pytest.fixture
def canary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("canary") / CANARY_NAME


def corpus(canary: Path) -> list[str]:
    return [p.format(c=canary) for p in PAYLOADS]


def _executed(canary: Path, tally: Tally, category: str, what: str) -> None:
    if canary.exists():
        tally.bad(category, "executions", what)
        canary.unlink()


def _attempt(tally: Tally, category: str, canary: Path, what: str, fn: Callable[[], Any]) -> Any:
    """One payload at one place through fleet's code: a value or a FleetError, never
    another exception, never the canary."""
    tally.attempt(category)
    try:
        return fn()
    except FleetError:
        return None
    except Exception as exc:
        tally.bad(category, "tracebacks", f"{what}: {type(exc).__name__}: {exc}")
        return None
    finally:
        _executed(canary, tally, category, what)


class _As:
    """A connection that runs as another inventory entry (the python under test)."""

    def __init__(self, conn: Any, host: Any) -> None:
        self._conn = conn
        self.host = host

    def run(self, *args: Any, **kwargs: Any) -> Any:
        return self._conn.run(*args, **kwargs)


@pytest.mark.integration
def test_every_remote_place_over_ssh(shared_sandbox: Any, canary: Path, tally: Tally) -> None:
    from fleet.diagnosis.host_logs import (
        check_path,
        diagnose_remote,
        port_holder,
        profile_log_path,
        tail_lines,
    )
    from fleet.inventory import load_inventory
    from fleet.onhost.client import run_raw
    from fleet.source import grep_tree, parse_file_spec, show_file
    from fleet.transport import Session

    category = "injection (over SSH)"
    inventory = load_inventory(shared_sandbox.inventory_path)
    spec = inventory.hosts[shared_sandbox.hosts[0].name]
    home = Path(shared_sandbox.hosts[0].home)
    with Session(inventory) as session:
        conn = session.connect(spec)
        for i, payload in enumerate(corpus(canary)):
            # every payload where the string meets the host's shell...
            places: dict[str, Callable[[], Any]] = {
                "logs path": lambda p=payload: tail_lines(conn, check_path("~/" + p), 5),
                "logs absolute path": lambda p=payload: tail_lines(
                    conn, check_path("/tmp/" + p), 5
                ),
                "logs profile": lambda p=payload: tail_lines(conn, profile_log_path(p), 5),
                "port from a log": lambda p=payload: port_holder(conn, p),
                "inventory python": lambda p=payload: run_raw(
                    _As(conn, spec.model_copy(update={"python": p})), "facts", {"op": "facts"}
                ),
            }
            # ...every other one where it travels in an on-host request (JSON on stdin)
            if i % 2 == 0:
                places.update(
                    {
                        "logs --diagnose path": lambda p=payload: diagnose_remote(
                            conn, check_path("~/" + p)
                        ),
                        "source show": lambda p=payload: show_file(conn, parse_file_spec(p)),
                        "source grep regex": lambda p=payload: grep_tree(conn, p, SMALL, limit=5),
                        "source grep fixed": lambda p=payload: grep_tree(
                            conn, p, SMALL, fixed=True, limit=5
                        ),
                        "source grep path": lambda p=payload: grep_tree(conn, "x", p, limit=5),
                        "source grep include": lambda p=payload: grep_tree(
                            conn, "x", "model_executor/layers", includes=[p], limit=5
                        ),
                    }
                )
            for place, call in places.items():
                _attempt(tally, category, canary, f"{place}: {payload!r}", call)
            # argv stays argv: each word arrives whole, whatever it holds
            if "\n" not in payload and "\0" not in payload:
                tally.attempt(category)
                res = conn.run(["printf", "%s|", payload, payload], timeout=30)
                if res.stdout != f"{payload}|{payload}|":
                    tally.bad(
                        category, "executions", f"argv changed: {payload!r} -> {res.stdout!r}"
                    )
                _executed(canary, tally, category, f"argv: {payload!r}")
    found = [p for p in home.rglob("*PWNED*")]
    if found:
        tally.bad(category, "executions", f"files created on the host: {found}")
    assert not tally.failures(category), tally.categories[category].examples


@pytest.mark.integration
def test_end_to_end_through_the_cli(
    shared_sandbox: Any, canary: Path, tmp_path: Path, tally: Tally
) -> None:
    """A sample of the corpus through the command line: exit codes and one-line errors."""
    category = "injection (CLI)"
    host = shared_sandbox.hosts[0].name
    doc = yaml.safe_load(shared_sandbox.inventory_path.read_text())
    payloads = corpus(canary)[::4]
    for i, payload in enumerate(payloads):
        # an inventory whose python and free variable hold the payload
        bad = json.loads(json.dumps(doc))
        entry = bad["all"]["children"]["sandbox"]["hosts"][host]
        entry["python"] = payload
        entry["models_dir"] = payload
        inv = tmp_path / f"inventory-{i}.yaml"
        inv.write_text(yaml.safe_dump(bad))
        runs = {
            "logs --path": [
                "--inventory", str(shared_sandbox.inventory_path), "logs", "--host", host,
                "--path", "~/" + payload,
            ],
            "logs PROFILE": [
                "--inventory", str(shared_sandbox.inventory_path), "logs", "--host", host, payload,
            ],
            "source grep": [
                "--inventory", str(shared_sandbox.inventory_path), "source", "grep", "--host",
                host, payload, "--limit", "3",
            ],
            "source show": [
                "--inventory", str(shared_sandbox.inventory_path), "source", "show", "--host",
                host, payload,
            ],
            "--host pattern": [
                "--inventory", str(shared_sandbox.inventory_path), "ping", "--host", payload,
            ],
            "inventory python": ["--inventory", str(inv), "inspect", "--host", host],
            "inventory var in a profile": [
                "--inventory", str(inv), "profile", "show", "kimi-eagle3", "--host", host,
            ],
        }  # fmt: skip
        for place, args in runs.items():
            tally.attempt(category)
            run = run_fleet(args)
            what = f"{place}: {payload!r}"
            if run.traceback:
                tally.bad(category, "tracebacks", f"{what}: {run.trace or run.stderr[-300:]}")
            if run.code not in (0, 1, 2, 3):
                tally.bad(category, "wrong exit", f"{what}: exit {run.code}")
            _executed(canary, tally, category, what)
    assert not tally.failures(category), tally.categories[category].examples


def test_inventory_host_names_are_refused_or_inert(
    tmp_path: Path, canary: Path, tally: Tally
) -> None:
    category = "injection (host names)"
    for i, payload in enumerate(corpus(canary)):
        inv = tmp_path / f"inv-{i}.yaml"
        inv.write_text(yaml.safe_dump({"all": {"hosts": {payload: {"address": "127.0.0.1"}}}}))
        tally.attempt(category)
        run = run_fleet(["--inventory", str(inv), "--json", "hosts"])
        if run.traceback:
            tally.bad(category, "tracebacks", f"{payload!r}: {run.trace or run.stderr[-200:]}")
        if run.code not in (0, 2):
            tally.bad(category, "wrong exit", f"{payload!r}: exit {run.code}")
        if run.code == 0 and payload not in json.loads(run.stdout).get("hosts", {}):
            tally.bad(category, "wrong exit", f"{payload!r}: accepted but not listed")
        _executed(canary, tally, category, repr(payload))
    assert not tally.failures(category), tally.categories[category].examples


# -- serve profile values into the launch script and the units --------------------------

STAND_IN = """#!/bin/sh
{ printf '%s\\0' "$@"; printf '\\1'; env -0; } > "$RECORD"
"""


def _recorded(path: Path) -> tuple[list[str], dict[str, str]] | None:
    """The stand-in vllm's argv and environment (NUL-separated), or None if it never ran."""
    if not path.exists():
        return None
    argv_part, _, env_part = path.read_bytes().partition(b"\1")
    argv = [a.decode() for a in argv_part.split(b"\0")[:-1]]
    env = dict(e.decode().partition("=")[::2] for e in env_part.split(b"\0") if e)
    return argv, env


STRING_FIELDS = ["model", "served_model_name", "host", "speculative.model", "description"]


def _directives(text: str) -> list[str]:
    """The keys a unit or program file sets (comments and sections left out), in order."""
    keys = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped[0] in "#;[":
            continue
        keys.append(re.split(r"[=:]", stripped, maxsplit=1)[0].strip())
    return keys


def test_profile_values_into_the_launch_script_and_units(
    tmp_path: Path, canary: Path, tally: Tally
) -> None:
    from fleet.inventory import HostSpec
    from fleet.serving import units
    from fleet.serving.profile import ProfileError, host_context, render

    category = "injection (serve profile)"
    base = {
        "name": "p",
        "model": "{{ models_dir }}/target",
        "served_model_name": "target",
        "tensor_parallel_size": 1,
        "speculative": {"model": "/models/drafter", "num_speculative_tokens": 2},
        "env": {"VLLM_LOGGING_LEVEL": "INFO"},
        "extra_args": ["--max-num-seqs", "8"],
    }
    layout = units.Layout(home=str(tmp_path), profile="p")
    run_dir = Path(layout.run_dir)
    run_dir.mkdir(parents=True)
    fake = tmp_path / "vllm"
    fake.write_text(STAND_IN)
    fake.chmod(0o755)
    record = tmp_path / "record.jsonl"
    clean = render(base, {"models_dir": "/models"})
    expected_keys = {
        "program": _directives(units.program_conf(clean, layout)),
        "unit": _directives(units.systemd_unit(clean, layout, user_unit=False)),
    }

    def check(
        raw: dict[str, Any], context: dict[str, Any], secrets: dict[str, str], what: str
    ) -> None:
        tally.attempt(category)
        try:
            profile = render(raw, context)
        except ProfileError as exc:
            if "\n" in str(exc):
                tally.bad(category, "wrong exit", f"{what}: a refusal of several lines")
            return
        except Exception as exc:
            tally.bad(category, "tracebacks", f"{what}: {type(exc).__name__}: {exc}")
            return
        profile = profile.model_copy(update={"vllm": str(fake)})
        try:  # each file on its own: any one of them reaching a host must be inert
            files = {
                "program": units.program_conf(profile, layout),
                "unit": units.systemd_unit(profile, layout, user_unit=False),
            }
        except Exception as exc:
            tally.bad(category, "tracebacks", f"{what}: {type(exc).__name__}: {exc}")
            return
        for name, text in files.items():
            if _directives(text) != expected_keys[name]:
                tally.bad(category, "executions", f"{what}: {name} gained directives")
        try:
            script = units.launch_script(profile, layout, python="/x/bin/python")
            secret_text = units.secrets_file(secrets)
        except FleetError:
            return  # refused when written (a NUL in an argument): nothing reaches the host
        except Exception as exc:
            tally.bad(category, "tracebacks", f"{what}: {type(exc).__name__}: {exc}")
            return
        (run_dir / "launch.sh").write_text(script)
        (run_dir / "secrets.env").write_text(secret_text)
        record.unlink(missing_ok=True)
        proc = subprocess.run(
            ["sh", str(run_dir / "launch.sh")],
            capture_output=True,
            timeout=60,
            env={"PATH": os.environ["PATH"], "RECORD": str(record)},
            check=False,
        )
        _executed(canary, tally, category, what)
        got = _recorded(record)
        if got is None or got[0] != ["serve", *profile.vllm_args()]:
            tally.bad(category, "executions", f"{what}: argv {got} ({proc.stderr[-200:]!r})")
            return
        env = got[1]
        for key, value in [*profile.env.items(), *secrets.items()]:
            if env.get(key) != value:
                tally.bad(category, "executions", f"{what}: {key}={env.get(key)!r}")

    host = HostSpec(name="h1", address="10.0.0.1", vars={"models_dir": "/models"})
    for payload in corpus(canary):
        for field in STRING_FIELDS:
            raw = json.loads(json.dumps(base))
            where, _, key = field.rpartition(".")
            (raw[where] if where else raw)[key] = payload
            check(raw, {"models_dir": "/models"}, {}, f"{field}: {payload!r}")
        check(
            {**base, "extra_args": [payload, "--x", payload]},
            {"models_dir": "/m"},
            {},
            f"extra_args: {payload!r}",
        )
        check({**base, "env": {"A_VAR": payload}}, {"models_dir": "/m"}, {}, f"env: {payload!r}")
        check(base, {"models_dir": "/m"}, {"VLLM_API_KEY": payload}, f"secret: {payload!r}")
        # an inventory variable the profile renders, and the host name itself
        vars_host = host.model_copy(update={"vars": {"models_dir": payload}})
        check(base, host_context(vars_host), {}, f"inventory var: {payload!r}")
        named = {**base, "served_model_name": "{{ host }}"}
        check(named, {"host": payload, "models_dir": "/m"}, {}, f"host name: {payload!r}")
    assert not tally.failures(category), tally.categories[category].examples
