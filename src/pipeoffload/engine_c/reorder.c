/* ---- The slot reorder's loops (pipeoffload.schedules.v_reorder) ----
 *
 * Slots, keys and microbatches are Python ints; here they are long long (a key is
 * ((slot·p + rank)·8 + type)·n + microbatch: far below 2^63 for any grid that fits in
 * memory; a larger one raises OverflowError).
 */

/* out[r][k] (a list) or NULL with an exception. */
static PyObject *slot_row(PyObject *out, Py_ssize_t r, long long k) {
    if (r < 0 || r >= PyList_GET_SIZE(out)) {
        PyErr_SetString(PyExc_IndexError, "rank out of range");
        return NULL;
    }
    PyObject *rows = PyList_GET_ITEM(out, r);
    if (!PyList_Check(rows) || k < 0 || k >= PyList_GET_SIZE(rows)) {
        PyErr_SetString(PyExc_IndexError, "slot type out of range");
        return NULL;
    }
    return PyList_GET_ITEM(rows, (Py_ssize_t)k);
}

/* max(t, out[r][k][j] + 1) into *t; -1 with an exception. */
static int after(PyObject *out, Py_ssize_t r, long long k, long long j, long long *t) {
    PyObject *row = slot_row(out, r, k);
    long long u;
    if (!row || ll_item(row, (Py_ssize_t)j, &u) < 0)
        return -1;
    if (u + 1 > *t)
        *t = u + 1;
    return 0;
}

PyDoc_STRVAR(squeeze_run_doc,
"squeeze_run(order, x, out, last, n, skip)\n--\n\n"
"pipeoffload.schedules.v_reorder._squeeze_run (the same slots, the same calls of\n"
"``skip.skip``), in place on ``out`` and ``last``: the position to go on from.");

static PyObject *squeeze_run(PyObject *self, PyObject *args) {
    PyObject *order, *out, *last, *skip;
    Py_ssize_t x0;
    long long n;
    if (!PyArg_ParseTuple(args, "O!nO!O!LO:squeeze_run", &PyList_Type, &order, &x0, &PyList_Type, &out,
                          &PyList_Type, &last, &n, &skip))
        return NULL;
    const Py_ssize_t p = PyList_GET_SIZE(out);
    if (n <= 0 || p <= 0) {
        PyErr_SetString(PyExc_ValueError, "squeeze_run needs n > 0 and at least one rank");
        return NULL;
    }
    long long T = 0, N = 0, mult[8] = {0}, D[8] = {0};
    Py_ssize_t n_types = 0;
    if (skip != Py_None) {
        PyObject *mult_o = PyObject_GetAttrString(skip, "mult"), *D_o = PyObject_GetAttrString(skip, "D");
        PyObject *T_o = PyObject_GetAttrString(skip, "T"), *N_o = PyObject_GetAttrString(skip, "N");
        int ok = mult_o && D_o && T_o && N_o && PyList_Check(mult_o) && PyList_Check(D_o) &&
                 PyList_GET_SIZE(mult_o) <= 8 && PyList_GET_SIZE(D_o) <= 8;
        if (ok) {
            n_types = PyList_GET_SIZE(mult_o);
            T = PyLong_AsLongLong(T_o);
            N = PyLong_AsLongLong(N_o);
            for (Py_ssize_t k = 0; ok && k < n_types; k++)
                ok = ll_item(mult_o, k, &mult[k]) == 0;
            for (Py_ssize_t k = 0; ok && k < PyList_GET_SIZE(D_o); k++)
                ok = ll_item(D_o, k, &D[k]) == 0;
            ok = ok && !PyErr_Occurred();
        }
        Py_XDECREF(mult_o); Py_XDECREF(D_o); Py_XDECREF(T_o); Py_XDECREF(N_o);
        if (!ok) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "skip has no mult, D, T and N as _SqueezeSkip has");
            return NULL;
        }
    }
    const Py_ssize_t len = PyList_GET_SIZE(order);
    long long streak = 0, check = skip != Py_None ? 2 * N : (long long)len;
    for (Py_ssize_t x = x0; x < len; x++) {
        long long key;
        if (ll_item(order, x, &key) < 0)
            return NULL;
        long long e = key / n, j = key % n, k = e & 7;
        Py_ssize_t r = (Py_ssize_t)((e >> 3) % p);
        long long t;
        if (ll_item(last, r, &t) < 0)
            return NULL;
        if (k == 0 || k == 2) {
            if (r > 0 && after(out, r - 1, k, j, &t) < 0)
                return NULL;
        } else if (k == 1 || k == 3) {
            if (r + 1 < p && after(out, r + 1, k, j, &t) < 0)
                return NULL;
        }
        if (0 < k && k < 4 && after(out, r, k - 1, j, &t) < 0)
            return NULL;
        if (j > 0 && after(out, r, k, j - 1, &t) < 0)
            return NULL;
        PyObject *row = slot_row(out, r, k);
        if (!row)
            return NULL;
        if (skip != Py_None) {
            /* The op is its copy one period on (same place in the slot order) and so is its slot. */
            long long c = k < n_types ? mult[k] : 0, prev = 0, back = 0;
            int same = j >= c && x >= N;
            if (same && ll_item(row, (Py_ssize_t)(j - c), &prev) < 0)
                return NULL;
            same = same && t == prev + T;
            if (same && ll_item(order, x - (Py_ssize_t)N, &back) < 0)
                return NULL;
            if (same && back == key - D[k])
                streak++;
            else {
                streak = 0;
                check = 2 * N;
            }
        }
        if (ll_set(row, (Py_ssize_t)j, t) < 0 || ll_set(last, r, t + 1) < 0)
            return NULL;
        if (streak >= check) {
            PyObject *got = PyObject_CallMethod(skip, "skip", "nL", x + 1, streak);
            long long to, need;
            if (!got)
                return NULL;
            int ok = PyArg_ParseTuple(got, "LL", &to, &need);
            Py_DECREF(got);
            if (!ok)
                return NULL;
            if (to > x + 1)
                return PyLong_FromLongLong(to);
            /* Not proved here: try again once the streak covers what the next ops read. */
            check = need > streak + N ? need : streak + N;
        }
    }
    return PyLong_FromSsize_t(len);
}

static int ll_cmp(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

/* Appends start, start + 1, ..., start + count - 1 to list. */
static int append_range(PyObject *list, long long start, long long count) {
    for (long long v = start; v < start + count; v++) {
        PyObject *x = PyLong_FromLongLong(v);
        if (!x || PyList_Append(list, x) < 0) {
            Py_XDECREF(x);
            return -1;
        }
        Py_DECREF(x);
    }
    return 0;
}

static int append_state(PyObject *states, long long wait0, long long wait1, long long prev) {
    PyObject *st = Py_BuildValue("(LLL)", wait0, wait1, prev);
    int rc = st ? PyList_Append(states, st) : -1;
    Py_XDECREF(st);
    return rc;
}

PyDoc_STRVAR(with_weights_doc,
"with_weights(rows, split, probes, states)\n--\n\n"
"pipeoffload.schedules.v_reorder._with_weights: the same lists (and, with ``probes``, the\n"
"same states appended to ``states``).");

static PyObject *with_weights(PyObject *self, PyObject *args) {
    PyObject *rows, *probes, *states;
    int split;
    if (!PyArg_ParseTuple(args, "O!pOO:with_weights", &PyList_Type, &rows, &split, &probes, &states))
        return NULL;
    const Py_ssize_t n_rows = PyList_GET_SIZE(rows);
    if (n_rows < 4 || (probes != Py_None && (!PyList_Check(probes) ||
                                             (PyList_GET_SIZE(probes) > 0 && !PyList_Check(states))))) {
        PyErr_SetString(PyExc_ValueError, "with_weights needs the four op lists (and probes with a states list)");
        return NULL;
    }
    Py_ssize_t n_ev = 0;
    for (Py_ssize_t k = 0; k < 4; k++) {
        if (!PyList_Check(PyList_GET_ITEM(rows, k))) {
            PyErr_SetString(PyExc_TypeError, "an op list is no list");
            return NULL;
        }
        n_ev += PyList_GET_SIZE(PyList_GET_ITEM(rows, k));
    }
    long long *ev = PyMem_Malloc(sizeof(long long) * (size_t)(n_ev ? n_ev : 1));
    PyObject *out = PyList_New(0);
    if (!ev || !out) {
        PyMem_Free(ev);
        Py_XDECREF(out);
        return PyErr_NoMemory();
    }
    Py_ssize_t e_i = 0;
    for (Py_ssize_t k = 0; k < 4; k++) {
        PyObject *ts = PyList_GET_ITEM(rows, k);
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(ts); i++) {
            long long t;
            if (ll_item(ts, i, &t) < 0)
                goto fail;
            ev[e_i++] = t * 8 + k;
        }
    }
    qsort(ev, (size_t)n_ev, sizeof(long long), ll_cmp);
    for (Py_ssize_t k = 0; k < n_rows + (split ? 2 : 1); k++) {
        PyObject *lst = k < n_rows ? PySequence_List(PyList_GET_ITEM(rows, k)) : PyList_New(0);
        if (!lst || PyList_Append(out, lst) < 0) {
            Py_XDECREF(lst);
            goto fail;
        }
        Py_DECREF(lst);
    }
    PyObject *w0 = PyList_GET_ITEM(out, 4), *w1 = PyList_GET_ITEM(out, PyList_GET_SIZE(out) - 1);
    long long wait0 = 0, wait1 = 0, prev = -1, at = 0;
    Py_ssize_t probe = 0, n_probes = probes == Py_None ? 0 : PyList_GET_SIZE(probes);
    int has_at = probe < n_probes && ll_item(probes, probe++, &at) == 0;
    if (PyErr_Occurred())
        goto fail;
    for (Py_ssize_t x = 0; x < n_ev; x++) {
        long long t = ev[x] >> 3, k = ev[x] & 7;
        while (has_at && t >= at) {
            if (append_state(states, wait0, wait1, prev) < 0)
                goto fail;
            has_at = probe < n_probes && ll_item(probes, probe++, &at) == 0;
            if (PyErr_Occurred())
                goto fail;
        }
        if (wait0 || wait1) {
            long long free = t - prev - 1;  /* slots prev+1 .. t-1, each runs one waiting W */
            if (free > 0) {
                long long n0 = free < wait0 ? free : wait0;
                if (append_range(w0, prev + 1, n0) < 0)
                    goto fail;
                wait0 -= n0;
                long long n1 = free - n0 < wait1 ? free - n0 : wait1;
                if (append_range(w1, prev + 1 + n0, n1) < 0)
                    goto fail;
                wait1 -= n1;
            }
        }
        if (k == 2 || (k == 3 && !split))
            wait0++;
        else if (k == 3)
            wait1++;
        prev = t;
    }
    while (has_at) {
        if (append_state(states, wait0, wait1, prev) < 0)
            goto fail;
        has_at = probe < n_probes && ll_item(probes, probe++, &at) == 0;
        if (PyErr_Occurred())
            goto fail;
    }
    if (append_range(w0, prev + 1, wait0) < 0 || append_range(w1, prev + 1 + wait0, wait1) < 0)
        goto fail;
    PyMem_Free(ev);
    return out;
fail:
    PyMem_Free(ev);
    Py_DECREF(out);
    return NULL;
}

/* ---- v_reorder._reorder's visits ---- */

static const int REORDER_MEM[8] = {1, 1, 0, 0, -1, -1, 0, 0};  /* v_reorder._MEM, by type */

/* Slots taken on one rank: a bitmap over [0, n). */
typedef struct {
    unsigned char *bit;
    long long n;
} Taken;

static int taken_has(const Taken *h, long long q) {
    return q >= 0 && q < h->n && h->bit[q];
}

/* bisect_left of the int list ``ts`` for x in [lo, len); -1 on an error. */
static int bisect_ll(PyObject *ts, long long x, Py_ssize_t lo, Py_ssize_t *out) {
    Py_ssize_t hi = PyList_GET_SIZE(ts);
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        long long v;
        if (ll_item(ts, mid, &v) < 0)
            return -1;
        if (v < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    *out = lo;
    return 0;
}

/* v_reorder._kth: the k-th smallest of the union of the increasing lists a and b. */
static int kth(PyObject *a, PyObject *b, long long k, long long *out) {
    Py_ssize_t na = PyList_GET_SIZE(a), nb = PyList_GET_SIZE(b);
    long long lo = k + 1 - nb > 0 ? k + 1 - nb : 0, hi = k + 1 < na ? k + 1 : na;
    while (lo < hi) {
        long long i = (lo + hi) / 2, x, y;
        if (ll_item(a, (Py_ssize_t)i, &x) < 0 || ll_item(b, (Py_ssize_t)(k - i), &y) < 0)
            return -1;
        if (x < y)
            lo = i + 1;
        else
            hi = i;
    }
    long long x = -1, y = -1;
    if (lo > 0 && ll_item(a, (Py_ssize_t)(lo - 1), &x) < 0)
        return -1;
    if (k - lo >= 0 && ll_item(b, (Py_ssize_t)(k - lo), &y) < 0)
        return -1;
    *out = x > y ? x : y;
    return 0;
}

/* v_reorder._step */
static void reorder_step(long long e, long long *level, long long *pending, long long prev) {
    long long t = e >> 3, k = e & 7;
    if (*pending) {
        long long free = t - prev - 1;
        if (free > 0) {
            long long run = free < *pending ? free : *pending;
            *level -= run;
            *pending -= run;
        }
    }
    *level += REORDER_MEM[k];
    if (k == 2 || k == 3)
        (*pending)++;
}

/* The first free slot of ``h`` in [from, t), or t. */
static long long next_free(const Taken *h, long long from, long long t) {
    long long q = from;
    while (q < t && taken_has(h, q))
        q++;
    return q;
}

static int pair_cmp(const void *a, const void *b) {
    const long long *x = a, *y = b;
    if (x[0] != y[0])
        return (x[0] > y[0]) - (x[0] < y[0]);
    return (x[1] > y[1]) - (x[1] < y[1]);
}

/* v_reorder._first_fit (W's listed), the free slots being those of ``h`` in (hi_dep, t). */
static int first_fit_listed(PyObject *rows, long long k, long long t, const Taken *h, long long hi_dep,
                            long long cap, long long *out) {
    long long lo = next_free(h, hi_dep + 1, t);
    if (lo >= t || REORDER_MEM[k] <= 0) {
        *out = lo >= t ? t : lo;
        return 0;
    }
    long long level = 0, rises = 0;
    Py_ssize_t n_rows = PyList_GET_SIZE(rows), spans_a[8], spans_b[8], n_win = 0;
    for (Py_ssize_t kk = 0; kk < n_rows && kk < 8; kk++) {
        int d = REORDER_MEM[kk];
        spans_a[kk] = spans_b[kk] = 0;
        if (!d)
            continue;
        PyObject *ts = PyList_GET_ITEM(rows, kk);
        Py_ssize_t a, b;
        if (!PyList_Check(ts) || bisect_ll(ts, lo, 0, &a) < 0 || bisect_ll(ts, t, a, &b) < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "an op list is no list");
            return -1;
        }
        level += d * (long long)a;
        if (d > 0)
            rises += b - a;
        spans_a[kk] = a;
        spans_b[kk] = b;
        n_win += b - a;
    }
    if (level + rises < cap) {
        *out = lo;  /* no level in lo..t-1 can reach the cap */
        return 0;
    }
    long long *win = PyMem_Malloc(sizeof(long long) * 2 * (size_t)(n_win ? n_win : 1));
    if (!win) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t w = 0;
    for (Py_ssize_t kk = 0; kk < n_rows && kk < 8; kk++) {
        int d = REORDER_MEM[kk];
        if (!d)
            continue;
        PyObject *ts = PyList_GET_ITEM(rows, kk);
        for (Py_ssize_t i = spans_a[kk]; i < spans_b[kk]; i++, w++) {
            if (ll_item(ts, i, &win[2 * w]) < 0) {
                PyMem_Free(win);
                return -1;
            }
            win[2 * w + 1] = d;
        }
    }
    qsort(win, (size_t)n_win, 2 * sizeof(long long), pair_cmp);
    /* The level is constant between changes: the last slot in lo..t-1 whose level is at
     * the cap; the op fits at the first free slot after it. */
    long long last_full = lo - 1, start = lo;
    for (Py_ssize_t x = 0; x < n_win; x++) {
        long long u = win[2 * x], d = win[2 * x + 1];
        if (level >= cap && u > start)
            last_full = u - 1;
        level += d;
        start = u;
    }
    PyMem_Free(win);
    if (level >= cap && t > start)
        last_full = t - 1;
    *out = lo > last_full ? lo : next_free(h, last_full + 1, t);
    return 0;
}

/* One rank's _RankLevels: its Python lists, changed in place, and its ``low``. */
typedef struct {
    PyObject *obj, *ev, *lv, *pd;
    long long low;
    int low_changed;
} Levels;

/* _RankLevels._window: 1 with the states in st (n_st pairs) when the move fits, 0 when a
 * level exceeds cap, -1 on an error. */
static int levels_window(Levels *L, long long k, long long t, long long q, long long cap, Py_ssize_t *a_out,
                         Py_ssize_t *b_out, long long **st, Py_ssize_t *n_st, Py_ssize_t *cap_st) {
    long long nw = q * 8 + k, old = t * 8 + k, level = 0, pending = 0, prev = -1;
    Py_ssize_t a, b, n_ev = PyList_GET_SIZE(L->ev);
    if (bisect_ll(L->ev, nw, 0, &a) < 0 || bisect_ll(L->ev, old, a, &b) < 0)
        return -1;
    if (a > 0) {
        long long e;
        if (ll_item(L->lv, a - 1, &level) < 0 || ll_item(L->pd, a - 1, &pending) < 0 || ll_item(L->ev, a - 1, &e) < 0)
            return -1;
        prev = e >> 3;
        if (prev < L->low) {
            L->low = prev;
            L->low_changed = 1;
        }
    }
    *n_st = 0;
    for (Py_ssize_t i = a - 1; i < n_ev; i++) {  /* the new event first (i = a − 1), then ev[a:b], then on from b + 1 */
        if (i == b)
            continue;
        long long e;
        if (i == a - 1)
            e = nw;
        else if (ll_item(L->ev, i, &e) < 0)
            return -1;
        reorder_step(e, &level, &pending, prev);
        if (level > cap)
            return 0;
        if (*n_st == *cap_st) {
            Py_ssize_t grow = *cap_st ? 2 * *cap_st : 64;
            long long *g = PyMem_Realloc(*st, sizeof(long long) * 2 * (size_t)grow);
            if (!g) {
                PyErr_NoMemory();
                return -1;
            }
            *st = g;
            *cap_st = grow;
        }
        (*st)[2 * *n_st] = level;
        (*st)[2 * *n_st + 1] = pending;
        (*n_st)++;
        if (i > b) {
            long long lv, pd;
            if (ll_item(L->lv, i, &lv) < 0 || ll_item(L->pd, i, &pd) < 0)
                return -1;
            if (level == lv && pending == pd)
                break;
        }
        prev = e >> 3;
    }
    *a_out = a;
    *b_out = b;
    return 1;
}

/* _RankLevels.first_fit over the free slots of ``h`` in (hi_dep, t); the slot in *out. */
static int levels_first_fit(Levels *L, long long k, long long t, const Taken *h, long long hi_dep, long long cap,
                            long long *out, long long **st, Py_ssize_t *cap_st) {
    for (long long q = next_free(h, hi_dep + 1, t); q < t; q = next_free(h, q + 1, t)) {
        Py_ssize_t a, b, n;
        int got = levels_window(L, k, t, q, cap, &a, &b, st, &n, cap_st);
        if (got < 0)
            return -1;
        if (!got)
            continue;
        /* ev[a:b+1] = [q*8 + k] + ev[a:b]; level and pending from a on: the states */
        PyObject **items = PySequence_Fast_ITEMS(L->ev);
        PyObject *moved = PyLong_FromLongLong(q * 8 + k);
        if (!moved)
            return -1;
        PyObject *dropped = items[b];
        memmove(items + a + 1, items + a, sizeof(PyObject *) * (size_t)(b - a));
        items[a] = moved;
        Py_DECREF(dropped);
        if (a + n > PyList_GET_SIZE(L->lv) || a + n > PyList_GET_SIZE(L->pd)) {
            PyErr_SetString(PyExc_IndexError, "levels shorter than the events");
            return -1;
        }
        for (Py_ssize_t x = 0; x < n; x++)
            if (ll_set(L->lv, a + x, (*st)[2 * x]) < 0 || ll_set(L->pd, a + x, (*st)[2 * x + 1]) < 0)
                return -1;
        *out = q;
        return 0;
    }
    *out = t;
    return 0;
}

/* Checks that every rank of ``grid`` holds at most 8 slot lists; their total length, or -1
 * with an exception. */
static Py_ssize_t grid_size(PyObject *grid) {
    Py_ssize_t total = 0;
    for (Py_ssize_t r = 0; r < PyList_GET_SIZE(grid); r++) {
        PyObject *rows = PyList_GET_ITEM(grid, r);
        if (!PyList_Check(rows) || PyList_GET_SIZE(rows) > 8) {
            PyErr_SetString(PyExc_TypeError, "a rank's rows are no list of at most 8 slot lists");
            return -1;
        }
        for (Py_ssize_t k = 0; k < PyList_GET_SIZE(rows); k++) {
            if (!PyList_Check(PyList_GET_ITEM(rows, k))) {
                PyErr_SetString(PyExc_TypeError, "a slot list is no list");
                return -1;
            }
            total += PyList_GET_SIZE(PyList_GET_ITEM(rows, k));
        }
    }
    return total;
}

PyDoc_STRVAR(reorder_visits_doc,
"reorder_visits(grid, visit, n, t1, read, levels, cap)\n--\n\n"
"pipeoffload.schedules.v_reorder._reorder's loop over ``visit`` (in place on ``grid`` and on\n"
"``levels``, a list of _RankLevels or None): the earliest slot a cool-down visit read (when\n"
"``read``; else None), or NotImplemented when a slot is negative (the Python loop runs then;\n"
"nothing is changed).");

static PyObject *reorder_visits(PyObject *self, PyObject *args) {
    PyObject *grid, *visit, *levels_o;
    long long n, t1, cap;
    int read;
    if (!PyArg_ParseTuple(args, "O!O!LLpOL:reorder_visits", &PyList_Type, &grid, &PyList_Type, &visit, &n, &t1,
                          &read, &levels_o, &cap))
        return NULL;
    const Py_ssize_t p = PyList_GET_SIZE(grid);
    if (n <= 0 || p <= 0 || (levels_o != Py_None && (!PyList_Check(levels_o) || PyList_GET_SIZE(levels_o) != p))) {
        PyErr_SetString(PyExc_ValueError, "reorder_visits: n > 0, ranks and one _RankLevels per rank");
        return NULL;
    }
    /* Slot range, for the taken bitmaps: every list is increasing, so its ends bound it. */
    long long lo_slot = 0, hi_slot = 0;
    if (grid_size(grid) < 0)
        return NULL;
    for (Py_ssize_t r = 0; r < p; r++) {
        PyObject *rows = PyList_GET_ITEM(grid, r);
        for (Py_ssize_t k = 0; k < PyList_GET_SIZE(rows); k++) {
            PyObject *ts = PyList_GET_ITEM(rows, k);
            long long x;
            for (Py_ssize_t i = 0; i < PyList_GET_SIZE(ts); i++) {  /* (each slot once: the bitmaps below) */
                if (ll_item(ts, i, &x) < 0)
                    return NULL;
                if (x < lo_slot)
                    lo_slot = x;
                if (x > hi_slot)
                    hi_slot = x;
            }
        }
    }
    if (lo_slot < 0)
        Py_RETURN_NOTIMPLEMENTED;
    Taken *taken = PyMem_Calloc((size_t)p, sizeof(Taken));
    Levels *lev = levels_o != Py_None ? PyMem_Calloc((size_t)p, sizeof(Levels)) : NULL;
    long long *st = NULL;
    Py_ssize_t cap_st = 0;
    PyObject *result = NULL;
    long long low = (long long)1 << 62;  /* v_reorder._NO_READ */
    if (!taken || (levels_o != Py_None && !lev)) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t r = 0; r < p; r++) {
        PyObject *rows = PyList_GET_ITEM(grid, r);
        taken[r].n = hi_slot + 2;
        taken[r].bit = PyMem_Calloc((size_t)taken[r].n, 1);
        if (!taken[r].bit) {
            PyErr_NoMemory();
            goto out;
        }
        for (Py_ssize_t k = 0; k < PyList_GET_SIZE(rows); k++) {
            PyObject *ts = PyList_GET_ITEM(rows, k);
            for (Py_ssize_t i = 0; i < PyList_GET_SIZE(ts); i++) {
                long long x;
                if (ll_item(ts, i, &x) < 0)
                    goto out;
                taken[r].bit[x] = 1;
            }
        }
        if (lev) {
            Levels *L = &lev[r];
            L->obj = PyList_GET_ITEM(levels_o, r);
            PyObject *low_o = PyObject_GetAttrString(L->obj, "low");
            L->ev = PyObject_GetAttrString(L->obj, "events");
            L->lv = PyObject_GetAttrString(L->obj, "level");
            L->pd = PyObject_GetAttrString(L->obj, "pending");
            int ok = low_o && L->ev && L->lv && L->pd && PyList_CheckExact(L->ev) && PyList_Check(L->lv) &&
                     PyList_Check(L->pd);
            if (ok) {
                L->low = PyLong_AsLongLong(low_o);
                ok = !(L->low == -1 && PyErr_Occurred());
            }
            Py_XDECREF(low_o);
            if (!ok) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_TypeError, "levels must be _RankLevels (events, level, pending lists, low)");
                goto out;
            }
        }
    }
    const Py_ssize_t n_visit = PyList_GET_SIZE(visit);
    for (Py_ssize_t x = 0; x < n_visit; x++) {
        long long e;
        if (ll_item(visit, x, &e) < 0)
            goto out;
        long long j = e % n;
        e /= n;
        long long k = e & 7;
        e >>= 3;
        long long t = e / p;
        Py_ssize_t r = (Py_ssize_t)(e % p);
        PyObject *rows = PyList_GET_ITEM(grid, r);
        if (k >= PyList_GET_SIZE(rows)) {
            PyErr_SetString(PyExc_IndexError, "a visit's type has no slot list");
            goto out;
        }
        /* Its inputs: the latest bounds where it may go; the earliest, what a cool-down visit reads. */
        long long hi_dep = -1, lo_dep = t, u;
        PyObject *nb = NULL;
        if (k == 0 || k == 2) {
            if (r > 0)
                nb = PyList_GET_ITEM(grid, r - 1);
        } else if ((k == 1 || k == 3) && r + 1 < p)
            nb = PyList_GET_ITEM(grid, r + 1);
        if (nb) {
            PyObject *ts = PySequence_Fast_GET_SIZE(nb) > k ? PyList_GET_ITEM(nb, k) : NULL;
            if (!ts) {
                PyErr_SetString(PyExc_IndexError, "a neighbour has no such slot list");
                goto out;
            }
            if (ll_item(ts, (Py_ssize_t)j, &u) < 0)
                goto out;
            hi_dep = lo_dep = u;
        }
        int have = 0;
        if (0 < k && k < 4) {
            if (ll_item(PyList_GET_ITEM(rows, k - 1), (Py_ssize_t)j, &u) < 0)
                goto out;
            have = 1;
        } else if (k == 4) {
            if (kth(PyList_GET_ITEM(rows, 2), PyList_GET_ITEM(rows, 3), j, &u) < 0)
                goto out;
            have = 1;
        }
        if (have) {
            if (u > hi_dep)
                hi_dep = u;
            if (u < lo_dep)
                lo_dep = u;
        }
        if (j > 0) {
            if (ll_item(PyList_GET_ITEM(rows, k), (Py_ssize_t)(j - 1), &u) < 0)
                goto out;
            if (u > hi_dep)
                hi_dep = u;
            if (u < lo_dep)
                lo_dep = u;
        }
        if (read && t >= t1 && lo_dep < low)
            low = lo_dep;
        long long q;
        if (!lev && REORDER_MEM[k] <= 0)
            q = next_free(&taken[r], hi_dep + 1, t);  /* an op that raises no level: the first free slot */
        else if (!lev) {
            if (first_fit_listed(rows, k, t, &taken[r], hi_dep, cap, &q) < 0)
                goto out;
        } else if (levels_first_fit(&lev[r], k, t, &taken[r], hi_dep, cap, &q, &st, &cap_st) < 0)
            goto out;
        if (q != t) {
            if (q < 0 || q >= taken[r].n) {  /* (never: q is below t, or after inputs that are) */
                PyErr_Format(PyExc_ValueError, "reorder_visits: op moved to slot %lld outside the grid", q);
                goto out;
            }
            if (t < taken[r].n)
                taken[r].bit[t] = 0;
            taken[r].bit[q] = 1;
            if (ll_set(PyList_GET_ITEM(rows, k), (Py_ssize_t)j, q) < 0)
                goto out;
        }
    }
    if (read)
        result = PyLong_FromLongLong(low);
    else {
        result = Py_None;
        Py_INCREF(result);
    }
out:
    if (lev) {
        for (Py_ssize_t r = 0; r < p; r++) {
            Levels *L = &lev[r];
            if (L->low_changed && result) {
                PyObject *v = PyLong_FromLongLong(L->low);
                if (!v || PyObject_SetAttrString(L->obj, "low", v) < 0)
                    Py_CLEAR(result);
                Py_XDECREF(v);
            }
            Py_XDECREF(L->ev); Py_XDECREF(L->lv); Py_XDECREF(L->pd);
        }
        PyMem_Free(lev);
    }
    if (taken) {
        for (Py_ssize_t r = 0; r < p; r++)
            PyMem_Free(taken[r].bit);
        PyMem_Free(taken);
    }
    PyMem_Free(st);
    return result;
}

/* The slot-order keys ((t*p + r)*8 + k)*n + j of every op of ``grid`` (per rank, per type, the
 * slot of each microbatch; one rank: p = 1), sorted, in a fresh array (*total of them); NULL with
 * an exception when a rank's rows are not at most 8 lists of ints. */
static long long *sorted_slot_keys(PyObject *grid, long long n, Py_ssize_t *total) {
    const Py_ssize_t p = PyList_GET_SIZE(grid);
    if ((*total = grid_size(grid)) < 0)
        return NULL;
    long long *keys = PyMem_Malloc(sizeof(long long) * (size_t)(*total ? *total : 1));
    if (!keys) {
        PyErr_NoMemory();
        return NULL;
    }
    Py_ssize_t x = 0;
    for (Py_ssize_t r = 0; r < p; r++) {
        PyObject *rows = PyList_GET_ITEM(grid, r);
        for (Py_ssize_t k = 0; k < PyList_GET_SIZE(rows); k++) {
            PyObject *ts = PyList_GET_ITEM(rows, k);
            for (Py_ssize_t j = 0; j < PyList_GET_SIZE(ts); j++) {
                long long t;
                if (ll_item(ts, j, &t) < 0) {
                    PyMem_Free(keys);
                    return NULL;
                }
                keys[x++] = ((t * p + r) * 8 + k) * n + j;
            }
        }
    }
    qsort(keys, (size_t)*total, sizeof(long long), ll_cmp);
    return keys;
}

PyDoc_STRVAR(slot_ordered_doc,
"slot_ordered(rows, n, table, bounds)\n--\n\n"
"One rank's ops in slot order (pipeoffload.schedules.v_reorder._lower): the op of type k and\n"
"microbatch j at slot rows[k][j] is table[k][j]; ops sorted by (slot, type, microbatch) as the\n"
"key (slot*8 + type)*n + j. Returns (ops, [bisect_left of each key bound in the sorted keys]).");

static PyObject *slot_ordered(PyObject *self, PyObject *args) {
    PyObject *rows, *table, *bounds;
    long long n;
    if (!PyArg_ParseTuple(args, "O!LO!O!:slot_ordered", &PyList_Type, &rows, &n, &PyList_Type, &table, &PyList_Type,
                          &bounds))
        return NULL;
    const Py_ssize_t nk = PyList_GET_SIZE(rows);
    if (n <= 0 || nk > 8 || PyList_GET_SIZE(table) < nk) {
        PyErr_SetString(PyExc_ValueError, "slot_ordered: n > 0, at most 8 op types, a table row per type");
        return NULL;
    }
    Py_ssize_t total;
    PyObject *one = PyList_New(1);  /* the rank's rows as a grid of one rank */
    if (!one)
        return NULL;
    Py_INCREF(rows);
    PyList_SET_ITEM(one, 0, rows);
    long long *keys = sorted_slot_keys(one, n, &total);
    Py_DECREF(one);
    if (!keys)
        return NULL;
    PyObject *out = PyList_New(total), *at = PyList_New(PyList_GET_SIZE(bounds)), *result = NULL;
    if (!out || !at)
        goto done;
    for (Py_ssize_t i = 0; i < total; i++) {
        long long e = keys[i], j = e % n;
        Py_ssize_t k = (Py_ssize_t)((e / n) & 7);
        PyObject *row = PyList_GET_ITEM(table, k);
        PyObject *op = PySequence_GetItem(row, (Py_ssize_t)j);
        if (!op)
            goto done;
        PyList_SET_ITEM(out, i, op);
    }
    for (Py_ssize_t b = 0; b < PyList_GET_SIZE(bounds); b++) {
        long long v;
        if (ll_item(bounds, b, &v) < 0)
            goto done;
        Py_ssize_t lo = 0, hi = total;
        while (lo < hi) {
            Py_ssize_t mid = (lo + hi) / 2;
            if (keys[mid] < v)
                lo = mid + 1;
            else
                hi = mid;
        }
        PyObject *o = PyLong_FromSsize_t(lo);
        if (!o)
            goto done;
        PyList_SET_ITEM(at, b, o);
    }
    result = Py_BuildValue("(OO)", out, at);
done:
    Py_XDECREF(out);
    Py_XDECREF(at);
    PyMem_Free(keys);
    return result;
}
