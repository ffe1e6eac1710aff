"""A cluster's local workers: threads of the driver's process (inproc addresses) or processes
of this machine (ipc sockets in a folder of their own, each process's stderr in a log there),
how each one ended, and their end. Remote workers are started by hand (`graphflow worker`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import threading

import zmq

from graphflow.lifetime import how_it_ended, log_tail
from graphflow.runtime.cores import start_worker_process
from graphflow.runtime.service import serve

PROCESS_START = 60.0  # seconds a local worker process may take to answer its first call


class LocalWorkers:
    """Starts a cluster's workers in `mode` "threads" or "processes" (none for "remote")."""

    def __init__(self, mode: str, run: str, context: zmq.Context) -> None:
        self.mode, self.run, self.context = mode, run, context
        self.tmp = tempfile.mkdtemp(prefix="graphflow-") if mode == "processes" else None
        self.threads: list[threading.Thread] = []
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, parts: int, local_workers: int, pins: list[int] | None,
              timeout: float) -> list[str]:
        """Start `parts` workers (process i on CPU pins[i], if given); their control addresses."""
        addresses = []
        for i in range(parts):
            if self.mode == "threads":
                address = f"inproc://graphflow-{self.run}-control{i}"
                ready = threading.Event()
                t = threading.Thread(target=serve, args=(address, self.context, ready),
                                     daemon=True, name=f"graphflow-worker{i}")
                t.start()
                ready.wait(timeout)
                self.threads.append(t)
            else:
                address = f"ipc://{self.tmp}/control{i}"
                self.procs.append(start_worker_process(
                    address, local_workers, pins[i] if pins else None, log=self.log(i)))
            addresses.append(address)
        return addresses

    def data_bind(self, i: int) -> str:
        """Where worker i receives its peers' tensors."""
        if self.mode == "threads":
            return f"inproc://graphflow-{self.run}-data{i}"
        return f"ipc://{self.tmp}/data{i}"

    def ended(self, i: int) -> str:
        """How worker i's process ended ("" while it runs, or if it is no process here)."""
        code = self.procs[i].poll() if i < len(self.procs) else None
        return "" if code is None else how_it_ended(code)

    def last_words(self, i: int) -> str:
        """The end of worker i's stderr ("" for a thread)."""
        return log_tail(self.log(i), lines=8) if i < len(self.procs) else ""

    def log(self, i: int) -> str:
        return os.path.join(self.tmp or "", f"worker{i}.log")

    def join(self, seconds: float = 5.0) -> None:
        """Wait up to `seconds` for each worker told to shut down (then `reap` kills it)."""
        for t in self.threads:
            t.join(timeout=seconds)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=seconds)


def reap(procs: list[subprocess.Popen[bytes]], tmp: str | None) -> None:
    """Kill the worker processes still running; remove their socket and log folder."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
