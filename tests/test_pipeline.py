"""Pipeline schedules as data, tested without processes."""

import pytest

from graphflow.runtime.pipeline import check_linear, schedule


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages,microbatches", [(1, 1), (2, 4), (4, 4), (4, 8), (3, 2)])
def test_every_stage_runs_each_microbatch_forward_then_backward(kind, stages, microbatches):
    for stage in range(stages):
        tasks = schedule(kind, stage, stages, microbatches)
        assert sorted(tasks) == sorted([(p, m) for p in "FB" for m in range(microbatches)])
        for m in range(microbatches):
            assert tasks.index(("F", m)) < tasks.index(("B", m))
        # micro-batches keep their order within each phase
        for phase in "FB":
            assert [m for p, m in tasks if p == phase] == list(range(microbatches))


def _alive(tasks):
    """Most micro-batches whose activations are held at once."""
    alive = peak = 0
    for phase, _ in tasks:
        alive += 1 if phase == "F" else -1
        peak = max(peak, alive)
    return peak


def test_1f1b_holds_at_most_stages_microbatches_gpipe_all():
    stages, microbatches = 4, 8
    for stage in range(stages):
        assert _alive(schedule("gpipe", stage, stages, microbatches)) == microbatches
        assert _alive(schedule("1f1b", stage, stages, microbatches)) == stages - stage


def test_last_stage_of_1f1b_alternates():
    assert schedule("1f1b", 2, 3, 3) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2),
                                         ("B", 2)]


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown schedule"):
        schedule("zigzag", 0, 2, 2)
    with pytest.raises(ValueError, match="stage 2 of 2"):
        schedule("gpipe", 2, 2, 2)
    with pytest.raises(ValueError, match="worker 1 to worker 0"):
        check_linear([("h->w0", 1, 0)])
    check_linear([("h->w1", 0, 1), ("grad/h->w0", 1, 0)])
