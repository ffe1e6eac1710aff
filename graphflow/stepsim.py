"""The step simulator behind `CostModel.predict`: workers run their nodes as the runtime does.

Each worker runs one node at a time, chosen as runtime/worker.py chooses: of the nodes whose
inputs are there, first those that lead to a send (the nearest send first: a peer may be
waiting), then the rest in the order they became ready. A tensor goes to each other worker
that reads it once, as soon as it is computed: the bytes of one worker's sends go out one after
another on its link (their latencies overlap), and those reaching one worker come in one after
another on its link. Each message also costs both ends' cores `message_cpu` (the transport's
threads: framing, zmq's I/O, the hand-over to the computing thread): the sender's right after
the node, the receiver's as a task of its own (a receipt) that comes first once the tensor is
nearly there, ending as it arrives if the worker is free. Between processes of one machine
the sender's core also copies the bytes into shared memory before the message goes. Last,
each worker updates its parameters.

Running nodes in plain topological order instead put, in speech-mlp's mincut plan, the output
layer's weight gradient (a third of that worker's step) before the gradient the other worker
waited for: predictions 18-23% above the measured step, where they are now within 7%.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from graphflow.ir import Graph, Node, steps_to_send, users_of
from graphflow.link import Link

LOCAL_OPS = ("placeholder", "constant")  # replicated: present on every worker at time 0


@dataclass(frozen=True)
class Transfer:
    """One tensor sent from worker `src` to `dst` (one per tensor and destination)."""

    tensor: str
    src: int
    dst: int
    nbytes: int
    start: float
    seconds: float


@dataclass
class Prediction:
    """A simulated training step: makespan, per-worker busy time and traffic, every transfer."""

    step_seconds: float
    busy: list[float]
    bytes_in: list[int]
    bytes_out: list[int]
    transfers: list[Transfer] = field(default_factory=list)
    finish: list[float] = field(default_factory=list)  # when each worker ends (its update done)

    def __str__(self) -> str:
        rows = [f"step {self.step_seconds * 1e3:.3f} ms, {len(self.transfers)} transfers"]
        rows += [f"  worker {w}: busy {b * 1e3:.3f} ms, in {i} B, out {o} B"
                 for w, (b, i, o) in enumerate(zip(self.busy, self.bytes_in, self.bytes_out))]
        return "\n".join(rows)


@dataclass(frozen=True)
class Receipt:
    """The receiving end's work on a tensor sent to it, due just before the link delivers it;
    `there`: when the tensor counts as arrived (in the order a worker takes its ready nodes):
    as the link delivers it, or later if that work, started when due, ends later."""

    tensor: Node
    there: float


Span = tuple[int, float, float]  # (worker, start, end)
# a task whose inputs are known: (when they are there, its rank: (-1, when due, position) for
# a receipt, (0, steps to the nearest send, position) for a node that leads to a send, else
# (1, when ready, position); the node or receipt)
Queued = tuple[float, tuple[int, float, int], Node | Receipt]


@dataclass
class Costs:
    """What the simulator asks of the cost model: a node's seconds, a tensor's bytes, the link
    they cross (latency, bytes on the wire, the sender's copy: graphflow/link.py), a
    parameter's update seconds, `updates(ends, alone)`: each worker's
    update seconds when worker w ends its compute at ends[w] and its update alone takes
    alone[w] (workers on one machine share its memory), and the CPU seconds a message costs
    each end."""

    node_seconds: Callable[[Node], float]
    nbytes: Callable[[Node], int]
    link: Link
    updates: Callable[[list[float], list[float]], list[float]]
    update_seconds: Callable[[Node], float]
    message_cpu: float = 0.0


@dataclass(frozen=True)
class Layout:
    """What a simulated step needs of the graph and its placement alone: worked out once for
    a stream of steps (`CostModel.stream_seconds`), not once a step (a quarter of the time a
    64-worker plan's recompute pass took)."""

    where: Mapping[Node, int]
    users: dict[Node, list[Node]]
    dests: dict[Node, list[int]]  # the other workers that read a node
    urgent: dict[Node, int]  # steps to the nearest send, for the nodes that lead to one
    position: dict[Node, int]
    params: list[Node]
    computed: list[Node]
    inputs: dict[Node, int]  # how many of a computed node's inputs are not local
    workers: int

    @classmethod
    def of(cls, graph: Graph, where: Mapping[Node, int]) -> Layout:
        order = graph.toposort()
        users = users_of(order)
        same = {n: [u for u in users[n] if where[u] == where[n]] for n in order}
        dests = {n: sorted({where[u] for u in users[n]} - {where[n]}) for n in order
                 if n.op not in LOCAL_OPS}
        computed = [n for n in order if n.op not in LOCAL_OPS and n.op != "parameter"]
        return cls(where, users, dests,
                   steps_to_send(order, same, lambda n: bool(dests.get(n))),
                   {n: i for i, n in enumerate(order)},
                   [n for n in order if n.op == "parameter"], computed,
                   {n: sum(x.op not in LOCAL_OPS for x in n.inputs) for n in computed},
                   max(where.values(), default=0) + 1)


def simulate(layout: Layout, costs: Costs, starts: Sequence[float] | None = None
             ) -> tuple[Prediction, dict[Node, Span]]:
    """One step of the graph with node n on worker where[n] (`Layout.of(graph, where)`),
    worker w starting at starts[w] (default 0): the prediction and each computed node's
    (worker, start, end)."""
    where, users, dests, urgent = layout.where, layout.users, layout.dests, layout.urgent
    position, workers = layout.position, layout.workers
    begin = list(starts) if starts is not None else [0.0] * workers
    free, link_free, busy = list(begin), list(begin), [0.0] * workers
    inboxes = [_Inbox() for _ in range(workers)]
    bytes_in, bytes_out = [0] * workers, [0] * workers
    ready: dict[tuple[Node, int], float] = {}  # (tensor, worker) -> when it is there
    spans: dict[Node, Span] = {}
    transfers: list[Transfer] = []

    cpu, link = costs.message_cpu, costs.link

    def produced(n: Node, end: float) -> None:
        w = where[n]
        ready[n, w] = end
        if dests[n]:
            nbytes = costs.nbytes(n)
            copy, wire = link.copy_seconds(nbytes), link.wire_seconds(nbytes)
        copied = end
        for d in dests[n]:
            copied += copy  # (the sender copies one message after another)
            start = max(copied, link_free[w])
            link_free[w] = start + wire  # (the latencies of sends in a row overlap)
            arrives = inboxes[d].take(start + link.latency_s, wire)
            bytes_out[w] += nbytes
            bytes_in[d] += nbytes
            transfers.append(Transfer(n.name, w, d, nbytes, start, arrives - start))
            if cpu + copy > 0:
                free[w] += cpu + copy  # (its node has just been placed: it ends at free[w])
                busy[w] += cpu + copy
                agenda.moved(w)
            if cpu > 0:
                due = max(arrives - cpu, start)
                agenda.push(d, due, (-1, due, position[n]), Receipt(n, due + cpu))
            else:
                ready[n, d] = arrives
        for u in users[n]:
            if cpu <= 0 or where[u] == w:
                there(u)

    def there(u: Node) -> None:  # one more of u's inputs is on u's worker
        missing[u] -= 1
        if missing[u] == 0:
            arrive(u)

    agenda = _Agenda(free)

    def arrive(n: Node) -> None:
        w = where[n]
        at = max((ready[x, w] for x in n.inputs if x.op not in LOCAL_OPS), default=begin[w])
        rank = (0, urgent[n], position[n]) if n in urgent else (1, at, position[n])
        agenda.push(w, at, rank, n)

    params, computed, missing = layout.params, layout.computed, dict(layout.inputs)
    for n in computed:  # (before the parameters: a node they complete arrives through them)
        if missing[n] == 0:
            arrive(n)
    for n in params:  # a parameter is there when its worker starts the step
        produced(n, begin[where[n]])
    receipts = sum(len(d) for d in dests.values()) if cpu > 0 else 0
    for _ in range(len(computed) + receipts):
        task, w, start = agenda.next()
        if isinstance(task, Receipt):
            free[w] = start + cpu
            busy[w] += cpu
            agenda.moved(w)
            ready[task.tensor, w] = task.there  # (its users start after this, w's next)
            for u in users[task.tensor]:
                if where[u] == w:
                    there(u)
            continue
        end = free[w] = start + costs.node_seconds(task)
        busy[w] += end - start
        agenda.moved(w)
        spans[task] = (w, start, end)
        produced(task, end)
    alone = [0.0] * workers  # then each worker updates the parameters it holds
    for n in params:
        alone[where[n]] += costs.update_seconds(n)
    for w, seconds in enumerate(costs.updates(free, alone)):
        free[w] += seconds
        busy[w] += seconds
    step = max([*ready.values(), *free], default=0.0)
    return Prediction(step, busy, bytes_in, bytes_out, transfers, free), spans


class _Inbox:
    """A worker's incoming link: it takes one message's bytes at a time, so messages that
    reach it together queue (many workers sending to one: a gather). Each takes the first gap
    long enough at or after its arrival (senders are simulated out of time order)."""

    def __init__(self) -> None:
        self.busy: list[tuple[float, float]] = []  # (start, end), sorted and disjoint

    def take(self, at: float, seconds: float) -> float:
        """When a message reaching the link at `at`, `seconds` long on it, is in."""
        i, t = max(bisect.bisect_right(self.busy, (at, math.inf)) - 1, 0), at
        while i < len(self.busy) and self.busy[i][0] < t + seconds:
            t = max(t, self.busy[i][1])
            i += 1
        self.busy.insert(i, (t, t + seconds))
        return t + seconds


class _Queue:
    """One worker's tasks whose inputs are known: those not there yet by the worker's time, by
    when they will be (a heap), and those that are, by rank (a heap). A worker's time only
    grows, so a task once there stays there. (One list per worker, all scanned at every pick,
    had made a 64-worker plan's partition take minutes.)"""

    def __init__(self) -> None:
        self.later: list[Queued] = []
        self.there: list[tuple[tuple[int, float, int], Node | Receipt]] = []

    def push(self, at: float, rank: tuple[int, float, int], task: Node | Receipt) -> None:
        heapq.heappush(self.later, (at, rank, task))  # (ranks are unique: tasks never compared)

    def start(self, free: float) -> float | None:
        """When the worker, free at `free`, starts its next task (None: it has none)."""
        if self.there:
            return free
        return max(free, self.later[0][0]) if self.later else None

    def pop(self, start: float) -> Node | Receipt:
        """The first by rank of the tasks there by `start`."""
        while self.later and self.later[0][0] <= start:
            _, rank, task = heapq.heappop(self.later)
            heapq.heappush(self.there, (rank, task))
        return heapq.heappop(self.there)[1]


class _Agenda:
    """Every worker's known tasks and, in a heap, when each worker starts its next (entries a
    later change made stale are skipped): the next task anywhere, as `next` tells, in log time.
    A worker takes, once it is free, the first by rank of its tasks whose inputs are there by
    then; the worker that starts earliest goes first (ties: the lowest index), so nothing
    simulated later can change its choice. Whoever changes a worker's time in `free` (shared)
    calls `moved`."""

    def __init__(self, free: list[float]) -> None:
        self.free = free
        self.queues = [_Queue() for _ in free]
        self.starts: list[tuple[float, int, int]] = []  # (start, worker, its version)
        self.version = [0] * len(free)

    def push(self, w: int, at: float, rank: tuple[int, float, int],
             task: Node | Receipt) -> None:
        self.queues[w].push(at, rank, task)
        self.moved(w)

    def moved(self, w: int) -> None:
        self.version[w] += 1
        start = self.queues[w].start(self.free[w])
        if start is not None:
            heapq.heappush(self.starts, (start, w, self.version[w]))

    def next(self) -> tuple[Node | Receipt, int, float]:
        """The next task to start anywhere: (node or receipt, worker, start)."""
        while self.starts:
            start, w, version = heapq.heappop(self.starts)
            if version == self.version[w]:
                return self.queues[w].pop(start), w, start
        raise ValueError("the graph's dependencies form a cycle across workers")


def shared_fraction(spans: Mapping[Node, Span], n: Node) -> float:
    """The fraction of node n's time during which a node of another worker runs too."""
    w, start, end = spans[n]
    if end <= start:
        return 0.0
    others = sorted((s, e) for m, (v, s, e) in spans.items() if v != w and e > start and s < end)
    covered, reach = 0.0, start
    for s, e in others:
        lo, hi = max(s, reach), min(e, end)
        if hi > lo:
            covered += hi - lo
            reach = hi
    return covered / (end - start)
