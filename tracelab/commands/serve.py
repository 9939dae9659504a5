"""`tracelab serve` opens the web app on a store; `tracelab demo` ingests sample_traces/ first.

The app binds to 127.0.0.1 by default: it serves trace contents (names, args, hosts) and has no
authentication, so exposing it (`--host 0.0.0.0`) is an explicit choice.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import signal
import sys
import tempfile
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tracelab.commands._common import add_db_option
from tracelab.errors import InputError, UsageError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8050
#: Environment variable that replaces DEFAULT_PORT (for a machine where 8050 is taken).
PORT_ENV = "TRACELAB_PORT"


def default_port() -> int:
    """TRACELAB_PORT when set, else DEFAULT_PORT."""
    raw = os.environ.get(PORT_ENV, "").strip()
    if not raw:
        return DEFAULT_PORT
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise UsageError(f"{PORT_ENV} must be a port number (1-65535), not {raw!r}.")
    return int(raw)


def _app_module() -> Any:
    try:
        import dash  # noqa: F401
    except ImportError as exc:
        raise UsageError(
            "the web app needs Dash and plotly: install them with `pip install 'tracelab[app]'`."
        ) from exc
    from tracelab import app

    return app


def check_port(host: str, port: int) -> None:
    """Fail now, before any thread starts, when the server could not listen on (host, port):
    a port out of range, a host that does not resolve, or an address in use. (A failure
    inside app.run came after the warm-up thread had started, and aborted the process.)"""
    import socket

    if not 1 <= port <= 65535:
        raise UsageError(f"--port must be 1..65535, not {port}.")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise UsageError(f"--host {host!r} does not resolve ({exc}).") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(addr)
        except OSError as exc:
            busy = exc.errno == 98 or "in use" in str(exc).lower()
            raise UsageError(
                f"cannot listen on {host}:{port}: "
                + (
                    "the port is in use by another program. Stop it, or pick another --port."
                    if busy
                    else f"{exc.strerror or exc}."
                )
            ) from None


def serve(db: str, host: str, port: int, *, warm: bool = True, runs: Sequence[str] = ()) -> int:
    """Serve the store at `db` until interrupted. `runs` are analyzed first (into the app's
    cache, so that their pages open at once) and their Overview URLs printed."""
    from tracelab.store import open_store

    check_port(host, port)
    with open_store(db, read_only=True):  # fail now, with the store's own message
        pass
    app = _app_module().create_app(db, warm=warm and not runs)
    for name in runs:
        print(f"tracelab: analyzed run {name!r}: {_analyze_in_app(name)}", flush=True)
    where = f"http://{host}:{port}/"
    print(f"tracelab: serving {db} at {where} (Ctrl-C to stop)", flush=True)
    for name in runs:
        print(
            f"tracelab: overview of run {name!r}: {where}overview?"
            f"{urllib.parse.urlencode({'run': name})}",
            flush=True,
        )
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"tracelab: warning: listening on {host}: anyone who can reach it can read the "
            "traces in this store.",
            file=sys.stderr,
        )
    app.run(host=host, port=port, debug=False)
    return 0


def _analyze_in_app(name: str) -> str:
    """Analyze one run through the app's own cache; a one-line summary of what it found."""
    from tracelab.app import db as appdb

    with appdb.cursor() as cur:
        run_id, _ = appdb.resolve(cur, name)
        found = appdb.analysis(cur, run_id)
    findings = found.findings
    summary = f"{len(findings)} finding{'s' if len(findings) != 1 else ''}"
    if findings:
        summary += f", worst: {findings[0].code}: {findings[0].title}"
    if found.errors:
        summary += f" ({len(found.errors)} analyzers failed: {', '.join(sorted(found.errors))})"
    return summary


def run_serve(args: argparse.Namespace) -> int:
    return serve(
        args.db,
        args.host,
        args.port if args.port is not None else default_port(),
        warm=not args.no_warm,
    )


def sample_traces_dir() -> Path | None:
    """sample_traces/ in the working directory, else next to the package (a source checkout)."""
    here = Path.cwd() / "sample_traces"
    if here.is_dir():
        return here
    import tracelab

    repo = Path(tracelab.__file__).resolve().parents[1] / "sample_traces"
    return repo if repo.is_dir() else None


def demo_runs(folder: Path) -> list[tuple[str, Path]]:
    """(run name, path) per capture or trace folder under `folder`; `folder` itself when it is
    one capture or holds trace files directly."""
    if (folder / "manifest.json").is_file():
        return [(folder.name, folder)]
    subdirs = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    runs = [(p.name, p) for p in subdirs if any(p.rglob("*.json*"))]
    if not runs and any(folder.glob("*.json*")):
        runs = [(folder.name, folder)]
    return runs


def _remove_at_exit(folder: str) -> None:
    """Remove `folder` when the process exits, also when SIGTERM or SIGHUP stops it (their
    default action skips atexit). On those the handler removes it and ends the process at once
    with status 128 + the signal, as the shell reports a killed process: a normal interpreter
    exit would stop the app's daemon threads inside DuckDB, which aborts the process."""
    atexit.register(shutil.rmtree, folder, ignore_errors=True)

    def stop(signum: int, frame: object) -> None:
        shutil.rmtree(folder, ignore_errors=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + signum)

    for name in ("SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is None:
            continue  # not on this platform
        # Replaces the CLI's unwind-like-Ctrl-C handler too: unwinding would stop the app's
        # daemon threads inside DuckDB at interpreter exit, which aborts the process.
        try:
            signal.signal(sig, stop)
        except ValueError:  # not the main thread: atexit alone
            return


def _runs_not_from(db: str, runs: list[tuple[str, Path]]) -> set[str]:
    """The demo's run names that `db` already holds from other sources: never replaced."""
    import json

    from tracelab.store import open_store

    if not Path(db).exists():
        return set()
    with open_store(db) as con:
        stored = dict(con.execute("SELECT name, source FROM runs").fetchall())
    return {
        name for name, path in runs if name in stored and json.loads(stored[name]) != [str(path)]
    }


def run_demo(args: argparse.Namespace) -> int:
    from tracelab.ingest import ingest

    folder = Path(args.traces) if args.traces else sample_traces_dir()
    if folder is None or not folder.is_dir():
        raise InputError(
            "no sample traces found: run from the repository root (which has sample_traces/) "
            "or pass --traces DIR.",
            path=str(folder) if folder else None,
        )
    runs = demo_runs(folder)
    if not runs:
        raise InputError(
            "no captures or trace files in this folder; pass --traces DIR.", path=str(folder)
        )
    db = args.db
    if db is None:
        tmp = tempfile.mkdtemp(prefix="tracelab-demo-")
        _remove_at_exit(tmp)
        db = os.path.join(tmp, "demo.duckdb")
    theirs = _runs_not_from(db, runs)
    for name, path in runs:
        if name in theirs:
            print(
                f"tracelab demo: run {name!r} is already in {db} and was not made by demo "
                f"from {path}: left as it is (use a new --db to see the demo's).",
                flush=True,
            )
            continue
        report = ingest([str(path)], db=db, run=name, if_exists="replace", skip_bad=True)
        state = (
            "unchanged"
            if report.unchanged
            else f"{len(report.ranks)} ranks, {report.events:,} events"
        )
        print(f"tracelab demo: run {name!r} from {path}: {state}", flush=True)
    if args.no_serve:
        print(f"tracelab demo: store ready at {db}; serve it with `tracelab serve --db {db}`")
        return 0
    return serve(db, args.host, args.port if args.port is not None else default_port())


def _add_server_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"interface to listen on (default {DEFAULT_HOST}: this machine only)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=None,
        help=f"port (default {DEFAULT_PORT}, or ${PORT_ENV} when set)",
    )


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "serve",
        help="open the web app on a store",
        description="Serve the web app (runs, overview, timeline, pipeline, stragglers, "
        "memory, compare) for the runs in a store. Opens the store read-only per request, so "
        "`tracelab ingest` can write to it meanwhile.",
    )
    add_db_option(p)
    _add_server_options(p)
    p.add_argument(
        "--no-warm",
        action="store_true",
        help="do not analyze the newest runs in the background at start",
    )
    p.set_defaults(func=run_serve)

    d = subparsers.add_parser(
        "demo",
        help="ingest sample_traces/ into a store and serve it",
        description="Ingest every capture under sample_traces/ (or --traces DIR) as one run "
        "each, into a temporary store (or --db FILE), then serve the web app on it.",
    )
    d.add_argument("--traces", metavar="DIR", help="folder of captures (default: sample_traces/)")
    d.add_argument(
        "--db",
        metavar="FILE",
        default=None,
        help="store to ingest into (default: a temporary file removed at exit)",
    )
    _add_server_options(d)
    d.add_argument(
        "--no-serve", action="store_true", help="ingest only, then print the serve command"
    )
    d.set_defaults(func=run_demo)
