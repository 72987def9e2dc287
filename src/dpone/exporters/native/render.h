/*
 * What the compiled renderer's files share: the column operations, the output
 * buffer, the cell functions of render.c and the SQLite reader's registration
 * (sqlite_rows.c); module.c is the module itself.
 */
#ifndef DPONE_RENDER_H
#define DPONE_RENDER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>

#define HIDDEN __attribute__((visibility("hidden")))

/* Column operations, as dpone.exporters.native_render numbers them. */
enum {
    OP_INTEGER = 1, OP_BIT, OP_DECIMAL, OP_FLOAT64, OP_FLOAT32, OP_DATE, OP_DATETIME7,
    OP_DATETIME3, OP_DATETIME0, OP_DATETIMEOFFSET, OP_TIME, OP_UUID, OP_TEXT, OP_BINARY,
    OP_LAST = OP_BINARY
};

typedef struct {
    char *data;
    size_t len, cap;
} buf_t;

HIDDEN int reserve(buf_t *b, size_t more);
HIDDEN int append(buf_t *b, const char *s, size_t n);

extern HIDDEN const char EMPTY_MARKER[2];
extern HIDDEN const char HEXDIGITS[];
extern HIDDEN char GUID_CHAR[256];

/* The escape letter of a character the bulk text producer escapes, or 0. */
HIDDEN char escape_of(Py_UCS4 c);

/* The cell functions: 1 written, 0 declined (nothing of the value kept), -1 an error
 * is set. cell() takes any Python value for a column's operation. */
HIDDEN int put_int64(buf_t *b, long long x);
HIDDEN int put_repr(buf_t *b, double v);
HIDDEN int put_float_decimal(buf_t *b, double v);
HIDDEN int put_float32(buf_t *b, double v);
HIDDEN int cell(buf_t *b, int op, PyObject *v);

/* Sets up what the cell functions use (render.c): 0, or -1 with an error set. */
HIDDEN int init_cells(void);

/* Adds the SqliteRows type (sqlite_rows.c) to the module: 0, or -1 with an error set. */
HIDDEN int add_sqlite_rows(PyObject *module);

#endif
