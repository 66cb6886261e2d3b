# Where fleet serve keeps a host's files (the one definition; the control side's
# fleet.serving.units renders paths from the same names):
#
#   ~/.fleet/run/<profile>/      launch.sh, secrets.env (0600), vllm.log, state.json, lock
#   ~/.fleet/supervisor/         fleet's own supervisord: its conf, socket, conf.d/, venv/
import os

from fleet.onhost._common import Refused

RUN_ROOT = os.path.join(".fleet", "run")
SUPERVISOR_ROOT = os.path.join(".fleet", "supervisor")
MAX_PROFILE_NAME = 64


def home() -> str:
    return os.path.realpath(os.path.expanduser("~"))


def run_root() -> str:
    return os.path.join(home(), RUN_ROOT)


def run_dir(name: str) -> str:
    """A profile's run directory; a name that is not one plain path part is refused."""
    if not name or "/" in name or name.startswith(".") or len(name) > MAX_PROFILE_NAME:
        raise Refused("bad profile name " + repr(name), "bad-request")
    return os.path.join(run_root(), name)


def supervisor_dir() -> str:
    return os.path.join(home(), SUPERVISOR_ROOT)
