"""`graphflow timeline TRACE -o OUT.png`: check a trace, print where each worker's time went,
draw the Gantt chart. The lead's cli.py adds the subcommand with `configure` and calls `run`.

    parser = argparse.ArgumentParser(prog="graphflow timeline")
    configure(parser)
    run(parser.parse_args(["run.json", "-o", "run.png"]))
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from graphflow.argtypes import count, output_file
from graphflow.trace.chrome import read
from graphflow.trace.summary import coverage, driver_alone, report

DESCRIPTION = ("Draw a run's trace (graphflow train --trace run.json, or a bench command's "
               "--trace) as a PNG Gantt chart: a row per worker and thread, a bar per kernel, "
               "send, receive and parameter-server call. Prints how much of each measured step "
               "every worker's spans cover. The JSON itself opens in https://ui.perfetto.dev "
               "and chrome://tracing. Drawing needs matplotlib.")
EXAMPLE = ("example: graphflow train lc-large --parts 2 --steps 5 --trace run.json && "
           "graphflow timeline run.json -o run.png --last-steps 2")


def _window(text: str) -> tuple[float, float]:
    try:
        a, b = (float(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected FROM:TO in ms, e.g. 200:450") \
            from None
    if not b > a:
        raise argparse.ArgumentTypeError(f"{text!r}: TO must be after FROM")
    return a, b


def configure(parser: argparse.ArgumentParser) -> None:
    """Add `graphflow timeline`'s arguments (and its description and example) to `parser`."""
    parser.description = parser.description or DESCRIPTION
    parser.epilog = parser.epilog or EXAMPLE
    parser.add_argument("trace", type=Path, help="a trace-event JSON file")
    parser.add_argument("-o", "--output", type=png_file, default=None,
                        help="the PNG to write (default: the trace's path with .png)")
    parser.add_argument("--last-steps", type=count, default=None, metavar="N",
                        help="draw and sum up only the last N steps the driver timed "
                             "(default: all; the summary leaves the first, compiling, out)")
    parser.add_argument("--window", type=_window, default=None, metavar="FROM:TO",
                        help="draw only this time range, in ms since the trace began")
    parser.add_argument("--title", default=None, help="the chart's title")
    parser.add_argument("--no-png", action="store_true",
                        help="only check the trace and print the summary (no matplotlib needed)")
    parser.add_argument("--json", action="store_true",
                        help="print the per-worker summary as JSON on stdout")


def png_file(text: str) -> Path:
    """An argparse type: a .png file to write (`argtypes.output_file`): the chart is a PNG
    whatever the suffix says, and matplotlib refuses a suffix it does not know only after
    the drawing."""
    if Path(text).suffix.lower() != ".png":
        raise argparse.ArgumentTypeError(
            f"'{text}': the chart is a PNG; give a file name ending in .png, not "
            f"'{Path(text).suffix or '(no suffix)'}'")
    return output_file(text)


CHART_OPTIONS = {"--window": "picks what to draw", "--output": "names the chart",
                 "--title": "titles the chart"}


def conflict(args: argparse.Namespace) -> str | None:
    """Options that would be ignored together, or an output that would overwrite the trace:
    a usage error, not a silent no-op."""
    if args.no_png:
        for option, what in CHART_OPTIONS.items():
            if getattr(args, option.lstrip("-")) is not None:
                return (f"{option} {what}, and --no-png draws nothing"  # (the summary is of
                        + ("; to sum up fewer steps, use --last-steps"  # whole steps)
                           if option == "--window" else ""))
        return None
    if args.window is not None and args.last_steps is not None:
        return ("--window and --last-steps both pick what to draw: give one (--last-steps "
                "draws the last N steps and sums them up, --window draws a time range)")
    out = args.output or args.trace.with_suffix(".png")
    if out.resolve() == args.trace.resolve():
        return (f"-o {out}: that is the trace itself; give another file" if args.output else
                f"TRACE {args.trace} ends in .png, where the chart would go; give -o FILE")
    return None


def run(args: argparse.Namespace) -> int:
    """Check the options and the trace, print its summary, draw it; 2 for options that do not
    go together (said on stderr). Raises TraceError (a GraphflowError) for a file that is not
    a trace, ImportError naming matplotlib when it is missing."""
    if args.last_steps is not None and args.last_steps < 1:  # (a namespace of a script's)
        raise ValueError("--last-steps must be >= 1")
    if problem := conflict(args):
        print(f"graphflow timeline: error: {problem}", file=sys.stderr)
        return 2
    doc = read(args.trace)
    out = None
    if not args.no_png:
        from graphflow.trace.gantt import draw

        out = draw(doc, args.output or args.trace.with_suffix(".png"),
                   last_steps=args.last_steps, window_ms=args.window, title=args.title)
    if args.json:
        print(json.dumps({"trace": str(args.trace), "png": str(out) if out else None,
                          "workers": coverage(doc, args.last_steps),
                          "driver_alone": driver_alone(doc, args.last_steps)}))
    else:
        print(report(doc, args.last_steps))
        if out is not None:
            print(f"wrote {out}")
    return 0
