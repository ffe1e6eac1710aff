"""Op FLOPs/bytes -> seconds, calibrated from kernels and a link timed on this machine; predicts
the step time of a placed training graph by list scheduling.

>>> import graphflow as gf
>>> m = gf.models.speech_mlp(batch=64)
>>> _ = gf.gradients(m.loss, m.graph.parameters())
>>> p = CostModel.builtin().predict(m.graph, {n.name: 0 for n in m.graph})
>>> p.step_seconds > 0 and p.transfers == []
True
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from math import prod
from pathlib import Path
from typing import Any

import numpy as np

from graphflow import stepsim
from graphflow.ir import SOURCE_OPS, Graph, Node
from graphflow.link import Link
from graphflow.ops.registry import REGISTRY, concrete, node_cost
from graphflow.stepsim import LOCAL_OPS, Costs, Prediction, Transfer
from graphflow.timing import (
    UPDATE_PASSES,
    cache_path,
    fingerprint,
    machine_fingerprint,
    read_cache,
    time_dispatch,
    time_messages,
    time_nodes,
    time_update,
    time_update_call,
    update_cache,
)

__all__ = ["LOCAL_OPS", "CostModel", "Link", "Prediction", "Transfer", "kernels",
           "signature", "tensor_bytes"]
BUILTIN = {"flop_rates": {"*": 60e9}, "bandwidth_Bps": 5e9, "overhead_s": 2e-6,
           "update_Bps": 20e9, "update_shared_Bps": 12e9, "dispatch_s": 3e-6,
           "update_call_s": 3e-6, "message_cpu_s": 30e-6}
MEASURED_RATES = ("update_Bps", "update_shared_Bps", "dispatch_s", "update_call_s")


RATE_MIN = 10  # a kernel shows its rate once it runs this many times the per-kernel overhead


def tensor_bytes(node: Node, batch: int) -> int:
    """Bytes of the node's output at this batch size."""
    return prod(concrete(node.shape, batch)) * np.dtype(node.dtype).itemsize


def signature(node: Node, batch: int) -> str:
    """What a kernel's time depends on: op, concrete input shapes and dtypes, attrs."""
    ins = ";".join(f"{x.dtype}{list(concrete(x.shape, batch))}" for x in node.inputs)
    attrs = ",".join(f"{k}={v!r}" for k, v in sorted(node.attrs.items()) if k != "value")
    return f"{node.op}({ins}){{{attrs}}}"


def op_family(op: str) -> str:
    """The op's kernel family (its ops/ module: matmul, local, conv, elementwise, ...)."""
    forward = REGISTRY[op].forward if op in REGISTRY else None
    return forward.__module__.rsplit(".", 1)[-1] if forward is not None else op


def kernels(graph: Graph, batch: int) -> dict[str, Node]:
    """One node of each kernel signature of `graph` at `batch`, in graph order."""
    out: dict[str, Node] = {}
    for n in graph.toposort():
        if n.op not in SOURCE_OPS and REGISTRY[n.op].forward:
            out.setdefault(signature(n, batch), n)
    return out


def _fused_updates(graph: Graph) -> set[Node]:
    from graphflow.runtime.gradients import fused_updates  # (the runtime imports us)
    return fused_updates(graph)


class CostModel:
    """Seconds per node and per transfer, and a step-time simulator.

    A node's seconds come from `times` (by node name: for tests and what-ifs), else a measured
    kernel signature, else overhead + max(flops / family FLOP rate, bytes / bandwidth); the
    latter two plus `dispatch_s`, a worker's bookkeeping around each kernel. A message costs
    `message_cpu_s` of CPU at each end beside the link's time (both ends' transport threads,
    measured between two worker processes in running steps: 20-47 us here, where a step's
    kernels take 5 us to 10 ms).
    `measured` maps signature -> [seconds, family, flops, bytes]; `batch` fills None dims.

    >>> cm = CostModel(times={"a": 1.0}, link=Link(1e9, 0.0))
    >>> cm.transfer_seconds(2e9)
    2.0
    """

    def __init__(self, measured: Mapping[str, Any] | None = None,
                 flop_rates: Mapping[str, float] | None = None,
                 bandwidth_Bps: float = BUILTIN["bandwidth_Bps"],
                 overhead_s: float = BUILTIN["overhead_s"], link: Link | None = None,
                 times: Mapping[str, float] | None = None, batch: int = 64,
                 update_Bps: float = BUILTIN["update_Bps"],
                 update_shared_Bps: float = BUILTIN["update_shared_Bps"],
                 dispatch_s: float = BUILTIN["dispatch_s"],
                 update_call_s: float = BUILTIN["update_call_s"],
                 message_cpu_s: float = BUILTIN["message_cpu_s"]) -> None:
        self.measured: dict[str, list[Any]] = {k: list(v) for k, v in (measured or {}).items()}
        self.flop_rates = dict(flop_rates or BUILTIN["flop_rates"])
        self.bandwidth_Bps, self.overhead_s = bandwidth_Bps, overhead_s
        self.update_Bps = update_Bps  # memory passes per second of the optimizer's update
        self.update_shared_Bps = update_shared_Bps  # ... each, two workers updating at once
        self.dispatch_s = dispatch_s  # a worker's time on a node beside its kernel
        self.update_call_s = update_call_s  # an update's time beside its memory passes
        self.message_cpu_s = message_cpu_s  # each end's CPU time on a message it sends or gets
        self.link = link or Link.builtin()
        self.times, self.batch = dict(times or {}), batch
        self._memo: dict[str, float] = {}
        # workload -> how much slower a step ran beside another on this machine (`graphflow
        # bench speedup`'s ceiling); `contention` is their median, what local plans predict by
        self.contentions: dict[str, float] = {}

    @property
    def contention(self) -> float:
        return statistics.median(self.contentions.values()) if self.contentions else 1.0

    @classmethod
    def builtin(cls, batch: int = 64) -> CostModel:
        """Conservative built-in rates (60 GFLOP/s, 5 GB/s, link 1.2 GB/s + 300 us, 3 us a node
        and an update beside their work, 30 us of CPU at each end of a message); no cache."""
        return cls(batch=batch)

    @classmethod
    def default(cls, batch: int = 64) -> CostModel:
        """This machine's cached calibration if there is one, else `builtin()`; its link and a
        message's CPU from another thread setup's or kernel code's, if only that has them.
        Never measures."""
        cache = read_cache(cache_path())
        model = cls._from_entry(cache.get(fingerprint()), batch)
        if not model.link_measured():  # (timing it takes 15 s, and it is the transport's)
            machine = machine_fingerprint()
            for other in cache.values():
                if other.get("machine") == machine and other.get("link"):
                    borrowed = cls(message_cpu_s=other["message_cpu_s"], link=Link(*other["link"]))
                    if borrowed.link_measured():
                        model.link, model.message_cpu_s = borrowed.link, borrowed.message_cpu_s
                        break
        return model

    @classmethod
    def _from_entry(cls, entry: Mapping[str, Any] | None, batch: int) -> CostModel:
        if not entry:
            return cls.builtin(batch)
        entry = {k: v for k, v in entry.items() if k != "machine"}
        link = Link(*entry.pop("link")) if entry.get("link") else None
        contentions = entry.pop("contentions", {})
        fitted = ("flop_rates", "bandwidth_Bps", "overhead_s")  # refit by today's rule
        model = cls(**{**BUILTIN, **{k: v for k, v in entry.items() if k not in fitted}},
                    link=link, batch=batch)
        model.contentions = dict(contentions)
        model._fit()
        return model

    @classmethod
    def calibrate(cls, graph: Graph, batch: int, repeats: int = 3, link: bool = True,
                  refresh: bool = False) -> CostModel:
        """Time each kernel signature of `graph` not yet cached (median of `repeats` passes after
        a warm-up), refit the fallback rates, measure the link and a message's CPU if not
        cached, save the cache.

        >>> import graphflow as gf
        >>> cm = CostModel.calibrate(gf.models.digits_lc().graph, batch=8)  # doctest: +SKIP
        """
        model = cls.builtin(batch) if refresh else cls.default(batch)
        model.time_missing(graph, batch, repeats)
        if refresh or model.update_Bps == BUILTIN["update_Bps"]:
            model.update_Bps = time_update(repeats)
        if refresh or model.update_shared_Bps == BUILTIN["update_shared_Bps"]:
            model.update_shared_Bps = time_update(repeats, streams=2)
        if refresh or model.dispatch_s == BUILTIN["dispatch_s"]:
            model.dispatch_s = time_dispatch(repeats)
        if refresh or model.update_call_s == BUILTIN["update_call_s"]:
            model.update_call_s = time_update_call(repeats)
        if link and (refresh or not model.link_measured()):
            model.calibrate_link(repeats)
        model.save()
        return model

    @classmethod
    def timed_for(cls, graphs: Sequence[Graph], batch: int, workers: int, measure: bool = True,
                  repeats: int = 3, say: Callable[[str], object] | None = None) -> CostModel:
        """This machine's model with every kernel of `graphs` timed at `batch` (those the
        cache lacks, once; none without `measure`), from the cache of the BLAS threads one of
        `workers` local workers gets, as they run them: what `graphflow show` and `visualize`
        predict plans by. `say` hears how many kernels are timed, if any."""
        from graphflow.runtime.cores import blas_threads, core_share

        with blas_threads(core_share(workers)):
            model = cls.default(batch)
            if not measure:
                return model
            todo = {sig for g in graphs for sig in kernels(g, batch)} - set(model.measured)
            if todo and say:
                say(f"timing {len(todo)} kernels on this machine (once: they are cached)")
            if not model.link_measured() and say:
                say("timing messages between two worker processes (once: it is cached)")
            for graph in graphs:
                model = cls.calibrate(graph, batch, repeats)
        return model

    def time_missing(self, graph: Graph, batch: int, repeats: int = 3) -> int:
        """Time here the kernels of `graph` this model has no time for; refit; how many."""
        todo = {sig: n for sig, n in kernels(graph, batch).items() if sig not in self.measured}
        for sig, seconds in time_nodes(todo, batch, repeats).items():
            flops, read, written = node_cost(todo[sig], batch)
            self.measured[sig] = [seconds, op_family(todo[sig].op), flops, read + written]
        self._fit()
        return len(todo)

    def use_times(self, samples: Mapping[str, Sequence[float]]) -> None:
        """Take the median of each measured signature's samples as its time; refit. (A
        benchmark times the kernels again between its measured steps, in its workers'
        processes, `WorkerService.time_kernels`, so kernel and step times see the same state
        of a shared machine.)"""
        for sig, times in samples.items():
            if sig in self.measured and times:
                self.measured[sig][0] = statistics.median(times)
        self._fit()

    def link_measured(self) -> bool:
        """Whether the link and a message's CPU are this machine's, not the built-in guesses
        (nor a link measured before its bytes were the sender's copy: not `shared`)."""
        return self.link.shared and self.message_cpu_s != BUILTIN["message_cpu_s"]

    def calibrate_link(self, repeats: int = 5) -> Link:
        """Measure the local transport between two worker processes in running steps
        (`timing.time_messages`): a message's CPU at each end, a small tensor's hop (the
        link's latency) and the rate a large one's hop adds its bytes at (the sender's copy
        into shared memory: a shared Link); store them, return the link."""
        self.message_cpu_s, hop, copy_Bps = time_messages(repeats)
        self.link = Link(copy_Bps, hop, shared=True)
        return self.link

    def save(self, path: Path | None = None) -> Path:
        """Write this calibration under this machine's fingerprint (atomic, under the cache's
        lock); a kernel timed before keeps the faster time (a busy machine only slows kernels),
        others stay, and a built-in guess leaves what was measured in place."""
        path = path or cache_path()
        key = fingerprint()  # (hashes the kernels' code)
        update_cache(path, lambda old: old.update({key: self._merged_entry(old.get(key, {}))}))
        return path

    def _merged_entry(self, before: Mapping[str, Any]) -> dict[str, Any]:
        merged = CostModel(measured=before.get("measured"))
        merged.measured.update({sig: list(v) for sig, v in self.measured.items()
                                if v[0] < merged.measured.get(sig, [float("inf")])[0]})
        merged._fit()
        entry = {**before, "measured": merged.measured, "flop_rates": merged.flop_rates,
                 "bandwidth_Bps": merged.bandwidth_Bps, "overhead_s": merged.overhead_s,
                 "contentions": {**before.get("contentions", {}), **self.contentions},
                 "machine": machine_fingerprint()}
        entry.update({k: getattr(self, k) for k in MEASURED_RATES
                      if getattr(self, k) != BUILTIN[k] or k not in before})
        if self.link_measured() or "link" not in before:
            entry.update(message_cpu_s=self.message_cpu_s, link=[
                self.link.bandwidth_Bps, self.link.latency_s, self.link.shared])
        return entry

    def _fit(self) -> None:
        """Refit overhead (the shortest kernel), memory bandwidth (median of memory-bound
        kernels) and per-family FLOP rates (best seen: bigger kernels of a family run no
        slower) from the samples; rates only from kernels long enough to show one (a cache of
        a tiny model's kernels, all call, had fitted 1.2 GFLOP/s to gemms and 76 MB/s)."""
        samples = list(self.measured.values())
        if not samples:
            return
        self.overhead_s = min(min(s[0] for s in samples), 20e-6)

        def rates(chosen: list[list[Any]], work: int) -> list[float]:
            return [s[work] / max(s[0] - self.overhead_s, 1e-9) for s in chosen]

        samples = [s for s in samples if s[0] >= RATE_MIN * self.overhead_s]
        low = [s for s in samples if s[3] > 0 and s[2] <= s[3]]
        if low:
            self.bandwidth_Bps = statistics.median(rates(low, 3))
        for fam in {"*", *(s[1] for s in samples)}:
            mine = [s for s in samples if (s[1] == fam and s[2] > 0)
                    or (fam == "*" and s[2] > 4 * s[3])]
            if mine:
                self.flop_rates[fam] = max(rates(mine, 2))
        self._memo.clear()

    def node_seconds(self, node: Node, batch: int | None = None) -> float:
        """Compute seconds of one node (source ops cost nothing); None dims take `batch`."""
        if node.name in self.times:
            return self.times[node.name]
        if node.op in SOURCE_OPS:
            return 0.0
        b = batch or self.batch
        sig = signature(node, b)
        if sig in self.measured:
            return float(self.measured[sig][0]) + self.dispatch_s
        if sig not in self._memo:
            flops, read, written = node_cost(node, b)
            rate = self.flop_rates.get(op_family(node.op), self.flop_rates["*"])
            self._memo[sig] = self.overhead_s + max(flops / rate,
                                                    (read + written) / self.bandwidth_Bps)
        return self._memo[sig] + self.dispatch_s

    def update_seconds(self, param: Node, parts: int = 1, fused: bool = False) -> float:
        """Seconds of the optimizer's update of `param`: the call, then reading it and its
        gradient (in `parts` arrays) and writing it at the optimizer kernel's measured rate;
        `fused` (runtime/gradients.py's `fused_updates`), in its gradient's kernel: the
        gradient is not read back (nor written, but its kernel was timed writing it)."""
        passes = UPDATE_PASSES + parts - 1 - int(fused)
        return self.update_call_s + passes * tensor_bytes(param, 1) / self.update_Bps

    def concurrent_updates(self, starts: Sequence[float], alone: Sequence[float]) -> list[float]:
        """Each worker's update seconds when the workers share one machine's memory: an update
        that starts at `starts[w]` and takes `alone[w]` by itself goes at the shared rate for
        the time another worker's update overlaps it (both stream memory).

        >>> cm = CostModel(update_Bps=30e9, update_shared_Bps=20e9)
        >>> cm.concurrent_updates([0.0, 0.0, 5.0], [2.0, 1.0, 1.0])
        [2.5, 1.5, 1.0]
        """
        stretch = max(self.update_Bps / self.update_shared_Bps - 1.0, 0.0)  # (noise: never faster)
        out = []
        for w, (s, a) in enumerate(zip(starts, alone, strict=True)):
            overlap = max((min(s + a, t + b) - max(s, t) for v, (t, b)
                           in enumerate(zip(starts, alone, strict=True)) if v != w and b > 0),
                          default=0.0)
            out.append(a + max(overlap, 0.0) * stretch if a > 0 else 0.0)
        return out

    def transfer_seconds(self, nbytes: float, link: Link | None = None) -> float:
        """Seconds to move `nbytes` over `link` (default: this model's calibrated link)."""
        return (link or self.link).seconds(nbytes)

    def predict(self, graph: Graph, placement: Mapping[str, int], batch: int | None = None,
                link: Link | None = None, contention: float = 1.0) -> Prediction:
        """Simulate one training step of `graph` (unsplit: no send/recv nodes) under `placement`.

        Each worker runs its nodes one at a time as the runtime does (graphflow/stepsim.py):
        of those whose inputs have arrived, what leads to a send first. A tensor is sent once
        per destination worker as soon as it is produced (parameters at time 0); the bytes
        into and out of a worker go one message at a time on its link. Placeholders and
        constants are local everywhere. Last, each worker applies the update to its parameters
        (three passes over them at the optimizer's measured rate: a streaming kernel, far
        faster per byte than the fitted `bandwidth_Bps` of the graph's small memory-bound
        kernels). With `contention` > 1 (workers on one machine share its memory and caches:
        how much slower a step runs beside another, as measured), a node takes that much longer
        for the part of its time another worker computes too (found by a first pass without it).
        """
        batch, link = batch or self.batch, link or self.link
        missing = [n.name for n in graph.nodes if n.name not in placement]
        if missing:
            raise KeyError(f"placement has no worker for {len(missing)} nodes, e.g. {missing[:3]}")
        layout = stepsim.Layout.of(graph, {n: placement[n.name] for n in graph.nodes})
        shared, fused = contention > 1.0, _fused_updates(graph)  # shared: workers of one machine
        first, spans = stepsim.simulate(layout, self._costs(batch, link, {}, shared, fused))
        if not shared or len(first.busy) < 2:
            return first
        slow = {n: 1.0 + (contention - 1.0) * stepsim.shared_fraction(spans, n) for n in spans}
        return stepsim.simulate(layout, self._costs(batch, link, slow, shared, fused))[0]

    def stream_seconds(self, graph: Graph, placement: Mapping[str, int],
                       batch: int | None = None, steps: int = 4) -> float:
        """Seconds per step in a stream of steps (`Cluster.stream`), each worker starting the
        next step once it has updated its parameters: the last of `steps` simulated steps. A
        busier worker starts each step later, so what it waits for costs the stream a wait
        that one step from a common start (`predict`) may not show."""
        batch = batch or self.batch
        layout = stepsim.Layout.of(graph, {n: placement[n.name] for n in graph.nodes})
        start, ends = [0.0] * layout.workers, [0.0]
        costs = self._costs(batch, self.link, {}, False, _fused_updates(graph))
        for _ in range(steps):
            start = stepsim.simulate(layout, costs, starts=start)[0].finish
            ends.append(max(start))
        return ends[-1] - ends[-2]

    def _costs(self, batch: int, link: Link, slow: Mapping[Node, float],
               shared: bool, fused: set[Node]) -> Costs:
        """This model's answers to the step simulator (graphflow/stepsim.py); a node's seconds
        worked out once (a stream of simulated steps asks again each step)."""
        seconds: dict[Node, float] = {}

        def node_seconds(n: Node) -> float:
            if n not in seconds:
                seconds[n] = self.node_seconds(n, batch) * slow.get(n, 1.0)
            return seconds[n]

        return Costs(
            node_seconds=node_seconds,
            nbytes=lambda n: tensor_bytes(n, batch), link=link,
            updates=self.concurrent_updates if shared else lambda _, alone: alone,
            update_seconds=lambda p: self.update_seconds(p, fused=p in fused),
            message_cpu=self.message_cpu_s)
