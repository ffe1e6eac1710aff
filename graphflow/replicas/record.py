"""What a data-parallel run did, for its caller: losses, evaluations, failures, steps, and
notes for the user (graphflow/replicas/manager.py keeps one across its fits)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Record:
    """What a run did: per replica losses, evaluations over time, failures; `steps_done` per
    replica and `steps_run` in all by the last fit (a downpour step counts once its push
    reached the shards; sandblaster's `steps_done` are the gradient portions each replica
    computed and won, its `steps_run` L-BFGS iterations); `shard_restarts`: shards that
    died and were restarted (ShardGroup's events, with the fit's "seconds" and "step" when
    the death was seen); `notes` for the user: shards resumed from a checkpoint or
    restarted, steps rounded up to whole lockstep rounds."""

    losses: dict[int, list[tuple[float, int, float]]] = field(default_factory=dict)  # t,step,loss
    evals: list[tuple[float, int, float]] = field(default_factory=list)  # time, steps, acc
    failures: list[str] = field(default_factory=list)
    steps_done: dict[int, int] = field(default_factory=dict)
    steps_run: int = 0
    notes: list[str] = field(default_factory=list)
    shard_restarts: list[dict[str, Any]] = field(default_factory=list)


def resume_note(shard: int, info: dict[str, Any]) -> str:
    """What to tell the user of a shard that resumed from a checkpoint (PSClient.init's
    "resumed" entry): "resuming shard 0 from ck/shard0-0000000003.npz (40 updates)"."""
    note = f"resuming shard {shard} from {info['path']} ({info['updates']} updates)"
    if "optimizer" in info:
        note += f", with its optimizer {info['optimizer']}, not the one asked for"
    return note


def restart_note(event: dict[str, Any]) -> str:
    """What to tell the user of a shard restarted (a ShardGroup event, stamped): "shard 0
    (pid 41) was killed by SIGKILL at step 20 (1.3 s): restarted as pid 57 from
    ck/shard0-0000000003.npz (40 updates)"."""
    note = f"shard {event['shard']} (pid {event['pid']}) {event['ended']}"
    if "step" in event:
        note += f" at step {event['step']} ({event['seconds']:.1f} s)"
    if "error" in event:
        return f"{note}: could not be restarted: {event['error']}"
    if event.get("checkpoint") is None:
        return f"{note}: restarted as pid {event['new_pid']} with no checkpoint to resume from"
    return (f"{note}: restarted as pid {event['new_pid']} from {event['checkpoint']} "
            f"({event['updates']} updates)")
