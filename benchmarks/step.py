"""A whole training step (forward, backward, SGD update) at batch 64: graphflow vs PyTorch CPU.

Workloads: lc-large (target: graphflow >= 2x torch's speed) and speech-mlp (>= 0.9x), on
synthetic data. Then the peak memory of one lc-large step, each framework in a fresh
subprocess (target: graphflow's step working set <= 1.5x torch's).

    python benchmarks/step.py                     # 1 thread, 7 repeats after 2 warm-ups
    python benchmarks/step.py --threads 2 --profile
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import common

BATCH = 64
LR = 0.01
TARGETS = {"lc-large": 2.0, "speech-mlp": 0.9}
MEMORY_TARGET = 1.5   # our step working set / torch's, at most
MEMORY_STEPS = 3
CLASSES = {"lc-large": 10, "speech-mlp": 8192}
INPUTS = {"lc-large": (3, 64, 64), "speech-mlp": (440,)}

COLUMNS = [("workload", "training step (batch 64)"), ("ours_ms", "graphflow ms"),
           ("torch_ms", "torch ms"), ("ratio", "torch/ours"), ("target", "target"),
           ("verdict", "result")]
MEM_COLUMNS = [("framework", "lc-large step memory"), ("baseline_mb", "baseline MB"),
               ("peak_mb", "peak MB"), ("step_mb", "peak - baseline MB"),
               ("reset", "peak reset by")]


def data(workload: str) -> tuple[Any, Any]:
    import numpy as np
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, *INPUTS[workload]), dtype=np.float32)
    y = rng.integers(0, CLASSES[workload], BATCH).astype(np.int32)
    return x, y


def ours(workload: str, x: Any, y: Any) -> tuple[Callable[[], float], Callable[[], None]]:
    """A step() of graphflow's Trainer on the workload, and a profile() of its forward ops."""
    from graphflow import models
    from graphflow.optim import SGD
    from graphflow.train import Trainer
    trainer = Trainer(models.WORKLOADS[workload](BATCH), SGD(LR))

    def profile() -> None:
        m = trainer.model
        prof = common.profile_ops(m.graph, trainer._fetches, {m.x: x, m.y: y},
                                  trainer.session.params)
        common.print_profile(f"graphflow per-op time, one {workload} step (without the "
                             f"update)", prof)
    return (lambda: trainer.step(x, y)), profile


def peer(torch: Any, workload: str, x: Any, y: Any) -> Callable[[], float]:
    import peers
    torch.manual_seed(0)
    model = peers.MODELS[workload]()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y).long()
    return lambda: peers.train_step(model, xt, yt, opt)


def time_workload(workload: str, args: argparse.Namespace, torch: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"workload": workload, "batch": BATCH, "target": TARGETS[workload]}
    x, y = data(workload)
    common.time_against_peer(row, workload, args, lambda: ours(workload, x, y),
                             (lambda: peer(torch, workload, x, y)) if torch is not None else None)
    return row


# -- memory: runs in a fresh process (`--_memory ours|torch`), prints one JSON line ------------

def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


class PeakTracker:
    """Peak RSS from now on: VmHWM after resetting it via clear_refs, else a 1 ms sampler."""

    def __init__(self) -> None:
        self.peak_kb = 0
        self.method = "clear_refs"
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            if _status_kb("VmHWM") > _status_kb("VmRSS") + 1024:
                raise OSError("VmHWM was not reset")
        except OSError:
            self.method = "sampler"
            self._start_sampler()

    def _start_sampler(self) -> None:
        import threading
        import time
        self._stop = threading.Event()

        def sample() -> None:
            while not self._stop.is_set():
                self.peak_kb = max(self.peak_kb, _status_kb("VmRSS"))
                time.sleep(0.001)
        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()

    def peak(self) -> int:
        if self.method == "clear_refs":
            return _status_kb("VmHWM")
        self._stop.set()
        self._thread.join()
        return max(self.peak_kb, _status_kb("VmRSS"))


def release_free_memory() -> bool:
    """Collect garbage and return free heap pages to the OS (glibc malloc_trim), so the baseline
    counts live memory only, not what the allocator kept from the warm-up step."""
    import ctypes
    import gc
    gc.collect()
    try:
        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):
        return False


def memory_child(framework: str, threads: int) -> int:
    x, y = data("lc-large")
    if framework == "ours":
        step = ours("lc-large", x, y)[0]
    else:
        torch = common.load_torch(threads)
        if torch is None:
            raise RuntimeError("torch is not installed")
        step = peer(torch, "lc-large", x, y)
    step()  # warm-up: compiled kernels, lazily created state
    trimmed = release_free_memory()
    baseline = _status_kb("VmRSS")
    tracker = PeakTracker()
    for _ in range(MEMORY_STEPS):
        step()
    peak = tracker.peak()
    print(json.dumps({"framework": framework, "baseline_mb": baseline / 1024,
                      "peak_mb": peak / 1024, "step_mb": (peak - baseline) / 1024,
                      "reset": tracker.method, "malloc_trim": trimmed,
                      "steps": MEMORY_STEPS}))
    return 0


def measure_memory(framework: str, threads: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--threads", str(threads), "--_memory", framework]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        error = (done.stderr.strip().splitlines() or ["no message"])[-1]
        print(f"error in the {framework} memory run: {error}", file=sys.stderr)
        return {"framework": framework, "error": error}
    return json.loads(done.stdout.strip().splitlines()[-1])


def memory_rows(args: argparse.Namespace, torch: Any) -> tuple[list[dict[str, Any]], Any]:
    rows = [measure_memory("ours", args.threads)]
    if torch is not None:
        rows.append(measure_memory("torch", args.threads))
    summary: dict[str, Any] = {"target": MEMORY_TARGET, "ratio": None, "verdict": "n/a"}
    if len(rows) == 2 and all("step_mb" in r for r in rows):
        summary["ratio"] = rows[0]["step_mb"] / max(rows[1]["step_mb"], 1e-9)
        summary["peak_ratio"] = rows[0]["peak_mb"] / rows[1]["peak_mb"]
        summary["verdict"] = common.verdict(summary["ratio"], MEMORY_TARGET, False)
    return rows, summary


def extra_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--only", choices=sorted(TARGETS), help="time only this workload")
    p.add_argument("--no-memory", action="store_true", help="skip the peak memory measurement")
    p.add_argument("--profile", action="store_true",
                   help="also print graphflow's per-op forward times for each workload")
    p.add_argument("--_memory", choices=("ours", "torch"), help=argparse.SUPPRESS)


def main() -> int:
    args = common.parse_args("step", __doc__, extra=extra_flags)
    if args._memory:
        return memory_child(args._memory, args.threads)
    torch = common.load_torch(args.threads)
    rows = [time_workload(w, args, torch) for w in TARGETS if args.only in (None, w)]
    common.print_table(rows, COLUMNS, f"training step: {args.threads} thread(s), median of "
                                      f"{args.repeats} after {args.warmup} warm-ups")
    mem, summary = ([], None) if args.no_memory else memory_rows(args, torch)
    if mem:
        common.print_table(mem, MEM_COLUMNS, f"lc-large step memory ({MEMORY_STEPS} steps "
                                             f"after 1 warm-up, fresh process each)")
        r = summary["ratio"]
        print(f"ours/torch step working set: {'-' if r is None else f'{r:.2f}'} "
              f"(target <= {MEMORY_TARGET}) {summary['verdict']}")
    common.missing_peer_note(torch)
    common.write_json(args.json, "step", args, torch, rows, memory=mem, memory_summary=summary)
    failed = [r["workload"] for r in rows if "error" in r] + \
        [f"memory ({r['framework']})" for r in mem if "error" in r]
    if failed:
        print(f"error: graphflow failed on {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    common.run_main(main)
