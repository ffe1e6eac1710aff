"""`graphflow bench sync`: PS against ring and tree allreduce, tiny settings."""

import json

from graphflow.bench import sync


def test_quick_run_has_every_method_and_replica_count(tmp_path, capsys):
    out_json, out_png = tmp_path / "sync.json", tmp_path / "sync.png"
    code = sync.main(["--quick", "--replicas", "1,2,3", "--json", str(out_json),
                      "--png", str(out_png)])
    assert code == 0
    doc = json.loads(out_json.read_text())
    got = {(p["method"], p["replicas"]) for p in doc["points"]}
    assert got == {(m, r) for m in sync.METHODS for r in (1, 2, 3)}
    assert all(p["median_s"] > 0 for p in doc["points"])
    assert out_png.stat().st_size > 10_000
    assert sync.main(["--mb", "0"]) == 2
