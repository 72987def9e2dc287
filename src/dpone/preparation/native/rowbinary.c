/*
 * dpone's compiled conversion: whole records of the bulk text format to RowBinary.
 *
 * The second converter beside the Python reference (dpone.typepolicy.converters with
 * dpone.connectors.bulk_text_codec). It takes only what it can prove the reference
 * accepts, with the reference's exact bytes; on anything else (a value the reference
 * refuses, or one this code does not decide) it declines the whole range, and the
 * caller converts the file with the reference. It never names an error: the
 * reference does that. Differential tests hold it to the reference value by value.
 *
 * Called through ctypes, which releases the GIL for the call, so ranges convert on
 * all cores. Each row's first 16 bytes of SHA-256, read little-endian, are summed
 * modulo 2**128: the rows digest of dpone.contracts.preparation.RowsDigest.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A row's SHA-256 through OpenSSL's SHA256_Init/Update/Final: measured on the
 * development machine, 0.11 us a row of 85 bytes against 0.19 us through EVP's
 * per-call dispatch (and 0.5 to 0.75 us through the one-shot SHA256(), which fetches
 * the algorithm every call). OpenSSL 3 deprecates them but keeps them; a later major
 * version gets EVP. Either way the CPU's SHA instructions are used where present. */
#define OPENSSL_SUPPRESS_DEPRECATED /* before any OpenSSL header: for those three alone */
#include <openssl/opensslv.h>
#if OPENSSL_VERSION_MAJOR == 3
#include <openssl/sha.h>
#define ROW_DIGEST_LOW_LEVEL 1
#endif
#include <openssl/evp.h>

/* Column kinds and target families, as dpone.preparation.native.rowbinary numbers them. */
enum { KIND_TEXT = 0, KIND_BINARY = 1, KIND_RAW = 2 };
enum {
    FAM_INT = 1, FAM_UINT, FAM_BOOL, FAM_DECIMAL, FAM_FLOAT, FAM_DATE, FAM_DATETIME,
    FAM_TIME, FAM_DTO, FAM_UUID, FAM_STRING, FAM_FIXED
};
/* Per column: kind, family, two parameters, nullable. */
#define SPEC_WIDTH 5

/* Outcomes. */
#define DONE 0
#define DECLINED 1
#define NO_MEMORY 2
#define NO_DIGEST 3

/* ClickHouse's Date32/DateTime64 range, in days since 1970-01-01: 1900-01-01, 2299-12-31. */
#define MIN_DAY (-25567LL)
#define MAX_DAY (120529LL)
#define SECONDS_PER_DAY 86400LL
/* Longer numbers are left to the other converters (the reference takes any length). */
#define MAX_FLOAT_TEXT 400

typedef struct {
    uint8_t *data;
    size_t len, cap;
} out_t;

static const int64_t POW10[10] = {
    1LL, 10LL, 100LL, 1000LL, 10000LL, 100000LL, 1000000LL, 10000000LL, 100000000LL,
    1000000000LL,
};

static int reserve(out_t *out, size_t more) {
    if (out->len + more <= out->cap) return 1;
    size_t cap = out->cap ? out->cap : 1 << 16;
    while (cap < out->len + more) cap *= 2;
    uint8_t *grown = realloc(out->data, cap);
    if (grown == NULL) return 0;
    out->data = grown;
    out->cap = cap;
    return 1;
}

static void put(out_t *out, const void *bytes, size_t n) {
    memcpy(out->data + out->len, bytes, n);
    out->len += n;
}

/* Little-endian bytes of a two's-complement integer (this code runs on little-endian
 * machines only: checked by dpone_rowbinary_check). */
static void put_int(out_t *out, __int128 value, size_t width) {
    if (width <= 8) { /* the low bytes of the two's complement, as an int64 holds them */
        int64_t low = (int64_t)value;
        put(out, &low, width);
        return;
    }
    uint8_t bytes[32];
    unsigned __int128 u = (unsigned __int128)value;
    for (size_t i = 0; i < width; i++) {
        bytes[i] = i < 16 ? (uint8_t)(u >> (8 * i)) : (value < 0 ? 0xff : 0x00);
    }
    put(out, bytes, width);
}

static void put_leb128(out_t *out, size_t n) {
    do {
        uint8_t b = n & 0x7f;
        n >>= 7;
        if (n) b |= 0x80;
        out->data[out->len++] = b;
    } while (n);
}

static int is_digit(uint8_t c) { return c >= '0' && c <= '9'; }

/* Hex digit values (either case) and -1 for every other byte; and 1 for the bytes a
 * text field may not hold raw (CR, U+001E, U+001F), that start an escape (U+001D) or
 * that start a multi-byte sequence. Built once, by the first call of any entry point
 * (tables_once). */
static int8_t HEX[256];
static uint8_t TEXT_SPECIAL[256];

static void build_tables(void) {
    for (int c = 0; c < 256; c++) {
        HEX[c] = c >= '0' && c <= '9' ? (int8_t)(c - '0')
               : c >= 'a' && c <= 'f' ? (int8_t)(c - 'a' + 10)
               : c >= 'A' && c <= 'F' ? (int8_t)(c - 'A' + 10) : -1;
        TEXT_SPECIAL[c] = c >= 0x80 || c == '\r' || c == 0x1d || c == 0x1e || c == 0x1f;
    }
}

static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static int hex_value(uint8_t c) { return HEX[c]; }

/* Digits s[0..n) as a number (n small enough not to overflow the caller's use). */
static int64_t digits_value(const uint8_t *s, size_t n) {
    int64_t v = 0;
    for (size_t i = 0; i < n; i++) v = v * 10 + (s[i] - '0');
    return v;
}

static int all_digits(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!is_digit(s[i])) return 0;
    return 1;
}

static int all_zeros(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != '0') return 0;
    return 1;
}

/* Length of the valid UTF-8 sequence at s (strict, as Python's decoder: no overlong
 * forms, no surrogates, nothing above U+10FFFF), or 0. */
static size_t utf8_sequence(const uint8_t *s, size_t n) {
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) return n >= 2 && (s[1] & 0xc0) == 0x80 ? 2 : 0;
    if (c >= 0xe0 && c <= 0xef) {
        if (n < 3 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80) return 0;
        if (c == 0xe0 && s[1] < 0xa0) return 0;
        if (c == 0xed && s[1] > 0x9f) return 0;
        return 3;
    }
    if (c >= 0xf0 && c <= 0xf4) {
        if (n < 4 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80 || (s[3] & 0xc0) != 0x80)
            return 0;
        if (c == 0xf0 && s[1] < 0x90) return 0;
        if (c == 0xf4 && s[1] > 0x8f) return 0;
        return 4;
    }
    return 0;
}

/* ------------------------------------------------------------------------- strings */

/* A text field: strict UTF-8, no raw CR, U+001E or U+001F, and U+001D only as one of
 * the six escapes (or the whole field the empty marker). Writes the decoded bytes
 * with the String or FixedString(n) encoding. */
static int text_value(out_t *out, const uint8_t *f, size_t n, int fixed, int64_t width) {
    if (n == 2 && f[0] == 0x1d && f[1] == 'E') {
        if (fixed) return width == 0;
        out->data[out->len++] = 0;
        return 1;
    }
    size_t decoded = 0;
    int escaped = 0;
    for (size_t i = 0; i < n;) {
        if (i + 8 <= n) { /* eight bytes at once when all are in 0x20..0x7f */
            uint64_t w;
            memcpy(&w, f + i, 8);
            if ((((w - 0x2020202020202020ULL) | w) & 0x8080808080808080ULL) == 0) {
                i += 8;
                decoded += 8;
                continue;
            }
        }
        uint8_t c = f[i];
        if (!TEXT_SPECIAL[c]) {
            i++;
            decoded++;
            continue;
        }
        if (c >= 0x80) {
            size_t k = utf8_sequence(f + i, n - i);
            if (k == 0) return 0;
            i += k;
            decoded += k;
            continue;
        }
        if (c == '\r' || c == 0x1e || c == 0x1f) return 0;
        if (c == 0x1d) {
            if (i + 1 >= n || !strchr("PTRNUS", f[i + 1]) || f[i + 1] == 0) return 0;
            escaped = 1;
            i += 2;
        } else {
            i += 1;
        }
        decoded += 1;
    }
    if (fixed && (int64_t)decoded != width) return 0;
    if (!fixed) put_leb128(out, decoded);
    if (!escaped) {
        put(out, f, n);
        return 1;
    }
    for (size_t i = 0; i < n;) { /* runs between escapes copied whole */
        const uint8_t *mark = memchr(f + i, 0x1d, n - i);
        size_t run = mark == NULL ? n - i : (size_t)(mark - (f + i));
        put(out, f + i, run);
        i += run;
        if (mark == NULL) break;
        uint8_t c;
        switch (f[i + 1]) {
        case 'P': c = 0x1d; break;
        case 'T': c = '\t'; break;
        case 'R': c = '\r'; break;
        case 'N': c = '\n'; break;
        case 'U': c = 0x1f; break;
        default: c = 0x1e; break; /* 'S': the only letter left */
        }
        out->data[out->len++] = c;
        i += 2;
    }
    return 1;
}

/* A binary field: hex byte pairs, either case, with optional space, VT, FF or CR
 * between pairs only (or the empty marker). */
static int binary_value(out_t *out, const uint8_t *f, size_t n, int fixed, int64_t width) {
    if (n == 2 && f[0] == 0x1d && f[1] == 'E') {
        if (fixed) return width == 0;
        out->data[out->len++] = 0;
        return 1;
    }
    if (n % 2 == 0 && (!fixed || (int64_t)(n / 2) == width)) {
        /* The exporter's form, pairs and nothing else: checked while decoding. */
        size_t start = out->len;
        if (!fixed) put_leb128(out, n / 2);
        size_t i = 0;
        for (; i < n; i += 2) {
            int hi = hex_value(f[i]), lo = hex_value(f[i + 1]);
            if ((hi | lo) < 0) break;
            out->data[out->len++] = (uint8_t)(hi << 4 | lo);
        }
        if (i == n) return 1;
        out->len = start; /* whitespace, or not hex: decided below */
    }
    size_t pairs = 0;
    for (size_t i = 0;;) {
        if (i + 1 >= n || hex_value(f[i]) < 0 || hex_value(f[i + 1]) < 0) return 0;
        pairs++;
        i += 2;
        if (i == n) break;
        while (i < n && (f[i] == ' ' || f[i] == 0x0b || f[i] == 0x0c || f[i] == '\r')) i++;
        /* the loop's check refuses whitespace at the end: a pair must follow */
    }
    if (fixed && (int64_t)pairs != width) return 0;
    if (!fixed) put_leb128(out, pairs);
    for (size_t i = 0; i < n;) {
        int hi = hex_value(f[i]);
        if (hi < 0) {
            i++;
            continue;
        }
        out->data[out->len++] = (uint8_t)(hi << 4 | hex_value(f[i + 1]));
        i += 2;
    }
    return 1;
}

/* ------------------------------------------------------------------------- numbers */

/* The number the digits a[0..an) then b[0..bn) spell (at most 38 digits in all):
 * 64-bit arithmetic for the first 18, which is most numbers, 128-bit beyond. */
static __int128 accumulate(const uint8_t *a, size_t an, const uint8_t *b, size_t bn) {
    uint64_t head = 0;
    size_t i = 0, total = an + bn;
    for (; i < total && i < 18; i++) head = head * 10 + ((i < an ? a[i] : b[i - an]) - '0');
    __int128 v = head;
    for (; i < total; i++) v = v * 10 + ((i < an ? a[i] : b[i - an]) - '0');
    return v;
}

/* -?(0|[1-9][0-9]*): the end of the integer part at f, or 0 when there is none. */
static size_t integer_part(const uint8_t *f, size_t n, size_t start) {
    if (start >= n || !is_digit(f[start])) return 0;
    if (f[start] == '0') return start + 1;
    size_t i = start + 1;
    while (i < n && is_digit(f[i])) i++;
    return i;
}

static int int_value(out_t *out, const uint8_t *f, size_t n, int bits, int is_signed) {
    size_t neg = f[0] == '-';
    if (integer_part(f, n, neg) != n || n > 21) return 0;
    if (neg && n == 2 && f[1] == '0') return 0; /* "-0" */
    __int128 v = accumulate(f + neg, n - neg, 0, 0);
    if (neg) v = -v;
    __int128 low, high;
    if (is_signed) {
        low = -((__int128)1 << (bits - 1));
        high = ((__int128)1 << (bits - 1)) - 1;
    } else {
        low = 0;
        high = ((__int128)1 << bits) - 1;
    }
    if (v < low || v > high) return 0;
    put_int(out, v, (size_t)bits / 8);
    return 1;
}

static size_t decimal_width(int precision) {
    return precision <= 9 ? 4 : precision <= 18 ? 8 : precision <= 38 ? 16 : 32;
}

/* Decimal(P, S) up to P = 38 (the scaled value then fits 127 bits). */
static int decimal_value(out_t *out, const uint8_t *f, size_t n, int precision, int scale) {
    size_t neg = f[0] == '-';
    size_t whole_end = integer_part(f, n, neg);
    if (whole_end == 0) return 0;
    size_t frac = whole_end, frac_n = 0;
    if (whole_end < n) {
        if (f[whole_end] != '.' || whole_end + 1 >= n) return 0;
        frac = whole_end + 1;
        frac_n = n - frac;
        if (!all_digits(f + frac, frac_n)) return 0;
    }
    if (frac_n > (size_t)scale) {
        if (!all_zeros(f + frac + scale, frac_n - scale)) return 0;
        frac_n = (size_t)scale;
    }
    size_t whole_n = whole_end - neg;
    int whole_zero = whole_n == 1 && f[neg] == '0';
    if (!whole_zero && whole_n > (size_t)(precision - scale)) return 0;
    __int128 v = accumulate(f + neg, whole_end - neg, f + frac, frac_n);
    for (size_t i = frac_n; i < (size_t)scale; i++) v *= 10;
    if (neg) {
        if (v == 0) return 0; /* a negative zero */
        v = -v;
    }
    put_int(out, v, decimal_width(precision));
    return 1;
}

/* -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)? */
static int float_grammar(const uint8_t *f, size_t n) {
    size_t i = integer_part(f, n, f[0] == '-');
    if (i == 0) return 0;
    if (i < n && f[i] == '.') {
        size_t start = ++i;
        while (i < n && is_digit(f[i])) i++;
        if (i == start) return 0;
    }
    if (i < n && (f[i] == 'e' || f[i] == 'E')) {
        i++;
        if (i < n && (f[i] == '-' || f[i] == '+')) i++;
        size_t start = i;
        while (i < n && is_digit(f[i])) i++;
        if (i == start) return 0;
    }
    return i == n;
}

/* The correctly rounded binary64 of grammar-checked text (glibc's strtod is exact; the
 * calling thread's locale is "C" for the call, see dpone_rowbinary_convert). */
/* Clinger's fast path for grammar-checked text: when the decimal significand is at
 * most 2**53 and the power of ten at most 22 either way, both are exact doubles and
 * one IEEE multiplication or division (rounded to nearest, in SSE registers) gives the
 * correctly rounded value, as strtod would. Most exported floats take it (Python's
 * repr has 17 significant digits at most, and 16 or fewer below 2**53); 0 sends the
 * text to strtod. */
static int fast_double(const uint8_t *f, size_t n, double *value) {
    static const double POWERS[23] = {
        1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
        1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
    };
    size_t i = f[0] == '-';
    uint64_t m = 0;
    int significant = 0, fraction = 0;
    int64_t e10 = 0;
    for (; i < n && f[i] != 'e' && f[i] != 'E'; i++) {
        if (f[i] == '.') {
            fraction = 1;
            continue;
        }
        if (m > 0 || f[i] != '0') {
            if (++significant > 19) return 0; /* 19 digits stay below 2**64 */
        }
        m = m * 10 + (uint64_t)(f[i] - '0');
        e10 -= fraction;
    }
    if (i < n) { /* the exponent */
        size_t start = ++i;
        int negative = f[i] == '-';
        if (f[i] == '-' || f[i] == '+') start = ++i;
        if (n - start > 4) return 0;
        int64_t e = 0;
        for (; i < n; i++) e = e * 10 + (f[i] - '0');
        e10 += negative ? -e : e;
    }
    if (m > (UINT64_C(1) << 53) || e10 < -22 || e10 > 22) return 0;
    double d = (double)m;
    d = e10 < 0 ? d / POWERS[-e10] : d * POWERS[e10];
    *value = f[0] == '-' ? -d : d;
    return 1;
}

static int parse_double(const uint8_t *f, size_t n, double *value) {
    char text[MAX_FLOAT_TEXT + 1];
    if (n > MAX_FLOAT_TEXT || !float_grammar(f, n)) return 0;
    if (fast_double(f, n, value)) return isfinite(*value);
    memcpy(text, f, n);
    text[n] = 0;
    *value = strtod(text, NULL);
    return isfinite(*value);
}

static int float64_value(out_t *out, const uint8_t *f, size_t n) {
    double v;
    if (!parse_double(f, n, &v)) return 0;
    put(out, &v, 8);
    return 1;
}

/* Float32: the binary64 of the text rounded to binary32 (to nearest, as Python's
 * struct does), taken when it is exactly that binary64, or when the binary64 of the
 * shortest text naming the binary32 (the reference's shortest_float32) is. */
static int float32_value(out_t *out, const uint8_t *f, size_t n) {
    double v;
    if (!parse_double(f, n, &v)) return 0;
    float single = (float)v;
    if (isinf(single)) return 0;
    if ((double)single != v) {
        if (single == 0) return 0;
        int found = 0;
        for (int digits = 1; digits <= 9 && !found; digits++) {
            char text[64];
            snprintf(text, sizeof text, "%.*g", digits, (double)single);
            double back = strtod(text, NULL);
            float narrowed = (float)back;
            if (isinf(narrowed)) continue; /* Python's struct refuses: the loop goes on */
            if (narrowed == single) {
                if (back != v) return 0;
                found = 1;
            }
        }
        if (!found) return 0;
    }
    put(out, &single, 4);
    return 1;
}

/* ------------------------------------------------------------------------- time */

static int leap(int64_t y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

/* Days from 1970-01-01 to y-m-d of the proleptic Gregorian calendar (y >= 1). */
static int64_t days_from_civil(int64_t y, int64_t m, int64_t d) {
    static const int before[12] = {0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334};
    int64_t p = y - 1;
    int64_t days = p * 365 + p / 4 - p / 100 + p / 400; /* days before year y, from 0001-01-01 */
    days += before[m - 1] + (m > 2 && leap(y)) + d - 1;
    return days - 719162; /* 0001-01-01 to 1970-01-01 */
}

/* YYYY-MM-DD at f (10 bytes): its day number, or 0 when it is not a calendar date. */
static int date_at(const uint8_t *f, int64_t *day) {
    static const int month_days[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (!all_digits(f, 4) || f[4] != '-' || !all_digits(f + 5, 2) || f[7] != '-' ||
        !all_digits(f + 8, 2))
        return 0;
    int64_t y = digits_value(f, 4), m = digits_value(f + 5, 2), d = digits_value(f + 8, 2);
    if (y < 1 || m < 1 || m > 12 || d < 1) return 0;
    if (d > month_days[m - 1] + (m == 2 && leap(y))) return 0;
    *day = days_from_civil(y, m, d);
    return 1;
}

/* HH:MM:SS(.f{1,9})? spanning f[0..n): ticks of 10^-precision s since midnight. */
static int clock_at(const uint8_t *f, size_t n, int precision, int64_t *ticks, int whole_minute) {
    if (n < 8 || !all_digits(f, 2) || f[2] != ':' || !all_digits(f + 3, 2) || f[5] != ':' ||
        !all_digits(f + 6, 2))
        return 0;
    size_t frac_n = 0;
    if (n > 8) {
        frac_n = n - 9;
        if (f[8] != '.' || frac_n < 1 || frac_n > 9 || !all_digits(f + 9, frac_n)) return 0;
    }
    int64_t hh = digits_value(f, 2), mm = digits_value(f + 3, 2), ss = digits_value(f + 6, 2);
    if (whole_minute && (ss != 0 || !all_zeros(f + 9, frac_n))) return 0;
    if (hh > 23 || mm > 59 || ss > 59) return 0;
    if (frac_n > (size_t)precision) {
        if (!all_zeros(f + 9 + precision, frac_n - precision)) return 0;
        frac_n = (size_t)precision;
    }
    int64_t fraction = digits_value(f + 9, frac_n) * POW10[precision - frac_n];
    *ticks = (hh * 3600 + mm * 60 + ss) * POW10[precision] + fraction;
    return 1;
}

static int date_value(out_t *out, const uint8_t *f, size_t n) {
    int64_t day;
    if (n != 10 || !date_at(f, &day) || day < MIN_DAY || day > MAX_DAY) return 0;
    put_int(out, day, 4);
    return 1;
}

static int datetime_value(out_t *out, const uint8_t *f, size_t n, int precision, int whole) {
    int64_t day, ticks;
    if (n < 19 || f[10] != ' ' || !date_at(f, &day)) return 0;
    if (!clock_at(f + 11, n - 11, precision, &ticks, whole)) return 0;
    if (day < MIN_DAY || day > MAX_DAY) return 0;
    put_int(out, day * SECONDS_PER_DAY * POW10[precision] + ticks, 8);
    return 1;
}

static int time_value(out_t *out, const uint8_t *f, size_t n, int precision) {
    int64_t ticks;
    if (!clock_at(f, n, precision, &ticks, 0)) return 0;
    put_int(out, ticks, 8);
    return 1;
}

/* YYYY-MM-DD HH:MM:SS[.f] +HH:MM: the UTC instant (Int64) and the offset minutes (Int16). */
static int dto_value(out_t *out, const uint8_t *f, size_t n, int precision) {
    int64_t day, ticks;
    if (n < 26 || f[10] != ' ' || f[n - 7] != ' ' || !date_at(f, &day)) return 0;
    const uint8_t *o = f + n - 6;
    if ((o[0] != '+' && o[0] != '-') || !all_digits(o + 1, 2) || o[3] != ':' ||
        !all_digits(o + 4, 2))
        return 0;
    if (!clock_at(f + 11, n - 18, precision, &ticks, 0)) return 0;
    int64_t oh = digits_value(o + 1, 2), om = digits_value(o + 4, 2);
    if (om > 59 || oh * 60 + om > 14 * 60) return 0;
    int64_t offset = (oh * 60 + om) * (o[0] == '-' ? -1 : 1);
    int64_t scale = POW10[precision];
    int64_t utc = day * SECONDS_PER_DAY * scale + ticks - offset * 60 * scale;
    if (utc < MIN_DAY * SECONDS_PER_DAY * scale || utc >= (MAX_DAY + 1) * SECONDS_PER_DAY * scale)
        return 0;
    put_int(out, utc, 8);
    put_int(out, offset, 2);
    return 1;
}

/* 8-4-4-4-12 hex digits, either case: each 64-bit half little-endian. */
static int uuid_value(out_t *out, const uint8_t *f, size_t n) {
    uint8_t digits[32];
    size_t k = 0;
    if (n != 36) return 0;
    for (size_t i = 0; i < 36; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            if (f[i] != '-') return 0;
            continue;
        }
        int v = hex_value(f[i]);
        if (v < 0) return 0;
        digits[k++] = (uint8_t)v;
    }
    uint8_t bytes[16];
    for (size_t half = 0; half < 2; half++)
        for (size_t b = 0; b < 8; b++) {
            size_t at = half * 16 + (7 - b) * 2; /* the half's last byte comes first */
            bytes[half * 8 + b] = (uint8_t)(digits[at] << 4 | digits[at + 1]);
        }
    put(out, bytes, 16);
    return 1;
}

/* ------------------------------------------------------------------------- fields */

static int field_value(out_t *out, const int32_t *c, const uint8_t *f, size_t n) {
    int kind = c[0], family = c[1], p0 = c[2], p1 = c[3];
    if (!reserve(out, n + 40)) return -1;
    if (kind == KIND_TEXT) {
        if (family == FAM_STRING) return text_value(out, f, n, 0, 0);
        if (family == FAM_FIXED) return text_value(out, f, n, 1, p0);
        return 0;
    }
    if (kind == KIND_BINARY) {
        if (family == FAM_STRING) return binary_value(out, f, n, 0, 0);
        if (family == FAM_FIXED) return binary_value(out, f, n, 1, p0);
        return 0;
    }
    /* Every grammar below checks every byte of the field against printable ASCII
     * (digits and a few marks), so a reserved character or a non-ASCII byte, which the
     * reference refuses as such, is refused by the grammar here. */
    switch (family) {
    case FAM_INT: return int_value(out, f, n, p0, 1);
    case FAM_UINT: return int_value(out, f, n, p0, 0);
    case FAM_BOOL:
        if (n != 1 || (f[0] != '0' && f[0] != '1')) return 0;
        out->data[out->len++] = f[0] - '0';
        return 1;
    case FAM_DECIMAL: return p0 <= 38 && decimal_value(out, f, n, p0, p1);
    case FAM_FLOAT: return p0 == 64 ? float64_value(out, f, n) : float32_value(out, f, n);
    case FAM_DATE: return date_value(out, f, n);
    case FAM_DATETIME: return datetime_value(out, f, n, p0, p1);
    case FAM_TIME: return time_value(out, f, n, p0);
    case FAM_DTO: return dto_value(out, f, n, p0);
    case FAM_UUID: return uuid_value(out, f, n);
    default: return 0;
    }
}

/* ------------------------------------------------------------------------- records */

/* Each thread keeps its output buffer from call to call: fresh memory for every range
 * cost about 6% of the time in page faults. Freed when the thread ends. */
static pthread_key_t kept_key;
static pthread_once_t kept_once = PTHREAD_ONCE_INIT;
static int kept_ready;

static void release_kept(void *kept) {
    free(((out_t *)kept)->data);
    free(kept);
}

static void make_kept_key(void) { kept_ready = pthread_key_create(&kept_key, release_kept) == 0; }

static out_t *kept_buffer(void) {
    pthread_once(&kept_once, make_kept_key);
    if (!kept_ready) return NULL;
    out_t *kept = pthread_getspecific(kept_key);
    if (kept == NULL) {
        kept = calloc(1, sizeof *kept);
        if (kept == NULL || pthread_setspecific(kept_key, kept) != 0) {
            free(kept);
            return NULL;
        }
    }
    kept->len = 0;
    return kept;
}

static int row_sha256(EVP_MD_CTX *ctx, EVP_MD *sha256, const uint8_t *row, size_t n,
                      uint8_t md[32]) {
#ifdef ROW_DIGEST_LOW_LEVEL
    (void)ctx;
    (void)sha256;
    SHA256_CTX c;
    return SHA256_Init(&c) && SHA256_Update(&c, row, n) && SHA256_Final(md, &c);
#else
    return EVP_DigestInit_ex2(ctx, sha256, NULL) && EVP_DigestUpdate(ctx, row, n) &&
           EVP_DigestFinal_ex(ctx, md, NULL);
#endif
}

typedef struct {
    uint8_t *data;   /* the RowBinary bytes: this thread's, valid until its next call */
    uint64_t length;
    uint64_t rows;   /* records converted (when declined: the record that was not) */
    uint8_t rows_digest[16]; /* the sum, little-endian */
} result_t;

static int convert(const uint8_t *in, size_t len, const int32_t *spec, int columns,
                   int64_t max_record_bytes, result_t *result) {
    out_t *kept = kept_buffer();
    result->data = NULL;
    result->length = 0;
    result->rows = 0;
    if (kept == NULL) return NO_MEMORY;
    out_t out = *kept; /* a local copy for the loop, stored back at the end */
    unsigned __int128 sum = 0;
    uint64_t rows = 0;
    int status = DONE;
#ifdef ROW_DIGEST_LOW_LEVEL
    EVP_MD_CTX *ctx = NULL; /* unused: see row_sha256 */
    EVP_MD *sha256 = NULL;
#else
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    EVP_MD *sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
    if (ctx == NULL || sha256 == NULL) status = NO_DIGEST;
#endif
    for (size_t at = 0; status == DONE && at < len;) {
        const uint8_t *line = in + at;
        const uint8_t *lf = memchr(line, '\n', len - at);
        if (lf == NULL) { /* the caller passes whole records only */
            status = DECLINED;
            break;
        }
        size_t line_n = (size_t)(lf - line);
        if (max_record_bytes > 0 && (int64_t)line_n + 1 > max_record_bytes) {
            status = DECLINED;
            break;
        }
        size_t row_start = out.len;
        const uint8_t *f = line;
        for (int col = 0; col < columns; col++) {
            const int32_t *c = spec + col * SPEC_WIDTH;
            size_t rest = (size_t)(lf - f);
            const uint8_t *tab = memchr(f, '\t', rest);
            int last = col == columns - 1;
            if (last ? tab != NULL : tab == NULL) {
                status = DECLINED; /* a record of the wrong width */
                break;
            }
            size_t n = last ? rest : (size_t)(tab - f);
            int nullable = c[4];
            if (!reserve(&out, 1)) {
                status = NO_MEMORY;
                break;
            }
            if (n == 0) {
                if (!nullable) {
                    status = DECLINED;
                    break;
                }
                out.data[out.len++] = 1;
            } else {
                if (nullable) out.data[out.len++] = 0;
                int ok = field_value(&out, c, f, n);
                if (ok < 0) {
                    status = NO_MEMORY;
                    break;
                }
                if (!ok) {
                    status = DECLINED;
                    break;
                }
            }
            f += n + 1;
        }
        if (status != DONE) break;
        uint8_t md[32];
        if (!row_sha256(ctx, sha256, out.data + row_start, out.len - row_start, md)) {
            status = NO_DIGEST;
            break;
        }
        unsigned __int128 term = 0;
        for (int i = 15; i >= 0; i--) term = term << 8 | md[i];
        sum += term;
        rows++;
        at += line_n + 1;
    }
    EVP_MD_free(sha256);
    EVP_MD_CTX_free(ctx);
    *kept = out; /* the buffer, grown or not, serves this thread's next call */
    result->rows = rows;
    if (status != DONE) return status;
    result->data = out.data;
    result->length = out.len;
    for (int i = 0; i < 16; i++) result->rows_digest[i] = (uint8_t)(sum >> (8 * i));
    return DONE;
}

/* Convert in[0..len), whole LF-terminated records, under spec (SPEC_WIDTH int32 per
 * column). Returns DONE (result filled), DECLINED, NO_MEMORY or NO_DIGEST. The result's
 * bytes belong to the calling thread and stay valid until its next call. */
int dpone_rowbinary_convert(const uint8_t *in, uint64_t len, const int32_t *spec, int columns,
                            int64_t max_record_bytes, result_t *result) {
    /* Numbers are read and written in the "C" locale whatever the process's is; the
     * change is this thread's alone and undone before returning. */
    pthread_once(&tables_once, build_tables);
    locale_t c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0);
    if (c_locale == (locale_t)0) return NO_MEMORY;
    locale_t previous = uselocale(c_locale);
    int status = convert(in, (size_t)len, spec, columns, max_record_bytes, result);
    uselocale(previous);
    freelocale(c_locale);
    return status;
}

/* 1 when this build can run here: little-endian, and SHA-256 available. */
int dpone_rowbinary_check(void) {
    const uint16_t one = 1;
    pthread_once(&tables_once, build_tables);
    EVP_MD *sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
    int ok = *(const uint8_t *)&one == 1 && sha256 != NULL;
    EVP_MD_free(sha256);
    return ok;
}
