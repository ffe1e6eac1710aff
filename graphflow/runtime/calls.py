"""The driver's calls to its workers: sent to several at once, replies gathered under one
deadline, and a failed, dead or silent worker named (`WorkerFailed`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import zmq

from graphflow.errors import GraphflowError
from graphflow.runtime.mailbox import PeerFailed
from graphflow.transport.endpoint import PeerTimeout
from graphflow.transport.rpc import RemoteError, RpcClient

# a worker's failure because of another's (it waited for it, or was told): report the other
SECONDARY = (f"{PeerTimeout.__name__}:", f"{PeerFailed.__name__}:")
EXIT_CHECK = 1.0  # s between looks at whether a silent worker's process has ended


class WorkerFailed(GraphflowError):
    """A worker died, hung or failed a step. `.worker` names it."""

    def __init__(self, message: str, worker: str, silent: bool = False) -> None:
        super().__init__(message)
        self.worker, self.silent = worker, silent  # silent: it did not answer at all


def reply_grace(timeout: float) -> float:
    """Seconds the driver waits for a reply beyond the workers' own `timeout`."""
    return max(1.0, 0.2 * timeout)


def _nothing(i: int) -> str:
    return ""


class WorkerCalls:
    """RPC calls to the workers behind `clients` (named `names`). `ended(i)` says how worker
    i's process ended ("" while it runs, or where nobody can tell: threads, other hosts), and
    `last_words(i)` what it last wrote; both go into the error that names it."""

    def __init__(self, clients: Sequence[RpcClient], names: Sequence[str],
                 ended: Callable[[int], str] = _nothing,
                 last_words: Callable[[int], str] = _nothing) -> None:
        self.clients, self.names = clients, names
        self.ended, self.last_words = ended, last_words
        self.silent: set[int] = set()  # workers that did not answer: dead or hung

    def call(self, i: int, method: str, args: Mapping[str, Any]) -> Any:
        return self.gather(method, {i: self.send(i, method, args)})[i]

    def call_each(self, method: str, args: Sequence[Mapping[str, Any]]) -> list[Any]:
        """Worker i's reply to `method(**args[i])`, for every worker, in the workers' order."""
        sent = {i: self.send(i, method, a) for i, a in enumerate(args)}
        return list(self.gather(method, sent).values())

    def send(self, i: int, method: str, args: Mapping[str, Any]) -> int:
        """Send the call to worker i; its request id (for `gather`)."""
        try:
            return self.clients[i].send(method, **args)
        except PeerTimeout as e:
            raise self._failure(i, method, e) from e

    def gather(self, method: str, sent: Mapping[int, int]) -> dict[int, Any]:
        """The replies to `sent` (worker -> request id), taken as they come until one deadline:
        the workers run side by side, and a dead one is named within the timeout (a local
        process that ended, within a second).

        A worker that fails on its own (a kernel, a feed) is reported at once; its peers, told
        by it, abandon the step too (PeerFailed). Otherwise a worker whose process ended is
        named first (even one that answered: its peers waited for what it had still to send),
        then a silent worker, before the peers that timed out waiting for it."""
        deadline = time.monotonic() + max(self.clients[i].timeout for i in sent)
        pending = dict(sent)
        results, errors = {}, []
        poller = zmq.Poller()
        for i in pending:
            poller.register(self.clients[i].socket, zmq.POLLIN)
        try:
            while pending:
                # (a reply may have come already, while another call waited for its own)
                ready = [i for i, rid in pending.items() if self.clients[i].has_reply(rid)]
                if not ready:
                    left = min(deadline - time.monotonic(), EXIT_CHECK)
                    polled = dict(poller.poll(max(1, int(left * 1000)))) if left > 0 else {}
                    ready = [i for i in pending if self.clients[i].socket in polled]
                if not ready:
                    if (gone := self._gone()) is not None:
                        raise self._ended(gone, method)
                    if time.monotonic() >= deadline:
                        errors += [self._silent(i, method) for i in pending]
                        break
                    continue
                for i in ready:
                    rid = pending[i]
                    try:
                        results[i] = self.clients[i].receive(rid, method, 0)
                    except PeerTimeout:
                        continue  # only a late reply, or another pending call's, was there
                    except RemoteError as e:
                        if not e.remote.startswith(SECONDARY):
                            raise self._failure(i, method, e) from e
                        errors.append(self._failure(i, method, e))
                    del pending[i]
                    poller.unregister(self.clients[i].socket)
        finally:  # (a failed step's other replies: nobody will ask for them)
            for i, rid in pending.items():
                self.clients[i].forget(rid)
        if errors:  # (a peer that died after answering is why the others waited in vain)
            if (gone := self._gone()) is not None:
                raise self._ended(gone, method)
            raise next((e for e in errors if e.silent), errors[0])
        return {i: results[i] for i in sent}  # in the workers' order, not the replies'

    def _gone(self) -> int | None:
        """A worker whose process has ended (any: one that died after answering holds up
        its peers' next receive), or None."""
        return next((i for i in range(len(self.clients)) if self.ended(i)), None)

    def _failure(self, i: int, method: str, e: PeerTimeout | RemoteError) -> WorkerFailed:
        if isinstance(e, PeerTimeout):
            return self._silent(i, method)
        return WorkerFailed(f"{self._named(i)} failed '{method}': {e.remote}", self.names[i])

    def _named(self, i: int) -> str:
        """Worker i's name, and its address if remote (another machine's: where to look)."""
        at = self.clients[i].address
        return f"{self.names[i]}{f' at {at}' if at.startswith('tcp') else ''}"

    def _silent(self, i: int, method: str) -> WorkerFailed:
        self.silent.add(i)
        return WorkerFailed(f"{self._named(i)} did not "
                            f"answer '{method}' within {self.clients[i].timeout:g}s (its timeout "
                            f"and the driver's grace for the reply): it died or hangs"
                            f"{self._quote(i)}", self.names[i], silent=True)

    def _ended(self, i: int, method: str) -> WorkerFailed:
        return WorkerFailed(f"{self.names[i]} {self.ended(i)} before answering '{method}'"
                            f"{self._quote(i)}", self.names[i], silent=True)

    def _quote(self, i: int) -> str:
        words = self.last_words(i)
        return "; its last words:\n    " + words.replace("\n", "\n    ") if words else ""
