"""How a ReplicaManager's replicas share parameters (`ReplicaOptions`), every value checked
when the options are made: a bad one is a ValueError naming the field, not a worker's failure
once the replicas have started.

    >>> ReplicaOptions(mode="ssp", staleness=3).staleness
    3
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from numbers import Real

from graphflow.errors import count_of
from graphflow.replicas.compress import make_codec
from graphflow.replicas.feed import LOCKSTEP
from graphflow.replicas.link import MODES as PS_MODES
from graphflow.runtime.clusterfile import CONNECT_TIMEOUT, load_cluster_file
from graphflow.runtime.options import MODES as WORKER_MODES
from graphflow.runtime.options import check_seconds

MODES = (*PS_MODES, "allreduce", "sandblaster")
REPLICA_TIMEOUT = 30.0  # s: the default timeout
BSP_DEADLINE = 10.0  # s: the default bsp_deadline (under REPLICA_TIMEOUT / 2)


@dataclass
class ReplicaOptions:
    """How replicas share parameters. `mode`: downpour, bsp or ssp through the parameter
    server, allreduce (synchronous, no PS: `algorithm` ring or tree) or sandblaster (L-BFGS,
    one iteration per batch, cut into `portions`; the optimizer is not used); `n_fetch` / `n_push`:
    downpour's fetch and push intervals in steps; `staleness`: ssp's s; `warm_start`: steps
    replica 0 runs alone first (downpour; ssp up to staleness + 1); `compress`: None,
    "float16" or "topk:FRACTION"; `slow`: replica -> seconds added to each of its steps (for
    experiments and tests). `timeout`: how long a replica's worker may be silent before its
    step fails (naming it); `bsp_deadline`: how long the bsp barrier waits for a replica
    before dropping it, by default 10 s or timeout / 3 if less (under the timeout / 2 the
    waiting replicas retry their PS calls for).

    Placement: `placement` threads or processes of this machine, or `hosts`: the control
    addresses of `graphflow worker`s elsewhere, replicas x parts of them (replica r gets
    hosts[r * parts:(r + 1) * parts]); the shards then listen on tcp at `ps_host`, an address
    of this machine those workers reach (`with_cluster_file` reads both)."""

    mode: str = "downpour"
    algorithm: str = "ring"
    portions: int = 8
    n_fetch: int = 1
    n_push: int = 1
    staleness: int = 2
    warm_start: int = 0
    compress: str | None = None
    placement: str = "threads"
    shard_placement: str = "threads"
    checkpoint_dir: str | None = None
    checkpoint_every: int = 200
    bsp_deadline: float | None = None  # None: BSP_DEADLINE, or timeout / 3 if less
    timeout: float = REPLICA_TIMEOUT  # a replica's worker silent this long fails its step
    connect_timeout: float = CONNECT_TIMEOUT  # remote workers' time to answer the first call
    ps_timeout: float = 2.0
    slow: dict[int, float] = field(default_factory=dict)
    hosts: list[str] | None = None
    ps_host: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown mode '{self.mode}'; known: {', '.join(MODES)}")
        if self.algorithm not in ("ring", "tree"):
            raise ValueError(f"unknown allreduce algorithm '{self.algorithm}': ring or tree")
        if self.bsp_deadline is None:  # (under the waiting replicas' timeout / 2 retries:
            check_seconds("timeout", self.timeout)  # the barrier drops one before they give up)
            self.bsp_deadline = min(BSP_DEADLINE, self.timeout / 3)
        self._check_values()
        if self.hosts and not self.ps_host and self.mode != "allreduce":
            raise ValueError("replicas on remote workers need ps_host: an address of this "
                             "machine the workers reach, for the parameter-server shards")
        if self.warm_start and (self.mode in LOCKSTEP or (
                self.mode == "ssp" and self.warm_start > self.staleness + 1)):
            # (replica 0 would wait at its first barrier, or the ssp gate, for the others)
            raise ValueError(f"warm_start {self.warm_start}: replica 0 cannot run alone in "
                             f"{self.mode} mode" + (f" past staleness {self.staleness} + 1"
                                                    if self.mode == "ssp" else ""))

    def _check_values(self) -> None:
        for name in ("portions", "n_fetch", "n_push"):
            count_of(getattr(self, name), name)
        for name in ("staleness", "warm_start", "checkpoint_every"):
            count_of(getattr(self, name), name, minimum=0)
        if self.placement not in WORKER_MODES or (self.placement == "remote" and not self.hosts):
            raise ValueError(f"placement must be threads or processes (or remote, with hosts), "
                             f"got {self.placement!r}")
        if self.shard_placement not in ("threads", "processes"):
            raise ValueError(f"shard_placement must be threads or processes, got "
                             f"{self.shard_placement!r}")
        for name in ("bsp_deadline", "timeout", "connect_timeout", "ps_timeout"):
            check_seconds(name, getattr(self, name))
        if self.compress is not None:
            if not isinstance(self.compress, str):  # (it goes to the workers as text)
                raise ValueError(f"compress must be a codec spec string, got {self.compress!r}")
            try:
                make_codec(self.compress)
            except ValueError as e:
                raise ValueError(f"compress {self.compress!r}: {e}") from None
        if not isinstance(self.slow, dict):
            raise ValueError(f"slow must be a dict replica -> seconds, got {self.slow!r}")
        for r, seconds in self.slow.items():
            count_of(r, "a replica in slow", minimum=0)
            if not (isinstance(seconds, Real) and math.isfinite(seconds) and seconds >= 0):
                raise ValueError(f"slow[{r}] must be a number of seconds >= 0, got {seconds!r}")
        if self.hosts is not None and (not isinstance(self.hosts, list) or not all(
                isinstance(h, str) for h in self.hosts)):
            raise ValueError(f"hosts must be a list of worker addresses, got {self.hosts!r}")

    def with_cluster_file(self, path: str) -> ReplicaOptions:
        """These options with `hosts` and `ps_host` from a TOML cluster file:
        `workers = ["tcp://10.0.0.2:5555", ...]` and `ps_host = "10.0.0.1"`."""
        data = load_cluster_file(path)
        ps_host = data.get("ps_host")
        if ps_host is not None and not isinstance(ps_host, str):
            raise ValueError(f"{path}: ps_host must be a string such as \"10.0.0.1\"")
        return replace(self, hosts=data["workers"], ps_host=ps_host)

