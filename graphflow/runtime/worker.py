"""A worker runs its subgraph of a plan as a dataflow: a node runs as soon as its inputs are
there, a pending Recv blocks nothing else, Sends go out on their own thread.

One compute thread (the caller of `run_step`) runs the kernels; the worker's mailbox
(runtime/mailbox.py) receives and sends tensors on threads of its own. Parameters live here
and are updated here, by the optimizer, from gradients computed here.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

import numpy as np

from graphflow.autodiff import is_seed
from graphflow.errors import located
from graphflow.executor import accumulate_kernel, checked_value, run_kernel
from graphflow.init import initial_value
from graphflow.ir import Graph, Node, steps_to_send, users_of
from graphflow.ops import aligned, packed_gemm, small_gemm
from graphflow.ops.registry import REGISTRY
from graphflow.runtime import batchjoin, pipeline
from graphflow.runtime.backlog import Backlog, early_updates, weight_groups
from graphflow.runtime.gradients import GradientSums, Updater, fused_gradients
from graphflow.runtime.mailbox import Mailbox, StepFailed, worker_name
from graphflow.trace.recorder import EXECUTOR, Recorder, clock
from graphflow.transport.endpoint import Endpoint

UNTRACED = frozenset({"parameter", "constant"})  # no work to show
UPDATED = np.zeros(0, np.float32)  # a gradient's value where its gemm ran the update instead


@dataclass
class _Run:
    """One micro-batch's values and, per value, how many of its users have yet to run;
    `into`: nodes whose value is added in place to an array (a gradient's running sum)."""

    values: dict[Node, np.ndarray]
    pending_users: dict[Node, int]
    into: dict[Node, np.ndarray] = field(default_factory=dict)
    seed_scale: float = 1.0  # the micro-batch's weight (`batchjoin.seed_scale`)
    # (a fused gradient node, its inputs) -> whether its kernel ran the update (`_fused_update`)
    update: Callable[[Node, list[np.ndarray]], bool] | None = None


class Worker:
    """Executes one worker's subgraph; owns its parameters and their optimizer state."""

    def __init__(self, index: int, graph: Graph, endpoint: Endpoint, grads: Mapping[str, str],
                 optimizer: Updater | None = None, timeout: float = 30.0,
                 stages: int = 1, loss_join: str = "mean") -> None:
        self.index, self.graph = index, graph
        self.loss_join = loss_join  # how the loss reads the batch: runtime/batchjoin.py
        self.timeout = timeout
        self.optimizer = optimizer
        self.params = {p.name: initial_value(p.name, p.attrs, graph.seed)
                       for p in graph.parameters()}
        # parameter -> its gradient node, for the parameters this worker holds
        self.grads = {p: g for p, g in grads.items() if p in self.params}
        self.order = graph.toposort()
        self.users = users_of(self.order)
        self.user_counts = {n: len(us) for n, us in self.users.items()}  # a run's pending users
        # what leads to a send, by its distance in nodes to the nearest send it feeds
        self.urgent = steps_to_send(self.order, self.users, lambda n: n.op == "send")
        self.position = {n: i for i, n in enumerate(self.order)}
        self.recvs = {n.attrs["key"]: n for n in self.order if n.op == "recv"}
        self.grad_nodes = set(self.grads.values())
        self.fused = fused_gradients(graph, self.grads, self.users)
        self.stages = stages
        backward = {n for n in self.order if pipeline.is_backward(n)}
        weights = pipeline.deferred_weight_nodes(self.order, self.users,
                                                 {graph[g] for g in self.grads.values()})
        late = set(pipeline.late_nodes(self.order, self.users))
        self.phases = {"FB": self.order,
                       "B": [n for n in self.order if n in backward and n not in weights],
                       "F": [n for n in self.order if n not in backward and n not in late],
                       "L": [n for n in self.order if n in late]}
        self.l_inputs = list(dict.fromkeys(x for n in self.phases["L"] for x in n.inputs
                                           if x not in late))
        self.l_names = {n.name for n in late}
        self.early_weights = pipeline.runs_weights_early(self.order)
        self.b_recvs = [n.attrs["key"] for n in self.phases["B"] if n.op == "recv"]
        # values of the F and B phases the deferred W phase reads, joined over micro-batches
        deferred = set(weights)
        self.w_inputs = list(dict.fromkeys(x for n in weights for x in n.inputs
                                           if x not in deferred))
        self.w_groups = weight_groups(weights)
        self.w_updates = early_updates(self.w_groups, self.grads, self.order)
        # the weights of its forward gemms, packed while the worker waits (ops/packed_gemm.py)
        self.packed = packed_gemm.PackedWeights(
            {name: self.params[name] for name in packed_gemm.forward_weights(self.order)})
        self.mail = Mailbox(worker_name(index), endpoint, timeout)
        self._prunes: dict[frozenset[str], tuple[dict[str, list[Node]], dict[Node, int]]] = {}

    @property
    def trace(self) -> Recorder | None:
        """The recorder of a traced run (graphflow/trace), else None; the mailbox shares it."""
        return self.mail.trace

    @trace.setter
    def trace(self, recorder: Recorder | None) -> None:
        self.mail.trace = recorder

    # -- the step -----------------------------------------------------------------------------
    def run_step(self, feeds: Mapping[str, np.ndarray], fetches: list[str], step: int,
                 train: bool = True, check_numerics: bool = False, microbatches: int = 1,
                 schedule: str = "1f1b", rows: int | None = None,
                 only: Collection[str] | None = None,
                 joins: Mapping[str, str] | None = None) -> dict[str, np.ndarray]:
        """Run the subgraph once per micro-batch, in the order of the pipeline schedule; with
        `train`, update the parameters from the gradients averaged over the micro-batches.
        With `only` (a run that does not train: runtime/prune.py), just the nodes so named,
        a micro-batch after another.

        Each fetch is joined over the micro-batches as `joins` says (runtime/batchjoin.py;
        `rows` is the whole batch's). A failed step is abandoned by its peers too
        (PeerFailed), at once.
        """
        try:
            self.mail.begin(step)
            with packed_gemm.using(self.packed):
                return self._run_step(feeds, fetches, step, train, check_numerics, microbatches,
                                      schedule, rows, only, joins or {})
        except Exception as e:
            self.mail.abort_peers(f"{type(e).__name__}: {e}")  # their waits for us end now
            raise

    def _run_step(self, feeds: Mapping[str, np.ndarray], fetches: list[str], step: int,
                  train: bool, check_numerics: bool, microbatches: int,
                  schedule: str, rows: int | None, only: Collection[str] | None,
                  joins: Mapping[str, str]) -> dict[str, np.ndarray]:
        sizes = pipeline.microbatch_rows(rows, microbatches) if rows else [1] * microbatches
        phases, counts = self.phases, self.user_counts
        if only is not None:
            if train:
                raise ValueError(f"{worker_name(self.index)}: a training step runs the whole "
                                 "subgraph, not only some nodes")
            phases, counts = self._pruned(only)
            tasks: list[tuple[str, int]] = [("FB", mb) for mb in range(microbatches)]
        elif microbatches == 1:
            tasks = [("FB", 0)]
        else:
            tasks = pipeline.schedule(schedule, self.index, self.stages, microbatches)
        parts = {k: pipeline.split_batch(k, v, microbatches) for k, v in feeds.items()}
        few_rows = max(sizes) <= small_gemm.row_limit()  # (more go to BLAS: it packs its own)
        self.packed.begin_step(self.params, microbatches if few_rows else 0)
        keep = set(fetches) | set(self.grads.values())
        runs: dict[int, _Run] = {}
        got: dict[str, list[np.ndarray]] = {name: [] for name in keep}
        sums = GradientSums(microbatches)
        updater = self.optimizer if train else None
        backlog = Backlog(self.w_groups, self.w_inputs)  # micro-batches whose W waits
        last_forward = max((i for i, (phase, _) in enumerate(tasks) if phase == "F"), default=-1)
        w_tag = step * microbatches  # (W nodes receive nothing: any tag of the step)
        late: list[tuple[int, _Run]] = []  # micro-batches whose L phase waits for the W task
        for i, (phase, mb) in enumerate(tasks):
            tag = step * microbatches + mb
            # The W phase runs at the end. A stage whose backward feeds no other stage (the
            # first) also runs it in its cooldown, a gradient at a time over the micro-batches
            # done so far, while the next backward's gradient is still on its way: its wait is
            # filled, no one else's grows (zero-bubble pipelines put W in the bubbles alike).
            if phase == "W":
                for k, r in late:  # the values only fetched (a loss), off the pipeline's path
                    self._dataflow(self.phases["L"], r, {}, keep, step * microbatches + k,
                                   check_numerics)
                    self._collect(r, keep & self.l_names, got, sums, copy=False)
                for group in backlog.waiting():
                    self._weight_group(backlog, group, keep, got, sums, w_tag, check_numerics,
                                       last=True, update=None if check_numerics else
                                       self._fused_update(sums, updater, fetches, group=group))
                    if updater is not None:  # its gradients are final: update now, while
                        # other stages compute, not when all stream memory at the end
                        self._update_early(group, sums, updater, fetches)
                continue
            if phase == "B" and i > last_forward and self.early_weights:
                for group in backlog.waiting():
                    if self.mail.arrived(self.b_recvs, tag):
                        break
                    self._weight_group(backlog, group, keep, got, sums, w_tag, check_numerics)
            run = runs.setdefault(mb, _Run({}, dict(counts), seed_scale=batchjoin.seed_scale(
                self.loss_join, sizes, mb)))
            if microbatches == 1 and not check_numerics:  # its gradients are final here
                run.update = self._fused_update(sums, updater, fetches, run.pending_users)
            self._dataflow(phases[phase], run, {k: v[mb] for k, v in parts.items()}, keep,
                           tag, check_numerics)
            if phase != "F":  # the micro-batch is complete
                self._collect(run, keep, got, sums, copy=microbatches > 1)
                if phase == "B":
                    backlog.add([run.values[x] for x in self.w_inputs])
                    if self.phases["L"]:
                        late.append((mb, _Run({x: run.values[x] for x in self.l_inputs},
                                              dict(self.user_counts))))
                del runs[mb]
        del backlog, run  # received tensors: over inproc, a peer's send waits until they go
        t0 = clock()
        self.mail.flush()
        tr = self.trace
        if tr is not None:
            tr.add(EXECUTOR, "send", "send flush", t0, clock())
        t0 = clock()
        out = {name: batchjoin.join(self.graph[name], joins.get(name, ""), vs, sizes)
               for name, vs in got.items() if vs}
        # a gradient only the update reads is averaged as the update reads it
        out.update({name: sums.mean(name) for name in sums.names()
                    if name in fetches or updater is None})
        left: list[str] = []  # parameters not updated early
        if updater is not None:
            left = [p for p in self.grads if p not in sums.applied]
            for p in left:
                sums.apply(updater, p, self.params[p], self.grads[p])
        if tr is not None:  # (joining and averaging the micro-batches' results count here)
            tr.add(EXECUTOR, "update", "update", t0, clock(), {"params": len(left)})
        return {name: out[name] for name in fetches}

    def _pruned(self, only: Collection[str]) -> tuple[dict[str, list[Node]], dict[Node, int]]:
        """The one phase of a run of the nodes named `only`, and each one's users among them
        (a value is freed once they have run); the last few are kept, a run looks alike."""
        key = frozenset(only)
        if key not in self._prunes:
            nodes = [n for n in self.order if n.name in key]
            members = set(nodes)
            counts = {n: sum(u in members for u in self.users[n]) for n in nodes}
            if len(self._prunes) >= 8:
                self._prunes.clear()
            self._prunes[key] = ({"FB": nodes}, counts)
        return self._prunes[key]

    def _weight_group(self, backlog: Backlog, group: int, keep: set[str],
                      got: dict[str, list[np.ndarray]], sums: GradientSums, tag: int,
                      check_numerics: bool, last: bool = False,
                      update: Callable[[Node, list[np.ndarray]], bool] | None = None) -> None:
        """Run one group of the W phase over the micro-batches it has not taken (their inputs
        joined along the batch axis: one gemm per weight, however many micro-batches) and add
        its gradients to `sums` (`last`: the step's last run, see GradientSums; `update`: the
        run's, see `_fused_update`)."""
        nodes = self.w_groups[group]
        # a gradient already summed from earlier micro-batches: its gemm adds straight into
        # the sum (beta = 1) instead of writing a new array that is then added. Not where
        # another node reads it: that node wants this run's part, not the running sum. Nor in
        # the last run, whose part the update adds.
        running = {n: sums.running(n.name) for n in nodes if not last and not self.users[n]
                   and REGISTRY[n.op].accumulate}
        into = {n: total for n, total in running.items() if total is not None}
        run = _Run(backlog.take(group), dict(self.user_counts), into, update=update)
        self._dataflow(nodes, run, {}, keep, tag, check_numerics)
        self._collect(run, keep, got, sums, copy=False, last=last)

    def _fused_update(self, sums: GradientSums, updater: Updater | None, fetches: list[str],
                 pending_users: dict[Node, int] | None = None, group: int = -1,
                 ) -> Callable[[Node, list[np.ndarray]], bool] | None:
        """A run's `update`: a parameter whose gradient is the product x.T @ dy, or a locally
        connected layer's weight gradient (`fused_gradients`), is updated in that kernel's own
        pass (Optimizer.update_product, update_local: the gradient is never written out and
        read back), once nothing of the step reads the parameter any more: in a run of the
        whole step, when its users there have all run (`pending_users`); in the W phase's last
        run of `group`, when the group makes its gradient final (`early_updates`). Not for a
        fetched gradient, nor without an updater."""
        if updater is None:
            return None

        def update(node: Node, inputs: list[np.ndarray]) -> bool:
            param = self.fused[node]
            final = (param in self.w_updates[group] if pending_users is None
                     else pending_users[self.graph[param]] == 0)
            return (final and self.grads[param] not in fetches
                    and sums.apply_product(updater, param, self.params[param],
                                           self.grads[param], node, inputs))
        return update

    def _update_early(self, group: int, sums: GradientSums, updater: Updater,
                      fetches: list[str]) -> None:
        """Update the parameters whose gradients W group `group`'s last run made final (a
        fetched gradient waits: the fetch gets it averaged)."""
        t0 = clock()
        params = [p for p in self.w_updates[group] if self.grads[p] not in fetches]
        for p in params:
            sums.apply(updater, p, self.params[p], self.grads[p])
        if (tr := self.trace) is not None and params:
            tr.add(EXECUTOR, "update", "update", t0, clock(), {"params": len(params)})

    def _collect(self, run: _Run, keep: set[str], got: dict[str, list[np.ndarray]],
                 sums: GradientSums, copy: bool, last: bool = False) -> None:
        """Take a finished run's kept values: gradients added to `sums`, others listed."""
        for name in keep:
            node = self.graph[name]
            if node not in run.values:
                continue  # computed in another phase
            value = run.values[node]
            if value is UPDATED:
                continue
            if name in self.grad_nodes:
                sums.add(name, value, copy, last)
            else:
                got[name].append(value)

    def _dataflow(self, nodes: list[Node], run: _Run, feeds: Mapping[str, np.ndarray],
                  keep: set[str], tag: int, check_numerics: bool) -> None:
        """Run `nodes` (one phase of one micro-batch) as a dataflow; values of earlier phases
        are in `run.values`; a value is freed once all its users, in any phase, have run."""
        members = set(nodes)
        values = run.values
        remaining = {n: sum(x not in values for x in n.inputs) for n in nodes}
        # a peer may be waiting on a send: sends first, then what leads to one, the nearest
        # send's first (a halo before the rest of a block), then the rest in graph order
        urgent: list[tuple[int, int, Node]] = []
        ready: deque[Node] = deque()

        def enqueue(n: Node) -> None:
            if n in self.urgent:
                heapq.heappush(urgent, (self.urgent[n], self.position[n], n))
            else:
                ready.append(n)

        for n in nodes:
            if remaining[n] == 0 and n.op != "recv":
                enqueue(n)
        waiting = {k: n for k, n in self.recvs.items() if n in members}
        done = 0

        def finish(n: Node, value: np.ndarray) -> None:
            nonlocal done
            values[n] = value
            done += 1
            for u in self.users[n]:
                if u in members:
                    remaining[u] -= 1
                    if remaining[u] == 0:
                        enqueue(u)
            for x in n.inputs:  # free inputs nobody else needs
                run.pending_users[x] -= 1
                if run.pending_users[x] == 0 and x.name not in keep and x.op != "parameter":
                    del values[x]

        deadline = time.monotonic() + self.timeout
        tr = self.trace
        while done < len(nodes):
            block = not ready and not urgent
            t0 = clock() if tr is not None else 0.0
            pack = block and self.packed.pending()  # idle: pack a weight for a forward to come
            arrived = self.mail.take(tag, waiting, block and not pack, deadline)
            if pack and not arrived:
                self.packed.pack_next()
                if tr is not None:
                    tr.add(EXECUTOR, "kernel", "pack weights", t0, clock(), {"op": "pack"})
                continue
            if tr is not None and block:  # the executor idles until a tensor comes
                tr.add(EXECUTOR, "recv", "recv wait", t0, clock(),
                       {"keys": [m["key"] for m, _ in arrived]})
            for meta, array in arrived:
                finish(waiting.pop(meta["key"]), array)
                deadline = time.monotonic() + self.timeout
            if ready or urgent:
                n = heapq.heappop(urgent)[2] if urgent else ready.popleft()
                if tr is None or n.op in UNTRACED:
                    finish(n, self._compute(n, run, feeds, tag, check_numerics))
                else:
                    t0, cpu0 = clock(), time.thread_time()
                    value = self._compute(n, run, feeds, tag, check_numerics)
                    # cpu below wall: the thread lost its core (another process or thread ran)
                    tr.add(EXECUTOR, "send" if n.op == "send" else "kernel", n.name, t0,
                           clock(), {"op": n.op, "cpu_ms": (time.thread_time() - cpu0) * 1e3})
                    finish(n, value)

    def _compute(self, n: Node, run: _Run, feeds: Mapping[str, np.ndarray], step: int,
                 check_numerics: bool) -> np.ndarray:
        if n.op == "parameter":
            return self.params[n.name]
        if n.op == "constant":
            if run.seed_scale != 1.0 and is_seed(n):  # a micro-batch of other than average rows
                return n.attrs["value"] * np.asarray(run.seed_scale, n.attrs["value"].dtype)
            return n.attrs["value"]
        if n.op == "placeholder":
            if n.name not in feeds:
                raise StepFailed(located(n, f"is not fed on {worker_name(self.index)}"))
            return checked_value(n, feeds[n.name])
        inputs = [run.values[x] for x in n.inputs]
        if run.update is not None and n in self.fused and run.update(n, inputs):
            return UPDATED
        if n in run.into:
            return accumulate_kernel(n, inputs, run.into[n], check_numerics)
        if n.op == "send":
            # a parameter (updated in place), a gradient summed in place or a view (of what,
            # it does not say) is tracked; any other value is never written again, and
            # tracking a zero-copy send costs CPU
            source = n.inputs[0]
            track = (source.op == "parameter" or source.name in self.grad_nodes
                     or not aligned.owns_data(inputs[0]))
            self.mail.post(worker_name(n.attrs["dst"]), n.attrs["key"], inputs[0], step, track)
            return inputs[0]
        return run_kernel(n, inputs, check_numerics)

    def close(self) -> None:
        self.mail.close()
