# fleet on-host module: the rehearsal vLLM's processes and its GPU memory.
#
# Part of the simulated `vllm serve` (vllm_sim.py). Python 3.8+, standard library only.
#
# Real vLLM is an APIServer, an EngineCore child and one worker per GPU (grandchildren of
# the APIServer). The simulator starts the same tree: the EngineCore and the workers are
# small sleeping Python processes whose /proc/PID/cmdline reads `VLLM::EngineCore` /
# `VLLM::Worker_TP0` ... They write exactly the bytes the APIServer (which plays the
# script) hands them, on their own stdout/stderr, and acknowledge each write, so the log
# is in order and every line carries the pid of the process that wrote it. They exit
# when the server closes their command pipe (whatever way it dies), on SIGTERM, or when
# told to; the EngineCore then clears the server's entries from the GPU state file.
#
# `~/.fleet-sandbox/gpu-state.json` (read by the sandbox's nvidia-smi stand-in):
# {"memory_used_mib": [per GPU], "processes": [{"pid", "name", "gpus", "used_memory_mib",
# "owner"}]}: memory not listed under a process (a test's "another job") is kept.
import fcntl
import json
import os
import signal
import sys
import threading
from typing import Any, Dict, List, Optional

# The program of a child process (run with `python -c`, argv: title, cmd fd, ack fd,
# python, state file, owner pid, then for the EngineCore the workers' fds).
SIM_CHILD = r"""
import fcntl, json, os, signal, sys
cmd_fd, ack_fd = int(sys.argv[1]), int(sys.argv[2])
python, state, owner = sys.argv[3], sys.argv[4], int(sys.argv[5])
workers = [int(x) for x in sys.argv[6:]]
children = []
def reap(*_):
    try:
        while True:
            pid, _st = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
    except ChildProcessError:
        return
def clear():
    if not state:
        return
    try:
        with open(state + ".lock", "a") as lk:
            fcntl.flock(lk, fcntl.LOCK_EX)
            try:
                with open(state) as fh:
                    doc = json.load(fh)
            except (OSError, ValueError):
                return
            procs = doc.get("processes") or []
            mine = [p for p in procs if isinstance(p, dict) and p.get("owner") == owner]
            if not mine:
                return
            used = list(doc.get("memory_used_mib") or [])
            for p in mine:
                for g in p.get("gpus") or []:
                    if 0 <= g < len(used):
                        used[g] = max(0, int(used[g]) - int(p.get("used_memory_mib") or 0))
            doc["processes"] = [p for p in procs if p not in mine]
            doc["memory_used_mib"] = used
            tmp = state + ".%d.tmp" % os.getpid()
            with open(tmp, "w") as fh:
                json.dump(doc, fh)
            os.replace(tmp, state)
    except OSError:
        pass
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGCHLD, reap)
rd = os.fdopen(cmd_fd, "rb")
def ack(text):
    try:
        os.write(ack_fd, text.encode() + b"\n")
    except OSError:
        os._exit(0)
while True:
    head = rd.readline()
    if not head:
        clear()
        os._exit(0)
    parts = head.split()
    op = parts[0]
    if op == b"W":
        fd, n = int(parts[1]), int(parts[2])
        data = rd.read(n)
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(fd, view):]
            except BrokenPipeError:
                break
        ack("ok")
    elif op == b"S":
        count = int(parts[1])
        pids = []
        for i in range(count):
            cfd, afd = workers[2 * i], workers[2 * i + 1]
            pid = os.fork()
            if pid == 0:
                for j, fd in enumerate(workers):
                    if fd not in (cfd, afd):
                        os.close(fd)
                os.close(cmd_fd)
                os.close(ack_fd)
                os.set_inheritable(cfd, True)
                os.set_inheritable(afd, True)
                title = parts[2 + i].decode()
                os.execv(python, [title, "-c", CODE, str(cfd), str(afd), python, "", "0"])
            pids.append(str(pid))
        for fd in workers:
            os.close(fd)
        workers = []
        ack(" ".join(pids))
    elif op == b"X":
        if len(parts) > 2 and parts[2] == b"clear":
            clear()
        ack("ok")
        os._exit(int(parts[1]))
    elif op == b"K":
        ack("ok")
        os.kill(os.getpid(), int(parts[1]))
    elif op == b"T":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        ack("ok")
    else:
        ack("?")
"""


class SimChild:
    """A child process the server drives through a command pipe."""

    def __init__(self, title: str, pid: int, cmd_fd: int, ack_fd: int) -> None:
        self.title = title
        self.pid = pid
        self.cmd_fd = cmd_fd
        self.ack = os.fdopen(ack_fd, "rb")
        self.alive = True
        self.lock = threading.Lock()

    def request(self, head: bytes, data: bytes = b"") -> Optional[str]:
        if not self.alive:
            return None
        with self.lock:
            try:
                view = memoryview(head + data)
                while view:
                    view = view[os.write(self.cmd_fd, view) :]
                answer = self.ack.readline()
            except OSError:
                answer = b""
        if not answer:
            self.alive = False
            return None
        return answer.decode().strip()

    def write(self, fd: int, data: bytes) -> None:
        self.request(b"W %d %d\n" % (fd, len(data)), data)

    def exit(self, code: int, clear: bool = False) -> None:
        self.request(b"X %d%s\n" % (code, b" clear" if clear else b""))
        self.alive = False

    def drain_on_sigterm(self) -> None:
        """A SIGTERM no longer ends this process: the server drains, then ends it (vLLM
        0.18+'s EngineCore with --shutdown-timeout takes SIGTERM as "finish, then stop")."""
        self.request(b"T\n")

    def kill(self, sig: int) -> None:
        self.request(b"K %d\n" % sig)
        self.alive = False

    def close(self) -> None:
        self.alive = False
        for fd in (self.cmd_fd,):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            self.ack.close()
        except OSError:
            pass


def sim_spawn_engine(
    python: str, worker_titles: List[str], state_path: str, owner: int
) -> Dict[str, Any]:
    """Start the EngineCore (`VLLM::EngineCore`) with pipes for its future workers.

    Returns {"engine": SimChild, "worker_pipes": [(cmd_w, ack_r)] per worker}; the
    workers are started later by `sim_spawn_workers` (as the EngineCore's children)."""
    ecmd_r, ecmd_w = os.pipe()
    eack_r, eack_w = os.pipe()
    child_fds: List[int] = []
    mine: List[Any] = []
    for _title in worker_titles:
        cmd_r, cmd_w = os.pipe()
        ack_r, ack_w = os.pipe()
        child_fds += [cmd_r, ack_w]
        mine.append((cmd_w, ack_r))
    pid = os.fork()
    if pid == 0:  # pragma: no cover - replaced by exec
        try:
            os.close(ecmd_w)
            os.close(eack_r)
            for cmd_w, ack_r in mine:
                os.close(cmd_w)
                os.close(ack_r)
            for fd in [ecmd_r, eack_w, *child_fds]:
                os.set_inheritable(fd, True)
            argv = ["VLLM::EngineCore", "-c", "CODE = %r\n" % SIM_CHILD + SIM_CHILD]
            argv += [str(ecmd_r), str(eack_w), python, state_path, str(owner)]
            argv += [str(fd) for fd in child_fds]
            os.execv(python, argv)
        finally:
            os._exit(127)
    os.close(ecmd_r)
    os.close(eack_w)
    for fd in child_fds:
        os.close(fd)
    return {"engine": SimChild("VLLM::EngineCore", pid, ecmd_w, eack_r), "worker_pipes": mine}


def sim_spawn_workers(engine: SimChild, titles: List[str], pipes: List[Any]) -> List[SimChild]:
    head = b"S %d %s\n" % (len(titles), " ".join(titles).encode())
    answer = engine.request(head) or ""
    pids = [int(p) for p in answer.split() if p.isdigit()]
    out = []
    for i, title in enumerate(titles):
        cmd_w, ack_r = pipes[i]
        pid = pids[i] if i < len(pids) else 0
        child = SimChild(title, pid, cmd_w, ack_r)
        if not pid:
            child.alive = False
        out.append(child)
    return out


# ---- GPU memory seen by the nvidia-smi stand-in --------------------------------------


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open("/proc/%d/stat" % pid) as fh:
            return fh.read().rsplit(")", 1)[-1].split()[0] not in ("Z", "X")
    except OSError:
        return True


class SimGpuState:
    """Reads and updates `gpu-state.json` under a lock (never half-written)."""

    def __init__(self, path: str, count: int, total_mib: int) -> None:
        self.path = path
        self.count = count
        self.total_mib = total_mib

    def _load(self) -> Dict[str, Any]:
        try:
            with open(self.path) as fh:
                doc = json.load(fh)
        except (OSError, ValueError):
            return {}
        return doc if isinstance(doc, dict) else {}

    def _split(self, doc: Dict[str, Any]) -> Any:
        """(memory used per GPU by others than listed processes, live process entries)."""
        used = [0] * self.count
        for i, value in enumerate(doc.get("memory_used_mib") or []):
            if i < self.count:
                try:
                    used[i] = int(value)
                except (TypeError, ValueError):
                    pass
        procs = [p for p in doc.get("processes") or [] if isinstance(p, dict)]
        for proc in procs:
            for g in proc.get("gpus") or []:
                if isinstance(g, int) and 0 <= g < self.count:
                    used[g] -= int(proc.get("used_memory_mib") or 0)
        external = [max(0, u) for u in used]
        live = [p for p in procs if _pid_alive(int(p.get("pid") or 0))]
        return external, live

    def used_by_others(self, owner: int) -> List[int]:
        """Memory in use per GPU by anything but this server (external + other owners)."""
        external, live = self._split(self._load())
        for proc in live:
            if proc.get("owner") == owner:
                continue
            for g in proc.get("gpus") or []:
                if isinstance(g, int) and 0 <= g < self.count:
                    external[g] += int(proc.get("used_memory_mib") or 0)
        return external

    def update(self, owner: int, entries: List[Dict[str, Any]]) -> None:
        """Replace this server's process entries (owner = the APIServer's pid)."""
        directory = os.path.dirname(self.path)
        if not os.path.isdir(directory):
            return
        try:
            with open(self.path + ".lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                external, live = self._split(self._load())
                procs = [p for p in live if p.get("owner") != owner]
                for entry in entries:
                    item = dict(entry)
                    item["owner"] = owner
                    procs.append(item)
                used = list(external)
                for proc in procs:
                    for g in proc.get("gpus") or []:
                        if isinstance(g, int) and 0 <= g < self.count:
                            used[g] += int(proc.get("used_memory_mib") or 0)
                doc = {
                    "memory_used_mib": [min(self.total_mib, u) for u in used],
                    "utilization_gpu": [0 if u == 0 else 3 for u in used],
                    "processes": procs,
                }
                tmp = "%s.%d.tmp" % (self.path, os.getpid())
                with open(tmp, "w") as fh:
                    json.dump(doc, fh, indent=2)
                    fh.write("\n")
                os.replace(tmp, self.path)
        except OSError:
            pass


def sim_die_by(sig: int) -> None:
    """End this process by `sig` with the default action (exit status 128+sig)."""
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    signal.pause() if hasattr(signal, "pause") else None
    os._exit(128 + sig)
