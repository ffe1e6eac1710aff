"""`graphflow bench convergence` end to end with tiny settings (thread replicas)."""

import json

from graphflow.bench import convergence


def test_quick_run_covers_every_mode_with_a_curve(tmp_path, capsys):
    out_json, out_png = tmp_path / "conv.json", tmp_path / "conv.png"
    code = convergence.main(["--quick", "--placement", "threads", "--no-progress",
                             "--json", str(out_json), "--png", str(out_png)])
    assert code == 0, capsys.readouterr()
    doc = json.loads(out_json.read_text())
    assert set(doc["runs"]) == set(convergence.MODES)
    for mode, run in doc["runs"].items():
        assert "error" not in run, (mode, run)
        times = [t for t, _, _ in run["curve"]]
        assert times == sorted(times) and len(times) >= 1
        assert all(0.0 <= acc <= 1.0 for _, _, acc in run["curve"])
        assert run["best"] > 0.15, (mode, run["best"])  # it learned something (10 classes)
    assert out_png.stat().st_size > 10_000
    assert "Downpour + Adagrad" in capsys.readouterr().out


def test_bad_arguments_exit_2():
    assert convergence.main(["--modes", "hogwild"]) == 2
    assert convergence.main(["--replicas", "0"]) == 2
