"""The step simulator (graphflow/stepsim.py) through `CostModel.predict`: list-scheduling
predictions on tiny graphs with injected times, the links, messages and updates."""

import numpy as np
import pytest

import graphflow as gf
from graphflow.costmodel import CostModel, Link
from tests.simgraphs import ROW, chain_graph, fork_graph, timed_model


def test_chain_on_one_worker_is_the_sum_of_times():
    g, _ = chain_graph()
    cm = timed_model({"a": 1.0, "b": 2.0, "c": 4.0})
    p = cm.predict(g, dict.fromkeys(["x", "a", "b", "c"], 0))
    assert p.step_seconds == pytest.approx(7.0)
    assert p.busy == [pytest.approx(7.0)] and p.transfers == []


def test_independent_branches_overlap():
    g = fork_graph()
    cm = timed_model({"a": 1.0, "l1": 2.0, "l2": 2.0, "r1": 3.0, "r2": 3.0}, bandwidth=1e18)
    one = cm.predict(g, {n.name: 0 for n in g})
    assert one.step_seconds == pytest.approx(11.0)
    placement = {"x": 0, "a": 0, "l1": 0, "l2": 0, "r1": 1, "r2": 1}
    two = cm.predict(g, placement)
    assert two.step_seconds == pytest.approx(1.0 + max(4.0, 6.0))
    assert two.busy == [pytest.approx(5.0), pytest.approx(6.0)]


def test_contention_slows_only_the_time_two_workers_compute_at_once():
    g = fork_graph()
    cm = timed_model({"a": 1.0, "l1": 2.0, "l2": 2.0, "r1": 3.0, "r2": 3.0}, bandwidth=1e18)
    placement = {"x": 0, "a": 0, "l1": 0, "l2": 0, "r1": 1, "r2": 1}
    # after a (1 s, alone), l1 l2 (4 s) run beside r1 r2 (6 s): the first 4 s of each are
    # shared, so l1 l2 take 1.5x as long and r1 (3 s) too, r2 for 1 of its 3 s
    two = cm.predict(g, placement, contention=1.5)
    assert two.busy == [pytest.approx(1.0 + 6.0), pytest.approx(4.5 + 3.0 * (1 + 0.5 / 3))]
    assert two.step_seconds == pytest.approx(1.0 + 4.5 + 3.5)
    # a chain across workers never computes on two at once: nothing slows down
    chain, _ = chain_graph()
    cm = timed_model({"a": 1.0, "b": 1.0, "c": 1.0}, bandwidth=1e18)
    split = {"x": 0, "a": 0, "b": 1, "c": 0}
    assert cm.predict(chain, split, contention=2.0).step_seconds == pytest.approx(3.0)


def test_cut_edge_adds_the_transfer_time():
    g, _ = chain_graph()
    cm = timed_model({"a": 1.0, "b": 2.0, "c": 4.0}, latency=0.5)
    p = cm.predict(g, {"x": 0, "a": 0, "b": 1, "c": 1})
    assert p.step_seconds == pytest.approx(1.0 + 1.5 + 2.0 + 4.0)
    (t,) = p.transfers
    assert (t.tensor, t.src, t.dst, t.nbytes) == ("a", 0, 1, ROW)
    assert t.seconds == pytest.approx(1.5) and t.start == pytest.approx(1.0)
    assert p.bytes_out == [ROW, 0] and p.bytes_in == [0, ROW]


def test_a_message_costs_both_ends_cpu_without_delaying_an_idle_receiver():
    # a -> b across workers, the link 0.5 s: the sender spends 0.2 s on the message after a,
    # the receiver 0.2 s before the tensor is there (within the link's time: it was idle)
    g, _ = chain_graph()
    cm = timed_model({"a": 1.0, "b": 2.0, "c": 4.0}, bandwidth=1e18, latency=0.5)
    cm.message_cpu_s = 0.2
    p = cm.predict(g, {"x": 0, "a": 0, "b": 1, "c": 1})
    assert p.step_seconds == pytest.approx(1.0 + 0.5 + 2.0 + 4.0)
    assert p.busy == [pytest.approx(1.2), pytest.approx(6.2)]
    # a message that costs more CPU than the link's time delays its tensor by the difference
    cm.message_cpu_s = 0.7
    assert cm.predict(g, {"x": 0, "a": 0, "b": 1, "c": 1}).step_seconds == \
        pytest.approx(1.0 + 0.7 + 2.0 + 4.0)


def test_on_a_shared_link_the_sender_copies_the_bytes_before_its_next_node():
    # a (1 s) on worker 0 is read by b on worker 1 and by c on worker 0: copying a's tensor
    # (one ROW at ROW bytes/s: 1 s) holds worker 0 before c, and the tensor leaves copied
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 1000))
        a = gf.neg(x, name="a")
        gf.neg(a, name="b")
        gf.neg(a, name="c")
    placement = {"x": 0, "a": 0, "b": 1, "c": 0}
    times = {"a": 1.0, "b": 2.0, "c": 4.0}
    p = CostModel(times=times, link=Link(ROW, 0.5, shared=True), batch=1,
                  message_cpu_s=0.0).predict(g, placement)
    assert p.busy == [pytest.approx(1.0 + 1.0 + 4.0), pytest.approx(2.0)]
    assert p.step_seconds == pytest.approx(6.0)
    (t,) = p.transfers
    assert t.start == pytest.approx(2.0) and t.seconds == pytest.approx(0.5)  # latency alone
    # the same link between machines: the bytes are on the wire, the sender goes on at once
    p = timed_model(times, latency=0.5).predict(g, placement)
    assert p.busy == [pytest.approx(5.0), pytest.approx(2.0)]
    assert p.transfers[0].seconds == pytest.approx(1.5)


def test_a_busy_receiver_pays_for_a_message_before_the_next_node_on_it():
    # worker 1 computes r1 (3 s) while a's tensor arrives at 1 s: it takes in the message
    # (0.25 s) after r1, then l1 (ready since 1 s) before r2 (ready at 3 s)
    cm = timed_model({"a": 1.0, "l1": 2.0, "l2": 2.0, "r1": 3.0, "r2": 3.0}, bandwidth=1e18)
    cm.message_cpu_s = 0.25
    with gf.Graph() as solo:  # r1 needs no input from worker 0: a constant's negation
        c = gf.constant(np.ones((1, 1000), np.float32), name="c")
        a = gf.neg(c, name="a")
        gf.neg(gf.neg(a, name="l1"), name="l2")
        gf.neg(gf.neg(c, name="r1"), name="r2")
    p = cm.predict(solo, {"c": 0, "a": 0, "l1": 1, "l2": 1, "r1": 1, "r2": 1})
    # worker 1: r1 0-3, the receipt 3-3.25, l1 3.25-5.25, r2 5.25-8.25, l2 8.25-10.25;
    # worker 0: a, then its 0.25 s on the send
    assert p.busy == [pytest.approx(1.25), pytest.approx(10.25)]
    assert p.step_seconds == pytest.approx(10.25)


def test_transfer_to_two_consumers_on_one_worker_is_sent_once():
    g = fork_graph()
    cm = timed_model({"a": 1.0, "l1": 2.0, "l2": 2.0, "r1": 3.0, "r2": 3.0})
    p = cm.predict(g, {"x": 0, "a": 0, "l1": 1, "l2": 1, "r1": 1, "r2": 1})
    assert [(t.tensor, t.dst) for t in p.transfers] == [("a", 1)]
    assert p.step_seconds == pytest.approx(1.0 + 1.0 + 10.0)


def test_sends_out_of_one_worker_serialise():
    g = fork_graph()
    cm = timed_model({"a": 1.0, "l1": 1.0, "l2": 1.0, "r1": 1.0, "r2": 1.0})
    p = cm.predict(g, {"x": 0, "a": 0, "l1": 1, "l2": 1, "r1": 2, "r2": 2})
    starts = sorted(t.start for t in p.transfers)
    assert starts == [pytest.approx(1.0), pytest.approx(2.0)]  # second waits for the first
    assert p.step_seconds == pytest.approx(3.0 + 2.0)


def test_sends_in_a_row_serialise_their_bytes_but_overlap_their_latency():
    g = fork_graph()
    cm = timed_model({"a": 1.0, "l1": 1.0, "l2": 1.0, "r1": 1.0, "r2": 1.0}, latency=0.5)
    p = cm.predict(g, {"x": 0, "a": 0, "l1": 1, "l2": 1, "r1": 2, "r2": 2})
    first, second = sorted(p.transfers, key=lambda t: t.start)
    assert (first.start, first.seconds) == (pytest.approx(1.0), pytest.approx(1.5))
    assert (second.start, second.seconds) == (pytest.approx(2.0), pytest.approx(1.5))
    assert p.step_seconds == pytest.approx(3.5 + 2.0)


def test_messages_into_one_worker_queue_on_its_link():
    with gf.Graph() as g:  # workers 1 and 2 each send worker 0 a part at once: a gather
        x = gf.placeholder("x", (None, 1000))
        gf.add(gf.neg(x, name="p1"), gf.exp(x, name="p2"), name="s")
    cm = timed_model({"p1": 1.0, "p2": 1.0, "s": 1.0}, latency=0.25)
    p = cm.predict(g, {"x": 0, "p1": 1, "p2": 2, "s": 0})
    assert sorted(t.start + t.seconds for t in p.transfers) == [pytest.approx(2.25),
                                                                pytest.approx(3.25)]
    assert p.step_seconds == pytest.approx(3.25 + 1.0)
    assert p.bytes_in == [2 * ROW, 0, 0]


def test_a_link_takes_in_a_message_in_the_first_gap_after_it_arrives():
    from graphflow.stepsim import _Inbox

    inbox = _Inbox()  # messages are simulated out of time order: later ones may come first
    assert inbox.take(5.0, 1.0) == 6.0
    assert inbox.take(0.0, 2.0) == 2.0  # before the first, which it does not delay
    assert inbox.take(1.0, 2.0) == 4.0  # after the second, in the gap before the first
    assert inbox.take(3.0, 2.0) == 8.0  # no gap of 2 s left before 6
    assert inbox.busy == [(0.0, 2.0), (2.0, 4.0), (5.0, 6.0), (6.0, 8.0)]


def test_a_worker_runs_what_a_peer_waits_for_first_as_the_runtime_does():
    with gf.Graph() as g:  # h comes first in graph order, but b on worker 0 waits for a
        x = gf.placeholder("x", (None, 1000))
        gf.neg(x, name="h")
        gf.neg(gf.neg(x, name="a"), name="b")
    cm = timed_model({"h": 10.0, "a": 1.0, "b": 1.0})
    p = cm.predict(g, {"x": 0, "h": 1, "a": 1, "b": 0})
    assert p.transfers[0].start == pytest.approx(1.0)  # a, then h
    assert p.step_seconds == pytest.approx(1.0 + 10.0)
    assert p.finish == [pytest.approx(3.0), pytest.approx(11.0)]


def test_a_pending_receive_does_not_hold_up_independent_nodes():
    with gf.Graph() as g:  # b waits for a from worker 1; c, after b in graph order, runs first
        x = gf.placeholder("x", (None, 1000))
        a, d = gf.neg(x, name="a"), gf.neg(x, name="d")
        gf.neg(a, name="b")
        gf.neg(d, name="c")
    assert [n.name for n in g.toposort()] == ["x", "a", "d", "b", "c"]
    cm = timed_model({"a": 5.0, "b": 1.0, "c": 3.0, "d": 0.5})
    p = cm.predict(g, {"x": 0, "a": 1, "b": 0, "c": 0, "d": 0})
    assert p.step_seconds == pytest.approx(5.0 + 1.0 + 1.0)  # a, its transfer, b


def test_placeholders_are_local_and_parameters_are_sent_from_their_owner():
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 1000))
        w = gf.parameter("w", (1000,))
        gf.mul(x, w, name="m")
    cm = timed_model({"m": 1.0})
    p = cm.predict(g, {"x": 0, "w": 0, "m": 1})
    assert [t.tensor for t in p.transfers] == ["w"]
    assert p.step_seconds == pytest.approx(1.0 + 1.0)


def test_each_worker_ends_with_the_update_of_its_parameters_at_the_measured_rate():
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 1000))
        w = gf.parameter("w", (1000,))
        gf.mul(x, w, name="m")
    # an update makes three passes over the parameter's 4000 bytes: 12000 bytes a second,
    # after its call (a quarter of a second here)
    cm = CostModel(times={"m": 1.0}, update_Bps=3 * ROW, bandwidth_Bps=1.0, batch=1,
                   update_call_s=0.25)
    p = cm.predict(g, {"x": 0, "w": 0, "m": 0})
    assert p.step_seconds == pytest.approx(1.0 + 0.25 + 1.0)
    assert p.busy == [pytest.approx(2.25)]


def test_updates_of_workers_on_one_machine_share_its_memory():
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 1000))
        w0, w1 = gf.parameter("w0", (1000,)), gf.parameter("w1", (1000,))
        gf.mul(x, w0, name="m0")
        gf.mul(x, w1, name="m1")
    place = {"x": 0, "w0": 0, "m0": 0, "w1": 1, "m1": 1}
    # alone an update takes 1 s; two at once go at half the rate each
    cm = CostModel(times={"m0": 1.0, "m1": 1.0}, update_Bps=3 * ROW,
                   update_shared_Bps=1.5 * ROW, bandwidth_Bps=1.0, batch=1, update_call_s=0)
    assert cm.predict(g, place, contention=1.5).busy == [pytest.approx(1.5 + 2.0)] * 2
    # on two machines (no contention) each update runs alone
    assert cm.predict(g, place).busy == [pytest.approx(2.0)] * 2
    # staggered: only the overlapping half of each update is slowed
    cm.times["m1"] = 1.5
    assert cm.predict(g, place, contention=1.0 + 1e-9).busy == [
        pytest.approx(1.0 + 1.5), pytest.approx(1.5 + 1.5)]
    # a shared rate measured above the lone one (noise) never shortens an update
    noisy = CostModel(update_Bps=20e9, update_shared_Bps=30e9)
    assert noisy.concurrent_updates([0.0, 0.0], [1.0, 1.0]) == [1.0, 1.0]


def test_a_stream_of_steps_overlaps_them_each_worker_starting_when_its_own_step_ends():
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 1000))
        gf.add(gf.neg(x, name="a"), gf.neg(x, name="c"), name="d")
    cm = timed_model({"a": 1.0, "c": 3.0, "d": 1.0}, bandwidth=1e18)
    placement = {"x": 0, "a": 0, "c": 1, "d": 0}
    # one step: worker 0 runs a, waits for c (3 s) and runs d: 4 s. In a stream, worker 1
    # starts its next c as soon as it has sent this one, so a step takes its 3 s
    assert cm.predict(g, placement).step_seconds == pytest.approx(4.0)
    assert cm.stream_seconds(g, placement) == pytest.approx(3.0)
    assert cm.stream_seconds(g, dict.fromkeys(placement, 0)) == pytest.approx(5.0)


def test_a_node_whose_only_worker_inputs_are_parameters_runs_once():
    # m reads the input and a parameter: it is ready once the parameter is (it was queued a
    # second time as well, so it ran twice and the step's last node never ran)
    with gf.Graph() as g:
        x = gf.placeholder("x", (None, 1000))
        w = gf.parameter("w", (1000,))
        gf.neg(gf.mul(x, w, name="m"), name="n")
    cm = timed_model({"m": 1.0, "n": 2.0})
    p = cm.predict(g, dict.fromkeys(["x", "w", "m", "n"], 0))
    assert p.step_seconds == pytest.approx(3.0, abs=1e-3)  # (and w's update, microseconds)
    assert p.busy == [pytest.approx(3.0, abs=1e-3)]


@pytest.mark.parametrize("strategy", ["spatial", "layerwise", "mincut"])
@pytest.mark.parametrize("parts", [2, 3])
def test_every_node_of_a_real_plan_runs_once_on_its_worker(strategy, parts):
    from graphflow import stepsim

    model = gf.models.digits_lc(batch=8)
    plan = gf.partition(model.graph, parts, strategy, loss=model.loss)
    where = {n: plan.placement[n.name] for n in plan.graph.nodes}
    layout = stepsim.Layout.of(plan.graph, where)
    costs = stepsim.Costs(node_seconds=lambda n: 1e-3, nbytes=lambda n: 1000,
                          link=Link(1e9, 1e-4), updates=lambda ends, alone: alone,
                          update_seconds=lambda p: 0.0)
    p, spans = stepsim.simulate(layout, costs)
    assert sorted(n.name for n in spans) == sorted(n.name for n in layout.computed)
    assert all(spans[n][0] == where[n] for n in spans)
    per_worker = [sum(where[n] == w for n in layout.computed) for w in range(parts)]
    assert p.busy == [pytest.approx(k * 1e-3) for k in per_worker]
