# The facts of `fleet inspect`, written as a pyinfra user writes them (peers benchmark):
# facts gathered in a deploy, run with --parallel N. Each host's facts are written as
# JSON to $FLEET_BENCH_OUT/<host>.json for the benchmark to check.
import json
import os

from pyinfra import host
from pyinfra.facts.files import Sha256File
from pyinfra.facts.server import Command

WORK = os.environ["FLEET_BENCH_WORK"]
py = host.data.python


def script(name, *args):
    with open(os.path.join(WORK, name), encoding="utf-8") as fh:
        text = fh.read()
    argv = " ".join([py, "-"] + [f"'{a}'" for a in args])
    return f"{argv} <<'FLEET_BENCH_EOF'\n{text}\nFLEET_BENCH_EOF"


vllm = json.loads(host.get_fact(Command, script("vllm_locate.py")))
gpus = host.get_fact(
    Command,
    "nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version"
    " --format=csv,noheader,nounits",
)
eagle3 = json.loads(host.get_fact(Command, script("eagle3_check.py", vllm["path"])))
sha256 = host.get_fact(Sha256File, vllm["path"] + "/model_executor/models/deepseek_v2.py")
disk = host.get_fact(Command, f"df -Pk \"$HOME\" '{vllm['path']}'")

with open(os.path.join(os.environ["FLEET_BENCH_OUT"], host.name + ".json"), "w") as fh:
    json.dump(
        {
            "version": vllm["version"],
            "path": vllm["path"],
            "gpus": gpus.splitlines(),
            "eagle3": eagle3["eagle3"],
            "allowlist": eagle3["allowlist"],
            "sha256": sha256,
            "disk": disk.splitlines(),
        },
        fh,
    )
