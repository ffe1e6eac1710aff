"""How the cost model measures this machine: kernels timed on random inputs, the optimizer's
update rate, messages between two worker processes for their CPU, latency and the rate their
bytes move at, and the cache that keeps the results per machine, thread setup and kernel code
(`fingerprint`), the messages' per machine (`machine_fingerprint`).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from llvmlite.binding import get_host_cpu_name

from graphflow.ir import Graph, Node
from graphflow.ops import aligned, simd
from graphflow.ops.registry import REGISTRY, concrete
from graphflow.serialize import decode_value, encode_value

UPDATE_PASSES = 3  # an SGD update reads the parameter and its gradient, writes the parameter


@functools.cache
def kernels_digest() -> str:
    """A digest of the kernels' code (the ops package and the optimizer updates): timings of
    older kernels say nothing of new ones (a new weight-gradient gemm made speech-mlp's take
    half as long, and cached times would have steered plans by the old ones)."""
    import graphflow.ops
    import graphflow.optim

    files = sorted(Path(graphflow.ops.__file__).parent.glob("*.py"))
    digest = hashlib.sha256()
    for f in [*files, Path(graphflow.optim.__file__)]:
        digest.update(f.name.encode() + f.read_bytes())
    return digest.hexdigest()[:16]


@functools.cache
def _cpu_model() -> str:
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    model = next((x.split(":", 1)[1].strip() for x in lines if x.startswith("model name")), "")
    return model or platform.processor()


def cpu_identity() -> dict[str, Any]:
    """The CPU: its model name (/proc/cpuinfo; "AMD EPYC" for any generation of them), LLVM's
    name for it and whether the gemm kernels' rules take it for AVX-512 (ops/simd.py)."""
    return {"cpu_model": _cpu_model(), "cpu_name": get_host_cpu_name(), "wide_vectors": simd.WIDE}


def _machine_parts() -> list[str]:
    return [platform.machine(), *map(str, cpu_identity().values()), str(os.cpu_count())]


def _digest(parts: Sequence[str]) -> str:
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def machine_fingerprint() -> str:
    """Identifies this machine alone: what the link between its worker processes is kept by
    (a message's cost does not change with the BLAS threads or the kernels' code)."""
    return _digest(_machine_parts())


def fingerprint() -> str:
    """Identifies this machine, thread setup, kernel code and the BLAS the kernels call
    (ops/blas.py): calibrations are only reused on a match."""
    import numba

    from graphflow.ops import blas

    return _digest([*_machine_parts(), np.__version__, numba.__version__,
                    str(numba.get_num_threads()), os.environ.get("OPENBLAS_NUM_THREADS", ""),
                    os.environ.get("OMP_NUM_THREADS", ""), kernels_digest(), blas.BLAS])


def cache_path() -> Path:
    """$GRAPHFLOW_COSTMODEL, else ~/.cache/graphflow/costmodel.json."""
    env = os.environ.get("GRAPHFLOW_COSTMODEL")
    return Path(env) if env else Path.home() / ".cache" / "graphflow" / "costmodel.json"


def _random_input(shape: tuple[int, ...], dtype: str, rng: np.random.Generator) -> np.ndarray:
    """Laid out as a step's tensors are (a large one starts on a page: ops/aligned.py), or a
    kernel is timed on whatever line offsets malloc gave: the forward gemm against a 2560 x
    8192 weight ran 19.7 ms on numpy's arrays, 16.1 on aligned ones, and 3 of 4 processes'
    random weight was off a line."""
    if np.dtype(dtype).kind in "iu":
        return aligned.full(shape, 0, dtype)  # labels and indices: zero is always in range
    return aligned.copy(rng.random(shape, dtype=dtype) + 0.5, dtype)


def kernel_specs(nodes: Mapping[str, Node], batch: int) -> list[dict[str, Any]]:
    """Each node's forward kernel as plain data, keyed by its signature: op, concrete input
    shapes and dtypes, attrs (so another process can time it: `time_kernels`)."""
    return [{"sig": sig, "op": n.op, "attrs": encode_value(n.attrs),
             "inputs": [[list(concrete(x.shape, batch)), x.dtype] for x in n.inputs]}
            for sig, n in nodes.items()]


def time_kernels(specs: Sequence[Mapping[str, Any]], repeats: int) -> dict[str, float]:
    """Median seconds of each kernel (`kernel_specs`) on random inputs: one warm-up pass, then
    `repeats` passes over all kernels (so a neighbour's burst spreads over many kernels)."""
    rng, arrays = np.random.default_rng(0), {}  # inputs of one shape and dtype are shared
    runs = {}
    for spec in specs:
        keys = [(tuple(shape), dtype) for shape, dtype in spec["inputs"]]
        for k in keys:
            if k not in arrays:
                arrays[k] = _random_input(*k, rng)
        runs[spec["sig"]] = (REGISTRY[spec["op"]].forward, [arrays[k] for k in keys],
                             decode_value(spec["attrs"]))
    times: dict[str, list[float]] = {sig: [] for sig in runs}
    for rep in range(max(repeats, 1) + 1):
        for sig, (forward, ins, attrs) in runs.items():
            t0 = time.perf_counter()
            forward(ins, attrs)
            if rep:
                times[sig].append(time.perf_counter() - t0)
    return {sig: statistics.median(t) for sig, t in times.items()}


def time_nodes(nodes: Mapping[str, Node], batch: int, repeats: int) -> dict[str, float]:
    """`time_kernels` of the nodes' kernels at `batch`, in this process."""
    return time_kernels(kernel_specs(nodes, batch), repeats)


def time_update(repeats: int, size: int = 1 << 24, streams: int = 1) -> float:
    """Bytes of memory passes per second of the SGD update kernel on a 64 MB float32
    parameter (larger than a last-level cache), in each of `streams` threads updating at once
    (the kernel releases the GIL: as co-located workers' updates at the end of a step)."""
    from graphflow.optim import SGD  # the optimizers import numba kernels of their own

    arrays = [(np.ones(size, np.float32), np.ones(size, np.float32)) for _ in range(streams)]
    sgd = SGD(lr=1e-3)
    with ThreadPoolExecutor(streams) as pool:
        times = []
        for _ in range(max(repeats, 1) + 1):
            t0 = time.perf_counter()
            list(pool.map(lambda i: sgd.update(f"p{i}", *arrays[i]), range(streams)))
            times.append(time.perf_counter() - t0)
    return UPDATE_PASSES * 4 * size / statistics.median(times[1:])


def time_update_call(repeats: int, calls: int = 200) -> float:
    """Seconds of one SGD update of a 16-element parameter: what an update costs beside its
    memory passes (a small model's many small parameters are all call)."""
    from graphflow.optim import SGD

    p, g = np.ones(16, np.float32), np.ones(16, np.float32)
    sgd = SGD(lr=1e-3)
    times = []
    for _ in range(max(repeats, 1) + 1):
        t0 = time.perf_counter()
        for _ in range(calls):
            sgd.update("p", p, g)
        times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times[1:])


def time_dispatch(repeats: int, short: int = 20, long: int = 220) -> float:
    """Seconds a worker spends on a node beside its kernel (its dataflow's bookkeeping): the
    step of a 1-worker cluster (threads) over a chain of `long` one-element negations, less
    the step over `short` of them, per extra node, less the negation's own kernel."""
    from graphflow.dsl import placeholder  # (the runtime imports the cost model: not at the top)
    from graphflow.ops.elementwise import neg

    steps = {}
    for n in (short, long):
        with Graph() as g:
            h = placeholder("x", (1,))
            for _ in range(n):
                h = neg(h)
        steps[n] = _median_run(g, 1, "threads", {"x": np.ones(1, np.float32)}, [h.name],
                               runs=3 * max(repeats, 1), warmup=1)
    kernel = time_nodes({"neg": h}, 1, repeats)["neg"]
    return max((steps[long] - steps[short]) / (long - short) - kernel, 0.0)


def write_cache(path: Path, machines: Mapping[str, Any]) -> None:
    """Write the cache (machine fingerprint -> entry) at once: a reader never sees half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump({"version": 1, "machines": dict(machines)}, f)
    os.replace(tmp, path)


def update_cache(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Read the cache, `change` it in place and write it, holding its lock (a file beside it):
    of two processes calibrating at once (a benchmark and `graphflow show`, or two test
    processes) each keeps the other's results, where the later write dropped the earlier's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (let go when the file closes)
        machines = read_cache(path)
        change(machines)
        write_cache(path, machines)


def read_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
        return dict(data.get("machines", {})) if data.get("version") == 1 else {}
    except (OSError, ValueError, AttributeError):
        return {}


# A hop's bytes are timed on a tensor this large: the reference workloads' larger messages
# (lc-large's halos, speech-mlp's activations) are 0.3-1 MB.
HOP_BYTES = 1 << 20


def time_messages(repeats: int, links: int = 40, hops: int = 40) -> tuple[float, float, float]:
    """(CPU seconds each end spends on a message, seconds a small tensor takes from one worker
    to the next, bytes per second a large tensor's hop adds) in running steps of two local
    worker processes, as a cluster runs them.

    CPU: each worker negates a 64 x 128 tensor `links` times and sends each result to the
    other, which negates and sums what it gets; the steps' extra time over the same graph with
    the sums kept at home is that of 2 x `links` ends on each worker. Little compute beside the
    messages: a freshly started cluster at times computes 8-30% slower throughout.
    Hop: a chain of `hops` negations alternating between the workers, over the same chain on
    one worker, per hop: of one element (an idle ping-pong shows a message's CPU alike, 20-35
    us here, but a hop of 42-54 us, against 80-127 in running steps), and of `HOP_BYTES`, whose
    bytes the sender copies into shared memory: 13.8 GB/s for 1 MB here, 6.9 for 4 MB, where a
    ping-pong of one buffer, hot in cache, had said 14-24."""
    def median_step(graph: Graph, fetch: list[str], feeds: dict[str, np.ndarray]) -> float:
        return _median_run(graph, 2, "processes", feeds, fetch, runs=10 * max(repeats, 1),
                           warmup=3, pin=True)

    def per_hop(shape: tuple[int, ...], count: int) -> float:
        x = {"x": np.ones(shape, np.float32)}
        local, alternating = (median_step(*_chain(count, alternate, shape), x)
                              for alternate in (False, True))
        return max(alternating - local, 0.0) / count

    small = {f"x{w}": np.ones((64, 128), np.float32) for w in (0, 1)}
    home, away = (median_step(*_exchange(links, cross), small) for cross in (False, True))
    hop = per_hop((1,), hops)
    big = per_hop((HOP_BYTES // 4,), hops // 2)
    return (max(away - home, 0.0) / (2 * links), hop,
            HOP_BYTES / max(big - hop, HOP_BYTES / 100e9))  # (noise: at most 100 GB/s)


def _median_run(graph: Graph, parts: int, mode: str, feeds: dict[str, np.ndarray],
                fetch: list[str], runs: int, warmup: int, pin: bool | None = None) -> float:
    """Median seconds of `runs` steps (`Cluster.run`, after `warmup` untimed) of `graph` on a
    local cluster of `parts` workers (its device scopes place it: "manual"; one part:
    layerwise)."""
    from graphflow.partitioners import partition  # (the runtime imports the cost model)
    from graphflow.runtime.cluster import Cluster

    plan = partition(graph, parts, "manual" if parts > 1 else "layerwise")
    with Cluster(plan, mode=mode, timeout=30.0, pin=pin) as cluster:
        times = []
        for _ in range(warmup + runs):
            t0 = time.perf_counter()
            cluster.run(feeds, fetch)
            times.append(time.perf_counter() - t0)
    return statistics.median(times[warmup:])


def _exchange(links: int, cross: bool) -> tuple[Graph, list[str]]:
    """`time_messages`' graph: per worker a chain of negations, each link sent to the other
    worker (`cross`) or kept, negated and summed there; and the sums to fetch."""
    from graphflow.dsl import device, placeholder
    from graphflow.ops.elementwise import add, neg

    sums = []
    with Graph() as g:
        for w in (0, 1):
            with device(f"worker:{w}"):
                h = placeholder(f"x{w}", (64, 128))
            total = None
            for _ in range(links):
                with device(f"worker:{w}"):
                    h = neg(h)
                with device(f"worker:{1 - w if cross else w}"):
                    got = neg(h)
                    total = got if total is None else add(total, got)
            sums.append(total)
    return g, [t.name for t in sums if t is not None]


def _chain(hops: int, alternate: bool, shape: tuple[int, ...]) -> tuple[Graph, list[str]]:
    """`time_messages`' chain of negations of a `shape` tensor, alternating between two
    workers or all on worker 0 (worker 1 negates the input once); and what to fetch."""
    from graphflow.dsl import device, placeholder
    from graphflow.ops.elementwise import neg

    with Graph() as g:
        x = placeholder("x", shape)
        with device("worker:1"):
            other = neg(x)
        h = x
        for i in range(hops):
            with device(f"worker:{i % 2 if alternate else 0}"):
                h = neg(h)
    return g, [h.name, other.name]
