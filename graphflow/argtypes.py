"""argparse types for counts: a bad value is a usage error (exit 2) naming the option, not a
silent default or a traceback later on."""

from __future__ import annotations

import argparse
from collections.abc import Callable


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


def microbatch_count(text: str) -> int | str:
    """An argparse type: a micro-batch count >= 1, or "auto" (the best predicted).

        >>> microbatch_count("auto"), microbatch_count("4")
        ('auto', 4)
    """
    return text if text == "auto" else count(text)


def csv_counts(text: str) -> list[int]:
    """An argparse type: comma-separated worker counts >= 1, sorted, always including 1."""
    try:
        counts = {int(s) for s in text.split(",") if s.strip()}
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a list of integers") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"'{text}': worker counts must be >= 1")
    return sorted(counts | {1})


def listen_address(text: str) -> str:
    """An argparse type: an address to bind; a tcp port must be 1-65535 or `*` (zmq would
    wrap 70000 round to 4464 and listen where no cluster file can name it).

        >>> listen_address("tcp://127.0.0.1:5555")
        'tcp://127.0.0.1:5555'
    """
    if text.startswith("tcp://"):
        port = text.rpartition(":")[2]
        if port != "*" and not (port.isdigit() and 1 <= int(port) <= 65535):
            raise argparse.ArgumentTypeError(
                f"'{text}': the port must be a number from 1 to 65535 (or *), got '{port}'")
    return text

