"""CURVE encryption and client allow-lists for endpoints whose traffic leaves the machine.

A `CurveConfig` is one endpoint's keypair and the public keys of the clients it lets in; the
ZAP handler (pyzmq's ThreadAuthenticator, one per zmq context) checks each connecting client's
key against the allow-list of the domain its socket names.
"""

from __future__ import annotations

import threading
from collections.abc import Collection
from dataclasses import dataclass

import zmq
from zmq.auth.thread import ThreadAuthenticator


@dataclass(frozen=True)
class CurveConfig:
    """CURVE keys of one endpoint (z85 bytes), for traffic that leaves the machine.

    The keypair serves the endpoint's bound socket and authenticates its outgoing connections;
    only clients whose public key is in `allowed_clients` get through.

        >>> a, b = CurveConfig.generate(), CurveConfig.generate()
        >>> a = CurveConfig(a.secret_key, a.public_key, allowed_clients=[b.public_key])
    """

    secret_key: bytes
    public_key: bytes
    allowed_clients: Collection[bytes] = ()

    @classmethod
    def generate(cls, allowed_clients: Collection[bytes] = ()) -> CurveConfig:
        """A fresh keypair (zmq.curve_keypair) with the given allow-list."""
        public, secret = zmq.curve_keypair()
        return cls(secret, public, tuple(allowed_clients))


class _AllowList:
    """ZAP credentials provider: ZAP domain -> allowed client public keys (z85)."""

    def __init__(self) -> None:
        self.domains: dict[str, frozenset[bytes]] = {}

    def callback(self, domain: str, key: bytes) -> bool:
        return key in self.domains.get(domain, frozenset())


_AUTH_LOCK = threading.Lock()
_AUTH: dict[int, tuple[ThreadAuthenticator, _AllowList]] = {}  # one ZAP handler per context


def allow_clients(context: zmq.Context, domain: str, keys: Collection[bytes]) -> None:
    """Let only clients with these public keys through to sockets of ZAP `domain`."""
    with _AUTH_LOCK:
        if id(context) not in _AUTH:
            auth = ThreadAuthenticator(context)
            auth.start()
            _AUTH[id(context)] = (auth, _AllowList())
        auth, allow = _AUTH[id(context)]
        allow.domains[domain] = frozenset(keys)
        auth.configure_curve_callback(domain, allow)


def disallow_clients(context: zmq.Context, domain: str) -> None:
    """Forget `domain` (its socket closed); the context's ZAP handler stops with the last."""
    with _AUTH_LOCK:
        auth, allow = _AUTH[id(context)]
        allow.domains.pop(domain, None)
        auth.credentials_providers.pop(domain, None)
        if not allow.domains:
            auth.stop()
            del _AUTH[id(context)]
