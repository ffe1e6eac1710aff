"""The `graphflow` command.

    graphflow train digits-lc              train on the bundled digits, print test accuracy
    graphflow train lc-large --steps 5     a few steps of a reference workload on synthetic data
    graphflow train my_model.py --parts 2  your own model (its build_model()), split in two
    graphflow show speech-mlp              the graph, one node a line, and its parameter count
    graphflow visualize lc-large --parts 4 -o plan.html   how a model is split, drawn
    graphflow train lc-large --parts 2 --steps 6 --trace run.json   record a run's timeline
    graphflow timeline run.json -o run.png                          ... and draw it
    graphflow ops                          the op table
    graphflow train digits-lc --replicas 2 --sync downpour   data parallelism through a PS
    graphflow bench speedup                speedup against workers, measured and predicted
    graphflow bench convergence            accuracy against time for Downpour, BSP, SSP, ...
    graphflow bench ps                     parameter-server pushes per second
    graphflow worker --listen tcp://HOST:PORT   serve a worker for a driver elsewhere
    graphflow ps --listen tcp://HOST:PORT ...   serve a parameter-server shard
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from math import prod
from typing import TYPE_CHECKING

from graphflow import train_command
from graphflow.argtypes import UsageError, count, listen_address, non_negative
from graphflow.errors import GraphflowError
from graphflow.runtime.heap import keep_freed_memory
from graphflow.train_command import MODEL_HELP

if TYPE_CHECKING:
    from graphflow.ir import Graph, Node


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("graphflow")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


WORKER = {"description": "Serve one graphflow worker: a driver (graphflow train --cluster FILE) "
                          "ships it a subgraph and runs steps on it. When the driver is done "
                          "(or fails) the worker forgets its run and waits for the next driver; "
                          "a driver that died is replaced by the next one to attach.",
          "epilog": "example: graphflow worker --listen tcp://10.0.0.2:5555"}


def _worker_arguments(w: argparse.ArgumentParser) -> argparse.ArgumentParser:
    w.add_argument("--listen", required=True, type=listen_address,
                   help="control address: tcp://HOST:PORT (or ipc:///PATH)")
    w.add_argument("--exit-with-parent", type=count, default=None, metavar="PID",
                   help="exit once process PID has ended (a driver names itself for the "
                        "workers it starts)")
    w.add_argument("--cpu", type=non_negative, default=None, metavar="N",
                   help="run on CPU N only (a local driver gives each of its workers a core)")
    w.add_argument("--once", action="store_true",
                   help="exit when the first driver is done with this worker, instead of "
                        "waiting for the next one")
    return w


def _parser() -> argparse.ArgumentParser:
    from graphflow.bench import SUITES
    from graphflow.partitioners import STRATEGIES
    from graphflow.prediction import add_estimate_option

    p = argparse.ArgumentParser(prog="graphflow", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"graphflow {_version()}")
    sub = p.add_subparsers(dest="command", required=True)

    train_command.configure(sub)


    s = sub.add_parser("show", help="print a model's graph, or its partition plan",
                       epilog="example: graphflow show lc-large --parts 2 --strategy spatial")
    s.add_argument("workload", metavar="MODEL", help=MODEL_HELP)
    s.add_argument("--backward", action="store_true",
                   help="include the gradient nodes in the graph printed")
    s.add_argument("--parts", type=count, default=None,
                   help="partition it for this many workers (1 too) and print the plan's "
                        "report instead of the graph")
    s.add_argument("--strategy", default=None, choices=[*STRATEGIES, "all"],
                   help="placement strategy with --parts (spatial); `all` compares their cuts "
                        "and predicted steps")
    s.add_argument("--batch", type=count, default=None,
                   help="batch size for the plan's figures (default: the model's own, else 64)")
    add_estimate_option(s)

    sub.add_parser("ops", help="list the registered ops", epilog="example: graphflow ops")

    from graphflow.trace import command as timeline
    from graphflow.viz import command as visualize

    visualize.configure(sub.add_parser(
        "visualize", help="draw how a model is split (.svg, .png, .dot, .html)",
        formatter_class=argparse.RawDescriptionHelpFormatter, description=visualize.__doc__))
    timeline.configure(sub.add_parser(
        "timeline", help="draw a run's trace (--trace FILE) as a PNG Gantt chart"))

    b = sub.add_parser("bench", help="benchmarks: `graphflow bench SUITE --help`",
                       epilog="example: graphflow bench speedup --workers 1,2")
    b.add_argument("suite", choices=list(SUITES),  # (main() lists them when none is given)
                   help="; ".join(f"{name}: {what}" for name, what in SUITES.items()))
    b.add_argument("args", nargs=argparse.REMAINDER, help="the suite's own options")

    _worker_arguments(sub.add_parser(
        "worker", help="serve one worker for a driver on another machine", **WORKER))

    # (listed here; main() hands `graphflow ps ...` to graphflow.ps's own parser)
    ps = sub.add_parser("ps", help="serve one parameter-server shard")
    ps.add_argument("args", nargs=argparse.REMAINDER, help="see `graphflow ps --help`")
    return p



def show_conflict(args: argparse.Namespace) -> str | None:
    """`show` options that would be ignored together: an error, not a silent no-op."""
    if args.parts is None:  # the graph, printed with its batch symbolic
        for option, what in (("--strategy", "places the plan's nodes"),
                             ("--batch", "sets the plan's figures"),
                             ("--estimate", "prices the plan")):
            if getattr(args, option[2:]) not in (None, False):
                return (f"{option} {what}: it needs --parts N (without it, show prints the "
                        f"graph)")
    elif args.backward:
        return ("--backward adds the gradient nodes to the graph printed, and --parts prints "
                "the plan's report instead (the plan of a model with a loss has them)")
    return None


def cmd_show(args: argparse.Namespace) -> int:
    from graphflow.autodiff import gradients
    from graphflow.modelspec import figure_batch, load_model

    if conflict := show_conflict(args):
        print(f"graphflow show: error: {conflict}", file=sys.stderr)
        return 2
    name, graph, loss = load_model(args.workload)  # symbolic batch: the figures are at --batch
    if args.parts is not None:
        try:
            args.batch = figure_batch(graph, args.batch)
        except GraphflowError as e:  # the model's own batch, not another: the option's fault
            print(f"graphflow show: error: {e}", file=sys.stderr)
            return 2
        return _show_plans(args, name, graph, loss)
    if args.backward:
        if loss is None:
            raise GraphflowError(f"--backward: MODEL '{args.workload}' has no loss to "
                                 f"differentiate")
        gradients(loss, graph.parameters())
    print(graph)
    n = sum(prod(p.shape) for p in graph.parameters())
    print(f"# {len(graph)} nodes, {n:,} parameters")
    return 0


def _show_plans(args: argparse.Namespace, name: str, graph: Graph, loss: Node | None) -> int:
    """The plan's report, or with --strategy all a line per strategy."""
    from graphflow.partitioners import STRATEGIES, partition
    from graphflow.partitioners.plan import contention_note
    from graphflow.prediction import command_cost
    from graphflow.units import fmt_bytes

    strategy = args.strategy or "spatial"
    strategies = STRATEGIES if strategy == "all" else [strategy]
    plans = [partition(graph, args.parts, s, loss=loss) for s in strategies]
    cost = command_cost(plans, args.batch, args.estimate)
    if strategy != "all":
        print(plans[0].report(args.batch, cost))
        return 0
    print(f"{name} on {args.parts} workers, batch {args.batch}"
          f"{contention_note(cost.contention, args.parts)}:")
    for s, plan in zip(strategies, plans, strict=True):
        cut = sum(t.nbytes(args.batch) for t in plan.transfers)
        prediction = plan.predict(args.batch, cost)
        used = sum(b > 0 for b in prediction.busy)
        spread = max(prediction.busy) * used / sum(prediction.busy)
        print(f"  {s:<10} cut {fmt_bytes(cut):>8}/step in {len(plan.transfers):3d} "
              f"transfers, predicted step {1e3 * prediction.step_seconds:7.1f} ms, "
              f"{used} worker(s) busy, the busiest {spread:.2f}x their mean")
    return 0


def cmd_ops(args: argparse.Namespace) -> int:
    from graphflow.ops.registry import REGISTRY

    width = max(len(name) for name in REGISTRY)
    for name, op in sorted(REGISTRY.items()):
        grad = "grad" if op.grad else "    "
        print(f"{name:<{width}}  {grad}  {op.doc}")
    return 0


def cmd_visualize(args: argparse.Namespace) -> int:
    from graphflow.viz.command import run

    return run(args)


def cmd_timeline(args: argparse.Namespace) -> int:
    from graphflow.trace.command import run

    return run(args)


def cmd_bench(args: argparse.Namespace) -> int:
    from importlib import import_module

    return int(import_module(f"graphflow.bench.{args.suite}").main(args.args))


def cmd_worker(args: argparse.Namespace) -> int:
    from graphflow.runtime.service import serve

    if args.cpu is not None:  # before any thread starts: zmq's and the worker's inherit it
        try:
            os.sched_setaffinity(0, {args.cpu})
        except (OSError, AttributeError) as e:
            print(f"graphflow worker: cannot run on CPU {args.cpu}: {e}", file=sys.stderr)
            return 2
    serve(args.listen, announce=True, own_gc=True, parent=args.exit_with_parent,
          once=args.once)
    return 0


def _bench_without_suite(argv: list[str]) -> bool:
    """`graphflow bench` with options but no suite before them (and no --help)."""
    rest = argv[1:]
    return (argv[:1] == ["bench"] and not (rest and not rest[0].startswith("-"))
            and not {"-h", "--help"} & set(rest))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    keep_freed_memory()  # every command runs (or serves) steps: the same tensors again and again
    if argv[:1] == ["ps"]:  # its own parser (argparse cannot pass options through)
        from graphflow.ps.__main__ import main as ps

        return int(ps(argv[1:], prog="graphflow ps"))
    if _bench_without_suite(argv):  # (argparse would say "required: suite, args")
        from graphflow.bench import SUITES

        print(f"usage: graphflow bench SUITE [options]\ngraphflow bench: error: choose a "
              f"suite: {', '.join(SUITES)} (`graphflow bench SUITE --help` for its "
              "options)", file=sys.stderr)
        return 2
    if argv[:1] == ["worker"]:  # its own parser: a worker starts without the driver's imports
        worker = argparse.ArgumentParser(prog="graphflow worker", **WORKER)
        args = _worker_arguments(worker).parse_args(argv[1:])
        args.command = "worker"
    else:
        args = _parser().parse_args(argv)
    if args.command == "train" and (conflict := train_command.conflict(args)):
        print(f"graphflow train: error: {conflict}", file=sys.stderr)
        return 2
    handler = {"train": train_command.run, "show": cmd_show, "ops": cmd_ops, "bench": cmd_bench,
               "worker": cmd_worker, "visualize": cmd_visualize,
               "timeline": cmd_timeline}[args.command]
    try:
        return handler(args)
    except BrokenPipeError:  # e.g. `graphflow show lc-large | head`; before OSError, its base
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except UsageError as e:  # (found before any work: argparse's exit code; before ValueError)
        print(f"graphflow {args.command}: error: {e}", file=sys.stderr)
        return 2
    except (GraphflowError, ValueError, ImportError, OSError) as e:
        print(f"graphflow {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
