"""`graphflow visualize MODEL --parts N --strategy S -o FILE`: draw how a model is split.

MODEL is a reference workload (lc-large, speech-mlp, digits-lc), `module:function`,
`path/to/file.py:function`, or a file or module alone, whose `build_model()` is used (see
graphflow.modelspec).

    graphflow visualize lc-large --parts 4 -o plan.svg
    graphflow visualize lc-large --parts 4 --compare spatial,layerwise,mincut -o cmp.html
    graphflow visualize models.py:my_net --parts 2 --strategy mincut --detail ops -o net.dot
    graphflow visualize lc-large --parts 4 --view spatial -o grid.png
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from graphflow.argtypes import count, output_file
from graphflow.errors import GraphflowError
from graphflow.modelspec import figure_batch, load_model
from graphflow.units import fmt_bytes
from graphflow.viz.api import FORMATS, VIEWS, render
from graphflow.viz.diagram import DETAILS

# The cli wires this in with `configure(parser)` and `run(args)` and prints the errors `run`
# raises (GraphflowError, ValueError, ImportError for .png without matplotlib, OSError).
EXAMPLE = "example: graphflow visualize lc-large --parts 4 --strategy spatial -o plan.svg"


def configure(parser: argparse.ArgumentParser) -> None:
    """Add visualize's arguments to `parser` (a subparser of the `graphflow` command)."""
    from graphflow.partitioners import STRATEGIES
    from graphflow.prediction import add_estimate_option  # (it imports the runtime)

    parser.description = parser.description or __doc__.split("\n\n")[0]
    parser.epilog = parser.epilog or EXAMPLE
    parser.add_argument("model", metavar="MODEL",
                        help="lc-large, speech-mlp, digits-lc, module:function or "
                             "file.py[:function] (default function: build_model)")
    parser.add_argument("--parts", type=count, default=2, help="workers to split it across (2)")
    parser.add_argument("--strategy", default=None, choices=STRATEGIES,
                        help="placement strategy (spatial)")
    parser.add_argument("-o", "--output", default="plan.svg", metavar="FILE", type=picture_file,
                        help=f"output file; its suffix picks the format: "
                             f"{', '.join(FORMATS)} (plan.svg)")
    parser.add_argument("--detail", default=None, choices=DETAILS,
                        help="one box per layer (name scope) or per op (layers)")
    parser.add_argument("--compare", default=None, metavar="S1,S2,...", type=strategy_list,
                        help="draw these strategies side by side with their predicted "
                             "step times, e.g. spatial,layerwise,mincut")
    parser.add_argument("--view", default="plan", choices=VIEWS,
                        help="the plan (graph, bars and spatial view) or only the spatial "
                             "view of its local2d / conv layers, one a plan (plan)")
    parser.add_argument("--batch", type=count, default=None,
                        help="batch size for bytes, FLOPs and predicted times (default: the "
                             "model's own, else 64)")
    parser.add_argument("--json", action="store_true",
                        help="print a summary of each plan as JSON on stdout")
    add_estimate_option(parser)


def picture_file(text: str) -> str:
    """An argparse type: a file to write (`argtypes.output_file`) whose suffix is a format
    visualize writes."""
    if Path(text).suffix.lower() not in FORMATS:
        raise argparse.ArgumentTypeError(
            f"'{text}': unknown format '{Path(text).suffix or '(no suffix)'}'; use one of "
            f"{', '.join(FORMATS)}")
    return str(output_file(text))


def strategy_list(text: str) -> list[str]:
    """An argparse type: comma-separated strategy names, each a known one."""
    from graphflow.partitioners import STRATEGIES

    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in names if s not in STRATEGIES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown strategy '{(unknown or [''])[0]}'; known: "
                                         f"{', '.join(STRATEGIES)}")
    return names


def strategies(args: argparse.Namespace) -> list[str]:
    """The strategies to draw: --compare's list, or --strategy."""
    if not args.compare:
        return [args.strategy or "spatial"]
    if isinstance(args.compare, str):  # a namespace not from configure's parser
        try:
            return strategy_list(args.compare)
        except argparse.ArgumentTypeError as e:
            raise GraphflowError(f"--compare: {e}") from None
    return list(args.compare)


def conflict(args: argparse.Namespace) -> str | None:
    """Options that would be ignored together: a usage error, not a silent no-op."""
    if args.compare and args.strategy is not None:
        return (f"--strategy {args.strategy} is ignored with --compare, which names the "
                f"strategies to draw: add {args.strategy} to its list instead")
    if args.view == "spatial" and args.detail is not None:
        return ("--detail picks the graph's boxes, and --view spatial draws no graph (only "
                "the grids of the local2d / conv layers)")
    if args.view == "spatial" and Path(args.output).suffix.lower() == ".dot":
        return "--view spatial is a picture: write .svg, .png or .html, not .dot"
    return None


def run(args: argparse.Namespace) -> int:
    """Partition MODEL, write the picture, print where (or the summary with --json); 2 for
    options that do not go together (said on stderr)."""
    from graphflow.partitioners import partition
    from graphflow.prediction import command_cost

    if args.parts < 1:
        raise GraphflowError(f"--parts must be at least 1, got {args.parts}")
    if problem := conflict(args):
        return usage_error(problem)
    name, graph, loss = load_model(args.model)
    try:
        args.batch = figure_batch(graph, args.batch)
    except GraphflowError as e:  # the model's own batch, not another
        return usage_error(str(e))
    detail = args.detail or "layers"
    plans = [partition(graph, args.parts, s, loss=loss) for s in strategies(args)]
    cost = command_cost(plans, args.batch, args.estimate)
    diagrams = render(plans, args.output, detail, args.batch, name, args.view, cost)
    if args.json:
        print(json.dumps({"model": name, "output": str(args.output),
                          "plans": [d.summary() for d in diagrams]}))
        return 0
    for d in diagrams:
        s = d.summary()
        print(f"{d.title}: {s[detail]} {detail}, {s['transfers']} transfers of "
              f"{fmt_bytes(s['bytes_per_step'])} per step, predicted step "
              f"{s['predicted_step_ms']:.1f} ms")
        if d.idle:  # as `graphflow show` says it
            print(f"idle: worker(s) {', '.join(map(str, d.idle))} got no nodes")
    print(f"wrote {args.output}")
    return 0


def usage_error(message: str) -> int:
    """Say on stderr what was wrong with the options; the exit code of a usage error."""
    print(f"graphflow visualize: error: {message}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m graphflow.viz ...`: the same command without the `graphflow` entry point."""
    parser = argparse.ArgumentParser(prog="graphflow visualize")
    configure(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (GraphflowError, ValueError, ImportError, OSError) as e:
        print(f"graphflow visualize: error: {e}", file=sys.stderr)
        return 1
