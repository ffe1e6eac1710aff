"""benchmarks/machine.py end to end, briefly: every core measured alone and with all busy."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "machine.py"


def test_machine_probe_measures_every_core(tmp_path):
    out = tmp_path / "machine.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--seconds", "0.3", "--json", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [r["cpu"] for r in rows] == sorted(os.sched_getaffinity(0))
    for r in rows:
        assert r["alone_ms"] > 0 and r["together_ms"] > 0 and r["alone_gbs"] > 0
        assert r["compute_ratio"] == pytest.approx(r["together_ms"] / r["alone_ms"])
    assert "together / alone" in done.stdout
