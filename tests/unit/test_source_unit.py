"""fleet.source: input checks, the on-host source script, and the output parsers.

The on-host calls are run LOCALLY (a ``LocalRunner``, i.e. ``<login shell> -c COMMAND`` as
sshd would) against a small vLLM-shaped tree (and the real trees) on PYTHONPATH: that
proves the quoting (hostile names stay inert), the containment check on the host and the
output protocol without any SSH.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from fleet.errors import OperationFailed, UsageError
from fleet.inventory import HostSpec
from fleet.source import (
    FileRange,
    GrepResult,
    PathEscapesTree,
    check_regex,
    check_relative,
    grep_tree,
    parse_file_spec,
    parse_grep_output,
    parse_show_output,
    show_file,
)
from fleet.transport import LocalRunner

HOSTILE = "we ird 'q\" ; $(touch PWNED1) `touch PWNED2` | touch PWNED3 & #.py"


@pytest.fixture()
def site(tmp_path: Path) -> Path:
    """A site-packages dir holding a tiny vllm package, plus traps outside of it."""
    site = tmp_path / "site"
    pkg = site / "vllm"
    models = pkg / "model_executor" / "models"
    models.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise SystemExit('vllm must not be imported')\n")
    (models / "deepseek_v2.py").write_text(
        "".join(f"line {i}\n" for i in range(1, 21))
        + "class DeepseekV2ForCausalLM(nn.Module, SupportsEagle):\n"
    )
    (models / HOSTILE).write_text("first\n$(touch PWNED4) `touch PWNED5`\nthird\n")
    (models / "__pycache__").mkdir()
    (models / "__pycache__" / "deepseek_v2.cpython-312.pyc").write_text("SupportsEagle cached\n")
    secret = tmp_path / "outside"
    secret.mkdir()
    (secret / "secret.py").write_text("SupportsEagle outside the tree\n")
    (pkg / "escape_dir").symlink_to(secret)
    (pkg / "escape_file.py").symlink_to(secret / "secret.py")
    (pkg / "inside_link.py").symlink_to(models / "deepseek_v2.py")
    return site


def host(
    site: Path | None, cwd: Path, python: str = "python3", shell: str = "/bin/sh"
) -> LocalRunner:
    env = {"PATH": os.environ["PATH"], "HOME": str(cwd), "LANG": "C.UTF-8"}
    if site is not None:
        env["PYTHONPATH"] = str(site)
    return LocalRunner(HostSpec(name="h1", python=python), cwd=cwd, env=env, login_shell=shell)


def no_markers(where: Path) -> None:
    assert not list(where.rglob("PWNED*")), "a hostile argument was executed"


# -- FILE[:A-B] and relative paths ------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a.py", FileRange("a.py", 1, None)),
        ("a.py:5", FileRange("a.py", 5, 5)),
        ("a.py:5-9", FileRange("a.py", 5, 9)),
        ("a.py:5-", FileRange("a.py", 5, None)),
        ("dir/a:b.py", FileRange("dir/a:b.py", 1, None)),
        ("dir/a:b.py:3-4", FileRange("dir/a:b.py", 3, 4)),
        ("./a.py:1-1", FileRange("./a.py", 1, 1)),
    ],
)
def test_file_spec(text: str, expected: FileRange) -> None:
    assert parse_file_spec(text) == expected


@pytest.mark.parametrize(
    "text",
    ["a.py:9-3", "a.py:0", "a.py:0-2", "a.py:-3", "a.py:", "a.py:1,3", ":1-2", ""],
)
def test_bad_ranges(text: str) -> None:
    with pytest.raises(UsageError):
        parse_file_spec(text)


@pytest.mark.parametrize(
    "path", ["/etc/passwd", "../x.py", "a/../../b", "a/..", "..", "~/x", "~root/x", "a\nb", "a\0b"]
)
def test_paths_leaving_the_tree_are_refused_locally(path: str) -> None:
    with pytest.raises(UsageError):
        check_relative(path)
    with pytest.raises(UsageError):
        parse_file_spec(path)


@pytest.mark.parametrize("path", ["a..b.py", "..hidden/x", "x/.../y", "."])
def test_dots_that_do_not_leave(path: str) -> None:
    assert check_relative(path) == path


def test_regex_checked_locally() -> None:
    assert check_regex(r"SupportsEagle3?\b") == r"SupportsEagle3?\b"
    for bad in ["(", "a{2,1}", "[z-a]", ""]:
        with pytest.raises(UsageError):
            check_regex(bad)
    assert check_regex("(", fixed=True) == "("


# -- show -------------------------------------------------------------------------------


def test_show_range(site: Path, tmp_path: Path) -> None:
    spec = parse_file_spec("model_executor/models/deepseek_v2.py:19-21")
    shown = show_file(host(site, tmp_path, sys.executable), spec)
    assert shown.path == "model_executor/models/deepseek_v2.py"
    assert shown.vllm_dir == str((site / "vllm").resolve())
    assert shown.total_lines == 21
    assert shown.lines == [
        (19, "line 19"),
        (20, "line 20"),
        (21, "class DeepseekV2ForCausalLM(nn.Module, SupportsEagle):"),
    ]


def test_show_whole_file_and_past_the_end(site: Path, tmp_path: Path) -> None:
    spec = parse_file_spec("model_executor/models/deepseek_v2.py")
    shown = show_file(host(site, tmp_path), spec)
    assert [n for n, _ in shown.lines] == list(range(1, 22))
    spec = parse_file_spec("model_executor/models/deepseek_v2.py:100-")
    shown = show_file(host(site, tmp_path), spec)
    assert shown.lines == [] and shown.total_lines == 21


def test_show_symlink_inside_the_tree_is_fine(site: Path, tmp_path: Path) -> None:
    shown = show_file(host(site, tmp_path), parse_file_spec("inside_link.py:1-1"))
    assert shown.path == "model_executor/models/deepseek_v2.py" and shown.lines == [(1, "line 1")]


@pytest.mark.parametrize("path", ["escape_file.py", "escape_dir/secret.py"])
def test_show_symlink_escape_is_refused_on_the_host(site: Path, tmp_path: Path, path: str) -> None:
    conn = host(site, tmp_path)
    with pytest.raises(PathEscapesTree) as info:
        show_file(conn, parse_file_spec(path))
    assert info.value.exit_code == 2 and info.value.code == "path-escapes-tree"
    assert "outside the tree" not in conn.commands[-1]


def test_show_missing_file_and_directory(site: Path, tmp_path: Path) -> None:
    with pytest.raises(OperationFailed) as info:
        show_file(host(site, tmp_path), parse_file_spec("nope.py"))
    assert info.value.code == "path-not-found" and info.value.exit_code == 1
    with pytest.raises(OperationFailed) as info:
        show_file(host(site, tmp_path), parse_file_spec("model_executor"))
    assert info.value.code == "not-a-file"


def test_show_refuses_special_files_without_blocking(site: Path, tmp_path: Path) -> None:
    os.mkfifo(site / "vllm" / "fifo.py")
    with pytest.raises(OperationFailed) as info:
        show_file(host(site, tmp_path), parse_file_spec("fifo.py"), timeout=30)
    assert info.value.code == "not-a-file"


def test_show_without_vllm(tmp_path: Path) -> None:
    with pytest.raises(OperationFailed, match="vLLM is not installed") as info:
        show_file(host(None, tmp_path), parse_file_spec("a.py"))
    assert info.value.code == "vllm-not-found"
    with pytest.raises(OperationFailed) as info:
        show_file(host(None, tmp_path, "/nonexistent/python"), parse_file_spec("a.py"))
    assert info.value.code == "python-missing"


def test_show_hostile_file_name_is_inert(site: Path, tmp_path: Path) -> None:
    spec = parse_file_spec(f"model_executor/models/{HOSTILE}:1-3")
    shown = show_file(host(site, tmp_path), spec)
    assert shown.path == f"model_executor/models/{HOSTILE}"
    assert [t for _, t in shown.lines] == ["first", "$(touch PWNED4) `touch PWNED5`", "third"]
    no_markers(tmp_path)


def test_show_hostile_interpreter_is_inert(site: Path, tmp_path: Path) -> None:
    odd = tmp_path / "bin; touch PWNED6" / "py $(touch PWNED7)"
    odd.parent.mkdir()
    odd.symlink_to(sys.executable)
    spec = parse_file_spec("model_executor/models/deepseek_v2.py:1-1")
    assert show_file(host(site, tmp_path, str(odd)), spec).lines == [(1, "line 1")]
    no_markers(tmp_path)


def test_show_on_real_vllm_0170(tmp_path: Path) -> None:
    from fleet.sandbox.vllm_source import vllm_tree

    spec = parse_file_spec("model_executor/models/deepseek_v2.py:1263-1265")
    shown = show_file(host(vllm_tree("0.17.0"), tmp_path), spec)
    assert shown.lines[0] == (1263, "class DeepseekV2ForCausalLM(")
    assert "SupportsEagle" in shown.lines[1][1] and "SupportsEagle3" not in shown.lines[1][1]


# -- grep -------------------------------------------------------------------------------


def grep(
    site: Path,
    cwd: Path,
    regex: str,
    path: str = ".",
    *,
    ignore_case: bool = False,
    fixed: bool = False,
    max_count: int | None = None,
    includes: tuple[str, ...] = (),
    limit: int = 1000,
) -> GrepResult:
    return grep_tree(
        host(site, cwd),
        regex,
        path,
        ignore_case=ignore_case,
        fixed=fixed,
        max_count=max_count,
        includes=includes,
        limit=limit,
    )


def test_grep_tree_skips_pycache_and_symlinked_dirs(site: Path, tmp_path: Path) -> None:
    result = grep(site, tmp_path, r"SupportsEagle\b")
    assert [(m.path, m.line) for m in result.matches] == [
        ("model_executor/models/deepseek_v2.py", 21)
    ]


def test_grep_options(site: Path, tmp_path: Path) -> None:
    result = grep(site, tmp_path, "LINE 1[0-9]", "model_executor", ignore_case=True, max_count=3)
    assert [m.line for m in result.matches] == [10, 11, 12]
    result = grep(site, tmp_path, "line", limit=5)
    assert len(result.matches) == 5 and result.truncated
    result = grep(site, tmp_path, "no such text anywhere")
    assert result.matches == [] and not result.truncated
    result = grep(site, tmp_path, "line", includes=("*.pyc",))
    assert result.matches == []


def test_grep_skips_fifos_inside_the_tree(site: Path, tmp_path: Path) -> None:
    os.mkfifo(site / "vllm" / "model_executor" / "pipe.py")
    result = grep(site, tmp_path, "line 2[01]")
    assert [m.line for m in result.matches] == [20]


def test_grep_hostile_regex_is_inert(site: Path, tmp_path: Path) -> None:
    result = grep(site, tmp_path, "$(touch PWNED4) `touch PWNED5`", fixed=True)
    assert [(m.path, m.line) for m in result.matches] == [(f"model_executor/models/{HOSTILE}", 2)]
    for regex in ["'; touch PWNED8; '", '"; touch PWNED9; "', "-e x --include=$(touch PWNEDa)"]:
        grep(site, tmp_path, regex, fixed=True)
    result = grep(site, tmp_path, "x", f"model_executor/models/{HOSTILE}")
    assert result.matches == []
    no_markers(tmp_path)


def test_grep_escape_refused(site: Path, tmp_path: Path) -> None:
    with pytest.raises(PathEscapesTree):
        grep(site, tmp_path, "SupportsEagle", "escape_dir")


def test_grep_on_real_vllm_0180(tmp_path: Path) -> None:
    from fleet.sandbox.vllm_source import vllm_tree

    result = grep_tree(
        host(vllm_tree("0.18.0"), tmp_path), r"^class \w+\(", "model_executor/models/kimi_k25.py"
    )
    assert ("model_executor/models/kimi_k25.py", 315) in [(m.path, m.line) for m in result.matches]


# -- output parsers ---------------------------------------------------------------------


def test_parse_grep_output() -> None:
    out = b"/v/vllm/a.py\x0012:x: y\n/v/vllm/b c.py\x003:z\ngarbage\n/v/x\x00\xb2:odd\n"
    result = parse_grep_output("/v/vllm", out)
    assert result.vllm_dir == "/v/vllm"
    assert [(m.path, m.line, m.text) for m in result.matches] == [
        ("a.py", 12, "x: y"),
        ("b c.py", 3, "z"),
    ]
    assert result.warnings[0] == "unparsed grep line: 'garbage'" and len(result.warnings) == 2


def test_parse_show_output() -> None:
    spec = FileRange("a.py", 7, 8)
    answer = {"vllm_dir": "/v", "file": "/v/a.py", "total_lines": 42}
    shown = parse_show_output(answer, b"seven\n\n", spec)
    assert (shown.total_lines, shown.lines) == (42, [(7, "seven"), (8, "")])
    with pytest.raises(OperationFailed):
        parse_show_output({"vllm_dir": "/v"}, b"", spec)


# -- any login shell ------------------------------------------------------------------


LOGIN_SHELLS = [s for s in ("sh", "bash", "dash", "zsh", "fish", "tcsh", "csh") if shutil.which(s)]


@pytest.mark.parametrize("shell", LOGIN_SHELLS)
def test_show_and_grep_under_any_login_shell(shell: str, site: Path, tmp_path: Path) -> None:
    conn = host(site, tmp_path, shell=str(shutil.which(shell)))
    spec = parse_file_spec("model_executor/models/deepseek_v2.py:20-21")
    assert show_file(conn, spec).lines[0] == (20, "line 20")
    assert [m.line for m in grep_tree(conn, r"x\\y|line 1[5]").matches] == [15]


def test_vllm_in_the_login_directory_does_not_shadow_the_installed_one(
    site: Path, tmp_path: Path
) -> None:
    decoy = tmp_path / "vllm" / "model_executor" / "models"
    decoy.mkdir(parents=True)
    (tmp_path / "vllm" / "__init__.py").write_text("")
    (decoy / "deepseek_v2.py").write_text("decoy\n")
    spec = parse_file_spec("model_executor/models/deepseek_v2.py:1")
    shown = show_file(host(site, tmp_path), spec)  # cwd is tmp_path
    assert shown.vllm_dir == str((site / "vllm").resolve()) and shown.lines == [(1, "line 1")]
