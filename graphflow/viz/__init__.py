"""The partition visualizer: how a plan splits a model, before any machine is spent on it.

`visualize(plan, path)` writes `.svg` (pure Python), `.png` (needs matplotlib), `.dot` (for
Graphviz users) or `.html` (one self-contained page: pan, zoom, hover, highlight a worker).
The pieces are data first: `build_diagram` (boxes, edges, cut edges with bytes, per-worker
figures) and `spatial_layers` (the spatial view's grids and halos) can be read by tests and
scripts; `graphflow visualize MODEL ...` is `graphflow.viz.command`.

>>> import graphflow as gf
>>> m = gf.models.lc_large(batch=None)
>>> plan = gf.partition(m.graph, 4, "spatial", loss=m.loss)
>>> [b.label for b in build_diagram(plan).boxes if len(b.workers) == 4]
['lc1', 'relu', 'lc2', 'relu_1', 'to_nchw', 'fc', 'flatten']
"""

from graphflow.modelspec import load_model
from graphflow.viz.api import FORMATS, VIEWS, render, visualize
from graphflow.viz.diagram import DETAILS, Box, Cut, Diagram, build_diagram
from graphflow.viz.spatial import Halo, SpatialLayer, spatial_layers

__all__ = ["DETAILS", "FORMATS", "VIEWS", "Box", "Cut", "Diagram", "Halo", "SpatialLayer",
           "build_diagram", "load_model", "render", "spatial_layers", "visualize"]
