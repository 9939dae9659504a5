"""Crash hygiene of an ingest: its worker processes and its staging folder never outlive it.

A killed ingest (SIGTERM from a CI timeout, SIGKILL from the OOM killer) used to orphan its
pool workers (150 MB each, holding the parent's stdout open, so a wrapper waiting for EOF hung)
and leak its `.tracelab-ingest-*` staging folder. Now:

- each worker asks the kernel for SIGKILL when its parent dies (Linux `prctl(PR_SET_PDEATHSIG)`)
  and also watches its parent from a thread, for other systems and for the race where the
  parent died before the request;
- workers ignore SIGINT (Ctrl-C reaches the whole process group; the parent decides), and the
  parent kills them when it unwinds from any exception, SIGTERM included (tracelab.cli);
- a staging folder's owner holds an exclusive lock (`flock`) on the folder's OWNER_FILE for its
  life, which the kernel releases when it dies, however it dies; the next ingest next to the
  same store removes every staging folder whose lock it can take. (The owner's pid in the
  folder's name decided it before: two ingests in different pid namespaces, containers that
  share the store's folder, or on two hosts, took each other's live folder for an orphan and
  removed it, failing the ingest. The pid decides still for a folder without OWNER_FILE, which
  an older tracelab left.)
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from tracelab.interrupts import signals_held

#: Staging folders are `STAGING_PREFIX<owner pid>-<random>`.
STAGING_PREFIX = ".tracelab-ingest-"
#: The file in a staging folder that its owner holds locked while it lives (`flock`).
OWNER_FILE = ".owner"
#: A folder without OWNER_FILE younger than this (seconds) may be one whose owner is about to
#: lock it: left alone.
UNLOCKED_GRACE_S = 60.0
#: The locked OWNER_FILE of each staging folder this process made (closed by remove_staging).
_OWNED: dict[Path, int] = {}
#: How often a worker checks that its parent is alive, in seconds.
PARENT_POLL_S = 0.5
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="tracelab-parent-watch", daemon=True).start()


def init_worker(parent_pid: int) -> None:
    """Pool initializer: die with the parent; leave SIGINT and SIGTERM to it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent(parent_pid)


def kill_pool(pool: ProcessPoolExecutor) -> None:
    """Stop a pool at once (the parent is unwinding): cancel what has not started and kill the
    workers, instead of waiting for their current files."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in processes:
        with contextlib.suppress(Exception):
            proc.kill()
    for proc in processes:
        with contextlib.suppress(Exception):
            proc.join(timeout=5)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def _orphaned(path: Path) -> bool:
    """Whether the staging folder `path`'s owner is gone: its OWNER_FILE's lock can be taken
    (then it is held until the folder is removed), or, for a folder without one that is not new,
    the pid in its name is no live process of this pid namespace."""
    if path in _OWNED:
        return False
    try:
        fd = os.open(path / OWNER_FILE, os.O_RDWR)
    except FileNotFoundError:
        owner = path.name[len(STAGING_PREFIX) :].split("-", 1)[0]
        try:
            young = time.time() - path.stat().st_mtime < UNLOCKED_GRACE_S
        except OSError:
            return False
        return (
            not young and owner.isdigit() and int(owner) != os.getpid() and not _alive(int(owner))
        )
    except OSError:
        return False
    try:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (ImportError, OSError):
        os.close(fd)
        return False
    _OWNED[path] = fd  # (released as the folder goes: remove_staging)
    return True


def remove_orphans(parent: str | None) -> list[Path]:
    """Remove the staging folders under `parent` (the system temp dir when None) whose owner
    process is gone (_orphaned); returns what was removed."""
    folder = Path(parent) if parent is not None else Path(tempfile.gettempdir())
    removed = []
    with contextlib.suppress(OSError):
        for path in folder.glob(STAGING_PREFIX + "*"):
            if path.is_dir() and _orphaned(path):
                remove_staging(path)
                removed.append(path)
    return removed


def remove_staging(path: Path) -> None:
    """Remove a staging folder whole, even when SIGINT or SIGTERM arrives meanwhile: their
    handlers raise, which would stop the removal halfway (a SIGTERM at the end of an ingest left
    its folder). They are held until the folder is gone, then delivered."""
    with signals_held():
        try:
            shutil.rmtree(path, ignore_errors=True)
        except BaseException:  # a signal that came before the mask took effect
            shutil.rmtree(path, ignore_errors=True)
            raise
        finally:
            fd = _OWNED.pop(path, None)
            if fd is not None:  # the lock goes with the folder, never before it
                with contextlib.suppress(OSError):
                    os.close(fd)


def make_staging(parent: str | None) -> Path:
    """A fresh staging folder under `parent`, named after this process and owned by it (its
    OWNER_FILE locked until remove_staging); orphans removed first."""
    remove_orphans(parent)
    path = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-", dir=parent))
    # Locked before it takes its name: another ingest's sweep finds no OWNER_FILE (a new
    # folder: left alone) or a locked one, never one it could lock in between.
    unnamed = path / f"{OWNER_FILE}.new"
    fd = os.open(unnamed, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, f"{socket.gethostname()} {os.getpid()}\n".encode())
        os.rename(unnamed, path / OWNER_FILE)
    except ImportError:  # no flock on this system: the pid in the name decides (_orphaned)
        os.close(fd)
        unnamed.unlink()
        return path
    except BaseException:
        os.close(fd)
        raise
    _OWNED[path] = fd
    return path
