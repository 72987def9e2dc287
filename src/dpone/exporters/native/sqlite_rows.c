/*
 * The compiled SQLite reader: a SELECT's rows rendered straight from SQLite's values
 * into bulk text records, without a Python object per value.
 *
 * It stands for Python's sqlite3 module followed by the Python renderer, and gives
 * their exact bytes: each value is the one sqlite3 would hand over (INTEGER an int,
 * REAL a float, TEXT the str of its strict UTF-8, BLOB bytes, NULL None), rendered by
 * the same rules as render.c's cell(). A value those rules do not decide from SQLite's
 * own representation is made into that Python object and given to cell(); a row cell()
 * declines is made into the tuple sqlite3 would return and handed back, for the Python
 * renderer to write or refuse. Whatever sqlite3 itself would refuse (text that is not
 * UTF-8, an error while stepping, a database it cannot open) raises Declined: the
 * caller exports the table again through sqlite3, which names the error.
 *
 * The connection is opened as dpone's SqliteSource opens its own: the same file: URI
 * (mode=ro), read-only, and the 5 s busy timeout of sqlite3.connect's default.
 */
#include "render.h"

#include <sqlite3.h>
#include <string.h>
#include "../../preparation/native/utf8.h"

static PyObject *declined; /* the Declined exception */

typedef struct {
    PyObject_HEAD
    sqlite3 *db;
    sqlite3_stmt *stmt;
    unsigned char *ops;
    int columns;
    int finished;
} RowsObject;

/* Outcomes of a SQLite value rendered directly, besides 1 written and -1 an error. */
#define UNDECIDED 0 /* for cell(), through the Python object sqlite3 would make */
#define NOT_UTF8 2  /* sqlite3 would refuse the text: the whole read is declined */

static void finish(RowsObject *self) {
    if (self->stmt) sqlite3_finalize(self->stmt);
    if (self->db) sqlite3_close(self->db);
    self->stmt = NULL;
    self->db = NULL;
    self->finished = 1;
}


static int is_utf8(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = utf8_sequence(s + i, n - i);
        if (k == 0) return 0;
        i += k;
    }
    return 1;
}

/* A text value's UTF-8 as a text field (escape) or a raw field (checked, 0 when the
 * codec would refuse it), as render.c's put_str does with the decoded str. */
static int text_field(buf_t *b, const unsigned char *s, size_t n, int escape) {
    if (n == 0) {
        if (!escape) return UNDECIDED;
        return append(b, EMPTY_MARKER, 2) ? 1 : -1;
    }
    if (!reserve(b, n * 2)) return -1;
    char *o = b->data + b->len;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = s[i];
        char letter = c < 0x20 ? escape_of(c) : 0;
        if (letter) {
            if (!escape) return UNDECIDED;
            *o++ = 0x1d;
            *o++ = letter;
        } else {
            *o++ = (char)c;
        }
    }
    b->len = (size_t)(o - b->data);
    return 1;
}

static int guid_field(buf_t *b, const unsigned char *s, size_t n) {
    if (n != 36) return UNDECIDED;
    if (!reserve(b, 36)) return -1;
    char *o = b->data + b->len;
    for (int i = 0; i < 36; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            if (s[i] != '-') return UNDECIDED;
            o[i] = '-';
        } else if (!(o[i] = GUID_CHAR[s[i]])) {
            return UNDECIDED;
        }
    }
    b->len += 36;
    return 1;
}

static int text_value(buf_t *b, int op, sqlite3_stmt *st, int i) {
    const unsigned char *s = sqlite3_column_text(st, i);
    size_t n = (size_t)sqlite3_column_bytes(st, i);
    if (s == NULL) return n == 0 ? UNDECIDED : -1;
    if (!is_utf8(s, n)) return NOT_UTF8;
    switch (op) {
    case OP_TEXT:
        return text_field(b, s, n, 1);
    case OP_DATE:
    case OP_DATETIME7:
    case OP_DATETIME3:
    case OP_DATETIME0:
    case OP_DATETIMEOFFSET:
    case OP_TIME:
        return text_field(b, s, n, 0);
    case OP_UUID:
        return guid_field(b, s, n);
    default:
        return UNDECIDED;
    }
}

/* One value decided from SQLite's representation, when the rules allow it. */
static int direct_value(buf_t *b, int op, sqlite3_stmt *st, int i, int type) {
    if (type == SQLITE_INTEGER) {
        long long x = sqlite3_column_int64(st, i);
        if (op == OP_INTEGER || op == OP_DECIMAL) return put_int64(b, x);
        if (op == OP_BIT && (x == 0 || x == 1)) return append(b, x ? "1" : "0", 1) ? 1 : -1;
        return UNDECIDED;
    }
    if (type == SQLITE_FLOAT) {
        double v = sqlite3_column_double(st, i);
        if (op == OP_FLOAT64) return put_repr(b, v);
        if (op == OP_DECIMAL) return put_float_decimal(b, v);
        if (op == OP_FLOAT32) return put_float32(b, v);
        return UNDECIDED;
    }
    if (type == SQLITE_TEXT) return text_value(b, op, st, i);
    if (op != OP_BINARY) return UNDECIDED;
    const unsigned char *p = sqlite3_column_blob(st, i);
    size_t n = (size_t)sqlite3_column_bytes(st, i);
    if (n == 0) return append(b, EMPTY_MARKER, 2) ? 1 : -1;
    if (p == NULL || !reserve(b, n * 2)) return -1;
    for (size_t k = 0; k < n; k++) {
        b->data[b->len++] = HEXDIGITS[p[k] >> 4];
        b->data[b->len++] = HEXDIGITS[p[k] & 15];
    }
    return 1;
}

/* The Python object sqlite3's cursor makes of value i (NULL: an error is set, a text
 * that is not UTF-8 among them, as sqlite3 refuses it too). */
static PyObject *value_object(sqlite3_stmt *st, int i) {
    switch (sqlite3_column_type(st, i)) {
    case SQLITE_NULL:
        Py_RETURN_NONE;
    case SQLITE_INTEGER:
        return PyLong_FromLongLong(sqlite3_column_int64(st, i));
    case SQLITE_FLOAT:
        return PyFloat_FromDouble(sqlite3_column_double(st, i));
    case SQLITE_TEXT: {
        const char *s = (const char *)sqlite3_column_text(st, i);
        int n = sqlite3_column_bytes(st, i);
        if (s == NULL && n) return PyErr_NoMemory();
        return PyUnicode_FromStringAndSize(s ? s : "", n);
    }
    default: {
        const char *p = sqlite3_column_blob(st, i);
        int n = sqlite3_column_bytes(st, i);
        if (p == NULL && n) return PyErr_NoMemory();
        return PyBytes_FromStringAndSize(p ? p : "", n);
    }
    }
}

/* The row as sqlite3 returns it; NULL with Declined set when it would refuse it. */
static PyObject *row_tuple(RowsObject *self) {
    PyObject *row = PyTuple_New(self->columns);
    if (row == NULL) return NULL;
    for (int i = 0; i < self->columns; i++) {
        PyObject *v = value_object(self->stmt, i);
        if (v == NULL) {
            Py_DECREF(row);
            PyErr_Clear();
            PyErr_SetString(declined, "sqlite3 would refuse a value of this row");
            return NULL;
        }
        PyTuple_SET_ITEM(row, i, v);
    }
    return row;
}

/* The current row's record appended: 1, 0 declined (nothing of it kept), -1 error, or
 * NOT_UTF8. */
static int render_row(RowsObject *self, buf_t *b) {
    size_t start = b->len;
    for (int i = 0; i < self->columns; i++) {
        int type = sqlite3_column_type(self->stmt, i);
        if (type != SQLITE_NULL) {
            int done = direct_value(b, self->ops[i], self->stmt, i, type);
            if (done == UNDECIDED) {
                PyObject *v = value_object(self->stmt, i);
                if (v == NULL) {
                    PyErr_Clear();
                    done = NOT_UTF8;
                } else {
                    done = cell(b, self->ops[i], v);
                    Py_DECREF(v);
                }
            }
            if (done != 1) {
                b->len = start;
                return done;
            }
        }
        if (!append(b, i + 1 < self->columns ? "\t" : "\n", 1)) return -1;
    }
    return 1;
}

PyDoc_STRVAR(read_doc,
"read(max_rows) -> (bytes, rows, declined_row)\n\n"
"The records of the next rows, at most max_rows of them, up to a row the renderer\n"
"declines: that row is returned as sqlite3 would return it (it is read, and is not\n"
"among the records), for the Python renderer. No rows and no declined row: the end.\n"
"Raises Declined where sqlite3 would raise.");

static PyObject *rows_read(RowsObject *self, PyObject *arg) {
    Py_ssize_t max_rows = PyLong_AsSsize_t(arg);
    if (max_rows == -1 && PyErr_Occurred()) return NULL;
    buf_t b = {NULL, 0, 0};
    Py_ssize_t rows = 0;
    PyObject *odd = NULL;
    while (!self->finished && rows < max_rows) {
        int rc = sqlite3_step(self->stmt);
        if (rc == SQLITE_DONE) {
            finish(self);
            break;
        }
        if (rc != SQLITE_ROW) {
            finish(self);
            PyErr_SetString(declined, "sqlite3 would raise while stepping");
            goto failed;
        }
        int done = render_row(self, &b);
        if (done == 1) {
            rows++;
            continue;
        }
        if (done == NOT_UTF8) {
            PyErr_SetString(declined, "sqlite3 would refuse a text of this row");
            goto failed;
        }
        if (done < 0) goto failed;
        odd = row_tuple(self);
        if (odd == NULL) goto failed;
        break;
    }
    PyObject *data = PyBytes_FromStringAndSize(b.data ? b.data : "", (Py_ssize_t)b.len);
    PyMem_Free(b.data);
    if (data == NULL) {
        Py_XDECREF(odd);
        return NULL;
    }
    return Py_BuildValue("(NnN)", data, rows, odd ? odd : Py_NewRef(Py_None));
failed:
    PyMem_Free(b.data);
    if (!PyErr_Occurred()) PyErr_NoMemory();
    return NULL;
}

static PyObject *rows_close(RowsObject *self, PyObject *unused) {
    (void)unused;
    finish(self);
    Py_RETURN_NONE;
}

static int rows_init(RowsObject *self, PyObject *args, PyObject *kwargs) {
    const char *uri, *sql;
    Py_buffer ops;
    static char *names[] = {"uri", "sql", "ops", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "ssy*", names, &uri, &sql, &ops)) return -1;
    finish(self);
    self->finished = 0;
    PyMem_Free(self->ops);
    self->ops = PyMem_Malloc(ops.len ? (size_t)ops.len : 1);
    if (self->ops == NULL) {
        PyBuffer_Release(&ops);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(self->ops, ops.buf, (size_t)ops.len);
    self->columns = (int)ops.len;
    PyBuffer_Release(&ops);
    for (int i = 0; i < self->columns; i++) {
        if (self->ops[i] < OP_INTEGER || self->ops[i] > OP_LAST) {
            PyErr_SetString(PyExc_ValueError, "unknown column operation");
            return -1;
        }
    }
    int rc = sqlite3_open_v2(uri, &self->db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, NULL);
    if (rc == SQLITE_OK) rc = sqlite3_busy_timeout(self->db, 5000);
    if (rc == SQLITE_OK) rc = sqlite3_prepare_v2(self->db, sql, -1, &self->stmt, NULL);
    if (rc != SQLITE_OK || self->stmt == NULL || self->columns == 0 ||
        sqlite3_column_count(self->stmt) != self->columns) {
        finish(self);
        PyErr_SetString(declined, "sqlite3 would refuse to open or prepare this");
        return -1;
    }
    return 0;
}

static void rows_dealloc(RowsObject *self) {
    finish(self);
    PyMem_Free(self->ops);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef rows_methods[] = {
    {"read", (PyCFunction)rows_read, METH_O, read_doc},
    {"close", (PyCFunction)rows_close, METH_NOARGS, "Finish the statement and close."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject rows_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dpone.exporters.native._render.SqliteRows",
    .tp_basicsize = sizeof(RowsObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "SqliteRows(uri, sql, ops): a SELECT's rows as bulk text records.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)rows_init,
    .tp_dealloc = (destructor)rows_dealloc,
    .tp_methods = rows_methods,
};

HIDDEN int add_sqlite_rows(PyObject *module) {
    declined = PyErr_NewException("dpone.exporters.native._render.Declined", NULL, NULL);
    if (declined == NULL || PyModule_AddObjectRef(module, "Declined", declined) < 0) return -1;
    if (PyType_Ready(&rows_type) < 0) return -1;
    return PyModule_AddObjectRef(module, "SqliteRows", (PyObject *)&rows_type);
}
