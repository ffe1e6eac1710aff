"""Child services end with the driver that started them.

A driver starts its local workers and parameter-server shards as child processes. If it dies
without closing them (killed, crashed, or a script that never called `close`), they would
serve nothing forever, each holding its share of the model. Given the driver's pid, a child
watches for it to go (its parent pid changes when it is re-parented) and stops.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

POLL_SECONDS = 0.5


def exit_with_parent(pid: int, stop: threading.Event,
                     on_exit: Callable[[], None] | None = None) -> threading.Thread:
    """Set `stop` (after calling `on_exit`) once process `pid` is no longer this one's parent;
    a daemon thread checks every POLL_SECONDS until `stop` is set."""
    def watch() -> None:
        while not stop.wait(POLL_SECONDS):
            if os.getppid() != pid:
                if on_exit is not None:
                    on_exit()
                stop.set()

    thread = threading.Thread(target=watch, name="graphflow-parent-watch", daemon=True)
    thread.start()
    return thread
