"""Headless Chromium as the browser tests and the app benchmark start it: Debian's `chromium`
and `chromium-driver`, with the flags that keep it quiet and offline on a CI machine."""

from __future__ import annotations

from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


def headless_flags(profile: str | Path) -> list[str]:
    """Command-line flags of a headless run with its own profile folder."""
    return [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
    ]
