"""Child services end with the driver that started them, and say how they ended.

A driver starts its local workers and parameter-server shards as child processes. If it dies
without closing them (killed, crashed, or a script that never called `close`), they would
serve nothing forever, each holding its share of the model. Given the driver's pid, a child
watches for it to go and stops. A child that ends first is reported by the driver with
`how_it_ended` and the last lines of its stderr log (`log_tail`).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path

POLL_SECONDS = 0.5
LOG_TAIL_BYTES = 64 * 1024  # of a child's stderr log read for its last lines


def how_it_ended(returncode: int) -> str:
    """A child process's end in words, from its (Popen) returncode.

        >>> how_it_ended(3), how_it_ended(-9)
        ('exited with code 3', 'was killed by SIGKILL')
    """
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


def log_tail(path: str | os.PathLike[str], lines: int = 20) -> str:
    """The last `lines` lines of a child's log file ("" if there is none)."""
    try:
        with open(Path(path), "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


def is_gone(pid: int, was_parent: bool) -> bool:
    """Whether process `pid` has ended. A parent that ends re-parents its children, which also
    tells its end when its pid has since been reused."""
    if was_parent:
        return os.getppid() != pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # it exists, as another user's
        return False
    return False


def exit_with_parent(pid: int, stop: threading.Event,
                     on_exit: Callable[[], None] | None = None) -> threading.Thread:
    """Set `stop` (after calling `on_exit`) once process `pid` (normally this one's parent)
    has ended; a daemon thread checks every POLL_SECONDS until `stop` is set."""
    if pid <= 0:
        raise ValueError(f"exit with parent: pid must be positive, got {pid}")
    was_parent = os.getppid() == pid

    def watch() -> None:
        while not stop.wait(POLL_SECONDS):
            if is_gone(pid, was_parent):
                if on_exit is not None:
                    on_exit()
                stop.set()

    thread = threading.Thread(target=watch, name="graphflow-parent-watch", daemon=True)
    thread.start()
    return thread
