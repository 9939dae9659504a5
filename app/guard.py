"""Turning errors into friendly pages: no view ever shows a traceback to the browser.

Bad URL parameters, unknown runs, a busy or missing store and analyzer failures become a page
that says what happened and what to do; anything unexpected is logged with its traceback on the
server and shown as a short message.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from tracelab.app.components import error_page
from tracelab.app.state import BadParam
from tracelab.errors import RunNotFoundError, StoreError, StoreLockedError, TracelabError

log = logging.getLogger("tracelab.app")


def describe(exc: BaseException) -> tuple[str, str, str | None]:
    """(title, message, hint) for an error shown to the user."""
    if isinstance(exc, BadParam):
        return (
            "This link has a bad parameter",
            str(exc),
            "Fix the address, or open the view from the runs list.",
        )
    if isinstance(exc, RunNotFoundError):
        return ("Unknown run", str(exc), "Pick a run from the runs list.")
    if isinstance(exc, StoreLockedError):
        return ("The store is busy", str(exc), "An ingest is writing to it; reload in a moment.")
    if isinstance(exc, StoreError):
        return ("Cannot open the store", str(exc), None)
    if isinstance(exc, TracelabError):
        return ("Cannot show this view", str(exc), None)
    return (
        "Something went wrong",
        f"{type(exc).__name__} while building this view. The server log has the details.",
        "Reload the page; if it keeps failing, report the log.",
    )


def safe_layout(active: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wrap a page's `layout(**kwargs)` so that any error renders as a friendly page."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(**kwargs: Any) -> Any:
            try:
                return fn(**kwargs)
            except Exception as exc:
                if not isinstance(exc, (TracelabError, BadParam)):
                    log.exception("error building %s with %r", active, kwargs)
                title, message, hint = describe(exc)
                run = kwargs.get("run") if isinstance(exc, (BadParam, StoreError)) else None
                return error_page(
                    title,
                    message,
                    hint=hint,
                    run=run if isinstance(run, str) and len(run) < 200 else None,
                    active=active,
                )

        return wrapper

    return deco
