"""`graphflow bench speedup` end to end with tiny settings: digits-lc, thread workers, 1 step."""

import json

import pytest

from graphflow.bench import speedup


@pytest.fixture(autouse=True)
def _private_costmodel(tmp_path, monkeypatch):
    """Calibrations go to a file of this test, not the user's cache."""
    monkeypatch.setenv("GRAPHFLOW_COSTMODEL", str(tmp_path / "costmodel.json"))


def test_quick_run_writes_points_json_and_png(tmp_path, capsys):
    out_json, out_png = tmp_path / "speedup.json", tmp_path / "speedup.png"
    code = speedup.main(["--quick", "--workloads", "digits-lc", "--mode", "threads",
                         "--workers", "1,2", "--steps", "1", "--no-progress",
                         "--json", str(out_json), "--png", str(out_png)])
    assert code == 0
    doc = json.loads(out_json.read_text())
    wl = doc["workloads"]["digits-lc"]
    points = {(p["strategy"], p["workers"]): p for p in wl["points"]}
    expected = {("(any)", 1), ("spatial", 2), ("layerwise", 2), ("mincut", 2),
                ("layerwise+1f1b", 2)}
    assert set(points) == expected
    for key, p in points.items():
        if "pipelining unavailable" in p.get("note", ""):
            continue
        assert "error" not in p, (key, p.get("error"))
        assert p["times_s"] and all(t > 0 for t in p["times_s"]), key
        assert p["median_s"] > 0 and p["speedup"] > 0 and p["predicted_s"] > 0, key
    assert wl["ceiling"]["ratio"] > 0
    # the pipelined point says how fast its micro-batches' kernels run (a fraction of the
    # whole batch's speed: per row, a small batch is never much faster)
    assert 0 < points["layerwise+1f1b", 2]["microbatch_rate"] < 1.5
    assert set(wl["predicted"]) == {"spatial", "layerwise", "mincut", "layerwise+1f1b"}
    for curve in wl["predicted"].values():
        assert [c["workers"] for c in curve] == [1, 2, 4]
        assert curve[0]["speedup"] == pytest.approx(1.0)
    assert doc["machine"]["cpu_count"] >= 1
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "machine ceiling (digits-lc)" in printed and "spatial" in printed


@pytest.mark.parametrize("bad", [["--workers", "0"], ["--workloads", "nope"],
                                 ["--strategies", "spatial,bogus"], ["--steps", "0"],
                                 ["--batch", "6", "--microbatches", "4"]])
def test_bad_arguments_exit_2(bad, capsys):
    assert speedup.main(bad) == 2
    assert "error" in capsys.readouterr().err


def test_help_exits_0(capsys):
    assert speedup.main(["--help"]) == 0
    assert "example: graphflow bench speedup" in capsys.readouterr().out
