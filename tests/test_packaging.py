"""`pip install .` (not editable) installs every subpackage, graphflow.ops and
graphflow.partitioners among them."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_non_editable_install_imports_subpackages(tmp_path):
    target, source = tmp_path / "site", tmp_path / "src"
    # a copy without build/ leftovers: setuptools would reuse stale files from there
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        "build", ".git", "*.egg-info", "__pycache__", "benchmarks", ".pytest_cache"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--target", str(target), str(source)],
                   check=True, capture_output=True, timeout=300)
    assert not (target / "ops").exists(), "ops must not install as a top-level module"
    # (an import below may still find a package through the editable install's finder)
    packages = {d.name for d in (ROOT / "graphflow").iterdir() if (d / "__init__.py").exists()}
    missing = sorted(p for p in packages | {"ops", "partitioners"}
                     if not (target / "graphflow" / p / "__init__.py").exists())
    assert not missing, f"not installed (add them to pyproject.toml's packages): {missing}"
    code = ("import graphflow, graphflow.ops, graphflow.partitioners, graphflow.runtime, "
            "graphflow.transport, graphflow.bench, graphflow.ps, graphflow.replicas; "
            "print(graphflow.__file__); print(len(graphflow.ops.REGISTRY))")
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, check=True,
                         capture_output=True, text=True, timeout=300).stdout.split()
    assert out[0].startswith(str(target))
    assert int(out[1]) > 40
