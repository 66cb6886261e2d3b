# Where fleet serve keeps a host's files (the one definition; the control side's
# fleet.serving.units, fleet logs and the tests build paths from the same names):
#
#   ~/.fleet/run/<profile>/      launch.sh, secrets.env (0600), vllm.log, state.json, lock
#   ~/.fleet/supervisor/         fleet's own supervisord: its conf, socket, conf.d/, venv/
#
# and what a profile may be named (the one check: a serve profile's name, fleet logs'
# PROFILE argument, a run directory on the host).
import os

from fleet.onhost._common import Refused

RUN_ROOT = ".fleet/run"
SUPERVISOR_ROOT = ".fleet/supervisor"
LOG_NAME = "vllm.log"
MAX_PROFILE_NAME = 64
PROFILE_NAME_RULE = "lower-case letters, digits, '.', '_' and '-' (at most 64)"
_FIRST = "abcdefghijklmnopqrstuvwxyz0123456789"
_REST = _FIRST + "._-"


def profile_name_ok(name: str) -> bool:
    """A profile name: one plain path part of ``PROFILE_NAME_RULE``'s characters, starting
    with a letter or digit (never ``.``, ``..`` or a hidden name)."""
    return 0 < len(name) <= MAX_PROFILE_NAME and name[0] in _FIRST and all(c in _REST for c in name)


def log_path(name: str) -> str:
    """A profile's vLLM log relative to the host user's home (``.fleet/run/<name>/vllm.log``);
    the name is not checked here (``profile_name_ok``)."""
    return RUN_ROOT + "/" + name + "/" + LOG_NAME


def home() -> str:
    return os.path.realpath(os.path.expanduser("~"))


def run_root() -> str:
    return os.path.join(home(), RUN_ROOT)


def run_dir(name: str) -> str:
    """A profile's run directory; a name ``profile_name_ok`` refuses is refused."""
    if not profile_name_ok(name):
        raise Refused("bad profile name " + repr(name), "bad-request")
    return os.path.join(run_root(), name)


def supervisor_dir() -> str:
    return os.path.join(home(), SUPERVISOR_ROOT)
