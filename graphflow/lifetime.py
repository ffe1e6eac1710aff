"""Child services end with the driver that started them.

A driver starts its local workers and parameter-server shards as child processes. If it dies
without closing them (killed, crashed, or a script that never called `close`), they would
serve nothing forever, each holding its share of the model. Given the driver's pid, a child
watches for it to go and stops.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

POLL_SECONDS = 0.5


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
