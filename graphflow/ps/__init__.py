"""Sharded parameter server: parameters sliced across shards, updated where they live.

    >>> from graphflow.ps import Layout, PSClient, ShardThread, start_shard_process

layout.py (where each slice lives), shard.py + vectors.py (a shard's state and handlers),
checkpoint.py (atomic checkpoints), server.py (the RPC loop, a shard in a thread or its own
process), client.py (PSClient: fan-out by the layout, retries), `python -m graphflow.ps`.
"""

from graphflow.ps.client import PSClient, PSError
from graphflow.ps.layout import Layout, Slice
from graphflow.ps.server import (
    ShardProcess,
    ShardStartError,
    ShardThread,
    run_shard_process,
    serve,
    serve_shard,
    start_shard_process,
)
from graphflow.ps.shard import Shard, ShardError

__all__ = ["Layout", "PSClient", "PSError", "Shard", "ShardError", "ShardProcess",
           "ShardStartError", "ShardThread", "Slice", "run_shard_process", "serve",
           "serve_shard", "start_shard_process"]
