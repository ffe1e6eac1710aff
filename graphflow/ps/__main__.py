"""`python -m graphflow.ps`: one parameter-server shard in this process (normally the replica
manager starts these itself).

    python -m graphflow.ps --listen ipc:///tmp/ps/ps0 --index 0 --shards 2 \\
        --checkpoint-dir /tmp/ps/ckpt --checkpoint-every 200

It restores its newest checkpoint from --checkpoint-dir, prints "... listening on ADDRESS" on
stderr once bound, serves until a `shutdown` request, SIGTERM or SIGINT (or until the process
--exit-with-parent names is gone), and logs to stderr.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from graphflow.argtypes import count, directory, listen_address, non_negative, seconds_or_zero
from graphflow.errors import GraphflowError
from graphflow.lifetime import exit_with_parent
from graphflow.ps.checkpoint import newest_slices
from graphflow.ps.server import serve_shard


def parser(prog: str = "python -m graphflow.ps") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, description=__doc__.replace("python -m graphflow.ps", prog),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"example: {prog} --listen tcp://127.0.0.1:5700 --index 0 "
               "--shards 1 --checkpoint-dir ckpt --checkpoint-seconds 30")
    p.add_argument("--listen", required=True, type=listen_address,
                   help="address to bind: tcp://HOST:PORT (HOST * for every interface, "
                        "PORT * for any) or ipc:///PATH")
    p.add_argument("--index", type=non_negative, default=0, help="this shard's index (0)")
    p.add_argument("--shards", type=count, default=1, help="how many shards there are (1)")
    p.add_argument("--checkpoint-dir", type=directory, default=None,
                   help="where checkpoints are written and restored from (none: no checkpoints)")
    p.add_argument("--checkpoint-every", type=non_negative, default=0,
                   help="write a checkpoint every N applied updates (0: not by count)")
    p.add_argument("--checkpoint-seconds", type=seconds_or_zero, default=0.0,
                   help="write a checkpoint every T seconds when something changed (0: never)")
    p.add_argument("--exit-with-parent", type=count, default=None, metavar="PID",
                   help="exit when process PID is gone (set by start_shard_process)")
    return p


def _conflict(args: argparse.Namespace) -> str | None:
    """Options that contradict each other (or the checkpoints they name): a usage error."""
    if not 0 <= args.index < args.shards:
        return f"--index {args.index} is not in [0, --shards {args.shards})"
    if args.checkpoint_dir is None and (args.checkpoint_every or args.checkpoint_seconds):
        option = "--checkpoint-every" if args.checkpoint_every else "--checkpoint-seconds"
        return f"{option} says when to checkpoint: it needs --checkpoint-dir DIR"
    held = newest_slices(args.checkpoint_dir) if args.checkpoint_dir is not None else {}
    if others := [i for i in held if i >= args.shards]:  # (its init would be refused)
        return (f"--checkpoint-dir {args.checkpoint_dir} holds checkpoints of shard "
                f"{others[0]}, so of more than --shards {args.shards}: use another "
                "directory, or the --shards they were written with")
    return None


def main(argv: list[str] | None = None, prog: str = "python -m graphflow.ps") -> int:
    """Serve one shard; 0 after a clean stop, 1 when it could not start, 2 on bad arguments."""
    p = parser(prog)
    args = p.parse_args(argv)
    if problem := _conflict(args):
        p.error(problem)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s ps:{args.index} %(levelname)s %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if args.exit_with_parent is not None:
        gone = args.exit_with_parent
        exit_with_parent(gone, stop, lambda: logging.getLogger("graphflow.ps").warning(
            "parent %d is gone: exiting", gone))

    def ready(address: str) -> None:
        print(f"graphflow.ps: shard {args.index} of {args.shards} listening on {address}",
              file=sys.stderr, flush=True)

    try:
        serve_shard(args.listen, args.index, args.shards, checkpoint_dir=args.checkpoint_dir,
                    checkpoint_every=args.checkpoint_every,
                    checkpoint_seconds=args.checkpoint_seconds, stop=stop, ready=ready)
    except GraphflowError as e:
        print(f"graphflow.ps: shard {args.index}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
