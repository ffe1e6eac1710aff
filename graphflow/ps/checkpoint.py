"""Atomic shard checkpoints: the newest complete one wins, the newest `keep` are kept.

A checkpoint is one uncompressed .npz file, `shard{index}-{seq:010d}.npz`: member "meta" is a
msgpack document (nested dicts / lists / scalars) in which every array is a reference to the
member "a{i}". It is written to a temporary file in the same directory, flushed and fsynced,
renamed over its final name (atomic) and the directory is fsynced, so a crash leaves either the
previous checkpoint or the new one, never half of one. Loading trusts nothing: no pickles
(`allow_pickle=False`), msgpack with limits, every array reference checked.

    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> path = save(d, 0, {"versions": {"w[0:3]": 4}, "params": {"w[0:3]": np.ones(3)}})
    >>> loaded = load_newest(d, 0)
    >>> loaded[1]["versions"], loaded[1]["params"]["w[0:3]"].tolist()
    ({'w[0:3]': 4}, [1.0, 1.0, 1.0])
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from graphflow.optim import make_optimizer

log = logging.getLogger("graphflow.ps")

_REF = 7  # msgpack extension code of an array reference
_META_MAX = 64 * 1024 * 1024
_NAME = re.compile(r"shard(\d+)-(\d{10})\.npz")


class CheckpointError(ValueError):
    """A checkpoint file is unreadable or malformed (names the file)."""


def checkpoints(directory: str | os.PathLike[str], index: int) -> list[Path]:
    """Shard `index`'s complete checkpoints in `directory`, oldest first."""
    d = Path(directory)
    if not d.is_dir():
        return []
    found = []
    for p in d.iterdir():
        m = _NAME.fullmatch(p.name)
        if m and int(m.group(1)) == index:
            found.append((_seq(p), p))
    return [p for _, p in sorted(found)]


def save(directory: str | os.PathLike[str], index: int, state: Any, keep: int = 2) -> Path:
    """Write `state` (msgpack-able data with ndarrays anywhere) as shard `index`'s newest
    checkpoint; delete all but the newest `keep`. Returns the new file's path."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    existing = checkpoints(d, index)
    seq = _seq(existing[-1]) + 1 if existing else 1
    arrays: dict[str, np.ndarray] = {}

    def ref(o: Any) -> Any:
        if isinstance(o, np.ndarray):
            arrays[f"a{len(arrays)}"] = np.ascontiguousarray(o)
            return msgpack.ExtType(_REF, msgpack.packb(len(arrays) - 1))
        if isinstance(o, np.generic):
            return o.item()
        raise TypeError(f"checkpoint: cannot store a {type(o).__name__}")

    meta = np.frombuffer(msgpack.packb(state, default=ref), np.uint8)
    final = d / f"shard{index}-{seq:010d}.npz"
    fd, tmp = tempfile.mkstemp(prefix=f".shard{index}-", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, meta=meta, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(d)
    for old in checkpoints(d, index)[:-keep] if keep > 0 else []:
        old.unlink(missing_ok=True)
    return final


def load(path: str | os.PathLike[str], arrays: bool = True) -> Any:
    """The state stored in checkpoint `path`; CheckpointError if it is unreadable. Without
    `arrays` only the meta member is read, and every array in the state is None."""
    try:
        with np.load(path, allow_pickle=False) as z:
            members = {name: z[name] for name in z.files if arrays or name == "meta"}
    except Exception as e:  # noqa: BLE001 - any failure to read means "not usable"
        raise CheckpointError(f"checkpoint {path}: unreadable ({type(e).__name__}: {e})") from e
    meta = members.pop("meta", None)
    if meta is None or meta.dtype != np.uint8 or meta.ndim != 1 or meta.size > _META_MAX:
        raise CheckpointError(f"checkpoint {path}: no valid 'meta' member")

    def ext_hook(code: int, data: bytes) -> Any:
        index = msgpack.unpackb(data) if code == _REF and len(data) <= 16 else None
        if not arrays and type(index) is int:
            return None
        array = members.get(f"a{index}") if type(index) is int else None
        if array is None:
            raise CheckpointError(f"checkpoint {path}: bad array reference ({code}, {data!r})")
        return array

    try:
        return msgpack.unpackb(meta.tobytes(), raw=False, strict_map_key=True,
                               ext_hook=ext_hook, max_bin_len=0, max_ext_len=64)
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - malformed msgpack
        raise CheckpointError(f"checkpoint {path}: bad meta ({type(e).__name__}: {e})") from e


def load_newest(directory: str | os.PathLike[str], index: int,
                parse: Callable[[Any], Any] | None = None) -> tuple[Path, Any] | None:
    """(path, state) of shard `index`'s newest usable checkpoint, or None. `parse(state)`, if
    given, turns the raw state into what is returned and raises ValueError / KeyError /
    TypeError to reject it. Unusable checkpoints are skipped (logged); leftover temporary
    files of an interrupted save are removed."""
    d = Path(directory)
    if d.is_dir():
        for tmp in d.glob(f".shard{index}-*.tmp"):
            log.warning("shard %d: removing %s, left by an interrupted checkpoint", index, tmp)
            tmp.unlink(missing_ok=True)
    for path in reversed(checkpoints(d, index)):
        try:
            state = load(path)
            return path, parse(state) if parse is not None else state
        except CheckpointError as e:
            log.error("shard %d: %s; trying an older checkpoint", index, e)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            log.error("shard %d: checkpoint %s is malformed (%s: %s); trying an older one",
                      index, path, type(e).__name__, e)
    return None


def newest_slices(directory: str | os.PathLike[str]) -> dict[int, tuple[Path, dict[str, int]]]:
    """{shard index: (its newest readable checkpoint in `directory`, the slices it holds:
    key -> size)}, read from the checkpoints' meta alone: what the shards of a run started
    on `directory` would restore, told before any of them starts (and writes there)."""
    d = Path(directory)
    indexes = {int(m.group(1)) for p in (d.iterdir() if d.is_dir() else ())
               if (m := _NAME.fullmatch(p.name))}
    found = {}
    for index in sorted(indexes):
        for path in reversed(checkpoints(d, index)):
            try:
                state = load(path, arrays=False)
                if state.get("format") != 1:
                    raise ValueError("not a format-1 shard checkpoint")  # (as parse_state)
                found[index] = (path, {str(k): _size(k) for k in state["params"]})
                break
            except (CheckpointError, ValueError, KeyError, TypeError, AttributeError):
                continue  # (the shard skips it too: load_newest)
    return found


def _size(key: str) -> int:
    """The size of slice `key`, "name[lo:hi]" (ValueError if it is not one)."""
    lo, _, hi = key.rpartition("[")[2].removesuffix("]").partition(":")
    if not (key.endswith("]") and lo.isdigit() and hi.isdigit() and int(hi) >= int(lo)):
        raise ValueError(f"not a slice key: {key!r}")
    return int(hi) - int(lo)


def _seq(path: Path) -> int:
    return int(path.name.rsplit("-", 1)[1].split(".")[0])


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def parse_state(st: Any) -> dict[str, Any]:
    """Checked shard state from a loaded checkpoint, its optimizer rebuilt (raises ValueError /
    KeyError / TypeError on anything malformed): `load_newest`'s `parse` for a Shard."""
    if not isinstance(st, dict) or st.get("format") != 1:
        raise ValueError("not a format-1 shard checkpoint")
    params = {str(k): _flat(v) for k, v in st["params"].items()}
    opt = make_optimizer(st["optimizer"]) if st["optimizer"] else None
    if opt is not None:
        opt.state = {str(k): {str(s): _flat(a).copy() for s, a in slots.items()}
                     for k, slots in st["slots"].items()}
    pairs = lambda rows: {int(a): int(b) for a, b in rows}  # noqa: E731
    run = st.get("run")  # (absent before runs were named)
    return {
        "run": None if run is None else str(run),
        "params": {k: v.copy() for k, v in params.items()},
        "versions": {str(k): int(v) for k, v in st["versions"].items()},
        "optimizer": opt, "last_step": {str(k): pairs(v) for k, v in st["last_step"].items()},
        "clock": pairs(st["clock"]), "live": {int(r) for r in st["live"]},
        "replicas": {int(r) for r in st["replicas"]},
        "staleness": None if st["staleness"] is None else int(st["staleness"]),
        "bsp_deadline": float(st["bsp_deadline"]),
        "counts": {k: int(v) for k, v in st["counts"].items()},
        "vectors": {str(n): {str(k): _flat(a).copy() for k, a in vec.items()}
                    for n, vec in st["vectors"].items()},
        "accepted": {str(n): {str(t) for t in tasks} for n, tasks in st["accepted"].items()},
        "pending": [(int(s), {str(k): _flat(a).copy() for k, a in sums.items()},
                     {str(k): {int(r) for r in w} for k, w in pushed.items()}, int(version))
                    for s, sums, pushed, version in st["pending"]]}


def _flat(a: Any) -> np.ndarray:
    if not isinstance(a, np.ndarray) or a.ndim != 1 or a.dtype.kind != "f":
        raise TypeError(f"expected a flat float array, got {type(a).__name__}")
    return a
