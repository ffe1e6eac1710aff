"""Single-process training: a Session, the gradients of the loss, an optimizer, a loop.

>>> import graphflow as gf                                            # doctest: +SKIP
>>> model = gf.models.digits_lc()                                     # doctest: +SKIP
>>> trainer = gf.Trainer(model, gf.optim.Adagrad(0.05))               # doctest: +SKIP
>>> data = gf.datasets.digits()                                       # doctest: +SKIP
>>> trainer.fit(gf.datasets.batches(data.x_train, data.y_train, 32), steps=100)  # doctest: +SKIP
>>> trainer.accuracy(data.x_test, data.y_test)                        # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from graphflow.autodiff import gradients
from graphflow.datasets import pairs
from graphflow.errors import count_of
from graphflow.executor import Session
from graphflow.models import Model
from graphflow.optim import Optimizer
from graphflow.partitioners import partition
from graphflow.prediction import best_microbatches
from graphflow.progress import Progress
from graphflow.replicas.feed import LOCKSTEP
from graphflow.runtime.cluster import Cluster
from graphflow.runtime.clusterfile import CONNECT_TIMEOUT, TRAIN_TIMEOUT
from graphflow.runtime.options import check_cluster_options
from graphflow.trace import driver_span, recording

if TYPE_CHECKING:
    from graphflow.replicas.manager import ReplicaOptions


@dataclass
class History:
    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)


class Trainer:
    """Trains a Model in this process; parameters live in `self.session`."""

    def __init__(self, model: Model, optimizer: Optimizer, check_numerics: bool = False) -> None:
        self.model = model
        self.optimizer = optimizer
        self.session = Session(model.graph, check_numerics=check_numerics)
        self.params = model.graph.parameters()
        self.grads = gradients(model.loss, self.params)
        self._fetches = [model.loss] + [self.grads[p.name] for p in self.params]
        self.step_count = 0

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        """One forward + backward + update on a batch; returns the loss before the update."""
        with driver_span("step", f"step {self.step_count}", {"step": self.step_count}):
            loss, *grads = self.session.run(self._fetches, {self.model.x: x, self.model.y: y})
            for p, g in zip(self.params, grads, strict=True):
                self.optimizer.update(p.name, self.session.params[p.name], g)
        self.step_count += 1
        return float(loss)

    def fit(self, batches: Iterable[tuple[np.ndarray, np.ndarray]], steps: int,
            progress: bool = True, log_every: int = 10,
            trace: str | Path | None = None) -> History:
        """Train for `steps` batches. With `trace`, write the run's timeline there (Chrome
        trace-event JSON: every worker's kernels, sends, receives and PS calls as spans; see
        graphflow.trace)."""
        count_of(steps, "steps")
        count_of(log_every, "log_every")
        with recording(trace):
            return self._fit(batches, steps, progress, log_every)

    def _fit(self, batches: Iterable[tuple[np.ndarray, np.ndarray]], steps: int,
             progress: bool, log_every: int) -> History:
        history = History()
        loss = None
        with Progress(steps, "train", enabled=progress) as bar:
            for loss in self._losses(islice(batches, steps)):
                if self.step_count % log_every == 0:
                    history.steps.append(self.step_count)
                    history.losses.append(loss)
                bar.update(loss=loss)
        if loss is not None and history.steps[-1:] != [self.step_count]:  # the last step, even
            history.steps.append(self.step_count)  # when the batches ran out before `steps`
            history.losses.append(loss)
        return history

    def _losses(self, batches: Iterable[tuple[np.ndarray, np.ndarray]]) -> Iterator[float]:
        """A training step on each batch, in turn: its loss."""
        for x, y in pairs(batches):
            yield self.step(x, y)

    def predict(self, x: np.ndarray, batch_size: int = 256) -> np.ndarray:
        """Class predictions (argmax of the logits)."""
        return self.model.classes(self._logits_of(), x, batch_size)

    def accuracy(self, x: np.ndarray, y: np.ndarray) -> float:
        return self.model.accuracy(self._logits_of(), x, y)

    def _logits_of(self) -> Callable[[np.ndarray], np.ndarray] | Session:
        """What gives the logits of some rows with the trained parameters: here the session,
        which holds them."""
        return self.session


class PartitionedTrainer(Trainer):
    """Trains a Model split across workers (model parallelism): `parts` workers placed by
    `strategy`, run as threads, local processes or remote `hosts`. Parameters live on the
    workers, which also compute `accuracy`'s and `predict`'s logits. `microbatches`
    "auto" takes the count of 1 (no pipeline), 2, 3, 4, 8 with the shortest predicted step at
    `batch` (the fewest within 5% of it; 1 where the plan cannot pipeline): `self.microbatches`
    says which. With `check_numerics`, a step
    stops at the first node that makes a NaN or inf, naming it."""

    def __init__(self, model: Model, optimizer: Optimizer, parts: int,
                 strategy: str = "spatial", mode: str = "threads",
                 hosts: list[str] | None = None, microbatches: int | Literal["auto"] = 1,
                 schedule: str = "eager", timeout: float = TRAIN_TIMEOUT,
                 batch: int | None = None, check_numerics: bool = False,
                 connect_timeout: float = CONNECT_TIMEOUT) -> None:
        # checked before the partitioning and the "auto" timings, not after them in Cluster
        check_cluster_options(mode, hosts, microbatches, timeout, connect_timeout, auto=True)
        self.model, self.optimizer = model, optimizer
        self.plan = partition(model.graph, parts, strategy, loss=model.loss)
        if microbatches == "auto":
            if batch is None:
                raise ValueError("microbatches='auto' needs the batch size (batch=...)")
            microbatches, _ = best_microbatches(self.plan, batch, repeats=3, schedule=schedule,
                                                unpipelined=True)
        self.microbatches = microbatches
        self.cluster = Cluster(self.plan, mode, hosts, optimizer.spec(), timeout, microbatches,
                               schedule, connect_timeout=connect_timeout,
                               check_numerics=check_numerics)
        self.step_count = 0

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        out = self.cluster.step({self.model.x.name: x, self.model.y.name: y})
        self.step_count += 1
        return float(out[self.model.loss.name])

    def _losses(self, batches: Iterable[tuple[np.ndarray, np.ndarray]]) -> Iterator[float]:
        """Streamed steps (Cluster.stream): each worker starts the next step as soon as its
        part of this one is done."""
        feeds = ({self.model.x.name: x, self.model.y.name: y} for x, y in pairs(batches))
        for out in self.cluster.stream(feeds):
            self.step_count += 1
            yield float(out[self.model.loss.name])

    def _logits_of(self) -> Callable[[np.ndarray], np.ndarray]:
        """The workers compute the logits (a run that does not train: no labels, no backward,
        and no parameter leaves its worker)."""
        x, logits = self.model.x.name, self.model.logits.name

        def logits_of(rows: np.ndarray) -> np.ndarray:
            n = len(rows)  # (at least a row per micro-batch)
            if n < self.microbatches:
                rows = np.concatenate([rows, np.zeros((self.microbatches - n, *rows.shape[1:]),
                                                      rows.dtype)])
            return self.cluster.run({x: rows}, logits)[logits][:n]
        return logits_of

    def close(self) -> None:
        self.cluster.close()


class DataParallelTrainer(Trainer):
    """Trains `replicas` copies of a Model (each split over `parts` workers by `strategy`)
    that share parameters through `shards` parameter-server shards; `options` set the mode
    (async Downpour, bsp, ssp, allreduce, Sandblaster L-BFGS), intervals, placement,
    checkpoints. See graphflow/replicas. Its replicas take batches on their own: train with
    `fit`, not `step`."""

    def __init__(self, model: Model, optimizer: Optimizer, replicas: int = 2, shards: int = 2,
                 parts: int = 1, strategy: str = "spatial",
                 options: ReplicaOptions | None = None) -> None:
        from graphflow.replicas.manager import ReplicaManager

        self.model, self.optimizer = model, optimizer
        self.session = Session(model.graph)
        self.plan = partition(model.graph, parts, strategy, loss=model.loss)
        self.manager = ReplicaManager(model, self.plan, optimizer, replicas, shards, options)
        self.step_count = 0

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        """Not here: TypeError (the replicas take batches on their own; call `fit`)."""
        raise TypeError("a DataParallelTrainer has no single step: its replicas take batches "
                        "on their own; call fit()")

    def _fit(self, batches: Iterable[tuple[np.ndarray, np.ndarray]], steps: int,
             progress: bool = True, log_every: int = 10) -> History:
        """`steps` mini-batches in all, each taken by whichever replica is free (lockstep
        modes: rounded up to whole rounds, `ReplicaManager.steps_to_run`). The history's
        losses: in the lockstep modes (bsp, allreduce) a round's mean over its replicas, at the
        steps run by the end of that round, so the last one is the last round's mean; in the
        asynchronous modes, the loss of the step that finished at that point in time (the
        last one: whichever replica's step finished last)."""
        seen = {r: len(losses) for r, losses in self.manager.record.losses.items()}
        with Progress(self.manager.steps_to_run(steps), "train", enabled=progress) as bar:
            def report(done: int, loss: float) -> None:
                bar.update(done - bar.done, loss=loss)
            record = self.manager.fit(batches, steps, progress=report)
        self.step_count += record.steps_run
        new = {r: losses[seen.get(r, 0):] for r, losses in record.losses.items()}
        if self.manager.options.mode in LOCKSTEP:
            points = _round_means(new)
        else:
            merged = sorted(x for losses in new.values() for x in losses)
            points = [(i + 1, loss) for i, (_, _, loss) in enumerate(merged)]
        history = History()  # (of this fit: the record keeps every fit's losses)
        before = 0
        for i, (done, loss) in enumerate(points):
            if done // log_every > before // log_every or i == len(points) - 1:
                history.steps.append(done)
                history.losses.append(loss)
            before = done
        return history

    def _logits_of(self) -> Session:
        """A local session with the shards' parameters."""
        self.session.params.update(self.manager.params())
        return self.session

    def close(self) -> None:
        self.manager.close()


def _round_means(losses: dict[int, list[tuple[float, int, float]]]) -> list[tuple[int, float]]:
    """Lockstep replicas' (time, step, loss) records -> (steps run by the end of the round,
    the round's mean loss) per round: fsum, so the mean does not depend on which replica
    reported first (nor which took which of the round's batches)."""
    rounds: dict[int, list[float]] = {}
    for records in losses.values():
        for _, step, loss in records:
            rounds.setdefault(step, []).append(loss)
    points, done = [], 0
    for step in sorted(rounds):
        done += len(rounds[step])
        points.append((done, math.fsum(rounds[step]) / len(rounds[step])))
    return points
