/*
 * What the compiled converter's files share (private: no Python or other caller
 * includes it). The output buffer and its small writers, the byte tables and digit
 * helpers, and the value functions each family file defines. Everything declared here
 * is hidden, so the library exports only the two entry points of rowbinary.c.
 */
#ifndef DPONE_ROWBINARY_H
#define DPONE_ROWBINARY_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Shared across this folder's files, never exported from the library. */
#define HIDDEN __attribute__((visibility("hidden")))

/* The RowBinary being written: data[0..len) of cap bytes. */
typedef struct {
    uint8_t *data;
    size_t len, cap;
} out_t;

/* Room for `more` bytes: 0 when memory runs out. The writers below assume it. */
static inline int reserve(out_t *out, size_t more) {
    if (out->len + more <= out->cap) return 1;
    size_t cap = out->cap ? out->cap : 1 << 16;
    while (cap < out->len + more) cap *= 2;
    uint8_t *grown = realloc(out->data, cap);
    if (grown == NULL) return 0;
    out->data = grown;
    out->cap = cap;
    return 1;
}

static inline void put(out_t *out, const void *bytes, size_t n) {
    memcpy(out->data + out->len, bytes, n);
    out->len += n;
}

/* Little-endian bytes of a two's-complement integer (this code runs on little-endian
 * machines only: checked by dpone_rowbinary_check). */
static inline void put_int(out_t *out, __int128 value, size_t width) {
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

static inline void put_leb128(out_t *out, size_t n) {
    do {
        uint8_t b = n & 0x7f;
        n >>= 7;
        if (n) b |= 0x80;
        out->data[out->len++] = b;
    } while (n);
}

/* Hex digit values (either case) and -1 for every other byte; and 1 for the bytes a
 * text field may not hold raw (CR, U+001E, U+001F), that start an escape (U+001D) or
 * that start a multi-byte sequence. Defined in values_text.c and filled once by
 * build_tables, which the entry points run first (through pthread_once). */
extern HIDDEN int8_t HEX[256];
extern HIDDEN uint8_t TEXT_SPECIAL[256];
HIDDEN void build_tables(void);

static inline int hex_value(uint8_t c) { return HEX[c]; }

static inline int is_digit(uint8_t c) { return c >= '0' && c <= '9'; }

/* Digits s[0..n) as a number (n small enough not to overflow the caller's use). */
static inline int64_t digits_value(const uint8_t *s, size_t n) {
    int64_t v = 0;
    for (size_t i = 0; i < n; i++) v = v * 10 + (s[i] - '0');
    return v;
}

static inline int all_digits(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!is_digit(s[i])) return 0;
    return 1;
}

static inline int all_zeros(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != '0') return 0;
    return 1;
}

/* The value functions: each takes the field f[0..n) (n >= 1, a NULL already written
 * apart), writes its RowBinary to out (which has room for n + 40 bytes) and returns 1,
 * or returns 0: the value is not one this code takes, and the range is declined. */

/* values_text.c: String and FixedString(width) from a text or a binary (hex) field. */
HIDDEN int text_value(out_t *out, const uint8_t *f, size_t n, int fixed, int64_t width);
HIDDEN int binary_value(out_t *out, const uint8_t *f, size_t n, int fixed, int64_t width);

/* values_number.c: (U)Int of `bits`, Decimal(P, S) up to P = 38, Float64 and Float32. */
HIDDEN int int_value(out_t *out, const uint8_t *f, size_t n, int bits, int is_signed);
HIDDEN int decimal_value(out_t *out, const uint8_t *f, size_t n, int precision, int scale);
HIDDEN int float64_value(out_t *out, const uint8_t *f, size_t n);
HIDDEN int float32_value(out_t *out, const uint8_t *f, size_t n);

/* values_time.c: Date32, DateTime64 (whole: whole minutes only), Time64, a
 * datetimeoffset as (UTC instant, offset minutes), and UUID. */
HIDDEN int date_value(out_t *out, const uint8_t *f, size_t n);
HIDDEN int datetime_value(out_t *out, const uint8_t *f, size_t n, int precision, int whole);
HIDDEN int time_value(out_t *out, const uint8_t *f, size_t n, int precision);
HIDDEN int dto_value(out_t *out, const uint8_t *f, size_t n, int precision);
HIDDEN int uuid_value(out_t *out, const uint8_t *f, size_t n);

#endif
