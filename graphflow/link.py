"""A point-to-point link between two workers, as the cost model prices a message on it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    """seconds(n) = latency + n / bandwidth: a message of n bytes, from its send to its receipt.

    A `shared` link is shared memory between worker processes of one machine
    (transport/ring.py): the sender copies the bytes into it, so that part of the hop is the
    sender's CPU (`copy_seconds`) and none is left on the wire (`wire_seconds`). Traced, a
    sender spent 0.2-0.35 ms of its step on a 1.4-2 MB message, where the link's latency and
    a constant CPU per message had priced none of it.

    >>> Link(1e9, 1e-4).seconds(1_000_000)
    0.0011
    >>> shm = Link(1e9, 1e-4, shared=True)
    >>> shm.copy_seconds(1_000_000), shm.wire_seconds(1_000_000)
    (0.001, 0.0)
    """

    bandwidth_Bps: float
    latency_s: float
    shared: bool = False

    def seconds(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bandwidth_Bps

    def copy_seconds(self, nbytes: float) -> float:
        """The sender's CPU seconds moving the bytes (a shared link's)."""
        return nbytes / self.bandwidth_Bps if self.shared else 0.0

    def wire_seconds(self, nbytes: float) -> float:
        """Seconds the bytes hold the sender's and the receiver's link (not a shared one's)."""
        return 0.0 if self.shared else nbytes / self.bandwidth_Bps

    @classmethod
    def ten_gigabit(cls) -> Link:
        """A 10 Gbit/s network: 1.25 GB/s, 100 us latency."""
        return cls(1.25e9, 100e-6)

    @classmethod
    def builtin(cls) -> Link:
        """The conservative local default: 1.2 GB/s, 300 us (loopback ZeroMQ)."""
        return cls(1.2e9, 300e-6)
