/*
 * Text and binary values: strict UTF-8 text with the bulk text format's escapes, and
 * hex binary, each to String or FixedString(n). Also the byte tables the other value
 * files share (see rowbinary.h).
 */
#include "rowbinary.h"
#include "utf8.h"

HIDDEN int8_t HEX[256];
HIDDEN uint8_t TEXT_SPECIAL[256];

HIDDEN void build_tables(void) {
    for (int c = 0; c < 256; c++) {
        HEX[c] = c >= '0' && c <= '9' ? (int8_t)(c - '0')
               : c >= 'a' && c <= 'f' ? (int8_t)(c - 'a' + 10)
               : c >= 'A' && c <= 'F' ? (int8_t)(c - 'A' + 10) : -1;
        TEXT_SPECIAL[c] = c >= 0x80 || c == '\r' || c == 0x1d || c == 0x1e || c == 0x1f;
    }
}


/* The empty marker (U+001D then 'E', the whole field) of a text or binary field: an
 * empty String, or a FixedString(0) (a wider FixedString cannot be empty). */
static int is_empty_marker(const uint8_t *f, size_t n) {
    return n == 2 && f[0] == 0x1d && f[1] == 'E';
}

static int empty_value(out_t *out, int fixed, int64_t width) {
    if (fixed) return width == 0;
    out->data[out->len++] = 0;
    return 1;
}

/* A text field: strict UTF-8, no raw CR, U+001E or U+001F, and U+001D only as one of
 * the six escapes (or the whole field the empty marker). Writes the decoded bytes
 * with the String or FixedString(n) encoding. */
HIDDEN int text_value(out_t *out, const uint8_t *f, size_t n, int fixed, int64_t width) {
    if (is_empty_marker(f, n)) return empty_value(out, fixed, width);
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
HIDDEN int binary_value(out_t *out, const uint8_t *f, size_t n, int fixed, int64_t width) {
    if (is_empty_marker(f, n)) return empty_value(out, fixed, width);
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
