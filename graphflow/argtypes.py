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


def seconds(text: str) -> float:
    """An argparse type: a time in seconds > 0.

        >>> seconds("2.5")
        2.5
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of seconds") from None
    if not value > 0:  # (NaN too)
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {text}")
    return value


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
