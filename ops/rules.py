"""The update rules, elementwise: SGD, momentum and DistBelief's Adagrad.

One loop serves every pass that updates a parameter: the optimizer's over a whole gradient
(graphflow/optim.py), the weight-gradient gemm's over each block of rows of the gradient it
has just summed (`short_gemm.matmul_tn_update`) and the locally connected layer's over each
location's block (`local.local_grad_weight_update`), so all give the same parameters, bit
for bit.

Element i of the gradient is x[x_at + i - at] plus, where y has elements, y[i]: a gradient in
two parts (a sum over earlier micro-batches and the last one's) is added as it is read.

>>> import numpy as np
>>> p, g = np.ones(3, np.float32), np.full(3, 2.0, np.float32)
>>> run(SGD, p, p[:0], g, 0, g[:0], 0, 3, np.float32(0.1), 0.0, 0.0, np.float32(1))
>>> [round(float(v), 3) for v in p]
[0.8, 0.8, 0.8]
"""

from __future__ import annotations

import numpy as np
from numba import njit

SGD, MOMENTUM, ADAGRAD = 0, 1, 2


@njit(cache=True, nogil=True, inline="always")
def _element(x: np.ndarray, y: np.ndarray, i: int) -> float:
    # (an empty y: the test is the same for every i, so LLVM takes it out of the loop)
    return x[i] + y[i] if y.size else x[i]


# error_model="numpy": no zero-division check in the loop, so it vectorises (Adagrad 5x)
@njit(cache=True, nogil=True, error_model="numpy")
def run(rule: int, p: np.ndarray, s: np.ndarray, x: np.ndarray, x_at: int, y: np.ndarray,
        at: int, count: int, lr: float, mu: float, eps: float, scale: float) -> None:
    """Update flat p[at:at + count] by `rule` (s: its state slot, velocity or squared sums)
    from the gradient `scale * (x + y)` as above. SGD takes lr already times scale."""
    # slices, indexed from 0: an index that may be negative wraps around, and that check
    # keeps the loops from vectorising (SGD 3x, Adagrad 7x slower)
    p, x = p[at:at + count], x[x_at:x_at + count]
    y = y[at:at + count] if y.size else y
    if rule == SGD:
        for i in range(count):
            p[i] -= lr * _element(x, y, i)
    elif rule == MOMENTUM:
        s = s[at:at + count]
        for i in range(count):
            s[i] = mu * s[i] + scale * _element(x, y, i)
            p[i] -= lr * s[i]
    else:
        s = s[at:at + count]
        for i in range(count):
            gi = scale * _element(x, y, i)
            s[i] += gi * gi
            # the floor: with eps 0, an element that never had a gradient stays (0 / tiny = 0)
            p[i] -= lr * gi / max(np.sqrt(s[i]) + eps, 1e-30)
