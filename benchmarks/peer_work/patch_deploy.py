# The EAGLE-3 patch, written as a pyinfra user writes it (peers benchmark): the diff a
# user keeps for this vLLM version, applied with GNU patch by patch.sh through
# server.script. `--data mode=check` makes it a dry run; a second apply changes nothing.
import os

from pyinfra import host
from pyinfra.operations import server

server.script(
    name="Apply the EAGLE-3 diff",
    src=os.path.join(os.environ["FLEET_BENCH_WORK"], "patch.sh"),
    args=(host.data.python, host.data.vllm_dir, host.data.get("mode", "apply")),
)
