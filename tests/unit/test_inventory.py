"""Inventory parsing, inheritance, aliases, selection and one-line errors (pure)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fleet.errors import UsageError
from fleet.inventory import load_inventory, parse_inventory

EXAMPLE = textwrap.dedent(
    """
    all:
      vars: {user: root, ssh_key: ~/.ssh/id_ed25519, python: /root/ml-env/bin/python}
      children:
        blackwell:
          vars: {port: 2200}
          hosts:
            b200-01: {address: 10.0.0.11}
            b200-02: {address: 10.0.0.12, port: 2222}
          children:
            canary:
              vars: {python: /opt/canary/bin/python}
              hosts:
                b200-03: {ansible_host: 10.0.0.13, ansible_user: ops}
        hopper:
          hosts:
            h100-01:
              ansible_port: 2022
              ansible_ssh_private_key_file: /keys/h100
              ansible_python_interpreter: /usr/bin/python3.11
              jump: bastion
            bastion: {address: 192.0.2.1}
    """
)


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "inventory.yaml"
    p.write_text(text)
    return p


def test_vars_inherit_downward_and_host_vars_win(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, EXAMPLE))
    b1, b2, b3 = (inv.hosts[n] for n in ("b200-01", "b200-02", "b200-03"))
    assert (b1.address, b1.port, b1.user, b1.python) == (
        "10.0.0.11",
        2200,
        "root",
        "/root/ml-env/bin/python",
    )
    assert b2.port == 2222  # host var beats group var
    assert b3.python == "/opt/canary/bin/python"  # child group beats parent group
    assert (b3.address, b3.user, b3.port) == ("10.0.0.13", "ops", 2200)  # aliases


def test_ansible_aliases(tmp_path: Path) -> None:
    h = load_inventory(write(tmp_path, EXAMPLE)).hosts["h100-01"]
    assert (h.port, h.ssh_key, h.python, h.jump) == (
        2022,
        "/keys/h100",
        "/usr/bin/python3.11",
        "bastion",
    )
    assert h.target == "h100-01"  # no address: the name is the target (ssh config alias)


@pytest.mark.parametrize(
    ("patterns", "expected"),
    [
        (["all"], {"b200-01", "b200-02", "b200-03", "h100-01", "bastion"}),
        (["blackwell"], {"b200-01", "b200-02", "b200-03"}),
        (["canary"], {"b200-03"}),
        (["b200-0[12]"], {"b200-01", "b200-02"}),
        (["h100-01", "canary"], {"h100-01", "b200-03"}),
        (["hop*"], {"h100-01", "bastion"}),
    ],
)
def test_selection(tmp_path: Path, patterns: list[str], expected: set[str]) -> None:
    inv = load_inventory(write(tmp_path, EXAMPLE))
    chosen = inv.select(patterns)
    assert {h.name for h in chosen} == expected
    order = list(inv.hosts)
    assert [h.name for h in chosen] == sorted((h.name for h in chosen), key=order.index)


def test_groups_listed(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, EXAMPLE))
    assert set(inv.hosts["b200-03"].groups) == {"all", "blackwell", "canary"}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("all: [1, 2", "invalid YAML (line"),
        (
            "all:\n  hosts:\n    a: {adress: 1.2.3.4}\n",
            "all.hosts.a.adress: unknown host variable (did you mean 'address'?)",
        ),
        (
            "all:\n  hosts:\n    a: {port: http}\n",
            "all.hosts.a.port: Input should be a valid integer",
        ),
        ("all:\n  hosts:\n    a: {port: 70000}\n", "all.hosts.a.port"),
        (
            "all:\n  hostz:\n    a: {}\n",
            "all.hostz: unknown key; a group holds vars, hosts, children (did you mean 'hosts'?)",
        ),
        ("all:\n  children:\n    g:\n      vars: [1]\n", "all.children.g.vars: must be a mapping"),
        ("", "inventory is empty"),
        ("all:\n  vars: {user: root}\n", "defines no hosts"),
        ("- a\n- b\n", "top level must be a mapping"),
        (
            "all:\n  hosts:\n    a: {address: '  '}\n",
            "all.hosts.a.address: Value error, must not be empty",
        ),
    ],
)
def test_broken_inventory_is_one_line(tmp_path: Path, text: str, fragment: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(UsageError) as err:
        load_inventory(path)
    message = str(err.value)
    assert fragment in message
    assert str(path) in message
    assert "\n" not in message


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="inventory file not found"):
        load_inventory(tmp_path / "nope.yaml")


def test_unknown_pattern_suggests(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, EXAMPLE))
    with pytest.raises(
        UsageError, match="no host or group matches 'blackwel'; did you mean 'blackwell'"
    ):
        inv.select(["blackwel"])


def test_top_level_groups_are_children_of_all() -> None:
    inv = parse_inventory({"all": {"vars": {"user": "u"}}, "gpu": {"hosts": {"x": None}}})
    assert inv.hosts["x"].user == "u"
    assert inv.groups["gpu"] == ["x"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["hosts"], "inventory file not found"),
        (["ping", "--host", "nope"], "no host or group matches 'nope'"),
    ],
)
def test_cli_bad_inventory_exit_2_no_traceback(
    tmp_path: Path, args: list[str], fragment: str
) -> None:
    inv = tmp_path / ("inventory.yaml" if "ping" in args else "missing.yaml")
    if "ping" in args:
        inv.write_text(EXAMPLE)
    proc = subprocess.run(
        [sys.executable, "-m", "fleet", "--inventory", str(inv), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert fragment in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_host_vars_win_whichever_group_lists_the_host() -> None:
    data = {
        "all": {
            "vars": {"port": 22, "user": "root"},
            "children": {
                "g1": {"hosts": {"a": {"port": 2222}}},
                "g2": {"vars": {"user": "ops"}, "hosts": {"a": None}},
                "g3": {"vars": {"port": 2300}, "children": {"g4": {"hosts": {"a": None}}}},
            },
        }
    }
    a = parse_inventory(data).hosts["a"]
    assert a.port == 2222  # the host's own var beats every group
    assert a.user == "ops"  # a group var beats 'all'
    assert set(a.groups) == {"all", "g1", "g2", "g3", "g4"}


def test_deeper_group_beats_shallower() -> None:
    data = {
        "all": {
            "children": {
                "outer": {
                    "vars": {"python": "/outer/python"},
                    "children": {
                        "inner": {"vars": {"python": "/inner/python"}, "hosts": {"x": {}}}
                    },
                },
            }
        }
    }
    assert parse_inventory(data).hosts["x"].python == "/inner/python"


@pytest.mark.parametrize("jump", ["ops@bastion:2222", "bastion", "[2001:db8::1]:22", "u@10.0.0.1"])
def test_jump_forms_accepted(jump: str) -> None:
    inv = parse_inventory({"all": {"hosts": {"a": {"jump": jump}}}})
    assert inv.hosts["a"].jump == jump


@pytest.mark.parametrize("jump", ["ops@bastion:port", "a b", "ssh://x", "u@@h"])
def test_bad_jump_is_a_usage_error(jump: str) -> None:
    with pytest.raises(UsageError, match=r"all\.hosts\.a\.jump: Value error, must be an inventory"):
        parse_inventory({"all": {"hosts": {"a": {"jump": jump}}}}, "inv.yaml")


def test_group_listed_at_two_depths_counts_at_its_deepest() -> None:
    data = {
        "all": {
            "children": {
                "zz": {"vars": {"python": "/zz"}, "hosts": {"h": None}},
                "aa": {"vars": {"python": "/aa"}, "hosts": {"h": None}},
                "rack": {"children": {"aa": {}}},
            }
        }
    }
    # 'aa' sits at depth 2 under 'rack', so it beats 'zz' (depth 1), as in Ansible
    assert parse_inventory(data).hosts["h"].python == "/aa"


def test_bastion_loop_is_refused() -> None:
    data = {"all": {"hosts": {"a": {"jump": "b"}, "b": {"jump": "c"}, "c": {"jump": "a"}}}}
    with pytest.raises(UsageError, match=r"inv\.yaml: a\.jump: bastion loop a -> b -> c -> a"):
        parse_inventory(data, "inv.yaml")


def test_free_variables_are_host_vars_merged_from_groups() -> None:
    inv = parse_inventory(
        {
            "all": {
                "vars": {"models_dir": "/models", "tier": "gold"},
                "children": {
                    "b": {
                        "vars": {"models_dir": "/data/models"},
                        "hosts": {"h1": {"address": "10.0.0.1", "vllm_port": 8001}, "h2": {}},
                    }
                },
            }
        }
    )
    assert inv.hosts["h1"].vars == {"models_dir": "/data/models", "tier": "gold", "vllm_port": 8001}
    assert inv.hosts["h2"].vars["models_dir"] == "/data/models"


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("adress", "x", "did you mean 'address'"),  # a typo of a known variable
        ("ansible_connection", "local", "unknown host variable"),
        ("models_dir", {"nested": 1}, "a string, a number"),
        ("models_dir", "a\0b", "NUL"),
        ("Models-Dir", "x", "unknown host variable"),
    ],
)
def test_free_variables_that_are_refused(key: str, value: object, problem: str) -> None:
    with pytest.raises(UsageError, match=problem):
        parse_inventory({"all": {"hosts": {"h1": {"address": "10.0.0.1", key: value}}}})


# -- values refused at load, values accepted ----------------------------------------------


def one_host(**hvars: object) -> dict[str, object]:
    return {"all": {"hosts": {"h1": dict(hvars)}}}


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("address", "10.0.0.1"),
        ("address", "gpu-01.example.com"),
        ("address", "gpu-01.example.com."),
        ("address", "_svc.internal"),
        ("address", "::1"),
        ("address", "2001:db8::7"),
        ("address", "fe80::1%eth0"),
        ("port", "2222"),
        ("user", "svc.vllm"),
        ("user", "alice@corp.example"),  # directory users may hold '@'
        ("ssh_key", "~/.ssh/id_ed25519"),
        ("known_hosts", "/etc/fleet/known_hosts"),
        ("python", "~/env/bin/python"),
        ("python", "python3"),
        ("connect_timeout", 0.5),
        ("connect_timeout", 3600),
        ("jump", "ops@[2001:db8::1]:2222"),
    ],
)
def test_plausible_values_are_accepted(var: str, value: object) -> None:
    parse_inventory(one_host(**{var: value}), "inv.yaml")


@pytest.mark.parametrize(
    ("var", "value", "fragment"),
    [
        ("connect_timeout", float("inf"), "finite"),
        ("connect_timeout", float("nan"), "finite"),
        ("connect_timeout", 0, "greater than 0"),
        ("connect_timeout", 86400, "less than or equal to 3600"),
        ("connect_timeout", True, "not true/false"),
        ("port", True, "not true/false"),
        ("address", "root@10.0.0.1", "give the user as the host variable 'user'"),
        ("address", "10.0.0.1:22", "give the port as the host variable 'port'"),
        ("address", "[::1]:22", "without brackets"),
        ("address", "[::1]", "without brackets"),
        ("address", "::g", "not a valid IPv6 address"),
        ("address", "a..b", "not a host name or IP address"),
        ("address", "-oProxyCommand=x", "not a host name or IP address"),
        ("address", "x" * 64 + ".example", "not a host name or IP address"),
        ("address", "a" * 300, "longer than 255 characters"),
        ("address", "x\x00y", "control characters"),
        ("address", "x y", "not a host name or IP address"),
        ("user", "ro\not", "control characters"),
        ("user", "-l", "not starting with '-'"),
        ("ssh_key", "~nobody-fleet-test/key", "names no local user"),
        ("known_hosts", "/kh\x00", "control characters"),
        ("known_hosts", "/" + "k" * 5000, "longer than 4096"),
        ("python", "~bob/bin/python", "only a leading '~/'"),
        ("python", "-c", "not an option"),
        ("python", "/opt/\u202eevil", "control characters"),
        ("jump", "bastion:99999", "port must be 1-65535"),
    ],
)
def test_values_that_would_fail_later_are_refused_at_load(
    var: str, value: object, fragment: str
) -> None:
    with pytest.raises(UsageError) as err:
        parse_inventory(one_host(**{var: value}), "inv.yaml")
    message = str(err.value)
    assert message.startswith(f"inv.yaml: all.hosts.h1.{var}: "), message
    assert fragment in message
    assert "\n" not in message and len(message) < 400


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"all": {"hosts": {"a..b": {}}}}, "a..b: no address given, and the host name is not"),
        # null is "not given" wherever it comes from, so the name must then be an address
        ({"all": {"hosts": {"-1": {"address": None}}}}, "-1: no address given, and the host"),
        (
            {"all": {"vars": {"address": "10.0.0.1"}, "hosts": {"-h": {"address": None}}}},
            "-h: no address given",
        ),
        (
            {"all": {"children": {"g": {"vars": {"address": None}, "hosts": {"a..b": {}}}}}},
            "a..b: no address given",
        ),
        ({"all": {"hosts": {None: {}}}}, "all.hosts.None: a host name must be a string"),
        ({"all": {"hosts": {True: {}}}}, "must be a string"),
        ({"all": {"hosts": {"a\nb": {"address": "x"}}}}, "all.hosts.a\\nb: bad host name"),
        ({"all": {"hosts": {"a b": {"address": "x"}}}}, "must not be empty or contain spaces"),
        ({"all": {"hosts": {"n" * 300: {"address": "x"}}}}, "longer than 255"),
        ({"all": {"children": {"g\x00": {}}, "hosts": {"h": {}}}}, "bad group name"),
        ({"all": {"hosts": {"h": {"jump": "u@x..y"}}}}, "h.jump: the bastion is not a host"),
        ({"all": {"children": {"g": {}}}, "g": {}}, "g: group given both at the top level"),
    ],
)
def test_bad_names_are_one_line(data: dict[object, object], fragment: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_inventory(data, "inv.yaml")
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_yaml_is_strict_but_merge_keys_work(tmp_path: Path) -> None:
    text = textwrap.dedent(
        """
        spare:
          vars: &defaults {user: root, port: 2200}
        all:
          hosts:
            a: {<<: *defaults, port: 2222}
            2001-02-03: {address: 10.0.0.9}
        """
    )
    inv = load_inventory(write(tmp_path, text))
    assert (inv.hosts["a"].user, inv.hosts["a"].port) == ("root", 2222)  # own key wins
    assert inv.hosts["2001-02-03"].address == "10.0.0.9"  # a date-like name stays text
    with pytest.raises(UsageError, match=r"line 4, column 5\): duplicate key 'a'"):
        load_inventory(write(tmp_path, "all:\n  hosts:\n    a: {}\n    a: {}\n"))


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_inventory_must_be_a_regular_file(tmp_path: Path, kind: str) -> None:
    import os

    path = tmp_path / "inv.yaml"
    path.mkdir() if kind == "directory" else os.mkfifo(path)
    with pytest.raises(UsageError, match=r"not a regular file|a directory"):
        load_inventory(path)


def test_many_groups_and_long_bastion_chains_are_handled_in_one_pass() -> None:
    n = 3000
    children = {
        f"g{i}": {"hosts": {f"h{i}": {"jump": f"h{i + 1}"} if i < n - 1 else {}}} for i in range(n)
    }
    inv = parse_inventory({"all": {"children": children}})
    assert inv.hosts["h7"].groups == ("g7", "all")
    assert inv.groups["all"] == [f"h{i}" for i in range(n)]  # inventory order
    assert inv.groups["g9"] == ["h9"]
    children[f"g{n - 1}"]["hosts"][f"h{n - 1}"] = {"jump": "h0"}
    with pytest.raises(UsageError, match=r"bastion loop h0 -> h1 -> h2"):
        parse_inventory({"all": {"children": children}}, "inv.yaml")
