"""Spies and saboteurs on worker threads: which parameters an optimizer's fused update really
updated; a step that fails on one worker."""

from typing import Any


def updated_by(monkeypatch: Any, cls: type, method: str) -> list[str]:
    """The names `cls.method(name, ...)` reported updating (a True return), in call order,
    while the test runs (workers as threads of this process)."""
    calls: list[str] = []
    real = getattr(cls, method)

    def spy(self: Any, name: str, *args: Any, **kwargs: Any) -> bool:
        done = real(self, name, *args, **kwargs)
        calls.extend([name] if done else [])
        return done

    monkeypatch.setattr(cls, method, spy)
    return calls


def fail_step(monkeypatch: Any, worker: int = 1, step: int = 1) -> None:
    """Worker `worker` fails step `step` with a ValueError, inside `_run_step`, so that its
    peers are told as of a real failure (workers as threads of this process)."""
    from graphflow.runtime.worker import Worker

    run_step = Worker._run_step

    def failing(self: Any, feeds: Any, fetches: Any, number: int, *args: Any,
                **kwargs: Any) -> Any:
        if self.index == worker and number == step:
            raise ValueError(f"step {step} fails on worker:{worker}")
        return run_step(self, feeds, fetches, number, *args, **kwargs)

    monkeypatch.setattr(Worker, "_run_step", failing)
