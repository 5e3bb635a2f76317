/* ---- building_block._reorder_bytes's scan ---- */

/* A slot grid's op positions: pos[(kind, layer group, microbatch)] mirrored in a C array
 * indexed by (code*S + layer group)*M + microbatch (-1: no such op). */
typedef struct {
    Py_ssize_t S, M;
    long long *at;
    PyObject *kinds;  /* (F, B, W): the code of a kind is its index */
} PosMirror;

static int kind_code(PyObject *kinds, PyObject *kind) {
    for (int c = 0; c < 3; c++)
        if (PyTuple_GET_ITEM(kinds, c) == kind)
            return c;
    return -1;
}

/* A cell's index in the mirror, or -1 (no exception) when it is not (kind, stage, j) in range. */
static Py_ssize_t cell_index(PosMirror *pm, PyObject *cell, int *code, Py_ssize_t *stage, Py_ssize_t *j) {
    if (!PyTuple_Check(cell) || PyTuple_GET_SIZE(cell) < 3)
        return -1;
    int c = kind_code(pm->kinds, PyTuple_GET_ITEM(cell, 0));
    Py_ssize_t s, mb;
    if (c < 0 || !index_in(PyTuple_GET_ITEM(cell, 1), pm->S, &s) || !index_in(PyTuple_GET_ITEM(cell, 2), pm->M, &mb))
        return -1;
    *code = c;
    *stage = s;
    *j = mb;
    return ((Py_ssize_t)c * pm->S + s) * pm->M + mb;
}

/* Reads every entry of pos into the mirror: 1, 0 when an entry is outside it (no exception),
 * -1 on an error. */
static int mirror_read(PosMirror *pm, PyObject *pos) {
    for (Py_ssize_t x = 0; x < 3 * pm->S * pm->M; x++)
        pm->at[x] = -1;
    Py_ssize_t it = 0;
    PyObject *key, *value;
    while (PyDict_Next(pos, &it, &key, &value)) {
        int c;
        Py_ssize_t s, j, x = cell_index(pm, key, &c, &s, &j);
        long long v;
        if (x < 0 || !PyLong_Check(value))
            return 0;
        v = PyLong_AsLongLong(value);
        if (v == -1 && PyErr_Occurred())
            return -1;
        pm->at[x] = v;
    }
    return 1;
}

/* The skip's lower bounds (what the scan read), written back before the skip reads them. */
static int skip_bounds(PyObject *skip, long long min_lb, long long after_lb) {
    PyObject *a = PyLong_FromLongLong(min_lb), *b = PyLong_FromLongLong(after_lb);
    int rc = a && b && PyObject_SetAttrString(skip, "min_lb", a) == 0 &&
             PyObject_SetAttrString(skip, "after_lb", b) == 0 ? 0 : -1;
    Py_XDECREF(a);
    Py_XDECREF(b);
    return rc;
}

PyDoc_STRVAR(reorder_bytes_doc,
"reorder_bytes(cells, pos, mem, thresholds, deps_of, kinds, S, M, skip)\n--\n\n"
"pipeoffload.schedules.building_block._reorder_bytes_py's scan, in place on the grid's\n"
"``cells`` and ``pos``, the levels ``mem`` (bytearrays) and ``skip`` (a _PeriodSkip or None):\n"
"True, or None when an op of ``pos`` is outside (F, B, W) x S x M (nothing is changed then).\n"
"``thresholds[r]``: the level at which rank r is at its peak; ``deps_of[code*S + stage]``: the\n"
"(code*S + stage) of each input of that op kind; ``kinds``: (F, B, W).");

static PyObject *reorder_bytes(PyObject *self, PyObject *args) {
    PyObject *cells, *pos, *mem, *thresholds, *deps_of, *kinds, *skip;
    Py_ssize_t S, M;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!nnO:reorder_bytes", &PyList_Type, &cells, &PyDict_Type, &pos,
                          &PyList_Type, &mem, &PyList_Type, &thresholds, &PyList_Type, &deps_of, &PyTuple_Type,
                          &kinds, &S, &M, &skip))
        return NULL;
    const Py_ssize_t p = PyList_GET_SIZE(cells);
    if (S <= 0 || M <= 0 || PyTuple_GET_SIZE(kinds) != 3 || PyList_GET_SIZE(mem) != p ||
        PyList_GET_SIZE(thresholds) != p || PyList_GET_SIZE(deps_of) != 3 * S || p == 0) {
        PyErr_SetString(PyExc_ValueError, "reorder_bytes: inconsistent grid, levels or tables");
        return NULL;
    }
    PosMirror pm = {S, M, NULL, kinds};
    long long *thr = PyMem_Malloc(sizeof(long long) * (size_t)p);
    Py_ssize_t *dep_off = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(3 * S + 1)), *dep = NULL;
    PyObject *done = NULL, *result = NULL;
    pm.at = PyMem_Malloc(sizeof(long long) * (size_t)(3 * S * M));
    if (!thr || !dep_off || !pm.at) {
        PyErr_NoMemory();
        goto out;
    }
    Py_ssize_t n_dep = 0;
    for (Py_ssize_t x = 0; x < 3 * S; x++) {
        PyObject *row = PyList_GET_ITEM(deps_of, x);
        if (!PyTuple_Check(row)) {
            PyErr_SetString(PyExc_TypeError, "reorder_bytes: deps_of rows must be tuples");
            goto out;
        }
        n_dep += PyTuple_GET_SIZE(row);
    }
    dep = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(n_dep ? n_dep : 1));
    if (!dep) {
        PyErr_NoMemory();
        goto out;
    }
    n_dep = 0;
    for (Py_ssize_t x = 0; x < 3 * S; x++) {
        PyObject *row = PyList_GET_ITEM(deps_of, x);
        dep_off[x] = n_dep;
        for (Py_ssize_t a = 0; a < PyTuple_GET_SIZE(row); a++)
            if (!index_in(PyTuple_GET_ITEM(row, a), 3 * S, &dep[n_dep++])) {
                PyErr_SetString(PyExc_ValueError, "reorder_bytes: an input is no op kind");
                goto out;
            }
    }
    dep_off[3 * S] = n_dep;
    for (Py_ssize_t r = 0; r < p; r++) {
        PyObject *lv = PyList_GET_ITEM(mem, r), *row = PyList_GET_ITEM(cells, r);
        if (!PyByteArray_Check(lv) || !PyList_Check(row) || ll_item(thresholds, r, &thr[r]) < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "reorder_bytes: levels must be bytearrays and rows lists");
            goto out;
        }
    }
    int got = mirror_read(&pm, pos);
    if (got <= 0) {
        if (got == 0) {
            result = Py_None;
            Py_INCREF(result);
        }
        goto out;
    }
    long long period = 0, min_lb = 0, after_lb = 0;
    if (skip != Py_None) {
        PyObject *o = PyObject_GetAttrString(skip, "period");
        if (!o)
            goto out;
        period = PyLong_AsLongLong(o);
        Py_DECREF(o);
        if ((period == -1 && PyErr_Occurred()) || period <= 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "reorder_bytes: the skip's period must be positive");
            goto out;
        }
    }
    Py_ssize_t length = PyList_GET_SIZE(PyList_GET_ITEM(cells, 0));
    for (Py_ssize_t t = 0; t < length; t++) {
        if (skip != Py_None && t % period == 0) {
            /* the skip reads and resets its lower bounds at each boundary */
            if (done && skip_bounds(skip, min_lb, after_lb) < 0)
                goto out;
            PyObject *to = PyObject_CallMethod(skip, "boundary", "n", t);
            if (!to)
                goto out;
            Py_ssize_t t2 = PyLong_AsSsize_t(to);
            Py_DECREF(to);
            if (t2 == -1 && PyErr_Occurred())
                goto out;
            if (t2 != t) {  /* periods written by the skip: its moves are in pos now */
                if (mirror_read(&pm, pos) <= 0) {
                    if (!PyErr_Occurred())
                        PyErr_SetString(PyExc_ValueError, "reorder_bytes: the skip wrote an op outside the grid");
                    goto out;
                }
                t = t2;
            }
            Py_XDECREF(done);
            PyObject *lb_o = PyObject_GetAttrString(skip, "min_lb"), *al_o = PyObject_GetAttrString(skip, "after_lb");
            done = PyObject_GetAttrString(skip, "done");
            int ok = lb_o && al_o && done && PyList_Check(done);
            if (ok) {
                min_lb = PyLong_AsLongLong(lb_o);
                after_lb = PyLong_AsLongLong(al_o);
                ok = !PyErr_Occurred();
            }
            Py_XDECREF(lb_o);
            Py_XDECREF(al_o);
            if (!ok) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_TypeError, "reorder_bytes: the skip's done must be a list");
                goto out;
            }
            if (t >= length)
                break;
        }
        for (Py_ssize_t r = 0; r < p; r++) {
            PyObject *row = PyList_GET_ITEM(cells, r);
            if (t >= PyList_GET_SIZE(row)) {
                PyErr_SetString(PyExc_IndexError, "reorder_bytes: rows of different lengths");
                goto out;
            }
            PyObject *cell = PyList_GET_ITEM(row, t);
            if (cell == Py_None)
                continue;
            int code;
            Py_ssize_t stage, j, x = cell_index(&pm, cell, &code, &stage, &j);
            if (x < 0) {
                PyErr_SetString(PyExc_ValueError, "reorder_bytes: a cell is no op of the grid");
                goto out;
            }
            Py_ssize_t own = (Py_ssize_t)code * S + stage;
            long long lb = 0;
            if (j > 0) {
                if (pm.at[x - 1] < 0) {
                    PyErr_SetString(PyExc_KeyError, "reorder_bytes: the previous microbatch's op is not in the grid");
                    goto out;
                }
                lb = pm.at[x - 1] + 1;
            }
            for (Py_ssize_t d = dep_off[own]; d < dep_off[own + 1]; d++) {
                long long u = pm.at[dep[d] * M + j];
                if (u < 0) {
                    PyErr_SetString(PyExc_KeyError, "reorder_bytes: an input is not in the grid");
                    goto out;
                }
                if (u + 1 > lb)
                    lb = u + 1;
            }
            if (skip != Py_None) {  /* record the scanned op and the earliest slot its decision reads */
                PyObject *rec = Py_BuildValue("(nO)", r, cell);
                int rc = rec ? PyList_Append(done, rec) : -1;
                Py_XDECREF(rec);
                if (rc < 0)
                    goto out;
                if (lb < min_lb)
                    min_lb = lb;
                if (lb < after_lb)
                    after_lb = lb;
            }
            PyObject *lv = PyList_GET_ITEM(mem, r);
            if (PyByteArray_GET_SIZE(lv) < t) {
                PyErr_SetString(PyExc_IndexError, "reorder_bytes: levels shorter than the row");
                goto out;
            }
            unsigned char *level = (unsigned char *)PyByteArray_AS_STRING(lv);
            long long q;
            if (code == 0) {
                q = t;
                if (lb < t) {  /* the stretch just before t where the level stays below the peak */
                    q = lb;
                    for (long long y = t - 1; y >= lb; y--)
                        if ((long long)level[y] >= thr[r]) {
                            q = y + 1;
                            break;
                        }
                }
            } else
                q = lb < t ? lb : t;
            while (q < t && PyList_GET_ITEM(row, q) != Py_None)
                q++;
            if (q < t) {
                Py_INCREF(cell);
                Py_INCREF(Py_None);
                PyObject *slot = PyLong_FromLongLong(q);
                if (!slot)
                    goto out;
                PyObject *keep = cell;
                Py_INCREF(keep);  /* (the row's reference goes with SetItem) */
                int rc = PyList_SetItem(row, (Py_ssize_t)t, Py_None) < 0 || PyList_SetItem(row, (Py_ssize_t)q, cell) < 0 ||
                         PyDict_SetItem(pos, keep, slot) < 0 ? -1 : 0;
                Py_DECREF(slot);
                Py_DECREF(keep);
                if (rc < 0)
                    goto out;
                pm.at[x] = q;
                if (code == 0)
                    for (long long y = q; y < t; y++)
                        level[y] = (unsigned char)(level[y] + 1);
                else if (code == 2)
                    for (long long y = q; y < t; y++)
                        level[y] = (unsigned char)(level[y] - 1);
            }
        }
    }
    if (skip != Py_None && done && skip_bounds(skip, min_lb, after_lb) < 0)
        goto out;
    result = Py_True;
    Py_INCREF(result);
out:
    Py_XDECREF(done);
    PyMem_Free(thr); PyMem_Free(dep_off); PyMem_Free(dep); PyMem_Free(pm.at);
    return result;
}

PyDoc_STRVAR(op_row_doc,
"op_row(kind, stage, m)\n--\n\n"
"``[(kind, stage, j) for j in range(m)]`` (building_block.op_table's rows).");

static PyObject *op_row(PyObject *self, PyObject *args) {
    PyObject *kind, *stage;
    Py_ssize_t m;
    if (!PyArg_ParseTuple(args, "OOn:op_row", &kind, &stage, &m))
        return NULL;
    if (m < 0) {
        PyErr_SetString(PyExc_ValueError, "op_row: m must be >= 0");
        return NULL;
    }
    PyObject *out = PyList_New(m);
    for (Py_ssize_t j = 0; out && j < m; j++) {
        PyObject *jo = PyLong_FromSsize_t(j), *op = jo ? PyTuple_Pack(3, kind, stage, jo) : NULL;
        Py_XDECREF(jo);
        if (!op)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, j, op);
    }
    return out;
}
