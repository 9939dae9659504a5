"""Write a built report: each format to a file, a folder, or stdout."""

from __future__ import annotations

import sys
from pathlib import Path

from tracelab.errors import UsageError
from tracelab.render import renderer
from tracelab.report.compare import Report


def write_outputs(report: Report, formats: list[str], out: str | None) -> list[str]:
    """Render each format; one format goes to `out` (a file) or stdout, several to folder `out`.

    Returns the paths written ("-" for stdout).
    """
    renderers = {f: renderer("report", f) for f in dict.fromkeys(formats)}
    formats = list(renderers)
    if len(formats) > 1 and out is None:
        raise UsageError("several --format values need --out FOLDER to write them into")
    written = []
    for fmt in formats:
        text = renderers[fmt].render(report)
        if out is None or out == "-":
            sys.stdout.write(text)
            written.append("-")
            continue
        target = Path(out)
        try:
            if len(formats) > 1 or target.is_dir() or out.endswith(("/", "\\")):
                target.mkdir(parents=True, exist_ok=True)
                target = target / renderers[fmt].filename
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(
                f"{target}: cannot create the output folder ({exc.strerror}). Choose another --out."
            ) from None
        try:
            target.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise UsageError(
                f"{target}: cannot write the report ({exc.strerror}). Choose another --out."
            ) from None
        written.append(str(target))
    return written
