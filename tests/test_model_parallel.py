"""A partitioned training step equals the single-process step: loss, every parameter gradient
and the parameters after a few SGD steps, for every strategy, 1-4 workers, threads and
processes."""

import numpy as np
import pytest

import graphflow as gf
from graphflow.partitioners import STRATEGIES, partition
from graphflow.runtime import Cluster

WORKLOADS = {"lc-large": (gf.models.lc_large, (3, 64, 64), 2),
             "speech-mlp": (gf.models.speech_mlp, (440,), 2),
             "digits-lc": (gf.models.digits_lc, (1, 32, 32), 4)}
_REFERENCE: dict = {}


def batch(workload, seed=0):
    _, shape, n = WORKLOADS[workload]
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((n, *shape)).astype(np.float32),
            "y": rng.integers(0, 10, n).astype(np.int32)}


def reference(workload):
    """Loss and gradients of the whole model in one process (cached per workload)."""
    if workload not in _REFERENCE:
        model = WORKLOADS[workload][0](batch=None)
        grads = gf.gradients(model.loss, model.graph.parameters())
        feeds = batch(workload)
        values = gf.Session(model.graph).run([model.loss, *grads.values()],
                                             {model.x: feeds["x"], model.y: feeds["y"]})
        _REFERENCE[workload] = (values[0], dict(zip(grads, values[1:])))
    return _REFERENCE[workload]


def assert_close(got, want, what):
    scale = float(np.abs(want).max()) + 1e-12
    err = float(np.abs(np.asarray(got) - want).max())
    assert err <= 1e-5 * scale, f"{what}: max error {err:.3g} vs scale {scale:.3g}"


def check_step(workload, strategy, parts, mode):
    loss, grads = reference(workload)
    model = WORKLOADS[workload][0](batch=None)
    plan = partition(model.graph, parts, strategy, loss=model.loss)
    with Cluster(plan, mode=mode, timeout=60) as cluster:
        out = cluster.gradients(batch(workload))
    assert_close(out.pop("loss"), loss, "loss")
    got = plan.assemble(out)
    assert set(got) == set(grads)
    for name, want in grads.items():
        assert_close(got[name], want, f"gradient of {name}")


@pytest.mark.parametrize("parts", [1, 2, 3, 4])
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_threads_step_equals_single_process(workload, strategy, parts):
    check_step(workload, strategy, parts, "threads")


@pytest.mark.parametrize("parts", [2, 4])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_processes_step_equals_single_process(strategy, parts):
    check_step("digits-lc", strategy, parts, "processes")


@pytest.mark.parametrize("workload", ["lc-large", "speech-mlp"])
def test_processes_big_models(workload):
    check_step(workload, "spatial", 2, "processes")


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("workload", ["digits-lc", "lc-large"])
def test_training_steps_give_the_same_parameters(workload, strategy):
    steps, lr = 3, 0.05
    model = WORKLOADS[workload][0](batch=None)
    trainer = gf.Trainer(model, gf.optim.SGD(lr))
    batches = [batch(workload, seed) for seed in range(steps)]
    for b in batches:
        trainer.step(b["x"], b["y"])
    plan = partition(WORKLOADS[workload][0](batch=None).graph, 3, strategy,
                     loss=model.loss)
    with Cluster(plan, optimizer={"name": "sgd", "lr": lr}, timeout=60) as cluster:
        for b in batches:
            cluster.step(b)
        got = plan.assemble(cluster.params())
    for name, want in trainer.session.params.items():
        assert_close(got[name], want, f"parameter {name} after {steps} steps")


# Adagrad's accumulator starts at 0.1 (TF's default): from 0, an element whose first gradient
# is a thousandth of the largest still moves by a whole lr, so rounding that is 1e-5 of the
# largest gradient became 2.4e-5 of lc2/W (the summation order differs between one batch and
# two micro-batches; seen on an AVX-512 machine). With 0.1: 1.5e-7.
@pytest.mark.parametrize("spec", [{"name": "sgd", "lr": 0.05},
                                  {"name": "momentum", "lr": 0.05, "momentum": 0.9},
                                  {"name": "adagrad", "lr": 0.05, "initial_accumulator": 0.1}],
                         ids=lambda s: s["name"])
def test_pipelined_training_steps_give_the_same_parameters(spec):
    # the update takes each gradient as a sum over micro-batches and its 1/m scale
    steps = 3
    model = WORKLOADS["digits-lc"][0](batch=None)
    trainer = gf.Trainer(model, gf.optim.OPTIMIZERS[spec["name"]](
        **{k: v for k, v in spec.items() if k != "name"}))
    batches = [batch("digits-lc", seed) for seed in range(steps)]
    for b in batches:
        trainer.step(b["x"], b["y"])
    plan = partition(WORKLOADS["digits-lc"][0](batch=None).graph, 2, "layerwise",
                     loss=model.loss)
    with Cluster(plan, optimizer=spec, microbatches=2, timeout=60) as cluster:
        for b in batches:
            cluster.step(b)
        got = plan.assemble(cluster.params())
    for name, want in trainer.session.params.items():
        assert_close(got[name], want, f"parameter {name} after {steps} steps")


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("parts", [2, 3])
@pytest.mark.parametrize("workload", ["speech-mlp", "digits-lc", "lc-large"])
def test_pipelined_layerwise_step_equals_single_process(workload, parts, schedule):
    loss, grads = reference(workload)
    model = WORKLOADS[workload][0](batch=None)
    plan = partition(model.graph, parts, "layerwise", loss=model.loss)
    with Cluster(plan, microbatches=2, schedule=schedule, timeout=60) as cluster:
        out = cluster.gradients(batch(workload))
    assert_close(out.pop("loss"), loss, "loss")
    got = plan.assemble(out)
    for name, want in grads.items():
        assert_close(got[name], want, f"gradient of {name}")


@pytest.mark.parametrize(("parts", "schedule", "mode"), [
    (2, "gpipe", "threads"), (2, "1f1b", "threads"), (3, "gpipe", "threads"),
    (3, "1f1b", "threads"), (2, "1f1b", "processes")])
def test_unequal_micro_batches_give_the_single_process_step(parts, schedule, mode):
    """4 rows in 3 micro-batches (2, 1, 1): each one's gradients weigh its rows, so the loss,
    the gradients and the parameters after SGD steps are the whole batch's."""
    loss, grads = reference("digits-lc")
    model = WORKLOADS["digits-lc"][0](batch=None)
    plan = partition(model.graph, parts, "layerwise", loss=model.loss)
    with Cluster(plan, mode=mode, optimizer={"name": "sgd", "lr": 0.05}, microbatches=3,
                 schedule=schedule, timeout=60) as cluster:
        out = cluster.gradients(batch("digits-lc"))
        assert_close(out.pop("loss"), loss, "loss")
        got = plan.assemble(out)
        for name, want in grads.items():
            assert_close(got[name], want, f"gradient of {name}")
        batches = [batch("digits-lc", seed) for seed in range(3)]
        for b in batches:
            cluster.step(b)
        got = plan.assemble(cluster.params())
    trainer = gf.Trainer(WORKLOADS["digits-lc"][0](batch=None), gf.optim.SGD(0.05))
    for b in batches:
        trainer.step(b["x"], b["y"])
    for name, want in trainer.session.params.items():
        assert_close(got[name], want, f"parameter {name} after 3 steps")


def test_a_batch_smaller_than_its_micro_batches_is_refused_before_the_workers_run():
    model = gf.models.digits_lc(batch=None)
    plan = partition(model.graph, 2, "layerwise", loss=model.loss)
    with Cluster(plan, microbatches=5, timeout=60) as cluster:
        with pytest.raises(ValueError, match="a batch of 4 rows cannot make 5 micro-batches"):
            cluster.step(batch("digits-lc"))
        assert cluster.step_count == 0


def test_pipelining_refuses_a_non_linear_plan_and_a_fixed_batch():
    model = gf.models.digits_lc()
    plan = partition(model.graph, 2, "spatial", loss=model.loss)
    with pytest.raises(ValueError, match="layerwise plan"):
        Cluster(plan, microbatches=2)
    model = gf.models.digits_lc(batch=32)
    plan = partition(model.graph, 2, "layerwise", loss=model.loss)
    with pytest.raises(ValueError, match="placeholder 'x' has a fixed one"):
        Cluster(plan, microbatches=2)


def test_each_tensor_crosses_once_per_destination_at_run_time():
    model = gf.models.lc_large(batch=None)
    plan = partition(model.graph, 3, "spatial", loss=model.loss)
    with Cluster(plan, timeout=60) as cluster:
        cluster.gradients(batch("lc-large"))
        stats = cluster.stats()
    sent = [key for s in stats for key in s["sent_keys"]]
    assert len(sent) == len(set(sent)) == len(plan.transfers)
    assert sum(s["bytes_sent"] for s in stats) == sum(t.nbytes(2) for t in plan.transfers)
