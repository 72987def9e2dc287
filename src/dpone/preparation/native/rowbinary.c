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
 *
 * This file holds the records: the field dispatch, the per-thread buffer, the row
 * digest and the two exported entry points. The values are in values_text.c,
 * values_number.c and values_time.c; rowbinary.h is what they share.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <locale.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rowbinary.h"

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

/* build_tables (values_text.c) runs once, by the first call of either entry point. */
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

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
