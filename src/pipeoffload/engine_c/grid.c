/* ---- The grid lowering's sweeps (pipeoffload.schedules.v_grid_lowering) ----
 *
 * A grid row is a list of one-character labels: F f B b W w (a rank's two forwards, two
 * backwards, two weight-gradient ops) or " " (empty). Counts, dependency slots and levels
 * stay in the sweeps' Python dicts and lists, changed in place.
 */

static PyObject *label_obj[7];  /* "F" "f" "B" "b" "W" "w" " ", made at import */
static const int LABEL_DELTA[7] = {1, 1, 0, 0, -1, -1, 0};
#define EMPTY_LABEL 6

/* The label index of a character (0..5, 6 for empty), or -1. */
static int char_label(Py_UCS4 ch) {
    switch (ch) {
    case 'F': return 0;
    case 'f': return 1;
    case 'B': return 2;
    case 'b': return 3;
    case 'W': return 4;
    case 'w': return 5;
    case ' ': return EMPTY_LABEL;
    }
    return -1;
}

/* The label index of a cell (0..5, 6 for empty); -1 with an exception for anything else. */
static int label_index(PyObject *c) {
    int x = PyUnicode_Check(c) && PyUnicode_GET_LENGTH(c) == 1 ? char_label(PyUnicode_READ_CHAR(c, 0)) : -1;
    if (x < 0)
        PyErr_SetString(PyExc_KeyError, "a grid cell is no label");
    return x;
}

/* The label index of slot t of a row (a str, or a list of one-character strs); -1 with an
 * exception for anything else. */
static int row_label(PyObject *row, int is_str, Py_ssize_t t) {
    if (!is_str)
        return label_index(PyList_GET_ITEM(row, t));
    int x = char_label(PyUnicode_READ_CHAR(row, t));
    if (x < 0)
        PyErr_SetString(PyExc_KeyError, "a grid cell is no label");
    return x;
}

/* dict[label] as a long long (count, slot or level dicts); -1 with an exception. */
static int label_get(PyObject *dict, int c, long long *out) {
    PyObject *v = PyDict_GetItemWithError(dict, label_obj[c]);
    if (!v) {
        if (!PyErr_Occurred())
            PyErr_SetObject(PyExc_KeyError, label_obj[c]);
        return -1;
    }
    *out = PyLong_AsLongLong(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

static int label_set(PyObject *dict, int c, long long v) {
    PyObject *x = PyLong_FromLongLong(v);
    int rc = x ? PyDict_SetItem(dict, label_obj[c], x) : -1;
    Py_XDECREF(x);
    return rc;
}

/* where[r][label][j] (a list's item) */
static int where_get(PyObject *where, Py_ssize_t r, int c, long long j, long long *out) {
    PyObject *d = PyList_GET_ITEM(where, r), *lst;
    if (!PyDict_Check(d) || !(lst = PyDict_GetItemWithError(d, label_obj[c]))) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_KeyError, "where has no such label");
        return -1;
    }
    return ll_item(lst, (Py_ssize_t)j, out);
}

static int where_set(PyObject *where, Py_ssize_t r, int c, long long j, long long v) {
    PyObject *d = PyList_GET_ITEM(where, r), *lst;
    if (!PyDict_Check(d) || !(lst = PyDict_GetItemWithError(d, label_obj[c]))) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_KeyError, "where has no such label");
        return -1;
    }
    return ll_set(lst, (Py_ssize_t)j, v);
}

/* Fetches the named attributes of obj into out (new references); -1 with an exception. */
static int get_attrs(PyObject *obj, const char **names, PyObject ***out, size_t n) {
    for (size_t a = 0; a < n; a++)
        if (!(*out[a] = PyObject_GetAttrString(obj, names[a])))
            return -1;
    return 0;
}

static void drop_attrs(PyObject ***out, size_t n) {
    for (size_t a = 0; a < n; a++)
        Py_CLEAR(*out[a]);
}

PyDoc_STRVAR(hole_column_doc,
"hole_column(filler, t)\n--\n\n"
"pipeoffload.schedules.v_grid_lowering._HoleFiller._column on ``filler`` (in place): the\n"
"furthest slot read, or None where the Python sweep raises _Refused (a count reaches m).");

static PyObject *hole_column(PyObject *self, PyObject *args) {
    PyObject *filler;
    long long t;
    if (!PyArg_ParseTuple(args, "OL:hole_column", &filler, &t))
        return NULL;
    PyObject *grid = NULL, *m_o = NULL, *p_o = NULL, *top_o = NULL, *count = NULL, *where = NULL, *level = NULL,
             *last_at = NULL, *length_o = NULL, *last_op = NULL;
    const char *names[] = {"grid", "m", "p", "top", "count", "where", "level", "last_at", "length", "last_op"};
    PyObject **slots[] = {&grid, &m_o, &p_o, &top_o, &count, &where, &level, &last_at, &length_o, &last_op};
    const size_t n_names = sizeof(names) / sizeof(*names);
    PyObject *result = NULL;
    int refused = 0;
    if (get_attrs(filler, names, slots, n_names) < 0)
        goto out;
    long long m = PyLong_AsLongLong(m_o), p = PyLong_AsLongLong(p_o), top = PyLong_AsLongLong(top_o),
              length = PyLong_AsLongLong(length_o);
    if (PyErr_Occurred())
        goto out;
    if (!PyList_Check(grid) || !PyList_Check(count) || !PyList_Check(where) || !PyList_Check(level) ||
        !PyList_Check(last_at) || !PyList_Check(last_op) || PyList_GET_SIZE(grid) < p || PyList_GET_SIZE(count) < p ||
        PyList_GET_SIZE(where) < p || PyList_GET_SIZE(level) < p || PyList_GET_SIZE(last_at) < p ||
        PyList_GET_SIZE(last_op) < p) {
        PyErr_SetString(PyExc_TypeError, "hole_column: the filler's state is not as _HoleFiller keeps it");
        goto out;
    }
    long long reach = t;
    for (Py_ssize_t i = 0; i < p && !refused; i++) {
        PyObject *row = PyList_GET_ITEM(grid, i), *cnt = PyList_GET_ITEM(count, i), *last = PyList_GET_ITEM(last_at, i);
        if (!PyList_Check(row) || PyList_GET_SIZE(row) < length || t < 0 || t >= length || !PyDict_Check(cnt) ||
            !PyDict_Check(last)) {
            PyErr_SetString(PyExc_TypeError, "hole_column: a row or a count is not as _HoleFiller keeps it");
            goto out;
        }
        long long lv;
        int c = label_index(PyList_GET_ITEM(row, t));
        if (c < 0 || ll_item(level, i, &lv) < 0)
            goto out;
        if (c != EMPTY_LABEL) {
            long long j;
            if (label_get(cnt, c, &j) < 0)
                goto out;
            if (j >= m) {
                refused = 1;
                break;
            }
            if (label_set(cnt, c, j + 1) < 0 || where_set(where, i, c, j, t) < 0 || ll_set(level, i, lv + LABEL_DELTA[c]) < 0)
                goto out;
            continue;
        }
        long long lop;
        if (ll_item(last_op, i, &lop) < 0)
            goto out;
        if (t >= lop)
            continue;  /* nothing of this rank lies later */
        int wanted[6], n_wanted = 0;
        for (int x = 0; x < 6; x++) {
            long long at;
            if (label_get(last, x, &at) < 0)
                goto out;
            wanted[x] = at > t;
            n_wanted += wanted[x];
        }
        long long delta = 0, rise = 0, k = t;
        for (long long kk = t + 1; kk < length; kk++) {
            k = kk;
            if (!n_wanted)
                break;
            c = label_index(PyList_GET_ITEM(row, kk));
            if (c < 0)
                goto out;
            delta += LABEL_DELTA[c];
            long long rise_before = rise;
            if (delta > rise)
                rise = delta;
            if (c == EMPTY_LABEL || !wanted[c])
                continue;
            wanted[c] = 0;
            n_wanted--;
            if ((c == 0 || c == 1) && lv + rise_before >= top)
                continue;
            long long j, dep;
            if (label_get(cnt, c, &j) < 0)
                goto out;
            if (j >= m) {
                refused = 1;
                break;
            }
            if (c == 0 || c == 2) {  /* F, B */
                if (i > 0) {
                    if (where_get(where, i - 1, c, j, &dep) < 0)
                        goto out;
                    if (!(0 <= dep && dep < t))
                        continue;
                } else if (c == 2) {
                    long long nf;
                    if (label_get(cnt, 1, &nf) < 0)
                        goto out;
                    if (nf <= j)
                        continue;
                }
            } else if (c == 1 || c == 3) {  /* f, b */
                if (i < p - 1) {
                    if (where_get(where, i + 1, c, j, &dep) < 0)
                        goto out;
                    if (!(0 <= dep && dep < t))
                        continue;
                } else {
                    long long nd;
                    if (label_get(cnt, c == 1 ? 0 : 2, &nd) < 0)
                        goto out;
                    if (nd <= j)
                        continue;
                }
            } else {  /* W, w: after their B, b */
                long long nd;
                if (label_get(cnt, c == 4 ? 2 : 3, &nd) < 0)
                    goto out;
                if (nd <= j)
                    continue;
            }
            Py_INCREF(label_obj[c]);
            Py_INCREF(label_obj[EMPTY_LABEL]);
            if (PyList_SetItem(row, (Py_ssize_t)t, label_obj[c]) < 0 ||
                PyList_SetItem(row, (Py_ssize_t)kk, label_obj[EMPTY_LABEL]) < 0 || label_set(cnt, c, j + 1) < 0 ||
                where_set(where, i, c, j, t) < 0 || ll_set(level, i, lv + LABEL_DELTA[c]) < 0)
                goto out;
            break;
        }
        if (refused)
            break;
        if (k > reach)
            reach = k;
    }
    if (refused) {
        result = Py_None;
        Py_INCREF(result);
    } else
        result = PyLong_FromLongLong(reach);
out:
    drop_attrs(slots, n_names);
    return result;
}

PyDoc_STRVAR(squeeze_column_doc,
"squeeze_column(squeezer, t)\n--\n\n"
"pipeoffload.schedules.v_grid_lowering._Squeezer._column on ``squeezer`` (in place): True,\n"
"or False where the Python sweep raises _Refused.");

static PyObject *squeeze_column(PyObject *self, PyObject *args) {
    PyObject *sq;
    long long t;
    if (!PyArg_ParseTuple(args, "OL:squeeze_column", &sq, &t))
        return NULL;
    PyObject *p_o = NULL, *m_o = NULL, *length_o = NULL, *count = NULL, *where = NULL, *nxt = NULL, *out = NULL,
             *cols = NULL, *order = NULL;
    const char *names[] = {"p", "m", "length", "count", "where", "nxt", "out", "cols", "order"};
    PyObject **slots[] = {&p_o, &m_o, &length_o, &count, &where, &nxt, &out, &cols, &order};
    const size_t n_names = sizeof(names) / sizeof(*names);
    PyObject *result = NULL;
    if (get_attrs(sq, names, slots, n_names) < 0)
        goto done;
    long long p = PyLong_AsLongLong(p_o), m = PyLong_AsLongLong(m_o), length = PyLong_AsLongLong(length_o);
    if (PyErr_Occurred())
        goto done;
    if (!PyList_Check(cols) || t < 0 || t >= PyList_GET_SIZE(cols) || !PyList_Check(order) || !PyList_Check(count) ||
        !PyList_Check(where) || !PyList_Check(nxt) || !PyList_Check(out) || PyList_GET_SIZE(count) < p ||
        PyList_GET_SIZE(where) < p || PyList_GET_SIZE(nxt) < p || PyList_GET_SIZE(out) < p) {
        PyErr_SetString(PyExc_TypeError, "squeeze_column: the squeezer's state is not as _Squeezer keeps it");
        goto done;
    }
    PyObject *col = PyList_GET_ITEM(cols, (Py_ssize_t)t);
    if (!PyTuple_Check(col) || PyTuple_GET_SIZE(col) < p) {
        PyErr_SetString(PyExc_TypeError, "squeeze_column: a column is no tuple of labels");
        goto done;
    }
    int refused = 0;
    for (Py_ssize_t n = 0; n < PyList_GET_SIZE(order) && !refused; n++) {
        long long r;
        if (ll_item(order, n, &r) < 0)
            goto done;
        if (r < 0 || r >= p) {
            PyErr_SetString(PyExc_IndexError, "squeeze_column: rank out of range");
            goto done;
        }
        int c = label_index(PyTuple_GET_ITEM(col, (Py_ssize_t)r));
        if (c < 0)
            goto done;
        int downward = c == 0 || c == 2 || c == 4;  /* _DOWNWARD: placed in a slot's first sweep */
        if (c == EMPTY_LABEL || downward != (n < p))
            continue;
        PyObject *cnt = PyList_GET_ITEM(count, (Py_ssize_t)r);
        long long j, slot, dep;
        if (!PyDict_Check(cnt)) {
            PyErr_SetString(PyExc_TypeError, "squeeze_column: a count is no dict");
            goto done;
        }
        if (label_get(cnt, c, &j) < 0)
            goto done;
        if (j >= m) {
            refused = 1;
            break;
        }
        if (ll_item(nxt, (Py_ssize_t)r, &slot) < 0)
            goto done;
        if (c == 0 || c == 2) {
            if (r > 0) {
                if (where_get(where, (Py_ssize_t)r - 1, c, j, &dep) < 0)
                    goto done;
                if (dep < 0) {
                    refused = 1;
                    break;
                }
                if (dep >= slot)
                    slot = dep + 1;
            } else if (c == 2) {
                if (where_get(where, (Py_ssize_t)r, 1, j, &dep) < 0)
                    goto done;
                if (dep < 0) {
                    refused = 1;
                    break;
                }
            }
        } else if (c == 1 || c == 3) {
            if (r < p - 1) {
                if (where_get(where, (Py_ssize_t)r + 1, c, j, &dep) < 0)
                    goto done;
                if (dep < 0) {
                    refused = 1;
                    break;
                }
                if (dep >= slot)
                    slot = dep + 1;
            } else {
                if (where_get(where, (Py_ssize_t)r, c == 1 ? 0 : 2, j, &dep) < 0)
                    goto done;
                if (dep < 0) {
                    refused = 1;
                    break;
                }
            }
        }
        if (slot >= length) {
            refused = 1;
            break;
        }
        PyObject *orow = PyList_GET_ITEM(out, (Py_ssize_t)r);
        if (!PyList_Check(orow) || slot < 0 || slot >= PyList_GET_SIZE(orow)) {
            PyErr_SetString(PyExc_IndexError, "squeeze_column: output slot out of range");
            goto done;
        }
        Py_INCREF(label_obj[c]);
        if (PyList_SetItem(orow, (Py_ssize_t)slot, label_obj[c]) < 0 || label_set(cnt, c, j + 1) < 0 ||
            where_set(where, (Py_ssize_t)r, c, j, slot) < 0 || ll_set(nxt, (Py_ssize_t)r, slot + 1) < 0)
            goto done;
    }
    result = PyBool_FromLong(!refused);
done:
    drop_attrs(slots, n_names);
    return result;
}

PyDoc_STRVAR(time_grid_doc,
"time_grid(rows, dur, delta, src, comm)\n--\n\n"
"pipeoffload.schedules.v_grid_lowering.time_grid's sweep over ``rows`` (one str of labels per\n"
"rank), with per (rank, label) duration, memory delta and cross-rank input rank (-1: none) in\n"
"flat lists of 6 per rank: (longest span, makespan, highest peak), the same floats; None when\n"
"an input is not a float (the Python sweep runs then).");

static PyObject *time_grid(PyObject *self, PyObject *args) {
    PyObject *rows, *dur_l, *delta_l, *src_l;
    double comm;
    if (!PyArg_ParseTuple(args, "O!O!O!O!d:time_grid", &PyList_Type, &rows, &PyList_Type, &dur_l, &PyList_Type,
                          &delta_l, &PyList_Type, &src_l, &comm))
        return NULL;
    const Py_ssize_t p = PyList_GET_SIZE(rows);
    if (p == 0 || PyList_GET_SIZE(dur_l) != 6 * p || PyList_GET_SIZE(delta_l) != 6 * p ||
        PyList_GET_SIZE(src_l) != 6 * p)
        Py_RETURN_NONE;
    double *dur = PyMem_Malloc(sizeof(double) * 6 * (size_t)p), *dm = PyMem_Malloc(sizeof(double) * 6 * (size_t)p);
    Py_ssize_t *src = PyMem_Malloc(sizeof(Py_ssize_t) * 6 * (size_t)p), *cnt = PyMem_Calloc(6 * (size_t)p, sizeof(Py_ssize_t));
    Py_ssize_t *done = PyMem_Calloc(6 * (size_t)p, sizeof(Py_ssize_t));
    double **ends = PyMem_Calloc(6 * (size_t)p, sizeof(double *));
    double *clock = PyMem_Calloc((size_t)p, sizeof(double)), *first = PyMem_Malloc(sizeof(double) * (size_t)p);
    double *level = PyMem_Calloc((size_t)p, sizeof(double)), *top = PyMem_Calloc((size_t)p, sizeof(double));
    PyObject *result = NULL;
    Py_ssize_t length = -1;
    if (!dur || !dm || !src || !cnt || !done || !ends || !clock || !first || !level || !top) {
        PyErr_NoMemory();
        goto out;
    }
    if (!numbers(dur_l, 6 * p, dur, 0) || !numbers(delta_l, 6 * p, dm, 0)) {
        result = Py_None;
        Py_INCREF(result);
        goto out;
    }
    for (Py_ssize_t x = 0; x < 6 * p; x++) {
        long long v;
        if (ll_item(src_l, x, &v) < 0)
            goto out;
        if (v < -1 || v >= p) {
            PyErr_SetString(PyExc_ValueError, "time_grid: an input rank out of range");
            goto out;
        }
        src[x] = (Py_ssize_t)v;
    }
    for (Py_ssize_t r = 0; r < p; r++) {
        PyObject *row = PyList_GET_ITEM(rows, r);
        if (!PyUnicode_Check(row) || (length >= 0 && PyUnicode_GET_LENGTH(row) != length)) {
            PyErr_SetString(PyExc_TypeError, "time_grid: rows must be strs of one length");
            goto out;
        }
        length = PyUnicode_GET_LENGTH(row);
        first[r] = -1.0;
        for (Py_ssize_t t = 0; t < length; t++) {
            int c = row_label(row, 1, t);
            if (c < 0)
                goto out;
            if (c < 6)
                cnt[r * 6 + c]++;
        }
    }
    for (Py_ssize_t x = 0; x < 6 * p; x++)
        if (!(ends[x] = PyMem_Malloc(sizeof(double) * (size_t)(cnt[x] ? cnt[x] : 1)))) {
            PyErr_NoMemory();
            goto out;
        }
    for (Py_ssize_t t = 0; t < length; t++)
        for (Py_ssize_t r = 0; r < p; r++) {
            int c = char_label(PyUnicode_READ_CHAR(PyList_GET_ITEM(rows, r), t));  /* (checked above) */
            if (c == EMPTY_LABEL)
                continue;
            Py_ssize_t x = r * 6 + c;
            double start = clock[r];
            if (src[x] >= 0) {
                Py_ssize_t y = src[x] * 6 + c;
                if (done[x] >= done[y]) {
                    PyErr_SetString(PyExc_IndexError, "time_grid: an input is not placed before its op");
                    goto out;
                }
                double arrive = ends[y][done[x]] + comm;
                if (arrive > start)
                    start = arrive;
            }
            if (first[r] < 0)
                first[r] = start;
            double end = start + dur[x];
            ends[x][done[x]++] = end;
            clock[r] = end;
            double lv = level[r] + dm[x];
            level[r] = lv;
            if (lv > top[r])
                top[r] = lv;
        }
    {
        double span = clock[0] - first[0], mx = clock[0], mn = first[0], peak = top[0];
        for (Py_ssize_t r = 1; r < p; r++) {
            double s = clock[r] - first[r];
            if (s > span)
                span = s;
            if (clock[r] > mx)
                mx = clock[r];
            if (first[r] < mn)
                mn = first[r];
            if (top[r] > peak)
                peak = top[r];
        }
        result = Py_BuildValue("(ddd)", span, mx - mn, peak);
    }
out:
    if (ends)
        for (Py_ssize_t x = 0; x < 6 * p; x++)
            PyMem_Free(ends[x]);
    PyMem_Free(ends); PyMem_Free(dur); PyMem_Free(dm); PyMem_Free(src); PyMem_Free(cnt); PyMem_Free(done);
    PyMem_Free(clock); PyMem_Free(first); PyMem_Free(level); PyMem_Free(top);
    return result;
}

PyDoc_STRVAR(grid_peaks_doc,
"grid_peaks(grid)\n--\n\n"
"pipeoffload.schedules.v_grid_lowering._peaks: per rank, the most chunk activations alive at\n"
"once along its row of labels (a list of one-character strs, or a str).");

static PyObject *grid_peaks(PyObject *self, PyObject *args) {
    PyObject *grid;
    if (!PyArg_ParseTuple(args, "O!:grid_peaks", &PyList_Type, &grid))
        return NULL;
    const Py_ssize_t p = PyList_GET_SIZE(grid);
    PyObject *out = PyList_New(p);
    for (Py_ssize_t r = 0; out && r < p; r++) {
        PyObject *row = PyList_GET_ITEM(grid, r);
        int is_str = PyUnicode_Check(row);
        if (!is_str && !PyList_Check(row)) {
            PyErr_SetString(PyExc_TypeError, "grid_peaks: a row is no list or str");
            Py_CLEAR(out);
            break;
        }
        Py_ssize_t n = is_str ? PyUnicode_GET_LENGTH(row) : PyList_GET_SIZE(row);
        long long level = 0, peak = 0;
        for (Py_ssize_t t = 0; t < n; t++) {
            int c = row_label(row, is_str, t);
            if (c < 0) {
                Py_CLEAR(out);
                break;
            }
            level += LABEL_DELTA[c];
            if (level > peak)
                peak = level;
        }
        if (!out)
            break;
        PyObject *v = PyLong_FromLongLong(peak);  /* max(0, running levels): peak starts at 0 */
        if (!v) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, r, v);
    }
    return out;
}

PyDoc_STRVAR(grid_dependencies_doc,
"grid_dependencies_hold(grid, m)\n--\n\n"
"pipeoffload.schedules.v_grid_lowering._dependencies_hold: every label m times on every rank\n"
"and every op after its dependencies.");

static PyObject *grid_dependencies_hold(PyObject *self, PyObject *args) {
    PyObject *grid;
    Py_ssize_t m;
    if (!PyArg_ParseTuple(args, "O!n:grid_dependencies_hold", &PyList_Type, &grid, &m))
        return NULL;
    const Py_ssize_t p = PyList_GET_SIZE(grid);
    if (m < 0) {
        PyErr_SetString(PyExc_ValueError, "grid_dependencies_hold: m must be >= 0");
        return NULL;
    }
    /* at[(i*6 + label)*m + j]: the slot of rank i's j-th op with that label */
    long long *at = PyMem_Malloc(sizeof(long long) * (size_t)(p * 6 * (m ? m : 1) + 1));
    if (!at)
        return PyErr_NoMemory();
    int holds = 1;
    for (Py_ssize_t i = 0; holds && i < p; i++) {
        PyObject *row = PyList_GET_ITEM(grid, i);
        int is_str = PyUnicode_Check(row);
        if (!is_str && !PyList_Check(row)) {
            PyMem_Free(at);
            PyErr_SetString(PyExc_TypeError, "grid_dependencies_hold: a row is no list or str");
            return NULL;
        }
        Py_ssize_t n = is_str ? PyUnicode_GET_LENGTH(row) : PyList_GET_SIZE(row), seen[6] = {0, 0, 0, 0, 0, 0};
        for (Py_ssize_t t = 0; holds && t < n; t++) {
            int c = row_label(row, is_str, t);
            if (c < 0) {
                PyMem_Free(at);
                return NULL;
            }
            if (c == EMPTY_LABEL)
                continue;
            if (seen[c] >= m)
                holds = 0;
            else
                at[(i * 6 + c) * m + seen[c]++] = t;
        }
        for (int c = 0; holds && c < 6; c++)
            holds = seen[c] == m;
    }
#define AT(i, c, j) at[((i) * 6 + (c)) * m + (j)]
    for (Py_ssize_t i = 0; holds && i < p; i++)
        for (Py_ssize_t j = 0; holds && j < m; j++) {
            /* labels: F 0, f 1, B 2, b 3, W 4, w 5 */
            if (AT(i, 2, j) >= AT(i, 4, j) || AT(i, 3, j) >= AT(i, 5, j))
                holds = 0;
            else if (i == 0 && AT(i, 1, j) >= AT(i, 2, j))
                holds = 0;
            else if (i == p - 1 && (AT(i, 0, j) >= AT(i, 1, j) || AT(i, 2, j) >= AT(i, 3, j)))
                holds = 0;
            else if (0 < i && i < p - 1 && (AT(i - 1, 0, j) >= AT(i, 0, j) || AT(i - 1, 2, j) >= AT(i, 2, j) ||
                                            AT(i + 1, 1, j) >= AT(i, 1, j) || AT(i + 1, 3, j) >= AT(i, 3, j)))
                holds = 0;
        }
#undef AT
    PyMem_Free(at);
    return PyBool_FromLong(holds);
}
