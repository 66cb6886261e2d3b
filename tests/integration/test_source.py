"""``fleet source show|grep`` over real SSH against sandbox hosts with real vLLM trees."""

from __future__ import annotations

import json
import re
import shlex
import subprocess

import pytest

from fleet.sandbox.core import Sandbox

pytestmark = [pytest.mark.integration, pytest.mark.docker]  # also in the docker stage

HOSTILE = "we ird 'q\" ; $(touch PWNED1) `touch PWNED2` | touch PWNED3 & #.py"
SESSION_RE = re.compile(r"Starting session: ")


def fleet(box: Sandbox, *args: str) -> subprocess.CompletedProcess[str]:
    return box.run_fleet(*args)


def on_host(box: Sandbox, name: str, command: str) -> str:
    """Run a shell command on a sandbox host through fleet's own transport."""
    return box.on_host(name, command, timeout=60).stdout


def vllm_dir(box: Sandbox, name: str) -> str:
    python = box.host(name).python
    code = "import importlib.util as u; print(u.find_spec('vllm').submodule_search_locations[0])"
    return on_host(box, name, shlex.join([python, "-c", code])).strip()


def test_show_groups_identical_hosts_and_numbers_lines(shared_sandbox: Sandbox) -> None:
    box = shared_sandbox
    marks = box.log_marks()
    spec = "model_executor/models/deepseek_v2.py:1263-1265"
    res = fleet(box, "source", "show", "--host", "all", spec)
    assert res.returncode == 0, res.stderr
    old = [h.name for h in box.hosts if h.vllm == "0.17.0"]
    new = [h.name for h in box.hosts if h.vllm == "0.18.0"]
    lines = res.stdout.splitlines()
    header_old = f"==> {', '.join(old)}: model_executor/models/deepseek_v2.py:1263-1265 <=="
    assert header_old in lines
    at = lines.index(header_old)
    assert lines[at + 1] == "1263  class DeepseekV2ForCausalLM("
    assert lines[at + 2].startswith("1264      nn.Module, SupportsPP,")
    assert any(line.startswith(f"==> {', '.join(new)}: ") for line in lines)
    for host in box.hosts:  # one connection, one command per host
        assert box.connection_count(host.name, since=marks[host.name]) == 1
        assert len(SESSION_RE.findall(box.sshd_log(host.name)[marks[host.name] :])) == 1


def test_show_json(shared_sandbox: Sandbox) -> None:
    res = fleet(
        shared_sandbox,
        "--json",
        "source",
        "show",
        "--host",
        "all",
        "model_executor/models/kimi_k25.py:315-321",
    )
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    for host in shared_sandbox.hosts:
        entry = doc["hosts"][host.name]
        assert entry["ok"] and entry["path"] == "model_executor/models/kimi_k25.py"
        assert [line["line"] for line in entry["lines"]] == list(range(315, 322))
        texts = [line["text"] for line in entry["lines"]]
        assert ("    SupportsEagle3," in texts) is (host.vllm == "0.18.0")
        assert entry["vllm_path"].endswith("/site-packages/vllm")


def test_grep_prefixed_by_host_and_json(shared_sandbox: Sandbox) -> None:
    box = shared_sandbox
    res = fleet(
        box,
        "source",
        "grep",
        "--host",
        "all",
        r"^\s+SupportsEagle3,",
        "model_executor/models/deepseek_v2.py",
    )
    assert res.returncode == 0, res.stderr
    new = {h.name for h in box.hosts if h.vllm == "0.18.0"}
    hits = [line.split(": ", 1) for line in res.stdout.splitlines()]
    assert {host for host, _ in hits} == new
    assert all(rest.startswith("model_executor/models/deepseek_v2.py:") for _, rest in hits)

    res = fleet(
        box,
        "--json",
        "source",
        "grep",
        "--host",
        "all",
        "-i",
        "-m",
        "1",
        "--include",
        "*.py",
        "set_AUX_hidden_state_layers",
        "model_executor/models",
    )
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert set(doc) == {"matches", "hosts"}
    for match in doc["matches"]:
        assert set(match) == {"host", "path", "line", "text"}
        assert "set_aux_hidden_state_layers" in match["text"]
    kimi = {m["host"] for m in doc["matches"] if m["path"] == "model_executor/models/kimi_k25.py"}
    assert kimi == new
    assert all(doc["hosts"][h.name]["ok"] for h in box.hosts)


def test_paths_leaving_the_tree_are_refused(shared_sandbox: Sandbox) -> None:
    for args in (
        ["source", "show", "--host", "all", "/etc/passwd"],
        ["source", "show", "--host", "all", "../../../../etc/passwd:1-3"],
        ["source", "grep", "--host", "all", "root", "/etc"],
        ["source", "grep", "--host", "all", "root", "model_executor/../.."],
    ):
        res = fleet(shared_sandbox, *args)
        assert res.returncode == 2, (args, res.stdout, res.stderr)
        assert res.stdout == ""
        assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr


@pytest.mark.sandbox(hosts=2, vllm=("0.17.0",))
def test_symlink_escape_refused_on_the_host(sandbox: Sandbox) -> None:
    name, other = sandbox.hosts[0].name, sandbox.hosts[1].name
    tree = vllm_dir(sandbox, name)
    on_host(sandbox, name, f"ln -s /etc {shlex.quote(tree + '/etc_link')}")
    marks = sandbox.log_marks()
    res = fleet(sandbox, "source", "show", "--host", "all", "etc_link/passwd")
    assert res.returncode == 2
    assert f"fleet: error: {name}: etc_link/passwd resolves outside the vLLM tree" in res.stderr
    assert "root:" not in res.stdout
    assert f"{other}: etc_link/passwd: no such file" in res.stderr
    res = fleet(sandbox, "--json", "source", "grep", "--host", name, "root", "etc_link")
    # every host refused the path: bad input, one line (and no JSON on stdout)
    assert res.returncode == 2 and res.stdout == ""
    assert (
        res.stderr.strip()
        == f"fleet: error: {name}: etc_link resolves outside the vLLM tree; refused"
    )
    assert sandbox.connection_count(name, since=marks[name]) == 2  # one per fleet run


@pytest.mark.sandbox(hosts=1, vllm=("0.18.0",))
def test_hostile_names_and_regexes_are_inert_over_ssh(sandbox: Sandbox) -> None:
    name = sandbox.hosts[0].name
    tree = vllm_dir(sandbox, name)
    target = f"{tree}/model_executor/models/{HOSTILE}"
    on_host(
        sandbox,
        name,
        f"printf '%s\\n' first '$(touch PWNED4) `touch PWNED5`' third > {shlex.quote(target)}",
    )
    res = fleet(
        sandbox, "--json", "source", "show", "--host", name, f"model_executor/models/{HOSTILE}:1-3"
    )
    assert res.returncode == 0, res.stderr
    entry = json.loads(res.stdout)["hosts"][name]
    assert [line["text"] for line in entry["lines"]] == [
        "first",
        "$(touch PWNED4) `touch PWNED5`",
        "third",
    ]
    res = fleet(
        sandbox, "--json", "source", "grep", "--host", name, "-F", "$(touch PWNED4) `touch PWNED5`"
    )
    assert res.returncode == 0, res.stderr
    matches = json.loads(res.stdout)["matches"]
    assert [(m["path"], m["line"]) for m in matches] == [(f"model_executor/models/{HOSTILE}", 2)]
    for regex in ["'; touch PWNED6; '", '"; touch PWNED7; "', "$(touch PWNED8)|`touch PWNED9`"]:
        res = fleet(sandbox, "source", "grep", "--host", name, regex, "model_executor/models")
        assert res.returncode == 0, res.stderr
    # the remote shell runs in the home directory and cds into the vLLM tree (under home)
    found = on_host(sandbox, name, "find \"$HOME\" -name 'PWNED*' 2>/dev/null; :")
    assert found.strip() == ""
