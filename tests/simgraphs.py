"""Tiny graphs and a cost model of given node times, for the step simulator's and the
planners' tests."""

import graphflow as gf
from graphflow.costmodel import CostModel, Link

ROW = 4 * 1000  # bytes of one float32 row of width 1000


def chain_graph():
    """x -> a -> b -> c, each [N, 1000]."""
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 1000))
        c = gf.neg(gf.neg(gf.neg(x, name="a"), name="b"), name="c")
    return g, c


def fork_graph():
    """x -> a; a -> l1 -> l2; a -> r1 -> r2 (two independent branches after a)."""
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 1000))
        a = gf.neg(x, name="a")
        gf.neg(gf.neg(a, name="l1"), name="l2")
        gf.neg(gf.neg(a, name="r1"), name="r2")
    return g


def timed_model(times, bandwidth=ROW, latency=0.0):
    """Times in seconds per node name; a link that moves one batch-1 tensor per second; no
    CPU time on messages."""
    return CostModel(times=times, link=Link(bandwidth, latency), batch=1, message_cpu_s=0.0)


def two_workers():
    """x -> h on worker 1 -> loss on worker 0: a transfer each way."""
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 3))
        with gf.device("worker:1"):
            w = gf.parameter("w", (3,), init="normal", scale=1.0)
            h = gf.mul(x, w, name="h")
        loss = gf.reduce_sum(gf.square(h, name="sq"), name="loss")
    return g, loss
