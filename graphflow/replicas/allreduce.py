"""Allreduce for synchronous data parallelism (as in FireCaffe): ring or binomial tree.

R ranks each hold the same named gradients; `AllReduce.allreduce` returns, on every rank, their
sum or mean. The dict is flattened into one buffer in sorted-name order and then

- `ring`: cut into R chunks; R-1 reduce-scatter steps (each rank sends one chunk to the next
  rank and adds the one from the previous) leave rank r the total of chunk r+1; R-1 all-gather
  steps pass the totals around. Each rank sends 2(R-1)/R of the vector, whatever R is.
- `tree`: a binomial tree rooted at rank 0; the sums flow up (log2 R rounds), the result flows
  back down. Fewer messages (better for small vectors), but rank 0 moves whole vectors.

Ranks talk over `Endpoint`s: each rank binds one and connects to the ranks it sends to. Keys
carry the step and the phase ("ar/STEP/rs/I", "ar/STEP/up/RANK", ...), so steps never mix. On
first use the ranks join: each reports to rank 0, which answers with the ranks that did not come,
so a rank that never joins is named (PeerTimeout) on every rank within about the timeout.

    >>> group = LocalGroup(2, "ring")
    >>> out = group.allreduce([{"w": np.ones(3, np.float32)}, {"w": np.zeros(3, np.float32)}],
    ...                       step=0)
    >>> out[1]["w"]
    array([0.5, 0.5, 0.5], dtype=float32)
    >>> group.close()
"""

from __future__ import annotations

import itertools
import logging
import os
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, TypeVar

import numpy as np
import zmq

from graphflow.transport.endpoint import Endpoint, PeerTimeout
from graphflow.transport.frames import FrameError

log = logging.getLogger("graphflow.replicas")

ALGORITHMS = ("ring", "tree")
T = TypeVar("T")
_GROUPS = itertools.count()


def rank_name(rank: int) -> str:
    """The endpoint name of `rank` (what peers expect tensors to come from)."""
    return f"rank{rank}"


def _lowbit(r: int) -> int:
    return r & -r


class AllReduce:
    """One rank of an allreduce group over `endpoint` (named `rank_name(rank)`; this object owns
    and closes it). `peers` maps ranks to their endpoints' addresses; only the ranks this one
    sends to are needed (rank 0 sends to all when they join). `timeout` (s) bounds every receive;
    sends are bounded by the endpoint's own timeout.

        ar = AllReduce(1, 4, Endpoint("rank1", "ipc:///tmp/ar1"), peers, "ring", timeout=10)
        mean = ar.allreduce({"w": grad_w, "b": grad_b}, step=7)
    """

    def __init__(self, rank: int, size: int, endpoint: Endpoint, peers: Mapping[int, str],
                 algorithm: str = "ring", timeout: float = 30.0) -> None:
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown allreduce algorithm {algorithm!r}; known: "
                             f"{', '.join(ALGORITHMS)}")
        if not 0 <= rank < size:
            raise ValueError(f"rank {rank} is not in a group of {size}")
        if endpoint.name != rank_name(rank):
            raise ValueError(f"rank {rank}: endpoint is named {endpoint.name!r}, expected "
                             f"{rank_name(rank)!r} (peers check who a tensor comes from)")
        self.rank, self.size, self.algorithm = rank, size, algorithm
        self.endpoint, self.timeout, self.peers = endpoint, timeout, dict(peers)
        missing = [r for r in self.targets() if r not in self.peers]
        if missing:
            raise ValueError(f"rank {rank} ({algorithm}) sends to ranks {missing} but peers has "
                             f"no address for them")
        self.name = rank_name(rank)
        self.bytes_sent = 0       # array bytes this rank sent, all calls
        self.last_bytes_sent = 0  # ... in the last allreduce
        self.calls = 0
        self._joined = size == 1
        self._connected: set[int] = set()
        self._trackers: list[tuple[zmq.MessageTracker, int, str]] = []

    def __repr__(self) -> str:
        return f"AllReduce(rank={self.rank}, size={self.size}, {self.algorithm!r})"

    def targets(self) -> list[int]:
        """The ranks this one sends to (joining included)."""
        r, R = self.rank, self.size
        if R == 1:
            return []
        out = set(range(1, R)) if r == 0 else {0}
        if self.algorithm == "ring":
            out.add((r + 1) % R)
        else:
            out.update(self._children())
            if r:
                out.add(r - _lowbit(r))
        return sorted(out)

    def _children(self) -> list[int]:
        """Tree children, largest subtree first: r + m for powers of two m below r's low bit."""
        top = _lowbit(self.rank) if self.rank else 1 << self.size.bit_length()
        masks = [1 << i for i in range(top.bit_length() - 1)]
        return [self.rank + m for m in reversed(masks) if self.rank + m < self.size]

    # -- joining ---------------------------------------------------------------------------------
    def join(self) -> None:
        """Connect and meet the other ranks (called by the first allreduce). Raises PeerTimeout
        naming the ranks that did not join within the timeout.
        """
        if self._joined:
            return
        for r in self.targets():
            if r not in self._connected:  # a join that failed may be tried again
                self.endpoint.connect(rank_name(r), self.peers[r])
                self._connected.add(r)
        if self.rank == 0:
            self._gather_roster()
        else:
            self.endpoint.send(rank_name(0), f"ar/join/{self.rank}", np.int64([self.rank]))
            absent = self.endpoint.recv("ar/roster", rank_name(0), 2 * self.timeout + 1.0)
            self._raise_absent([int(a) for a in absent], "reported by rank0")
        self._joined = True

    def _gather_roster(self) -> None:
        deadline = time.monotonic() + self.timeout
        absent = []
        for r in range(1, self.size):
            try:
                self.endpoint.recv(f"ar/join/{r}", rank_name(r),
                                   max(0.0, deadline - time.monotonic()))
            except PeerTimeout:
                absent.append(r)
        for r in range(1, self.size):
            if r not in absent:
                self.endpoint.send(rank_name(r), "ar/roster", np.int64(absent))
        self._raise_absent(absent, "rank0 waited for them")

    def _raise_absent(self, absent: list[int], how: str) -> None:
        if absent:
            names = ", ".join(rank_name(a) for a in absent)
            raise PeerTimeout(f"{self.name}: allreduce group of {self.size}: {names} did not "
                              f"join within {self.timeout:g}s ({how})",
                              rank_name(absent[0]), f"ar/join/{absent[0]}")

    # -- the reduction ---------------------------------------------------------------------------
    def allreduce(self, arrays: Mapping[str, np.ndarray], step: int,
                  average: bool = True) -> dict[str, np.ndarray]:
        """The sum (or with `average` the mean) over all ranks of each named array; every rank
        must call it with the same names, shapes and `step`. Returns new arrays.

            means = ar.allreduce({"w": gw, "b": gb}, step=3)
        """
        buf, spans = _flatten(arrays)
        self.last_bytes_sent = 0
        try:
            self.join()
            if self.size > 1:
                (self._ring if self.algorithm == "ring" else self._tree)(buf, step, average)
            self._settle()
        except Exception as e:
            self._trackers.clear()  # the buffer is dropped with the step: peers may keep it
            log.error("%s: allreduce (%s, %d ranks) of step %d failed: %s", self.name,
                      self.algorithm, self.size, step, e)
            raise
        self.calls += 1
        return {name: buf[lo:hi].reshape(shape).astype(dtype, copy=False)
                for name, (lo, hi, shape, dtype) in spans.items()}

    def _ring(self, buf: np.ndarray, step: int, average: bool) -> None:
        r, R = self.rank, self.size
        nxt, prv = (r + 1) % R, (r - 1) % R
        cuts = [c * buf.size // R for c in range(R + 1)]

        def chunk(c: int) -> np.ndarray:
            c %= R
            return buf[cuts[c]:cuts[c + 1]]

        for s in range(R - 1):  # reduce-scatter: afterwards chunk r+1 holds its total
            key = f"ar/{step}/rs/{s}"
            self._send(nxt, key, chunk(r - s), step)
            mine = chunk(r - s - 1)
            np.add(mine, self._recv(prv, key, step, mine), out=mine)
        if average:
            chunk(r + 1)[...] /= R
        for s in range(R - 1):  # all-gather
            key = f"ar/{step}/ag/{s}"
            self._send(nxt, key, chunk(r + 1 - s), step)
            mine = chunk(r - s)
            mine[...] = self._recv(prv, key, step, mine)

    def _tree(self, buf: np.ndarray, step: int, average: bool) -> None:
        r = self.rank
        children = self._children()
        for c in reversed(children):  # smallest subtree first: it is ready first
            np.add(buf, self._recv(c, f"ar/{step}/up/{c}", step, buf), out=buf)
        if r:
            parent = r - _lowbit(r)
            self._send(parent, f"ar/{step}/up/{r}", buf, step)
            buf[...] = self._recv(parent, f"ar/{step}/down/{r}", step, buf)
        elif average:
            buf /= self.size
        for c in children:
            self._send(c, f"ar/{step}/down/{c}", buf, step)

    def _send(self, peer: int, key: str, array: np.ndarray, step: int) -> None:
        tracker = self.endpoint.send(rank_name(peer), key, array, step)
        if tracker is not None:  # zero-copy: `array` must not change until the peer is done
            self._trackers.append((tracker, peer, key))
        self.bytes_sent += array.nbytes
        self.last_bytes_sent += array.nbytes

    def _recv(self, peer: int, key: str, step: int, like: np.ndarray) -> np.ndarray:
        got = self.endpoint.recv(key, rank_name(peer), self.timeout, step=step)
        if got.dtype != like.dtype or got.shape != like.shape:
            raise FrameError(f"{self.name}: {key!r} from {rank_name(peer)} is {got.size} "
                             f"{got.dtype}, expected {like.size} {like.dtype} (do all ranks "
                             "reduce the same names and shapes?)")
        return got

    def _settle(self) -> None:
        """Wait until peers are done with the zero-copy buffers sent (inproc lends memory)."""
        deadline = time.monotonic() + self.timeout
        trackers, self._trackers = self._trackers, []
        for tracker, peer, key in trackers:
            try:
                tracker.wait(max(0.0, deadline - time.monotonic()))
            except zmq.NotDone:
                raise PeerTimeout(f"{self.name}: {rank_name(peer)} still holds tensor {key!r} "
                                  f"after {self.timeout:g}s", rank_name(peer), key) from None

    def close(self) -> None:
        """Close the endpoint (idempotent)."""
        self._trackers.clear()
        self.endpoint.close()


def _flatten(arrays: Mapping[str, np.ndarray]) -> tuple[np.ndarray, dict[str, Any]]:
    """One new buffer holding the arrays in sorted-name order, and name -> (lo, hi, shape,
    dtype) in it."""
    names = sorted(arrays)
    values = [np.asarray(arrays[n]) for n in names]
    dtype = np.result_type(*values) if values else np.dtype(np.float32)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"allreduce needs float32/float64 arrays, got "
                         f"{', '.join(f'{n}: {v.dtype}' for n, v in zip(names, values))}")
    buf = np.empty(sum(v.size for v in values), dtype)
    spans, lo = {}, 0
    for name, v in zip(names, values):
        buf[lo:lo + v.size] = v.reshape(-1)
        spans[name] = (lo, lo + v.size, v.shape, v.dtype)
        lo += v.size
    return buf, spans


class LocalGroup:
    """R ranks in this process, each on its own thread with an Endpoint over inproc (tests,
    benchmarks). `run(fn)` calls fn(AllReduce) on every rank at once.

        >>> with LocalGroup(3, "tree") as g:
        ...     outs = g.allreduce([{"x": np.full(2, float(r))} for r in range(3)], step=0)
        >>> [float(out["x"][0]) for out in outs]
        [1.0, 1.0, 1.0]
    """

    def __init__(self, size: int, algorithm: str = "ring", timeout: float = 10.0,
                 context: zmq.Context | None = None) -> None:
        uid = f"{os.getpid()}-{next(_GROUPS)}"
        self.size = size
        self.endpoints = [Endpoint(rank_name(r), f"inproc://graphflow-ar-{uid}-{r}",
                                   context=context, timeout=timeout) for r in range(size)]
        peers = {r: ep.address for r, ep in enumerate(self.endpoints)}
        self.ranks = [AllReduce(r, size, ep, peers, algorithm, timeout)
                      for r, ep in enumerate(self.endpoints)]
        self._pools = [ThreadPoolExecutor(1, thread_name_prefix=f"allreduce-{uid}-rank{r}")
                       for r in range(size)]

    def run(self, fn: Callable[[AllReduce], T], ranks: Sequence[int] | None = None) -> list[T]:
        """fn(rank) on each of `ranks` (default all) in its thread; their results in rank order.
        If any raised, the first exception (by rank) is raised once all have finished.
        """
        chosen = range(self.size) if ranks is None else ranks
        futures = [self._pools[r].submit(fn, self.ranks[r]) for r in chosen]
        wait(futures)
        for f in futures:
            if f.exception() is not None:
                raise f.exception()  # type: ignore[misc]
        return [f.result() for f in futures]

    def allreduce(self, inputs: Sequence[Mapping[str, np.ndarray]], step: int,
                  average: bool = True) -> list[dict[str, np.ndarray]]:
        """Every rank's result of allreduce(inputs[rank], step)."""
        if len(inputs) != self.size:
            raise ValueError(f"{len(inputs)} inputs for a group of {self.size}")
        return self.run(lambda ar: ar.allreduce(inputs[ar.rank], step, average))

    def close(self) -> None:
        for pool in self._pools:
            pool.shutdown(wait=True)
        for ar in self.ranks:
            ar.close()

    def __enter__(self) -> LocalGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _timed(ar: AllReduce, x: dict[str, np.ndarray], step: int, barrier: threading.Barrier,
           timeout: float) -> tuple[float, float, int]:
    barrier.wait(timeout)
    start = time.perf_counter()
    ar.allreduce(x, step)
    return start, time.perf_counter(), ar.last_bytes_sent


def bench_allreduce(sizes_bytes: Sequence[int], ranks: int, algorithm: str = "ring",
                    repeats: int = 10, timeout: float = 30.0) -> dict[str, Any]:
    """Time allreduce (mean) of one float32 vector per size among `ranks` threads over inproc.

    A step's time runs from the moment all ranks were released together to the moment the last
    one finished; the median over `repeats` (after one warm-up) is reported.

        >>> r = bench_allreduce([1 << 20], ranks=2, algorithm="ring", repeats=3)
        >>> r["results"][0]["bytes"], r["results"][0]["bytes_sent_per_rank"]
        (1048576, 1048576)
    """
    rows = []
    with LocalGroup(ranks, algorithm, timeout) as group:
        barrier = threading.Barrier(ranks)
        for nbytes in sizes_bytes:
            x = {"g": np.random.default_rng(0).standard_normal(nbytes // 4).astype(np.float32)}
            times = []
            for i in range(repeats + 1):
                step = group.ranks[0].calls
                marks = group.run(lambda ar, s=step, x=x: _timed(ar, x, s, barrier, timeout))
                if i:
                    times.append(max(m[1] for m in marks) - min(m[0] for m in marks))
            median = statistics.median(times)
            rows.append({"bytes": nbytes, "median_s": median, "min_s": min(times),
                         "times_s": times, "gb_per_s": nbytes / median / 1e9,
                         "bytes_sent_per_rank": max(m[2] for m in marks)})
    return {"algorithm": algorithm, "ranks": ranks, "transport": "inproc", "threads": ranks,
            "dtype": "float32", "repeats": repeats, "results": rows}
