/* Kineto trace scanner: one pass over a trace's JSON bytes into column buffers.
 *
 * tracelab.convert's fast path. `scan(buffer)` validates the whole document as strict JSON
 * (RFC 8259: UTF-8, no NaN/Infinity, no trailing data) and returns, for every element of
 * `traceEvents`, the fields tracelab keeps, as packed little-endian column buffers:
 *
 *   ph          uint8   first byte of a one-character `ph` (0 otherwise)
 *   name, cat   strings unescaped into one data buffer + int64 offsets (cat: validity bytes)
 *   pid, tid    int64   value when a JSON integer; kind 1 = integer, 0 = absent or null,
 *                       2 = anything else (its raw text span is listed in `other`)
 *   ts, dur     int64   the decimal text converted exactly to integer nanoseconds (µs * 1000,
 *                       digits past the third decimal rounded half to even); kind 1 = number,
 *                       0 = absent or null
 *   args        the raw JSON text of `args`, verbatim, + int64 offsets and validity bytes
 *   ids         int64 x N_IDS: integer values of a few top-level keys of `args` (correlation,
 *                       External id, stream, the [memory] fields, and PyTorch 1.8's lower-case
 *                       `external id`), INT64_MIN when absent
 *   top         (key, start, end) of every other top-level member, for the caller to decode
 *
 * It returns None, and the caller falls back to the reference decoder (msgspec), whenever the
 * input is not valid JSON or is valid but outside this fast path (a ts/dur with an exponent or
 * beyond int64 ns, an escaped `ph`, a lone surrogate in any string, nesting deeper than
 * MAX_DEPTH, two `traceEvents` members, a non-object event, or a field of an unexpected JSON
 * type). Error messages therefore always come from the reference decoder, and this scanner
 * only ever has to agree with it on input both accept (tests/foundation/test_fast_scan.py).
 *
 * Every read is bounds-checked against the buffer's length; the buffer is never modified.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h> /* x86-64 always has SSE2; elsewhere the portable loops run alone */
#endif

#define MAX_DEPTH 512
#define N_IDS 9
/* The same keys, in the same order, as tracelab.decode.ID_KEYS. */
static const char *ID_KEYS[N_IDS] = {
    "correlation", "External id", "stream", "Device Type",
    "Device Id", "Bytes", "Total Allocated", "Total Reserved", "external id",
};
#define ABSENT INT64_MIN

/* ---------------------------------------------------------------- growable buffers */

/* The column buffers are Python bytes objects from the start, grown in place and finally
 * shrunk to their length, so the result needs no copy: copying, and faulting in the copy's
 * fresh pages, cost as much as the scan itself. */
typedef struct {
    PyObject *obj;
    char *p;
    size_t len, cap;
} Buf;

static int buf_reserve(Buf *b, size_t extra) {
    if (b->len + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra) cap *= 2;
    if (cap > (size_t)PY_SSIZE_T_MAX) return -1;
    if (!b->obj) {
        b->obj = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)cap);
        if (!b->obj) return -1;
    } else if (_PyBytes_Resize(&b->obj, (Py_ssize_t)cap)) {
        return -1; /* the old object was freed and b->obj set to NULL */
    }
    b->p = PyBytes_AS_STRING(b->obj);
    b->cap = cap;
    return 0;
}

static inline int buf_put(Buf *b, const void *src, size_t n) {
    if (b->len + n > b->cap && buf_reserve(b, n)) return -1;
    if (n) memcpy(b->p + b->len, src, n);
    b->len += n;
    return 0;
}

static inline int buf_i64(Buf *b, int64_t v) {
    if (b->len + sizeof v > b->cap && buf_reserve(b, sizeof v)) return -1;
    memcpy(b->p + b->len, &v, sizeof v);
    b->len += sizeof v;
    return 0;
}

static inline int buf_u8(Buf *b, uint8_t v) {
    if (b->len + 1 > b->cap && buf_reserve(b, 1)) return -1;
    b->p[b->len++] = (char)v;
    return 0;
}

/* ---------------------------------------------------------------- parser state */

enum { OK = 0, DECLINE = -1, NOMEM = -2 };

typedef struct {
    const unsigned char *s;
    size_t n, i;
} P;

typedef struct {
    size_t start, end; /* content span, quotes excluded */
    int escaped;
} Str;

typedef struct {
    int kind;          /* 0 absent/null, 1 integer, 2 other */
    int64_t value;
    size_t start, end; /* raw span */
} Any;

typedef struct {
    int kind; /* 0 absent/null, 1 number */
    int64_t ns;
} Time;

typedef struct {
    Buf ph, name_off, name_data, cat_off, cat_data, cat_valid;
    Buf pid, pid_kind, tid, tid_kind, ts, ts_kind, dur, dur_kind;
    Buf args_off, args_data, args_valid, ids[N_IDS], other, top;
    Buf scratch;
    int64_t n;
} Out;

/* Bytes that end a run of plain string content: '"', '\\' and control characters. */
static unsigned char STRING_STOP[256];
static unsigned char IS_WS[256];

static void init_tables(void) {
    for (int c = 0; c < 0x20; c++) STRING_STOP[c] = 1;
    STRING_STOP['"'] = STRING_STOP['\\'] = 1;
    IS_WS[' '] = IS_WS['\n'] = IS_WS['\r'] = IS_WS['\t'] = 1;
}

/* Byte by byte: inlined at each call site, where the length of a run (none, one space, a
 * newline and an indent) repeats, so the branches predict well. (A 16-byte SSE2 version was
 * 1.5x slower on the whole scan: most calls see no whitespace at all.) */
static inline void ws(P *p) {
    while (p->i < p->n && IS_WS[p->s[p->i]]) p->i++;
}

static int expect(P *p, unsigned char c) {
    ws(p);
    if (p->i >= p->n || p->s[p->i] != c) return DECLINE;
    p->i++;
    return OK;
}

static int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL
/* Bit tricks on eight bytes at once: a zero byte; a byte below n (n <= 128). */
static inline uint64_t has_zero(uint64_t v) { return (v - ONES) & ~v & HIGHS; }
static inline uint64_t has_less(uint64_t v, uint64_t n) { return (v - ONES * n) & ~v & HIGHS; }

/* A string at p->i (which must be '"'): validates escapes and control characters. */
static int scan_string(P *p, Str *out) {
    if (p->i >= p->n || p->s[p->i] != '"') return DECLINE;
    size_t i = p->i + 1;
    int escaped = 0;
    const unsigned char *s = p->s;
    for (;;) {
#if defined(__SSE2__)
        /* sixteen bytes at a time: the first quote, backslash or control character */
        while (i + 16 <= p->n) {
            __m128i v = _mm_loadu_si128((const __m128i *)(s + i));
            __m128i stop = _mm_or_si128(
                _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('"')), _mm_cmpeq_epi8(v, _mm_set1_epi8('\\'))),
                _mm_cmpeq_epi8(_mm_subs_epu8(v, _mm_set1_epi8(0x1F)), _mm_setzero_si128()));
            unsigned m = (unsigned)_mm_movemask_epi8(stop);
            if (m) {
                i += (size_t)__builtin_ctz(m);
                break;
            }
            i += 16;
        }
#endif
        /* eight bytes at a time while none is a quote, a backslash or a control character */
        while (i + 8 <= p->n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (has_zero(w ^ (ONES * '"')) | has_zero(w ^ (ONES * '\\')) | has_less(w, 0x20)) break;
            i += 8;
        }
        while (i < p->n && !STRING_STOP[s[i]]) i++;
        if (i >= p->n) return DECLINE;
        unsigned char c = s[i];
        if (c == '"') break;
        if (c < 0x20) return DECLINE;
        if (c == '\\') {
            escaped = 1;
            if (i + 1 >= p->n) return DECLINE;
            unsigned char e = s[i + 1];
            if (e == 'u') {
                if (i + 5 >= p->n) return DECLINE;
                for (int k = 2; k < 6; k++)
                    if (hexval(s[i + k]) < 0) return DECLINE;
                /* Half a surrogate pair is not text: in any string, kept raw or not. */
                uint32_t cp = (uint32_t)(hexval(s[i + 2]) << 12 | hexval(s[i + 3]) << 8 |
                                         hexval(s[i + 4]) << 4 | hexval(s[i + 5]));
                if (cp >= 0xDC00 && cp <= 0xDFFF) return DECLINE;
                i += 6;
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    if (i + 5 >= p->n || s[i] != '\\' || s[i + 1] != 'u') return DECLINE;
                    uint32_t lo = 0;
                    for (int k = 2; k < 6; k++) {
                        int h = hexval(s[i + k]);
                        if (h < 0) return DECLINE;
                        lo = lo << 4 | (uint32_t)h;
                    }
                    if (lo < 0xDC00 || lo > 0xDFFF) return DECLINE;
                    i += 6;
                }
                continue;
            }
            if (!strchr("\"\\/bfnrt", e) || e == 0) return DECLINE;
            i += 2;
            continue;
        }
        i++;
    }
    out->start = p->i + 1;
    out->end = i;
    out->escaped = escaped;
    p->i = i + 1;
    return OK;
}

static int put_utf8(Buf *b, uint32_t cp) {
    unsigned char u[4];
    size_t n;
    if (cp < 0x80) { u[0] = (unsigned char)cp; n = 1; }
    else if (cp < 0x800) { u[0] = 0xC0 | (cp >> 6); u[1] = 0x80 | (cp & 0x3F); n = 2; }
    else if (cp < 0x10000) {
        u[0] = 0xE0 | (cp >> 12); u[1] = 0x80 | ((cp >> 6) & 0x3F); u[2] = 0x80 | (cp & 0x3F);
        n = 3;
    } else {
        u[0] = 0xF0 | (cp >> 18); u[1] = 0x80 | ((cp >> 12) & 0x3F);
        u[2] = 0x80 | ((cp >> 6) & 0x3F); u[3] = 0x80 | (cp & 0x3F); n = 4;
    }
    return buf_put(b, u, n) ? NOMEM : OK;
}

static uint32_t hex4(const unsigned char *s) {
    return (uint32_t)(hexval(s[0]) << 12 | hexval(s[1]) << 8 | hexval(s[2]) << 4 | hexval(s[3]));
}

/* Append a scanned string's text to `b`, unescaped. */
static int put_string(Buf *b, const P *p, const Str *str) {
    const unsigned char *s = p->s;
    if (!str->escaped) return buf_put(b, s + str->start, str->end - str->start) ? NOMEM : OK;
    size_t i = str->start;
    while (i < str->end) {
        size_t j = i;
        while (j < str->end && s[j] != '\\') j++;
        if (buf_put(b, s + i, j - i)) return NOMEM;
        if (j >= str->end) break;
        unsigned char e = s[j + 1];
        char c;
        switch (e) {
        case 'b': c = '\b'; break;
        case 'f': c = '\f'; break;
        case 'n': c = '\n'; break;
        case 'r': c = '\r'; break;
        case 't': c = '\t'; break;
        case 'u': {
            uint32_t cp = hex4(s + j + 2);
            i = j + 6;
            if (cp >= 0xDC00 && cp <= 0xDFFF) return DECLINE; /* lone low surrogate */
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (i + 6 > str->end || s[i] != '\\' || s[i + 1] != 'u') return DECLINE;
                uint32_t lo = hex4(s + i + 2);
                if (lo < 0xDC00 || lo > 0xDFFF) return DECLINE;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                i += 6;
            }
            int rc = put_utf8(b, cp);
            if (rc) return rc;
            continue;
        }
        default: c = (char)e; /* " \ / */
        }
        if (buf_u8(b, (uint8_t)c)) return NOMEM;
        i = j + 2;
    }
    return OK;
}

/* A key's text: a span of the input, or its unescaped copy in `scratch`. */
typedef struct {
    const char *s;
    size_t n;
} Key;

static int key_text(const P *p, const Str *k, Buf *scratch, Key *out) {
    if (!k->escaped) {
        out->s = (const char *)p->s + k->start;
        out->n = k->end - k->start;
        return OK;
    }
    scratch->len = 0;
    int rc = put_string(scratch, p, k);
    out->s = scratch->p;
    out->n = scratch->len;
    return rc;
}

static inline int bytes_eq(const char *a, const char *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

#define KEY_IS(key, lit) ((key).n == sizeof(lit) - 1 && bytes_eq((key).s, lit, sizeof(lit) - 1))

/* A member's key and its ':': where it is in the input (`raw`) and its text (`k`). */
static int read_key(P *p, Buf *scratch, Str *raw, Key *k) {
    ws(p);
    if (scan_string(p, raw) || expect(p, ':')) return DECLINE;
    return key_text(p, raw, scratch, k);
}

/* The ID_KEYS slot of an args key, or -1. */
static int id_slot(Key k) {
    switch (k.n) {
    case 5: return KEY_IS(k, "Bytes") ? 5 : -1;
    case 6: return KEY_IS(k, "stream") ? 2 : -1;
    case 9: return KEY_IS(k, "Device Id") ? 4 : -1;
    case 11:
        if (KEY_IS(k, "correlation")) return 0;
        if (KEY_IS(k, "External id")) return 1;
        if (KEY_IS(k, "external id")) return 8;
        return KEY_IS(k, "Device Type") ? 3 : -1;
    case 14: return KEY_IS(k, "Total Reserved") ? 7 : -1;
    case 15: return KEY_IS(k, "Total Allocated") ? 6 : -1;
    default: return -1;
    }
}

typedef struct {
    int integer;       /* a JSON integer that fits int64 */
    int64_t ivalue;
    int ns_ok;         /* no exponent, and value * 1000 fits int64 */
    int64_t ns;
} Num;

/* A number at p->i, validated against JSON's grammar. */
static int scan_number(P *p, Num *num) {
    const unsigned char *s = p->s;
    size_t i = p->i, n = p->n;
    int neg = 0;
    if (i < n && s[i] == '-') { neg = 1; i++; }
    if (i >= n || s[i] < '0' || s[i] > '9') return DECLINE;
    uint64_t whole = 0;
    int overflow = 0;
    if (s[i] == '0') {
        i++;
    } else {
        while (i < n && s[i] >= '0' && s[i] <= '9') {
            if (whole > (UINT64_MAX - 9) / 10) overflow = 1;
            else whole = whole * 10 + (s[i] - '0');
            i++;
        }
    }
    int has_frac = 0, has_exp = 0;
    uint64_t frac3 = 0;
    int fdigits = 0, round_digit = -1, sticky = 0;
    if (i < n && s[i] == '.') {
        has_frac = 1;
        i++;
        if (i >= n || s[i] < '0' || s[i] > '9') return DECLINE;
        while (i < n && s[i] >= '0' && s[i] <= '9') {
            int d = s[i] - '0';
            if (fdigits < 3) frac3 = frac3 * 10 + d;
            else if (fdigits == 3) round_digit = d;
            else if (d) sticky = 1;
            fdigits++;
            i++;
        }
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        has_exp = 1;
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= n || s[i] < '0' || s[i] > '9') return DECLINE;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    }
    p->i = i;
    num->integer = !has_frac && !has_exp && !overflow &&
                   whole <= (neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX);
    num->ivalue = num->integer ? (neg ? (int64_t)(0 - whole) : (int64_t)whole) : 0;
    for (; fdigits < 3; fdigits++) frac3 *= 10;
    num->ns_ok = !has_exp && !overflow && whole < (uint64_t)(INT64_MAX / 1000 - 1);
    if (num->ns_ok) {
        uint64_t mag = whole * 1000 + frac3;
        /* round half to even on the digits past the third decimal */
        if (round_digit > 5 || (round_digit == 5 && (sticky || (mag & 1)))) mag++;
        num->ns = neg ? -(int64_t)mag : (int64_t)mag;
    }
    return OK;
}

/* A number being skipped: JSON's grammar only, no value. */
static int skip_number(P *p) {
    const unsigned char *s = p->s;
    size_t i = p->i, n = p->n;
    if (i < n && s[i] == '-') i++;
    if (i >= n || s[i] < '0' || s[i] > '9') return DECLINE;
    if (s[i] == '0') i++;
    else while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    if (i < n && s[i] == '.') {
        i++;
        if (i >= n || s[i] < '0' || s[i] > '9') return DECLINE;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= n || s[i] < '0' || s[i] > '9') return DECLINE;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    }
    p->i = i;
    return OK;
}

static int scan_literal(P *p, const char *lit) {
    size_t n = lit[0] == 'f' ? 5 : 4; /* true, null, false */
    if (p->i + n > p->n || memcmp(p->s + p->i, lit, n) != 0) return DECLINE;
    p->i += n;
    return OK;
}

/* After a member or an element: 1 when ',' follows (another comes), 0 when `close` does (the
 * container ends), DECLINE otherwise. Consumes what it read. */
static int after_item(P *p, unsigned char close) {
    ws(p);
    if (p->i >= p->n) return DECLINE;
    unsigned char c = p->s[p->i++];
    if (c == ',') return 1;
    return c == close ? 0 : DECLINE;
}

static int skip_value(P *p, int depth);
static int put_string(Buf *b, const P *p, const Str *str);

/* Past the opening '{' or '[' at p->i: 1 when the container is empty (`close` consumed). */
static int opens_empty(P *p, unsigned char close) {
    p->i++;
    ws(p);
    if (p->i < p->n && p->s[p->i] == close) {
        p->i++;
        return 1;
    }
    return 0;
}

static int skip_object(P *p, int depth) {
    if (opens_empty(p, '}')) return OK;
    int more;
    do {
        Str k;
        ws(p);
        if (scan_string(p, &k) || expect(p, ':')) return DECLINE;
        int rc = skip_value(p, depth + 1);
        if (rc) return rc;
    } while ((more = after_item(p, '}')) > 0);
    return more < 0 ? DECLINE : OK;
}

static int skip_array(P *p, int depth) {
    if (opens_empty(p, ']')) return OK;
    int more;
    do {
        int rc = skip_value(p, depth + 1);
        if (rc) return rc;
    } while ((more = after_item(p, ']')) > 0);
    return more < 0 ? DECLINE : OK;
}

static int skip_value(P *p, int depth) {
    if (depth > MAX_DEPTH) return DECLINE;
    ws(p);
    if (p->i >= p->n) return DECLINE;
    Str str;
    switch (p->s[p->i]) {
    case '{': return skip_object(p, depth);
    case '[': return skip_array(p, depth);
    case '"': return scan_string(p, &str);
    case 't': return scan_literal(p, "true");
    case 'f': return scan_literal(p, "false");
    case 'n': return scan_literal(p, "null");
    default: return skip_number(p);
    }
}

/* `args`: validated like any value; when an object, the integer values of ID_KEYS. */
static int scan_args(P *p, int64_t ids[N_IDS], Buf *scratch) {
    for (int k = 0; k < N_IDS; k++) ids[k] = ABSENT;
    ws(p);
    if (p->i >= p->n) return DECLINE;
    if (p->s[p->i] != '{') return skip_value(p, 1);
    Str key;
    p->i++;
    ws(p);
    if (p->i < p->n && p->s[p->i] == '}') { p->i++; return OK; }
    for (;;) {
        Key kt;
        int rc0 = read_key(p, scratch, &key, &kt);
        if (rc0) return rc0;
        ws(p);
        int slot = id_slot(kt);
        if (slot >= 0 && p->i < p->n && (p->s[p->i] == '-' || (p->s[p->i] >= '0' && p->s[p->i] <= '9'))) {
            Num num;
            if (scan_number(p, &num)) return DECLINE;
            ids[slot] = num.integer ? num.ivalue : ABSENT;
        } else {
            int rc = skip_value(p, 2);
            if (rc) return rc;
            if (slot >= 0) ids[slot] = ABSENT;
        }
        int more = after_item(p, '}');
        if (more < 0) return DECLINE;
        if (more) continue;
        return OK;
    }
}

static int scan_any(P *p, Any *a) {
    ws(p);
    a->start = p->i;
    if (p->i < p->n && (p->s[p->i] == '-' || (p->s[p->i] >= '0' && p->s[p->i] <= '9'))) {
        Num num;
        if (scan_number(p, &num)) return DECLINE;
        a->end = p->i;
        a->kind = num.integer ? 1 : 2;
        a->value = num.integer ? num.ivalue : 0;
        return OK;
    }
    if (p->i < p->n && p->s[p->i] == 'n') {
        if (scan_literal(p, "null")) return DECLINE;
        a->end = p->i;
        a->kind = 0;
        a->value = 0;
        return OK;
    }
    int rc = skip_value(p, 2);
    if (rc) return rc;
    a->end = p->i;
    a->kind = 2;
    a->value = 0;
    return OK;
}

/* ts/dur: a number or null; anything else is outside the fast path. */
static int scan_time(P *p, Time *t) {
    ws(p);
    if (p->i < p->n && p->s[p->i] == 'n') {
        if (scan_literal(p, "null")) return DECLINE;
        t->kind = 0;
        return OK;
    }
    Num num;
    if (scan_number(p, &num) || !num.ns_ok) return DECLINE;
    t->kind = 1;
    t->ns = num.ns;
    return OK;
}

/* A string or null (`cat`), or a string only (`name`, `ph`). */
static int scan_text(P *p, Str *str, int *present, int nullable) {
    ws(p);
    if (nullable && p->i < p->n && p->s[p->i] == 'n') {
        *present = 0;
        return scan_literal(p, "null");
    }
    *present = 1;
    return scan_string(p, str);
}

static int put_other(Out *o, int field, const Any *a) {
    if (buf_i64(&o->other, o->n) || buf_i64(&o->other, field) ||
        buf_i64(&o->other, (int64_t)a->start) || buf_i64(&o->other, (int64_t)a->end))
        return NOMEM;
    return OK;
}

static int scan_event(P *p, Out *o) {
    ws(p);
    if (p->i >= p->n || p->s[p->i] != '{') return DECLINE;
    p->i++;
    /* Only the fields read below are initialized: zeroing whole structs per event showed up
     * as a tenth of the scan. */
    Str ph, name, cat, key;
    int has_ph = 0, has_name = 0, has_cat = 0, has_args = 0;
    Any pid, tid;
    Time ts, dur;
    pid.kind = tid.kind = 0;
    pid.value = tid.value = 0;
    ts.kind = dur.kind = 0;
    ts.ns = dur.ns = 0;
    size_t args_start = 0, args_end = 0;
    int64_t ids[N_IDS];
    for (int k = 0; k < N_IDS; k++) ids[k] = ABSENT;
    ws(p);
    if (p->i < p->n && p->s[p->i] == '}') {
        p->i++;
    } else {
        for (;;) {
            Key k;
            int rc = read_key(p, &o->scratch, &key, &k);
            if (rc) return rc;
            if (KEY_IS(k, "ph")) rc = scan_text(p, &ph, &has_ph, 0);
            else if (KEY_IS(k, "name")) rc = scan_text(p, &name, &has_name, 0);
            else if (KEY_IS(k, "cat")) rc = scan_text(p, &cat, &has_cat, 1);
            else if (KEY_IS(k, "pid")) rc = scan_any(p, &pid);
            else if (KEY_IS(k, "tid")) rc = scan_any(p, &tid);
            else if (KEY_IS(k, "ts")) rc = scan_time(p, &ts);
            else if (KEY_IS(k, "dur")) rc = scan_time(p, &dur);
            else if (KEY_IS(k, "args")) {
                ws(p);
                args_start = p->i;
                rc = scan_args(p, ids, &o->scratch);
                args_end = p->i;
                has_args = 1;
            } else rc = skip_value(p, 2);
            if (rc) return rc;
            int more = after_item(p, '}');
            if (more < 0) return DECLINE;
            if (more) continue;
            break;
        }
    }
    uint8_t ph_code = 0;
    if (has_ph) {
        if (ph.escaped) return DECLINE;
        if (ph.end - ph.start == 1) ph_code = p->s[ph.start];
    }
    int rc;
    if (buf_u8(&o->ph, ph_code)) return NOMEM;
    if (has_name && (rc = put_string(&o->name_data, p, &name))) return rc;
    if (has_cat && (rc = put_string(&o->cat_data, p, &cat))) return rc;
    if (buf_i64(&o->name_off, (int64_t)o->name_data.len) ||
        buf_i64(&o->cat_off, (int64_t)o->cat_data.len) || buf_u8(&o->cat_valid, (uint8_t)has_cat))
        return NOMEM;
    if (buf_i64(&o->pid, pid.value) || buf_u8(&o->pid_kind, (uint8_t)pid.kind) ||
        buf_i64(&o->tid, tid.value) || buf_u8(&o->tid_kind, (uint8_t)tid.kind))
        return NOMEM;
    if (pid.kind == 2 && put_other(o, 0, &pid)) return NOMEM;
    if (tid.kind == 2 && put_other(o, 1, &tid)) return NOMEM;
    if (buf_i64(&o->ts, ts.kind ? ts.ns : 0) || buf_u8(&o->ts_kind, (uint8_t)ts.kind) ||
        buf_i64(&o->dur, dur.kind ? dur.ns : 0) || buf_u8(&o->dur_kind, (uint8_t)dur.kind))
        return NOMEM;
    if (has_args && buf_put(&o->args_data, p->s + args_start, args_end - args_start)) return NOMEM;
    if (buf_i64(&o->args_off, (int64_t)o->args_data.len) || buf_u8(&o->args_valid, (uint8_t)has_args))
        return NOMEM;
    for (int k = 0; k < N_IDS; k++)
        if (buf_i64(&o->ids[k], ids[k])) return NOMEM;
    o->n++;
    return OK;
}

static int scan_events(P *p, Out *o) {
    ws(p);
    if (p->i >= p->n || p->s[p->i] != '[') return DECLINE;
    p->i++;
    ws(p);
    if (p->i < p->n && p->s[p->i] == ']') { p->i++; return OK; }
    for (;;) {
        int rc = scan_event(p, o);
        if (rc) return rc;
        int more = after_item(p, ']');
        if (more < 0) return DECLINE;
        if (more) continue;
        return OK;
    }
}

static int scan_top(P *p, Out *o) {
    if (expect(p, '{')) return DECLINE;
    int seen_events = 0;
    ws(p);
    if (p->i < p->n && p->s[p->i] == '}') {
        p->i++;
    } else {
        for (;;) {
            Str key;
            Key k;
            int rc = read_key(p, &o->scratch, &key, &k);
            if (rc) return rc;
            if (KEY_IS(k, "traceEvents")) {
                if (seen_events++) return DECLINE;
                rc = scan_events(p, o);
            } else {
                ws(p);
                size_t start = p->i;
                rc = skip_value(p, 1);
                if (!rc && (buf_i64(&o->top, (int64_t)key.start - 1) ||
                            buf_i64(&o->top, (int64_t)key.end + 1) ||
                            buf_i64(&o->top, (int64_t)start) || buf_i64(&o->top, (int64_t)p->i)))
                    rc = NOMEM;
            }
            if (rc) return rc;
            int more = after_item(p, '}');
            if (more < 0) return DECLINE;
            if (more) continue;
            break;
        }
    }
    ws(p);
    if (p->i != p->n || !seen_events) return DECLINE;
    return OK;
}

/* Strict UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF). */
static int valid_utf8(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
#if defined(__SSE2__)
        /* ASCII, the common case, 64 bytes at a time */
        while (i + 64 <= n) {
            __m128i a = _mm_or_si128(_mm_loadu_si128((const __m128i *)(s + i)),
                                     _mm_loadu_si128((const __m128i *)(s + i + 16)));
            __m128i b = _mm_or_si128(_mm_loadu_si128((const __m128i *)(s + i + 32)),
                                     _mm_loadu_si128((const __m128i *)(s + i + 48)));
            if (_mm_movemask_epi8(_mm_or_si128(a, b))) break;
            i += 64;
        }
#endif
        /* The 64-byte loop can end exactly at the end: reading s[n] would fault when the
         * input ends at a page boundary (an mmap of a file whose size is a multiple of 4096). */
        if (i >= n) break;
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ULL)) { i += 8; continue; }
        }
        unsigned char c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t len;
        uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; }
        else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; }
        else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; }
        else return 0;
        if (i + len > n) return 0;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
            (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
            return 0;
        i += len;
    }
    return 1;
}

/* ---------------------------------------------------------------- Python glue */

/* Reserve room up front: string data is never longer than the input (so those buffers never
 * move), and a Kineto event takes well over 64 bytes of JSON. Untouched pages cost nothing. */
static int presize(Out *o, size_t n) {
    size_t events = n / 64 + 16;
    Buf *data[] = {&o->name_data, &o->cat_data, &o->args_data};
    for (size_t k = 0; k < 3; k++)
        if (buf_reserve(data[k], n + 1)) return -1;
    Buf *i64[] = {&o->name_off, &o->cat_off, &o->args_off, &o->pid, &o->tid, &o->ts, &o->dur};
    for (size_t k = 0; k < sizeof i64 / sizeof *i64; k++)
        if (buf_reserve(i64[k], 8 * (events + 1))) return -1;
    for (int k = 0; k < N_IDS; k++)
        if (buf_reserve(&o->ids[k], 8 * events)) return -1;
    Buf *u8[] = {&o->ph, &o->cat_valid, &o->pid_kind, &o->tid_kind, &o->ts_kind, &o->dur_kind,
                 &o->args_valid};
    for (size_t k = 0; k < sizeof u8 / sizeof *u8; k++)
        if (buf_reserve(u8[k], events)) return -1;
    return 0;
}

static void out_free(Out *o) {
    Buf *all[] = {&o->ph, &o->name_off, &o->name_data, &o->cat_off, &o->cat_data,
                  &o->cat_valid, &o->pid, &o->pid_kind, &o->tid, &o->tid_kind, &o->ts,
                  &o->ts_kind, &o->dur, &o->dur_kind, &o->args_off, &o->args_data,
                  &o->args_valid, &o->other, &o->top, &o->scratch};
    for (size_t k = 0; k < sizeof all / sizeof *all; k++) Py_CLEAR(all[k]->obj);
    for (int k = 0; k < N_IDS; k++) Py_CLEAR(o->ids[k].obj);
}

/* Hand a buffer, shrunk to its length, to `d[key]`. */
static int set_bytes(PyObject *d, const char *key, Buf *b) {
    if (!b->obj) b->obj = PyBytes_FromStringAndSize("", 0);
    else if (_PyBytes_Resize(&b->obj, (Py_ssize_t)b->len)) return -1;
    if (!b->obj) return -1;
    int rc = PyDict_SetItemString(d, key, b->obj);
    Py_CLEAR(b->obj);
    b->p = NULL;
    b->len = b->cap = 0;
    return rc;
}

static PyObject *build_result(Out *o, const unsigned char *s) {
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    struct { const char *k; Buf *b; } cols[] = {
        {"ph", &o->ph}, {"name_off", &o->name_off}, {"name_data", &o->name_data},
        {"cat_off", &o->cat_off}, {"cat_data", &o->cat_data}, {"cat_valid", &o->cat_valid},
        {"pid", &o->pid}, {"pid_kind", &o->pid_kind}, {"tid", &o->tid},
        {"tid_kind", &o->tid_kind}, {"ts", &o->ts}, {"ts_kind", &o->ts_kind}, {"dur", &o->dur},
        {"dur_kind", &o->dur_kind}, {"args_off", &o->args_off}, {"args_data", &o->args_data},
        {"args_valid", &o->args_valid}, {"other", &o->other},
    };
    for (size_t k = 0; k < sizeof cols / sizeof *cols; k++)
        if (set_bytes(d, cols[k].k, cols[k].b)) goto fail;
    PyObject *ids = PyDict_New();
    if (!ids || PyDict_SetItemString(d, "ids", ids)) { Py_XDECREF(ids); goto fail; }
    Py_DECREF(ids);
    for (int k = 0; k < N_IDS; k++)
        if (set_bytes(ids, ID_KEYS[k], &o->ids[k])) goto fail;
    PyObject *n = PyLong_FromLongLong(o->n);
    if (!n || PyDict_SetItemString(d, "n", n)) { Py_XDECREF(n); goto fail; }
    Py_DECREF(n);
    /* top-level members: (key as JSON text, value start, value end) */
    const int64_t *t = (const int64_t *)o->top.p;
    size_t nt = o->top.len / (4 * sizeof(int64_t));
    PyObject *top = PyList_New((Py_ssize_t)nt);
    if (!top || PyDict_SetItemString(d, "top", top)) { Py_XDECREF(top); goto fail; }
    Py_DECREF(top);
    for (size_t k = 0; k < nt; k++) {
        PyObject *item = Py_BuildValue("(y#LL)", (const char *)s + t[4 * k],
                                       (Py_ssize_t)(t[4 * k + 1] - t[4 * k]),
                                       (long long)t[4 * k + 2], (long long)t[4 * k + 3]);
        if (!item) goto fail;
        PyList_SET_ITEM(top, (Py_ssize_t)k, item);
    }
    return d;
fail:
    Py_DECREF(d);
    return NULL;
}

static PyObject *scan(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE)) return NULL;
    Out o;
    memset(&o, 0, sizeof o);
    P p = {(const unsigned char *)view.buf, (size_t)view.len, 0};
    int rc;
    /* The GIL stays held: the column buffers are Python objects. */
    rc = valid_utf8(p.s, p.n) ? OK : DECLINE;
    if (rc == OK && presize(&o, p.n)) rc = NOMEM;
    /* leading offsets of the string/args columns */
    if (rc == OK && (buf_i64(&o.name_off, 0) || buf_i64(&o.cat_off, 0) || buf_i64(&o.args_off, 0)))
        rc = NOMEM;
    if (rc == OK) rc = scan_top(&p, &o);
    PyObject *res = NULL;
    if (rc == NOMEM) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
    }
    else if (rc == DECLINE) res = Py_NewRef(Py_None);
    else res = build_result(&o, p.s);
    out_free(&o);
    PyBuffer_Release(&view);
    return res;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_O,
     "scan(buffer) -> dict of column buffers, or None when the reference decoder must decide."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "tracelab._kineto",
    "Fast one-pass scanner of Kineto trace JSON into column buffers (see tracelab.convert).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kineto(void) {
    init_tables();
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "MAX_DEPTH", MAX_DEPTH)) Py_CLEAR(m);
    return m;
}
