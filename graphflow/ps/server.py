"""Serving a shard: the RPC loop (requests, with bsp deadlines and timed checkpoints between
them), a shard in a thread for tests, and a shard in its own process (`python -m graphflow.ps`).

    >>> import numpy as np
    >>> with ShardThread("inproc://doc-ps0", index=0) as t:
    ...     client = RpcClient(t.address, "ps:0", timeout=5.0)
    ...     client.call("init", values={"w[0:2]": np.zeros(2, np.float32)},
    ...                 optimizer={"name": "sgd", "lr": 0.1}, replicas=[0])["versions"]
    ...     client.close()
    {'w[0:2]': 0}
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import zmq

from graphflow.errors import GraphflowError
from graphflow.lifetime import how_it_ended, log_tail
from graphflow.ps.shard import Shard
from graphflow.transport.endpoint import PeerTimeout
from graphflow.transport.rpc import RemoteError, RpcClient, RpcServer

log = logging.getLogger("graphflow.ps")

POLL = 0.02  # s: how long the loop waits for a request before doing its periodic work
_LISTENING = re.compile(r"listening on (\S+)")


class ShardStartError(GraphflowError):
    """A shard process exited or stayed silent while starting (its log's tail is included)."""


def serve(shard: Shard, listen: str, stop: threading.Event | None = None,
          ready: Callable[[str], None] | None = None, poll: float = POLL,
          context: zmq.Context | None = None) -> None:
    """Answer `shard`'s RPCs on `listen` until `stop` is set or a `shutdown` request came.
    A push is answered first and its update applied right after (`Shard.defer_updates`),
    before the next request is read; `shard.tick()` runs after every request and every
    `poll` s of quiet. `ready(address)` is called once the socket is bound (the address has
    the real port of "tcp://host:*")."""
    if listen.startswith("ipc://"):
        Path(listen[len("ipc://"):]).parent.mkdir(parents=True, exist_ok=True)
    with RpcServer(listen, context, linger=0.5) as server:
        log.info("shard %d: listening on %s", shard.index, server.address)
        if ready is not None:
            ready(server.address)
        handlers = shard.handlers()
        shard.defer_updates = True
        while not shard.stopping and (stop is None or not stop.is_set()):
            server.handle_one(handlers, poll)
            try:
                shard.flush()  # this request's updates, before the next request is read
                shard.tick()
            except Exception:  # noqa: BLE001 - logged; one failure must not stop the shard
                log.exception("shard %d: applying updates or periodic work failed; serving on",
                              shard.index)
        shard.stopped()


def serve_shard(listen: str, index: int = 0, shards: int = 1, *,
                checkpoint_dir: str | os.PathLike[str] | None = None, checkpoint_every: int = 0,
                checkpoint_seconds: float = 0.0, stop: threading.Event | None = None,
                ready: Callable[[str], None] | None = None, poll: float = POLL,
                context: zmq.Context | None = None) -> Shard:
    """Make shard `index` of `shards` (restoring its newest checkpoint in `checkpoint_dir`)
    and serve it on `listen` until stopped (see `serve`); returns the shard.

        serve_shard("ipc:///tmp/ps/ps0", 0, 2, checkpoint_dir="/tmp/ps/ckpt", stop=event)
    """
    shard = Shard(index, shards, checkpoint_dir, checkpoint_every, checkpoint_seconds)
    serve(shard, listen, stop, ready, poll, context)
    return shard


class ShardThread:
    """A shard served by a daemon thread of this process (for tests and single-process runs).
    The shard (and its checkpoint restore) is made in the caller's thread; the constructor
    returns once the socket is bound. `.shard` is the live state: read it only while quiet.

        with ShardThread("ipc:///tmp/ps/ps0", index=0, shards=2) as t:
            client = PSClient([t.address, other], layout)
    """

    def __init__(self, listen: str, index: int = 0, shards: int = 1, *,
                 checkpoint_dir: str | os.PathLike[str] | None = None,
                 checkpoint_every: int = 0, checkpoint_seconds: float = 0.0,
                 context: zmq.Context | None = None, timeout: float = 10.0) -> None:
        self.shard = Shard(index, shards, checkpoint_dir, checkpoint_every, checkpoint_seconds)
        self._stop, bound = threading.Event(), threading.Event()
        self._error: BaseException | None = None
        self.address = ""

        def ready(address: str) -> None:
            self.address = address
            bound.set()

        def run() -> None:
            try:
                serve(self.shard, listen, self._stop, ready, context=context)
            except BaseException as e:  # noqa: BLE001 - reported to the starting thread
                self._error = e
                bound.set()

        self.thread = threading.Thread(target=run, daemon=True, name=f"ps-shard{index}")
        self.thread.start()
        if not bound.wait(timeout) or self._error is not None:
            self.stop()
            raise ShardStartError(f"shard {index} on {listen} did not start: "
                                  f"{self._error or f'not bound within {timeout:g}s'}")

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and join the thread (bounded by `timeout`)."""
        self._stop.set()
        self.thread.join(timeout)

    def __enter__(self) -> ShardThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ShardProcess:
    """A shard running in its own process (`python -m graphflow.ps`); see
    `start_shard_process`. Its stderr (logs) goes to `log_path`."""

    def __init__(self, proc: subprocess.Popen[bytes], index: int, address: str,
                 log_path: Path, argv: list[str]) -> None:
        self.proc, self.index, self.address, self.log_path, self.argv = (
            proc, index, address, log_path, argv)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL (a crash, for fault tests) and reap."""
        if self.alive():
            self.proc.kill()
        self.proc.wait(10)

    def stop(self, timeout: float = 5.0) -> int | None:
        """Ask it to shut down (RPC), then SIGTERM, then SIGKILL; its exit code."""
        if self.alive():
            try:
                with RpcClient(self.address, f"ps:{self.index}", timeout=timeout / 2) as c:
                    c.call("shutdown")
            except (PeerTimeout, RemoteError):
                pass
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if sig is not None and self.alive():
                self.proc.send_signal(sig)
            try:
                return self.proc.wait(timeout / 2)
            except subprocess.TimeoutExpired:
                continue
        return self.proc.poll()

    def log_tail(self, lines: int = 20) -> str:
        return log_tail(self.log_path, lines)

    def __enter__(self) -> ShardProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_shard_process(listen: str, index: int = 0, shards: int = 1, *,
                        checkpoint_dir: str | os.PathLike[str] | None = None,
                        checkpoint_every: int = 0, checkpoint_seconds: float = 0.0,
                        log_path: str | os.PathLike[str] | None = None,
                        timeout: float = 60.0, env: dict[str, str] | None = None,
                        ) -> ShardProcess:
    """Start `python -m graphflow.ps` for shard `index` and return once it answers an RPC
    (at most `timeout` s; ShardStartError with its log's tail otherwise). Its stderr is
    appended to `log_path` (default: shard{index}.log in `checkpoint_dir`, else a temp file).
    The process exits by itself when this one dies.

        proc = start_shard_process("ipc:///tmp/ps/ps0", 0, 2, checkpoint_dir="/tmp/ps/ckpt")
        os.kill(proc.pid, signal.SIGKILL)     # later: start it again with the same directory
    """
    argv = [sys.executable, "-m", "graphflow.ps", "--listen", listen, "--index", str(index),
            "--shards", str(shards), "--exit-with-parent", str(os.getpid())]
    if checkpoint_dir is not None:
        argv += ["--checkpoint-dir", str(checkpoint_dir), "--checkpoint-every",
                 str(checkpoint_every), "--checkpoint-seconds", str(checkpoint_seconds)]
    if log_path is None:
        where = Path(checkpoint_dir) if checkpoint_dir is not None else Path(tempfile.mkdtemp())
        where.mkdir(parents=True, exist_ok=True)
        log_path = where / f"shard{index}.log"
    log_path = Path(log_path)
    with open(log_path, "ab") as err:
        offset = err.tell()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=err, env=env)
    shard = ShardProcess(proc, index, "", log_path, argv)
    try:
        shard.address = _wait_answering(shard, offset, timeout)
    except BaseException:
        shard.kill()
        raise
    return shard


run_shard_process = start_shard_process  # the name issue 4's spec uses


def _wait_answering(shard: ShardProcess, offset: int, timeout: float) -> str:
    """The address shard `shard` announced in its log, once it answers `stats` there."""
    deadline = time.monotonic() + timeout
    address = ""
    while time.monotonic() < deadline:
        if not shard.alive():
            raise ShardStartError(f"shard {shard.index} {how_it_ended(shard.proc.returncode)}"
                                  f" while starting; its log:\n{shard.log_tail()}")
        if not address:
            with open(shard.log_path, "rb") as f:
                f.seek(offset)
                found = _LISTENING.search(f.read().decode(errors="replace"))
            address = found.group(1) if found else ""
        if address:
            try:
                with RpcClient(address, f"ps:{shard.index}", timeout=0.5) as client:
                    client.call("stats")
                return address
            except PeerTimeout:
                pass
        time.sleep(0.02)
    raise ShardStartError(f"shard {shard.index} did not answer within {timeout:g}s; its log:\n"
                          f"{shard.log_tail()}")
