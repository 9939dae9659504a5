"""The C scanner (tracelab._kineto) against the reference decoder (msgspec).

On every shared real trace both must give identical columns; on damaged or odd input the scanner
must either give what the reference gives or decline (and then the reference decides), never
accept what the reference rejects, and never crash.
"""

from __future__ import annotations

import gzip
import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from tracelab.errors import TraceFormatError
from tracelab.ingest import decode as dec

pytestmark = pytest.mark.skipif(
    dec._kineto is None and shutil.which("cc") is None,
    reason="no C compiler here: the extension could not be built",
)


def test_the_extension_was_built() -> None:
    """The extension is optional for installs without a compiler; with one, a failed build
    would silently cost the fast path, so it is an error here."""
    assert dec._kineto is not None, "tracelab._kineto is missing: reinstall (pip install -e .)"


ARRAYS = ("ph", "pid", "tid", "ts_ns", "dur_ns", "ts_missing", "dur_missing")
STRINGS = ("name", "cat", "args")


def shared_traces(root: Path) -> list[Path]:
    files = sorted(
        p
        for p in root.rglob("*")
        if p.is_file() and (p.name.endswith(".json") or p.name.endswith(".json.gz"))
    )
    assert len(files) >= 15, files
    return files


def read(path: Path) -> bytes:
    raw = path.read_bytes()
    return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw


def assert_same(fast: dec.DecodedTrace, ref: dec.DecodedTrace) -> None:
    assert fast.n == ref.n
    for f in ARRAYS:
        np.testing.assert_array_equal(getattr(fast, f), getattr(ref, f), err_msg=f)
    for f in STRINGS:
        assert getattr(fast, f).equals(getattr(ref, f)), f
    assert fast.odd == ref.odd
    assert fast.top == ref.top
    assert fast.ids.keys() == ref.ids.keys()
    for k in ref.ids:
        np.testing.assert_array_equal(fast.ids[k], ref.ids[k], err_msg=k)


def decode_both(buf: bytes) -> tuple[dec.DecodedTrace | None, dec.DecodedTrace | Exception]:
    scanned = dec._kineto.scan(buf)
    fast = dec._from_scan(scanned, buf) if scanned is not None else None
    try:
        ref: dec.DecodedTrace | Exception = dec.decode_reference(buf, Path("t.json"))
    except TraceFormatError as exc:
        ref = exc
    return fast, ref


def test_identical_columns_on_every_shared_trace(hta_traces: Path) -> None:
    for path in shared_traces(hta_traces):
        buf = read(path)
        fast, ref = decode_both(buf)
        if path.name == "memory_timeline.raw.gz":
            continue  # not a Kineto trace (both reject or both accept, checked below)
        assert fast is not None, f"fast path declined {path}"
        assert not isinstance(ref, Exception), path
        assert_same(fast, ref)


def event(**kw: object) -> dict[str, object]:
    base: dict[str, object] = {
        "ph": "X",
        "cat": "cpu_op",
        "name": "aten::mm",
        "pid": 1,
        "tid": 2,
        "ts": 10.5,
        "dur": 3,
    }
    base.update(kw)
    return base


ODD_BUT_VALID = [
    # escapes and non-ASCII in names, keys and args; surrogate pairs
    {
        "traceEvents": [
            event(name='a"b\\c\u00e9\U0001f600\n\t/', args={"k\u00e9y": 'v\\"', "correlation": 7})
        ]
    },
    {
        "traceEvents": [
            json.loads('{"ph": "X", "na\\u006de": "x\\ud83d\\ude00", "ts": 1, "dur": 2}')
        ]
    },
    # pid/tid as text, floats, null, absent; ts/dur null or absent; cat null
    {
        "traceEvents": [
            event(pid="Spans", tid=1.5),
            event(pid=None, tid=True),
            event(cat=None),
            {"ph": "X", "name": "n", "ts": 1},
            {"ph": "M", "name": "process_name", "pid": 3, "args": {"name": "r"}},
        ]
    },
    # ids of every kind: negative, huge, float, text, duplicated keys
    {
        "traceEvents": [
            event(
                args={
                    "correlation": -1,
                    "External id": 2**70,
                    "stream": 7.0,
                    "Bytes": -4096,
                    "Device Id": "1",
                    "Total Allocated": 0,
                }
            )
        ]
    },
    # fractional µs past the ns: round half to even, negative times
    {
        "traceEvents": [
            event(ts=1.0005, dur=0.0015),
            event(ts=-2.25, dur=0.0025),
            event(ts=1669783687464181.123, dur=1.9999),
        ]
    },
    # args that are not objects, nested deeply, empty objects/arrays; other top-level keys
    {
        "traceEvents": [
            event(args=[1, {"a": [[], {}]}]),
            event(args="s"),
            event(args=None),
            event(args={"a": {"b": {"c": [1, 2, {"correlation": 9}]}}}),
        ],
        "distributedInfo": {"rank": 3},
        "baseTimeNanoseconds": 1000,
        "x": [None, True, False],
    },
    {"traceEvents": []},
]


@pytest.mark.parametrize("doc", ODD_BUT_VALID, ids=range(len(ODD_BUT_VALID)))
@pytest.mark.parametrize("indent", [None, 2])
def test_odd_but_valid_documents(doc: dict[str, object], indent: int | None) -> None:
    buf = json.dumps(doc, indent=indent, ensure_ascii=indent is None).encode()
    fast, ref = decode_both(buf)
    assert not isinstance(ref, Exception)
    if fast is not None:
        assert_same(fast, ref)


DECLINED = [
    b'{"traceEvents": [{"ph": "X", "ts": 1e3, "dur": 1}]}',  # exponent: reference decides
    b'{"traceEvents": [], "traceEvents": []}',  # duplicate member
    b'{"traceEvents": [{"ph": "X", "ts": 99999999999999999999, "dur": 1}]}',  # past int64 ns
]


@pytest.mark.parametrize("buf", DECLINED)
def test_declines_what_it_does_not_handle(buf: bytes) -> None:
    assert dec._kineto.scan(buf) is None


INVALID = [
    b"",
    b"{",
    b"[]",
    b'{"traceEvents": [}',
    b'{"traceEvents": [{"ph": "X"}]',
    b"{} x",
    b'{"traceEvents": [{"ph": "X", "ts": NaN}]}',
    b'{"traceEvents": [{"ts": 01}]}',
    b'{"traceEvents": [{"ts": 1.}]}',
    b'{"traceEvents": [{"ts": -}]}',
    b'{"a": tru}',
    b'{"traceEvents": [{"name": "\x01"}]}',
    b'{"traceEvents": [{"name": "\\x"}]}',
    b'{"traceEvents": [{"name": "\\ud800"}]}',
    b'{"traceEvents": [{"name": "\xff"}]}',
    b'{"traceEvents": [{"name": "\xc0\xaf"}]}',
    b'{"traceEvents": [1]}',
    b'{"traceEvents": [{"name": 3}]}',
    b'{"traceEvents": [{"ts": "1"}]}',
    b'{"traceEvents": [{"ph": null}]}',
    b'{"traceEvents": {}}',
    b'{"schemaVersion": 1}',
    b'{"traceEvents": [{"args": ' + b"[" * 600 + b"]" * 600 + b"}]}",
]


@pytest.mark.parametrize("buf", INVALID)
def test_never_accepts_what_the_reference_rejects(buf: bytes) -> None:
    assert dec._kineto.scan(buf) is None


#: What the scanner's string and UTF-8 loops stop at: a quote (escaped), a backslash escape,
#: a raw control character (invalid), a multi-byte character, a bad UTF-8 byte (invalid).
STOPS = ('\\"', "\\n", "\x01", "\u00e9", "\udcff")


@pytest.mark.parametrize("stop", STOPS, ids=["quote", "escape", "control", "utf8", "bad-utf8"])
def test_every_offset_of_a_stop_byte(stop: str) -> None:
    """The scanner reads strings 16 bytes and UTF-8 64 bytes at a time, then byte by byte: a
    stop byte at each offset of those blocks, and past them, decodes as the reference does."""
    for offset in range(0, 140):
        name = "n" * offset + stop + "t" * (offset % 23)
        text = '{"traceEvents": [{"ph": "X", "name": "%s", "ts": 1, "dur": 2}]}' % name
        buf = text.encode("utf-8", "surrogateescape" if stop == "\udcff" else "strict")
        fast, ref = decode_both(buf)
        if isinstance(ref, Exception):
            assert fast is None, (offset, ref)
        else:
            assert fast is not None, offset
            assert_same(fast, ref)
            assert fast.name[0].as_py() == json.loads(text)["traceEvents"][0]["name"]


def test_damaged_traces_agree_with_the_reference(hta_traces: Path) -> None:
    """Truncations and byte flips of a real trace: the scanner accepts exactly what the reference
    accepts (then with identical columns), or declines."""
    (path,) = (hta_traces / "critical_path" / "simple_add").glob("*.json.gz")
    buf = read(path)[:200_000]
    buf = buf[: buf.rfind(b"},") + 1] + b"]}"  # a shorter but valid trace
    assert dec._kineto.scan(buf) is not None
    rng = random.Random(7)
    accepted = 0
    for trial in range(300):
        data = bytearray(buf)
        if trial % 3 == 0:
            data = data[: rng.randrange(len(data))]
        else:
            for _ in range(rng.randint(1, 3)):
                data[rng.randrange(len(data))] = rng.choice(
                    b'"{}[],:\\ 0123456789eE.-+ntfu\x00\xff'
                )
        fast, ref = decode_both(bytes(data))
        if fast is None:
            continue
        assert not isinstance(ref, Exception), f"trial {trial}: scanner accepted {ref}"
        assert_same(fast, ref)
        accepted += 1
    assert accepted >= 30, accepted  # flips inside strings and numbers keep the JSON valid


def test_conversion_without_the_extension_is_identical(
    hta_traces: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where no C compiler was available the reference decoder does everything: same files."""
    import pyarrow.parquet as pq

    from tracelab.ingest.convert import convert_trace

    (trace,) = (hta_traces / "nccl_parser_config").glob("*.json.gz")
    fast_info = convert_trace(trace, tmp_path / "fast")
    monkeypatch.setattr(dec, "_kineto", None)
    ref_info = convert_trace(trace, tmp_path / "ref")
    assert fast_info == ref_info
    for name in ("events", "steps", "memory", "lanes"):
        fast = pq.read_table(tmp_path / "fast" / f"{name}.parquet")
        ref = pq.read_table(tmp_path / "ref" / f"{name}.parquet")
        assert fast.num_rows > 0 or name == "memory", name
        assert fast.equals(ref), name


#: Scans documents that end right where an unreadable page begins, in a child process (a read
#: past the end is a segfault there, not a crash of the test run). CI's ingest of a pipeline
#: capture died this way: an all-ASCII trace whose size was a multiple of 4096, mapped with
#: mmap, and the UTF-8 check's 64-byte loop read the byte after the last.
_GUARD_CHILD = r"""
import ctypes, mmap, sys
from tracelab.ingest import _kineto

PAGE = mmap.PAGESIZE
docs = [bytes.fromhex(h) for h in sys.stdin.read().split()]
span = (max(len(d) for d in docs) // PAGE + 2) * PAGE
m = mmap.mmap(-1, span + PAGE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
base = ctypes.addressof(ctypes.c_char.from_buffer(m))
libc = ctypes.CDLL(None, use_errno=True)
assert libc.mprotect(ctypes.c_void_p(base + span), PAGE, 0) == 0, ctypes.get_errno()
view = memoryview(m)
accepted = 0
for doc in docs:
    start = span - len(doc)
    view[start:span] = doc
    accepted += _kineto.scan(view[start:span]) is not None
print(accepted)
"""


def test_never_reads_past_the_end_of_its_buffer() -> None:
    import subprocess
    import sys

    ascii_doc = json.dumps(
        {"traceEvents": [{"ph": "X", "name": "a", "ts": 1.5, "dur": 2, "pid": 1, "tid": 1}]}
    ).encode()
    docs = [ascii_doc]
    # Whole documents of every length modulo 64 (the UTF-8 check's stride), ASCII and not.
    for pad in range(130):
        docs.append(ascii_doc[:-1] + b', "x": "' + b"y" * pad + b'"}')
        docs.append(ascii_doc[:-1] + b', "x": "' + b"y" * pad + "\u00e9".encode() + b'"}')
    # Every prefix of a document: each parser state meets the end of the buffer.
    rich = json.dumps(
        {
            "traceEvents": [
                {
                    "ph": "X",
                    "name": 'n\\u00e9"',
                    "cat": None,
                    "ts": -1.25e3,
                    "dur": 0.0005,
                    "pid": "p",
                    "tid": [1, {"a": True}],
                    "args": {"correlation": 7, "b": False},
                },
                {"ph": "i", "name": "\ud83d\ude00", "ts": 10, "s": "t"},
            ],
            "deviceProperties": [{"id": 0}],
        }
    ).encode()
    docs += [rich[:k] for k in range(1, len(rich) + 1)]
    child = subprocess.run(
        [sys.executable, "-c", _GUARD_CHILD],
        input=" ".join(d.hex() for d in docs),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert child.returncode == 0, (
        f"the scan read past its buffer: {child.returncode}\n{child.stderr}"
    )
    assert int(child.stdout) >= 2 * 130 + 2, child.stdout  # the whole documents were scanned
