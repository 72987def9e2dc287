/*
 * Number values: (U)Int of the given bits, Decimal(P, S) up to P = 38, and
 * Float64/Float32 held to the reference's correctly rounded reading.
 */
#include <math.h>
#include <stdio.h>

#include "rowbinary.h"

/* Longer numbers are left to the other converters (the reference takes any length). */
#define MAX_FLOAT_TEXT 400

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

HIDDEN int int_value(out_t *out, const uint8_t *f, size_t n, int bits, int is_signed) {
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
HIDDEN int decimal_value(out_t *out, const uint8_t *f, size_t n, int precision, int scale) {
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

/* The correctly rounded binary64 of grammar-checked text (glibc's strtod is exact; the
 * calling thread's locale is "C" for the call, see dpone_rowbinary_convert). */
static int parse_double(const uint8_t *f, size_t n, double *value) {
    char text[MAX_FLOAT_TEXT + 1];
    if (n > MAX_FLOAT_TEXT || !float_grammar(f, n)) return 0;
    if (fast_double(f, n, value)) return isfinite(*value);
    memcpy(text, f, n);
    text[n] = 0;
    *value = strtod(text, NULL);
    return isfinite(*value);
}

HIDDEN int float64_value(out_t *out, const uint8_t *f, size_t n) {
    double v;
    if (!parse_double(f, n, &v)) return 0;
    put(out, &v, 8);
    return 1;
}

/* Float32: the binary64 of the text rounded to binary32 (to nearest, as Python's
 * struct does), taken when it is exactly that binary64, or when the binary64 of the
 * shortest text naming the binary32 (the reference's shortest_float32) is. */
HIDDEN int float32_value(out_t *out, const uint8_t *f, size_t n) {
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
