"""Clusters of `graphflow bench speedup`: started and warmed up, timed in rounds, and the
micro-batch count of a pipelined row chosen by a short trial of each."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import repeat
from typing import Any

import numpy as np

from graphflow.bench import memory_to_spare
from graphflow.partitioners import Plan
from graphflow.progress import Progress
from graphflow.runtime.cluster import Cluster

OPTIMIZER = {"name": "sgd", "lr": 0.001}
TRIAL_ROUNDS = 6  # interleaved windows per micro-batch count in a trial (3 picked 4 micro-batches
#                  for speech-mlp once where 2 were 5-7% faster in three longer interleaved runs)
TRIAL_WITHIN = 1.3  # counts predicted more than 30% slower than the best one are not tried
#                     (8 micro-batches: predicted 1.6-2.1x the best, measured 1.4-2.4x)
TRIAL_MARGIN = 0.05  # a count replaces the predicted best only if its trial is this much faster


def time_rounds(ones: Sequence[Cluster], running: dict[int, list[Cluster]],
                points: list[dict[str, Any]], feeds: dict[str, np.ndarray],
                args: argparse.Namespace, bar: Progress,
                between: Callable[[Cluster], None] = lambda one: None) -> dict[str, Any]:
    """`args.steps` rounds, each: `args.window` steps of a 1-worker cluster alone, as many of
    two independent 1-worker clusters at once (the ceiling), as many of every running point,
    then `between(the round's lone 1-worker cluster)` (the cost model's kernels and update rates
    timed again in its process). A neighbour's burst so spreads over all points instead of
    spoiling one. The 1-worker clusters (two or more) take those turns
    in rotation, as a point with several clusters times one a round. Times are per step."""
    alone, both = [], []
    window = args.window
    with ThreadPoolExecutor(2) as pool:
        for r in range(args.steps):
            pair = (ones[r % len(ones)], ones[(r + 1) % len(ones)])
            alone.append(timed(pair[0], feeds, window))
            t0 = time.perf_counter()
            list(pool.map(lambda c: timed(c, feeds, window), pair))
            both.append((time.perf_counter() - t0) / window)
            for i, clusters in list(running.items()):
                try:
                    points[i]["times_s"].append(timed(clusters[r % len(clusters)], feeds,
                                                      window))
                except Exception as e:  # noqa: BLE001 - drop the point, keep the others
                    points[i]["error"] = f"{type(e).__name__}: {e}"
                    del running[i]
            between(pair[0])
            bar.label = f"{points[0]['workload'] if points else ''} round {r + 1}/{args.steps}"
            bar.update(alone_ms=1e3 * alone[-1], both_ms=1e3 * both[-1])
    return {"alone_s": alone, "together_s": both,
            "ratio": 2 * statistics.median(alone) / statistics.median(both)}


UNEVEN = 1.15  # a point whose slowest cluster's median is this much over its fastest's is noted


def cluster_medians(times: Sequence[float], clusters: int) -> list[float]:
    """Each cluster's median seconds per step, from a point's round times (`time_rounds`
    times cluster r % clusters in round r).

    >>> [round(m, 3) for m in cluster_medians([0.070, 0.090, 0.072, 0.094, 0.068], 2)]
    [0.07, 0.092]
    """
    return [statistics.median(times[k::clusters]) for k in range(min(clusters, len(times)))]


def uneven_clusters(label: str, medians: Sequence[float]) -> str | None:
    """A note when a point's clusters (their `cluster_medians`) ran at clearly different
    speeds (freshly started clusters of one plan sometimes do; the point's median includes
    them all), else None.

    >>> uneven_clusters("x P=2", [0.071, 0.092])
    'x P=2: its clusters ran 71.0 / 92.0 ms a step (medians): 1.30x apart'
    >>> uneven_clusters("x P=2", [0.071, 0.0745]) is None
    True
    """
    if len(medians) < 2 or max(medians) < UNEVEN * min(medians):
        return None
    each = " / ".join(f"{1e3 * m:.1f}" for m in medians)
    return (f"{label}: its clusters ran {each} ms a step (medians): "
            f"{max(medians) / min(medians):.2f}x apart")


def affordable(start: int, stop: int, needed: int = 1) -> Iterator[int]:
    """start .. stop - 1, the clusters to start: past the first `needed`, only while a quarter
    of the memory is free (`memory_to_spare`)."""
    for k in range(start, stop):
        if k >= needed and not memory_to_spare():
            return
        yield k


def start_cluster(plan: Plan, args: argparse.Namespace, microbatches: int,
                  feeds: dict[str, np.ndarray], label: str) -> Cluster:
    """A started cluster for `plan`, warmed up by `args.warmup` steps; `label` names its
    workers in a --trace."""
    extra = {"microbatches": microbatches, "schedule": args.schedule} if microbatches > 1 else {}
    cluster = Cluster(plan, mode=args.mode, optimizer=OPTIMIZER, timeout=300.0, **extra)
    cluster.trace_label = label
    try:
        for _ in range(args.warmup):
            cluster.step(feeds)
    except BaseException:
        cluster.close()
        raise
    return cluster


def timed(cluster: Cluster, feeds: dict[str, np.ndarray], window: int) -> float:
    """Seconds per step of `window` streamed training steps."""
    t0 = time.perf_counter()
    for _ in cluster.stream(repeat(feeds, window)):
        pass
    return (time.perf_counter() - t0) / window


def fastest_microbatches(plan: Plan, args: argparse.Namespace, counts: Sequence[int],
                         feeds: dict[str, np.ndarray], label: str, predicted: int
                         ) -> tuple[int, list[Cluster], dict[int, float]]:
    """Start `args.clusters` clusters of `plan` for each micro-batch count, time each count in
    TRIAL_ROUNDS interleaved windows (its clusters by turns), and keep the count whose fastest
    cluster is fastest, by a margin (below): (its count, its clusters, every count's fastest
    cluster's median seconds per step). The cost model ranks the counts too, but its guesses for
    small micro-batches missed which was fastest here (speech-mlp: 2 predicted best, measured
    6-9% slower than 3 in two runs). A fresh cluster now and then runs 20-40% slower than others
    of its plan, whatever its count, so a count's median could be a slow cluster's: one cluster
    a count picked 3 micro-batches for speech-mlp where its 2-micro-batch cluster came out at
    89.7 ms (2 run 70-74 ms and 3 run 77-79 interleaved), and three a count picked 4 where the
    2-micro-batch median came out at 84 ms against 80 for 4, at least two of its three clusters
    slow in some window (the row then ran 4 micro-batches at 73-81 ms a step, where 2 run
    67-71). The fastest cluster can be a lucky one too: 4 micro-batches at 68.2 ms beat 2 at
    69.4, and then ran 73-93 ms a step where 2 had run 64-72 in the four runs before. So the
    `predicted` best count (one of `counts`) keeps its place unless another's fastest cluster
    beats its fastest by more than TRIAL_MARGIN."""
    clusters: dict[int, list[Cluster]] = {}
    try:
        for m in counts:
            clusters[m] = []
            for k in affordable(0, args.clusters):
                name = f"{label} trial {m}" + (f" ({k + 1})" if k else "")
                clusters[m].append(start_cluster(plan, args, m, feeds, name))
        times: dict[int, list[list[float]]] = {m: [[] for _ in mine] for m, mine in
                                                clusters.items()}  # per count and cluster
        for r in range(TRIAL_ROUNDS):
            for m, mine in clusters.items():
                times[m][r % len(mine)].append(timed(mine[r % len(mine)], feeds, args.window))
        fastest = {m: min(statistics.median(t) for t in per if t) for m, per in times.items()}
        best = min(fastest, key=fastest.__getitem__)
        if fastest[best] > (1 - TRIAL_MARGIN) * fastest[predicted]:  # (within the trial's noise)
            best = predicted
        return best, clusters.pop(best), fastest
    finally:
        for mine in clusters.values():
            for cluster in mine:
                cluster.close()
