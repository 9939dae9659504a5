"""The analyzer registry is published whole. The app analyzes runs on several threads; filled
in place, a second thread saw only the analyzers imported so far, so a run came out of the
Compare page's first visit analyzed by `steps` alone: no other finding and no error, cached
until the server restarted."""

from __future__ import annotations

import importlib
import threading
import time

import pytest

import tracelab.analyzers as analyzers


def test_a_thread_never_sees_a_half_built_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(analyzers, "_REGISTRY", None)
    real = importlib.import_module
    importing = threading.Event()

    def slow_import(name: str, package: str | None = None):  # type: ignore[no-untyped-def]
        if name == "tracelab.analyzers.breakdown":
            importing.set()
            time.sleep(0.5)  # the first thread is inside the build, past `steps`
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", slow_import)
    first: dict[str, object] = {}
    builder = threading.Thread(target=lambda: first.update(analyzers.registry()))
    builder.start()
    assert importing.wait(10)
    seen = list(analyzers.registry())  # the second caller, while the first still imports
    builder.join(10)
    names = [m.rsplit(".", 1)[1] for m in analyzers.MODULES]
    assert seen == names
    assert list(first) == names
