"""Decompress a whole gzip file in memory, as fast as this machine allows.

Traces come as `.json.gz` (the collector writes them so, and so does torch.profiler's
`export_chrome_trace` to a `.gz` name). `gzip.decompress` inflates, then checks the CRC in a
second pass; here each member is inflated with its CRC and size checked in C, in one pass, by
ISA-L (the `isal` package) where it is installed and by zlib otherwise. On the 54 MB
`df_index_resolver` trace: 0.040 s with ISA-L, 0.093 s with zlib, 0.123 s with gzip.decompress.

Like gzip.decompress, every member of a multi-member file is decompressed and joined; anything
after the last member that is not another member is an error.
"""

from __future__ import annotations

import mmap
import types
import zlib

_inflate: types.ModuleType
try:
    from isal import isal_zlib as _inflate
except ImportError:  # no wheel for this platform: the standard library's zlib
    _inflate = zlib

#: First two bytes of every gzip member.
GZIP_MAGIC = b"\x1f\x8b"
#: What a damaged stream raises, from either implementation.
ERRORS: tuple[type[Exception], ...] = tuple({zlib.error, getattr(_inflate, "error", zlib.error)})
#: Name of the implementation in use, for benchmarks and bug reports.
BACKEND = "isal" if _inflate is not zlib else "zlib"


class GzipError(ValueError):
    """The data is not a complete, intact gzip stream."""


Data = bytes | mmap.mmap


def is_gzip(data: Data) -> bool:
    return data[:2] == GZIP_MAGIC


def gunzip(data: Data) -> bytes:
    """All members of the gzip stream `data`, decompressed and joined."""
    parts: list[bytes] = []
    rest: Data = data
    while True:
        inflater = _inflate.decompressobj(16 + zlib.MAX_WBITS)
        try:
            parts.append(inflater.decompress(rest))
        except ERRORS as exc:
            raise GzipError(str(exc)) from exc
        if not inflater.eof:
            raise GzipError("the data ends in the middle of a gzip member")
        rest = inflater.unused_data
        if not rest:
            return parts[0] if len(parts) == 1 else b"".join(parts)
        if not is_gzip(rest):
            raise GzipError(f"{len(rest)} bytes after the last gzip member are not gzip data")
