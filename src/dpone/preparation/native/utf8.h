/* Strict UTF-8, shared by dpone's compiled parts (the RowBinary converter here and the
 * export renderer's SQLite reader): one definition of what Python's decoder accepts. */
#ifndef DPONE_UTF8_H
#define DPONE_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Length of the valid UTF-8 sequence at s (strict, as Python's decoder: no overlong
 * forms, no surrogates, nothing above U+10FFFF), or 0. */
static inline size_t utf8_sequence(const uint8_t *s, size_t n) {
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

#endif
