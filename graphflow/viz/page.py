"""Scene -> one self-contained HTML page: the SVG inline, CSS and JavaScript inline, no request
leaves the page. Drag to pan, wheel to zoom, hover a node for its op, shape, FLOPs, parameters
and worker, click a worker (in the legend, a node or a bar) to highlight its subgraph; Escape
or a click on the background clears it, `0` resets the view."""

from __future__ import annotations

from xml.sax.saxutils import escape

from graphflow.viz.scene import Scene
from graphflow.viz.svg import to_svg

STYLE = """
html, body { margin: 0; height: 100%; font-family: DejaVu Sans, Helvetica, Arial, sans-serif; }
#bar { position: fixed; top: 0; left: 0; right: 0; padding: 4px 10px; background: #fafafa;
       border-bottom: 1px solid #ddd; font-size: 12px; color: #555; z-index: 2; }
#plan { position: fixed; top: 25px; left: 0; width: 100%; height: calc(100% - 25px);
        cursor: grab; }
#plan.dragging { cursor: grabbing; }
#tip { position: fixed; display: none; white-space: pre; background: #fffffe;
       border: 1px solid #888; padding: 6px 8px; font-size: 12px; z-index: 3;
       box-shadow: 1px 2px 6px rgba(0,0,0,.2); pointer-events: none; }
g.node, g.legend-item, rect.bar, rect.block { cursor: pointer; }
g.node:hover rect.frame { stroke-width: 2.5; }
.focus g.node:not(.on), .focus g.edge:not(.on), .focus g.cut:not(.on),
.focus rect.bar:not(.on), .focus rect.block:not(.on) { opacity: .15; }
"""

SCRIPT = r"""
(function () {
  const svg = document.getElementById('plan');
  const tip = document.getElementById('tip');
  const nodes = svg.querySelectorAll('g.node');
  document.body.dataset.nodes = String(nodes.length);
  document.title = 'graphflow plan: ' + nodes.length + ' nodes';
  svg.querySelectorAll('g.node > title').forEach(t => t.remove());  // our tooltip instead
  const full = svg.getAttribute('viewBox').split(' ').map(Number);
  let vb = full.slice();
  const show = () => svg.setAttribute('viewBox', vb.join(' '));
  const toSvg = (cx, cy) => {
    const r = svg.getBoundingClientRect();
    const s = Math.max(vb[2] / r.width, vb[3] / r.height);
    return [vb[0] + (cx - r.left) * s, vb[1] + (cy - r.top) * s, s];
  };
  svg.addEventListener('wheel', e => {
    e.preventDefault();
    const f = e.deltaY < 0 ? 0.85 : 1 / 0.85;
    const [px, py] = toSvg(e.clientX, e.clientY);
    vb = [px - (px - vb[0]) * f, py - (py - vb[1]) * f, vb[2] * f, vb[3] * f];
    show();
  }, {passive: false});
  let drag = null, dragged = false;  // dragged: the click that ends a drag is no click
  svg.addEventListener('pointerdown', e => {
    drag = {x: e.clientX, y: e.clientY, vb: vb.slice(), moved: false};
    dragged = false;
    svg.classList.add('dragging');
  });
  window.addEventListener('pointermove', e => {
    if (drag) {
      const s = toSvg(0, 0)[2];
      const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
      if (Math.abs(dx) + Math.abs(dy) > 3) drag.moved = true;
      vb = [drag.vb[0] - dx * s, drag.vb[1] - dy * s, vb[2], vb[3]];
      show();
    }
    const node = e.target.closest && e.target.closest('g.node');
    if (node && !drag) {
      tip.textContent = node.dataset.info;
      tip.style.display = 'block';
      tip.style.left = (e.clientX + 14) + 'px';
      tip.style.top = (e.clientY + 14) + 'px';
    } else {
      tip.style.display = 'none';
    }
  });
  // on the window: a drag may end outside the SVG (or the browser may take the pointer)
  const endDrag = () => {
    dragged = drag !== null && drag.moved;
    drag = null;
    svg.classList.remove('dragging');
  };
  window.addEventListener('pointerup', endDrag);
  window.addEventListener('pointercancel', endDrag);
  let focus = null;
  const highlight = w => {
    focus = (w === focus) ? null : w;
    svg.classList.toggle('focus', focus !== null);
    svg.querySelectorAll('[data-workers]').forEach(el => {
      el.classList.toggle('on', focus !== null && el.dataset.workers.split(' ').includes(focus));
    });
    svg.querySelectorAll('rect.bar, rect.block').forEach(el => {
      el.classList.toggle('on', el.dataset.worker === focus);
    });
    document.getElementById('focus').textContent =
      focus === null ? '' : ' | highlighting worker ' + focus;
  };
  svg.addEventListener('click', e => {
    if (dragged) { dragged = false; return; }
    const hit = e.target.closest('[data-worker], g.node');
    if (!hit) { if (focus !== null) highlight(focus); return; }
    const w = hit.dataset.worker !== undefined ? hit.dataset.worker
      : (hit.dataset.workers || '').split(' ')[0];
    if (w !== '' && w !== '-1') highlight(w);
  });
  window.addEventListener('keydown', e => {
    if (e.key === 'Escape' && focus !== null) highlight(focus);
    if (e.key === '0') { vb = full.slice(); show(); }
  });
})();
"""


def to_html(scene: Scene) -> str:
    svg = to_svg(scene, element_id="plan")
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f"<title>{escape(scene.title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
            f'<div id="bar">{escape(scene.title)} | drag to pan, wheel to zoom, key 0 to reset | '
            f'hover a node for details | click a worker to highlight it<span id="focus">'
            f'</span></div>\n{svg}<div id="tip"></div>\n<script>{SCRIPT}</script>\n'
            f"</body>\n</html>\n")
