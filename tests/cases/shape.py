"""Cases for ops/shape.py."""

import numpy as np

from tests.cases import OpCase


def _one(shape):
    return lambda rng: [rng.standard_normal(shape)]


def _transpose(x, axes):
    return np.transpose(x, axes)


def _slice(x, begin, end):
    return x[tuple(slice(b, e) for b, e in zip(begin, end))]


CASES = [
    OpCase("transpose", _one((3, 4)), _transpose, attrs={"axes": (1, 0)}, label="2d"),
    OpCase("transpose", _one((3, 2, 4, 5)), _transpose, attrs={"axes": (2, 3, 1, 0)},
           label="nchw_hwcn"),
    OpCase("transpose", _one((4, 5, 2, 3)), _transpose, attrs={"axes": (3, 2, 0, 1)},
           label="hwcn_nchw"),
    OpCase("transpose", _one((9, 2, 10)), _transpose, attrs={"axes": (2, 1, 0)},
           label="tiles"),  # 9 x 10: one full 8 x 8 tile plus both edges
    OpCase("transpose", _one((2, 3, 4)), _transpose, attrs={"axes": (1, 0, 2)}, label="generic"),
    OpCase("transpose", _one((2, 1, 3)), _transpose, attrs={"axes": (2, 0, 1)}, label="unit"),
    OpCase("reshape", _one((2, 3, 4)), lambda x, shape: x.reshape(shape),
           attrs={"shape": (4, -1)}),
    OpCase("reshape", _one((6,)), lambda x, shape: x.reshape(shape), attrs={"shape": (2, 1, 3)},
           label="expand"),
    OpCase("flatten", _one((2, 3, 4)), lambda x: x.reshape(2, -1)),
    OpCase("concat", lambda rng: [rng.standard_normal((2, 3)), rng.standard_normal((2, 1)),
                                  rng.standard_normal((2, 2))],
           lambda *xs, axis: np.concatenate(xs, axis=axis), attrs={"axis": 1}),
    OpCase("concat", lambda rng: [rng.standard_normal((1, 2, 3)), rng.standard_normal((2, 2, 3))],
           lambda *xs, axis: np.concatenate(xs, axis=axis), attrs={"axis": 0}, label="axis0"),
    OpCase("slice", _one((4, 5, 3)), _slice, attrs={"begin": (1, 0, 2), "end": (3, None, 3)}),
    OpCase("slice", _one((4, 5)), _slice, attrs={"begin": (0, 0), "end": (None, None)},
           label="all"),
    OpCase("slice", _one((5, 2, 3)), _slice, attrs={"begin": (1, 0, 0), "end": (4, None, None)},
           label="rows"),
    OpCase("pad", _one((2, 3, 2)), lambda x, pads: np.pad(x, pads),
           attrs={"pads": ((0, 1), (2, 0), (1, 1))}),
]
