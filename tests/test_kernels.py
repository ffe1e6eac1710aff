"""Every Numba kernel is compiled with nogil (worker threads run kernels side by side) and
cache (a fresh process reuses compiled code)."""

import importlib
import pkgutil

from numba.core.registry import CPUDispatcher

import graphflow.ops


def _dispatchers():
    for mod in pkgutil.iter_modules(graphflow.ops.__path__):
        module = importlib.import_module(f"graphflow.ops.{mod.name}")
        for name, obj in vars(module).items():
            if isinstance(obj, CPUDispatcher) and obj.__module__ == module.__name__:
                yield f"{mod.name}.{name}", obj


def test_every_kernel_is_nogil_and_cached():
    found = dict(_dispatchers())
    assert len(found) > 20
    bad = [name for name, d in found.items()
           if not d.targetoptions.get("nogil") or type(d._cache).__name__ != "FunctionCache"]
    assert not bad, f"kernels without nogil=True or cache=True: {bad}"
