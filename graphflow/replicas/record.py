"""What a data-parallel run did, for its caller: losses, evaluations, failures, steps, and
notes for the user (graphflow/replicas/manager.py keeps one across its fits)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Record:
    """What a run did: per replica losses, evaluations over time, failures; `steps_done` per
    replica and `steps_run` in all by the last fit; `notes` for the user: shards resumed from
    a checkpoint, steps rounded up to whole lockstep rounds."""

    losses: dict[int, list[tuple[float, int, float]]] = field(default_factory=dict)  # t,step,loss
    evals: list[tuple[float, int, float]] = field(default_factory=list)  # time, steps, acc
    failures: list[str] = field(default_factory=list)
    steps_done: dict[int, int] = field(default_factory=dict)
    steps_run: int = 0
    notes: list[str] = field(default_factory=list)


def resume_note(shard: int, info: dict[str, Any]) -> str:
    """What to tell the user of a shard that resumed from a checkpoint (PSClient.init's
    "resumed" entry): "resuming shard 0 from ck/shard0-0000000003.npz (40 updates)"."""
    note = f"resuming shard {shard} from {info['path']} ({info['updates']} updates)"
    if "optimizer" in info:
        note += f", with its optimizer {info['optimizer']}, not the one asked for"
    return note
