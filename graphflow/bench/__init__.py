"""Benchmarks behind the `graphflow bench` command: shared thread setup, machine info, tables.

>>> print(format_table([{"a": "x", "b": 1.5}], [("a", "A"), ("b", "B")]))
A  B
-  -----
x  1.500
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from graphflow.runtime.cores import BLAS_THREAD_VARS, blas_threads


def single_threaded() -> AbstractContextManager[None]:
    """One BLAS / OpenMP thread here and in every worker process started inside."""
    return blas_threads(1)


def add_trace_option(p: argparse.ArgumentParser) -> None:
    """`--trace FILE`, the same on every suite."""
    p.add_argument("--trace", type=Path, default=None, metavar="FILE",
                   help="write the run's timeline there (Chrome trace-event JSON; draw it "
                        "with `graphflow timeline FILE`)")


def csv_names(text: str) -> list[str]:
    """An argparse type: comma-separated names, duplicates dropped."""
    names = list(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    if not names:
        raise argparse.ArgumentTypeError("no names given")
    return names


def csv_choices(allowed: Sequence[str]) -> Callable[[str], list[str]]:
    """An argparse type: comma-separated names, each one of `allowed` (duplicates dropped)."""
    def parse(text: str) -> list[str]:
        names = [s.strip() for s in text.split(",") if s.strip()]
        bad = [n for n in names if n not in allowed]
        if bad or not names:
            raise argparse.ArgumentTypeError(f"{', '.join(bad) or 'nothing'} given; choose "
                                             f"from {', '.join(allowed)}")
        return list(dict.fromkeys(names))
    return parse


def machine_info() -> dict[str, Any]:
    """Host, CPU (`timing.cpu_identity`), core count, load average and library versions, for
    results files."""
    import numba
    import numpy as np

    from graphflow.timing import cpu_identity

    return {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "host": platform.node(), "platform": platform.platform(),
            "python": platform.python_version(), **cpu_identity(), "cpu_count": os.cpu_count(),
            "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
            "numpy": np.__version__, "numba": numba.__version__,
            "threads": {v: os.environ.get(v) for v in BLAS_THREAD_VARS}}


def machine_notes(machine: dict[str, Any], workers: int) -> list[str]:
    """What about this machine (`machine_info`) bears on a multi-worker benchmark's figures."""
    notes = []
    if workers > (cores := machine["cpu_count"] or 1):
        notes.append(f"{workers} workers on {cores} cores: oversubscribed")
    if not machine.get("wide_vectors", True):
        notes.append("this CPU has no AVX-512 (ops/simd.py): the dense layers' gemms go to BLAS, "
                     "which runs micro-batches slower a row than whole batches, so pipelining "
                     "gains little")
    return notes


def memory_to_spare(reserve: float = 0.25) -> bool:
    """Whether more than `reserve` of this machine's memory is available (Linux's MemAvailable;
    True where it cannot be read): a benchmark starts a point's extra clusters only then (the
    speedup bench's speech-mlp clusters took 16 GB at once with three a point)."""
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        total, available = (int(info[k].split()[0]) for k in ("MemTotal", "MemAvailable"))
    except (OSError, KeyError, ValueError):
        return True
    return available > reserve * total


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]],
                 left: Collection[str] = ()) -> str:
    """Rows as an aligned text table; `columns` is (key, header) pairs; None prints as '-'.
    The first column and those in `left` are left-aligned, the others right-aligned."""
    cells = [[_cell(r.get(k)) for k, _ in columns] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (_, h) in enumerate(columns)]
    lines = ["  ".join(h.ljust(w) for (_, h), w in zip(columns, widths, strict=True)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lefts = [i == 0 or k in left for i, (k, _) in enumerate(columns)]
    for c in cells:
        lines.append("  ".join(v.ljust(w) if lf else v.rjust(w)
                               for v, w, lf in zip(c, widths, lefts, strict=True)).rstrip())
    return "\n".join(lines)


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}"
    return str(v)
