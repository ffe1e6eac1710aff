"""`graphflow bench ps`: parameter-server pushes per second (issue 4's PS benchmark).

1. One shard in its own process, one client in this process, over ipc: pushes per second of a
   1 MB float32 gradient (262144 elements) that the shard applies with Adagrad, against a bare
   pyzmq DEALER/ROUTER round trip of the same payload between two processes (1 MB out
   zero-copy, a 2-byte reply back). Target: the push rate is at least 0.6x the bare one.
2. Scaling: a 4 MB parameter split across 1, 2 and 4 shard processes; one client pushes the
   whole gradient each time, to all its shards at once from parallel threads (PSClient's
   fan-out), and also one shard after the other ("sequential").

Every process is started first; then each round times a batch of pushes of every point in
turn, so a busy neighbour slows all alike. Figures are medians over the rounds.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from graphflow.argtypes import count, csv_counts_of, non_negative
from graphflow.bench import (
    add_output_options,
    add_trace_option,
    fill_defaults,
    format_table,
    machine_info,
    single_threaded,
    write_outputs,
)
from graphflow.progress import Progress
from graphflow.ps import Layout, PSClient, ShardProcess, start_shard_process
from graphflow.trace import current, recording

TARGET = 0.6
OPTIMIZER = {"name": "adagrad", "lr": 0.01}
COLUMNS = [("what", "what"), ("shards", "shards"), ("mb", "MB/push"), ("rate", "pushes/s"),
           ("mbs", "MB/s"), ("ratio", "vs bare"), ("target", "target"), ("verdict", "met")]

# The bare peer: a ROUTER that answers each message with b"ok" (and exits when idle 60 s).
_BARE = """
import sys, zmq
s = zmq.Context.instance().socket(zmq.ROUTER)
s.linger = 0
s.bind(sys.argv[1])
while s.poll(60000):
    ident, *frames = s.recv_multipart(copy=False)
    s.send_multipart([ident, b"ok"])
    if frames[0].bytes[:4] == b"stop":
        break
"""


QUICK = {"shards": [1, 2], "pushes": 10, "rounds": 2, "warmup": 3}  # --quick's defaults
FULL = {"shards": [1, 2, 4], "pushes": 60, "rounds": 15, "warmup": 20}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="graphflow bench ps", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: graphflow bench ps --rounds 9 --pushes 100 --shards 1,2")
    p.add_argument("--shards", type=csv_counts_of("shard", include_one=False), default=None,
                   help="shard counts of the scaling part, comma-separated (1,2,4; --quick: 1,2)")
    p.add_argument("--pushes", type=count, default=None,
                   help="1 MB pushes per round (the 4 MB scaling points do a third) "
                        f"({FULL['pushes']}; --quick: {QUICK['pushes']})")
    p.add_argument("--rounds", type=count, default=None,
                   help=f"timed rounds; medians over them ({FULL['rounds']}; --quick: "
                        f"{QUICK['rounds']})")
    p.add_argument("--warmup", type=non_negative, default=None,
                   help=f"untimed pushes per point ({FULL['warmup']}; --quick: "
                        f"{QUICK['warmup']})")
    add_output_options(p, "ps", png=False)
    p.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    add_trace_option(p)
    p.add_argument("--quick", action="store_true",
                   help="tiny settings, for tests: --shards 1,2 --pushes 10 --rounds 2 "
                        "--warmup 3 unless given, and no JSON unless given")
    return p


def arguments(argv: list[str] | None = None,
              p: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    """The options, those not given filled with --quick's or the full run's defaults; a bad
    one exits 2 (SystemExit)."""
    p = p or parser()
    return fill_defaults(p.parse_args(argv), p, "ps", QUICK, FULL)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the table, write JSON. 0 when every point ran, 1 when one
    failed, 2 on a bad argument."""
    try:
        args = arguments(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    with single_threaded(), recording(args.trace):
        doc = run(args)
    print(format_table(_rows(doc), COLUMNS))
    for note in doc["notes"]:
        print(f"note: {note}")
    write_outputs(doc, args.json)
    return 1 if any("error" in pt for pt in doc["points"]) else 0


class _Point:
    """One measured configuration: `push()` sends one message and waits for the reply."""

    def __init__(self, what: str, shards: int, nbytes: int, push: Callable[[], Any],
                 pushes: int) -> None:
        self.what, self.shards, self.nbytes, self.push, self.pushes = (
            what, shards, nbytes, push, pushes)
        self.rates: list[float] = []
        self.error: str | None = None

    def timed(self, n: int) -> None:
        session = current()  # traced: a driver span per push (looked up once, not per push)
        t0 = time.perf_counter()
        for _ in range(n):
            if session is None:
                self.push()
            else:
                with session.driver.span("ps", self.what, {"shards": self.shards},
                                         thread="client"):
                    self.push()
        self.rates.append(n / (time.perf_counter() - t0))

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {"what": self.what, "shards": self.shards, "bytes": self.nbytes,
                               "pushes_per_round": self.pushes, "pushes_per_s": self.rates}
        if self.error:
            out["error"] = self.error
        elif self.rates:
            out["median_pushes_per_s"] = statistics.median(self.rates)
            out["median_MB_per_s"] = out["median_pushes_per_s"] * self.nbytes / 1e6
        return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement, as a JSON-ready dict."""
    doc: dict[str, Any] = {"benchmark": "ps", "machine": machine_info(),
                           "settings": {k: str(v) if isinstance(v, Path) else v
                                        for k, v in vars(args).items()},
                           "optimizer": OPTIMIZER, "target": TARGET, "points": [], "notes": []}
    cores = doc["machine"]["cpu_count"] or 1
    if max(args.shards) + 1 > cores:
        doc["notes"].append(f"{max(args.shards)} shard processes and a client on {cores} cores:"
                            " oversubscribed")
    with ExitStack() as stack:  # (the folder goes last, once its shards have stopped)
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="graphflow-bench-ps-"))
        points = _start_points(args, tmp, stack)
        with Progress(args.rounds, "ps", enabled=not args.no_progress) as bar:
            for pt in points:
                _guarded(pt, lambda pt=pt: pt.timed(args.warmup))
                pt.rates.clear()
            for _ in range(args.rounds):
                for pt in points:
                    _guarded(pt, lambda pt=pt: pt.timed(pt.pushes))
                bar.update(**{"bare/s": _last(points[0]), "ps/s": _last(points[1])})
        doc["points"] = [pt.result() for pt in points]
    bare, one = doc["points"][0], doc["points"][1]
    if "median_pushes_per_s" in bare and "median_pushes_per_s" in one:
        doc["ratio"] = one["median_pushes_per_s"] / bare["median_pushes_per_s"]
        doc["met"] = doc["ratio"] >= TARGET
    doc["machine"]["loadavg_end"] = machine_info()["loadavg"]
    return doc


def _start_points(args: argparse.Namespace, tmp: str, stack: ExitStack) -> list[_Point]:
    """Start the bare peer and every shard process (four at a time), init the shards; the
    points in table order."""
    rng = np.random.default_rng(0)
    small = rng.standard_normal(262144).astype(np.float32)
    big = rng.standard_normal(4 * 262144).astype(np.float32)
    configs = [("one", 1, small.size)] + [(f"scale{k}", k, big.size) for k in args.shards]
    todo = [(f"{name}-{i}", i, k) for name, k, _ in configs for i in range(k)]
    with ThreadPoolExecutor(4) as pool:
        bare = pool.submit(_bare_peer, f"ipc://{tmp}/bare", stack, args.pushes)
        procs = dict(zip([t[0] for t in todo], pool.map(
            lambda t: start_shard_process(f"ipc://{tmp}/{t[0]}", t[1], t[2],
                                          log_path=Path(tmp) / f"{t[0]}.log"), todo)))
        for proc in procs.values():
            stack.callback(proc.stop)
        points = [bare.result()]
    for name, k, n in configs:
        shards = [procs[f"{name}-{i}"] for i in range(k)]
        points += _ps_points(name, shards, small if n == small.size else big, args, stack)
    return points


def _ps_points(name: str, shards: list[ShardProcess], grad: np.ndarray,
               args: argparse.Namespace, stack: ExitStack) -> list[_Point]:
    layout = Layout.build({"w": grad.shape}, len(shards))
    addresses = [p.address for p in shards]
    clients = [stack.enter_context(PSClient(addresses, layout, timeout=30.0, parallel=par))
               for par in ((True, False) if len(shards) > 1 else (True,))]
    clients[0].init({"w": np.zeros_like(grad)}, OPTIMIZER, [0, 1])
    out = []
    for replica, client in enumerate(clients):
        push = functools.partial(_push, client, replica, itertools.count(), grad)
        if name == "one":
            what, pushes = "ps push (adagrad)", args.pushes
        else:
            what = "ps push" + ("" if len(shards) == 1 else
                                ", parallel" if replica == 0 else ", sequential")
            pushes = max(1, args.pushes // 3)
        out.append(_Point(what, len(shards), grad.nbytes, push, pushes))
    return out


def _push(client: PSClient, replica: int, steps: Iterator[int], grad: np.ndarray) -> None:
    client.push(replica, next(steps), {"w": grad})


def _bare_peer(address: str, stack: ExitStack, pushes: int) -> _Point:
    """The bare pyzmq peer process and a point pushing 1 MB to it."""
    proc = subprocess.Popen([sys.executable, "-c", _BARE, address], stdin=subprocess.DEVNULL)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(address)

    def close() -> None:
        try:
            sock.send(b"stop")
        finally:
            sock.close()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    stack.callback(close)
    payload = np.random.default_rng(1).standard_normal(262144).astype(np.float32)

    def push() -> None:
        sock.send(payload, copy=False)
        if not sock.poll(30000):
            raise TimeoutError("the bare pyzmq peer did not answer within 30s")
        sock.recv()

    return _Point("bare pyzmq round trip", 1, payload.nbytes, push, pushes)


def _guarded(pt: _Point, fn: Callable[[], None]) -> None:
    if pt.error is None:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - one failed point is reported, the rest go on
            pt.error = f"{type(e).__name__}: {e}"


def _last(pt: _Point) -> float:
    return pt.rates[-1] if pt.rates else 0.0


def _rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    bare = doc["points"][0].get("median_pushes_per_s")
    rows = []
    for i, pt in enumerate(doc["points"]):
        row: dict[str, Any] = {"what": pt["what"], "shards": pt["shards"],
                               "mb": pt["bytes"] / 2**20}
        if "error" in pt:
            row["what"] = f"{pt['what']}: {pt['error'][:60]}"
        elif "median_pushes_per_s" in pt:
            row.update(rate=pt["median_pushes_per_s"], mbs=pt["median_MB_per_s"])
            if i == 1 and bare:
                row.update(ratio=f"{doc['ratio']:.2f}x", target=f">={TARGET}x",
                           verdict="PASS" if doc["met"] else "FAIL")
        rows.append(row)
    return rows


if __name__ == "__main__":
    sys.exit(main())
