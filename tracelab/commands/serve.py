"""`tracelab serve` opens the web app on a store; `tracelab demo` ingests sample_traces/ first.

The app binds to 127.0.0.1 by default: it serves trace contents (names, args, hosts) and has no
authentication, so exposing it (`--host 0.0.0.0`) is an explicit choice.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from tracelab.commands._common import add_db_option
from tracelab.errors import InputError, UsageError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8050


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
                + ("the port is in use by another program. Stop it, or pick another --port."
                   if busy else f"{exc.strerror or exc}.")) from None


def serve(db: str, host: str, port: int, *, warm: bool = True) -> int:
    """Serve the store at `db` until interrupted."""
    from tracelab.store import open_store

    check_port(host, port)
    with open_store(db, read_only=True):  # fail now, with the store's own message
        pass
    app = _app_module().create_app(db, warm=warm)
    where = f"http://{host}:{port}/"
    print(f"tracelab: serving {db} at {where} (Ctrl-C to stop)", flush=True)
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(f"tracelab: warning: listening on {host}: anyone who can reach it can read the "
              "traces in this store.", file=sys.stderr)
    app.run(host=host, port=port, debug=False)
    return 0


def run_serve(args: argparse.Namespace) -> int:
    return serve(args.db, args.host, args.port, warm=not args.no_warm)


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


def _runs_not_from(db: str, runs: list[tuple[str, Path]]) -> set[str]:
    """The demo's run names that `db` already holds from other sources: never replaced."""
    import json

    from tracelab.store import open_store

    if not Path(db).exists():
        return set()
    with open_store(db) as con:
        stored = dict(con.execute("SELECT name, source FROM runs").fetchall())
    return {name for name, path in runs
            if name in stored and json.loads(stored[name]) != [str(path)]}


def run_demo(args: argparse.Namespace) -> int:
    from tracelab.ingest import ingest

    folder = Path(args.traces) if args.traces else sample_traces_dir()
    if folder is None or not folder.is_dir():
        raise InputError(
            "no sample traces found: run from the repository root (which has sample_traces/) "
            "or pass --traces DIR.", path=str(folder) if folder else None)
    runs = demo_runs(folder)
    if not runs:
        raise InputError("no captures or trace files in this folder; pass --traces DIR.",
                         path=str(folder))
    db = args.db
    if db is None:
        tmp = tempfile.mkdtemp(prefix="tracelab-demo-")
        atexit.register(shutil.rmtree, tmp, ignore_errors=True)
        db = os.path.join(tmp, "demo.duckdb")
    theirs = _runs_not_from(db, runs)
    for name, path in runs:
        if name in theirs:
            print(f"tracelab demo: run {name!r} is already in {db} and was not made by demo "
                  f"from {path}: left as it is (use a new --db to see the demo's).", flush=True)
            continue
        report = ingest([str(path)], db=db, run=name, if_exists="replace", skip_bad=True)
        state = "unchanged" if report.unchanged else f"{len(report.ranks)} ranks, {report.events:,} events"
        print(f"tracelab demo: run {name!r} from {path}: {state}", flush=True)
    if args.no_serve:
        print(f"tracelab demo: store ready at {db}; serve it with `tracelab serve --db {db}`")
        return 0
    return serve(db, args.host, args.port)


def _add_server_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default=DEFAULT_HOST,
                   help=f"interface to listen on (default {DEFAULT_HOST}: this machine only)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "serve", help="open the web app on a store",
        description="Serve the web app (runs, overview, timeline, pipeline, stragglers, "
        "memory, compare) for the runs in a store. Opens the store read-only per request, so "
        "`tracelab ingest` can write to it meanwhile.",
    )
    add_db_option(p)
    _add_server_options(p)
    p.add_argument("--no-warm", action="store_true",
                   help="do not analyze the newest runs in the background at start")
    p.set_defaults(func=run_serve)

    d = subparsers.add_parser(
        "demo", help="ingest sample_traces/ into a store and serve it",
        description="Ingest every capture under sample_traces/ (or --traces DIR) as one run "
        "each, into a temporary store (or --db FILE), then serve the web app on it.",
    )
    d.add_argument("--traces", metavar="DIR", help="folder of captures (default: sample_traces/)")
    d.add_argument("--db", metavar="FILE", default=None,
                   help="store to ingest into (default: a temporary file removed at exit)")
    _add_server_options(d)
    d.add_argument("--no-serve", action="store_true", help="ingest only, then print the serve command")
    d.set_defaults(func=run_demo)
