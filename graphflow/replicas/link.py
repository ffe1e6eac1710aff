"""A worker's link to the parameter server: it stands in for the optimizer.

With a link, a worker does not update its parameters itself: each step's gradients are summed
here, pushed to the shards that hold the worker's own parameters, and fresh parameters are
fetched back. How and when depends on the consistency mode:

- `downpour` (async): push the summed gradients every `n_push` steps and fetch every
  `n_fetch` steps, each on its own thread, so compute never waits for the network; fetched
  values are installed between steps.
- `bsp`: push every step, then wait until the shards have applied the step's averaged update
  (every live replica pushed) and fetch it. A shard restarted from a checkpoint meanwhile
  (its fetch replies name another process) has lost the push: the step goes to it again.
- `ssp`: push and fetch every step; before a step, wait while this replica is more than
  `staleness` clocks ahead of the slowest live one.

`AllReduceLink` is the synchronous alternative without a PS: replicas average gradients
directly with a ring or tree allreduce.

    link = PSLink(worker.params, client_factory, replica=0, mode="downpour")
    link.before_step(step); worker.run_step(...); link.after_step(step)
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from graphflow.errors import GraphflowError
from graphflow.ps.client import PSClient, PSError
from graphflow.replicas.allreduce import AllReduce
from graphflow.runtime.gradients import Updater
from graphflow.trace.recorder import EXECUTOR, PS_FETCH, PS_PUSH, Recorder, clock

log = logging.getLogger("graphflow.replicas")

MODES = ("downpour", "bsp", "ssp")
RESTART_CHECK = 1.0  # s between a bsp barrier's looks for a restarted shard


class LinkError(GraphflowError):
    """The parameter server could not be reached, or dropped this replica."""


def _codec(spec: str | None) -> Any:
    if spec in (None, "", "none"):
        return None
    from graphflow.replicas.compress import make_codec

    return make_codec(spec)


class PSLink:
    """Sums gradients like an optimizer would apply them (`update`), talks to the PS between
    steps. `client_factory()` makes a PSClient for the worker's own parameters (one per thread).
    """

    def __init__(self, params: dict[str, np.ndarray], client_factory: Callable[[], PSClient],
                 replica: int, mode: str = "downpour", n_fetch: int = 1, n_push: int = 1,
                 staleness: int = 2, compress: str | None = None, timeout: float = 30.0) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown consistency mode '{mode}'; known: {', '.join(MODES)}")
        if n_fetch < 1 or n_push < 1 or staleness < 0:
            raise ValueError(f"n_fetch and n_push must be >= 1 and staleness >= 0, got "
                             f"{n_fetch}, {n_push}, {staleness}")
        self.params, self.replica, self.mode = params, replica, mode
        self.n_fetch, self.n_push, self.staleness = n_fetch, n_push, staleness
        self.timeout = timeout
        self.codec = _codec(compress)
        self.client = client_factory()
        self.sums: dict[str, np.ndarray] = {}
        self.steps_summed = 0
        self.pushes = self.fetches = 0
        self.waited = 0.0  # seconds spent waiting on the PS (ssp gate, bsp barrier)
        self.trace: Recorder | None = None  # set while a run is traced (graphflow/trace)
        self._error: BaseException | None = None
        self._fresh: dict[str, np.ndarray] | None = None
        self._lock = threading.Lock()
        self._pushq: queue.Queue[tuple[int, dict[str, np.ndarray]] | threading.Event | None] = \
            queue.Queue(2)
        self._fetchq: queue.Queue[int | None] = queue.Queue(1)
        self._threads: list[threading.Thread] = []
        self.install(self.client.fetch())
        # bsp: every slice's version goes up by one per step, from here
        self.version0 = min(self.client.versions.values(), default=0)
        self.last_step = -1
        if mode == "downpour":  # each thread its own client (sockets are per thread)
            pusher, fetcher = client_factory(), client_factory()
            self._threads = [
                threading.Thread(target=self._serve, args=(
                    self._pushq, lambda job: self._push(pusher, *job), "push"),
                    daemon=True, name=f"replica{replica}-push"),
                threading.Thread(target=self._serve, args=(
                    self._fetchq, lambda step: self._fetched(fetcher, step), "fetch"),
                    daemon=True, name=f"replica{replica}-fetch")]
            for t in self._threads:
                t.start()

    # -- the optimizer's place in Worker.run_step ------------------------------------------------
    def update(self, name: str, param: np.ndarray, grad: np.ndarray, scale: float = 1.0,
               also: np.ndarray | None = None) -> None:
        """Sum `scale * (grad + also)` for the next push (the PS applies it, not this worker)."""
        fresh = also is not None or scale != 1.0  # grad becomes an array of our own
        if also is not None:
            grad = grad + also
        if scale != 1.0:
            grad = grad * np.asarray(scale, param.dtype)
        total = self.sums.get(name)
        if total is None:
            self.sums[name] = (np.asarray if fresh else np.array)(grad, dtype=param.dtype)
        else:
            np.add(total, grad, out=total)

    # -- between steps ---------------------------------------------------------------------------
    def before_step(self, step: int) -> None:
        """Install fetched parameters (downpour); wait at the SSP gate."""
        self._check()
        with self._lock:
            fresh, self._fresh = self._fresh, None
        t0 = clock()
        if fresh is not None:
            self.install(fresh)
            self._span(EXECUTOR, "ps install", t0, step)
        if self.mode == "ssp":
            t0 = clock()
            self._wait_for(lambda: self.client.clock_ok(self.replica, step, self.staleness),
                           f"the slowest replica to come within {self.staleness} clocks of "
                           f"replica {self.replica} (clock {step})")
            self._span(EXECUTOR, "ssp gate", t0, step)

    def after_step(self, step: int) -> None:
        """Push (and fetch) as the mode says, after the worker's step `step` ran."""
        self._check()
        self.steps_summed += 1
        self.last_step = step
        if self.mode == "downpour":
            if self.steps_summed >= self.n_push and not self._pushq.full():
                # (while the last push is still on its way, gradients go on summing here)
                self._pushq.put_nowait((step, self._take_sums()))
            if (step + 1) % self.n_fetch == 0:
                try:
                    self._fetchq.put_nowait(step)
                except queue.Full:
                    pass  # a fetch is already on its way
            return
        sums = self._take_sums()
        boots = dict(self.client.boots)  # the shard processes of the last fetch
        self._push(self.client, step, sums)
        t0 = clock()
        if self.mode == "bsp":
            self._bsp_barrier(step, sums, boots)
            self._span(EXECUTOR, "bsp barrier", t0, step)
        else:
            self.install(self.client.fetch())
            self._span(EXECUTOR, "ps fetch", t0, step)

    def install(self, values: Mapping[str, np.ndarray]) -> None:
        for name, value in values.items():
            if name in self.params:
                self.params[name][...] = value
        self.fetches += 1

    # -- helpers ------------------------------------------------------------------------------
    def _take_sums(self) -> dict[str, np.ndarray]:
        sums, self.sums, self.steps_summed = self.sums, {}, 0
        return sums

    def _span(self, thread: str, name: str, t0: float, step: int,
              nbytes: int | None = None) -> None:
        if (tr := self.trace) is not None:
            args = {"step": step} if nbytes is None else {"step": step, "bytes": nbytes}
            tr.add(thread, "ps", name, t0, clock(), args)

    def _push(self, client: PSClient, step: int, sums: dict[str, np.ndarray],
              again: bool = False) -> None:
        if not sums:
            return
        t0 = clock()
        self._push_now(client, step, sums, again)
        self._span(PS_PUSH if self.mode == "downpour" else EXECUTOR,
                   "ps push again" if again else "ps push", t0, step,
                   sum(g.nbytes for g in sums.values()))

    def _push_now(self, client: PSClient, step: int, sums: dict[str, np.ndarray],
                  again: bool) -> None:
        if self.mode == "bsp":
            # a repeat goes uncompressed: encoding again would count top-k residuals twice
            codec = None if again else self.codec
            out = client.push(self.replica, step, sums, mode="bsp",
                              version=self.version0 + step + 1, codec=codec)
            if out["dropped"]:  # its pushes would be ignored from now on: stop, say why
                peers = ", ".join(map(client.peer, out["dropped"]))
                raise LinkError(f"replica {self.replica}: step {step} refused, dropped by "
                                f"{peers} (a bsp barrier waited past its deadline for it)")
        else:
            client.push(self.replica, step, sums, mode="async", codec=self.codec)
        self.pushes += 1

    def _bsp_barrier(self, step: int, sums: dict[str, np.ndarray],
                     boots: dict[int, str]) -> None:
        """Fetch the step's update once every shard applied it; push the step again when a
        shard process other than the one of `boots` answers (restarted, it lost the push)."""
        start = time.monotonic()
        while True:
            left = self.timeout - (time.monotonic() - start)
            try:
                fresh = self.client.fetch(min_version=self.version0 + step + 1,
                                          wait=max(0.0, min(RESTART_CHECK, left)))
                break
            except PSError:
                if left <= RESTART_CHECK:
                    raise
            if self.client.boots != boots:
                self._push(self.client, step, sums, again=True)
                boots = dict(self.client.boots)
        self.install(fresh)
        self.waited += time.monotonic() - start

    def _wait_for(self, ready: Callable[[], bool], what: str) -> None:
        start = time.monotonic()
        pause = 0.001
        while not ready():
            if time.monotonic() - start > self.timeout:
                raise LinkError(f"replica {self.replica}: waited {self.timeout:g}s for {what}")
            time.sleep(pause)
            pause = min(2 * pause, 0.02)
        self.waited += time.monotonic() - start

    def _check(self) -> None:
        if self._error is not None:
            raise LinkError(f"replica {self.replica}: parameter server: {self._error}")

    def _serve(self, jobs: queue.Queue[Any], work: Callable[[Any], None], what: str) -> None:
        """Run `work(job)` for each job until None; an Event is set when reached (`flush`:
        the jobs before it are done). The first failure stops the thread and is raised on the
        compute thread at its next step."""
        while (job := jobs.get()) is not None:
            if isinstance(job, threading.Event):
                job.set()
                continue
            try:
                work(job)
            except Exception as e:  # noqa: BLE001 - reported at the next step
                log.error("replica %d: %s failed: %s", self.replica, what, e)
                self._error = e
                return

    def _fetched(self, client: PSClient, step: int) -> None:
        t0 = clock()
        fresh = client.fetch()
        with self._lock:
            self._fresh = fresh
        self._span(PS_FETCH, "ps fetch", t0, step)

    def flush(self) -> None:
        """Downpour: push what is left and wait until every push so far has reached the
        shards (a shard's retries included), so that the PS holds every step run. Raises
        LinkError if a push failed or the pushes take longer than the link's timeout."""
        if self.mode != "downpour":
            return  # (bsp and ssp push within each step)
        self._check()
        reached, deadline = threading.Event(), time.monotonic() + self.timeout
        try:
            self._queue_rest()
            self._pushq.put(reached, timeout=max(0.0, deadline - time.monotonic()))
        except queue.Full:
            pass  # (the push thread is stuck: reported below)
        if not reached.wait(max(0.0, deadline - time.monotonic())):
            self._check()
            raise LinkError(f"replica {self.replica}: pushes to the parameter server not done "
                            f"within {self.timeout:g}s")
        self._check()

    def _queue_rest(self) -> None:
        """Hand the gradients summed since the last push to the push thread (downpour), as
        the last step summed: the shards' clock of this replica then counts the steps run,
        and the next step's push is not taken for a repeat of this one."""
        if self.sums:
            self._pushq.put((self.last_step, self._take_sums()), timeout=self.timeout)

    def close(self) -> None:
        """Push what is left (downpour) and stop the threads."""
        if self.mode == "downpour" and self._error is None:
            self._queue_rest()
        for q in (self._pushq, self._fetchq):
            q.put(None, timeout=self.timeout)
        for t in self._threads:
            t.join(timeout=self.timeout)


class AllReduceLink:
    """Synchronous data parallelism without a parameter server (FireCaffe): after each step
    the replicas' copies of this worker average their gradients with an allreduce (ring or
    tree) and each applies the same update with its own optimizer, so they stay equal."""

    def __init__(self, params: dict[str, np.ndarray], allreduce: AllReduce,
                 optimizer: Updater) -> None:
        self.params, self.allreduce, self.optimizer = params, allreduce, optimizer
        self.sums: dict[str, np.ndarray] = {}
        self.trace: Recorder | None = None  # set while a run is traced (graphflow/trace)

    def update(self, name: str, param: np.ndarray, grad: np.ndarray, scale: float = 1.0,
               also: np.ndarray | None = None) -> None:
        if also is not None:
            grad = grad + also
        self.sums[name] = grad if scale == 1.0 else grad * np.asarray(scale, param.dtype)

    def before_step(self, step: int) -> None:
        pass

    def after_step(self, step: int) -> None:
        t0 = clock()
        mean = self.allreduce.allreduce(self.sums, step, average=True)
        t1 = clock()
        for name, grad in mean.items():
            self.optimizer.update(name, self.params[name], grad)
        self.sums = {}
        if (tr := self.trace) is not None:
            tr.add(EXECUTOR, "allreduce", "allreduce", t0, t1, {"step": step})
            tr.add(EXECUTOR, "update", "update", t1, clock(), {"params": len(mean)})

    def close(self) -> None:
        self.allreduce.close()
