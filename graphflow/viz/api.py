"""`visualize(plan, path)`: the format follows the file's suffix."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from graphflow.partitioners.plan import Plan
from graphflow.viz.compose import compose, spatial_scene
from graphflow.viz.diagram import Diagram, build_diagram
from graphflow.viz.dot import to_dot
from graphflow.viz.page import to_html
from graphflow.viz.png import require_matplotlib, write_png
from graphflow.viz.scene import Scene
from graphflow.viz.spatial import spatial_layers
from graphflow.viz.svg import to_svg

if TYPE_CHECKING:
    from graphflow.costmodel import CostModel

FORMATS = (".svg", ".png", ".dot", ".html")
VIEWS = ("plan", "spatial")


def visualize(plan: Plan | Sequence[Plan], path: str | Path, *, detail: str = "layers",
              batch: int = 64, compare: Sequence[Plan] | None = None,
              title: str | None = None) -> Path:
    """Draw `plan` to `path` (.svg, .png, .dot or .html); returns the path. A list of plans
    draws the first with the others compared beside it (as `compare=` does).

    The layer graph (`detail="ops"`: every op) coloured by worker, cut edges labelled with the
    bytes they carry per step at `batch`, per-worker bars of FLOPs, parameters, bytes in / out
    and predicted busy time, and for split locally connected layers the spatial view. Plans
    in `compare` are drawn beside it with their predicted step times. `.png` needs matplotlib.

    >>> import graphflow as gf
    >>> m = gf.models.lc_large(batch=None)
    >>> plans = [gf.partition(m.graph, 4, s, loss=m.loss) for s in ("spatial", "layerwise")]
    >>> gf.visualize(plans[0], "plan.svg", compare=plans[1:])  # doctest: +SKIP
    PosixPath('plan.svg')
    """
    first = list(plan) if isinstance(plan, list | tuple) else [plan]
    if not first:
        raise ValueError("visualize: no plan to draw (an empty list)")
    others = [compare] if isinstance(compare, Plan) else list(compare or [])
    plans = [*first, *others]
    for i, p in enumerate(plans):
        if not isinstance(p, Plan):
            what = "compare takes" if i >= len(first) else "visualize draws"
            raise TypeError(f"{what} plans (gf.partition(graph, parts, strategy, loss=...)), "
                            f"got {type(p).__name__} {p!r:.60}")
    render(plans, path, detail, batch, title)
    return Path(path)


def render(plans: Sequence[Plan], path: str | Path, detail: str = "layers", batch: int = 64,
           title: str | None = None, view: str = "plan",
           cost: CostModel | None = None) -> list[Diagram]:
    """Write the plans side by side to `path`; returns their diagrams (for summaries).
    `view="spatial"` draws only the plans' spatial views, one below the other; `cost`
    predicts busy times. Missing folders of `path` are made (as argtypes.output_file says)."""
    path = Path(path)
    fmt = _check(path, view)
    diagrams = [build_diagram(p, detail, batch, _title(p, title), cost) for p in plans]
    picture: Scene | str
    if fmt == ".dot":
        picture = to_dot(diagrams)
    else:
        layers = [spatial_layers(p, batch) for p in plans]
        if view == "spatial" and not layers[0]:
            raise ValueError(f"{diagrams[0].title}: no local2d or conv2d layer to draw a "
                             f"spatial view of")
        scene = (spatial_scene(diagrams, layers) if view == "spatial"
                 else compose(diagrams, layers))
        picture = (scene if fmt == ".png" else to_svg(scene) if fmt == ".svg"
                   else to_html(scene))
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(picture, str):
        path.write_text(picture)
    else:
        write_png(picture, path)
    return diagrams


def _check(path: Path, view: str) -> str:
    """The format of `path`, once it and `view` are known to go together."""
    fmt = path.suffix.lower()
    if fmt not in FORMATS:
        raise ValueError(f"cannot write '{path}': unknown format "
                         f"'{fmt or '(no suffix)'}'; use one of {', '.join(FORMATS)}")
    if view not in VIEWS:
        raise ValueError(f"unknown view '{view}'; use one of: {', '.join(VIEWS)}")
    if view == "spatial" and fmt == ".dot":
        raise ValueError("the spatial view is a picture: write .svg, .png or .html")
    if fmt == ".png":
        require_matplotlib()  # before any work
    return fmt


def _title(plan: Plan, model: str | None) -> str:
    what = f"{plan.strategy}, {plan.parts} worker{'s' if plan.parts > 1 else ''}"
    return f"{model}: {what}" if model else what
