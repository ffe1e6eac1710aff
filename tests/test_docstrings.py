"""Every docstring example in graphflow (its partitioners and ops included) runs and prints
what it shows: an example that went stale is a defect like any other."""

import doctest
import importlib
import pkgutil

import pytest

import graphflow
import graphflow.ops
import graphflow.partitioners

# ops/ and partitioners/ sit beside graphflow/ in the source tree: walked on their own
PACKAGES = (graphflow, graphflow.ops, graphflow.partitioners)
MODULES = sorted({info.name for p in PACKAGES
                  for info in pkgutil.walk_packages(p.__path__, f"{p.__name__}.")
                  if not info.name.endswith("__main__")} | {p.__name__ for p in PACKAGES})


def test_the_walk_finds_the_packages_installed_under_graphflow():
    assert {"graphflow.partitioners.recompute", "graphflow.ops.matmul",
            "graphflow.viz.groups"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name))
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name}"
