/*
 * The compiled renderer's module: render_rows over a list of driver rows (the cells
 * are render.c's), the SqliteRows reader (sqlite_rows.c), and the initialisation.
 */
#include "render.h"

/* One row: its record (fields, TABs, LF) appended, or nothing of it (0 declined). */
static int row(buf_t *b, const unsigned char *ops, Py_ssize_t columns, PyObject *r) {
    if (!PyTuple_CheckExact(r) || PyTuple_GET_SIZE(r) != columns) return 0;
    size_t start = b->len;
    for (Py_ssize_t i = 0; i < columns; i++) {
        PyObject *v = PyTuple_GET_ITEM(r, i);
        if (v != Py_None) {
            int done = cell(b, ops[i], v);
            if (done != 1) {
                b->len = start;
                return done;
            }
        }
        if (!append(b, i + 1 < columns ? "\t" : "\n", 1)) return -1;
    }
    return 1;
}

PyDoc_STRVAR(render_rows_doc,
"render_rows(ops, rows, start, stop) -> (bytes, next)\n\n"
"The records of rows[start:stop] in the bulk text format, up to the first row this\n"
"renderer declines: next is that row's index (stop when it took them all). ops holds\n"
"one operation a column (dpone.exporters.native_render).");

static PyObject *render_rows(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer ops;
    PyObject *rows;
    Py_ssize_t start, stop;
    if (!PyArg_ParseTuple(args, "y*O!nn", &ops, &PyList_Type, &rows, &start, &stop)) return NULL;
    const unsigned char *op = ops.buf;
    Py_ssize_t columns = ops.len;
    for (Py_ssize_t i = 0; i < columns; i++) {
        if (op[i] < OP_INTEGER || op[i] > OP_LAST) {
            PyBuffer_Release(&ops);
            PyErr_SetString(PyExc_ValueError, "unknown column operation");
            return NULL;
        }
    }
    if (stop > PyList_GET_SIZE(rows)) stop = PyList_GET_SIZE(rows);
    buf_t b = {NULL, 0, 0};
    Py_ssize_t i = start < 0 ? 0 : start;
    for (; i < stop && columns > 0; i++) {
        int done = row(&b, op, columns, PyList_GET_ITEM(rows, i));
        if (done < 0) {
            PyMem_Free(b.data);
            PyBuffer_Release(&ops);
            return PyErr_Occurred() ? NULL : PyErr_NoMemory();
        }
        if (done == 0) break;
    }
    if (columns == 0) i = start < 0 ? 0 : start;
    PyBuffer_Release(&ops);
    PyObject *data = PyBytes_FromStringAndSize(b.data ? b.data : "", (Py_ssize_t)b.len);
    PyMem_Free(b.data);
    if (data == NULL) return NULL;
    return Py_BuildValue("(Nn)", data, i);
}

static PyMethodDef methods[] = {
    {"render_rows", render_rows, METH_VARARGS, render_rows_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_render", "dpone's compiled renderer of driver rows.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__render(void) {
    if (init_cells() < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (add_sqlite_rows(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
