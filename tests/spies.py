"""A spy on an optimizer's fused update: which parameters it really updated."""

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
