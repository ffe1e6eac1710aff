"""Running plans: a Worker executes one subgraph (its Mailbox moves its tensors); a
WorkerService exposes it over RPC; a Cluster (the driver) starts or reaches the workers and
runs training steps on them."""

from graphflow.runtime.calls import WorkerFailed
from graphflow.runtime.cluster import Cluster
from graphflow.runtime.mailbox import StepFailed
from graphflow.runtime.worker import Worker

__all__ = ["Cluster", "StepFailed", "Worker", "WorkerFailed"]
