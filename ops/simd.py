"""A 16-lane float32 vector for Numba kernels: load, store, splat, zero, fused multiply-add;
and a prefetch hint.

LLVM vectorises loops that reduce along contiguous memory, but not a kernel that keeps a block
of output rows in registers while it walks down a weight's rows (x @ w): it has to be told.
These intrinsics give a kernel `<16 x float>` values that live in registers across a loop
(one AVX-512 register, or two AVX2 ones where that is what the CPU has). The kernels' register
tiles were sized for the first: `WIDE` says whether this CPU has them (their `wins` rules ask;
GRAPHFLOW_WIDE_VECTORS=1 or 0 overrides it, to measure or test either set of rules anywhere).

    >>> import numpy as np
    >>> from numba import njit
    >>> @njit
    ... def axpy16(a, x, y):          # y[:16] += a * x[:16]
    ...     vstore(y, 0, vfma(vsplat(a), vload(x, 0), vload(y, 0)))
    >>> x, y = np.arange(16, dtype=np.float32), np.ones(16, np.float32)
    >>> axpy16(np.float32(2), x, y); float(y[15])
    31.0
"""

from __future__ import annotations

import os
from typing import Any

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils, config
from numba.core.codegen import get_host_cpu_features
from numba.core.errors import TypingError
from numba.extending import intrinsic, models, register_model

LANES = 16
_VEC = ir.VectorType(ir.FloatType(), LANES)
_I32 = ir.IntType(32)

__all__ = ["LANES", "WIDE", "prefetch", "vfma", "vload", "vsplat", "vstore", "vstore4", "vzero"]


def _has_wide_registers() -> bool:
    """Whether the CPU Numba compiles for has AVX-512F, so a vector fits one register. Without
    it the kernels' tiles spill: on an AVX2-only znver3 they ran 1.6-2.2x slower than
    one-thread BLAS at 64 rows, where they ran 1.5-1.8x faster on AVX-512."""
    forced = os.environ.get("GRAPHFLOW_WIDE_VECTORS", "")
    if forced in ("0", "1"):
        return forced == "1"
    features = config.CPU_FEATURES
    if features is None:
        features = get_host_cpu_features()
    return "+avx512f" in features.split(",")


WIDE = _has_wide_registers()


class F32x16(types.Type):
    """Numba's type of a `<16 x float>` value."""

    def __init__(self) -> None:
        super().__init__(name="f32x16")


f32x16 = F32x16()


@register_model(F32x16)
class _F32x16Model(models.PrimitiveModel):
    def __init__(self, dmm: Any, fe_type: Any) -> None:
        super().__init__(dmm, fe_type, _VEC)


def _address(context: Any, builder: Any, arrty: Any, arr: Any, index: Any) -> Any:
    data = context.make_array(arrty)(context, builder, arr).data
    return builder.bitcast(builder.gep(data, [index]), _VEC.as_pointer())


def _flat_float32(arr: Any, where: str) -> None:
    if not (isinstance(arr, types.Array) and arr.dtype == types.float32 and arr.ndim == 1
            and arr.layout == "C"):
        raise TypingError(f"{where}: needs a contiguous 1-D float32 array, got {arr}")


@intrinsic
def vload(typingctx: Any, arr: Any, index: Any) -> Any:
    """arr[index:index + 16] as a vector (no bounds check; any alignment)."""
    _flat_float32(arr, "vload")

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return builder.load(_address(context, builder, sig.args[0], *args), align=4)
    return f32x16(arr, index), codegen


@intrinsic
def vstore(typingctx: Any, arr: Any, index: Any, value: Any) -> Any:
    """arr[index:index + 16] = value (no bounds check; any alignment)."""
    _flat_float32(arr, "vstore")

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> None:
        builder.store(args[2], _address(context, builder, sig.args[0], args[0], args[1]),
                      align=4)
    return types.void(arr, index, value), codegen


@intrinsic
def vsplat(typingctx: Any, x: Any) -> Any:
    """A vector of 16 copies of the float32 `x`."""
    if x != types.float32:
        raise TypingError(f"vsplat: needs a float32, got {x}")

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        one = builder.insert_element(ir.Constant(_VEC, ir.Undefined), args[0],
                                     ir.Constant(_I32, 0))
        return builder.shuffle_vector(one, ir.Constant(_VEC, ir.Undefined),
                                      ir.Constant(ir.VectorType(_I32, LANES), [0] * LANES))
    return f32x16(x), codegen


@intrinsic
def vzero(typingctx: Any) -> Any:
    """A vector of zeros."""
    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return ir.Constant(_VEC, [0.0] * LANES)
    return f32x16(), codegen


@intrinsic
def vfma(typingctx: Any, a: Any, b: Any, c: Any) -> Any:
    """a * b + c, lane by lane, rounded once."""
    if not all(v == f32x16 for v in (a, b, c)):
        raise TypingError(f"vfma: needs three f32x16 vectors, got {a}, {b}, {c}")

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VEC, [_VEC] * 3),
                                             "llvm.fma.v16f32")
        return builder.call(fma, args)
    return f32x16(a, b, c), codegen


@intrinsic
def prefetch(typingctx: Any, arr: Any, index: Any) -> Any:
    """Ask for arr[index]'s cache line in L2 ahead of its use: a hint, which never faults."""
    _flat_float32(arr, "prefetch")

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        address = builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(8).as_pointer())
        hint = ir.FunctionType(ir.VoidType(), [address.type, _I32, _I32, _I32])
        fn = cgutils.get_or_insert_function(builder.module, hint, "llvm.prefetch.p0i8")
        # a read; locality 2 (L2 and out: the line waits there a few thousand cycles); data
        read, locality, data_cache = (ir.Constant(_I32, v) for v in (0, 2, 1))
        builder.call(fn, [address, read, locality, data_cache])
        return context.get_dummy_value()
    return types.void(arr, index), codegen


@njit(nogil=True, cache=True, inline="always")
def vstore4(arr: Any, index: int, v0: Any, v1: Any, v2: Any, v3: Any) -> None:
    """arr[index:index + 64] = the four vectors, one after another (a 64-column panel row)."""
    vstore(arr, index, v0)
    vstore(arr, index + 16, v1)
    vstore(arr, index + 32, v2)
    vstore(arr, index + 48, v3)
