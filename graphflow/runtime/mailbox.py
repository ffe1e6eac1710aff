"""A worker's tensors in flight, the transport side of a worker (runtime/worker.py computes).

A receiver thread moves arriving tensors from the endpoint into an inbox; an outgoing tensor
goes out at once from the computing thread when its peer's queue takes it, else a sender
thread pushes it, so a send never stalls compute; a tensor that comes before it is wanted (a
later step or micro-batch) waits in a stash. Every wait is bounded by `timeout`.

A worker whose step fails tells its peers (`abort_peers`): their waits for its tensors end at
once with PeerFailed, which they pass on to their own peers, instead of each timing out.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Collection, Mapping
from typing import Any

import numpy as np

from graphflow.errors import GraphflowError
from graphflow.ir import Node
from graphflow.trace.recorder import RECV, SEND, Recorder, clock
from graphflow.transport.endpoint import Endpoint, PeerTimeout
from graphflow.transport.frames import FrameError

IDLE_WAIT = 5.0  # s the receiver waits for a tensor before it looks again (close wakes it)
ABORT = "!abort"  # the key of a failed peer's notice (no node's key: those are node names)
Arrival = tuple[dict[str, Any], np.ndarray]  # (header: key, src, step, ...; the tensor)


class StepFailed(GraphflowError):
    """A worker could not finish a step (a peer did not deliver in time, a kernel failed)."""


class PeerFailed(StepFailed):
    """A peer failed this step and said so: the step is abandoned here too."""


def _let_it_go() -> None:
    """Yield the core to the thread just woken to move a sent tensor (zmq's I/O thread, or our
    sender thread). Linux's scheduler (EEVDF) lets a computing thread finish its time slice
    (1.5 ms on 2 cores) before a thread it woke runs on its core: a pinned worker's tensor
    waited that long behind its next kernel while the peer waited for it. Yielding, a 4 x 1024
    MLP's spatial step on 2 workers went from 13.3 to 8.9 ms (interleaved, 3 clusters each);
    lc-large and speech-mlp, whose kernels are long beside their transfers, did not change."""
    if _YIELD is not None:
        _YIELD()


_YIELD = getattr(os, "sched_yield", None)  # (not on Windows)


def worker_name(index: int) -> str:
    return f"worker:{index}"


class Mailbox:
    """`name`'s inbox and outbox on `endpoint`, with their two threads (started here)."""

    def __init__(self, name: str, endpoint: Endpoint, timeout: float) -> None:
        self.name, self.endpoint, self.timeout = name, endpoint, timeout
        self.bytes_sent = self.bytes_received = 0
        self.sent_keys: list[str] = []
        self.trace: Recorder | None = None  # set while a run is traced (graphflow/trace)
        self._inbox: queue.Queue[Arrival] = queue.Queue()
        self._outbox: queue.Queue[tuple[str, str, np.ndarray, int, bool] | None] = queue.Queue()
        self._stash: dict[tuple[str, int], np.ndarray] = {}
        self.step = 0  # the step being run (`begin`); a peer's abort notice names one
        self._aborts: dict[int, str] = {}  # step -> why a peer abandoned it
        self._trackers: list[Any] = []
        self._send_error: BaseException | None = None
        self._send_lock = threading.Lock()  # one thread at a time on the endpoint's sockets
        self._stop = threading.Event()
        short = name.replace("worker:", "w")
        self._threads = [threading.Thread(target=self._receive_loop, daemon=True,
                                          name=f"{short}-recv"),
                         threading.Thread(target=self._send_loop, daemon=True,
                                          name=f"{short}-send")]
        for t in self._threads:
            t.start()

    def post(self, peer: str, key: str, array: np.ndarray, step: int, track: bool) -> None:
        """Send `array` to `peer`: now, if nothing is queued before it and the peer's queue
        takes it, else by the sender thread. With `track`, `flush` waits until zmq is done
        with its memory (an array its owner will write again). Then the core goes, for a
        moment, to the thread that moves it (`_let_it_go`).

        Handing a tensor to the sender thread cost 150-250 us before it went (the thread's
        wake-up, then the GIL), on every hop of a pipeline's critical path."""
        if self._send_lock.acquire(blocking=False):  # (the sender thread may be mid-send)
            try:
                if not self._outbox.unfinished_tasks and self._send_error is None:
                    t0 = clock()
                    sent, tracker = self.endpoint.offer(peer, key, array, step, track)
                    if sent:
                        self._sent(peer, key, array, step, tracker, t0)
                        _let_it_go()
                        return
            except GraphflowError as e:  # as the sender thread would: `flush` raises it
                self._send_error = e
                return
            finally:
                self._send_lock.release()
        self._outbox.put((peer, key, array, step, track))
        _let_it_go()

    def take(self, step: int, waiting: Mapping[str, Node], block: bool,
             deadline: float) -> list[Arrival]:
        """The tensors of `step` that `waiting` (key -> its recv node) names and that have
        arrived; with `block`, wait for one until `deadline` (then PeerTimeout, naming the peer
        and the key)."""
        self._check_aborted()
        if isinstance(self._send_error, FrameError):  # (refused here: peers wait in vain;
            raise StepFailed(f"{self.name}: {self._send_error}")  # a silent peer: see flush)
        early = [k for (k, s) in self._stash if s == step and k in waiting]
        got = [({"key": k}, self._stash.pop((k, step))) for k in early]
        while True:
            try:
                meta, array = self._inbox.get(block=block and not got,
                                              timeout=max(deadline - time.monotonic(), 0.001))
            except queue.Empty:
                if block and not got:
                    self._raise_timeout(waiting)
                return got
            self.bytes_received += array.nbytes
            if meta["key"] == ABORT:
                self._note_abort(meta, array)
                self._check_aborted()
            elif meta["step"] == step and meta["key"] in waiting:
                got.append((meta, array))
            else:  # an early tensor of a later step (or micro-batch): keep it
                self._stash[(meta["key"], meta["step"])] = array
            block = False

    def arrived(self, keys: Collection[str], step: int) -> bool:
        """Whether every tensor `keys` names for `step` is here already (no waiting)."""
        while True:  # what came meanwhile goes to the stash, where `take` looks first
            try:
                meta, array = self._inbox.get_nowait()
            except queue.Empty:
                break
            self.bytes_received += array.nbytes
            if meta["key"] == ABORT:
                self._note_abort(meta, array)
            else:
                self._stash[(meta["key"], meta["step"])] = array
        self._check_aborted()
        return all((k, step) in self._stash for k in keys)

    def begin(self, step: int) -> None:
        """Step `step` starts: older abort notices are void; PeerFailed if it is aborted."""
        self.step = step
        self._aborts = {s: why for s, why in self._aborts.items() if s >= step}
        self._check_aborted()

    def abort_peers(self, why: str) -> None:
        """Tell every peer this worker sends to that it abandons the current step. Sent
        without waiting: a dead peer's notice is dropped, not waited for."""
        notice = np.frombuffer(why.encode()[:4096], np.uint8)
        for peer in self.endpoint.peers:
            self._outbox.put((peer, ABORT, notice, self.step, False))

    def flush(self) -> None:
        """Wait until every posted tensor has gone to zmq, and every tracked one has left (its
        memory is free to change)."""
        self._outbox.join()
        if isinstance(self._send_error, PeerTimeout):  # the peer's failure: the driver names
            raise self._send_error  # it (a silent one) before this worker (calls.SECONDARY)
        if self._send_error is not None:
            raise StepFailed(f"{self.name}: {self._send_error}")
        for tracker in self._trackers:
            tracker.wait(self.timeout)
        self._trackers.clear()

    def close(self) -> None:
        self._stop.set()
        self.endpoint.interrupt()
        self._outbox.put(None)
        for t in self._threads:  # a send in flight ends within `timeout`
            t.join(timeout=self.timeout + IDLE_WAIT + 1)
        if not any(t.is_alive() for t in self._threads):  # never close a socket in use
            self.endpoint.close()

    def _note_abort(self, meta: dict[str, Any], notice: np.ndarray) -> None:
        if meta["step"] >= self.step:  # (a notice for a step done here already is void)
            why = bytes(notice).decode(errors="replace")
            self._aborts.setdefault(meta["step"], f"{meta['src']} failed: {why}")

    def _check_aborted(self) -> None:
        if self.step in self._aborts:
            raise PeerFailed(f"{self.name}: step {self.step} abandoned, "
                             f"{self._aborts[self.step]}")

    def _raise_timeout(self, waiting: Mapping[str, Node]) -> None:
        if self._send_error is not None:
            raise StepFailed(f"{self.name}: {self._send_error}")
        key, node = next(iter(waiting.items()))
        peer = worker_name(node.attrs["src"])
        raise PeerTimeout(f"{self.name}: no tensor '{key}' from {peer} within "
                          f"{self.timeout:g}s ({len(waiting)} receive(s) pending)", peer, key)

    # -- the helper threads --------------------------------------------------------------------
    def _receive_loop(self) -> None:
        while not self._stop.is_set():
            try:
                got = self.endpoint.recv_any(IDLE_WAIT)
            except GraphflowError:  # a bad frame: dropped, the step times out naming the key
                continue
            if got is not None:
                t0 = clock()
                self._inbox.put(got)
                if (tr := self.trace) is not None:  # marks the arrival (zmq moved the bytes)
                    meta = got[0]
                    tr.add(RECV, "recv", meta["key"], t0, clock(),
                           {"from": meta["src"], "bytes": got[1].nbytes, "step": meta["step"]})
                got = None  # don't hold the frame: the sender's zero-copy tracker waits on it

    def _send_loop(self) -> None:
        while True:
            item = self._outbox.get()
            try:
                if item is None:
                    return
                peer, key, array, step, track = item
                if self._stop.is_set() or (self._send_error is not None and key != ABORT):
                    continue  # a peer is gone or the worker is closing: drop the rest
                t0 = clock()
                with self._send_lock:
                    if key == ABORT:  # best effort, never waits: a peer that cannot take it is gone
                        self.endpoint.send(peer, key, array, step, track, wait=False)
                        continue
                    tracker = self.endpoint.send(peer, key, array, step, track)
                    self._sent(peer, key, array, step, tracker, t0)
            except GraphflowError as e:
                self._send_error = e
            finally:
                self._outbox.task_done()

    def _sent(self, peer: str, key: str, array: np.ndarray, step: int, tracker: Any,
              t0: float) -> None:
        """Account for a tensor gone to zmq (under the send lock)."""
        if (tr := self.trace) is not None:
            tr.add(SEND, "send", key, t0, clock(), {"to": peer, "bytes": array.nbytes,
                                                    "step": step})
        if tracker is not None:
            self._trackers.append(tracker)
        self.bytes_sent += array.nbytes
        self.sent_keys.append(key)
