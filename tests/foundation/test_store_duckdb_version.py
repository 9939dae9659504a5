"""The store records the DuckDB storage version beside its schema version, and a store from an
incompatible DuckDB is a clear error naming both versions."""

from __future__ import annotations

import struct
from pathlib import Path

import duckdb
import pytest

from tracelab.errors import StoreError
from tracelab.ingest import ingest
from tracelab.store import duckdb_storage_version, open_store

from .kineto import run_set

#: DuckDB's main file header: an 8-byte checksum, then the checksummed rest of a 4 KiB block.
_HEADER_BLOCK = 4096
_MUL = 0xBF58476D1CE4E5B9


def _header_checksum(block: bytes) -> int:
    """DuckDB's block checksum (5381 xor each 8-byte word times a constant)."""
    result = 5381
    for (word,) in struct.iter_unpack("<Q", block[8:_HEADER_BLOCK]):
        result ^= (word * _MUL) & 0xFFFF_FFFF_FFFF_FFFF
    return result


def _rewrite_header(path: Path, *, storage_number: int, writer: bytes) -> None:
    """Give a DuckDB file another storage version number and writer release, as a file from
    a newer DuckDB has; the checksum is recomputed so that only the version is wrong."""
    data = bytearray(path.read_bytes())
    assert data[8:12] == b"DUCK"
    assert struct.unpack_from("<Q", data, 0)[0] == _header_checksum(bytes(data))
    struct.pack_into("<Q", data, 12, storage_number)
    data[52:84] = writer.ljust(32, b"\0")
    struct.pack_into("<Q", data, 0, _header_checksum(bytes(data)))
    path.write_bytes(bytes(data))


def test_a_new_store_records_the_duckdb_storage_version(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    ingest([run_set(tmp_path / "t")], db=db, progress=False)
    with open_store(db) as con:
        meta = dict(con.execute("SELECT key, value FROM tracelab_meta").fetchall())
        here = duckdb_storage_version(con)
    assert here is not None and here.startswith("v")
    assert meta["duckdb_storage_version"] == here
    assert meta["duckdb_version"] == duckdb.__version__
    assert meta["schema_version"]


def test_a_store_from_another_storage_version_names_both(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    ingest([run_set(tmp_path / "t")], db=db, progress=False)
    con = duckdb.connect(str(db))
    here = duckdb_storage_version(con)
    con.execute("UPDATE tracelab_meta SET value = 'v9.9.0+' WHERE key = 'duckdb_storage_version'")
    con.execute("UPDATE tracelab_meta SET value = '9.9.0' WHERE key = 'duckdb_version'")
    con.close()
    for read_only in (True, False):
        with pytest.raises(StoreError) as err:
            with open_store(db, read_only=read_only):
                pass
        text = str(err.value)
        assert "DuckDB 9.9.0 (storage version v9.9.0+)" in text
        assert f"DuckDB {duckdb.__version__} writes storage version {here}" in text
        assert "--db NEW.duckdb" in text


def test_a_store_from_an_older_tracelab_without_the_record_still_opens(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    ingest([run_set(tmp_path / "t")], db=db, progress=False)
    con = duckdb.connect(str(db))
    con.execute("DELETE FROM tracelab_meta WHERE key LIKE 'duckdb_%'")
    con.close()
    with open_store(db) as con:
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 1


def test_a_file_duckdb_cannot_read_names_both_versions(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    ingest([run_set(tmp_path / "t")], db=db, progress=False)
    _rewrite_header(db, storage_number=1000, writer=b"v2.9.0")
    for read_only in (True, False):
        with pytest.raises(StoreError) as err:
            with open_store(db, read_only=read_only):
                pass
        text = str(err.value)
        assert "written by DuckDB v2.9.0 (storage version 1000)" in text
        assert f"the installed DuckDB {duckdb.__version__} cannot read" in text
        assert "pip install 'duckdb==2.9.0'" in text
