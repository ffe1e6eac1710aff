"""`gf.Cluster`'s Python API used wrongly, or after close: each mistake named as the caller
made it (as `gf.Session` names it), before any worker is asked, never a raw zmq error or a
worker blamed for the caller's feed."""

import contextlib
import time

import numpy as np
import pytest

import graphflow as gf
from graphflow.errors import GraphError, GraphflowError, MissingFeedError
from graphflow.partitioners import partition
from graphflow.runtime import Cluster, WorkerFailed
from graphflow.runtime.worker import Worker
from graphflow.train import PartitionedTrainer
from tests.spies import fail_step

SGD = {"name": "sgd", "lr": 0.05}
CLOSED = "the cluster is closed"


@pytest.fixture(scope="module")
def model():
    return gf.models.digits_lc(batch=None)


@pytest.fixture(scope="module")
def plan(model):
    return partition(model.graph, 2, "layerwise", loss=model.loss)


def batches(n, size=4):
    rng = np.random.default_rng(3)
    return [{"x": rng.standard_normal((size, 1, 32, 32)).astype(np.float32),
             "y": rng.integers(0, 10, size).astype(np.int32)} for _ in range(n)]


# -- close ------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_close_twice_is_fine_and_later_calls_say_the_cluster_is_closed(plan, mode):
    cluster = Cluster(plan, mode=mode, optimizer=SGD, timeout=60)
    cluster.step(batches(1)[0])
    cluster.close()
    cluster.close()
    for call in (lambda: cluster.step(batches(1)[0]), cluster.params, cluster.stats,
                 lambda: cluster.run(batches(1)[0], ["loss"]),
                 lambda: cluster.set_params({}), lambda: next(cluster.stream(batches(1)))):
        with pytest.raises(GraphflowError, match=CLOSED):
            call()


def test_a_with_block_after_close_says_the_cluster_is_closed(plan):
    cluster = Cluster(plan, timeout=60)
    with cluster:
        pass
    cluster.close()  # (after the with block's own)
    with pytest.raises(GraphflowError, match=CLOSED), cluster:
        pass


def test_a_partitioned_trainer_closes_twice(model):
    trainer = PartitionedTrainer(model, gf.optim.SGD(0.05), parts=2, strategy="layerwise")
    trainer.close()
    trainer.close()


# -- feeds and fetches ------------------------------------------------------------------------
def test_nodes_feed_and_fetch_as_their_names_do(model, plan):
    data = batches(2)
    outs = []
    for by_node in (False, True):
        with Cluster(plan, optimizer=SGD, timeout=60) as cluster:
            feeds = [{model.x: b["x"], model.y: b["y"]} if by_node else b for b in data]
            out = cluster.step(feeds[0])
            out.update(cluster.run(feeds[1], [model.loss, model.logits]))
            outs.append(out)
    assert sorted(outs[1]) == ["fc/add", "loss"]
    for name, value in outs[0].items():
        np.testing.assert_array_equal(outs[1][name], value, err_msg=name)


def test_one_fetch_alone_and_twice_is_fetched_once(model, plan):
    with Cluster(plan, timeout=60) as cluster:
        assert list(cluster.run(batches(1)[0], model.loss)) == ["loss"]
        assert list(cluster.run(batches(1)[0], ["loss", model.loss])) == ["loss"]


@pytest.mark.parametrize("extra, message", [
    ({"z": np.zeros(4, np.int32)}, r"no placeholder named 'z' in the plan to feed \(its "
                                   r"placeholders: 'x', 'y'\)"),
    ({"xx": np.zeros(4, np.int32)}, r"no placeholder named 'xx'.*did you mean 'x'\?"),
    ({"relu": np.zeros(4, np.float32)}, r"cannot feed 'relu': it is a relu, and a cluster's "
                                        r"workers are fed placeholders only"),
])
def test_an_unknown_feed_is_refused_by_name(plan, extra, message):
    with Cluster(plan, timeout=60) as cluster:
        with pytest.raises(GraphError, match=message):
            cluster.step({**batches(1)[0], **extra})
        assert cluster.step_count == 0  # no worker was asked


def test_an_unknown_fetch_is_refused_with_a_suggestion(plan):
    with Cluster(plan, timeout=60) as cluster:
        with pytest.raises(GraphError, match=r"no node named 'los' in the plan to fetch; did "
                                             r"you mean 'loss'\?"):
            cluster.run(batches(1)[0], ["los"])


def test_a_missing_placeholder_is_named_at_the_driver(model, plan):
    with Cluster(plan, timeout=60) as cluster:
        with pytest.raises(MissingFeedError, match=r"placeholder 'y' .*is not fed, but the "
                                                   r"plan's workers read it .*expected an "
                                                   r"int32 array of shape \(N,\)"):
            cluster.step({"x": batches(1)[0]["x"]})
        cluster.step(batches(1)[0])  # the workers were not disturbed


def test_a_node_of_another_graph_is_refused(plan):
    with gf.Graph():
        other_x = gf.placeholder("x", (None, 3))
        w = gf.placeholder("w", (None, 3))
    data = batches(1)[0]
    with Cluster(plan, timeout=60) as cluster:
        with pytest.raises(GraphError, match=r"placeholder 'x' .*is a feed, but the plan has "
                                             r"a different node of that name"):
            cluster.step({other_x: data["x"], "y": data["y"]})
        with pytest.raises(GraphError, match=r"placeholder 'w' .*is a fetch, but the plan has "
                                             r"no node 'w': the node is of another graph"):
            cluster.run(data, [w])
        with pytest.raises(GraphError, match="fetches must be nodes or node names, got int 3"):
            cluster.run(data, 3)


def test_gradients_of_a_plan_without_a_loss_say_so(model):
    with Cluster(partition(model.graph, 2, "layerwise"), timeout=60) as cluster:
        with pytest.raises(GraphflowError, match=r"the plan has no loss.*partition with "
                                                 r"loss=\.\.\."):
            cluster.gradients(batches(1)[0])


# -- options ----------------------------------------------------------------------------------
@pytest.mark.parametrize("options, message", [
    ({"microbatches": 0}, "microbatches must be an int >= 1, got 0"),
    ({"microbatches": -1}, "microbatches must be an int >= 1, got -1"),
    ({"microbatches": 2.5}, "microbatches must be an int >= 1, got 2.5"),
    ({"microbatches": "two"}, "microbatches must be an int >= 1, got 'two'"),
    ({"mode": "remote"}, r"mode='remote' needs hosts=\[\.\.\.\]"),
    ({"mode": "cloud"}, "unknown mode 'cloud': threads, processes or remote"),
    ({"timeout": -1}, "timeout must be a number of seconds > 0, got -1"),
    ({"timeout": 0}, "timeout must be a number of seconds > 0, got 0"),
    ({"connect_timeout": 0}, "connect_timeout must be a number of seconds > 0, got 0"),
])
def test_bad_options_are_refused_naming_the_option_and_value(plan, options, message):
    with pytest.raises(ValueError, match=message):
        Cluster(plan, **options)


@pytest.mark.parametrize("microbatches", ["two", 0, 1.5])
def test_a_partitioned_trainer_refuses_bad_microbatches(model, microbatches):
    with pytest.raises(ValueError, match=f"microbatches must be an int >= 1 or 'auto', got "
                                         f"{microbatches!r}"):
        PartitionedTrainer(model, gf.optim.SGD(0.05), parts=2, strategy="layerwise",
                              microbatches=microbatches)


# -- a stream whose batches fail --------------------------------------------------------------
def failing_after(data, error):
    yield from data
    raise error


def test_steps_sent_before_the_batches_fail_finish_first(plan, monkeypatch):
    run_step, done = Worker._run_step, []

    def slow(self, feeds, fetches, step, *args, **kwargs):
        time.sleep(0.3 * (step == 1))  # the batches fail while step 1 still runs
        out = run_step(self, feeds, fetches, step, *args, **kwargs)
        done.append((self.index, step))
        return out

    data = batches(3)
    with Cluster(plan, optimizer=SGD, timeout=60) as want:
        for b in data[:2]:
            want.step(b)
        expected = want.params()
    monkeypatch.setattr(Worker, "_run_step", slow)
    with Cluster(plan, optimizer=SGD, timeout=60) as cluster:
        with pytest.raises(OSError, match="the data went away"):
            next(cluster.stream(failing_after(data[:2], OSError("the data went away")),
                                ahead=2))
        assert sorted(done) == [(0, 0), (0, 1), (1, 0), (1, 1)]  # answered, before the raise
        assert cluster.step_count == 2
        got = cluster.params()
        cluster.step(data[2])
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_a_refused_batch_in_a_stream_lets_the_steps_sent_finish(plan):
    data = batches(2)
    with Cluster(plan, optimizer=SGD, timeout=60) as cluster:
        with pytest.raises(MissingFeedError, match="placeholder 'y'"):
            list(cluster.stream([*data, {"x": data[0]["x"]}], ahead=2))
        assert cluster.step_count == 2
        assert np.isfinite(cluster.step(data[0])["loss"])


def test_a_sent_steps_failure_is_raised_chained_to_the_batches_error(plan, monkeypatch):
    fail_step(monkeypatch)  # worker 1, step 1
    with Cluster(plan, optimizer=SGD, timeout=60) as cluster:
        steps = cluster.stream(failing_after(batches(2), OSError("the data went away")),
                               ahead=2)
        with pytest.raises(WorkerFailed, match="step 1 fails") as failure:
            with contextlib.closing(steps):
                next(steps)
        assert failure.value.worker == "worker:1"
        assert any(isinstance(e, OSError) for e in contexts(failure.value))


def contexts(error):
    """The exceptions `error` was raised while handling, innermost first."""
    while (error := error.__context__) is not None:
        yield error
