"""argparse types for counts and output files: a bad value is a usage error (exit 2) naming
the option, not a silent default or a traceback later on (or after an hour's benchmark)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= `minimum`.

        >>> at_least(1)("3")
        3
    """
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


count = at_least(1)
non_negative = at_least(0)


def positive(unit: str = "") -> Callable[[str], float]:
    """An argparse type: a finite number > 0 (`unit`: what it counts, for the messages).

        >>> positive(" seconds")("2.5")
        2.5
    """
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a number{unit}") from None
        if not 0 < value < float("inf"):  # (NaN too)
            raise argparse.ArgumentTypeError(f"must be > 0{unit} and finite, got {text}")
        return value

    return parse


seconds = positive(" seconds")
learning_rate = positive()


class UsageError(ValueError):
    """A bad combination of options (or of options and the files they name), found before
    any work starts: the command says `graphflow CMD: error: ...` and exits 2, as argparse
    does for a bad value."""


def seconds_or_zero(text: str) -> float:
    """An argparse type: a finite number of seconds >= 0 (0: never).

        >>> seconds_or_zero("0"), seconds_or_zero("30")
        (0.0, 30.0)
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of seconds") from None
    if not 0 <= value < float("inf"):  # (NaN too: it would never checkpoint, silently)
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds (0: never) and finite, "
                                         f"got {text}")
    return value


def microbatch_count(text: str) -> int | str:
    """An argparse type: a micro-batch count >= 1, or "auto" (the best predicted).

        >>> microbatch_count("auto"), microbatch_count("4")
        ('auto', 4)
    """
    return text if text == "auto" else count(text)


def csv_counts_of(noun: str, include_one: bool = True) -> Callable[[str], list[int]]:
    """An argparse type: comma-separated `noun` counts >= 1, sorted, duplicates dropped, and
    with 1 added when `include_one`.

        >>> csv_counts_of("shard", include_one=False)("4,2")
        [2, 4]
    """
    def parse(text: str) -> list[int]:
        items = [s.strip() for s in text.split(",")]
        if not all(items):
            raise argparse.ArgumentTypeError(f"'{text}': an empty item in the list of {noun} "
                                             "counts")
        try:
            counts = {int(s) for s in items}
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a list of integers") from None
        if min(counts) < 1:
            raise argparse.ArgumentTypeError(f"'{text}': {noun} counts must be >= 1")
        return sorted(counts | {1} if include_one else counts)

    return parse


csv_counts = csv_counts_of("worker")


def output_file(text: str) -> Path:
    """An argparse type: a file to write at the end of a run, checked before the run: not a
    directory, and in a writable directory. Missing parent directories are fine (writers make
    them), as long as the nearest existing one is a writable directory.

        >>> output_file("/tmp/graphflow-results/run.json")
        PosixPath('/tmp/graphflow-results/run.json')
    """
    path = Path(text)
    if not text:
        raise argparse.ArgumentTypeError("an empty file name")
    if path.is_dir() or text.endswith(("/", os.sep)):
        raise argparse.ArgumentTypeError(f"'{text}' is a directory; give a file name")
    if path.exists() and not os.access(path, os.W_OK):
        raise argparse.ArgumentTypeError(f"'{text}' exists and is not writable")
    _check_writable_parent(text, path.absolute().parent)
    return path


def directory(text: str) -> Path:
    """An argparse type: a directory to write in, checked before the run: an existing
    directory, or one that can be made (the nearest existing parent a writable directory).

        >>> directory("/tmp/graphflow-checkpoints")
        PosixPath('/tmp/graphflow-checkpoints')
    """
    path = Path(text)
    if not text:
        raise argparse.ArgumentTypeError("an empty directory name")
    if path.exists() and not path.is_dir():  # (else "[Errno 20] Not a directory" mid-run)
        raise argparse.ArgumentTypeError(f"'{text}' is a file, not a directory")
    if path.is_dir():
        if not os.access(path, os.W_OK | os.X_OK):
            raise argparse.ArgumentTypeError(f"the directory '{text}' is not writable")
        return path
    _check_writable_parent(text, path.absolute().parent)
    return path


def _check_writable_parent(text: str, parent: Path) -> None:
    """ArgumentTypeError unless the nearest existing one of `parent` and its parents is a
    writable directory (writers make the missing ones)."""
    while not parent.exists() and not parent.is_symlink():
        parent = parent.parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"'{text}': '{parent}' is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"'{text}': the directory '{parent}' is not writable")


def listen_address(text: str) -> str:
    """An argparse type: an address another process can reach, to bind: tcp://HOST:PORT
    (HOST `*` for every interface; a port 1-65535, or `*` for any: zmq would wrap 70000 round
    to 4464 and listen where no cluster file can name it) or ipc:///PATH.

        >>> listen_address("tcp://127.0.0.1:5555")
        'tcp://127.0.0.1:5555'
    """
    scheme, sep, rest = text.partition("://")
    if not sep or scheme not in ("tcp", "ipc"):
        raise argparse.ArgumentTypeError(f"'{text}': expected tcp://HOST:PORT or ipc:///PATH")
    if scheme == "ipc":
        if not rest:
            raise argparse.ArgumentTypeError(f"'{text}': no path, expected ipc:///PATH")
        return text
    host, colon, port = rest.rpartition(":")
    if not colon or not host:
        raise argparse.ArgumentTypeError(f"'{text}': expected tcp://HOST:PORT (HOST: an "
                                         "address of this machine, or * for all of them)")
    if port != "*" and not (port.isdigit() and 1 <= int(port) <= 65535):
        raise argparse.ArgumentTypeError(
            f"'{text}': the port must be a number from 1 to 65535 (or *), got '{port}'")
    return text
