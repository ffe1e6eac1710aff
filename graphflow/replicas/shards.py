"""The parameter-server shards of a run: started as threads or processes, and watched.

A shard process that dies is started again on the same address with the same checkpoint
directory, so it resumes from its newest checkpoint; the replicas' clients retry their calls
meanwhile (pushes are de-duplicated, so a retried push is applied once).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from graphflow.errors import GraphflowError
from graphflow.lifetime import how_it_ended
from graphflow.ps.server import ShardProcess, ShardThread, start_shard_process
from graphflow.transport.endpoint import PeerTimeout
from graphflow.transport.rpc import RemoteError, RpcClient

log = logging.getLogger("graphflow.replicas")

WATCH = 0.1  # seconds between looks at the shard processes


class ShardGroup:
    """`count` shards on ipc addresses under a temporary directory, or on tcp ports of
    `listen_host` (an address of this machine that workers on other machines reach). With
    `placement="processes"` each shard is its own process, restarted from `checkpoint_dir` if
    it dies. Each restart is an event in `events` ({"shard", "pid", "ended", "new_pid",
    "checkpoint" it resumed from, "updates" it held, or "error"}, with what `stamp()` adds
    when the death was seen), also passed to `on_restart`.

        with ShardGroup(2, "processes", checkpoint_dir="ckpt") as shards:
            client = PSClient(shards.addresses, layout)
    """

    def __init__(self, count: int, placement: str = "threads",
                 checkpoint_dir: str | None = None, checkpoint_every: int = 200,
                 timeout: float = 30.0, listen_host: str | None = None,
                 on_restart: Callable[[dict[str, Any]], None] | None = None,
                 stamp: Callable[[], dict[str, Any]] | None = None) -> None:
        if placement not in ("threads", "processes"):
            raise ValueError(f"unknown shard placement '{placement}': threads or processes")
        self.placement, self.timeout = placement, timeout
        self._tmp = tempfile.mkdtemp(prefix="graphflow-ps-")
        self.checkpoint_dir = checkpoint_dir or (
            str(Path(self._tmp) / "checkpoints") if placement == "processes" else None)
        self.checkpoint_every = checkpoint_every
        # (tcp ports are picked at bind; a restarted shard binds the port its first one got)
        self.addresses = [f"tcp://{listen_host}:*" if listen_host else f"ipc://{self._tmp}/ps{i}"
                          for i in range(count)]
        self.restarts: list[str] = []  # what the watcher did, for logs and tests
        self.events: list[dict[str, Any]] = []  # the same, as data (see the class docstring)
        self._on_restart, self._stamp = on_restart, stamp
        self._threads: list[ShardThread] = []
        self._procs: list[ShardProcess] = []
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None
        try:
            for i, address in enumerate(self.addresses):
                if placement == "threads":
                    self._threads.append(ShardThread(
                        address, i, count, checkpoint_dir=self.checkpoint_dir,
                        checkpoint_every=checkpoint_every, timeout=timeout))
                    self.addresses[i] = self._threads[-1].address
                else:
                    self._procs.append(self._start(i))
                    self.addresses[i] = self._procs[-1].address
        except BaseException:
            self.close()
            raise
        if self._procs:
            self._watcher = threading.Thread(target=self._watch, daemon=True, name="ps-watch")
            self._watcher.start()

    def _start(self, i: int) -> ShardProcess:
        return start_shard_process(self.addresses[i], i, len(self.addresses),
                                   checkpoint_dir=self.checkpoint_dir,
                                   checkpoint_every=self.checkpoint_every,
                                   timeout=self.timeout)

    def address_for(self, name: str) -> str:
        """An ipc address in this group's private directory (for other endpoints of a run)."""
        return f"ipc://{self._tmp}/{name}"

    @property
    def pids(self) -> list[int]:
        """Process ids of the shard processes (empty for threads)."""
        with self._lock:
            return [p.pid for p in self._procs]

    def _watch(self) -> None:
        while not self._closing.wait(WATCH):
            for i, proc in enumerate(list(self._procs)):
                if not proc.alive() and not self._closing.is_set():
                    self._restart(i, proc)

    def _restart(self, i: int, proc: ShardProcess) -> None:
        ended = how_it_ended(proc.proc.returncode)
        event: dict[str, Any] = {"shard": i, "pid": proc.pid, "ended": ended}
        try:
            event.update(self._stamp() if self._stamp else {})
        except Exception:  # noqa: BLE001 - the shard is restarted all the same
            log.exception("shard %d: stamping its death failed", i)
        what = (f"shard {i} (pid {proc.pid}) {ended}; restarting it from its checkpoint in "
                f"{self.checkpoint_dir}")
        log.error(what)
        try:
            fresh = self._start(i)
        except GraphflowError as e:
            log.error("shard %d could not be restarted: %s", i, e)
            self.restarts.append(f"{what}: failed: {e}")
            event["error"] = str(e)
        else:
            with self._lock:
                self._procs[i] = fresh
            self.restarts.append(f"{what}: restarted as pid {fresh.pid}")
            log.warning("shard %d restarted as pid %d", i, fresh.pid)
            event.update(new_pid=fresh.pid, **self._restored(fresh))
        self.events.append(event)
        if self._on_restart is not None:
            try:
                self._on_restart(event)
            except Exception:  # noqa: BLE001 - the watcher must go on watching
                log.exception("shard %d: reporting its restart failed", i)

    def _restored(self, proc: ShardProcess) -> dict[str, Any]:
        """The checkpoint a restarted shard resumed from (None: none was found) and the
        updates of its most updated slice, as it says."""
        try:
            with RpcClient(proc.address, f"ps:{proc.index}", timeout=self.timeout) as client:
                stats = client.call("stats")
        except (PeerTimeout, RemoteError) as e:  # (it answered once started: unlikely)
            log.error("shard %d: could not ask what it resumed from: %s", proc.index, e)
            return {"checkpoint": None}
        return {"checkpoint": stats["restored"],
                "updates": max(stats["versions"].values(), default=0)}

    def close(self) -> None:
        self._closing.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5.0)
        for t in self._threads:
            t.stop()
        for p in self._procs:
            p.stop()
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> ShardGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
