"""The speedup bench's PNG: per workload, measured speedups (markers), the cost model's
predicted curves to 64 machines (lines), the ideal and the machine's ceiling."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot(doc: dict[str, Any], path: Path) -> str | None:
    """Per workload: measured speedups (markers), predicted curves (lines), ideal, ceiling.
    Returns a message instead when matplotlib is missing."""
    try:
        from matplotlib.figure import Figure
        from matplotlib.ticker import FuncFormatter
    except ImportError:
        return "matplotlib is not installed: no PNG (pip install matplotlib)"
    names = list(doc["workloads"])
    fig = Figure(figsize=(6.4 * len(names), 5.0), layout="constrained")
    for ax, name in zip(fig.subplots(1, len(names), squeeze=False)[0], names, strict=True):
        wl = doc["workloads"][name]
        top = max(c["workers"] for curve in wl["predicted"].values() for c in curve)
        ys = [wl["ceiling"]["ratio"]]
        ax.plot([1, top], [1, top], ":", color="gray", label="ideal")
        for i, (label, curve) in enumerate(wl["predicted"].items()):
            line = [(c["workers"], c["speedup"]) for c in curve if "speedup" in c]
            pts = [(1, 1.0)] + [(p["workers"], p["speedup"]) for p in wl["points"]
                                if p["strategy"] == label and "speedup" in p]
            ys += [y for _, y in line + pts]
            ax.plot(*zip(*line or [(1, 1.0)], strict=True), "-", color=f"C{i}", label=label)
            ax.plot(*zip(*pts, strict=True), "o", color=f"C{i}", markersize=8,
                    markeredgecolor="black")
        ax.plot([], [], "-", color="black", label="predicted, 10 Gbit/s")
        ax.plot([], [], "o", color="white", markeredgecolor="black", label="measured here")
        ax.plot([2], [wl["ceiling"]["ratio"]], "*", color="black", markersize=14,
                label=f"machine ceiling at 2 ({wl['ceiling']['ratio']:.2f}x)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_ylim(min(0.5, min(ys) / 1.25), top * 1.1)
        ax.set(title=f"{name}, batch {doc['settings']['batch']}", xlabel="workers (machines)",
               ylabel="speedup over 1 worker")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return None
