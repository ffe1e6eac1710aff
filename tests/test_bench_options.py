"""`graphflow bench SUITE`'s options: bad values are usage errors (exit 2) before any run,
--quick fills only the options not given and writes no results file unless asked."""

import argparse
import os

import pytest

from graphflow.argtypes import csv_counts, csv_counts_of, output_file
from graphflow.bench import convergence, ps, speedup, sync

SUITES = {"speedup": speedup, "convergence": convergence, "ps": ps, "sync": sync}
OUTPUTS = [(s, o) for s in SUITES for o in ("--json", "--png", "--trace")
           if (s, o) != ("ps", "--png")]


def _usage_error(main, argv, capsys) -> str:
    assert main(argv) == 2
    return capsys.readouterr().err


def test_output_file_rejects_directories_and_non_directory_parents(tmp_path):
    assert output_file(str(tmp_path / "new" / "deeper" / "a.json")) == \
        tmp_path / "new" / "deeper" / "a.json"  # (writers make missing parents)
    (tmp_path / "plain").write_text("")
    for bad, why in [(str(tmp_path), "is a directory"), (f"{tmp_path}/sub/", "is a directory"),
                     ("", "empty"), (str(tmp_path / "plain" / "a.json"), "is not a directory")]:
        with pytest.raises(argparse.ArgumentTypeError, match=why):
            output_file(bad)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_output_file_rejects_an_unwritable_directory(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(argparse.ArgumentTypeError, match="not writable"):
        output_file(str(locked / "a.json"))


@pytest.mark.parametrize(("suite", "option"), OUTPUTS)
def test_an_output_that_is_a_directory_is_a_usage_error(suite, option, tmp_path, capsys):
    err = _usage_error(SUITES[suite].main, ["--quick", option, str(tmp_path)], capsys)
    assert f"argument {option}: '{tmp_path}' is a directory" in err


def test_count_lists_name_their_noun_and_reject_empty_items(capsys):
    assert csv_counts("2,4") == [1, 2, 4]
    assert csv_counts_of("shard", include_one=False)("4,2,2") == [2, 4]
    with pytest.raises(argparse.ArgumentTypeError, match="worker counts must be >= 1"):
        csv_counts("0")
    err = _usage_error(sync.main, ["--replicas", "0"], capsys)
    assert "replica counts must be >= 1" in err and "worker" not in err
    assert "empty item" in _usage_error(sync.main, ["--replicas", "1,,2"], capsys)
    assert "shard counts" in _usage_error(ps.main, ["--shards", "0,2"], capsys)


def test_sync_needs_one_float32_element_of_gradient(capsys):
    err = _usage_error(sync.main, ["--mb", "0.000001"], capsys)
    assert "argument --mb" in err and "the least is 3.815e-06 MB" in err
    assert sync.arguments(["--mb", "3.815e-06"]).mb == 3.815e-06
    for bad in ("0", "-1", "nan", "inf"):
        assert "argument --mb" in _usage_error(sync.main, ["--mb", bad], capsys)


@pytest.mark.parametrize("bad", [["--lr", "-1"], ["--sgd-lr", "nan"], ["--eval-every", "0"],
                                 ["--batch", "600"], ["--modes", "sgd", "--batch", "5000"]])
def test_convergence_rejects_bad_numbers_before_training(bad, capsys):
    err = _usage_error(convergence.main, bad, capsys)
    assert f"argument {bad[-2]}" in err


def test_quick_keeps_the_options_given():
    args = sync.arguments(["--quick", "--mb", "1", "--repeats", "5"])
    assert (args.mb, args.repeats) == (1.0, 5)
    assert (sync.arguments(["--quick"]).mb, sync.arguments([]).repeats) == (0.25, 15)
    args = ps.arguments(["--quick", "--shards", "3", "--pushes", "7", "--warmup", "0"])
    assert (args.shards, args.pushes, args.rounds, args.warmup) == ([3], 7, 2, 0)
    args = convergence.arguments(["--quick", "--steps", "9", "--sgd-lr", "0.05"])
    assert (args.steps, args.sgd_lr, args.eval_every) == (9, 0.05, 0.2)
    assert convergence.arguments([]).steps == 1500


def test_only_full_runs_default_to_the_results_directory():
    for suite in (sync, convergence, ps):
        quick = suite.arguments(["--quick"])
        assert quick.json is None and getattr(quick, "png", None) is None, suite.__name__
    assert str(sync.arguments([]).json) == "benchmarks/results/sync.json"
    assert str(convergence.arguments([]).png) == "benchmarks/results/convergence.png"
    assert str(ps.arguments([]).json) == "benchmarks/results/ps.json"
    assert "--quick: none unless" in speedup.parser().format_help()


def test_a_quick_run_writes_no_file_unless_asked(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert sync.main(["--quick", "--replicas", "1", "--repeats", "1", "--mb", "0.01"]) == 0
    assert list(tmp_path.iterdir()) == []
    assert "no JSON or PNG written" in capsys.readouterr().out


def test_a_quick_speedup_ceiling_says_it_is_noise():
    ceiling = {"ratio": 2.7, "alone_s": [0.001], "together_s": [0.0008]}
    assert "noise, not a measure" in speedup._ceiling_line("digits-lc", ceiling, "threads",
                                                           quick=True)
    assert "noise" not in speedup._ceiling_line("digits-lc", ceiling, "threads")


def test_a_convergence_plot_without_curves_warns_nothing(tmp_path, recwarn):
    doc = {"runs": {"sgd": {"error": "ValueError: ..."}}, "machine": {"cpu_count": 2}}
    assert convergence.plot(doc, tmp_path / "c.png") is None
    assert not [w for w in recwarn if "artists" in str(w.message)]
