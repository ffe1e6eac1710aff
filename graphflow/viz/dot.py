"""Diagram -> Graphviz DOT text (for Graphviz users; graphflow itself never runs Graphviz).

One node statement per box (`class="node layer"` or `"node op"`); data edges in grey; cut
edges in red with `label` (the bytes per step), `bytes` and `transfers` attributes. A box that
spans workers is `striped` in its workers' colours. Several diagrams become clusters.
"""

from __future__ import annotations

from graphflow.units import fmt_bytes, fmt_ms
from graphflow.viz.diagram import Box, Diagram
from graphflow.viz.graph import tooltip
from graphflow.viz.scene import CUT, EDGE, REPLICATED_FILL, light


def to_dot(diagrams: list[Diagram]) -> str:
    lines = ["digraph plan {",
             '  graph [rankdir=TB, labelloc=t, labeljust=l, fontname="Helvetica"];',
             '  node [shape=box, style=filled, fontname="Helvetica", fontsize=11];',
             f'  edge [color="{EDGE}", fontname="Helvetica", fontsize=10];']
    if len(diagrams) == 1:
        lines.append(f"  graph [label={_q(_caption(diagrams[0]))}];")
        lines += _body(diagrams[0], "", "  ")
    else:
        for k, d in enumerate(diagrams):
            lines.append(f"  subgraph cluster_{k} {{")
            lines.append(f"    graph [label={_q(_caption(d))}];")
            lines += _body(d, f"p{k}:", "    ")
            lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _body(d: Diagram, prefix: str, pad: str) -> list[str]:
    kind = "layer" if d.detail == "layers" else "op"
    label = {b.id: b.label for b in d.boxes}
    out = [f"{pad}{_q(prefix + b.label)} [{_node_attrs(b, kind)}];" for b in d.boxes]
    out += [f"{pad}{_q(prefix + label[a])} -> {_q(prefix + label[b])};" for a, b in d.edges]
    for c in d.cuts:
        attrs = {"label": fmt_bytes(c.nbytes), "color": CUT, "fontcolor": CUT,
                 "penwidth": "2", "style": "dashed" if c.backward else "solid",
                 "class": f"cut {'backward' if c.backward else 'forward'}",
                 "bytes": str(c.nbytes), "transfers": " ".join(c.transfers),
                 "constraint": "false" if c.backward or c.src == c.dst else "true"}
        out.append(f"{pad}{_q(prefix + label[c.src])} -> {_q(prefix + label[c.dst])} "
                   f"[{_attrs(attrs)}];")
    return out


def _node_attrs(b: Box, kind: str) -> str:
    attrs = {"label": f"{b.label}\n{b.op} {b.shape}", "class": f"node {kind}",
             "tooltip": tooltip(b), "workers": " ".join(str(w) for w, _ in b.workers)}
    if not b.workers:
        attrs["fillcolor"] = REPLICATED_FILL
    elif len(b.workers) == 1:
        attrs["fillcolor"] = light(b.workers[0][0])
    else:
        attrs["style"] = "striped"
        attrs["fillcolor"] = ":".join(f"{light(w)};{share:.3f}" for w, share in b.workers)
    return _attrs(attrs)


def _caption(d: Diagram) -> str:
    lines = [f"{d.title}: predicted step {fmt_ms(d.step_seconds)}, batch {d.batch}"]
    for s, busy in zip(d.stats, d.busy):
        lines.append(f"w{s.index}: {s.flops / 1e9:.3g} GFLOP, params {fmt_bytes(s.param_bytes)}"
                     f", in {fmt_bytes(s.bytes_in)}, out {fmt_bytes(s.bytes_out)}, busy "
                     f"{fmt_ms(busy)}")
    return "\n".join(lines)


def _attrs(attrs: dict[str, str]) -> str:
    return ", ".join(f"{k}={_q(v)}" for k, v in attrs.items())


def _q(s: str) -> str:
    """A DOT double-quoted string (newlines become DOT's `\\n` escape)."""
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
