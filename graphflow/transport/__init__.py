"""ZeroMQ transport: tensor frames (untrusted decoding), worker endpoints, driver RPC.

    >>> from graphflow.transport import Endpoint, RpcClient, RpcServer, PeerTimeout
"""

from graphflow.transport.curve import CurveConfig
from graphflow.transport.endpoint import Endpoint, PeerTimeout
from graphflow.transport.frames import (
    DTYPES,
    FrameError,
    TransportError,
    decode_message,
    decode_tensor,
    encode_message,
    encode_tensor,
)
from graphflow.transport.rpc import RemoteError, RpcClient, RpcServer

__all__ = [
    "DTYPES", "CurveConfig", "Endpoint", "FrameError", "PeerTimeout", "RemoteError",
    "RpcClient", "RpcServer", "TransportError", "decode_message", "decode_tensor",
    "encode_message", "encode_tensor",
]
