"""Cases for ops/matmul.py."""

from tests.cases import OpCase


def _pair(a_shape, b_shape):
    return lambda rng: [rng.standard_normal(a_shape), rng.standard_normal(b_shape)]


def _ref(a, b, transpose_a=False, transpose_b=False):
    return (a.T if transpose_a else a) @ (b.T if transpose_b else b)


CASES = [
    OpCase("matmul", _pair((4, 5), (5, 3)), _ref),
    OpCase("matmul", _pair((5, 4), (5, 3)), _ref, attrs={"transpose_a": True}, label="ta"),
    OpCase("matmul", _pair((4, 5), (3, 5)), _ref, attrs={"transpose_b": True}, label="tb"),
    OpCase("matmul", _pair((5, 4), (3, 5)), _ref,
           attrs={"transpose_a": True, "transpose_b": True}, label="tatb"),
    OpCase("matmul", _pair((1, 6), (6, 1)), _ref, label="vectors"),
]
