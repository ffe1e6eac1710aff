"""Tensor throughput between two processes: graphflow's Endpoint vs bare pyzmq, in one run.

A sender (this process) pushes --messages tensors of --size-mb MB float32 to a receiver process,
over ipc and tcp loopback. "ours" is Endpoint.send -> Endpoint.recv(key) (header encoding,
untrusted decoding, stash), untracked as a worker sends an activation (only parameters and
gradients summed in place are tracked); "bare" is a pyzmq PUSH/PULL loop of the same two frames
sent with send_multipart(copy=False) and received with recv_multipart(copy=False). Over ipc
ours copies each tensor into a shared-memory slot and sends only its header (the ring of
graphflow/transport/ring.py, as workers on one machine do); "ipc-socket" is ours with the rings
off, every byte through the socket as bare sends them. Repeats of
ours and bare are interleaved; the table shows the median GB/s and ours/bare (target >= 0.8),
"paired" (the median of ours/bare over adjacent runs, steadier when a neighbour is busy) and the
CPU time per message of both processes together (all threads, zmq's I/O threads included).
Both processes keep freed memory in their heap, as every graphflow worker process does
(`graphflow.runtime.heap`): received 1 MB buffers are not mapped afresh from the kernel.

    python benchmarks/transport.py                    # 1 MB x 500 messages, 45 repeats
    python benchmarks/transport.py --size-mb 64 --messages 20 --transports tcp
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import tempfile
import time
from typing import Any

import common

TARGET = 0.8      # ours / bare throughput, at least
DEADLINE = 60.0   # seconds any single wait may take before the run is declared broken
KEY = "lc1/relu->w1@mb0"
COLUMNS = [("transport", "transport"), ("size_mb", "MB"), ("messages", "messages"),
           ("ours_gbs", "ours GB/s"), ("bare_gbs", "bare GB/s"), ("ratio", "ours/bare"),
           ("paired_ratio", "paired"), ("ours_cpu_us", "ours CPU us/msg"),
           ("bare_cpu_us", "bare CPU us/msg"),
           ("target", "target"), ("verdict", "result")]


def extra_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--messages", type=int, default=500, help="tensors per timed run (500)")
    p.add_argument("--size-mb", type=float, default=1.0, help="tensor size in MB (1)")
    p.add_argument("--transports", nargs="+", choices=("ipc", "ipc-socket", "tcp"),
                   default=["ipc", "ipc-socket", "tcp"],
                   help="transports to measure (ipc ipc-socket tcp)")
    p.add_argument("--hwm", type=int, default=16, help="Endpoint queue length in messages (16)")
    # A round is a tenth of a second and the machine's spells are longer: over ipc, medians
    # of 7 rounds swung from 0.53 to 1.04 here, of 15 from 0.71 to 1.30 (14 runs), of 45 from
    # 0.90 to 0.98 (6 runs, 25 s each).
    p.set_defaults(repeats=45)


def _bind(transport: str, tmp: str, name: str) -> str:
    return f"ipc://{tmp}/{name}" if transport.startswith("ipc") else "tcp://127.0.0.1:*"


def receiver(conn: Any, transport: str, tmp: str, hwm: int) -> None:
    """Child process: bind an Endpoint and a bare PULL, drain what the parent asks for."""
    import zmq

    from graphflow.runtime.heap import keep_freed_memory
    from graphflow.transport import Endpoint
    keep_freed_memory()
    ep = Endpoint("recv", _bind(transport, tmp, "ours"), timeout=DEADLINE, hwm=hwm)
    bare = zmq.Context.instance().socket(zmq.PULL)
    bare.linger = 0
    bare.bind(_bind(transport, tmp, "bare"))
    conn.send((ep.address, bare.getsockopt_string(zmq.LAST_ENDPOINT)))
    while conn.poll(DEADLINE):
        cmd = conn.recv()
        if cmd is None:
            break
        mode, n = cmd
        cpu = time.process_time()
        try:
            last = None
            for _ in range(n):
                if mode == "ours":
                    last = ep.recv(KEY, "send")
                else:
                    if not bare.poll(int(DEADLINE * 1000)):
                        raise TimeoutError(f"bare receiver: nothing within {DEADLINE}s")
                    last = bare.recv_multipart(copy=False)
            check = float(last[-1]) if mode == "ours" else len(last)
            conn.send(("ok", check, time.process_time() - cpu))
        except Exception as e:  # noqa: BLE001 - report to the parent, which fails the run
            conn.send(("error", f"{type(e).__name__}: {e}", 0.0))
    ep.close()
    bare.close()


class Link:
    """The sending side of one transport: an Endpoint and a bare PUSH to one receiver child."""

    def __init__(self, transport: str, x: Any, hwm: int) -> None:
        import msgpack
        import zmq

        from graphflow.transport import Endpoint
        self.tmp = tempfile.TemporaryDirectory(prefix="gf-bench-")
        self.conn, child = mp.get_context("spawn").Pipe()
        self.proc = mp.get_context("spawn").Process(
            target=receiver, args=(child, transport, self.tmp.name, hwm), daemon=True)
        self.proc.start()
        if not self.conn.poll(DEADLINE):
            raise TimeoutError(f"{transport} receiver did not start within {DEADLINE}s")
        ours_addr, bare_addr = self.conn.recv()
        self.ep = Endpoint("send", _bind(transport, self.tmp.name, "send"), timeout=DEADLINE,
                           hwm=hwm, rings=transport != "ipc-socket")
        self.ep.connect("recv", ours_addr)
        self.push = zmq.Context.instance().socket(zmq.PUSH)
        self.push.sndtimeo, self.push.linger = int(DEADLINE * 1000), 0
        self.push.connect(bare_addr)
        self.x = x
        self.cpu: dict[str, list[float]] = {"ours": [], "bare": []}  # s per run, both sides
        self.header = msgpack.packb({"key": KEY, "src": "send", "dtype": "float32",
                                     "shape": list(x.shape), "step": 0})

    def run(self, mode: str, n: int) -> None:
        """Send n tensors the `mode` way; return once the receiver has all of them."""
        self.conn.send((mode, n))
        cpu = time.process_time()
        if mode == "ours":
            for i in range(n):
                self.ep.send("recv", KEY, self.x, step=i, track=False)
        else:
            for _ in range(n):
                self.push.send_multipart([self.header, self.x], copy=False)
        if not self.conn.poll(DEADLINE):
            raise TimeoutError(f"receiver did not finish {n} {mode} messages in {DEADLINE}s")
        status, detail, recv_cpu = self.conn.recv()
        self.cpu[mode].append(time.process_time() - cpu + recv_cpu)
        if status != "ok":
            raise RuntimeError(f"receiver ({mode}): {detail}")
        if detail != (float(self.x[-1]) if mode == "ours" else 2):
            raise RuntimeError(f"receiver ({mode}) got the wrong data: {detail}")

    def close(self) -> None:
        self.conn.send(None)
        self.proc.join(10.0)
        if self.proc.is_alive():
            self.proc.kill()
        self.ep.close()
        self.push.close()
        self.tmp.cleanup()


def measure_transport(transport: str, args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    x = np.random.default_rng(0).standard_normal(int(args.size_mb * 2**20) // 4,
                                                 dtype=np.float32)
    link = Link(transport, x, args.hwm)
    try:
        n = args.messages
        times = common.measure({"ours": lambda: link.run("ours", n),
                                "bare": lambda: link.run("bare", n)},
                               args.repeats, args.warmup)
    finally:
        link.close()
    gbs = {k: n * x.nbytes / t["median_s"] / 1e9 for k, t in times.items()}
    ratio = gbs["ours"] / gbs["bare"]
    paired = statistics.median(b / o for o, b in zip(times["ours"]["times_s"],
                                                      times["bare"]["times_s"]))
    cpu = {k: statistics.median(c) / n * 1e6 for k, c in link.cpu.items()}
    return {"transport": transport, "size_mb": args.size_mb, "messages": n, "hwm": args.hwm,
            "ours_cpu_us": cpu["ours"], "bare_cpu_us": cpu["bare"],
            "ours_gbs": gbs["ours"], "bare_gbs": gbs["bare"], "ratio": ratio,
            "paired_ratio": paired, "target": TARGET, "verdict": common.verdict(ratio, TARGET),
            "times": times}


def main() -> int:
    args = common.parse_args("transport", __doc__, extra=extra_flags)
    from graphflow.runtime.heap import keep_freed_memory  # after parse_args sets the threads
    keep_freed_memory()
    if args.messages < 1 or args.size_mb <= 0:
        raise ValueError("--messages must be >= 1 and --size-mb > 0")
    rows = [measure_transport(t, args) for t in args.transports]
    common.print_table(rows, COLUMNS, f"two processes, float32 tensors (GB = 1e9 bytes), median "
                                      f"of {args.repeats} after {args.warmup} warm-ups")
    common.write_json(args.json, "transport", args, None, rows)
    return 0


if __name__ == "__main__":
    common.run_main(main)
