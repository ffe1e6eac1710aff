"""Named, seeded parameter initializers.

A parameter's initial value depends only on the graph seed, its name and its initializer, so
every worker and replica that builds the same model gets the same values without talking.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from graphflow.errors import GraphError, did_you_mean
from graphflow.ops import aligned

Initializer = Callable[[np.random.Generator, tuple[int, ...], dict[str, Any]], np.ndarray]


def _fans(shape: tuple[int, ...], attrs: dict[str, Any]) -> tuple[float, float]:
    fan_in = attrs.get("fan_in") or (shape[0] if shape else 1)
    fan_out = attrs.get("fan_out") or (shape[-1] if shape else 1)
    return float(fan_in), float(fan_out)


def glorot_uniform(rng: np.random.Generator, shape: tuple[int, ...],
                   attrs: dict[str, Any]) -> np.ndarray:
    fan_in, fan_out = _fans(shape, attrs)
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, shape)


def he_normal(rng: np.random.Generator, shape: tuple[int, ...],
              attrs: dict[str, Any]) -> np.ndarray:
    fan_in, _ = _fans(shape, attrs)
    return rng.normal(0.0, np.sqrt(2.0 / fan_in), shape)


def normal(rng: np.random.Generator, shape: tuple[int, ...], attrs: dict[str, Any]) -> np.ndarray:
    return rng.normal(0.0, attrs.get("scale", 0.01), shape)


def uniform(rng: np.random.Generator, shape: tuple[int, ...], attrs: dict[str, Any]) -> np.ndarray:
    scale = attrs.get("scale", 0.05)
    return rng.uniform(-scale, scale, shape)


def zeros(rng: np.random.Generator, shape: tuple[int, ...], attrs: dict[str, Any]) -> np.ndarray:
    return np.full(shape, attrs.get("value", 0.0))


INITIALIZERS: dict[str, Initializer] = {
    "glorot_uniform": glorot_uniform, "he_normal": he_normal, "normal": normal,
    "uniform": uniform, "zeros": zeros,
}
# the options each initializer reads: any other is a mistake (`stddev` for `scale`), refused
OPTIONS: dict[str, tuple[str, ...]] = {
    "glorot_uniform": ("fan_in", "fan_out"), "he_normal": ("fan_in",), "normal": ("scale",),
    "uniform": ("scale",), "zeros": ("value",),
}


def check_options(init: str, options: dict[str, Any], where: str) -> None:
    """Raise a GraphError (`where` first: the parameter and the user's line) for an option of
    `options` that initializer `init` does not read."""
    known = OPTIONS[init]
    for key in options:
        if key not in known:
            takes = f"its options: {', '.join(known)}" if known else "it takes no options"
            raise GraphError(f"{where}: initializer '{init}' has no option '{key}'; {takes}"
                             f"{did_you_mean(key, known)}")


def taken(init: str, **options: Any) -> dict[str, Any]:
    """Those of `options` that `init` reads (a layer offers fan_in and fan_out to any init)."""
    return {k: v for k, v in options.items() if k in OPTIONS.get(init, ())}


def initial_value(name: str, attrs: dict[str, Any], graph_seed: int) -> np.ndarray:
    """The initial value of parameter `name` (attrs: shape, dtype, init and its options).

    A block of a partitioned parameter (attr `block`, see `block_of`) gets its slice of the
    whole parameter's value, so a partitioned model starts exactly where the whole one does.
    """
    if "block" in attrs:
        spec = attrs["block"]
        whole = initial_value(spec["of"], spec["attrs"], graph_seed)
        return aligned.copy(block_of(whole, spec))
    init = attrs.get("init", "glorot_uniform")
    if init not in INITIALIZERS:
        raise GraphError(f"parameter '{name}': unknown initializer '{init}', known: "
                         f"{', '.join(INITIALIZERS)}")
    seed = (zlib.crc32(name.encode()) + 1_000_003 * graph_seed) % 2**32
    value = INITIALIZERS[init](np.random.default_rng(seed), tuple(attrs["shape"]), attrs)
    return aligned.copy(value, attrs["dtype"])


def block_of(whole: np.ndarray, spec: dict[str, Any]) -> np.ndarray:
    """The block `spec` ({view, axis, lo, hi, shape}) of a whole parameter's value."""
    index = [slice(None)] * len(spec["view"])
    index[spec["axis"]] = slice(spec["lo"], spec["hi"])
    return whole.reshape(spec["view"])[tuple(index)].reshape(spec["shape"])


def assemble_blocks(shape: tuple[int, ...], blocks: list[tuple[dict[str, Any], np.ndarray]],
                    dtype: str = "float32") -> np.ndarray:
    """The whole parameter (or gradient) of `shape` from its (spec, value) blocks."""
    whole = np.zeros(shape, dtype)
    for spec, value in blocks:
        index = [slice(None)] * len(spec["view"])
        index[spec["axis"]] = slice(spec["lo"], spec["hi"])
        whole.reshape(spec["view"])[tuple(index)] = value.reshape(
            whole.reshape(spec["view"])[tuple(index)].shape)
    return whole
