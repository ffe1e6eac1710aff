"""Acceptance 2 of issue 5: the HTML page opens in headless Chromium, renders (a non-blank
screenshot), counts as many nodes as the plan has layers (its script ran), and no request
leaves the page.

Chromium is Debian's `chromium` package: installed here by the session fixture when missing
(as root, with apt-get), skipped with the reason when that cannot be done. Every subprocess
has a timeout; DNS is mapped to nothing, so even the browser's own background requests
cannot leave the machine.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

import graphflow as gf
from graphflow.viz import build_diagram, visualize
from graphflow.viz.scene import light
from tests.vizparse import read_png

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--host-resolver-rules=MAP * ~NOTFOUND",
         "--virtual-time-budget=3000"]
INSTALL_SECONDS = 300


def _apt_install() -> str:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=INSTALL_SECONDS)
    if r.returncode != 0:  # the package lists may be missing or stale
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, env=env,
                       timeout=INSTALL_SECONDS)
        r = subprocess.run(cmd, capture_output=True, text=True, env=env,
                           timeout=INSTALL_SECONDS)
    return r.stderr[-500:]


@pytest.fixture(scope="session")
def chromium():
    path = shutil.which("chromium")
    if path is None:
        if not hasattr(os, "geteuid") or os.geteuid() != 0 or not shutil.which("apt-get"):
            pytest.skip(reason="headless Chromium is not installed and cannot be installed here "
                        "(needs root and apt-get: apt-get install chromium)")
        try:
            why = _apt_install()
        except subprocess.TimeoutExpired:
            why = f"apt-get took over {INSTALL_SECONDS} s"
        path = shutil.which("chromium")
        if path is None:
            pytest.skip(reason=f"could not install Debian's chromium package: {why}")
    return path


def browse(chromium, tmp_path, page, *args):
    """Run Chromium headless on `page`; returns (stdout, the URLs the page requested)."""
    log = tmp_path / f"net-{len(list(tmp_path.glob('net-*')))}.json"
    cmd = [chromium, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
           f"--log-net-log={log}", *args, page.as_uri()]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout, page_requests(log)


def page_requests(log):
    """URLs of the requests a page made: in Chromium's net log, those with an initiator (the
    browser's own background requests have none: "not an origin")."""
    events = json.loads(log.read_text())
    types = {v: k for k, v in events["constants"]["logEventTypes"].items()}
    return [e["params"]["url"] for e in events["events"]
            if types[e["type"]] == "URL_REQUEST_START_JOB" and "url" in e.get("params", {})
            and e["params"].get("initiator") != "not an origin"]


def test_the_page_renders_counts_its_nodes_and_requests_nothing(chromium, tmp_path):
    m = gf.models.lc_large(batch=None)
    plan = gf.partition(m.graph, 4, "spatial", loss=m.loss)
    layers = len(build_diagram(plan).boxes)
    page = visualize(plan, tmp_path / "plan.html", title="lc-large")

    dom, requests = browse(chromium, tmp_path, page, "--dump-dom")
    assert f"<title>graphflow plan: {layers} nodes</title>" in dom  # the script ran
    assert re.search(rf'<body[^>]*data-nodes="{layers}"', dom)
    assert len(re.findall(r'<g [^>]*class="node layer"', dom)) == layers
    assert all(u.startswith(("file:", "data:")) for u in requests), requests

    _, requests = browse(chromium, tmp_path, page, "--window-size=1280,900",
                         f"--screenshot={tmp_path / 'shot.png'}")
    assert all(u.startswith(("file:", "data:")) for u in requests), requests
    image = read_png(str(tmp_path / "shot.png"))[..., :3].astype(int)
    assert image.shape[:2] == (900, 1280)
    assert (image.min(axis=2) < 200).mean() > 0.01, "the screenshot is (nearly) blank"
    worker0 = np.array([int(light(0)[i:i + 2], 16) for i in (1, 3, 5)])
    assert (np.abs(image - worker0).sum(axis=2) < 12).sum() > 100, "no worker-0 boxes drawn"


def test_a_page_that_requests_something_is_caught(chromium, tmp_path):
    """The check above can fail: a page loading an image from loopback port 9 (discard)."""
    page = tmp_path / "leak.html"
    page.write_text('<!DOCTYPE html><html><body><img src="http://127.0.0.1:9/x.png">'
                    "</body></html>")
    _, requests = browse(chromium, tmp_path, page, "--dump-dom")
    assert "http://127.0.0.1:9/x.png" in requests


PROBE = """<script>
const svg = document.getElementById('plan');
svg.querySelector('g.legend-item[data-worker="3"]')
   .dispatchEvent(new MouseEvent('click', {bubbles: true}));
const on = [...svg.querySelectorAll('g.node.on')].map(n => n.dataset.name).sort();
svg.querySelector('g.node[data-name="lc2"] rect.frame')
   .dispatchEvent(new PointerEvent('pointermove', {bubbles: true, clientX: 40, clientY: 40}));
const tip = document.getElementById('tip');
document.body.dataset.probe = JSON.stringify(
  {on, focus: svg.classList.contains('focus'), tip: tip.style.display, text: tip.textContent});
</script>
</body>"""


def test_hover_and_worker_highlight(chromium, tmp_path):
    """A click on worker 3 in the legend highlights the layers it runs; hovering lc2 shows
    its op, shape, FLOPs, parameters and workers."""
    m = gf.models.lc_large(batch=None)
    plan = gf.partition(m.graph, 4, "spatial", loss=m.loss)
    page = visualize(plan, tmp_path / "plan.html")
    page.write_text(page.read_text().replace("</body>", PROBE))
    dom, _ = browse(chromium, tmp_path, page, "--dump-dom")
    probe = json.loads(html.unescape(re.search(r'data-probe="([^"]*)"', dom).group(1)))
    expected = sorted(b.label for b in build_diagram(plan).boxes
                      if 3 in [w for w, _ in b.workers])
    assert probe["focus"] and probe["on"] == expected
    assert probe["tip"] == "block"
    for part in ("lc2", "local2d", "FLOPs", "parameters", "worker: w0"):
        assert part in probe["text"]
