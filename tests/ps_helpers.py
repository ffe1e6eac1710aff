"""A shard for the parameter-server tests: one slice "w[0:6]" = 0..5, three replicas."""

import numpy as np

from graphflow.ps import Shard


def make_shard(replicas=(0, 1, 2), opt=None, **kw):
    """Shard 0 with w[0:6] = 0..5, Adagrad(0.1) unless `opt`, bsp deadline 5 s."""
    shard = Shard(0, **kw)
    shard.init({"w[0:6]": np.arange(6, dtype=np.float32)}, opt or {"name": "adagrad", "lr": 0.1},
               list(replicas), bsp_deadline=5.0)
    return shard
