/*
 * dpone's compiled renderer: driver rows (the Python objects sqlite3 and pymssql
 * return) to the bulk text format's record bytes, under the type policy.
 *
 * The second renderer beside the Python one (dpone.exporters.render with
 * dpone.connectors.bulk_text_codec), which stays the specification. It takes a row
 * only when it gives exactly the bytes the Python path gives for it: exact built-in
 * types (int, float, str, bytes, decimal.Decimal, datetime, date, time, uuid.UUID,
 * None), values its rules decide. Anything else, a subclass, a value the Python path
 * refuses, text UTF-8 cannot carry, is *declined*: the call stops before that row and
 * the caller renders it in Python, which writes it or names what is wrong. It never
 * names an error. Differential tests hold the two to the same bytes.
 *
 * A CPython extension module, not a ctypes library: its input is Python objects, and
 * reading them needs the C API (and the GIL) anyway. Where Python's own formatting
 * decides a value (repr of a float, format(Decimal, "f"), Decimal(str)), the same
 * function is called, so the text is Python's by construction.
 */
#include "render.h"

#include <datetime.h>
#include <math.h>
#include <string.h>

/* SQLite keeps a REAL in a NUMERIC column only when 15 significant digits round-trip. */
#define REVERSIBLE_DIGITS 15

static PyObject *decimal_type; /* decimal.Decimal */
static PyObject *uuid_type;    /* uuid.UUID */
static PyObject *format_f;     /* "f" */
static PyObject *int_name;     /* "int" */

/* ------------------------------------------------------------------------ buffer */

HIDDEN int reserve(buf_t *b, size_t more) {
    if (b->len + more <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 1 << 16;
    while (cap < b->len + more) cap *= 2;
    char *data = PyMem_Realloc(b->data, cap);
    if (data == NULL) return 0;
    b->data = data;
    b->cap = cap;
    return 1;
}

static void put(buf_t *b, const char *s, size_t n) { /* room reserved by the caller */
    memcpy(b->data + b->len, s, n);
    b->len += n;
}

HIDDEN int append(buf_t *b, const char *s, size_t n) {
    if (!reserve(b, n)) return 0;
    put(b, s, n);
    return 1;
}

HIDDEN const char EMPTY_MARKER[2] = {0x1d, 'E'};
/* A hex digit in either case, lowercased; 0 for any other character. Filled by the
 * module's initialisation. */
HIDDEN char GUID_CHAR[256];
HIDDEN const char HEXDIGITS[] = "0123456789abcdef";

/* ------------------------------------------------------------------------ text */

/* The escape letter of a character the producer escapes, or 0: also exactly the
 * characters a raw field may not hold (the codec's encode_raw). */
HIDDEN char escape_of(Py_UCS4 c) {
    switch (c) {
    case 0x1d: return 'P';
    case '\t': return 'T';
    case '\r': return 'R';
    case '\n': return 'N';
    case 0x1f: return 'U';
    case 0x1e: return 'S';
    default: return 0;
    }
}

/* Append the UTF-8 of an exact str: escaped (a text field) or checked (a raw field).
 * 0 declines: a lone surrogate (UTF-8 cannot encode it), a reserved character of a
 * raw field, an empty raw field; -1 is out of memory. */
static int put_str(buf_t *b, PyObject *s, int escape) {
    if (PyUnicode_READY(s) < 0) return -1;
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    if (n == 0) {
        if (!escape) return 0;
        return append(b, EMPTY_MARKER, 2) ? 1 : -1;
    }
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    /* At most 4 bytes a character (an escape is 2 bytes for 1). */
    if (!reserve(b, (size_t)n * (kind == PyUnicode_1BYTE_KIND ? 2 : 4))) return -1;
    char *o = b->data + b->len;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c < 0x80) {
            if (c < 0x20) {
                char letter = escape_of(c);
                if (letter) {
                    if (!escape) return 0;
                    *o++ = 0x1d;
                    *o++ = letter;
                    continue;
                }
            }
            *o++ = (char)c;
        } else if (c < 0x800) {
            *o++ = (char)(0xc0 | (c >> 6));
            *o++ = (char)(0x80 | (c & 0x3f));
        } else if (c < 0x10000) {
            if (c >= 0xd800 && c <= 0xdfff) return 0;
            *o++ = (char)(0xe0 | (c >> 12));
            *o++ = (char)(0x80 | ((c >> 6) & 0x3f));
            *o++ = (char)(0x80 | (c & 0x3f));
        } else {
            *o++ = (char)(0xf0 | (c >> 18));
            *o++ = (char)(0x80 | ((c >> 12) & 0x3f));
            *o++ = (char)(0x80 | ((c >> 6) & 0x3f));
            *o++ = (char)(0x80 | (c & 0x3f));
        }
    }
    b->len = (size_t)(o - b->data);
    return 1;
}

/* A raw field's text: an exact str passed through, checked as encode_raw checks it. */
static int put_raw(buf_t *b, PyObject *s) {
    return put_str(b, s, 0);
}

static int put_binary(buf_t *b, PyObject *v) {
    Py_ssize_t n = PyBytes_GET_SIZE(v);
    if (n == 0) return append(b, EMPTY_MARKER, 2) ? 1 : -1;
    if (!reserve(b, (size_t)n * 2)) return -1;
    const unsigned char *s = (const unsigned char *)PyBytes_AS_STRING(v);
    char *o = b->data + b->len;
    for (Py_ssize_t i = 0; i < n; i++) {
        *o++ = HEXDIGITS[s[i] >> 4];
        *o++ = HEXDIGITS[s[i] & 15];
    }
    b->len += (size_t)n * 2;
    return 1;
}

/* ------------------------------------------------------------------------ numbers */

/* str(x) of an integer. */
HIDDEN int put_int64(buf_t *b, long long x) {
    char digits[24];
    char *end = digits + sizeof digits, *p = end;
    /* Through the unsigned magnitude, so that the most negative value has one too. */
    unsigned long long m = x < 0 ? 0ULL - (unsigned long long)x : (unsigned long long)x;
    do {
        *--p = (char)('0' + m % 10);
        m /= 10;
    } while (m);
    if (x < 0) *--p = '-';
    return append(b, p, (size_t)(end - p)) ? 1 : -1;
}

/* str(v) of an exact int: digits from a C integer, or Python's str for a big one. */
static int put_int(buf_t *b, PyObject *v) {
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow) {
        PyObject *text = PyObject_Str(v); /* may refuse (the digit limit): declined */
        if (text == NULL) {
            PyErr_Clear();
            return 0;
        }
        int done = put_raw(b, text);
        Py_DECREF(text);
        return done;
    }
    if (x == -1 && PyErr_Occurred()) return -1;
    return put_int64(b, x);
}

static const double POW10[19] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8, 1e9,
                                  1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18};

/* repr(v) without dtoa, when it is plain with at most 15 significant digits (and
 * 1e-4 <= |v| < 1e15, where repr never writes an exponent): the length written to
 * out (at most 1 + 15 + 1 + 18 bytes), or 0 to leave it to dtoa.
 *
 * Why it is repr: for each count of decimals s, the integers r within half an ulp of
 * |v| * 10**s are the s-decimal texts that read back as v. With at most 15 digits an
 * ulp of |v| * 10**s is below 0.25, so there is at most one, the nearest integer to
 * the (correctly rounded) product, and r / 10**s, both exact doubles, reads back
 * through IEEE division exactly as float(text) does. The first s that works gives
 * the fewest digits, which is repr's shortest round-trip text (unique at that
 * length, so also its nearest). */
static int plain_repr(double v, char *out) {
    double a = fabs(v);
    if (!(a >= 1e-4 && a < 1e15)) return 0;
    for (int s = 0; s <= 18; s++) {
        double m = a * POW10[s];
        if (m >= 1e15) return 0;
        double r = nearbyint(m);
        if (r / POW10[s] != a) continue;
        uint64_t digits = (uint64_t)r, unit = (uint64_t)POW10[s];
        uint64_t whole = digits / unit, part = digits % unit;
        char tmp[24], *end = tmp + sizeof tmp, *p = end;
        if (s == 0) *--p = '0';
        for (int i = 0; i < s; i++) {
            *--p = (char)('0' + part % 10);
            part /= 10;
        }
        *--p = '.';
        do {
            *--p = (char)('0' + whole % 10);
            whole /= 10;
        } while (whole);
        if (v < 0) *--p = '-';
        memcpy(out, p, (size_t)(end - p));
        return (int)(end - p);
    }
    return 0;
}

/* repr(v) of a float, as float.__repr__ writes it. */
HIDDEN int put_repr(buf_t *b, double v) {
    char fast[40];
    int n = plain_repr(v, fast);
    if (n) return append(b, fast, (size_t)n) ? 1 : -1;
    char *text = PyOS_double_to_string(v, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (text == NULL) return -1;
    int done = append(b, text, strlen(text)) ? 1 : -1;
    PyMem_Free(text);
    return done;
}

/* Whether a float's repr text is plain (-?digits.digits) with at most 15 significant
 * digits, counted as render._decimal counts them: every digit after the leading
 * zeros, the zero of a whole number's ".0" too. */
static int plain_decimal(const char *text) {
    const char *p = text + (text[0] == '-');
    int plain = 1, dot = 0, significant = 0, leading = 1;
    for (const char *q = p; *q; q++) {
        if (*q == '.') {
            plain = plain && !dot && q != p && q[1] != '\0';
            dot = 1;
        } else if (*q >= '0' && *q <= '9') {
            if (*q != '0') leading = 0;
            if (!leading) significant++;
        } else {
            plain = 0;
        }
    }
    return plain && dot && significant <= REVERSIBLE_DIGITS;
}

/* A float in a decimal column: its shortest text when plain_decimal, negative zero
 * written as zero. Any other text (an exponent, nan, inf) is the Python path's, and
 * so is a refusal. */
HIDDEN int put_float_decimal(buf_t *b, double v) {
    char fast[40];
    int n = plain_repr(v, fast);
    if (n) { /* never zero */
        fast[n] = '\0';
        return plain_decimal(fast) ? (append(b, fast, (size_t)n) ? 1 : -1) : 0;
    }
    char *text = PyOS_double_to_string(v, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (text == NULL) return -1;
    int done = 0;
    if (plain_decimal(text)) {
        const char *out = text[0] == '-' && v == 0 ? text + 1 : text;
        done = append(b, out, strlen(out)) ? 1 : -1;
    }
    PyMem_Free(text);
    return done;
}

/* format(d, "f") of an exact Decimal (or of Decimal(str)), negative zero as zero;
 * not finite is the Python path's refusal. */
static int put_decimal(buf_t *b, PyObject *d) {
    PyObject *text = PyObject_Format(d, format_f);
    if (text == NULL) {
        PyErr_Clear();
        return 0;
    }
    int done = 0;
    if (PyUnicode_IS_ASCII(text)) {
        const char *s = (const char *)PyUnicode_DATA(text);
        Py_ssize_t n = PyUnicode_GET_LENGTH(text);
        int finite = n > 0, zero = 1;
        for (Py_ssize_t i = 0; i < n; i++) {
            char c = s[i];
            if (c >= '1' && c <= '9') zero = 0;
            else if (!(c == '0' || c == '.' || (c == '-' && i == 0))) finite = 0;
        }
        if (finite) {
            size_t skip = s[0] == '-' && zero;
            done = append(b, s + skip, (size_t)n - skip) ? 1 : -1;
        }
    }
    Py_DECREF(text);
    return done;
}

static int decimal_cell(buf_t *b, PyObject *v) {
    PyTypeObject *t = Py_TYPE(v);
    if (t == &PyLong_Type) return put_int(b, v);
    if (t == &PyFloat_Type) return put_float_decimal(b, PyFloat_AS_DOUBLE(v));
    if (t == (PyTypeObject *)decimal_type) return put_decimal(b, v);
    if (t == &PyUnicode_Type) {
        PyObject *d = PyObject_CallOneArg(decimal_type, v);
        if (d == NULL) {
            PyErr_Clear();
            return 0;
        }
        int done = put_decimal(b, d);
        Py_DECREF(d);
        return done;
    }
    return 0;
}

/* A binary64 that widens back unchanged from binary32 (struct's '<f' round trip). */
static int is_binary32(double v) {
    if (!isfinite(v)) return 0;
    float y = (float)v;
    return !isinf(y) && (double)y == v;
}

/* The shortest text naming the binary32 v: typepolicy.converters.shortest_float32. */
HIDDEN int put_float32(buf_t *b, double v) {
    if (!is_binary32(v)) return 0;
    if (v == 0) return signbit(v) ? (append(b, "-0.0", 4) ? 1 : -1) : (append(b, "0.0", 3) ? 1 : -1);
    for (int digits = 1; digits < 10; digits++) {
        char *text = PyOS_double_to_string(v, 'g', digits, 0, NULL);
        if (text == NULL) return -1;
        double back = PyOS_string_to_double(text, NULL, NULL);
        PyMem_Free(text);
        if (back == -1.0 && PyErr_Occurred()) return -1;
        float y = (float)back;
        if (isinf(y) && !isinf(back)) continue; /* struct.pack's OverflowError */
        if ((double)y == v) return put_repr(b, back);
    }
    return put_repr(b, v);
}

/* ------------------------------------------------------------------------ times */

/* value (0 <= value < 10**width) in exactly width digits, zero-padded. */
static char *digits_of(char *o, int value, int width) {
    for (int i = width - 1; i >= 0; i--) {
        o[i] = (char)('0' + value % 10);
        value /= 10;
    }
    return o + width;
}

/* _fraction: "." and the first digits of f"{microsecond:06d}0", none for 0 digits. */
static int put_fraction(buf_t *b, int microsecond, int digits) {
    if (digits == 0) return 1;
    char text[8];
    text[0] = '.';
    digits_of(text + 1, microsecond, 6);
    text[7] = '0';
    return append(b, text, (size_t)digits + 1) ? 1 : -1;
}

/* "YYYY-MM-DD" (the year 1 to 9999) */
static char *date_of(char *o, int year, int month, int day) {
    o = digits_of(o, year, 4);
    *o++ = '-';
    o = digits_of(o, month, 2);
    *o++ = '-';
    return digits_of(o, day, 2);
}

/* "HH:MM:SS" */
static char *clock_of(char *o, int hour, int minute, int second) {
    o = digits_of(o, hour, 2);
    *o++ = ':';
    o = digits_of(o, minute, 2);
    *o++ = ':';
    return digits_of(o, second, 2);
}

/* A datetime without tzinfo as "%Y-%m-%d %H:%M:%S" and its fraction. strftime writes
 * a year before 1000 without padding: such years are the Python path's. */
static int put_datetime(buf_t *b, PyObject *v, int digits) {
    if (PyDateTime_DATE_GET_TZINFO(v) != Py_None) return 0;
    int year = PyDateTime_GET_YEAR(v);
    if (year < 1000) return 0;
    int us = PyDateTime_DATE_GET_MICROSECOND(v);
    char text[19];
    char *o = date_of(text, year, PyDateTime_GET_MONTH(v), PyDateTime_GET_DAY(v));
    *o++ = ' ';
    clock_of(o, PyDateTime_DATE_GET_HOUR(v), PyDateTime_DATE_GET_MINUTE(v),
             PyDateTime_DATE_GET_SECOND(v));
    if (!append(b, text, sizeof text)) return -1;
    if (digits == 3 && us % 1000) digits = 7; /* not a whole millisecond: all of it */
    return put_fraction(b, us, digits);
}

static int put_time(buf_t *b, PyObject *v) {
    if (PyDateTime_TIME_GET_TZINFO(v) != Py_None) return 0;
    char text[8];
    clock_of(text, PyDateTime_TIME_GET_HOUR(v), PyDateTime_TIME_GET_MINUTE(v),
             PyDateTime_TIME_GET_SECOND(v));
    if (!append(b, text, sizeof text)) return -1;
    return put_fraction(b, PyDateTime_TIME_GET_MICROSECOND(v), 7);
}

static int put_date(buf_t *b, PyObject *v) {
    char text[10];
    date_of(text, PyDateTime_GET_YEAR(v), PyDateTime_GET_MONTH(v), PyDateTime_GET_DAY(v));
    return append(b, text, sizeof text) ? 1 : -1;
}

/* ------------------------------------------------------------------------ GUIDs */

/* A GUID's text in the 8-4-4-4-12 form, in any case: lowercased. Any other form is
 * the Python path's (uuid.UUID parses braces, no dashes, urn:uuid:). */
static int put_guid_text(buf_t *b, PyObject *s) {
    if (PyUnicode_READY(s) < 0) return -1;
    if (!PyUnicode_IS_ASCII(s) || PyUnicode_GET_LENGTH(s) != 36) return 0;
    const Py_UCS1 *c = PyUnicode_1BYTE_DATA(s);
    if (!reserve(b, 36)) return -1;
    char *o = b->data + b->len;
    for (int i = 0; i < 36; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            if (c[i] != '-') return 0;
            o[i] = '-';
        } else if (!(o[i] = GUID_CHAR[c[i]])) {
            return 0;
        }
    }
    b->len += 36;
    return 1;
}

/* str(u) of an exact uuid.UUID: '%032x' of u.int with four dashes. */
static int put_uuid(buf_t *b, PyObject *u) {
    PyObject *number = PyObject_GetAttr(u, int_name);
    if (number == NULL) {
        PyErr_Clear();
        return 0;
    }
    unsigned char bytes[16];
    int failed = !PyLong_CheckExact(number) ||
#if PY_VERSION_HEX >= 0x030d0000
                 _PyLong_AsByteArray((PyLongObject *)number, bytes, 16, 0, 0, 0) < 0;
#else
                 _PyLong_AsByteArray((PyLongObject *)number, bytes, 16, 0, 0) < 0;
#endif
    Py_DECREF(number);
    if (failed) {
        PyErr_Clear();
        return 0;
    }
    if (!reserve(b, 36)) return -1;
    for (int i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10) b->data[b->len++] = '-';
        b->data[b->len++] = HEXDIGITS[bytes[i] >> 4];
        b->data[b->len++] = HEXDIGITS[bytes[i] & 15];
    }
    return 1;
}

/* ------------------------------------------------------------------------ cells */

/* One non-NULL cell: 1 written, 0 declined (nothing of it kept), -1 an error set. */
HIDDEN int cell(buf_t *b, int op, PyObject *v) {
    PyTypeObject *t = Py_TYPE(v);
    int str = t == &PyUnicode_Type;
    switch (op) {
    case OP_INTEGER:
        return t == &PyLong_Type ? put_int(b, v) : 0;
    case OP_BIT:
        if (v == Py_True || v == Py_False) return append(b, v == Py_True ? "1" : "0", 1) ? 1 : -1;
        if (t == &PyLong_Type) {
            int overflow = 0;
            long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
            if (!overflow && (x == 0 || x == 1)) return append(b, x ? "1" : "0", 1) ? 1 : -1;
        }
        return 0;
    case OP_DECIMAL:
        return decimal_cell(b, v);
    case OP_FLOAT64:
        return t == &PyFloat_Type ? put_repr(b, PyFloat_AS_DOUBLE(v)) : 0;
    case OP_FLOAT32:
        return t == &PyFloat_Type ? put_float32(b, PyFloat_AS_DOUBLE(v)) : 0;
    case OP_DATE:
        return str ? put_raw(b, v) : PyDate_CheckExact(v) ? put_date(b, v) : 0;
    case OP_DATETIME7:
    case OP_DATETIME3:
    case OP_DATETIME0:
        if (str) return put_raw(b, v);
        if (!PyDateTime_CheckExact(v)) return 0;
        return put_datetime(b, v, op == OP_DATETIME7 ? 7 : op == OP_DATETIME3 ? 3 : 0);
    case OP_DATETIMEOFFSET:
        return str ? put_raw(b, v) : 0;
    case OP_TIME:
        return str ? put_raw(b, v) : PyTime_CheckExact(v) ? put_time(b, v) : 0;
    case OP_UUID:
        if (str) return put_guid_text(b, v);
        return t == (PyTypeObject *)uuid_type ? put_uuid(b, v) : 0;
    case OP_TEXT:
        return str ? put_str(b, v, 1) : 0;
    case OP_BINARY:
        return t == &PyBytes_Type ? put_binary(b, v) : 0;
    default:
        return 0;
    }
}

static PyObject *attribute_of(const char *module_name, const char *name) {
    PyObject *m = PyImport_ImportModule(module_name);
    if (m == NULL) return NULL;
    PyObject *value = PyObject_GetAttrString(m, name);
    Py_DECREF(m);
    return value;
}

HIDDEN int init_cells(void) {
    for (int c = 0; c < 256; c++) {
        GUID_CHAR[c] = (char)((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') ? c
                              : c >= 'A' && c <= 'F' ? c - 'A' + 'a' : 0);
    }
    PyDateTime_IMPORT;
    if (PyDateTimeAPI == NULL) return -1;
    decimal_type = attribute_of("decimal", "Decimal");
    uuid_type = attribute_of("uuid", "UUID");
    format_f = PyUnicode_InternFromString("f");
    int_name = PyUnicode_InternFromString("int");
    if (!decimal_type || !uuid_type || !format_f || !int_name) return -1;
    if (!PyType_Check(decimal_type) || !PyType_Check(uuid_type)) {
        PyErr_SetString(PyExc_ImportError, "decimal.Decimal or uuid.UUID is not a type");
        return -1;
    }
    return 0;
}
