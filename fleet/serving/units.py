"""What ``fleet serve`` writes on a host, rendered here (pure): the launch script, the
supervisord program and instance configuration, the systemd unit.

The host's layout (``home`` is the host user's home, as the host reported it)::

    ~/.fleet/run/<profile>/launch.sh     the server's command line (no secrets in it)
    ~/.fleet/run/<profile>/secrets.env   mode 0600, sourced by launch.sh
    ~/.fleet/run/<profile>/vllm.log      stdout and stderr of vLLM (one log to follow)
    ~/.fleet/supervisor/supervisord.conf fleet's own supervisord (one per host user)
    ~/.fleet/supervisor/conf.d/<profile>.conf
    /etc/systemd/system/fleet-<profile>.service  (systemd backend, root)
    ~/.config/systemd/user/fleet-<profile>.service  (systemd backend, other users)

Templates are ``templates/serve/*.j2``; shell text comes from :mod:`fleet.transport.shell`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from fleet.errors import UsageError
from fleet.onhost.layout import LOG_NAME, RUN_ROOT, SUPERVISOR_ROOT
from fleet.paths import templates_dir
from fleet.transport import shell

if TYPE_CHECKING:
    from jinja2 import Environment

    from fleet.serving.multinode import Node
    from fleet.serving.profile import Profile

# vLLM started through this guard gets SIGTERM when its parent (the supervisor) dies:
# PR_SET_PDEATHSIG, which survives exec; a parent already gone ends it at once.
DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys; "
    "ctypes.CDLL(None).prctl(1, signal.SIGTERM); "
    'p = int(os.environ.pop("FLEET_SUPERVISOR_PID", "0") or 0); '
    'p and p - os.getppid() and sys.exit("fleet: the supervisor ended before vLLM"); '
    "os.execv(sys.argv[1], sys.argv[1:])"
)
# characters a path may not hold in supervisord's or systemd's files (quoting, % expansion)
_UNSAFE = re.compile(r'[\x00-\x20"%;\\$`\']')


@dataclass(frozen=True)
class Layout:
    """Where one profile's files live on a host (absolute paths)."""

    home: str
    profile: str

    def __post_init__(self) -> None:
        if not self.home.startswith("/") or _UNSAFE.search(self.home):
            raise UsageError(
                f"the host's home {self.home!r} cannot be written into a service "
                "configuration (it must be absolute, without spaces, quotes, %, ;, $ or "
                "backslashes)"
            )

    @property
    def run_dir(self) -> str:
        return f"{self.home}/{RUN_ROOT}/{self.profile}"

    @property
    def log(self) -> str:
        return f"{self.run_dir}/{LOG_NAME}"

    @property
    def sup_dir(self) -> str:
        return f"{self.home}/{SUPERVISOR_ROOT}"

    @property
    def program_conf(self) -> str:
        return f"{self.sup_dir}/conf.d/{self.profile}.conf"

    @property
    def unit_name(self) -> str:
        return f"fleet-{self.profile}.service"


@cache
def _env() -> Environment:
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    env = Environment(
        loader=FileSystemLoader(str(templates_dir() / "serve")),
        undefined=StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["systemd_text"] = systemd_text
    return env


def systemd_text(value: object) -> str:
    """A value as systemd reads it literally: ``%`` starts a specifier (``%n``, ``%h``)
    in a unit's settings, ``%%`` is one ``%``. (Control characters never reach here: the
    profile refuses them.)"""
    return str(value).replace("%", "%%")


def launch_script(
    profile: Profile,
    layout: Layout,
    *,
    python: str,
    die_with_parent: bool = False,
    node: Node | None = None,
    argv: list[str] | None = None,
) -> str:
    """``launch.sh``: source the secrets, export the profile's environment (and ``node``'s,
    for a server across hosts), exec vLLM (or ``argv``: the Ray node of such a server)
    (with ``die_with_parent``, through the host's python so that vLLM ends when the
    supervisor that started it dies: no server is left on the GPUs unsupervised)."""
    lines: list[shell.Fragment | shell.Raw] = [
        shell.script("# fleet serve {{name}}: written by fleet (do not edit)", name=profile.name),
        shell.script("cd {{dir}} || exit 1", dir=layout.run_dir),
        # vLLM's workers open many files: the soft limit up to the hard one
        shell.Raw('ulimit -n "$(ulimit -Hn)" 2>/dev/null || true'),
        shell.Raw("set -a"),
        shell.Raw("[ -f ./secrets.env ] && . ./secrets.env"),
        shell.Raw("set +a"),
    ]
    env = dict(profile.env)
    if node is not None:
        env.update(node.env(profile))  # this node's address, ports, interface, timeouts
    for name, value in sorted(env.items()):
        lines.append(shell.script("export {{kv}}", kv=shell.assignment(name, value)))
    if argv is None:
        argv = [profile.vllm_executable(python), "serve", *profile.vllm_args(node)]
    if die_with_parent:
        lines.append(shell.Raw('FLEET_SUPERVISOR_PID="$PPID"; export FLEET_SUPERVISOR_PID'))
        argv = [python, "-c", DIE_WITH_PARENT, *argv]
    lines.append(shell.script("exec {{argv}}", argv=argv))
    return shell.script_file(lines)


def secrets_file(secrets: dict[str, str]) -> str:
    """``secrets.env`` (mode 0600 on the host): ``NAME='value'`` lines sourced by sh."""
    lines = ["# fleet serve: secrets from the control machine's env file (mode 0600)"]
    lines += [shell.assignment(k, v) for k, v in sorted(secrets.items())]
    return "\n".join(lines) + "\n"


def supervisord_conf(layout: Layout) -> str:
    return (
        _env().get_template("supervisord.conf.j2").render(sup_dir=layout.sup_dir, home=layout.home)
    )


def program_conf(profile: Profile, layout: Layout) -> str:
    return _env().get_template("program.conf.j2").render(profile=profile, run_dir=layout.run_dir)


def systemd_unit(profile: Profile, layout: Layout, *, user_unit: bool = False) -> str:
    return (
        _env()
        .get_template("systemd.service.j2")
        .render(profile=profile, run_dir=layout.run_dir, home=layout.home, user_unit=user_unit)
    )
