"""The command: --help, exit codes, errors on stderr, JSON output."""

import json
import re
import subprocess
import sys

import pytest

from graphflow.prediction import MICROBATCH_CHOICES


def run(*args):
    return subprocess.run([sys.executable, "-m", "graphflow.cli", *args], capture_output=True,
                          text=True, timeout=600)


def test_help_and_usage_errors(cli_here):
    r = run("--help")
    assert r.returncode == 0 and "train" in r.stdout
    for command in ("train", "show", "ops", "visualize", "timeline", "bench", "worker", "ps"):
        code, out, _ = cli_here(command, "--help")
        assert code == 0 and "example:" in out, (command, out[-300:])
    code, out, _ = cli_here("--version")
    assert code == 0 and out.startswith("graphflow ")
    code, _, err = cli_here("train", "--optimizer", "no-such-optimizer")
    assert code == 2 and "invalid choice" in err


def test_a_worker_process_starts_without_the_drivers_parts(cli_here):
    # (partitioners, networkx, pymetis, plots: 0.4 s of every local worker's start-up)
    driver_only = ("networkx", "pymetis", "matplotlib", "graphflow.partitioners",
                   "graphflow.viz", "graphflow.train", "graphflow.bench")
    code = ("import sys; from graphflow import cli; from graphflow.runtime.service import serve; "
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {driver_only!r} "
            f"or '.'.join(m.split('.')[:2]) in {driver_only!r}))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", (r.stdout, r.stderr[-500:])
    code, _, err = cli_here("worker", "--cpu", "0")  # (its own parser, the same errors)
    assert code == 2 and "graphflow worker: error:" in err and "--listen" in err


def test_the_driver_s_parts_and_submodules_come_on_first_use():
    code = ("import graphflow as gf; print(gf.train.PartitionedTrainer.__name__, "
            "gf.viz.__name__, gf.partition.__name__, gf.Trainer.__name__); gf.no_such_part")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.split() == ["PartitionedTrainer", "graphflow.viz", "partition", "Trainer"]
    assert "module 'graphflow' has no attribute 'no_such_part'" in r.stderr


def test_bad_counts_are_usage_errors(cli_here):
    # --steps 0 used to run the default 1500 steps, --parts -1 one process, --steps -3 crashed
    for args, expected in ((("train", "--steps", "0"), "argument --steps: must be >= 1, got 0"),
                           (("train", "--parts", "-1"), "argument --parts: must be >= 1"),
                           (("train", "--timeout", "-1"), "must be > 0 seconds and finite, got -1"),
                           (("bench", "speedup", "--batch", "x"), "'x' is not an integer")):
        code, _, err = cli_here(*args)
        assert code == 2 and expected in err, (args, err[-300:])


def test_ops_lists_the_registry():
    r = run("ops")
    assert r.returncode == 0 and "local2d" in r.stdout and "softmax_cross_entropy" in r.stdout


def test_train_json_and_error_exit_code():
    r = run("train", "lc-large", "--steps", "2", "--batch", "4", "--json", "--no-progress")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["steps"] == 2 and result["final_loss"] > 0
    r = run("train", "digits-lc", "--steps", "1", "--batch", "100000", "--no-progress")
    assert r.returncode == 1 and "error: batch_size 100000" in r.stderr


def test_speech_mlp_defaults_learn():
    """The default learning rate brings the loss below chance (ln 8192 = 9.01) in 8 steps;
    at 0.01 the wide sigmoid layers saturated and it was 13.3."""
    r = run("train", "speech-mlp", "--steps", "8", "--json", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["final_loss"] < 8.0


def test_partitioned_training_and_plan_report(cli_here):
    r = run("train", "digits-lc", "--parts", "2", "--steps", "30", "--json", "--no-progress")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["test_accuracy"] > 0.3 and result["final_loss"] > 0
    code, out, _ = cli_here("show", "lc-large", "--parts", "2", "--strategy", "spatial")
    assert code == 0 and "predicted step" in out and "plan: spatial" in out
    code, out, _ = cli_here("show", "digits-lc", "--parts", "2", "--strategy", "all")
    assert code == 0 and all(s in out for s in ("spatial", "layerwise", "mincut"))
    cut = {}  # the plan's figures are at --batch (they were at the model's default 64)
    for batch in (64, 128):
        code, out, err = cli_here("show", "speech-mlp", "--parts", "2", "--strategy",
                                  "layerwise", "--batch", batch)
        assert code == 0, err
        cut[batch] = float(re.search(r"transfers of ([\d.]+) MB", out).group(1))
    assert cut[128] == pytest.approx(2 * cut[64], rel=0.01)
    code, _, err = cli_here("train", "digits-lc", "--cluster", "/no/such/file.toml",
                            "--no-progress")
    assert code == 1 and "No such file" in err


def test_train_chooses_the_micro_batch_count():
    r = run("train", "digits-lc", "--parts", "2", "--strategy", "layerwise", "--microbatches",
            "auto", "--steps", "4", "--batch", "32", "--json", "--no-progress")
    assert r.returncode == 0, r.stderr
    chosen = re.search(r"micro-batches: (\d+) \(auto\)", r.stderr)
    assert chosen and int(chosen[1]) in (1, *MICROBATCH_CHOICES), r.stderr  # 1: no pipeline
    assert json.loads(r.stdout)["final_loss"] > 0
    r = run("train", "digits-lc", "--parts", "2", "--strategy", "spatial", "--microbatches",
            "auto", "--steps", "1", "--batch", "32", "--json", "--no-progress")
    assert r.returncode == 0 and "micro-batches: 1 (auto)" in r.stderr, r.stderr  # no pipeline
    r = run("train", "--microbatches", "some")
    assert r.returncode == 2 and "'some' is not an integer" in r.stderr


def test_data_parallel_training_and_the_ps_command():
    r = run("train", "digits-lc", "--replicas", "2", "--sync", "downpour", "--steps", "60",
            "--json", "--no-progress")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["steps"] == 60 and result["test_accuracy"] > 0.3
    r = run("ps", "--help")
    assert r.returncode == 0 and "--checkpoint-dir" in r.stdout
    r = run("ps", "--listen")
    assert r.returncode == 2 and "--listen" in r.stderr


def test_train_trace_then_timeline(tmp_path):
    trace, png = tmp_path / "run.json", tmp_path / "run.png"
    r = run("train", "lc-large", "--parts", "2", "--steps", "3", "--batch", "8",
            "--trace", str(trace), "--no-progress")
    assert r.returncode == 0, r.stderr
    r = run("timeline", str(trace), "-o", str(png), "--json")
    assert r.returncode == 0, r.stderr
    workers = json.loads(r.stdout)["workers"]
    # the first step (compiling) left out of the summary's medians
    assert len(workers) == 2 and all(w["steps"] == 2 and w["left_out"] == 1
                                     for w in workers), workers
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = run("timeline", str(tmp_path / "missing.json"), "-o", str(png))
    assert r.returncode == 1 and "missing.json" in r.stderr
