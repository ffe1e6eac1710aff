"""Readers for the visualizer's outputs, written for the tests (no dependency): SVG elements by
class, a small DOT parser, a PNG decoder and byte labels."""

from __future__ import annotations

import re
import struct
import xml.etree.ElementTree as ET
import zlib

import numpy as np

SVG = "{http://www.w3.org/2000/svg}"
UNITS = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def classes(el: ET.Element) -> set[str]:
    return set(el.get("class", "").split())


def svg_groups(root: ET.Element, cls: str) -> list[ET.Element]:
    """Every element with class `cls`, namespaced or not (an SVG inline in HTML has none)."""
    return [el for el in root.iter() if cls in classes(el)]


def parse_svg(text: str) -> ET.Element:
    return ET.fromstring(text.encode())


def inline_svg(html: str) -> ET.Element:
    start, end = html.index("<svg"), html.index("</svg>") + len("</svg>")
    return ET.fromstring(html[start:end].encode())


def label_bytes(label: str) -> float:
    number, unit = label.split()
    return float(number) * UNITS[unit]


def text_of(el: ET.Element) -> list[str]:
    return [t.text or "" for t in el.iter() if t.tag in (f"{SVG}text", "text")]


# -- DOT --------------------------------------------------------------------------------------
_ID = r'"((?:[^"\\]|\\.)*)"'
_NODE = re.compile(rf"^\s*{_ID}\s*\[(.*)\];\s*$")
_EDGE = re.compile(rf"^\s*{_ID}\s*->\s*{_ID}\s*(?:\[(.*)\])?;\s*$")
_ATTR = re.compile(rf"(\w+)={_ID}")


def parse_dot(text: str) -> tuple[dict[str, dict[str, str]], list[tuple[str, str, dict]]]:
    """(node id -> attributes, [(src, dst, attributes)]) of a DOT file written one statement
    a line, as graphflow writes it; fails on an unbalanced brace or an unreadable line."""
    lines = text.strip().splitlines()
    assert lines[0].startswith("digraph") and lines[-1] == "}", "not a digraph"
    assert text.count("{") == text.count("}"), "unbalanced braces"
    nodes, edges = {}, []
    for line in lines[1:-1]:
        if m := _EDGE.match(line):
            edges.append((_unq(m.group(1)), _unq(m.group(2)), _attrs(m.group(3) or "")))
        elif m := _NODE.match(line):
            nodes[_unq(m.group(1))] = _attrs(m.group(2))
        else:
            assert re.match(r"^\s*(graph|node|edge)\s*\[.*\];$|^\s*subgraph \w+ \{$|^\s*\}$",
                            line), f"unreadable DOT line: {line}"
    return nodes, edges


def _attrs(s: str) -> dict[str, str]:
    return {k: _unq(v) for k, v in _ATTR.findall(s)}


def _unq(s: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), s)


# -- PNG --------------------------------------------------------------------------------------
def read_png(path: str) -> np.ndarray:
    """(height, width, channels) uint8: matplotlib's reader when it is there (fast), else ours
    (both check the signature and decode every chunk)."""
    data = open(path, "rb").read()
    try:
        import matplotlib.image
    except ImportError:
        return decode_png(data)
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    return (matplotlib.image.imread(path) * 255).round().astype(np.uint8)


def decode_png(data: bytes) -> np.ndarray:
    """(height, width, channels) uint8 of an 8-bit RGB / RGBA non-interlaced PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        assert zlib.crc32(kind + body) == struct.unpack(">I", data[pos + 8 + length:
                                                                 pos + 12 + length])[0]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, f"unsupported PNG {header}"
    channels = 3 if colour == 2 else 4
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(height, 1 + width * channels)
    return _unfilter(raw, channels).reshape(height, width, channels)


def _unfilter(raw: np.ndarray, bpp: int) -> np.ndarray:
    out = np.zeros((raw.shape[0], raw.shape[1] - 1), np.int32)
    for y, row in enumerate(raw):
        kind, line = row[0], row[1:].astype(np.int32)
        prev = out[y - 1] if y else np.zeros_like(line)
        if kind == 0:
            out[y] = line
        elif kind == 1:
            for x in range(0, len(line), bpp):  # left neighbours: one pixel at a time
                left = out[y, x - bpp:x] if x else 0
                out[y, x:x + bpp] = (line[x:x + bpp] + left) & 255
        elif kind == 2:
            out[y] = (line + prev) & 255
        else:
            for x in range(len(line)):
                a = out[y, x - bpp] if x >= bpp else 0
                b, c = prev[x], prev[x - bpp] if x >= bpp else 0
                if kind == 3:
                    out[y, x] = (line[x] + (a + b) // 2) & 255
                else:
                    p = a + b - c
                    pred = a if abs(p - a) <= min(abs(p - b), abs(p - c)) else (
                        b if abs(p - b) <= abs(p - c) else c)
                    out[y, x] = (line[x] + pred) & 255
    return out.astype(np.uint8)
