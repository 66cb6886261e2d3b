"""fleet.transport.shell: words, paths, templates and ``sh -c`` for any login shell.

Run by the real shells of this machine (sshd hands a command to the user's login shell:
sh, bash, dash, zsh, fish, tcsh or csh), so quoting is checked on the real parsers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.errors import UsageError
from fleet.transport import shell
from fleet.transport.shell import Raw, RemotePath

LOGIN_SHELLS = [s for s in ("sh", "bash", "dash", "zsh", "fish", "tcsh", "csh") if shutil.which(s)]
TRICKY = [
    "",
    "plain",
    "a'b",
    'a"b',
    "a\\b",
    "a\\\\b",
    "\\",
    "'",
    "!",
    "x!y",
    "$HOME",
    "`id`",
    "a b;c|d&e",
    "%s\\0%s",
    "*?[a]{b}~#()<>^",
]


@pytest.mark.parametrize("login", LOGIN_SHELLS)
def test_sh_reaches_sh_intact_from_any_login_shell(login: str, tmp_path: Path) -> None:
    """Whatever the login shell is, ``sh`` gets the script unchanged (fish reads ``\\\\``
    in single quotes as one backslash, csh expands ``!``)."""
    for text in TRICKY:
        cmd = shell.sh(shell.script("printf '%s' {{text}}", text=text))
        res = subprocess.run(
            [login, "-c", cmd], capture_output=True, text=True, cwd=tmp_path, timeout=30
        )
        assert (res.returncode, res.stdout) == (0, text), (login, text, res.stderr)


@pytest.mark.parametrize("login", LOGIN_SHELLS)
def test_join_passes_each_argument_whole(login: str, tmp_path: Path) -> None:
    cmd = shell.join(["printf", "%s|", *TRICKY[1:]])
    res = subprocess.run(
        [login, "-c", cmd], capture_output=True, text=True, cwd=tmp_path, timeout=30
    )
    assert res.stdout == "".join(f"{t}|" for t in TRICKY[1:]), (login, res.stderr)


@settings(max_examples=40, deadline=None)
@given(st.text(st.characters(codec="utf-8", exclude_characters="\n\0")))
def test_word_property(text: str) -> None:
    for login in [s for s in ("sh", "fish", "tcsh") if s in LOGIN_SHELLS]:
        res = subprocess.run(
            [login, "-c", "printf '%s' " + shell.word(text)],
            capture_output=True,
            timeout=30,
            env={"PATH": os.environ["PATH"], "LANG": "C.UTF-8"},
        )
        assert res.stdout.decode("utf-8", "surrogateescape") == text, (login, text)


def test_newline_and_nul_cannot_be_sent() -> None:
    for bad in ("a\nb", "a\0b"):
        with pytest.raises(UsageError):
            shell.word(bad)
    with pytest.raises(UsageError):
        shell.sh("echo a\necho b")


def test_remote_paths_have_one_home_rule(tmp_path: Path) -> None:
    home = tmp_path / "h o'me"
    (home / "a dir").mkdir(parents=True)
    env = {"PATH": os.environ["PATH"], "HOME": str(home)}
    for given_path, expected in [
        ("~", str(home)),
        ("~/a dir", str(home / "a dir")),
        ("/abs/x y", "/abs/x y"),
    ]:
        cmd = shell.sh(shell.script("printf '%s' {{p}}", p=RemotePath(given_path)))
        out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, env=env)
        assert out.stdout == expected
    for bad in ("~root/x", "", "a\0b"):
        with pytest.raises(UsageError):
            shell.path(bad)


def test_templates_quote_by_type() -> None:
    text = shell.script(
        "x {{word}} {{n}} {{raw}} {{path}} {{many}}",
        word="a b",
        n=7,
        raw=Raw("$size"),
        path=RemotePath("~/logs/v.log"),
        many=["-e", "a'b"],
    )
    assert text == "x 'a b' 7 $size \"$HOME\"/'logs/v.log' '-e' 'a'\\''b'"
    with pytest.raises(KeyError):
        shell.script("{{missing}}")
    with pytest.raises(KeyError):
        shell.script("no fields", extra="x")
    with pytest.raises(TypeError):
        shell.script("{{b}}", b=True)


def test_only_commands_built_here_can_be_run() -> None:
    from fleet.transport.runner import command_text

    assert command_text(["ls", "-l"]) == "'ls' '-l'"
    assert isinstance(command_text(shell.sh("true")), shell.Command)
    with pytest.raises(TypeError):
        command_text("rm -rf ~")  # type: ignore[arg-type]


def test_masked_hides_secrets_in_logged_commands() -> None:
    cmd = shell.join(["vllm", "serve", "m", "--api-key", "sk-abcdefghijklmnopqrstuv"])
    assert "sk-abcdefghijklmnopqrstuv" not in shell.masked(cmd)
