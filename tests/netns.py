"""Private hosts for tests: network namespaces joined by veth pairs to a bridge.

Every address lives only inside namespaces made here; nothing is added to the machine's own
namespace (each veth pair is created inside a private namespace). `Hosts.close()` kills the
processes started with `Hosts.popen` and deletes the namespaces.

    hosts = Hosts.create(["a", "b", "c"])   # raises Unavailable(reason) where it cannot
    proc = hosts.popen("a", ["python", "-c", "print(1)"])
    hosts.address("a")                      # "10.213.7.1"
    hosts.close()
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from collections.abc import Sequence
from typing import Any

SUBNET = "10.213.7"         # a /24 that exists only inside these namespaces
PREFIX = "gfmm"             # namespace names: gfmm<pid><host>
IP_TIMEOUT = 10.0           # seconds for one `ip` command


class Unavailable(Exception):
    """Namespaces cannot be made here; the message says why (the tests skip with it)."""


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> None:
    """Delete namespaces left by an earlier run of these tests whose process is gone."""
    listing = _ip("netns", "list").stdout
    for line in listing.splitlines():
        m = re.fullmatch(rf"({PREFIX}(\d+)[a-z]+)(?: \(id: \d+\))?", line.strip())
        if m and int(m.group(2)) != os.getpid() and not _alive(int(m.group(2))):
            _ip("netns", "del", m.group(1))


class Hosts:
    """Namespaces named after `hosts`; the last one holds the bridge the others plug into.
    Host i gets SUBNET.(i+1)/24."""

    def __init__(self, hosts: Sequence[str]) -> None:
        self.hosts = list(hosts)
        self.ns = {h: f"{PREFIX}{os.getpid()}{h}" for h in self.hosts}
        self.made: list[str] = []
        self.procs: list[subprocess.Popen[Any]] = []

    @classmethod
    def create(cls, hosts: Sequence[str]) -> Hosts:
        if os.geteuid() != 0:
            raise Unavailable("network namespaces need root (ip netns add)")
        if shutil.which("ip") is None:
            raise Unavailable("the `ip` command (iproute2) is not installed")
        remove_stale()
        self = cls(hosts)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def address(self, host: str) -> str:
        return f"{SUBNET}.{self.hosts.index(host) + 1}"

    def _run(self, *args: str, what: str) -> None:
        r = _ip(*args)
        if r.returncode != 0:
            raise Unavailable(f"cannot {what}: `ip {' '.join(args)}` failed: "
                              f"{r.stderr.strip() or r.returncode}")

    def _build(self) -> None:
        for h in self.hosts:
            self._run("netns", "add", self.ns[h], what="create a network namespace")
            self.made.append(self.ns[h])
            self._run("-n", self.ns[h], "link", "set", "lo", "up", what="bring up lo")
        hub = self.hosts[-1]
        self._run("-n", self.ns[hub], "link", "add", "br0", "type", "bridge",
                  what="create a bridge")
        for i, h in enumerate(self.hosts[:-1]):
            port = f"p{i}"
            self._run("-n", self.ns[h], "link", "add", "eth0", "type", "veth", "peer", "name",
                      port, "netns", self.ns[hub], what="create a veth pair")
            self._run("-n", self.ns[hub], "link", "set", port, "master", "br0",
                      what="attach a veth to the bridge")
            self._run("-n", self.ns[hub], "link", "set", port, "up", what="bring up a veth")
            self._run("-n", self.ns[h], "addr", "add", f"{self.address(h)}/24", "dev", "eth0",
                      what="add an address")
            self._run("-n", self.ns[h], "link", "set", "eth0", "up", what="bring up a veth")
        self._run("-n", self.ns[hub], "addr", "add", f"{self.address(hub)}/24", "dev", "br0",
                  what="add an address")
        self._run("-n", self.ns[hub], "link", "set", "br0", "up", what="bring up the bridge")
        self._run("netns", "exec", self.ns[hub], "true", what="run a command in a namespace")

    def popen(self, host: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start `argv` inside `host`'s namespace, in its own process group (see `kill`)."""
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns[host], *argv],
                                start_new_session=True, **kwargs)
        self.procs.append(proc)
        return proc

    @staticmethod
    def kill(proc: subprocess.Popen[Any], timeout: float = 5.0) -> None:
        """SIGKILL `proc`'s whole process group (while its leader lives) and reap it."""
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        for proc in self.procs:
            self.kill(proc)
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        self.procs.clear()
        for name in reversed(self.made):
            _ip("netns", "del", name)
        self.made.clear()
