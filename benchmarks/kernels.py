"""Forward + backward time per layer: graphflow vs PyTorch CPU at the same thread count.

Each row times one layer as users get it (forward, input gradient, weight and bias gradients,
seeded with a random dy) at the reference workloads' shapes, batch 64. ratio = torch time /
graphflow time (above 1: graphflow is faster); each row has its target and PASS / FAIL.

    python benchmarks/kernels.py                  # 1 thread, 7 repeats after 2 warm-ups
    python benchmarks/kernels.py --threads 2 --only local2d --profile
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import common


@dataclass(frozen=True)
class Case:
    name: str
    kind: str                 # local2d | dense | conv2d
    shape: tuple[int, ...]    # input: (N, C, H, W) or (N, features)
    out: int                  # filters or units
    target: float             # minimum torch_time / our_time
    kernel: int = 1
    stride: int = 1
    padding: int = 0

    def out_shape(self) -> tuple[int, ...]:
        if self.kind == "dense":
            return (self.shape[0], self.out)
        n, _, h, w = self.shape
        size = [(s + 2 * self.padding - self.kernel) // self.stride + 1 for s in (h, w)]
        return (n, self.out, *size)

    def flops(self) -> float:
        """Forward + backward multiply-adds x 2 (three products of the forward's size)."""
        if self.kind == "dense":
            return 3 * 2 * self.shape[0] * self.shape[1] * self.out
        n, c = self.shape[:2]
        locations = self.out_shape()[2] * self.out_shape()[3]
        return 3 * 2 * n * locations * self.out * c * self.kernel ** 2


CASES = [
    Case("local2d lc1 3x64x64 -> 32 7x7/2", "local2d", (64, 3, 64, 64), 32, 3.0, 7, 2),
    Case("local2d lc2 32x29x29 -> 64 5x5/2", "local2d", (64, 32, 29, 29), 64, 3.0, 5, 2),
    Case("dense 440 -> 2560", "dense", (64, 440), 2560, 0.9),
    Case("dense 2560 -> 2560", "dense", (64, 2560), 2560, 0.9),
    Case("dense 2560 -> 8192", "dense", (64, 2560), 8192, 0.9),
    Case("conv2d 32x29x29 -> 64 5x5 pad 2", "conv2d", (64, 32, 29, 29), 64, 0.5, 5, 1, 2),
]

COLUMNS = [("case", "layer (batch 64, fwd+bwd)"), ("ours_ms", "graphflow ms"),
           ("torch_ms", "torch ms"), ("ours_gflops", "ours GFLOP/s"),
           ("ratio", "torch/ours"), ("target", "target"), ("verdict", "result")]


def data(case: Case) -> tuple[Any, Any]:
    import numpy as np
    rng = np.random.default_rng(0)
    x = rng.standard_normal(case.shape, dtype=np.float32)
    dy = rng.standard_normal(case.out_shape(), dtype=np.float32)
    return x, dy


def ours(case: Case, x: Any, dy: Any) -> tuple[Callable[[], Any], Callable[[], None]]:
    """A run() over forward + all gradients of graphflow's layer, and a profile() of it."""
    import graphflow as gf
    from graphflow import layers
    with gf.Graph() as g:
        xp = gf.placeholder("x", case.shape)
        if case.kind == "dense":
            y = layers.dense(xp, case.out, name="layer")
        else:
            build = layers.local2d if case.kind == "local2d" else layers.conv2d
            y = build(xp, case.out, case.kernel, stride=case.stride, padding=case.padding,
                      name="layer")
        if tuple(y.shape) != case.out_shape():
            raise ValueError(f"{case.name}: graphflow output {y.shape}, expected "
                             f"{case.out_shape()}")
        dyp = gf.placeholder("dy", y.shape)
        wrt = [xp, *g.parameters()]
        grads = gf.gradients(y, wrt, dy=dyp)
    sess = gf.Session(g)
    fetches = [y] + [grads[n.name] for n in wrt]
    feeds = {xp: x, dyp: dy}

    def profile() -> None:
        prof = common.profile_ops(g, fetches, feeds, sess.params)
        common.print_profile(f"graphflow per-op time: {case.name}", prof)
    return (lambda: sess.run(fetches, feeds)), profile


def peer(torch: Any, case: Case, x: Any, dy: Any) -> Callable[[], Any]:
    import peers
    torch.manual_seed(0)
    mod = peers.layer(case.kind, case.shape, case.out, case.kernel, case.stride, case.padding)
    xt = torch.from_numpy(x).requires_grad_()
    dyt = torch.from_numpy(dy)
    tensors = [xt, *mod.parameters()]

    def run() -> None:
        for t in tensors:
            t.grad = None
        mod(xt).backward(dyt)
    return run


def run_case(case: Case, args: Any, torch: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"case": case.name, "target": case.target, **asdict(case)}
    x, dy = data(case)
    sides = common.time_against_peer(
        row, case.name, args, lambda: ours(case, x, dy),
        (lambda: peer(torch, case, x, dy)) if torch is not None else None)
    for side in sides:
        row[f"{side}_gflops"] = case.flops() / row[side]["median_s"] / 1e9
    return row


def extra_flags(p: Any) -> None:
    p.add_argument("--only", default="", help="run only rows whose name contains this text")
    p.add_argument("--profile", action="store_true",
                   help="also print graphflow's per-op forward times for each row")


def main() -> int:
    args = common.parse_args("kernels", __doc__, extra=extra_flags)
    torch = common.load_torch(args.threads)
    cases = [c for c in CASES if args.only in c.name]
    if not cases:
        raise ValueError(f"no row matches --only '{args.only}'")
    rows = []
    for case in cases:
        rows.append(run_case(case, args, torch))
        print(f"  done: {case.name}", file=sys.stderr, flush=True)
    common.print_table(rows, COLUMNS, f"kernels: fwd+bwd, {args.threads} thread(s), median of "
                                      f"{args.repeats} after {args.warmup} warm-ups")
    common.missing_peer_note(torch)
    common.write_json(args.json, "kernels", args, torch, rows)
    failed = [r["case"] for r in rows if "error" in r]
    if failed:
        print(f"error: graphflow failed on {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    common.run_main(main)
