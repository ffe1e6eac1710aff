"""Run timelines: spans of every worker's kernels, sends, receives and PS calls, written in the
Chrome trace-event format (Perfetto, chrome://tracing) and drawn as a PNG Gantt chart.

    from graphflow.trace import recording
    with recording("run.json"):              # clusters stepping inside are traced
        trainer.fit(batches, steps=5)

    graphflow timeline run.json -o run.png   # the chart (needs matplotlib)

recorder.py keeps a process's spans, session.py gathers them at the driver onto one clock,
chrome.py writes / reads / validates the JSON, summary.py measures how much of each step the
spans cover, gantt.py draws, command.py is `graphflow timeline`.
"""

from graphflow.trace.chrome import TraceError, read, validate
from graphflow.trace.session import current, driver_span, recording

__all__ = ["TraceError", "current", "driver_span", "read", "recording", "validate"]
