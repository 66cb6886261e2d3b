# The rehearsal vLLM across several hosts (fleet/onhost/rehearsal/vllm_sim.py): vLLM's own
# multi-node mode (mp: --nnodes/--node-rank/--master-addr/--master-port, --headless on the
# workers) and Ray (--distributed-executor-backend ray on the head of a real Ray cluster).
#
# mp: the head's rendezvous is a real TCP listener on master_addr:master_port (torch's
# TCPStore stands there); every headless node connects and says its rank; when all have
# joined, the head answers each, and the ranks' lines follow on every node with their
# global ranks. A node that does not join within the rendezvous timeout (torch's 600 s,
# compressed like the load) gives torch's DistStoreError on the head. A node whose
# connection drops later (it died) is noticed: the head prints the NCCL watchdog timeout
# its collectives would meet and exits; a headless node whose head is gone exits too.
#
# ray: the head imports the real `ray`, joins the cluster fleet started (RAY_ADDRESS),
# refuses duplicate node IPs as vLLM does, reserves a placement group of one GPU bundle
# per rank (waiting as vLLM waits, up to its 1800 s, compressed) and keeps one small
# actor on every node's first bundle; an actor that dies (its node died) ends the server
# with Ray's ActorDiedError.
import os
import socket
import threading
import time
from typing import Any, Dict, List, Optional

SIM_RENDEZVOUS_S = 600.0  # torch's default store timeout (DistStoreError after it)
SIM_PLACEMENT_S = 1800.0  # vLLM's PG_WAIT_TIMEOUT (v1/executor/ray_utils.py)
SIM_FULL_LOAD_S = 2400.0  # the 40-minute load the sandbox compresses into load_seconds


class SimRendezvousError(Exception):
    """The process group could not form: torch's (or Ray's) error, as vLLM prints it
    (raised to the load, which fails the ranks with it: vllm_sim_faults.fail_rendezvous)."""


class SimNodes:
    """This process's part of a server across hosts (nothing to do for one host)."""

    def __init__(self, sim: Any, values: Dict[str, Any]) -> None:
        self.sim = sim
        self.backend = str(values.get("distributed_executor_backend") or "")
        self.nnodes = int(values.get("nnodes") or 1)
        self.node_rank = int(values.get("node_rank") or 0)
        self.master_addr = str(values.get("master_addr") or "127.0.0.1")
        self.master_port = int(values.get("master_port") or 29501)
        self.headless = bool(values.get("headless"))
        self.world = sim.tp * sim.pp
        multi = self.backend == "mp" and self.nnodes > 1
        self.local_world = self.world // self.nnodes if multi else self.world
        self.rank0 = self.node_rank * self.local_world if multi else 0
        self.peers: List[socket.socket] = []
        self.listener: Optional[socket.socket] = None
        self.lost: Optional[str] = None
        self.ray_actors: List[Any] = []
        self.ray_pg: Any = None

    @property
    def multinode(self) -> bool:
        return self.backend == "mp" and self.nnodes > 1

    @property
    def ray(self) -> bool:
        return self.backend == "ray"

    def compressed(self, seconds: float) -> float:
        """A vLLM/torch timeout scaled as the sandbox scales the 40-minute load."""
        scale = self.sim.load_seconds / SIM_FULL_LOAD_S if self.sim.load_seconds else 0.01
        override = self.sim.knobs.get("rendezvous_timeout_s")
        if override is not None and seconds == SIM_RENDEZVOUS_S:
            return float(override)
        return max(5.0, seconds * scale)

    def fits(self) -> bool:
        """Does the world size fit the GPUs vLLM will see (ParallelConfig's check)?"""
        if self.ray:
            return True
        return self.local_world <= self.sim.gpu_count

    # -- mp: the rendezvous -------------------------------------------------------------
    def rendezvous(self) -> None:
        if not self.multinode:
            return
        if self.node_rank == 0:
            self._serve_store()
        else:
            self._join_store()
        threading.Thread(target=self._watch, daemon=True).start()

    def _serve_store(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # as torch's TCPStore (c10d socket.cpp enableAddressReuse): the connections of the
        # last server's rendezvous left in TIME_WAIT do not keep the next one from binding;
        # a process that listens there still does
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((self.master_addr, self.master_port))
        except OSError:
            listener.close()
            raise SimRendezvousError(
                "torch.distributed.DistNetworkError: The server socket has failed to listen on "
                "any local network address. port: %d, useIpv6: false, code: -98, name: "
                "EADDRINUSE, message: address already in use" % self.master_port
            ) from None
        listener.listen(64)
        self.listener = listener
        deadline = time.monotonic() + self.compressed(SIM_RENDEZVOUS_S)
        while len(self.peers) < self.nnodes - 1:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SimRendezvousError(
                    "torch.distributed.DistStoreError: Timed out after %d seconds waiting for "
                    "clients. %d/%d clients joined."
                    % (int(SIM_RENDEZVOUS_S) + 1, len(self.peers) + 1, self.nnodes)
                )
            listener.settimeout(min(left, 0.5))
            try:
                conn, _addr = listener.accept()
            except socket.timeout:
                continue
            conn.settimeout(10.0)
            try:
                hello = conn.recv(64).decode("ascii", "replace")
            except OSError:
                conn.close()
                continue
            if hello.startswith("RANK "):
                self.peers.append(conn)
            else:
                conn.close()
        for conn in self.peers:
            conn.sendall(b"GO\n")

    def _join_store(self) -> None:
        deadline = time.monotonic() + self.compressed(SIM_RENDEZVOUS_S)
        while True:
            try:
                conn = socket.create_connection((self.master_addr, self.master_port), timeout=2.0)
                conn.sendall(("RANK %d\n" % self.node_rank).encode("ascii"))
                conn.settimeout(max(1.0, deadline - time.monotonic()))
                if conn.recv(8).startswith(b"GO"):
                    self.peers.append(conn)
                    return
                conn.close()
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SimRendezvousError(
                    "torch.distributed.DistNetworkError: The client socket has timed out after "
                    "%ds while trying to connect to (%s, %d)."
                    % (int(SIM_RENDEZVOUS_S), self.master_addr, self.master_port)
                )
            time.sleep(0.2)

    def _watch(self) -> None:
        """A peer's connection ends: that node died (or the head is gone)."""
        for conn in list(self.peers):
            conn.settimeout(None)
        while self.lost is None and self.peers:
            for conn in list(self.peers):
                conn.settimeout(0.2)
                try:
                    data = conn.recv(1)
                except socket.timeout:
                    continue
                except OSError:
                    data = b""
                if not data:
                    self.lost = "the head" if self.node_rank else "a worker node"
                    return

    def close(self) -> None:
        for conn in self.peers:
            try:
                conn.close()
            except OSError:
                pass
        if self.listener is not None:
            self.listener.close()
        for actor in self.ray_actors:
            try:
                import ray

                ray.kill(actor)
            except Exception:
                pass

    # -- ray: the cluster, the placement group, one actor per node ------------------------
    def ray_place(self) -> None:
        if not self.ray:
            return
        sim = self.sim
        try:
            import ray
            from ray.util.placement_group import placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        except ImportError as exc:
            raise SimRendezvousError(
                "ImportError: Failed to import Ray, please install Ray with `pip install ray`. (%s)"
                % exc
            ) from None
        address = os.environ.get("RAY_ADDRESS") or "auto"
        ray.init(address=address, logging_level="ERROR", log_to_driver=False,
                 include_dashboard=False)  # fmt: skip
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        ips = sorted({str(n.get("NodeManagerAddress")) for n in nodes})
        if len(ips) < len(nodes):
            raise SimRendezvousError(
                "RuntimeError: Every node should have a unique IP address. Got %d nodes with "
                "node ids %s and %d unique IP addresses %s. Please check your network "
                "configuration. If you set `VLLM_HOST_IP` environment variable, make sure it "
                "is unique for each node."
                % (len(nodes), [n.get("NodeID") for n in nodes], len(ips), set(ips))
            )
        sim.say_ray("ray_pg_new", ())
        specs = [{"GPU": 1.0} for _ in range(self.world)]
        self.ray_pg = placement_group(specs, strategy="PACK")
        wait = self.compressed(SIM_PLACEMENT_S)
        started = time.monotonic()
        interval = 10.0
        while True:
            ready, _ = ray.wait([self.ray_pg.ready()], timeout=min(interval, wait))
            if ready:
                break
            waited = time.monotonic() - started
            if waited >= wait:
                raise SimRendezvousError(
                    "ValueError: Cannot provide a placement group requiring %d GPUs "
                    "(placement_group_specs=%s) within %d seconds. See `ray status` and `ray "
                    "list nodes` to make sure the cluster has enough resources."
                    % (self.world, specs, int(SIM_PLACEMENT_S))
                )
            sim.say_ray("ray_pg_wait", (int(waited), specs))
            interval *= 2

        @ray.remote(num_gpus=1, num_cpus=0)
        class SimRank:
            def ip(self) -> str:
                return ray.util.get_node_ip_address()

        per_node = max(1, self.world // max(1, len(ips)))
        for bundle in range(0, self.world, per_node):
            strategy = PlacementGroupSchedulingStrategy(
                placement_group=self.ray_pg, placement_group_bundle_index=bundle
            )
            rank: Any = SimRank
            self.ray_actors.append(rank.options(scheduling_strategy=strategy).remote())
        self.ray_ips = ray.get([a.ip.remote() for a in self.ray_actors], timeout=120)
        threading.Thread(target=self._watch_ray, daemon=True).start()

    def _watch_ray(self) -> None:
        import ray

        while self.lost is None:
            time.sleep(0.5)
            for actor, ip in zip(self.ray_actors, self.ray_ips):
                try:
                    ray.get(actor.ip.remote(), timeout=30)
                except Exception as exc:
                    self.lost = "the Ray node %s (%s)" % (ip, type(exc).__name__)
                    return
