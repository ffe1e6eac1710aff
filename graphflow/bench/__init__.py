"""Benchmarks behind the `graphflow bench` command: shared thread setup, machine info, tables.

>>> print(format_table([{"a": "x", "b": 1.5}], [("a", "A"), ("b", "B")]))
A  B
-  -----
x  1.500
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from graphflow.argtypes import output_file
from graphflow.runtime.cores import BLAS_THREAD_VARS, blas_threads

RESULTS = Path("benchmarks/results")  # where full runs write by default (the README's figures)

SUITES = {  # `graphflow bench SUITE`: graphflow.bench.SUITE's main(argv)
    "speedup": "DistBelief's Fig. 3 here: speedup against workers, measured and predicted",
    "convergence": "its Fig. 4: accuracy against time for Downpour, BSP, SSP, ...",
    "ps": "parameter-server pushes per second",
    "sync": "parameter server against allreduce"}


def single_threaded() -> AbstractContextManager[None]:
    """One BLAS / OpenMP thread here and in every worker process started inside."""
    return blas_threads(1)


def add_trace_option(p: argparse.ArgumentParser) -> None:
    """`--trace FILE`, the same on every suite."""
    p.add_argument("--trace", type=output_file, default=None, metavar="FILE",
                   help="write the run's timeline there (Chrome trace-event JSON; draw it "
                        "with `graphflow timeline FILE`)")


def add_output_options(p: argparse.ArgumentParser, suite: str, png: bool = True) -> None:
    """`--json FILE` (and `--png FILE`), checked before the run (`argtypes.output_file`); the
    defaults are filled by `settle_outputs`."""
    p.add_argument("--json", type=output_file, default=None, metavar="FILE",
                   help=f"every figure and the machine, as JSON (full runs: {RESULTS}/"
                        f"{suite}.json; --quick: none unless given)")
    if png:
        p.add_argument("--png", type=output_file, default=None, metavar="FILE",
                       help=f"the plot; skipped without matplotlib (full runs: {RESULTS}/"
                            f"{suite}.png; --quick: none unless given)")


def fill_defaults(args: argparse.Namespace, p: argparse.ArgumentParser, suite: str,
                  quick: dict[str, Any], full: dict[str, Any]) -> argparse.Namespace:
    """Give the options not given (None) --quick's or the full run's default (options given
    are kept, --quick or not), then the output files (`settle_outputs`)."""
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    settle_outputs(args, p, suite)
    return args


def settle_outputs(args: argparse.Namespace, p: argparse.ArgumentParser, suite: str) -> None:
    """Fill a full run's default output files, checked as given ones are (a usage error).
    --quick leaves them unset: a tiny run must not overwrite a full run's results."""
    for kind in ("json", "png"):
        if kind in vars(args) and getattr(args, kind) is None and not args.quick:
            try:
                setattr(args, kind, output_file(str(RESULTS / f"{suite}.{kind}")))
            except argparse.ArgumentTypeError as e:
                p.error(f"argument --{kind}: {e}")


def write_outputs(doc: dict[str, Any], json_path: Path | None, png_path: Path | None = None,
                  plot: Callable[[dict[str, Any], Path], str | None] | None = None) -> None:
    """Write the results' JSON (and the PNG, by `plot`) where asked, and say where or that
    nothing was written."""
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {json_path}")
    if png_path is not None and plot is not None:
        print(plot(doc, png_path) or f"wrote {png_path}")
    if json_path is None and png_path is None:
        files, options = ("JSON or PNG", "--json/--png") if plot else ("JSON", "--json")
        print(f"no {files} written (--quick writes results only where {options} say)")


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


def format_curves(workloads: dict[str, Any]) -> str:
    """`bench speedup`'s predicted speedups on 1-64 machines (each workload's "predicted":
    strategy -> [{"workers": n, "speedup": x}, ...]) as a table: one row a strategy."""
    rows, sizes = [], sorted({p["workers"] for wl in workloads.values()
                              for curve in wl["predicted"].values() for p in curve})
    for name, wl in workloads.items():
        for label, curve in wl["predicted"].items():
            rows.append({"workload": name, "strategy": label,
                         **{str(p["workers"]): f"{p['speedup']:.2f}x" for p in curve}})
    return format_table(rows, [("workload", "workload"), ("strategy", "strategy"),
                               *[(str(n), str(n)) for n in sizes]], left=("strategy",))


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}"
    return str(v)
