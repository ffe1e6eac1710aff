"""Which driver a served worker serves, and whether a driver and a worker speak the same RPCs.

A `graphflow worker --listen` process outlives its drivers (runtime/service.py). `Owners`
keeps which driver is attached and which drivers were taken over (by whom), and refuses the
calls of any other. A worker's `hello` (and `attach`) reply names its graphflow version and
PROTOCOL; the driver refuses a worker whose differ (`check_worker`) before its first `load`,
which would otherwise fail on a changed signature.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from graphflow.runtime.calls import WorkerFailed

# Bump when a worker RPC's name or arguments change: the package version stays the same
# between commits, so two checkouts tell their RPCs apart by this. (1: workers before it.)
PROTOCOL = 2
ANYONE = frozenset({"hello", "attach", "release"})  # what any driver may ask, attached or not
TAKEN_OVER_KEPT = 64  # drivers remembered as taken over (enough for any one worker's life)

Reaches = Callable[[bytes], bool]  # whether a driver (a routing id) is still connected


def graphflow_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("graphflow")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def check_workers(names: Sequence[str], addresses: Sequence[str], replies: Sequence[Any]) -> None:
    """Refuse the first worker (`names`, at `addresses`) whose `hello` reply names another
    graphflow version or protocol than this driver's: WorkerFailed naming both."""
    ours = f"graphflow {graphflow_version()} (protocol {PROTOCOL})"
    for name, address, reply in zip(names, addresses, replies, strict=True):
        if not isinstance(reply, Mapping) or "protocol" not in reply:
            theirs = "an older graphflow that reports no version"
        elif (reply.get("version"), reply.get("protocol")) == (graphflow_version(), PROTOCOL):
            continue
        else:
            theirs = f"graphflow {reply.get('version')} (protocol {reply.get('protocol')})"
        raise WorkerFailed(f"{name} at {address} runs {theirs}, this driver {ours}: install "
                           f"the same graphflow on both (and restart the worker)", name)


class Owners:
    """The driver a served worker serves (`owner`, a routing id, described as `driver`), and
    the drivers it was taken from: their later calls are refused, even once the driver that
    took it over has released it (a paused driver resumes after its run was dropped).
    `say` reports drivers attaching and leaving; `run` tells apart two drivers of one process
    (two Clusters) from one driver connected twice."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.owner: bytes | None = None
        self.driver = self.run = ""
        self._taken: dict[bytes, str] = {}  # a driver taken over -> the one that took it

    def admit(self, method: str, caller: bytes | None) -> None:
        """RuntimeError unless `caller` may call `method` now."""
        if method in ANYONE or caller == self.owner:
            return
        if self.owner is not None:
            taker, since = self.driver, ""
        elif caller in self._taken:
            taker, since = self._taken[caller], " (and has released it since)"
        else:
            return  # (unattached: a driver that started this worker itself)
        raise RuntimeError(f"{method!r} refused: this worker now serves driver {taker}, which "
                           f"took it over while this driver seemed gone{since}")

    def attach(self, caller: bytes | None, driver: str, run: str, server: Any = None) -> bool:
        """Make `caller` the owner; True if it is a new one (the run before is dropped). A
        driver still connected (`server.reaches` it: an RpcServer) keeps the worker:
        RuntimeError."""
        if self.owner is not None and caller == self.owner:
            self.driver, self.run = driver, run
            return False
        if self.owner is not None:
            if server is not None and server.reaches(self.owner):
                if run and run == self.run:  # one driver, two connections: two entries
                    raise RuntimeError(f"this worker ({server.address}) is listed twice in "
                                       f"the cluster of driver {driver}: one worker, two "
                                       f"entries (under different spellings?): list it once")
                raise RuntimeError(f"this worker serves driver {self.driver}, which is still "
                                   f"connected: it is free once that driver closes")
            self.say(f"driver {self.driver} is gone without releasing: its run is dropped")
            self._taken[self.owner] = driver
            while len(self._taken) > TAKEN_OVER_KEPT:
                del self._taken[next(iter(self._taken))]
        self._taken.pop(caller, None)  # type: ignore[arg-type]
        self.say(f"driver {driver} attached")
        self.owner, self.driver, self.run = caller, driver, run
        return True

    def release(self, caller: bytes | None) -> bool:
        """Whether `caller` was the owner (now there is none)."""
        if caller != self.owner:
            return False
        self.say(f"driver {self.driver} left")
        self.owner, self.driver, self.run = None, "", ""
        return True

    def gone(self, reaches: Reaches) -> bool:
        """Whether the attached driver is gone without releasing (its connection ended, or
        fell silent past the heartbeat timeout: transport/endpoint.py's HEARTBEAT_MS)."""
        return self.owner is not None and not reaches(self.owner)
