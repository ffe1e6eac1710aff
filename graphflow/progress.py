"""A small progress bar on stderr: redrawn in place on a terminal, a line per 10% otherwise."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """A progress bar on stderr: redrawn in place on a terminal, a line per tenth otherwise.

    >>> import io
    >>> out = io.StringIO()
    >>> with Progress(10, "train", stream=out) as bar:
    ...     bar.update(10, loss=0.5)
    >>> out.getvalue().startswith("train")
    True
    """

    def __init__(self, total: int, label: str = "", stream: TextIO | None = None,
                 enabled: bool = True) -> None:
        self.total, self.label, self.done = total, label, 0
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = self.stream.isatty()
        self.start = time.perf_counter()
        self._last_decile = -1

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()

    def update(self, n: int = 1, **info: float) -> None:
        self.done += n
        if not self.enabled:
            return
        decile = 10 * self.done // max(self.total, 1)
        if not self.tty and decile == self._last_decile and self.done != self.total:
            return
        self._last_decile = decile
        elapsed = time.perf_counter() - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        width = 28
        filled = width * self.done // max(self.total, 1)
        extra = " ".join(f"{k} {v:.4g}" for k, v in info.items())
        line = (f"{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}"
                f" {rate:.1f} it/s {extra}")
        self.stream.write(("\r" + line) if self.tty else (line + "\n"))
        self.stream.flush()
