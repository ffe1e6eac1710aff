"""Graphs as plain data (dicts of lists, strings and numbers) for saving plans and shipping
subgraphs to workers. Round-trips exactly: tuples, numpy constants and None (batch) dims.

>>> import graphflow as gf
>>> with gf.Graph() as g:
...     y = gf.relu(gf.placeholder("x", (None, 3)) * 2.0)
>>> str(graph_from_dict(graph_to_dict(g))) == str(g)
True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphflow.ir import Graph

FORMAT = "graphflow.graph/1"


def encode_value(v: Any) -> Any:
    """Attrs -> JSON/msgpack-safe data; tuples and arrays are tagged to come back the same."""
    if isinstance(v, np.ndarray):
        return {"__nd__": v.dtype.name, "shape": list(v.shape), "data": v.ravel().tolist()}
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, tuple):
        return {"__tuple__": [encode_value(x) for x in v]}
    if isinstance(v, list):
        return [encode_value(x) for x in v]
    if isinstance(v, dict):
        return {str(k): encode_value(x) for k, x in v.items()}
    return v


def decode_value(v: Any) -> Any:
    if isinstance(v, dict):
        if "__nd__" in v:
            return np.array(v["data"], dtype=v["__nd__"]).reshape(v["shape"])
        if "__tuple__" in v:
            return tuple(decode_value(x) for x in v["__tuple__"])
        return {k: decode_value(x) for k, x in v.items()}
    if isinstance(v, list):
        return [decode_value(x) for x in v]
    return v


def graph_to_dict(graph: Graph) -> dict[str, Any]:
    nodes = [{"op": n.op, "name": n.name, "inputs": [x.name for x in n.inputs],
              "attrs": encode_value(n.attrs), "shape": list(n.shape), "dtype": n.dtype,
              "device": n.device, "source": n.source} for n in graph.nodes]
    return {"format": FORMAT, "dtype": graph.dtype, "seed": graph.seed, "nodes": nodes,
            "gradients": dict(graph.gradients)}


def graph_from_dict(data: dict[str, Any]) -> Graph:
    """Rebuild and validate a graph (shape rules re-checked, unknown ops and cycles refused)."""
    if data.get("format") != FORMAT:
        raise ValueError(f"not a graphflow graph (format {data.get('format')!r}, "
                         f"expected {FORMAT!r})")
    g = Graph(data["dtype"], data["seed"])
    for d in data["nodes"]:
        missing = [x for x in d["inputs"] if x not in g]
        if missing:
            raise ValueError(f"node '{d['name']}' uses {missing[0]!r} before it is defined")
        g.insert(d["op"], d["name"], [g[x] for x in d["inputs"]], decode_value(d["attrs"]),
                 tuple(d["shape"]), d["dtype"], d["device"], d["source"])
    g.gradients = {k: v for k, v in data.get("gradients", {}).items() if k in g and v in g}
    g.validate()
    return g
