/* The timing pass's list-scheduling loops (pipeoffload.passes.timing: _time_compact_py,
 * _time_in_runs_py) on C copies of their inputs, and the helpers every part uses to read them. */

/* The engine's inputs as C arrays. */
typedef struct {
    Py_ssize_t m, n_end, n_deps, n_own, p, n_ops;
    double origin;
    double *end;           /* n_end */
    double *clock;         /* p (the first p entries of the clock list) */
    Py_ssize_t *dep_off;   /* n_deps + 1 */
    Py_ssize_t *dep_base;  /* dep_off[n_deps] */
    double *dep_lat;
    Py_ssize_t *own;       /* n_own */
    double *dur;           /* n_own */
    Py_ssize_t *op_off;    /* p + 1: rank r's ops are [op_off[r], op_off[r + 1]) */
    Py_ssize_t *ti;        /* n_ops */
    Py_ssize_t *mb;        /* n_ops */
} Engine;

static void engine_free(Engine *e) {
    PyMem_Free(e->end); PyMem_Free(e->clock); PyMem_Free(e->dep_off); PyMem_Free(e->dep_base);
    PyMem_Free(e->dep_lat); PyMem_Free(e->own); PyMem_Free(e->dur); PyMem_Free(e->op_off);
    PyMem_Free(e->ti); PyMem_Free(e->mb);
    memset(e, 0, sizeof(*e));
}

/* A list of p numbers as doubles (floats, or ints where ``ints``); 0 (no exception) when
 * an item is neither. */
static int numbers(PyObject *list, Py_ssize_t p, double *out, int ints) {
    if (!PyList_CheckExact(list) || PyList_GET_SIZE(list) < p)
        return 0;
    for (Py_ssize_t i = 0; i < p; i++) {
        PyObject *x = PyList_GET_ITEM(list, i);
        if (PyFloat_CheckExact(x))
            out[i] = PyFloat_AS_DOUBLE(x);
        else if (ints && PyLong_CheckExact(x)) {
            out[i] = PyLong_AsDouble(x);
            if (out[i] == -1.0 && PyErr_Occurred()) {
                PyErr_Clear();
                return 0;
            }
        } else
            return 0;
    }
    return 1;
}

/* An int as a Py_ssize_t in [0, limit); 0 (no exception) otherwise. */
static int index_in(PyObject *x, Py_ssize_t limit, Py_ssize_t *out) {
    if (!PyLong_Check(x))
        return 0;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(x, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    if (v < 0 || v >= (long long)limit)
        return 0;
    *out = (Py_ssize_t)v;
    return 1;
}

/* Reads the inputs. Returns 1 when every one is as the loops need, 0 when the Python
 * loop must run (no exception set), -1 on an error (exception set). Checks every index
 * the loops form: 0 <= ti < n_own, 0 <= mb < m, 0 <= own < n_deps with own*m + m <= n_end,
 * every dependency base with base + m <= n_end. */
static int engine_read(Engine *e, Py_ssize_t m, PyObject *deps, PyObject *clock, PyObject *origin,
                       PyObject *end, PyObject *tis, PyObject *mbs, PyObject *own_of, PyObject *dur_of) {
    memset(e, 0, sizeof(*e));
    if (m <= 0 || !PyList_CheckExact(deps) || !PyList_CheckExact(clock) || !PyFloat_CheckExact(origin) ||
        !PyList_CheckExact(end) || !PyList_CheckExact(own_of) || !PyList_CheckExact(dur_of) ||
        !(PyList_CheckExact(tis) || PyTuple_CheckExact(tis)) || !(PyList_CheckExact(mbs) || PyTuple_CheckExact(mbs)))
        return 0;
    if (PyList_GET_SIZE(end) < m)
        return 0;
    e->m = m;
    e->origin = PyFloat_AS_DOUBLE(origin);
    e->n_end = PyList_GET_SIZE(end);
    e->n_deps = PyList_GET_SIZE(deps);
    e->n_own = PyList_GET_SIZE(own_of);
    e->p = PySequence_Fast_GET_SIZE(tis);
    if (PySequence_Fast_GET_SIZE(mbs) != e->p || PyList_GET_SIZE(clock) < e->p || PyList_GET_SIZE(dur_of) < e->n_own)
        return 0;
    PyObject **tis_items = PySequence_Fast_ITEMS(tis), **mbs_items = PySequence_Fast_ITEMS(mbs);
    Py_ssize_t n_ops = 0;
    for (Py_ssize_t r = 0; r < e->p; r++) {
        PyObject *t = tis_items[r], *j = mbs_items[r];
        if (!PyList_CheckExact(t) || !PyList_CheckExact(j) || PyList_GET_SIZE(t) != PyList_GET_SIZE(j))
            return 0;
        n_ops += PyList_GET_SIZE(t);
    }
    Py_ssize_t n_dep_items = 0;
    for (Py_ssize_t d = 0; d < e->n_deps; d++) {
        PyObject *row = PyList_GET_ITEM(deps, d);
        if (!PyTuple_CheckExact(row))
            return 0;
        n_dep_items += PyTuple_GET_SIZE(row);
    }
    e->n_ops = n_ops;
    e->end = PyMem_Malloc(sizeof(double) * (size_t)(e->n_end ? e->n_end : 1));
    e->clock = PyMem_Malloc(sizeof(double) * (size_t)(e->p ? e->p : 1));
    e->dep_off = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(e->n_deps + 1));
    e->dep_base = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(n_dep_items ? n_dep_items : 1));
    e->dep_lat = PyMem_Malloc(sizeof(double) * (size_t)(n_dep_items ? n_dep_items : 1));
    e->own = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(e->n_own ? e->n_own : 1));
    e->dur = PyMem_Malloc(sizeof(double) * (size_t)(e->n_own ? e->n_own : 1));
    e->op_off = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(e->p + 1));
    e->ti = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(n_ops ? n_ops : 1));
    e->mb = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(n_ops ? n_ops : 1));
    if (!e->end || !e->clock || !e->dep_off || !e->dep_base || !e->dep_lat || !e->own || !e->dur ||
        !e->op_off || !e->ti || !e->mb) {
        PyErr_NoMemory();
        return -1;
    }
    if (!numbers(end, e->n_end, e->end, 0) || !numbers(clock, e->p, e->clock, 0) ||
        !numbers(dur_of, e->n_own, e->dur, 0))
        return 0;
    Py_ssize_t k = 0;
    for (Py_ssize_t d = 0; d < e->n_deps; d++) {
        PyObject *row = PyList_GET_ITEM(deps, d);
        e->dep_off[d] = k;
        for (Py_ssize_t a = 0; a < PyTuple_GET_SIZE(row); a++, k++) {
            PyObject *pair = PyTuple_GET_ITEM(row, a);
            if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2 ||
                !index_in(PyTuple_GET_ITEM(pair, 0), e->n_end - m + 1, &e->dep_base[k]) ||
                !PyFloat_CheckExact(PyTuple_GET_ITEM(pair, 1)))
                return 0;
            e->dep_lat[k] = PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(pair, 1));
        }
    }
    e->dep_off[e->n_deps] = k;
    for (Py_ssize_t i = 0; i < e->n_own; i++) {
        Py_ssize_t own;
        if (!index_in(PyList_GET_ITEM(own_of, i), e->n_deps, &own) || own > (e->n_end - m) / m)
            return 0;
        e->own[i] = own;
    }
    Py_ssize_t o = 0;
    for (Py_ssize_t r = 0; r < e->p; r++) {
        PyObject *t = tis_items[r], *j = mbs_items[r];
        e->op_off[r] = o;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(t); i++, o++)
            if (!index_in(PyList_GET_ITEM(t, i), e->n_own, &e->ti[o]) || !index_in(PyList_GET_ITEM(j, i), m, &e->mb[o]))
                return 0;
    }
    e->op_off[e->p] = o;
    return 1;
}

static PyObject *array_type;  /* array.array */

/* ``array('d')`` of n doubles. */
static PyObject *double_array(const double *x, Py_ssize_t n) {
    return PyObject_CallFunction(array_type, "sy#", "d", (const char *)x, n * (Py_ssize_t)sizeof(double));
}

/* Writes the C results back as the Python loop leaves them: ``end`` at every slot an op
 * placed (in op order, so a slot placed twice ends with its later end), ``clock`` of each
 * rank, and each rank's starts and ends as ``array('d')`` (0.0 where no op was placed). */
static PyObject *engine_write(Engine *e, PyObject *clock, PyObject *end, const Py_ssize_t *done,
                              const double *st, const double *en) {
    PyObject *starts = PyList_New(e->p), *ends = PyList_New(e->p);
    if (!starts || !ends)
        goto fail;
    for (Py_ssize_t r = 0; r < e->p; r++) {
        Py_ssize_t a = e->op_off[r], n = e->op_off[r + 1] - a;
        PyObject *sl = double_array(st + a, n), *el = double_array(en + a, n);
        if (!sl || !el) {
            Py_XDECREF(sl); Py_XDECREF(el);
            goto fail;
        }
        PyList_SET_ITEM(starts, r, sl);
        PyList_SET_ITEM(ends, r, el);
        for (Py_ssize_t i = a; i < a + done[r]; i++) {
            Py_ssize_t slot = e->own[e->ti[i]] * e->m + e->mb[i];
            PyObject *x = PyFloat_FromDouble(e->end[slot]);
            if (!x || PyList_SetItem(end, slot, x) < 0)
                goto fail;
        }
        PyObject *c = PyFloat_FromDouble(e->clock[r]);
        if (!c || PyList_SetItem(clock, r, c) < 0)
            goto fail;
    }
    return Py_BuildValue("(NN)", starts, ends);
fail:
    Py_XDECREF(starts);
    Py_XDECREF(ends);
    return NULL;
}

PyDoc_STRVAR(time_compact_doc,
"time_compact(m, deps, clock, origin, end, tis, mbs, own_of, dur_of, runs)\n--\n\n"
"pipeoffload.passes.timing._time_compact_py's loop: (starts, ends, placed), or None when\n"
"an input is outside what the C loop handles (nothing is changed then).");

/* Both loops' arguments: (m, deps, clock, origin, end, tis, mbs, own_of, dur_of, runs). */
typedef struct {
    Py_ssize_t m;
    PyObject *deps, *clock, *origin, *end, *tis, *mbs, *own_of, *dur_of, *runs;
} Args;

/* Parses ``args`` and reads the engine's inputs (engine_read): 1 to run the C loop, 0 when
 * the Python loop must (``e`` freed), -1 on an error (exception set, ``e`` freed). */
static int engine_args(PyObject *args, const char *format, Args *a, Engine *e) {
    memset(e, 0, sizeof(*e));
    if (!PyArg_ParseTuple(args, format, &a->m, &a->deps, &a->clock, &a->origin, &a->end, &a->tis, &a->mbs,
                          &a->own_of, &a->dur_of, &a->runs))
        return -1;
    int ok = engine_read(e, a->m, a->deps, a->clock, a->origin, a->end, a->tis, a->mbs, a->own_of, a->dur_of);
    if (ok <= 0)
        engine_free(e);
    return ok;
}

static PyObject *time_compact(PyObject *self, PyObject *args) {
    Args in;
    Engine e;
    int ok = engine_args(args, "nOOOOOOOOO:time_compact", &in, &e);
    if (ok <= 0) {
        if (ok < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *clock = in.clock, *end = in.end, *runs = in.runs;
    if (runs != Py_None && !PyList_CheckExact(runs)) {
        engine_free(&e);
        Py_RETURN_NONE;
    }
    Py_ssize_t p = e.p, n_end = e.n_end;
    Py_ssize_t *done = PyMem_Calloc((size_t)(p ? p : 1), sizeof(Py_ssize_t));
    Py_ssize_t *ready = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(p ? p : 1));
    Py_ssize_t *wnext = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(p ? p : 1));
    /* Ranks waiting for a slot, in the order they began to wait: head and tail per slot
     * (rank + 1; 0 = none), linked through wnext. A rank waits for at most one slot and is
     * then not in the ready queue, so p entries hold every queue. */
    Py_ssize_t *whead = PyMem_Calloc((size_t)(n_end ? n_end : 1), sizeof(Py_ssize_t));
    Py_ssize_t *wtail = PyMem_Calloc((size_t)(n_end ? n_end : 1), sizeof(Py_ssize_t));
    double *st = PyMem_Calloc((size_t)(e.n_ops ? e.n_ops : 1), sizeof(double));
    double *en = PyMem_Calloc((size_t)(e.n_ops ? e.n_ops : 1), sizeof(double));
    Py_ssize_t *run_list = NULL, n_runs = 0, cap_runs = 0;
    PyObject *result = NULL;
    if (!done || !ready || !wnext || !whead || !wtail || !st || !en) {
        PyErr_NoMemory();
        goto out;
    }
    const double unplaced = -INFINITY;
    const double origin_t = e.origin;
    Py_ssize_t q_head = 0, q_len = p;
    for (Py_ssize_t r = 0; r < p; r++)
        ready[r] = r;
    while (q_len > 0) {
        Py_ssize_t r = ready[q_head];
        q_head = (q_head + 1) % p;
        q_len--;
        Py_ssize_t a = e.op_off[r], n = e.op_off[r + 1] - a;
        Py_ssize_t i = done[r], i0 = i;
        double c = e.clock[r];
        while (i < n) {
            Py_ssize_t k = e.ti[a + i], j = e.mb[a + i], own = e.own[k];
            double t = origin_t;
            Py_ssize_t missing = -1;
            for (Py_ssize_t d = e.dep_off[own]; d < e.dep_off[own + 1]; d++) {
                double x = e.end[e.dep_base[d] + j];
                if (x == unplaced) {
                    missing = e.dep_base[d] + j;
                    break;
                }
                x += e.dep_lat[d];
                if (x > t)
                    t = x;
            }
            if (missing >= 0) {
                wnext[r] = 0;
                if (wtail[missing])
                    wnext[wtail[missing] - 1] = r + 1;
                else
                    whead[missing] = r + 1;
                wtail[missing] = r + 1;
                break;
            }
            if (c > t)
                t = c;
            Py_ssize_t slot = own * e.m + j;
            st[a + i] = t;
            en[a + i] = e.end[slot] = c = t + e.dur[k];
            i++;
            Py_ssize_t w = whead[slot];
            if (w) {
                whead[slot] = wtail[slot] = 0;
                for (; w; w = wnext[w - 1]) {
                    ready[(q_head + q_len) % p] = w - 1;
                    q_len++;
                }
            }
        }
        done[r] = i;
        e.clock[r] = c;
        if (runs != Py_None && i > i0) {
            if (n_runs == cap_runs) {
                cap_runs = cap_runs ? 2 * cap_runs : 256;
                Py_ssize_t *grown = PyMem_Realloc(run_list, sizeof(Py_ssize_t) * 2 * (size_t)cap_runs);
                if (!grown) {
                    PyErr_NoMemory();
                    goto out;
                }
                run_list = grown;
            }
            run_list[2 * n_runs] = r;
            run_list[2 * n_runs + 1] = i - i0;
            n_runs++;
        }
    }
    for (Py_ssize_t x = 0; x < n_runs; x++) {
        PyObject *pair = Py_BuildValue("(nn)", run_list[2 * x], run_list[2 * x + 1]);
        if (!pair || PyList_Append(runs, pair) < 0) {
            Py_XDECREF(pair);
            goto out;
        }
        Py_DECREF(pair);
    }
    {
        PyObject *se = engine_write(&e, clock, end, done, st, en);
        if (!se)
            goto out;
        Py_ssize_t placed = 0;
        for (Py_ssize_t r = 0; r < p; r++)
            placed += done[r];
        result = Py_BuildValue("(OOn)", PyTuple_GET_ITEM(se, 0), PyTuple_GET_ITEM(se, 1), placed);
        Py_DECREF(se);
    }
out:
    PyMem_Free(done); PyMem_Free(ready); PyMem_Free(wnext); PyMem_Free(whead); PyMem_Free(wtail);
    PyMem_Free(st); PyMem_Free(en); PyMem_Free(run_list);
    engine_free(&e);
    return result;
}

PyDoc_STRVAR(time_in_runs_doc,
"time_in_runs(m, deps, clock, origin, end, tis, mbs, own_of, dur_of, runs)\n--\n\n"
"pipeoffload.passes.timing._time_in_runs_py's loop: (starts, ends), or None when an input\n"
"is outside what the C loop handles (nothing is changed then). ``runs``: flat (rank, count)\n"
"pairs, a sequence of ints.");

static PyObject *time_in_runs(PyObject *self, PyObject *args) {
    Args in;
    Engine e;
    int ok = engine_args(args, "nOOOOOOOOO:time_in_runs", &in, &e);
    if (ok <= 0) {
        if (ok < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *clock = in.clock, *end = in.end, *runs = in.runs;
    Py_ssize_t p = e.p;
    PyObject *flat = PySequence_Fast(runs, "runs must be a sequence");
    Py_ssize_t *done = PyMem_Calloc((size_t)(p ? p : 1), sizeof(Py_ssize_t));
    Py_ssize_t *pairs = NULL;
    double *st = PyMem_Calloc((size_t)(e.n_ops ? e.n_ops : 1), sizeof(double));
    double *en = PyMem_Calloc((size_t)(e.n_ops ? e.n_ops : 1), sizeof(double));
    PyObject *result = NULL;
    if (!flat)
        goto out;
    Py_ssize_t n_flat = PySequence_Fast_GET_SIZE(flat);
    pairs = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(n_flat ? n_flat : 1));
    if (!done || !st || !en || !pairs) {
        PyErr_NoMemory();
        goto out;
    }
    /* Check the runs first: each names a rank and stays within its list (the Python loop
     * would raise partway through, after changing the engine; that case is left to it). */
    int fits = n_flat % 2 == 0;
    for (Py_ssize_t x = 0; fits && x < n_flat; x += 2) {
        Py_ssize_t r, n;
        PyObject **items = PySequence_Fast_ITEMS(flat);
        fits = index_in(items[x], p, &r) && index_in(items[x + 1], PY_SSIZE_T_MAX, &n) &&
               n <= e.op_off[r + 1] - e.op_off[r] - done[r];
        if (fits) {
            pairs[x] = r;
            pairs[x + 1] = n;
            done[r] += n;
        }
    }
    if (!fits) {
        result = Py_None;
        Py_INCREF(result);
        goto out;
    }
    memset(done, 0, sizeof(Py_ssize_t) * (size_t)(p ? p : 1));
    const double origin_t = e.origin;
    for (Py_ssize_t x = 0; x < n_flat; x += 2) {
        Py_ssize_t r = pairs[x], n = pairs[x + 1];
        Py_ssize_t a = e.op_off[r], i0 = done[r];
        double c = e.clock[r];
        for (Py_ssize_t i = i0; i < i0 + n; i++) {
            Py_ssize_t k = e.ti[a + i], j = e.mb[a + i], own = e.own[k];
            double t = origin_t;
            for (Py_ssize_t d = e.dep_off[own]; d < e.dep_off[own + 1]; d++) {
                double v = e.end[e.dep_base[d] + j];
                v += e.dep_lat[d];
                if (v > t)
                    t = v;
            }
            if (c > t)
                t = c;
            st[a + i] = t;
            en[a + i] = e.end[own * e.m + j] = c = t + e.dur[k];
        }
        done[r] = i0 + n;
        e.clock[r] = c;
    }
    /* Ranks no run names keep their clock; write-back rewrites it with the same value. */
    result = engine_write(&e, clock, end, done, st, en);
out:
    Py_XDECREF(flat);
    PyMem_Free(done); PyMem_Free(pairs); PyMem_Free(st); PyMem_Free(en);
    engine_free(&e);
    return result;
}
