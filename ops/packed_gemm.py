"""x @ w against a copy of w packed panel by panel, for the forward passes of a step.

`small_gemm.matmul_nn` reads w a panel at a time, 128 rows by 64 columns, each row's 256 bytes
a whole row of w apart: from memory that pattern feeds 105-140 GFLOP/s. Packed in the order the
kernel visits it (each panel's rows one after another), w streams front to back, and with the
panel two ahead asked for, the same kernel runs at 220-245 GFLOP/s at 16-64 rows against a
2560 x 8192 weight (6.5 -> 3.0 ms at 16 rows, 19.1 -> 10.9 at 64; one core). Those unpacked
times were with w 16-48 bytes off a cache line, as malloc left most weights; with weights
aligned (ops/aligned.py) a later run measured 5.1 -> 3.4 and 16.8 -> 11.3 ms.

Packing is a pass over w (5.2-5.9 ms for those 84 MB), paid after every update, so a worker
packs only while it would wait anyway (runtime/worker.py): a later pipeline stage waits for the
first micro-batch at the start of every step. `PackedWeights` keeps one worker's packed copies;
`using(...)` makes them the ones `matmul_into` looks in, on the worker's compute thread. The
packed kernel does the same sums in the same order as matmul_nn: the same product, bit for bit.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
from numba import njit

from graphflow.ir import Node
from graphflow.ops import aligned, small_gemm
from graphflow.ops.simd import LANES, vload, vstore4
from graphflow.ops.small_gemm import BLOCK_ROWS, CHUNK_COLS, PANEL, _nn_row1, _nn_rows4

AHEAD = 2  # panels ahead the kernel asks for (1: 199 GFLOP/s, 2-4: 222, 8: 217 at 16 rows)


@njit(nogil=True, cache=True)
def pack_chunk(w: np.ndarray, out: np.ndarray, j0: int) -> None:
    """Pack w's columns j0.. of one chunk (CHUNK_COLS wide, whole panels only) into flat `out`,
    in matmul_nn's visiting order: chunk, block of BLOCK_ROWS rows, panel, row."""
    k, n = w.shape
    c = n - n % PANEL
    j1 = min(c, j0 + CHUNK_COLS)
    flat = w.reshape(-1)
    q = j0 * k  # the chunks before this one, all whole
    for k0 in range(0, k, BLOCK_ROWS):
        for j in range(j0, j1, PANEL):
            for p in range(k0, min(k, k0 + BLOCK_ROWS)):
                s = p * n + j
                vstore4(out, q, vload(flat, s), vload(flat, s + 16), vload(flat, s + 32),
                        vload(flat, s + 48))
                q += PANEL


@njit(nogil=True, cache=True)
def matmul_nn_packed(a: np.ndarray, pb: np.ndarray, out: np.ndarray) -> int:
    """out[:, :c] = a (m, k) @ w[:, :c] for w (k, n) packed into flat `pb` (`pack_chunk`),
    where c is n rounded down to whole panels; returns c (the caller does the rest)."""
    m, k = a.shape
    n = out.shape[1]
    c = n - n % PANEL
    m4 = m - m % 4
    flat_out = out.reshape(-1)
    out[:, :c] = 0
    q = 0
    for j0 in range(0, c, CHUNK_COLS):
        for k0 in range(0, k, BLOCK_ROWS):
            k1 = min(k, k0 + BLOCK_ROWS)
            for j in range(j0, min(c, j0 + CHUNK_COLS), PANEL):
                at = q - k0 * PANEL  # (row p of the panel at at + p * PANEL)
                for i in range(0, m4, 4):  # each row block asks for its line of each row
                    line = (i // 4) % (PANEL // LANES) * LANES
                    _nn_rows4(a, pb, flat_out, i, j, n, k0, k1, at, PANEL,
                              AHEAD * (k1 - k0) * PANEL + line)
                for i in range(m4, m):
                    _nn_row1(a, pb, flat_out, i, j, n, k0, k1, at, PANEL)
                q += (k1 - k0) * PANEL
    return c


class PackedWeights:
    """One worker's packed copies of the weights its forward passes multiply by, kept fresh
    for a step: `begin_step` marks them all stale (an update rewrote the weights), `pack_next`
    packs a chunk of the next one while the worker is idle, and `forward` multiplies by the
    packed copy once the whole of it is packed.

    >>> w = np.arange(256 * 64, dtype=np.float32).reshape(256, 64)
    >>> pw = PackedWeights({"w": w})
    >>> pw.begin_step({"w": w}, forwards=1); pw.pending()
    True
    >>> while pw.pack_next(): pass
    >>> x = np.ones((2, 256), np.float32); out = np.empty((2, 64), np.float32)
    >>> bool(pw.forward(x, w, out) == 64 and (out == x @ w).all())
    True
    """

    def __init__(self, weights: dict[str, np.ndarray]) -> None:
        self._buffers = {name: aligned.empty(_packed_size(w), np.float32)
                         for name, w in weights.items()}
        self._chunks = {name: _chunks(w) for name, w in weights.items()}  # (shapes are fixed)
        self._weights: dict[int, str] = {}  # id of the step's array -> its name
        self._chunks_done: dict[str, int] = {}  # name -> chunks packed this step
        self._uses_left: dict[str, int] = {}
        self._arrays: dict[str, np.ndarray] = {}
        self.chunks_packed = 0  # in all steps

    def begin_step(self, weights: dict[str, np.ndarray], forwards: int) -> None:
        """The step's weight arrays (by name); each serves `forwards` forward passes."""
        self._weights = {id(weights[name]): name for name in self._buffers}
        self._chunks_done = dict.fromkeys(self._buffers, 0)
        self._uses_left = dict.fromkeys(self._buffers, forwards)
        self._arrays = weights

    def pending(self) -> bool:
        """Whether a weight a forward pass still needs is not yet packed."""
        return any(self._uses_left[n] > 0 and self._chunks_done[n] < self._chunks[n]
                   for n in self._buffers)

    def pack_next(self) -> bool:
        """Pack one chunk (1024 columns) of the first weight still to pack; False if none is."""
        for name, buf in self._buffers.items():
            done = self._chunks_done[name]
            if self._uses_left[name] > 0 and done < self._chunks[name]:
                pack_chunk(self._arrays[name], buf, done * CHUNK_COLS)
                self._chunks_done[name] = done + 1
                self.chunks_packed += 1
                return True
        return False

    def forward(self, a: np.ndarray, w: np.ndarray, out: np.ndarray) -> int | None:
        """out[:, :c] = a @ w[:, :c] from w's packed copy, as `matmul_nn` computes it, if w is
        one of this step's weights and all of it is packed; returns c, or None where the caller
        should run matmul_nn itself. Counts the forward pass either way.

        (Packing in a first stage's first forward, as it reads w, for its later micro-batches:
        the pipelined speech-mlp step was 0.5-1.2% faster in one interleaved run, 4% slower in
        the next; not kept.)"""
        name = self._weights.get(id(w))
        if name is None or self._arrays[name] is not w:
            return None
        self._uses_left[name] -= 1
        if self._chunks_done[name] < self._chunks[name]:
            return None
        return matmul_nn_packed(a, self._buffers[name], out)


def _whole_panel_cols(w: np.ndarray) -> int:
    return w.shape[1] - w.shape[1] % PANEL


def _chunks(w: np.ndarray) -> int:
    return -(-_whole_panel_cols(w) // CHUNK_COLS)


def _packed_size(w: np.ndarray) -> int:
    return w.shape[0] * _whole_panel_cols(w)


_current = threading.local()


@contextmanager
def using(weights: PackedWeights | None) -> Iterator[None]:
    """Within: this thread's forward passes look for packed weights in `weights`."""
    before = getattr(_current, "weights", None)
    _current.weights = weights
    try:
        yield
    finally:
        _current.weights = before


def forward(a: np.ndarray, w: np.ndarray, out: np.ndarray) -> int | None:
    """`PackedWeights.forward` by the weights this thread uses (see `using`); None without."""
    weights: PackedWeights | None = getattr(_current, "weights", None)
    return None if weights is None else weights.forward(a, w, out)


def forward_weights(order: list[Node]) -> list[str]:
    """The float32 parameters that are the w of a forward x @ w long and wide enough for
    small_gemm's kernel (the backward's matmuls transpose theirs)."""
    names = []
    for n in order:
        if n.op != "matmul" or n.attrs.get("transpose_a") or n.attrs.get("transpose_b"):
            continue
        w = n.inputs[1]
        if w.op == "parameter" and w.dtype == "float32" and len(w.shape) == 2 and \
                small_gemm.wins(small_gemm.row_limit(), w.shape[1], w.shape[0]):
            names.append(w.name)
    return list(dict.fromkeys(names))
