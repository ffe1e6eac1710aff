"""Wire format: a tensor is [msgpack header, raw buffer]; control messages carry arrays likewise.

Everything decoded here is untrusted: headers are size-capped and unpacked with small msgpack
limits, dtypes come from an allow-list, and the byte count is checked before the buffer is
viewed as an array. Arrays are native-endian (the machines here are all little-endian).

    >>> frames = encode_tensor("lc1/relu->w1@mb0", "w0", np.ones((2, 3), np.float32), step=4)
    >>> meta, x = decode_tensor(bytes(frames[0]), bytes(frames[1]))
    >>> meta["key"], meta["step"], x.shape
    ('lc1/relu->w1@mb0', 4, (2, 3))
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from graphflow.errors import GraphflowError

DTYPES = frozenset({"float32", "float64", "int32", "int64", "uint8"})
_NATIVE = {np.dtype(n): n for n in DTYPES}       # native dtype -> wire name (fast path)
_BY_NAME = {n: np.dtype(n) for n in DTYPES}
MAX_DIMS = 8
TENSOR_HEADER_MAX = 4096                # bytes
TENSOR_STR_MAX = 1024                   # bytes of a header's string (key, src): unpack limit
CONTROL_HEADER_MAX = 16 * 1024 * 1024   # bytes; plans are about 1 MB of msgpack
# bytes in one frame: receivers set it as MAXMSGSIZE, and libzmq drops (disconnects) a peer
# that sends more, silently; so senders refuse a larger array themselves
MAX_FRAME_BYTES = 1 << 30
_KEY_SHOWN = 80                         # characters of a key quoted in an error
_ND_EXT = 1                             # msgpack ExtType code of an array reference
_SHARED_EXT = 2                         # ... of a shared-memory array (transport/shared.py)

_unpackb = functools.partial(msgpack.unpackb, raw=False, strict_map_key=True)
_TENSOR_UNPACK = functools.partial(_unpackb, max_str_len=TENSOR_STR_MAX, max_bin_len=0,
                                   max_array_len=64, max_map_len=16, max_ext_len=0)
_CONTROL_UNPACK = functools.partial(_unpackb, max_str_len=4 * 1024 * 1024,
                                    max_bin_len=CONTROL_HEADER_MAX, max_array_len=1 << 21,
                                    max_map_len=1 << 20, max_ext_len=256)
_REF_UNPACK = functools.partial(_unpackb, max_str_len=16, max_bin_len=0,
                                max_array_len=MAX_DIMS + 1, max_map_len=0, max_ext_len=0)
_SHARED_UNPACK = functools.partial(_unpackb, max_str_len=64, max_bin_len=0,
                                   max_array_len=MAX_DIMS + 2, max_map_len=0, max_ext_len=0)


class TransportError(GraphflowError):
    """Base class of the transport's errors (bad frames, silent peers, remote failures)."""


class FrameError(TransportError):
    """A received message is malformed or hostile: it names the key / sender when known."""


def short_key(key: str) -> str:
    """`key` quoted for an error message, cut to its first characters if long."""
    if len(key) <= _KEY_SHOWN:
        return repr(key)
    return f"{key[:_KEY_SHOWN - 20]!r}... ({len(key)} characters)"


def _where(key: Any = None, src: Any = None) -> str:
    parts = [f"tensor {short_key(key)}" if isinstance(key, str) else "message"]
    if isinstance(src, str):
        parts.append(f"from {short_key(src)}")
    return " ".join(parts)


def describe(where: Any) -> str:
    return where() if callable(where) else where


def _view(frame: Any) -> memoryview:
    """A flat byte view of bytes, a memoryview, an ndarray or a zmq.Frame."""
    if isinstance(frame, np.ndarray):
        frame = np.ascontiguousarray(frame).reshape(-1).view(np.uint8)
    view = memoryview(getattr(frame, "buffer", frame))
    if view.ndim == 1 and view.format in ("B", "b", "c"):
        return view
    try:
        return view.cast("B")
    except TypeError as e:
        raise FrameError(f"payload is not a flat byte buffer ({e})") from None


def wire_array(array: Any, what: Any = "array") -> tuple[np.ndarray, str]:
    """(`array` as a C-contiguous native-endian ndarray, its dtype name); copies if needed."""
    a = np.asarray(array)
    check_frame_size(a.nbytes, what)  # (before a copy: a broadcast view may be huge)
    name = _NATIVE.get(a.dtype)
    if name is None:
        if a.dtype.name not in DTYPES:
            raise FrameError(f"{describe(what)}: dtype {a.dtype.str!r} cannot be sent "
                             f"(allowed: {', '.join(sorted(DTYPES))})")
        name = a.dtype.name
        a = a.astype(a.dtype.newbyteorder("="))
    return (a if a.flags.c_contiguous else a.copy(order="C")), name


def check_frame_size(nbytes: int, what: Any = "array") -> None:
    """FrameError if an array of `nbytes` is over MAX_FRAME_BYTES: the receiver would drop it
    and close the connection without a word (the sender then waits its whole timeout)."""
    if nbytes > MAX_FRAME_BYTES:
        raise FrameError(f"{describe(what)}: {nbytes} bytes cannot be sent, over the "
                         f"{MAX_FRAME_BYTES}-byte limit of one zmq frame (MAX_FRAME_BYTES); "
                         "send it in parts")


def array_nbytes(dtype: Any, shape: Any, where: Any) -> int:
    """Validate an untrusted (dtype, shape); the bytes such an array takes.

    `where` (a str, or a callable returning one) prefixes error messages.
    """
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise FrameError(f"{describe(where)}: dtype {dtype!r} is not allowed "
                         f"(allowed: {', '.join(sorted(DTYPES))})")
    if not isinstance(shape, list | tuple) or len(shape) > MAX_DIMS:
        raise FrameError(f"{describe(where)}: shape must be a list of at most {MAX_DIMS} ints, "
                         f"got {shape!r}")
    if not all(type(d) is int and d >= 0 for d in shape):
        raise FrameError(f"{describe(where)}: shape {list(shape)} has a negative or "
                         "non-integer dim")
    return math.prod(shape) * _BY_NAME[dtype].itemsize


def check_array(dtype: Any, shape: Any, buffer: Any, where: Any) -> np.ndarray:
    """Validate an untrusted (dtype, shape, buffer); a read-only array viewing the buffer.

    `where` (a str, or a callable returning one) prefixes error messages.
    """
    want = array_nbytes(dtype, shape, where)
    view = _view(buffer)
    if want != view.nbytes:
        raise FrameError(f"{describe(where)}: shape {list(shape)} {dtype} needs {want} bytes, "
                         f"the payload has {view.nbytes}")
    a = np.ndarray(shape, _BY_NAME[dtype], view)
    if not a.flags.aligned:
        a = a.copy()
    a.flags.writeable = False  # it may be the sender's memory (inproc): never write through it
    return a


def _unpack(data: Any, limit: int, unpack: Any, where: str, **kw: Any) -> Any:
    view = _view(data)
    if view.nbytes > limit:
        raise FrameError(f"{where}: header of {view.nbytes} bytes exceeds the {limit}-byte cap")
    try:
        return unpack(view, **kw)
    except FrameError:
        raise
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise FrameError(f"{where}: bad msgpack header ({type(e).__name__}: {e})") from None


# ---- tensors: [header {key, src, dtype, shape, step}, raw buffer] -------------------------------

def encode_tensor(key: str, src: str, array: Any, step: int = 0) -> list[Any]:
    """The two frames of a tensor message: [header bytes, C-contiguous ndarray].

    The array itself is the second frame so that zmq can send it without copying.

        >>> header, buf = encode_tensor("k", "w0", np.arange(3.0))
        >>> buf.flags.c_contiguous, isinstance(header, bytes)
        (True, True)
    """
    a, dtype = wire_array(array, lambda: _where(key, src))
    return [tensor_header(key, src, dtype, a.shape, step), a]


def tensor_header(key: str, src: str, dtype: str, shape: tuple[int, ...], step: int,
                  ring: list[Any] | None = None) -> bytes:
    """A tensor message's header; `ring` names the shared-memory slot holding the bytes
    (transport/ring.py), in place of the second frame's."""
    for field, text in (("key", key), ("src", src)):  # (a receiver would drop it unread)
        if len(text.encode()) > TENSOR_STR_MAX:
            raise FrameError(f"{_where(key, src)}: its {field} of {len(text.encode())} bytes "
                             f"is over the {TENSOR_STR_MAX}-byte limit (TENSOR_STR_MAX): "
                             "give the node a shorter name")
    meta = {"key": key, "src": src, "dtype": dtype, "shape": list(shape), "step": int(step)}
    if ring is not None:
        meta["ring"] = ring
    header = msgpack.packb(meta)
    if len(header) > TENSOR_HEADER_MAX:
        raise FrameError(f"{_where(key, src)}: header of {len(header)} bytes exceeds the "
                         f"{TENSOR_HEADER_MAX}-byte limit (a key of {len(key)} characters: "
                         "give the node a shorter name)")
    return header


def decode_tensor(header: Any, buffer: Any, ring: Ring | None = None
                  ) -> tuple[dict[str, Any], np.ndarray]:
    """Validate an untrusted tensor message: (meta, read-only array viewing `buffer`, or the
    shared-memory slot its header names when `ring` may map one: transport/ring.py).

        >>> meta, x = decode_tensor(*encode_tensor("k", "w0", np.zeros((0, 4), np.int32)))
        >>> x.shape, meta["src"]
        ((0, 4), 'w0')
    """
    return _decode_usual(header, buffer, ring) or _decode_checked(header, buffer, ring)


def _decode_usual(header: Any, buffer: Any, ring: Ring | None
                  ) -> tuple[dict[str, Any], np.ndarray] | None:
    # A receiving thread's microseconds count: with 4-5 us more Python work per 1 MB tensor,
    # ipc streams ran a fifth slower here (the zmq I/O threads share the two cores). So the
    # usual message is checked in 2.3 us, not 3.3; None hands anything else to the full check,
    # which names what is wrong.
    head = _view(header)
    if head.nbytes > TENSOR_HEADER_MAX:
        return None
    try:  # _TENSOR_UNPACK's limits, spelled out (through the partial it took 0.2 us more)
        meta = msgpack.unpackb(head, raw=False, strict_map_key=True,
                               max_str_len=TENSOR_STR_MAX,
                               max_bin_len=0, max_array_len=64, max_map_len=16, max_ext_len=0)
    except Exception:  # noqa: BLE001 - malformed: the full check explains
        return None
    if type(meta) is not dict:
        return None
    name, shape = meta.get("dtype"), meta.get("shape")
    dtype = _BY_NAME.get(name) if type(name) is str else None
    if (dtype is None or type(shape) is not list or len(shape) > MAX_DIMS
            or type(meta.get("key")) is not str or type(meta.get("src")) is not str
            or type(meta.get("step")) is not int):
        return None
    for d in shape:
        if type(d) is not int or d < 0:
            return None
    data = _view(buffer)
    if math.prod(shape) * dtype.itemsize != data.nbytes:
        if ring is None or data.nbytes or "ring" not in meta:
            return None
        return meta, ring(meta["ring"], name, shape, lambda: _where(meta["key"], meta["src"]))
    a = np.ndarray(shape, dtype, data)
    if not a.flags.aligned:
        return None
    a.flags.writeable = False  # as check_array: it may be the sender's memory (inproc)
    return meta, a


def _decode_checked(header: Any, buffer: Any, ring: Ring | None
                    ) -> tuple[dict[str, Any], np.ndarray]:
    meta = _unpack(header, TENSOR_HEADER_MAX, _TENSOR_UNPACK, "tensor header")
    if not isinstance(meta, dict):
        raise FrameError(f"tensor header: expected a map, got {type(meta).__name__}")
    where = lambda: _where(meta.get("key"), meta.get("src"))  # noqa: E731 - built on error only
    for field, kind in (("key", str), ("src", str), ("step", int)):
        if not isinstance(meta.get(field), kind) or isinstance(meta.get(field), bool):
            raise FrameError(f"{where()}: header field {field!r} must be {kind.__name__}, "
                             f"got {meta.get(field)!r}")
    if "ring" in meta:
        if ring is None:
            raise FrameError(f"{where()}: names a shared-memory slot, which only an ipc inbox "
                             "takes")
        if _view(buffer).nbytes:
            raise FrameError(f"{where()}: names a shared-memory slot and carries bytes too")
        return meta, ring(meta["ring"], meta.get("dtype"), meta.get("shape"), where)
    return meta, check_array(meta.get("dtype"), meta.get("shape"), buffer, where)


# ---- control messages: nested msgpack data with arrays moved to their own frames ---------------

@dataclass(frozen=True)
class SharedRef:
    """An array in shared memory as a message carries it (see transport/shared.py): its file's
    name under /dev/shm, its dtype and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]


Attach = Callable[[str, str, list[int]], np.ndarray]  # (name, dtype, shape) -> the array
# (slot reference, dtype, shape, where) -> the array in that shared-memory slot (ring.py)
Ring = Callable[[Any, Any, Any, Any], np.ndarray]


def encode_message(obj: Any) -> list[Any]:
    """Frames of a control message: [msgpack header, array frames...].

    `obj` is nested dicts (str keys) / lists / tuples / str / int / float / bool / None / bytes
    and ndarrays anywhere; each array becomes its own zero-copy frame, referenced from the header
    by a msgpack extension (index, dtype, shape). A `SharedRef` stays a reference (name, dtype,
    shape) for the receiver to map. Numpy scalars become Python scalars.

        >>> frames = encode_message({"w": np.ones(3, np.float32), "lr": 0.1})
        >>> len(frames), decode_message(frames)["lr"]
        (2, 0.1)
    """
    arrays: list[np.ndarray] = []

    def default(o: Any) -> Any:
        if isinstance(o, np.ndarray):
            a, dtype = wire_array(o, lambda: f"message: array {_path_to(obj, o) or '?'}")
            arrays.append(a)
            ref = msgpack.packb([len(arrays) - 1, dtype, *a.shape])
            return msgpack.ExtType(_ND_EXT, ref)
        if isinstance(o, SharedRef):
            return msgpack.ExtType(_SHARED_EXT, msgpack.packb([o.name, o.dtype, *o.shape]))
        if isinstance(o, np.generic):
            return o.item()
        raise FrameError(f"message: cannot encode a {type(o).__name__}")

    header = msgpack.packb(obj, default=default)
    if len(header) > CONTROL_HEADER_MAX:
        raise FrameError(f"message: header of {len(header)} bytes exceeds {CONTROL_HEADER_MAX}")
    return [header, *arrays]


def _path_to(obj: Any, target: Any, depth: int = 8) -> str | None:
    """Where `target` sits in `obj`, as `['args']['feeds']['x']` (for an error about it)."""
    if obj is target:
        return ""
    if depth == 0:
        return None
    items = obj.items() if isinstance(obj, dict) else \
        enumerate(obj) if isinstance(obj, list | tuple) else ()
    for k, v in items:
        if (sub := _path_to(v, target, depth - 1)) is not None:
            return f"[{k!r}]{sub}"
    return None


def message_id(frames: list[Any]) -> Any:
    """The "id" of a message `decode_message` refused, if its header still reads (arrays not
    looked at), so that the error can go back to the caller; None otherwise."""
    try:
        head = _unpack(frames[0], CONTROL_HEADER_MAX, _CONTROL_UNPACK, "message",
                       ext_hook=lambda code, data: None)
    except (FrameError, IndexError):
        return None
    return head.get("id") if isinstance(head, dict) else None


def decode_message(frames: list[Any], attach: Attach | None = None) -> Any:
    """Validate and decode the frames of `encode_message` (arrays view their frames); a shared
    array is mapped by `attach`, and refused without one (a connection from another host)."""
    if not frames:
        raise FrameError("message: no frames")
    payloads = frames[1:]
    used: set[int] = set()

    def ext_hook(code: int, data: bytes) -> Any:
        if code == _SHARED_EXT:
            return shared(data)
        if code != _ND_EXT:
            raise FrameError(f"message: unknown msgpack extension type {code}")
        ref = _unpack(data, 256, _REF_UNPACK, "message array reference")
        if not isinstance(ref, list) or len(ref) < 2 or type(ref[0]) is not int:
            raise FrameError(f"message: bad array reference {ref!r}")
        index = ref[0]
        if not 0 <= index < len(payloads) or index in used:
            raise FrameError(f"message: array reference {index} does not match one of the "
                             f"{len(payloads)} array frames")
        used.add(index)
        return check_array(ref[1], ref[2:], payloads[index], f"message array {index}")

    def shared(data: bytes) -> np.ndarray:
        if attach is None:
            raise FrameError("message: a shared-memory array is only taken over a local (ipc) "
                             "connection")
        ref = _unpack(data, 256, _SHARED_UNPACK, "message shared-array reference")
        if not isinstance(ref, list) or len(ref) < 2:
            raise FrameError(f"message: bad shared-array reference {ref!r}")
        return attach(ref[0], ref[1], ref[2:])

    obj = _unpack(frames[0], CONTROL_HEADER_MAX, _CONTROL_UNPACK, "message",
                  ext_hook=ext_hook)
    if len(used) != len(payloads):
        raise FrameError(f"message: {len(payloads)} array frames but the header references "
                         f"{len(used)}")
    return obj
