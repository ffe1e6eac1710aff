"""benchmarks/transport.py end to end, briefly, and the interleaving of common.measure."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def test_transport_benchmark_compares_ours_with_bare_on_both_transports(tmp_path):
    out = tmp_path / "transport.json"
    done = subprocess.run([sys.executable, str(BENCH / "transport.py"), "--messages", "4",
                           "--size-mb", "0.25", "--repeats", "3", "--warmup", "0",
                           "--json", str(out)], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert doc["repeats"] == 3
    rows = {r["transport"]: r for r in doc["rows"]}
    assert set(rows) == {"ipc", "ipc-socket", "tcp"}
    for r in rows.values():
        assert len(r["times"]["ours"]["times_s"]) == len(r["times"]["bare"]["times_s"]) == 3
        assert r["ratio"] == pytest.approx(r["ours_gbs"] / r["bare_gbs"])
        assert r["verdict"] == ("PASS" if r["ratio"] >= 0.8 else "FAIL")
        assert r["ours_cpu_us"] > 0 and r["bare_cpu_us"] > 0


def test_measure_alternates_the_order_of_its_rounds(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import common

    calls = []
    times = common.measure({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                           repeats=4, warmup=1)
    assert calls == ["a", "b"] + ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert [len(times[k]["times_s"]) for k in "ab"] == [4, 4]
