"""An ``nvidia-smi`` stand-in for rehearsal hosts: 8 x NVIDIA B200 by default.

This file is installed as-is (standard library only, Python >= 3.8) as ``nvidia-smi`` on
every sandbox host, with a shebang naming the host's Python. It answers the invocations
fleet and people use, in nvidia-smi's own output formats:

    nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv,noheader
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
    nvidia-smi -L
    nvidia-smi                      (the summary table)

What it reports comes from two optional JSON files under ``$HOME/.fleet-sandbox/``:

- ``host.json`` (written by ``fleet sandbox up``): ``{"gpu_name": "NVIDIA B200",
  "gpu_count": 8, "memory_total_mib": 183359, "driver_version": "...", "cuda_version":
  "...", "host": "b200-01"}``; every key optional.
- ``gpu-state.json`` (written by whatever simulates a GPU workload, e.g. a simulated vLLM
  server): ``{"memory_used_mib": [int per GPU], "utilization_gpu": [int per GPU],
  "processes": [{"pid": 123, "name": "python3", "gpus": [0, 1], "used_memory_mib": 1000}]}``.
"""

import json
import os
import sys
from typing import Any, Dict, List, Optional, Tuple

DEFAULTS: Dict[str, Any] = {
    "gpu_name": "NVIDIA B200",
    "gpu_count": 8,
    "memory_total_mib": 183359,
    "driver_version": "570.133.20",
    "cuda_version": "12.8",
    "vbios_version": "97.00.82.00.1A",
    "compute_cap": "10.0",
    "power_limit_w": 1000.0,
    "host": "sandbox",
}

# PCI bus ids of the eight GPUs of an HGX B200 board.
BUS_IDS = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")

# field -> (canonical name, unit shown in the header and after values, or "")
FIELDS: Dict[str, Tuple[str, str]] = {
    "count": ("count", ""),
    "index": ("index", ""),
    "name": ("name", ""),
    "gpu_name": ("name", ""),
    "uuid": ("uuid", ""),
    "gpu_uuid": ("uuid", ""),
    "serial": ("serial", ""),
    "gpu_serial": ("serial", ""),
    "pci.bus_id": ("pci.bus_id", ""),
    "gpu_bus_id": ("pci.bus_id", ""),
    "driver_version": ("driver_version", ""),
    "vbios_version": ("vbios_version", ""),
    "compute_cap": ("compute_cap", ""),
    "persistence_mode": ("persistence_mode", ""),
    "pstate": ("pstate", ""),
    "memory.total": ("memory.total", "MiB"),
    "memory.used": ("memory.used", "MiB"),
    "memory.free": ("memory.free", "MiB"),
    "memory.reserved": ("memory.reserved", "MiB"),
    "utilization.gpu": ("utilization.gpu", "%"),
    "utilization.memory": ("utilization.memory", "%"),
    "temperature.gpu": ("temperature.gpu", ""),
    "power.draw": ("power.draw", "W"),
    "power.limit": ("power.limit", "W"),
    "clocks.sm": ("clocks.current.sm", "MHz"),
    "clocks.current.sm": ("clocks.current.sm", "MHz"),
    "clocks.max.sm": ("clocks.max.sm", "MHz"),
    "mig.mode.current": ("mig.mode.current", ""),
}

APP_FIELDS: Dict[str, Tuple[str, str]] = {
    "pid": ("pid", ""),
    "process_name": ("process_name", ""),
    "name": ("process_name", ""),
    "used_memory": ("used_gpu_memory", "MiB"),
    "used_gpu_memory": ("used_gpu_memory", "MiB"),
    "gpu_uuid": ("gpu_uuid", ""),
    "gpu_bus_id": ("gpu_bus_id", ""),
    "gpu_name": ("gpu_name", ""),
}

INVALID_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"


def _load(path: str) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def load_config(home: Optional[str] = None) -> Dict[str, Any]:
    """The host's GPU description and current load, defaults filled in."""
    base = os.path.join(home or os.path.expanduser("~"), ".fleet-sandbox")
    config = dict(DEFAULTS)
    host = _load(os.path.join(base, "host.json"))
    config.update({k: v for k, v in host.items() if v is not None})
    config["state"] = _load(os.path.join(base, "gpu-state.json"))
    return config


def _per_gpu(values: Any, index: int, default: int) -> int:
    if isinstance(values, list) and index < len(values):
        try:
            return int(values[index])
        except (TypeError, ValueError):
            return default
    return default


def gpus(config: Dict[str, Any]) -> List[Dict[str, Any]]:
    """One dict per GPU with every canonical field (numbers unformatted)."""
    state = config.get("state") or {}
    total = int(config["memory_total_mib"])
    count = int(config["gpu_count"])
    out = []
    host_tag = sum(ord(c) for c in str(config["host"])) % 0xFFFF
    for i in range(count):
        used = min(total, max(0, _per_gpu(state.get("memory_used_mib"), i, 0)))
        util = _per_gpu(state.get("utilization_gpu"), i, 0)
        bus = BUS_IDS[i % len(BUS_IDS)]
        out.append(
            {
                "count": count,
                "index": i,
                "name": config["gpu_name"],
                "uuid": f"GPU-{host_tag:04x}b200-{i:04x}-4c1d-9e2a-{i:012x}",
                "serial": f"1655024{host_tag:05d}{i:02d}",
                "pci.bus_id": f"00000000:{bus}:00.0",
                "driver_version": config["driver_version"],
                "vbios_version": config["vbios_version"],
                "compute_cap": config["compute_cap"],
                "persistence_mode": "Enabled",
                "pstate": "P0",
                "memory.total": total,
                "memory.used": used,
                "memory.free": total - used,
                "memory.reserved": 0,
                "utilization.gpu": util,
                "utilization.memory": util // 2,
                "temperature.gpu": 31 + i % 4 + util // 5,
                "power.draw": 138.0 + 7.5 * i + 8.0 * util,
                "power.limit": float(config["power_limit_w"]),
                "clocks.current.sm": 1965 if util else 345,
                "clocks.max.sm": 1965,
                "mig.mode.current": "Disabled",
            }
        )
    return out


def _fmt(value: Any, unit: str, units: bool) -> str:
    text = f"{value:.2f}" if isinstance(value, float) else str(value)
    return f"{text} {unit}" if unit and units else text


def _parse_format(spec: str) -> Optional[Tuple[bool, bool]]:
    opts = [o.strip() for o in spec.split(",") if o.strip()]
    if "csv" not in opts or any(o not in ("csv", "noheader", "nounits") for o in opts):
        return None
    return "noheader" not in opts, "nounits" not in opts


def _csv(
    rows: List[Dict[str, Any]],
    names: List[str],
    table: Dict[str, Tuple[str, str]],
    header: bool,
    units: bool,
) -> str:
    lines = []
    if header:
        # nvidia-smi heads each column with the field's canonical name (gpu_name -> name)
        lines.append(
            ", ".join(
                f"{table[n][0]} [{table[n][1]}]" if table[n][1] else table[n][0] for n in names
            )
        )
    for row in rows:
        lines.append(", ".join(_fmt(row[table[n][0]], table[n][1], units) for n in names))
    return "".join(line + "\n" for line in lines)


def _select(all_gpus: List[Dict[str, Any]], ids: Optional[str]) -> Optional[List[Dict[str, Any]]]:
    if ids is None:
        return all_gpus
    chosen = []
    for part in ids.split(","):
        part = part.strip()
        match = [g for g in all_gpus if part in (str(g["index"]), g["uuid"], g["pci.bus_id"])]
        if not match:
            return None
        chosen.extend(match)
    return chosen


def query_gpu(
    config: Dict[str, Any], fields: str, fmt: str, ids: Optional[str] = None
) -> Tuple[int, str]:
    names = [f.strip() for f in fields.split(",") if f.strip()]
    for name in names:
        if name not in FIELDS:
            return 2, f'Field "{name}" is not a valid field to query.\n\n'
    parsed = _parse_format(fmt)
    if not names or parsed is None:
        return 2, INVALID_ARGS
    rows = _select(gpus(config), ids)
    if rows is None:
        return 6, "No devices were found\n"
    return 0, _csv(rows, names, FIELDS, *parsed)


def query_apps(config: Dict[str, Any], fields: str, fmt: str) -> Tuple[int, str]:
    names = [f.strip() for f in fields.split(",") if f.strip()]
    for name in names:
        if name not in APP_FIELDS:
            return 2, f'Field "{name}" is not a valid field to query.\n\n'
    parsed = _parse_format(fmt)
    if not names or parsed is None:
        return 2, INVALID_ARGS
    all_gpus = gpus(config)
    rows = []
    for proc in (config.get("state") or {}).get("processes") or []:
        if not isinstance(proc, dict):
            continue
        for index in proc.get("gpus") or []:
            if not isinstance(index, int) or not 0 <= index < len(all_gpus):
                continue
            gpu = all_gpus[index]
            rows.append(
                {
                    "pid": proc.get("pid", 0),
                    "process_name": proc.get("name", "python3"),
                    "used_gpu_memory": proc.get("used_memory_mib", 0),
                    "gpu_uuid": gpu["uuid"],
                    "gpu_bus_id": gpu["pci.bus_id"],
                    "gpu_name": gpu["name"],
                }
            )
    return 0, _csv(rows, names, APP_FIELDS, *parsed)


def list_gpus(config: Dict[str, Any]) -> str:
    return "".join(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})\n" for g in gpus(config))


WIDTH = 89  # inner width of nvidia-smi's table


def _rule(fill: str = "-", cells: Tuple[int, ...] = ()) -> str:
    if not cells:
        return "+" + fill * WIDTH + "+"
    return "|" + "+".join(fill * c for c in cells) + "|"


def _row(*cells: Tuple[str, int]) -> str:
    return "|" + "|".join(f" {text:<{width - 2}} " for text, width in cells) + "|"


def summary(config: Dict[str, Any]) -> str:
    """The default ``nvidia-smi`` table (abridged to the lines people read)."""
    cols = (41, 24, 22)
    lines = [
        _rule(),
        _row(
            (
                f"NVIDIA-SMI {config['driver_version']:<22}Driver Version: "
                f"{config['driver_version']:<15}CUDA Version: {config['cuda_version']}",
                WIDTH,
            )
        ),
        _rule("-", cols),
        _row(
            ("GPU  Name                 Persistence-M", 41),
            ("Bus-Id          Disp.A", 24),
            ("Volatile Uncorr. ECC", 22),
        ),
        _row(
            ("Fan  Temp   Perf          Pwr:Usage/Cap", 41),
            ("          Memory-Usage", 24),
            ("GPU-Util  Compute M.", 22),
        ),
        _rule("=", cols),
    ]
    for g in gpus(config):
        power = f"{int(g['power.draw'])}W / {int(g['power.limit'])}W"
        memory = f"{g['memory.used']}MiB / {g['memory.total']}MiB"
        util = f"{g['utilization.gpu']}%"
        lines.append(
            _row(
                (f"{g['index']:>3}  {g['name']:<24}{'On':>10}", 41),
                (f"{g['pci.bus_id']:<16} Off", 24),
                (f"{'0':>20}", 22),
            )
        )
        lines.append(
            _row(
                (f"N/A   {g['temperature.gpu']}C    P0{power:>24}", 41),
                (f"{memory:>22}", 24),
                (f"{util:>7}      Default", 22),
            )
        )
        lines.append(_rule("-", cols))
    lines += [
        "",
        _rule(),
        _row(("Processes:", WIDTH)),
        _row(
            (
                " GPU   GI   CI              PID   Type   Process name" + " " * 24 + "GPU Memory",
                WIDTH,
            )
        ),
        _rule("=", (WIDTH,)),
    ]
    shown = False
    for proc in (config.get("state") or {}).get("processes") or []:
        if not isinstance(proc, dict):
            continue
        for index in proc.get("gpus") or []:
            shown = True
            name = str(proc.get("name", "python3"))[:34]
            mem = f"{proc.get('used_memory_mib', 0)}MiB"
            pid = proc.get("pid", 0)
            lines.append(
                _row((f" {index:>3}   N/A  N/A  {pid:>13}      C   {name:<34}{mem:>10}", WIDTH))
            )
    if not shown:
        lines.append(_row(("No running processes found", WIDTH)))
    lines.append(_rule())
    return "\n".join(lines) + "\n"


def _option(argv: List[str], i: int, names: Tuple[str, ...]) -> Tuple[Optional[str], int]:
    """Value of ``--opt=value`` / ``--opt value`` / ``-i value`` at argv[i], and the next index."""
    arg = argv[i]
    for name in names:
        if arg.startswith(name + "="):
            return arg[len(name) + 1 :], i + 1
        if arg == name:
            if i + 1 < len(argv):
                return argv[i + 1], i + 2
            return None, i + 1
    return None, i


HELP = """NVIDIA System Management Interface -- fleet sandbox stand-in.

    nvidia-smi [-i ID] --query-gpu=FIELD[,FIELD...] --format=csv[,noheader][,nounits]
    nvidia-smi --query-compute-apps=FIELD[,FIELD...] --format=csv[,noheader][,nounits]
    nvidia-smi -L | --list-gpus
    nvidia-smi
"""


def run(argv: List[str], config: Dict[str, Any]) -> Tuple[int, str]:
    """Exit code and stdout for ``nvidia-smi argv`` (pure: no I/O)."""
    query_gpu_fields = query_app_fields = fmt = ids = None
    listing = False
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            return 0, HELP
        if arg in ("-L", "--list-gpus"):
            listing = True
            i += 1
            continue
        value, nxt = _option(argv, i, ("--query-gpu",))
        if nxt != i:
            query_gpu_fields, i = value, nxt
            continue
        value, nxt = _option(argv, i, ("--query-compute-apps",))
        if nxt != i:
            query_app_fields, i = value, nxt
            continue
        value, nxt = _option(argv, i, ("--format",))
        if nxt != i:
            fmt, i = value, nxt
            continue
        value, nxt = _option(argv, i, ("-i", "--id"))
        if nxt != i:
            ids, i = value, nxt
            continue
        return 2, INVALID_ARGS
    if listing:
        return 0, list_gpus(config)
    if query_gpu_fields is not None:
        if fmt is None:
            return 2, INVALID_ARGS
        return query_gpu(config, query_gpu_fields, fmt, ids)
    if query_app_fields is not None:
        if fmt is None:
            return 2, INVALID_ARGS
        return query_apps(config, query_app_fields, fmt)
    if fmt is not None or ids is not None:
        return 2, INVALID_ARGS
    return 0, summary(config)


def main(argv: Optional[List[str]] = None) -> int:
    code, out = run(list(sys.argv[1:] if argv is None else argv), load_config())
    sys.stdout.write(out)
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
