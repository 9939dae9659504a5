"""tracelab.ingest.gunzip against the standard library's gzip, with ISA-L and with plain zlib."""

from __future__ import annotations

import gzip
import platform
import zlib

import pytest

from tracelab.ingest import gunzip

TEXT = b'{"traceEvents": [' + b",".join(b'{"ph": "X", "ts": %d}' % i for i in range(20_000)) + b"]}"


@pytest.fixture(params=["installed", "zlib"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "zlib":
        monkeypatch.setattr(gunzip, "_inflate", zlib)
    return request.param


@pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64", "aarch64", "arm64"),
    reason="isal is a dependency only where PyPI has wheels for it",
)
def test_the_fast_backend_is_installed_here() -> None:
    """isal is a dependency on x86-64 and ARM64: without it, gzipped traces inflate 3x slower."""
    assert gunzip.BACKEND == "isal"


@pytest.mark.parametrize("level", [1, 6, 9])
def test_one_member(backend: str, level: int) -> None:
    data = gzip.compress(TEXT, level)
    assert gunzip.is_gzip(data)
    assert gunzip.gunzip(data) == TEXT


def test_every_member_is_joined_as_gzip_does(backend: str) -> None:
    data = gzip.compress(TEXT[:1000]) + gzip.compress(b"") + gzip.compress(TEXT[1000:])
    assert gunzip.gunzip(data) == gzip.decompress(data) == TEXT


@pytest.mark.parametrize("cut", [10, 100, -9, -1])
def test_a_truncated_stream_is_an_error(backend: str, cut: int) -> None:
    data = gzip.compress(TEXT)
    with pytest.raises(gunzip.GzipError):
        gunzip.gunzip(data[:cut])


@pytest.mark.parametrize("where", ["deflate", "crc", "size"])
def test_damage_is_an_error(backend: str, where: str) -> None:
    data = bytearray(gzip.compress(TEXT))
    at = {"deflate": len(data) // 2, "crc": len(data) - 6, "size": len(data) - 2}[where]
    data[at] ^= 0x55
    with pytest.raises(gunzip.GzipError):
        gunzip.gunzip(bytes(data))


def test_data_after_the_last_member_is_an_error(backend: str) -> None:
    with pytest.raises(gunzip.GzipError, match="after the last gzip member"):
        gunzip.gunzip(gzip.compress(TEXT) + b"garbage")


def test_plain_json_is_not_gzip() -> None:
    assert not gunzip.is_gzip(TEXT)
    assert not gunzip.is_gzip(b"")
