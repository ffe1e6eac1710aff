"""A trace as a PNG Gantt chart: one row per process and thread, one bar per span, coloured by
what it was (kernel, send, receive, PS call, idle). Needs matplotlib (optional in graphflow).

    doc = graphflow.trace.read("run.json")
    draw(doc, "run.png", last_steps=3)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from graphflow.trace.chrome import Event, events, process_order
from graphflow.trace.summary import coverage

COLOURS = {  # category -> colour (and its legend text)
    "kernel": ("#4e79a7", "kernel"), "send": ("#f28e2b", "send"),
    "recv": ("#59a14f", "receive / wait for a tensor"), "update": ("#9c755f", "update"),
    "ps": ("#e15759", "parameter server"), "allreduce": ("#e15759", "allreduce"),
    "rpc": ("#b07aa1", "reply to the driver"), "idle": ("#d9d9d9", "idle / driver's request"),
    "gc": ("#edc948", "garbage collection"), "step": ("#bab0ac", "step (driver)")}
OTHER = ("#76b7b2", "other")
PLOT_PX = 1100  # about the width of the bars' area in pixels (14 in at 110 dpi, less labels)
CHAR_PX = 5  # about the width of a character of the bars' labels (6 pt)


def need_matplotlib() -> Any:
    """matplotlib's Figure class, or an ImportError that says how to get it."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("drawing a timeline needs matplotlib, which is not installed "
                          "(pip install matplotlib); the trace JSON itself opens in "
                          "https://ui.perfetto.dev or chrome://tracing") from None
    return Figure


def window_of_steps(evs: Sequence[Event], last: int) -> tuple[float, float] | None:
    """(start, end) in microseconds around the driver's last `last` steps, if it timed any."""
    steps = sorted((e.ts, e.end) for e in evs if e.process == "driver" and e.cat == "step")
    if not steps or last < 1:
        return None
    chosen = steps[-last:]
    start, end = chosen[0][0], max(b for _, b in chosen)
    pad = 0.02 * (end - start)
    return start - pad, end + pad


def rows(doc: Mapping[str, Any], evs: Sequence[Event]) -> list[tuple[str, list[Event]]]:
    """(label, spans) per process and thread, in the trace's process order then thread id."""
    order = process_order(doc)
    by_row: dict[tuple[float, int, int], list[Event]] = defaultdict(list)
    for e in evs:
        by_row[(order.get(e.pid, e.pid), e.pid, e.tid)].append(e)
    return [(f"{spans[0].process} / {spans[0].thread}", spans)
            for _, spans in sorted(by_row.items(), key=lambda kv: kv[0])]


def _clip(evs: Sequence[Event], window: tuple[float, float] | None) -> list[Event]:
    if window is None:
        return list(evs)
    a, b = window
    return [e for e in evs if e.ts < b and e.end > a]


def _subtitle(doc: Mapping[str, Any], last_steps: int | None) -> str:
    parts = [f"{c['process']}: spans {100 * c['coverage']:.0f}% of a {c['step_ms']:.0f} ms "
             f"step, computing {100 * c['compute']:.0f}%" for c in coverage(doc, last_steps)]
    return "; ".join(parts)


def draw(doc: Mapping[str, Any], path: str | Path, *, last_steps: int | None = None,
         window_ms: tuple[float, float] | None = None, title: str | None = None) -> Path:
    """Write the chart of `doc` (a validated trace) to `path` (PNG); the path written.
    `last_steps` draws only the driver's last N steps, `window_ms` only that time range."""
    Figure = need_matplotlib()
    evs = events(doc)
    window = (window_of_steps(evs, last_steps) if last_steps else None) or (
        (window_ms[0] * 1e3, window_ms[1] * 1e3) if window_ms else None)
    shown = rows(doc, _clip(evs, window))
    if not shown:
        raise ValueError("nothing to draw: the trace has no spans" +
                         (" in that window" if window else ""))
    lo = window[0] if window else min(e.ts for _, spans in shown for e in spans)
    hi = window[1] if window else max(e.end for _, spans in shown for e in spans)
    fig = Figure(figsize=(14, 1.6 + 0.34 * len(shown)), layout="constrained")
    ax = fig.subplots()
    min_width = (hi - lo) / 1e3 / 1500  # a span too short for a pixel still shows
    used: set[str] = set()
    for y, (_, spans) in enumerate(shown):
        by_cat: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for e in spans:
            by_cat[e.cat].append((e.ts / 1e3, max(e.dur / 1e3, min_width)))
        for cat, bars in sorted(by_cat.items(), key=lambda kv: kv[0] == "gc"):  # gc: on top
            colour = COLOURS.get(cat, OTHER)[0]
            ax.broken_barh(bars, (y - 0.38, 0.76), facecolors=colour, linewidth=0)
            used.add(cat)
        _label_wide(ax, [e for e in spans if lo <= e.ts and e.end <= hi], y,
                    (hi - lo) / PLOT_PX)
    for e in evs:  # where the driver's steps start
        if e.process == "driver" and e.cat == "step" and lo <= e.ts <= hi:
            ax.axvline(e.ts / 1e3, color="black", linewidth=0.5, alpha=0.25)
    ax.set_yticks(range(len(shown)), [label for label, _ in shown], fontsize=8)
    ax.set_ylim(len(shown) - 0.5, -0.5)
    ax.set_xlim(lo / 1e3, hi / 1e3)
    ax.set_xlabel("time (ms since the trace began)")
    ax.grid(True, axis="x", alpha=0.3)
    handles = [_patch(COLOURS.get(c, OTHER)) for c in sorted(used)]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8,
              frameon=False)
    sub = _subtitle(doc, last_steps)
    ax.set_title((title or "graphflow timeline") + (f"\n{sub}" if sub else ""), fontsize=9)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out


def short_name(e: Event) -> str:
    """A kernel as its layer and op ("lc2 local2d_grad_input"), other spans by name."""
    op = e.args.get("op")
    if e.cat != "kernel" or not isinstance(op, str):
        return e.name if len(e.name) <= 28 else "..." + e.name[-25:]
    parts = e.name.split("/")
    layer = parts[1] if parts[0] == "grad" and len(parts) > 2 else parts[0]
    return f"{layer} {op}" if layer != op else op


def _label_wide(ax: Any, spans: Sequence[Event], y: int, us_per_px: float) -> None:
    """Write the name of each span wide enough to hold it (a kernel's node, a step); of spans
    that overlap (a collection inside a kernel) only the innermost. `spans`: those in view."""
    chosen: list[tuple[Event, str]] = []
    for e in sorted(spans, key=lambda e: e.dur):
        # the layer and op, else the op alone, where it fits in the bar
        text = next((t for t in (short_name(e), str(e.args.get("op", "")))
                     if t and e.dur >= (CHAR_PX * len(t) + 8) * us_per_px), None)
        if text and not any(c.ts < e.end and e.ts < c.end for c, _ in chosen):
            chosen.append((e, text))
    for e, text in chosen:
        ax.text((e.ts + e.dur / 2) / 1e3, y, text, ha="center", va="center",
                fontsize=6, color="white" if e.cat in ("kernel", "ps", "update") else "black",
                clip_on=True)


def _patch(colour_label: tuple[str, str]) -> Any:
    from matplotlib.patches import Patch

    return Patch(facecolor=colour_label[0], label=colour_label[1])
