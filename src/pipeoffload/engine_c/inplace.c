/* ---- Resumable loops that work in place on their Python state ----
 *
 * pipeoffload.passes.steady_timing._Engine.run and pipeoffload.schedules.w_refill._Refill.run
 * are called many times on the same state (stopped at per-rank limits, checked, shifted,
 * resumed), so copying the end table in and out per call would cost more than the loop.
 * These read and write the Python lists directly: the end table item by item, the small
 * per-call tables (dependencies, durations, deltas) and the per-rank state as C arrays
 * written back on every return. The callbacks they make (``locate``, ``pos``) read only the
 * orders, never the state held here.
 */

/* Ranks ready to run: a FIFO that grows (the Python loops' deque). */
typedef struct {
    Py_ssize_t *item, head, len, cap;
} Ready;

static int ready_push(Ready *q, Py_ssize_t r) {
    if (q->len == q->cap) {
        Py_ssize_t cap = q->cap ? 2 * q->cap : 16;
        Py_ssize_t *grown = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)cap);
        if (!grown) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t x = 0; x < q->len; x++)
            grown[x] = q->item[(q->head + x) % q->cap];
        PyMem_Free(q->item);
        q->item = grown;
        q->head = 0;
        q->cap = cap;
    }
    q->item[(q->head + q->len) % q->cap] = r;
    q->len++;
    return 0;
}

static Py_ssize_t ready_pop(Ready *q) {
    Py_ssize_t r = q->item[q->head];
    q->head = (q->head + 1) % q->cap;
    q->len--;
    return r;
}

/* end[slot] as a double; -1 with an exception when out of range or not a float. */
static int end_get(PyObject *end, Py_ssize_t slot, double *out) {
    if (slot < 0 || slot >= PyList_GET_SIZE(end)) {
        PyErr_Format(PyExc_IndexError, "end table slot %zd out of range", slot);
        return -1;
    }
    PyObject *x = PyList_GET_ITEM(end, slot);
    if (!PyFloat_CheckExact(x)) {
        PyErr_Format(PyExc_TypeError, "end table slot %zd holds no float", slot);
        return -1;
    }
    *out = PyFloat_AS_DOUBLE(x);
    return 0;
}

static int list_set_float(PyObject *list, Py_ssize_t i, double v) {
    PyObject *x = PyFloat_FromDouble(v);
    return x ? PyList_SetItem(list, i, x) : -1;
}

/* ``waiting.setdefault(slot, []).append(r)`` */
static int wait_on(PyObject *waiting, Py_ssize_t slot, Py_ssize_t r) {
    PyObject *key = PyLong_FromSsize_t(slot), *rank = PyLong_FromSsize_t(r);
    int rc = -1;
    if (key && rank) {
        PyObject *lst = PyDict_GetItemWithError(waiting, key);
        if (lst)
            rc = PyList_Append(lst, rank);
        else if (!PyErr_Occurred() && (lst = PyList_New(0)) != NULL) {
            rc = PyList_Append(lst, rank) < 0 ? -1 : PyDict_SetItem(waiting, key, lst);
            Py_DECREF(lst);
        }
    }
    Py_XDECREF(key);
    Py_XDECREF(rank);
    return rc;
}

/* ``woken = waiting.pop(slot, None); if woken: ready.extend(woken)`` */
static int wake(PyObject *waiting, Py_ssize_t slot, Ready *q, Py_ssize_t p) {
    if (PyDict_GET_SIZE(waiting) == 0)
        return 0;
    PyObject *key = PyLong_FromSsize_t(slot);
    if (!key)
        return -1;
    PyObject *lst = PyDict_GetItemWithError(waiting, key);
    int rc = 0;
    if (lst) {
        Py_INCREF(lst);
        rc = PyDict_DelItem(waiting, key);
        for (Py_ssize_t x = 0; rc == 0 && x < PyList_GET_SIZE(lst); x++) {
            Py_ssize_t r;
            if (!index_in(PyList_GET_ITEM(lst, x), p, &r)) {
                PyErr_SetString(PyExc_ValueError, "a waiting list holds no rank");
                rc = -1;
            } else
                rc = ready_push(q, r);
        }
        Py_DECREF(lst);
    } else if (PyErr_Occurred())
        rc = -1;
    Py_DECREF(key);
    return rc;
}

/* A list of p ints in [0, limit) (``flags``: bools) as Py_ssize_t; 0 when one is not. */
static int indices(PyObject *list, Py_ssize_t p, Py_ssize_t limit, Py_ssize_t *out) {
    if (!PyList_CheckExact(list) || PyList_GET_SIZE(list) != p)
        return 0;
    for (Py_ssize_t i = 0; i < p; i++)
        if (!index_in(PyList_GET_ITEM(list, i), limit, &out[i]))
            return 0;
    return 1;
}

static int flags(PyObject *list, Py_ssize_t p, char *out) {
    if (!PyList_CheckExact(list) || PyList_GET_SIZE(list) != p)
        return 0;
    for (Py_ssize_t i = 0; i < p; i++) {
        PyObject *x = PyList_GET_ITEM(list, i);
        if (x != Py_True && x != Py_False)
            return 0;
        out[i] = x == Py_True;
    }
    return 1;
}

static int write_indices(PyObject *list, Py_ssize_t p, const Py_ssize_t *v) {
    for (Py_ssize_t i = 0; i < p; i++) {
        PyObject *x = PyLong_FromSsize_t(v[i]);
        if (!x || PyList_SetItem(list, i, x) < 0)
            return -1;
    }
    return 0;
}

static int write_flags(PyObject *list, Py_ssize_t p, const char *v) {
    for (Py_ssize_t i = 0; i < p; i++) {
        PyObject *x = v[i] ? Py_True : Py_False;
        Py_INCREF(x);
        if (PyList_SetItem(list, i, x) < 0)
            return -1;
    }
    return 0;
}

static int write_floats(PyObject *list, Py_ssize_t p, const double *v) {
    for (Py_ssize_t i = 0; i < p; i++)
        if (list_set_float(list, i, v[i]) < 0)
            return -1;
    return 0;
}

/* Dependencies per op kind: rows of (offset, latency) pairs, a list or tuple of tuples. */
typedef struct {
    Py_ssize_t n, *off, *base;
    double *lat;
} Deps;

static void deps_free(Deps *d) {
    PyMem_Free(d->off); PyMem_Free(d->base); PyMem_Free(d->lat);
    memset(d, 0, sizeof(*d));
}

/* 1 read, 0 when a row is not as expected (no exception), -1 on an error. Offsets may be
 * negative (steady_timing's are relative to the op's own slot); callers check the slots
 * they form. */
static int deps_read(Deps *d, PyObject *rows) {
    memset(d, 0, sizeof(*d));
    if (!PyList_CheckExact(rows))
        return 0;
    d->n = PyList_GET_SIZE(rows);
    Py_ssize_t items = 0;
    for (Py_ssize_t k = 0; k < d->n; k++) {
        PyObject *row = PyList_GET_ITEM(rows, k);
        if (!PyTuple_CheckExact(row) && !PyList_CheckExact(row))
            return 0;
        items += PySequence_Fast_GET_SIZE(row);
    }
    d->off = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(d->n + 1));
    d->base = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(items ? items : 1));
    d->lat = PyMem_Malloc(sizeof(double) * (size_t)(items ? items : 1));
    if (!d->off || !d->base || !d->lat) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t x = 0;
    for (Py_ssize_t k = 0; k < d->n; k++) {
        PyObject *row = PyList_GET_ITEM(rows, k);
        d->off[k] = x;
        for (Py_ssize_t a = 0; a < PySequence_Fast_GET_SIZE(row); a++, x++) {
            PyObject *pair = PySequence_Fast_GET_ITEM(row, a);
            if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2 ||
                !PyLong_CheckExact(PyTuple_GET_ITEM(pair, 0)) || !PyFloat_CheckExact(PyTuple_GET_ITEM(pair, 1)))
                return 0;
            d->base[x] = PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 0));
            if (d->base[x] == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                return 0;
            }
            d->lat[x] = PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(pair, 1));
        }
    }
    d->off[d->n] = x;
    return 1;
}

/* An int item of a list as Py_ssize_t in [0, limit); -1 with an exception otherwise. */
static int item_index(PyObject *list, Py_ssize_t i, Py_ssize_t limit, Py_ssize_t *out) {
    if (!index_in(PyList_GET_ITEM(list, i), limit, out)) {
        PyErr_Format(PyExc_ValueError, "order entry %zd is no op slot below %zd", i, limit);
        return -1;
    }
    return 0;
}

/* list[i] as a long long; -1 with an exception when list is not a list, i out of range or
 * the item no int. */
static int ll_item(PyObject *list, Py_ssize_t i, long long *out) {
    if (!PyList_Check(list) || i < 0 || i >= PyList_GET_SIZE(list)) {
        PyErr_SetString(PyExc_IndexError, "slot list index out of range");
        return -1;
    }
    PyObject *x = PyList_GET_ITEM(list, i);
    if (!PyLong_Check(x)) {
        PyErr_SetString(PyExc_TypeError, "a slot is no int");
        return -1;
    }
    *out = PyLong_AsLongLong(x);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

static int ll_set(PyObject *list, Py_ssize_t i, long long v) {
    if (!PyList_Check(list) || i < 0 || i >= PyList_GET_SIZE(list)) {
        PyErr_SetString(PyExc_IndexError, "slot list index out of range");
        return -1;
    }
    PyObject *x = PyLong_FromLongLong(v);
    return x ? PyList_SetItem(list, i, x) : -1;
}

/* steady_timing._index: the index of op ``slot`` in ``codes`` when it is in the periodic range
 * [lo, hi) (ref: own -> (first index, microbatch)), else -1; -2 with an exception. */
static Py_ssize_t period_index(long long slot, PyObject *codes, Py_ssize_t lo, Py_ssize_t hi, PyObject *ref,
                               long long m, long long period) {
    long long own = slot / m, mb = slot % m, i0, mb0, at;
    PyObject *key = PyLong_FromLongLong(own);
    if (!key)
        return -2;
    PyObject *v = PyDict_GetItemWithError(ref, key);
    Py_DECREF(key);
    if (!v)
        return PyErr_Occurred() ? -2 : -1;
    if (!PyTuple_Check(v) || PyTuple_GET_SIZE(v) != 2) {
        PyErr_SetString(PyExc_TypeError, "a first-period entry is no (index, microbatch) pair");
        return -2;
    }
    i0 = PyLong_AsLongLong(PyTuple_GET_ITEM(v, 0));
    mb0 = PyLong_AsLongLong(PyTuple_GET_ITEM(v, 1));
    if (PyErr_Occurred())
        return -2;
    long long k = i0 + (mb - mb0) * period;
    if (!(lo <= k && k < hi) || k >= PyList_GET_SIZE(codes))
        return -1;
    if (ll_item(codes, (Py_ssize_t)k, &at) < 0)
        return -2;
    return at == slot ? (Py_ssize_t)k : -1;
}

/* A skeleton op's index on rank q by its period (``periodic``: the lowering's (codes, ranges,
 * first periods, ops per period), per rank): 1 with *k when it is in q's periodic range, 0 when
 * it is not (the caller asks its Python lookup), -1 with an exception. */
static int periodic_position(PyObject *periodic, Py_ssize_t q, long long slot, long long m, Py_ssize_t *k) {
    if (!PyTuple_Check(periodic) || PyTuple_GET_SIZE(periodic) != 4) {
        PyErr_SetString(PyExc_TypeError, "periodic must be (codes, ranges, refs, periods)");
        return -1;
    }
    PyObject *codes = PyTuple_GET_ITEM(periodic, 0), *ranges = PyTuple_GET_ITEM(periodic, 1),
             *refs = PyTuple_GET_ITEM(periodic, 2), *periods = PyTuple_GET_ITEM(periodic, 3);
    if (!PyList_Check(codes) || !PyList_Check(ranges) || !PyList_Check(refs) || !PyList_Check(periods) ||
        q < 0 || q >= PyList_GET_SIZE(codes) || q >= PyList_GET_SIZE(ranges) || q >= PyList_GET_SIZE(refs) ||
        q >= PyList_GET_SIZE(periods)) {
        PyErr_SetString(PyExc_TypeError, "periodic: one list entry per rank");
        return -1;
    }
    PyObject *rng = PyList_GET_ITEM(ranges, q), *ref = PyList_GET_ITEM(refs, q);
    Py_ssize_t lo, hi;
    long long per;
    if (!PyTuple_Check(rng) || !PyDict_Check(ref) || !PyArg_ParseTuple(rng, "nn", &lo, &hi) ||
        ll_item(periods, q, &per) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "periodic: a range is no (lo, hi) or a first period no dict");
        return -1;
    }
    Py_ssize_t at = period_index(slot, PyList_GET_ITEM(codes, q), lo, hi, ref, m, per);
    if (at == -2)
        return -1;
    if (at < 0)
        return 0;
    *k = at;
    return 1;
}
