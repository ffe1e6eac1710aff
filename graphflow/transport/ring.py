"""Large tensors between processes on one machine, through shared memory instead of the socket.

Over ipc, ZeroMQ moves a tensor's bytes twice, into the kernel's socket buffer and out again,
each time on an I/O thread, and the receiver gets a freshly allocated copy: about 200 us of CPU
a megabyte, on the two cores the workers compute on. An endpoint sending to a peer over ipc
instead copies a large tensor into a slot of its ring for that peer (a file in /dev/shm each)
and sends only the header, naming the slot. The receiver views the slot read-only; when the
last view of it is freed, a finalizer clears the slot's busy byte in the ring's flags file,
and the sender may fill it again. One copy in all, made by the sender, which may change its
own array at once (no zero-copy tracker to wait for).

The sender keeps at most MAX_SLOTS slots of at most MAX_RING_BYTES in all per peer; with every
slot busy (a receiver that keeps many tensors, or one that died) a tensor goes by the socket
as before. The receiver maps a ring's files once, unlinks them (both mappings outlive the
names; the sender unlinks what is left when it closes), and takes references only on an ipc
inbox, and only to files of this user named as a ring names them.
"""

from __future__ import annotations

import math
import mmap
import re
import threading
import time
import uuid
import weakref
from typing import Any

import numpy as np

from graphflow.transport.frames import FrameError, array_nbytes, describe
from graphflow.transport.shared import create_ours, exists_ours, map_ours, unlink_ours

RING_MIN_BYTES = 64 * 1024     # smaller tensors ride in the message (cheaper than a slot)
MAX_SLOTS = 64                 # slots per peer
MAX_RING_BYTES = 512 << 20     # bytes of slots per peer
FLAG_STRIDE = 64               # a cache line per busy byte: the two processes write them
_NAME = re.compile(r"graphflow-ring-[0-9a-f]{32}-(flags|[0-9]{1,3})")


class SendRing:
    """The sender's slots for one peer. `put` copies an array into a free slot and returns the
    header fields that name it, or None when no slot can take it. Raises OSError when
    /dev/shm cannot hold even the flags."""

    def __init__(self) -> None:
        self.prefix = f"graphflow-ring-{uuid.uuid4().hex}-"
        flags = create_ours(self.prefix + "flags", MAX_SLOTS * FLAG_STRIDE)
        self.flags = np.frombuffer(flags, np.uint8)[::FLAG_STRIDE]  # (holds the mapping)
        self._slots: list[np.ndarray] = []   # slot i's bytes, file prefix + i
        self._full = False  # /dev/shm refused a slot: grow no more

    def put(self, a: np.ndarray) -> list[Any] | None:
        """Copy C-contiguous `a` into a free slot; [ring prefix, slot index] for its header."""
        free = [i for i, s in enumerate(self._slots)
                if self.flags[i] == 0 and s.nbytes >= a.nbytes]
        if free:
            i = min(free, key=lambda j: self._slots[j].nbytes)
        elif (not self._full and len(self._slots) < MAX_SLOTS
              and sum(s.nbytes for s in self._slots) + a.nbytes <= MAX_RING_BYTES):
            i = len(self._slots)
            size = max(a.nbytes, RING_MIN_BYTES)
            try:
                self._slots.append(np.frombuffer(create_ours(f"{self.prefix}{i}", size), np.uint8))
            except OSError:
                self._full = True
                return None
        else:
            return None
        self.flags[i] = 1  # busy until the receiver's last view of it is freed
        np.copyto(self._slots[i][:a.nbytes].view(a.dtype).reshape(a.shape), a)
        return [self.prefix, i]

    def release(self, ref: list[Any]) -> None:
        """Free the slot `put` returned `ref` for, when its message did not go out."""
        self.flags[ref[1]] = 0

    def busy(self) -> int:
        """How many slots a receiver still holds."""
        return int(np.count_nonzero(self.flags[:len(self._slots)]))

    def close(self, linger: float = 0.0) -> None:
        """Unlink the files the receiver has not (idempotent); the mappings last while used.
        A busy slot whose file is still there is a tensor on its way that the receiver has not
        opened yet (it unlinks a file once mapped): up to `linger` seconds are given to it, as
        ZeroMQ gives its queued messages. Unlinked at once, a peer's last tensors of an
        all-reduce were lost now and then when the sender finished first."""
        deadline = time.monotonic() + linger
        while time.monotonic() < deadline and any(
                self.flags[i] and exists_ours(f"{self.prefix}{i}")
                for i in range(len(self._slots))):
            time.sleep(0.001)
        for name in ["flags", *map(str, range(len(self._slots)))]:
            unlink_ours(self.prefix + name)


class RingViews:
    """The receiver's side: read-only views of the slots named in tensor headers."""

    def __init__(self) -> None:
        self._maps: dict[str, mmap.mmap] = {}
        self._lock = threading.Lock()

    def view(self, ref: Any, dtype: Any, shape: Any, where: Any) -> np.ndarray:
        """The array of `dtype` and `shape` in the slot `ref` ([ring prefix, slot index], from
        a header) names; the slot is free again once the array and every view of it are gone.
        `where` (a str, or a callable returning one) prefixes error messages."""
        ring, slot = ref if isinstance(ref, list) and len(ref) == 2 else (None, None)
        if not (isinstance(ring, str) and type(slot) is int and 0 <= slot < MAX_SLOTS
                and _NAME.fullmatch(f"{ring}{slot}")):
            raise FrameError(f"{describe(where)}: bad shared-memory slot {ref!r}")
        nbytes = array_nbytes(dtype, shape, where)
        flags = self._map(ring + "flags", MAX_SLOTS * FLAG_STRIDE, True, where)
        data = self._map(f"{ring}{slot}", nbytes, False, where)
        base = np.frombuffer(data, np.dtype(dtype), math.prod(shape))
        weakref.finalize(base, _release, flags, slot * FLAG_STRIDE)
        a = base.reshape(shape)
        a.flags.writeable = False
        return a

    def _map(self, name: str, size: int, write: bool, where: Any) -> mmap.mmap:
        with self._lock:
            mm = self._maps.get(name)
            if mm is None:
                mm = self._maps[name] = map_ours(name, describe(where), write)
                unlink_ours(name)  # mapped at both ends now: nothing is left in /dev/shm
        if len(mm) < size:
            raise FrameError(f"{describe(where)}: needs {size} bytes, slot {name} has {len(mm)}")
        return mm


def _release(flags: mmap.mmap, offset: int) -> None:
    flags[offset] = 0
