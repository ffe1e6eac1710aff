"""Scene -> SVG text, in pure Python (no dependency): `.svg` output always works."""

from __future__ import annotations

from xml.sax.saxutils import escape, quoteattr

from graphflow.viz.scene import Group, Item, Path, Polygon, Rect, Scene, Text

FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
ANCHOR = {"start": "start", "middle": "middle", "end": "end"}


def to_svg(scene: Scene, element_id: str | None = None) -> str:
    """The scene as a standalone SVG document (an `<svg>` element, for HTML, when
    `element_id` is given)."""
    hatches = sorted(_hatch_colours(scene.items))
    # inline in HTML the namespace is implied: the page then holds no URL at all
    xmlns = "" if element_id else ' xmlns="http://www.w3.org/2000/svg"'
    head = (f'<svg{xmlns} width="{scene.width:.0f}" '
            f'height="{scene.height:.0f}" viewBox="0 0 {scene.width:.0f} {scene.height:.0f}" '
            f'font-family={quoteattr(FONT)}'
            + (f' id={quoteattr(element_id)}' if element_id else "") + ">")
    lines = [head, f"<title>{escape(scene.title)}</title>", "<defs>"]
    for colour in hatches:
        lines.append(f'<pattern id="{_hatch_id(colour)}" width="6" height="6" '
                     f'patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
                     f'<rect width="2.5" height="6" fill="{colour}" fill-opacity="0.75"/>'
                     f"</pattern>")
    lines.append("</defs>")
    lines.append(f'<rect width="{scene.width:.0f}" height="{scene.height:.0f}" fill="white"/>')
    lines.extend(_item(i) for i in scene.items)
    lines.append("</svg>")
    prolog = "" if element_id else '<?xml version="1.0" encoding="UTF-8"?>\n'
    return prolog + "\n".join(lines) + "\n"


def _item(item: Item) -> str:
    if isinstance(item, Group):
        return _group(item)
    if isinstance(item, Rect):
        return _rect(item)
    if isinstance(item, Text):
        weight = ' font-weight="bold"' if item.bold else ""
        return (f'<text x="{item.x:.1f}" y="{item.y:.1f}" font-size="{item.size:.1f}" '
                f'text-anchor="{ANCHOR[item.anchor]}" fill="{item.color}"{weight}>'
                f"{escape(item.text)}</text>")
    if isinstance(item, Path):
        dash = ' stroke-dasharray="5,3"' if item.dash else ""
        return (f'<path d="{_path_data(item)}" fill="none" stroke="{item.color}" '
                f'stroke-width="{item.width:g}"{dash}/>')
    if isinstance(item, Polygon):
        points = " ".join(f"{x:.1f},{y:.1f}" for x, y in item.points)
        return f'<polygon points="{points}" fill="{item.fill}"/>'
    raise TypeError(f"cannot draw {type(item).__name__} in SVG")


def _group(g: Group) -> str:
    attrs = []
    if g.id:
        attrs.append(f"id={quoteattr(g.id)}")
    if g.cls:
        attrs.append(f"class={quoteattr(g.cls)}")
    attrs.extend(f"data-{k}={quoteattr(v)}" for k, v in g.data.items())
    if g.x or g.y:
        attrs.append(f'transform="translate({g.x:.1f},{g.y:.1f})"')
    title = f"<title>{escape(g.title)}</title>" if g.title else ""
    body = "\n".join(_item(i) for i in g.items)
    return f"<g {' '.join(attrs)}>{title}\n{body}\n</g>"


def _rect(r: Rect) -> str:
    attrs = [f'x="{r.x:.1f}" y="{r.y:.1f}" width="{r.w:.1f}" height="{r.h:.1f}"',
             f'fill="{r.fill}" stroke="{r.stroke}" stroke-width="{r.width:g}"']
    if r.dash:
        attrs.append('stroke-dasharray="4,3"')
    if r.cls:
        attrs.append(f"class={quoteattr(r.cls)}")
    attrs.extend(f"data-{k}={quoteattr(v)}" for k, v in r.data.items())
    out = f"<rect {' '.join(attrs)}/>"
    if r.hatch:  # the hatching is a second rect filled with a pattern, over the first
        out += (f'<rect x="{r.x:.1f}" y="{r.y:.1f}" width="{r.w:.1f}" height="{r.h:.1f}" '
                f'fill="url(#{_hatch_id(r.hatch)})" pointer-events="none"/>')
    return out


def _path_data(p: Path) -> str:
    (x0, y0), *rest = p.points
    if p.curve and len(rest) == 3:
        return f"M{x0:.1f},{y0:.1f} C" + " ".join(f"{x:.1f},{y:.1f}" for x, y in rest)
    return f"M{x0:.1f},{y0:.1f} " + " ".join(f"L{x:.1f},{y:.1f}" for x, y in rest)


def _hatch_colours(items: list[Item]) -> set[str]:
    out = set()
    for i in items:
        if isinstance(i, Group):
            out |= _hatch_colours(i.items)
        elif isinstance(i, Rect) and i.hatch:
            out.add(i.hatch)
    return out


def _hatch_id(colour: str) -> str:
    return "hatch-" + colour.lstrip("#")
