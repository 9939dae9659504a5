"""tracelab: trace-driven profiling and diagnosis for distributed PyTorch training.

`import tracelab` stays light: it imports neither torch nor dash. The collector
(`tracelab.profile`) and the app are reached lazily.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__", "profile"]


def __getattr__(name: str) -> Any:
    if name == "profile":
        from tracelab.collectors import profile

        return profile
    raise AttributeError(f"module 'tracelab' has no attribute {name!r}")
