"""A cluster file: the TOML that names the machines a model runs on.

    workers = ["tcp://10.0.0.2:5555", "tcp://10.0.0.3:5555"]

(`graphflow worker --listen tcp://HOST:PORT` serves one; replica sets add their own keys.)
"""

from __future__ import annotations

import tomllib
from typing import Any
from urllib.parse import urlparse


def read_cluster_file(path: str) -> list[str]:
    """The worker control addresses listed in a TOML cluster file (`workers = [...]`)."""
    return load_cluster_file(path)["workers"]


def load_cluster_file(path: str) -> dict[str, Any]:
    """A TOML cluster file's contents, its `workers` checked to be tcp://HOST:PORT."""
    with open(path, "rb") as f:
        data = tomllib.load(f)
    workers = data.get("workers")
    if not isinstance(workers, list) or not all(isinstance(w, str) for w in workers):
        raise ValueError(f"{path}: expected `workers = [\"tcp://HOST:PORT\", ...]`")
    bad = [w for w in workers if urlparse(w).scheme != "tcp" or not urlparse(w).port]
    if bad:
        raise ValueError(f"{path}: worker address {bad[0]!r} is not tcp://HOST:PORT")
    return data
