"""The trace format and tools without running a model: recorder, trace-event JSON and its
validation, the step-coverage summary, the clock-offset estimate, the Gantt PNG, the command."""

import argparse
import gc
import json
import sys

import numpy as np
import pytest

from graphflow.trace import TraceError, read, recording, validate
from graphflow.trace import session as tracing
from graphflow.trace.chrome import Track, document, events
from graphflow.trace.command import configure, run
from graphflow.trace.recorder import (
    EXECUTOR,
    SEND,
    Recorder,
    activate,
    bind_thread,
    deactivate,
    pack,
    unpack,
)
from graphflow.trace.session import estimate_offset
from graphflow.trace.summary import coverage, covered


def sample_doc(gap=0.004):
    """A driver timing two 100 ms steps of one worker whose executor spans leave `gap` s of
    each step uncovered."""
    def step(t):
        return [(EXECUTOR, "idle", "await step", t - 0.01, t + 0.002, None),
                (EXECUTOR, "kernel", "lc1/local2d", t + 0.002, t + 0.05, {"op": "local2d"}),
                (EXECUTOR, "recv", "recv wait", t + 0.05, t + 0.07, {"keys": ["k"]}),
                (EXECUTOR, "kernel", "grad/lc1/x", t + 0.07, t + 0.096 - gap, {"op": "x"}),
                (EXECUTOR, "rpc", "step reply", t + 0.096 - gap, t + 0.096, None),
                (SEND, "send", "k", t + 0.03, t + 0.031, {"to": "worker:1", "bytes": 8})]
    driver = [("MainThread", "step", f"step {i}", t, t + 0.1, {"cluster": 0, "step": i})
              for i, t in enumerate((1.0, 1.2))]
    worker = step(1.0) + step(1.2)
    return document([Track(0, "driver", driver, {"role": "driver"}),
                     Track(1, "worker 0", worker, {"role": "worker", "cluster": 0, "worker": 0})],
                    t0=0.9)


def test_recorder_pack_round_trip_and_take_drains():
    rec = Recorder(limit=3)
    for i in range(5):
        rec.add(EXECUTOR if i % 2 else SEND, "kernel", f"n{i % 2}", i, i + 0.5,
                {"op": "x"} if i == 1 else None)
    assert rec.dropped == 2
    batch = rec.take()
    assert rec.spans == [] and rec.dropped == 0 and batch["dropped"] == 2
    assert len(batch["labels"]) == 2 and batch["times"].shape == (3, 2)
    assert unpack(batch) == [(SEND, "kernel", "n0", 0.0, 0.5, None),
                             (EXECUTOR, "kernel", "n1", 1.0, 1.5, {"op": "x"}),
                             (SEND, "kernel", "n0", 2.0, 2.5, None)]


def test_packed_spans_survive_the_rpc_encoding():
    from graphflow.transport.frames import decode_message, encode_message

    batch = pack([(EXECUTOR, "kernel", "a", 1.0, 2.0, {"op": "add"})] * 1000)
    frames = [bytes(f) if isinstance(f, bytes) else np.asarray(f).tobytes()
              for f in encode_message(batch)]
    assert unpack(decode_message(frames)) == unpack(batch)


def test_document_is_valid_trace_event_json():
    doc = json.loads(json.dumps(sample_doc()))
    validate(doc)
    names = {(e["name"], e["args"]["name"]) for e in doc["traceEvents"] if e["ph"] == "M"
             and "name" in e["args"]}
    assert {("process_name", "driver"), ("process_name", "worker 0"),
            ("thread_name", "executor"), ("thread_name", "send")} <= names
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
            assert e["dur"] >= 0 and e["ts"] >= 0
    kernel = next(e for e in events(doc) if e.name == "lc1/local2d")
    assert (kernel.process, kernel.thread, kernel.ts, kernel.dur) == \
        ("worker 0", "executor", 102000.0, 48000.0)


@pytest.mark.parametrize("bad, why", [
    ({"events": []}, "not a trace"),
    ({"traceEvents": [{"ph": "X", "name": "a", "ts": 0, "pid": 0, "tid": 0}]}, "dur"),
    ({"traceEvents": [{"ph": "X", "name": "a", "ts": float("nan"), "dur": 1, "pid": 0,
                       "tid": 0}]}, "finite ts"),
    ({"traceEvents": [{"ph": "X", "name": "a", "ts": 0, "dur": 1, "pid": "w", "tid": 0}]},
     "integers"),
    ({"traceEvents": [{"ph": "Q", "name": "a"}]}, "unknown phase"),
    ({"traceEvents": [{"ph": "M", "name": "colour", "pid": 0, "args": {}}]}, "metadata"),
])
def test_validate_names_what_is_wrong(bad, why):
    with pytest.raises(TraceError, match=why):
        validate(bad)


def test_read_accepts_the_array_form_and_rejects_non_json(tmp_path):
    path = tmp_path / "a.json"
    path.write_text(json.dumps([{"ph": "X", "name": "a", "ts": 0, "dur": 1, "pid": 0, "tid": 0}]))
    assert len(read(path)["traceEvents"]) == 1
    path.write_text("{not json")
    with pytest.raises(TraceError, match="not JSON"):
        read(path)


def test_coverage_counts_the_executor_thread_only_and_nested_spans_once():
    (c,) = coverage(sample_doc(gap=0.004))
    assert c["steps"] == 2 and c["step_ms"] == pytest.approx(100.0)
    # the step is covered but for the 4 ms gap; the send thread's span is not added in
    assert c["coverage"] == pytest.approx(0.96, abs=1e-6)
    assert c["compute"] == pytest.approx((0.048 + 0.022) / 0.1, abs=1e-6)
    spans = [e for e in events(sample_doc()) if e.thread == "executor"]
    inner = spans[1]._replace(name="gc", ts=spans[1].ts + 10, dur=5)  # inside a kernel
    assert covered(sorted([*spans, inner], key=lambda e: e.ts), 0, 1e9) == \
        covered(spans, 0, 1e9)


def test_clock_offset_from_the_fastest_round_trip():
    now = iter([0.0, 1.0, 10.0, 10.2, 20.0, 20.05])  # round trips of 1 s, 0.2 s, 0.05 s
    remote = iter([500.0, 505.1, 515.0])
    real = tracing.clock
    tracing.clock = lambda: next(now)
    try:
        offset, rtt = estimate_offset(lambda: next(remote), probes=3)
    finally:
        tracing.clock = real
    assert rtt == pytest.approx(0.05) and offset == pytest.approx(20.025 - 515.0)


def test_recording_none_is_off_and_a_session_never_outlives_its_block(tmp_path):
    with recording(None) as session:
        assert session is None and tracing.current() is None
    with recording(tmp_path / "t.json") as session:
        assert tracing.current() is session
        with pytest.raises(RuntimeError, match="already"):
            with recording(tmp_path / "u.json"):
                pass
        with tracing.driver_span("step", "step 0"):
            pass
    assert tracing.current() is None
    validate(json.loads((tmp_path / "t.json").read_text()))
    with tracing.driver_span("step", "after"):  # off: a null context
        pass
    assert [s[2] for s in session.driver.spans] == ["step 0"]


def test_garbage_collections_become_spans_only_while_a_recorder_is_live():
    rec = Recorder()
    activate(rec)
    bind_thread(rec, EXECUTOR)
    try:
        gc.collect()
    finally:
        bind_thread(None)
        deactivate(rec)
    assert any(s[1] == "gc" and s[0] == EXECUTOR for s in rec.spans)
    n = len(rec.spans)
    gc.collect()
    assert len(rec.spans) == n
    assert not any(getattr(cb, "__module__", "") == "graphflow.trace.recorder"
                   for cb in gc.callbacks)


def _args(*argv):
    p = argparse.ArgumentParser(prog="graphflow timeline")
    configure(p)
    return p.parse_args([str(a) for a in argv])


def test_timeline_command_writes_a_png_that_decodes(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    trace = tmp_path / "run.json"
    trace.write_text(json.dumps(sample_doc()))
    assert run(_args(trace, "--last-steps", "1")) == 0
    out = capsys.readouterr().out
    assert "worker 0: executor spans" in out and "wrote" in out
    image = imread(tmp_path / "run.png")
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 500
    assert float(np.std(image[..., :3])) > 0.05  # not blank
    assert run(_args(trace, "-o", tmp_path / "w.png", "--window", "100:250")) == 0
    assert (tmp_path / "w.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_timeline_command_summary_as_json_and_errors(tmp_path, capsys, monkeypatch):
    trace = tmp_path / "run.json"
    trace.write_text(json.dumps(sample_doc()))
    assert run(_args(trace, "--no-png", "--json")) == 0
    (worker,) = json.loads(capsys.readouterr().out)["workers"]
    assert worker["process"] == "worker 0" and worker["steps"] == 2
    with pytest.raises(SystemExit):
        _args(trace, "--window", "5:1")
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # as if not installed
    with pytest.raises(ImportError, match="matplotlib"):
        run(_args(trace))
    (tmp_path / "bad.json").write_text('{"traceEvents": 3}')
    with pytest.raises(TraceError):
        run(_args(tmp_path / "bad.json", "--no-png"))
