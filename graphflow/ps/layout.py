"""Where each parameter lives: flat slices of the parameters spread over S shards.

All parameters are flattened in sorted-name order and concatenated; the concatenation is cut
into S contiguous ranges whose element counts differ by at most one (so with one itemsize the
shards' bytes differ by at most one element's worth). A parameter crossing a cut is split into
slices; a slice's key is f"{name}[{lo}:{hi}]" over the parameter's flat elements. An empty
parameter gets one empty slice on the shard where its offset falls.

    >>> layout = Layout.build({"b": (4,), "w": (2, 3)}, shards=2)
    >>> [(s.key, s.shard) for s in layout.slices]
    [('b[0:4]', 0), ('w[0:1]', 0), ('w[1:6]', 1)]
    >>> layout.shards_of(["w"]), layout.keys_on(1)
    ([0, 1], ['w[1:6]'])
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Slice:
    """Elements [lo, hi) of parameter `name`'s flat view, held by `shard` under `key`."""

    key: str
    name: str
    shard: int
    lo: int
    hi: int

    @property
    def size(self) -> int:
        return self.hi - self.lo


class Layout:
    """Parameter name -> slices across shards (see the module docstring for the rule)."""

    def __init__(self, shapes: Mapping[str, tuple[int, ...]], shards: int, itemsize: int = 4,
                 ) -> None:
        if shards < 1:
            raise ValueError(f"a layout needs at least one shard, got {shards}")
        self.shapes = {n: tuple(int(d) for d in shapes[n]) for n in sorted(shapes)}
        self.shards, self.itemsize = shards, itemsize
        self.slices = _cut(self.shapes, shards)
        self._by_name: dict[str, list[Slice]] = {}
        self._by_shard: dict[int, list[Slice]] = {s: [] for s in range(shards)}
        for sl in self.slices:
            self._by_name.setdefault(sl.name, []).append(sl)
            self._by_shard[sl.shard].append(sl)
        self._by_key = {sl.key: sl for sl in self.slices}

    @classmethod
    def build(cls, shapes: Mapping[str, tuple[int, ...]], shards: int, itemsize: int = 4,
              ) -> Layout:
        """The layout of parameters with these `shapes` over `shards` shards."""
        return cls(shapes, shards, itemsize)

    def slices_of(self, name: str) -> list[Slice]:
        """The slices of parameter `name`, in element order."""
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"parameter '{name}' is not in the layout "
                           f"(have: {', '.join(self.shapes)})") from None

    def slice(self, key: str) -> Slice:
        """The slice with this key."""
        try:
            return self._by_key[key]
        except KeyError:
            raise KeyError(f"no slice '{key}' in the layout") from None

    def shards_of(self, names: Iterable[str] | None = None) -> list[int]:
        """Sorted ids of the shards holding any slice of `names` (default: every parameter)."""
        names = self.shapes if names is None else names
        return sorted({sl.shard for n in names for sl in self.slices_of(n)})

    def keys_on(self, shard: int, names: Iterable[str] | None = None) -> list[str]:
        """Keys of the slices on `shard` (only those of `names` when given)."""
        wanted = None if names is None else set(names)
        return [sl.key for sl in self._by_shard[shard] if wanted is None or sl.name in wanted]

    def bytes_on(self, shard: int) -> int:
        """Bytes of parameters held by `shard`."""
        return sum(sl.size for sl in self._by_shard[shard]) * self.itemsize

    def split(self, values_by_name: Mapping[str, Any]) -> dict[int, dict[str, np.ndarray]]:
        """{shard: {key: flat view}} of the given parameters (views when C-contiguous); a
        value may have the parameter's shape or be flat.

            >>> lay = Layout.build({"w": (2, 3)}, 2)
            >>> {s: {k: v.tolist() for k, v in d.items()}
            ...  for s, d in lay.split({"w": np.arange(6)}).items()}
            {0: {'w[0:3]': [0, 1, 2]}, 1: {'w[3:6]': [3, 4, 5]}}
        """
        out: dict[int, dict[str, np.ndarray]] = {}
        for name, value in values_by_name.items():
            flat = np.ascontiguousarray(value).reshape(-1)
            if name in self.shapes and flat.size != math.prod(self.shapes[name]):
                raise ValueError(f"parameter '{name}': {flat.size} elements, the layout has "
                                 f"shape {self.shapes[name]}")
            for sl in self.slices_of(name):
                out.setdefault(sl.shard, {})[sl.key] = flat[sl.lo:sl.hi]
        return out

    def join(self, slices_by_key: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """{name: new array of its shape} from flat slices; every slice of each parameter that
        has one here must be present."""
        names = sorted({self.slice(k).name for k in slices_by_key})
        out: dict[str, np.ndarray] = {}
        for name in names:
            parts = self.slices_of(name)
            missing = [sl.key for sl in parts if sl.key not in slices_by_key]
            if missing:
                raise KeyError(f"parameter '{name}': slices {', '.join(missing)} are missing")
            dtype = np.result_type(*(slices_by_key[sl.key] for sl in parts))
            flat = np.empty(math.prod(self.shapes[name]), dtype)
            for sl in parts:
                piece = np.asarray(slices_by_key[sl.key]).reshape(-1)
                if piece.size != sl.size:
                    raise ValueError(f"slice '{sl.key}': {piece.size} elements, "
                                     f"expected {sl.size}")
                flat[sl.lo:sl.hi] = piece
            out[name] = flat.reshape(self.shapes[name])
        return out

    def to_dict(self) -> dict[str, Any]:
        """A msgpack-able description; `Layout.from_dict` rebuilds the same layout."""
        return {"shapes": {n: list(s) for n, s in self.shapes.items()}, "shards": self.shards,
                "itemsize": self.itemsize}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Layout:
        """The layout described by `to_dict`'s output (checked: it may come off the wire)."""
        shapes, shards, itemsize = d.get("shapes"), d.get("shards"), d.get("itemsize", 4)
        ok = isinstance(shapes, Mapping) and type(shards) is int and type(itemsize) is int \
            and all(isinstance(n, str) and isinstance(s, list | tuple)
                    and all(type(x) is int and x >= 0 for x in s) for n, s in shapes.items())
        if not ok:
            raise ValueError(f"not a layout description: {dict(d)!r:.200}")
        return cls({n: tuple(s) for n, s in shapes.items()}, shards, itemsize)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Layout) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        per = ", ".join(str(self.bytes_on(s)) for s in range(self.shards))
        return f"Layout({len(self.shapes)} parameters, {self.shards} shards, bytes [{per}])"


def slices_differ(held: Mapping[str, int], asked: Mapping[str, int]) -> str | None:
    """How the slices `asked` for (key -> size) differ from those `held`, told by the first
    parameter that differs; None if they are the same.

        >>> slices_differ({"w[0:4]": 4}, {"w[0:2]": 2, "b[0:3]": 3})
        "parameter 'b': none held, b[0:3] asked for"
    """
    if dict(held) == dict(asked):
        return None
    by_name: dict[str, tuple[list[str], list[str]]] = {}
    for i, keys in enumerate((held, asked)):
        for key in sorted(keys):
            by_name.setdefault(key.rsplit("[", 1)[0], ([], []))[i].append(key)
    for name, (h, a) in sorted(by_name.items()):
        if h != a:
            return (f"parameter '{name}': {', '.join(h) or 'none'} held, "
                    f"{', '.join(a) or 'none'} asked for")
    key = next(k for k in sorted(asked) if held[k] != asked[k])
    return f"slice '{key}': {held[key]} values held, {asked[key]} asked for"


def _cut(shapes: Mapping[str, tuple[int, ...]], shards: int) -> list[Slice]:
    sizes = {n: math.prod(s) for n, s in shapes.items()}
    total = sum(sizes.values())
    cuts = [s * total // shards for s in range(shards + 1)]

    def shard_at(pos: int) -> int:  # the shard whose range holds element `pos`
        return min(bisect.bisect_right(cuts, pos) - 1, shards - 1)

    slices, offset = [], 0
    for name, size in sizes.items():
        if size == 0:
            slices.append(Slice(f"{name}[0:0]", name, shard_at(offset), 0, 0))
        pos, end = offset, offset + size
        while pos < end:
            s = shard_at(pos)
            hi = min(end, cuts[s + 1])
            slices.append(Slice(f"{name}[{pos - offset}:{hi - offset}]", name, s, pos - offset,
                                hi - offset))
            pos = hi
        offset = end
    return slices
