"""A cluster file: the TOML that names the machines a model runs on.

    workers = ["tcp://10.0.0.2:5555", "tcp://10.0.0.3:5555"]

(`graphflow worker --listen tcp://HOST:PORT` serves one; replica sets add their own keys.)
Every error names the file and the entry: `c.toml: workers[1] = 'tcp://:5555': no host`.
"""

from __future__ import annotations

import socket
import threading
import time
import tomllib
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlparse

FORM = "tcp://HOST:PORT"
CONNECT_TIMEOUT = 10.0  # seconds a remote worker has to answer a driver's first call
TRAIN_TIMEOUT = 60.0  # seconds a trained split model's worker may be silent in a step
RESOLVE_TIMEOUT = 2.0  # seconds to look up the workers' host names (to find one listed twice)


def address_problem(address: object) -> str | None:
    """What is wrong with a worker's control address (None if it is tcp://HOST:PORT).

        >>> address_problem("tcp://:5555"), address_problem("tcp://10.0.0.2:5555")
        ('no host', None)
    """
    if not isinstance(address, str):
        return f"not a string, expected \"{FORM}\""
    url = urlparse(address)
    if url.scheme != "tcp":
        return f"not {FORM}"
    try:
        port = url.port
    except ValueError:  # (urlparse: "Port out of range 0-65535", "Port could not be cast")
        return "the port is not a number from 1 to 65535"
    if not url.hostname:
        return "no host"
    if port is None or port == 0:
        return "no port" if port is None else "port 0: the driver needs the worker's own port"
    if url.path or url.query or url.params or url.fragment or url.username:
        return f"extra parts, expected just {FORM}"
    return None


def workers_problem(workers: Sequence[object], key: str = "workers") -> tuple[str, str] | None:
    """(entry, problem) for the first bad one of a list of worker addresses, or None.

    A worker listed twice (one worker serves one part: a second `load` replaces the first) is
    found by its resolved (IP, port), however it is spelled: localhost, 127.0.0.1, port 05741.
    """
    if not workers:
        return f"{key} = []", f"list one \"{FORM}\" per worker"
    for i, w in enumerate(workers):
        if (problem := address_problem(w)) is not None:
            return f"{key}[{i}] = {w!r}", problem
    where = _resolve([urlparse(str(w)) for w in workers])
    for i, w in enumerate(workers):
        for j in range(i):
            if w == workers[j]:
                return f"{key}[{i}] = {w!r}", f"repeats {key}[{j}]: each worker serves one part"
            if same := where[i] & where[j]:
                ip, port = min(same)
                return (f"{key}[{i}] = {w!r}",
                        f"the same worker ({ip} port {port}) as {key}[{j}] = {workers[j]!r}: "
                        "each worker serves one part")
    return None


def _resolve(urls: Sequence[Any]) -> list[set[tuple[str, int]]]:
    """Each tcp URL's set of (IP, port); (its host name as written, port) where the lookup
    fails or takes over RESOLVE_TIMEOUT in all (lookups run side by side, in threads)."""
    found: list[set[tuple[str, int]]] = [{(u.hostname.lower(), u.port)} for u in urls]

    def look(i: int, host: str, port: int) -> None:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            return  # (unknown here: the driver's connect will say so)
        found[i] = {(info[4][0], port) for info in infos}

    threads = [threading.Thread(target=look, args=(i, u.hostname, u.port), daemon=True)
               for i, u in enumerate(urls)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + RESOLVE_TIMEOUT
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return list(found)


def check_hosts(hosts: Sequence[object], parts: int, path: str = "") -> None:
    """ValueError unless `hosts` (`Cluster(hosts=...)`, or a cluster file's workers) are one
    good worker address for each of a plan's `parts`."""
    where = f"{path}: " if path else ""
    if (bad := workers_problem(hosts, "workers" if path else "hosts")) is not None:
        raise ValueError(f"{where}{bad[0]}: {bad[1]}")
    if len(hosts) != parts:
        raise ValueError(f"{where}{len(hosts)} worker(s) for a plan of {parts} part(s): "
                         f"one worker serves each part")


def read_cluster_file(path: str) -> list[str]:
    """The worker control addresses listed in a TOML cluster file (`workers = [...]`)."""
    return load_cluster_file(path)["workers"]


def load_cluster_file(path: str) -> dict[str, Any]:
    """A TOML cluster file's contents, its `workers` checked to be tcp://HOST:PORT.
    ValueError naming the file and the entry otherwise (OSError if it cannot be read)."""
    with open(path, "rb") as f:
        try:
            data = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{path}: not valid TOML: {e}") from None
    workers = data.get("workers")
    if workers is None:
        keys = ", ".join(sorted(data)) or "none"
        raise ValueError(f"{path}: no `workers = [\"{FORM}\", ...]` (keys found: {keys})")
    if not isinstance(workers, list):
        raise ValueError(f"{path}: workers = {workers!r}: expected a list, "
                         f"`workers = [\"{FORM}\", ...]`")
    if (bad := workers_problem(workers)) is not None:
        raise ValueError(f"{path}: {bad[0]}: {bad[1]}")
    return data
