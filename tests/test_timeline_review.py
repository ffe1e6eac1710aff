"""A user's review of `graphflow timeline`: the summary's totals are of the steps it counts
(--last-steps, or all but the compiling first), a trace of one process gets a step's medians,
options that would be ignored and outputs that would overwrite the trace or are not PNGs are
usage errors (exit 2)."""

from __future__ import annotations

import argparse
import json

import pytest

from graphflow.trace.chrome import Track, document
from graphflow.trace.command import configure, run
from graphflow.trace.recorder import EXECUTOR
from graphflow.trace.summary import coverage, driver_alone, report

# A step's kernel: 1 s in the first (compiling), 40 ms after; the steps 100 ms but the first
STEPS = [(1.0, 2.1), (2.2, 2.3), (2.4, 2.52), (2.6, 2.7)]


def kernel_ms(k: int) -> float:
    return 1000.0 if k == 0 else 40.0 + k  # 41, 42, 43: each step's own


def one_process_doc():
    """`graphflow train digits-lc --trace`: the driver runs the kernels, its steps name no
    cluster."""
    spans = []
    for k, (a, b) in enumerate(STEPS):
        spans.append(("MainThread", "step", f"step {k}", a, b, {"step": k}))
        spans.append(("MainThread", "kernel", "fc/matmul", a + 0.001,
                      a + 0.001 + kernel_ms(k) / 1e3, {"op": "matmul"}))
    return document([Track(0, "driver", spans, {"role": "driver"})], t0=0.9)


def cluster_doc():
    """A driver timing STEPS of one worker that runs a kernel and awaits the next step."""
    driver, worker = [], []
    for k, (a, b) in enumerate(STEPS):
        driver.append(("MainThread", "step", f"step {k}", a, b, {"cluster": 0, "step": k}))
        worker += [(EXECUTOR, "idle", "await step", a - 0.05, a + 0.002, None),
                   (EXECUTOR, "kernel", "fc/matmul", a + 0.002, a + 0.002 + kernel_ms(k) / 1e3,
                    {"op": "matmul"}),
                   (EXECUTOR, "rpc", "step reply", b - 0.004, b, None)]
    return document([Track(0, "driver", driver, {"role": "driver"}),
                     Track(1, "worker 0", worker, {"role": "worker", "cluster": 0, "worker": 0})],
                    t0=0.9)


def args(*argv):
    p = argparse.ArgumentParser(prog="graphflow timeline")
    configure(p)
    return p.parse_args([str(a) for a in argv])


@pytest.fixture
def trace(tmp_path):
    def write(doc, name="run.json"):
        path = tmp_path / name
        path.write_text(json.dumps(doc))
        return path
    return write


# -- 3. the totals are of the steps counted ----------------------------------------------------
def test_a_workers_totals_leave_out_what_the_summary_leaves_out():
    (c,) = coverage(cluster_doc())
    assert c["steps"] == 3 and c["category_ms"]["kernel"] == pytest.approx(41 + 42 + 43)
    (c,) = coverage(cluster_doc(), last_steps=1)
    assert c["category_ms"]["kernel"] == pytest.approx(43)
    # the wait for a step counts only inside the step (2 ms of it; 50 ms before it started)
    assert c["category_ms"]["idle"] == pytest.approx(2, abs=1e-3)
    text = report(cluster_doc(), last_steps=2)
    assert "in those steps: kernel 85.0 ms" in text and "1041" not in text, text


def test_a_one_process_trace_gets_a_steps_medians(trace, capsys):
    doc = one_process_doc()
    assert driver_alone(doc) == {"steps": 3, "left_out": 1,
                                 "ms_per_step": {"step": pytest.approx(100.0),
                                                 "kernel": pytest.approx(42.0)}}
    assert driver_alone(cluster_doc()) is None
    path = trace(doc)
    assert run(args(path, "--no-png")) == 0
    out = capsys.readouterr().out
    assert out.startswith("driver (no workers), a step: step 100.0 ms, kernel 42.0 ms (median "
                          "of 3 steps, the first left out)"), out
    assert run(args(path, "--no-png", "--last-steps", 2)) == 0
    assert "step 110.0 ms, kernel 42.5 ms (median of the last 2 steps)" in \
        capsys.readouterr().out
    assert run(args(path, "--no-png", "--json", "--last-steps", 2)) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["workers"] == [] and summary["driver_alone"]["steps"] == 2
    assert summary["driver_alone"]["ms_per_step"]["kernel"] == pytest.approx(42.5)


# -- 6. options that would be ignored ----------------------------------------------------------
@pytest.mark.parametrize("argv,message", [
    (["--last-steps", "2", "--window", "0:10"], "--window and --last-steps both pick what to "
                                                "draw"),
    (["--no-png", "-o", "x.png"], "--output names the chart, and --no-png draws nothing"),
    (["--no-png", "--title", "t"], "--title titles the chart, and --no-png draws nothing"),
    (["--no-png", "--window", "0:10"], "--window picks what to draw"),
])
def test_options_that_would_be_ignored_are_usage_errors(cli_here, trace, tmp_path, argv,
                                                        message):
    path = trace(cluster_doc())
    code, out, err = cli_here("timeline", path, *argv)
    assert code == 2 and err.startswith(f"graphflow timeline: error: {message}"), err
    assert len(err.splitlines()) == 1 and out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]  # nothing drawn


# -- 8. / 9. / 10. the output ------------------------------------------------------------------
def test_the_trace_is_never_overwritten_by_its_chart(cli_here, trace):
    path = trace(cluster_doc(), name="trace.png")  # a trace with a picture's name
    before = path.read_bytes()
    code, _, err = cli_here("timeline", path)
    assert code == 2 and "ends in .png, where the chart would go; give -o FILE" in err, err
    code, _, err = cli_here("timeline", path, "-o", path.parent / "." / "trace.png")
    assert code == 2 and "that is the trace itself" in err, err
    assert path.read_bytes() == before


@pytest.mark.parametrize("name", ["x.txt", "x.svg", "x"])
def test_an_output_that_is_not_a_png_is_a_usage_error(cli_here, trace, tmp_path, name):
    code, _, err = cli_here("timeline", trace(cluster_doc()), "-o", tmp_path / name)
    assert code == 2 and "the chart is a PNG; give a file name ending in .png" in err, err
    assert not (tmp_path / name).exists()


def test_outputs_in_new_folders_and_under_files_as_visualize_takes_them(cli_here, trace,
                                                                         tmp_path):
    pytest.importorskip("matplotlib")
    path = trace(cluster_doc())
    (tmp_path / "file").write_text("")
    code, _, err = cli_here("timeline", path, "-o", tmp_path / "file" / "x.png")
    assert code == 2 and "is not a directory" in err, err  # argtypes.output_file
    out = tmp_path / "new" / "x.png"
    code, _, err = cli_here("timeline", path, "-o", out)  # (visualize makes them too)
    assert code == 0 and out.read_bytes()[:4] == b"\x89PNG", err
