/* The list-scheduling engine's per-op loops in C, op for op and float for float:
 * pipeoffload.passes.timing's _time_compact_py and _time_in_runs_py, and (below, in place
 * on their Python state) pipeoffload.passes.steady_timing._Engine._run_py and
 * pipeoffload.schedules.w_refill._Refill._run_py.
 *
 * Why: the planner times several hundred schedules of 10^5-10^6 ops each; the first two
 * loops were ~ 20 % of a Llama-405B plan's CPU in pure Python (docs/planner.md §4g); the
 * V lowerings' periodic timings and W refills were ~ 18 % of V-auto's at p = 64
 * (docs/algorithms.md §9.16).
 *
 * Guarantees: each function returns exactly what its Python twin returns and leaves the
 * engine's ``clock`` and ``end`` lists as it would (IEEE doubles, the same comparisons and
 * additions in the same order; nothing here is reassociated), or returns None without
 * touching anything when an input is outside what it handles (a non-float time, a
 * non-int address, an index out of range); the caller then runs the Python loop. Built
 * optionally (setup.py): without a C compiler the package runs the Python loops.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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

/* A float list's items as doubles; 0 (no exception) when one is not exactly a float. */
static int floats(PyObject *list, Py_ssize_t n, double *out) {
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyList_GET_ITEM(list, i);
        if (!PyFloat_CheckExact(x))
            return 0;
        out[i] = PyFloat_AS_DOUBLE(x);
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
    if (!floats(end, e->n_end, e->end) || !floats(clock, e->p, e->clock) || !floats(dur_of, e->n_own, e->dur))
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

PyDoc_STRVAR(steady_run_doc,
"steady_run(engine)\n--\n\n"
"pipeoffload.passes.steady_timing._Engine.run's loop on ``engine`` (in place): whether every\n"
"rank reached its limit, or None when an input is outside what the C loop handles (nothing\n"
"is changed then).");

static PyObject *steady_run(PyObject *self, PyObject *args) {
    PyObject *eng;
    if (!PyArg_ParseTuple(args, "O:steady_run", &eng))
        return NULL;
    PyObject *codes = NULL, *rel = NULL, *end = NULL, *durc = NULL, *origin_o = NULL, *clock = NULL, *first = NULL,
             *done_l = NULL, *lim_l = NULL, *waiting = NULL, *blocked_l = NULL, *locate = NULL, *m_o = NULL;
    PyObject **slots[] = {&codes, &rel, &end, &durc, &origin_o, &clock, &first, &done_l, &lim_l, &waiting,
                          &blocked_l, &locate, &m_o};
    const char *names[] = {"codes", "rel", "end", "durc", "origin", "clock", "first", "done", "lim", "waiting",
                           "blocked", "locate", "m"};
    PyObject *result = NULL;
    Deps d = {0};
    Ready q = {0};
    double *dur = NULL, *clk = NULL, *fst = NULL;
    Py_ssize_t *done = NULL, *lim = NULL;
    char *blocked = NULL;
    for (size_t a = 0; a < sizeof(names) / sizeof(*names); a++)
        if (!(*slots[a] = PyObject_GetAttrString(eng, names[a])))
            goto out;
    Py_ssize_t m = PyLong_Check(m_o) ? PyLong_AsSsize_t(m_o) : -1;
    if (m == -1 && PyErr_Occurred())
        goto out;
    int fine = m > 0 && PyList_CheckExact(codes) && PyList_CheckExact(end) && PyList_CheckExact(durc) &&
               PyFloat_CheckExact(origin_o) && PyDict_CheckExact(waiting);
    Py_ssize_t p = fine ? PyList_GET_SIZE(codes) : 0, n_own = fine ? PyList_GET_SIZE(durc) : 0;
    if (fine) {
        dur = PyMem_Malloc(sizeof(double) * (size_t)(n_own ? n_own : 1));
        clk = PyMem_Malloc(sizeof(double) * (size_t)(p ? p : 1));
        fst = PyMem_Malloc(sizeof(double) * (size_t)(p ? p : 1));
        done = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(p ? p : 1));
        lim = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(p ? p : 1));
        blocked = PyMem_Malloc((size_t)(p ? p : 1));
        if (!dur || !clk || !fst || !done || !lim || !blocked) {
            PyErr_NoMemory();
            goto out;
        }
        int got = deps_read(&d, rel);
        if (got < 0)
            goto out;
        fine = got && d.n >= n_own && numbers(durc, n_own, dur, 0) && numbers(clock, p, clk, 0) &&
               numbers(first, p, fst, 0) && indices(done_l, p, PY_SSIZE_T_MAX, done) &&
               indices(lim_l, p, PY_SSIZE_T_MAX, lim) && flags(blocked_l, p, blocked);
        for (Py_ssize_t r = 0; fine && r < p; r++)
            fine = PyList_CheckExact(PyList_GET_ITEM(codes, r)) &&
                   lim[r] <= PyList_GET_SIZE(PyList_GET_ITEM(codes, r)) && done[r] <= lim[r];
    }
    if (!fine) {
        result = Py_None;
        Py_INCREF(result);
        goto out;
    }
    const double origin = PyFloat_AS_DOUBLE(origin_o), unplaced = -INFINITY;
    const Py_ssize_t n_end = PyList_GET_SIZE(end);
    int failed = 0;
    for (Py_ssize_t r = 0; r < p; r++)
        if (!blocked[r] && done[r] < lim[r] && ready_push(&q, r) < 0)
            goto out;
    while (q.len > 0 && !failed) {
        Py_ssize_t r = ready_pop(&q);
        PyObject *ops = PyList_GET_ITEM(codes, r);
        Py_ssize_t i = done[r], n = lim[r];
        double c = clk[r];
        blocked[r] = 0;
        while (i < n) {
            Py_ssize_t slot;
            if (item_index(ops, i, n_end, &slot) < 0) {
                failed = 1;
                break;
            }
            Py_ssize_t own = slot / m;
            if (own >= n_own) {
                PyErr_Format(PyExc_ValueError, "op slot %zd has no duration", slot);
                failed = 1;
                break;
            }
            double t = origin;
            Py_ssize_t missing = -1;
            for (Py_ssize_t k = d.off[own]; k < d.off[own + 1]; k++) {
                double e;
                if (end_get(end, slot + d.base[k], &e) < 0) {
                    failed = 1;
                    break;
                }
                if (e == unplaced) {
                    missing = slot + d.base[k];
                    break;
                }
                e += d.lat[k];
                if (e > t)
                    t = e;
            }
            if (failed)
                break;
            if (missing >= 0) {
                if (wait_on(waiting, missing, r) < 0) {
                    failed = 1;
                    break;
                }
                blocked[r] = 1;
                if (locate != Py_None) {  /* _Engine._demand */
                    PyObject *where = PyObject_CallFunction(locate, "n", missing);
                    if (!where) {
                        failed = 1;
                        break;
                    }
                    if (where != Py_None) {
                        Py_ssize_t qr, k;
                        if (!PyTuple_Check(where) || PyTuple_GET_SIZE(where) != 2 ||
                            !index_in(PyTuple_GET_ITEM(where, 0), p, &qr) ||
                            !index_in(PyTuple_GET_ITEM(where, 1), PY_SSIZE_T_MAX, &k)) {
                            Py_DECREF(where);
                            PyErr_SetString(PyExc_ValueError, "locate must give None or (rank, index)");
                            failed = 1;
                            break;
                        }
                        if (qr != r && k >= lim[qr]) {
                            int stopped = done[qr] == lim[qr] && !blocked[qr];
                            lim[qr] = k + 1;
                            if (stopped && ready_push(&q, qr) < 0) {
                                Py_DECREF(where);
                                failed = 1;
                                break;
                            }
                        }
                    }
                    Py_DECREF(where);
                }
                break;
            }
            if (c > t)
                t = c;
            if (i == 0)
                fst[r] = t;
            c = t + dur[own];
            if (list_set_float(end, slot, c) < 0) {
                failed = 1;
                break;
            }
            i++;
            if (wake(waiting, slot, &q, p) < 0) {
                failed = 1;
                break;
            }
        }
        done[r] = i;
        clk[r] = c;
    }
    /* The state as the Python loop leaves it, also when an error stopped the loop. */
    if (write_floats(clock, p, clk) < 0 || write_floats(first, p, fst) < 0 || write_indices(done_l, p, done) < 0 ||
        write_indices(lim_l, p, lim) < 0 || write_flags(blocked_l, p, blocked) < 0 || failed)
        goto out;
    {
        int all = 1;
        for (Py_ssize_t r = 0; r < p; r++)
            all &= done[r] == lim[r];
        result = PyBool_FromLong(all);
    }
out:
    for (size_t a = 0; a < sizeof(names) / sizeof(*names); a++)
        Py_XDECREF(*slots[a]);
    deps_free(&d);
    PyMem_Free(q.item); PyMem_Free(dur); PyMem_Free(clk); PyMem_Free(fst); PyMem_Free(done); PyMem_Free(lim);
    PyMem_Free(blocked);
    return result;
}

PyDoc_STRVAR(refill_run_doc,
"refill_run(run, tracker, code_kind)\n--\n\n"
"pipeoffload.schedules.w_refill._Refill.run's loop on ``run`` and its ``tracker`` (in place;\n"
"``code_kind``: timing.CODE_KIND, the op kind of each code):\n"
"whether every rank reached its limit; the rank (an int) that cannot keep its cap (the\n"
"caller raises Infeasible); or None when an input is outside what the C loop handles\n"
"(nothing is changed then).");

/* The refill's per-call tables and per-rank state (w_refill._Refill and zb_auto.Tracker). */
typedef struct {
    Py_ssize_t S, M, p, n_end;
    double origin;
    Deps deps;
    double *dur, *mem;                              /* per layer group, F B W */
    double *cap, *clock, *level, *peak, *idle, *first;  /* per rank */
    char *started, *blocked;
    Py_ssize_t *done, *lim, *rank_of;
    PyObject *end, *order, *ops_of, *code_kind;
} Refill;

/* Tracker.put with ListScheduler.place inline (w_refill._placer's ``put``): ``arrive`` the
 * op's input arrival, or NAN to compute it here (an op whose inputs are placed). */
static int refill_put(Refill *f, Py_ssize_t code, Py_ssize_t stage, Py_ssize_t mb, Py_ssize_t r, double arrive) {
    Py_ssize_t own = code * f->S + stage, slot = own * f->M + mb;
    double t = arrive;
    if (isnan(arrive)) {
        t = f->origin;
        for (Py_ssize_t k = f->deps.off[own]; k < f->deps.off[own + 1]; k++) {
            double e;
            if (end_get(f->end, f->deps.base[k] + mb, &e) < 0)
                return -1;
            e = e + f->deps.lat[k];
            if (e > t)
                t = e;
        }
    }
    double before = f->clock[r];
    if (before > t)
        t = before;
    double c = t + f->dur[stage * 3 + code];
    if (list_set_float(f->end, slot, c) < 0)
        return -1;
    f->clock[r] = c;
    if (f->started[r])
        f->idle[r] += t - before;
    else {
        f->started[r] = 1;
        f->first[r] = t;
    }
    double lv = f->level[r] + f->mem[stage * 3 + code];
    f->level[r] = lv;
    if (lv > f->peak[r])
        f->peak[r] = lv;
    PyObject *op = PyList_GET_ITEM(f->ops_of, slot), *row = PyList_GET_ITEM(f->order, r);
    if (op != Py_None)
        return PyList_Append(row, op);
    op = Py_BuildValue("(Onn)", PyTuple_GET_ITEM(f->code_kind, code), stage, mb);
    int rc = op ? PyList_Append(row, op) : -1;
    Py_XDECREF(op);
    return rc;
}

/* The oldest pending W of ``pend`` (a list of (layer group, microbatch)), popped; -1 with an
 * exception when it is not such a pair. */
static int pending_pop(Refill *f, PyObject *pend, Py_ssize_t *stage, Py_ssize_t *mb) {
    PyObject *w = PyList_GET_ITEM(pend, 0);
    if (!PyTuple_CheckExact(w) || PyTuple_GET_SIZE(w) != 2 || !index_in(PyTuple_GET_ITEM(w, 0), f->S, stage) ||
        !index_in(PyTuple_GET_ITEM(w, 1), f->M, mb)) {
        PyErr_SetString(PyExc_ValueError, "a pending W is no (layer group, microbatch) pair");
        return -1;
    }
    return PySequence_DelItem(pend, 0);
}

static int pending_stage(Refill *f, PyObject *pend, Py_ssize_t *stage) {
    PyObject *w = PyList_GET_ITEM(pend, 0);
    if (!PyTuple_CheckExact(w) || PyTuple_GET_SIZE(w) != 2 || !index_in(PyTuple_GET_ITEM(w, 0), f->S, stage)) {
        PyErr_SetString(PyExc_ValueError, "a pending W is no (layer group, microbatch) pair");
        return -1;
    }
    return 0;
}

/* The oldest pending W put (its inputs are placed). */
static int put_pending(Refill *f, PyObject *pend, Py_ssize_t r) {
    Py_ssize_t stage, mb;
    if (pending_pop(f, pend, &stage, &mb) < 0)
        return -1;
    return refill_put(f, 2, stage, mb, r, NAN);
}

static void refill_free(Refill *f) {
    deps_free(&f->deps);
    PyMem_Free(f->dur); PyMem_Free(f->mem); PyMem_Free(f->cap); PyMem_Free(f->clock); PyMem_Free(f->level);
    PyMem_Free(f->peak); PyMem_Free(f->idle); PyMem_Free(f->first); PyMem_Free(f->started);
    PyMem_Free(f->blocked); PyMem_Free(f->done); PyMem_Free(f->lim); PyMem_Free(f->rank_of);
}

/* Per layer group (F, B, W) floats of a list of 3-tuples; 0 when one is not. */
static int table3(PyObject *rows, Py_ssize_t S, double *out) {
    if (!PyList_CheckExact(rows) || PyList_GET_SIZE(rows) != S)
        return 0;
    for (Py_ssize_t s = 0; s < S; s++) {
        PyObject *row = PyList_GET_ITEM(rows, s);
        if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != 3)
            return 0;
        for (int k = 0; k < 3; k++) {
            PyObject *x = PyTuple_GET_ITEM(row, k);
            if (!PyFloat_CheckExact(x))
                return 0;
            out[s * 3 + k] = PyFloat_AS_DOUBLE(x);
        }
    }
    return 1;
}

static PyObject *refill_run(PyObject *self, PyObject *args) {
    PyObject *run, *tr, *code_kind;
    if (!PyArg_ParseTuple(args, "OOO:refill_run", &run, &tr, &code_kind))
        return NULL;
    PyObject *skeleton = NULL, *pending = NULL, *caps = NULL, *done_l = NULL, *lim_l = NULL, *blocked_l = NULL,
             *waiting = NULL, *partial_o = NULL, *consulted = NULL, *pos = NULL, *ops_of = NULL, *S_o = NULL,
             *M_o = NULL, *deps = NULL, *end = NULL, *clock = NULL, *origin_o = NULL, *dur = NULL, *mem = NULL,
             *level = NULL, *peak = NULL, *idle = NULL, *started = NULL, *first = NULL, *order = NULL,
             *rank_of = NULL;
    PyObject **slots[] = {&skeleton, &pending, &caps, &done_l, &lim_l, &blocked_l, &waiting, &partial_o, &consulted,
                          &pos, &ops_of};
    const char *names[] = {"skeleton", "pending", "caps", "done", "lim", "blocked", "waiting", "partial",
                           "consulted", "pos", "ops_of"};
    PyObject **tslots[] = {&S_o, &M_o, &deps, &end, &clock, &origin_o, &dur, &mem, &level, &peak, &idle, &started,
                           &first, &order, &rank_of};
    const char *tnames[] = {"num_stages", "num_microbatches", "deps", "end", "clock", "origin", "dur", "mem",
                            "level", "peak", "idle", "started", "first", "order", "rank_of"};
    const size_t n_names = sizeof(names) / sizeof(*names), n_tnames = sizeof(tnames) / sizeof(*tnames);
    PyObject *result = NULL;
    Refill f;
    Ready q = {0};
    memset(&f, 0, sizeof(f));
    for (size_t a = 0; a < n_names; a++)
        if (!(*slots[a] = PyObject_GetAttrString(run, names[a])))
            goto out;
    for (size_t a = 0; a < n_tnames; a++)
        if (!(*tslots[a] = PyObject_GetAttrString(tr, tnames[a])))
            goto out;
    int fine = PyLong_CheckExact(S_o) && PyLong_CheckExact(M_o) && PyList_CheckExact(skeleton) &&
               PyList_CheckExact(pending) && PyDict_CheckExact(waiting) && PyList_CheckExact(end) &&
               PyList_CheckExact(order) && PyList_CheckExact(ops_of) && PyTuple_CheckExact(code_kind) &&
               PyTuple_GET_SIZE(code_kind) == 3 && PyList_CheckExact(consulted) && PyList_GET_SIZE(consulted) >= 1 &&
               PyFloat_CheckExact(origin_o) && (partial_o == Py_True || partial_o == Py_False);
    if (fine) {
        f.S = PyLong_AsSsize_t(S_o);
        f.M = PyLong_AsSsize_t(M_o);
        if ((f.S == -1 || f.M == -1) && PyErr_Occurred())
            goto out;
        f.p = PyList_GET_SIZE(skeleton);
        f.n_end = PyList_GET_SIZE(end);
        fine = f.S > 0 && f.M > 0 && f.n_end == 3 * f.S * f.M && PyList_GET_SIZE(ops_of) == f.n_end &&
               PyList_GET_SIZE(pending) == f.p && PyList_GET_SIZE(order) == f.p;
    }
    if (fine) {
        size_t p1 = (size_t)(f.p ? f.p : 1);
        f.dur = PyMem_Malloc(sizeof(double) * 3 * (size_t)f.S);
        f.mem = PyMem_Malloc(sizeof(double) * 3 * (size_t)f.S);
        f.cap = PyMem_Malloc(sizeof(double) * p1);
        f.clock = PyMem_Malloc(sizeof(double) * p1);
        f.level = PyMem_Malloc(sizeof(double) * p1);
        f.peak = PyMem_Malloc(sizeof(double) * p1);
        f.idle = PyMem_Malloc(sizeof(double) * p1);
        f.first = PyMem_Malloc(sizeof(double) * p1);
        f.started = PyMem_Malloc(p1);
        f.blocked = PyMem_Malloc(p1);
        f.done = PyMem_Malloc(sizeof(Py_ssize_t) * p1);
        f.lim = PyMem_Malloc(sizeof(Py_ssize_t) * p1);
        f.rank_of = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)f.S);
        if (!f.dur || !f.mem || !f.cap || !f.clock || !f.level || !f.peak || !f.idle || !f.first || !f.started ||
            !f.blocked || !f.done || !f.lim || !f.rank_of) {
            PyErr_NoMemory();
            goto out;
        }
        int got = deps_read(&f.deps, deps);
        if (got < 0)
            goto out;
        fine = got && f.deps.n == 3 * f.S && table3(dur, f.S, f.dur) && table3(mem, f.S, f.mem) &&
               numbers(caps, f.p, f.cap, 1) && numbers(clock, f.p, f.clock, 0) && numbers(level, f.p, f.level, 0) &&
               numbers(peak, f.p, f.peak, 0) && numbers(idle, f.p, f.idle, 0) && numbers(first, f.p, f.first, 0) &&
               flags(started, f.p, f.started) && flags(blocked_l, f.p, f.blocked) &&
               indices(done_l, f.p, PY_SSIZE_T_MAX, f.done) && indices(lim_l, f.p, PY_SSIZE_T_MAX, f.lim) &&
               indices(rank_of, f.S, f.p, f.rank_of) && PyList_GET_SIZE(clock) == f.p;
        for (Py_ssize_t k = 0; fine && k < f.deps.off[f.deps.n]; k++)
            fine = f.deps.base[k] >= 0 && f.deps.base[k] + f.M <= f.n_end;
        for (Py_ssize_t r = 0; fine && r < f.p; r++)
            fine = PyList_CheckExact(PyList_GET_ITEM(skeleton, r)) && PyList_CheckExact(PyList_GET_ITEM(pending, r)) &&
                   PyList_CheckExact(PyList_GET_ITEM(order, r)) &&
                   f.lim[r] <= PyList_GET_SIZE(PyList_GET_ITEM(skeleton, r)) && f.done[r] <= f.lim[r];
    }
    if (!fine) {
        result = Py_None;
        Py_INCREF(result);
        goto out;
    }
    f.origin = PyFloat_AS_DOUBLE(origin_o);
    f.end = end;
    f.order = order;
    f.ops_of = ops_of;
    f.code_kind = code_kind;
    const int partial = partial_o == Py_True;
    const double unplaced = -INFINITY;
    const Py_ssize_t w_first = 2 * f.S * f.M;  /* the skeleton holds F and B slots only */
    Py_ssize_t infeasible = -1;
    int failed = 0;
    for (Py_ssize_t r = 0; r < f.p; r++)
        if (!f.blocked[r] && f.done[r] < f.lim[r] && ready_push(&q, r) < 0)
            goto out;
    while (q.len > 0 && !failed && infeasible < 0) {
        Py_ssize_t r = ready_pop(&q);
        PyObject *ops = PyList_GET_ITEM(skeleton, r), *pend = PyList_GET_ITEM(pending, r);
        double cap = f.cap[r], a = fabs(cap), tol = 1e-9 * (a > 1.0 ? a : 1.0);
        Py_ssize_t i = f.done[r], n = f.lim[r];
        f.blocked[r] = 0;
        while (i < n) {
            Py_ssize_t slot;
            if (item_index(ops, i, w_first, &slot) < 0) {
                failed = 1;
                break;
            }
            Py_ssize_t own = slot / f.M, mb = slot % f.M, code = own / f.S, stage = own % f.S;
            Py_ssize_t missing = -1;
            double arrive = f.origin;
            for (Py_ssize_t k = f.deps.off[own]; k < f.deps.off[own + 1]; k++) {
                double e;
                if (end_get(end, f.deps.base[k] + mb, &e) < 0) {
                    failed = 1;
                    break;
                }
                if (e == unplaced) {
                    missing = f.deps.base[k] + mb;
                    break;
                }
                e += f.deps.lat[k];
                if (e > arrive)
                    arrive = e;
            }
            if (failed)
                break;
            if (missing >= 0) {
                if (wait_on(waiting, missing, r) < 0) {
                    failed = 1;
                    break;
                }
                f.blocked[r] = 1;
                if (pos != Py_None) {  /* limited: the rank that owes the op goes on to it */
                    Py_ssize_t qr = f.rank_of[(missing / f.M) % f.S], k;
                    PyObject *at = PyObject_CallFunction(pos, "n", missing);
                    if (!at) {
                        failed = 1;
                        break;
                    }
                    int ok = index_in(at, PY_SSIZE_T_MAX, &k);
                    Py_DECREF(at);
                    if (!ok) {
                        PyErr_SetString(PyExc_ValueError, "pos must give an index");
                        failed = 1;
                        break;
                    }
                    if (qr != r && k >= f.lim[qr]) {
                        if (f.done[qr] == f.lim[qr] && !f.blocked[qr] && ready_push(&q, qr) < 0) {
                            failed = 1;
                            break;
                        }
                        f.lim[qr] = k + 1;
                    }
                }
                break;
            }
            /* Pending W's: those that end before the input arrives, one more for a partly
             * idle gap (partial), and those the op's memory needs. */
            while (PyList_GET_SIZE(pend) > 0) {
                Py_ssize_t ws;
                if (pending_stage(&f, pend, &ws) < 0) {
                    failed = 1;
                    break;
                }
                if (!(f.clock[r] + f.dur[ws * 3 + 2] <= arrive + 1e-12))
                    break;
                if (put_pending(&f, pend, r) < 0) {
                    failed = 1;
                    break;
                }
            }
            if (failed)
                break;
            if (PyList_GET_SIZE(pend) > 0 && f.clock[r] < arrive - 1e-12) {
                Py_INCREF(Py_True);
                if (PyList_SetItem(consulted, 0, Py_True) < 0 || (partial && put_pending(&f, pend, r) < 0)) {
                    failed = 1;
                    break;
                }
            }
            while (f.level[r] + f.mem[stage * 3 + code] > cap + tol) {
                if (PyList_GET_SIZE(pend) == 0) {
                    infeasible = r;
                    break;
                }
                if (put_pending(&f, pend, r) < 0) {
                    failed = 1;
                    break;
                }
            }
            if (failed || infeasible >= 0)
                break;
            if (refill_put(&f, code, stage, mb, r, arrive) < 0) {
                failed = 1;
                break;
            }
            if (code == 1) {
                PyObject *w = Py_BuildValue("(nn)", stage, mb);
                int rc = w ? PyList_Append(pend, w) : -1;
                Py_XDECREF(w);
                if (rc < 0) {
                    failed = 1;
                    break;
                }
            }
            i++;
            if (wake(waiting, slot, &q, f.p) < 0) {
                failed = 1;
                break;
            }
        }
        if (infeasible < 0)  /* (the Python loop raises before it writes the rank's position) */
            f.done[r] = i;
    }
    /* The state as the Python loop leaves it, also when it stops on an error. */
    {
        int rc = write_floats(clock, f.p, f.clock) < 0 || write_floats(level, f.p, f.level) < 0 ||
             write_floats(peak, f.p, f.peak) < 0 || write_floats(idle, f.p, f.idle) < 0 ||
             write_floats(first, f.p, f.first) < 0 || write_flags(started, f.p, f.started) < 0 ||
             write_flags(blocked_l, f.p, f.blocked) < 0 || write_indices(done_l, f.p, f.done) < 0 ||
             write_indices(lim_l, f.p, f.lim) < 0 ? -1 : 0;
        if (rc < 0 || failed)
            goto out;
    }
    if (infeasible >= 0)
        result = PyLong_FromSsize_t(infeasible);
    else {
        int all = 1;
        for (Py_ssize_t r = 0; r < f.p; r++)
            all &= f.done[r] == f.lim[r];
        result = PyBool_FromLong(all);
    }
out:
    for (size_t a = 0; a < n_names; a++)
        Py_XDECREF(*slots[a]);
    for (size_t a = 0; a < n_tnames; a++)
        Py_XDECREF(*tslots[a]);
    refill_free(&f);
    PyMem_Free(q.item);
    return result;
}

/* ---- The slot reorder's loops (pipeoffload.schedules.v_reorder) ----
 *
 * Slots, keys and microbatches are Python ints; here they are long long (a key is
 * ((slot·p + rank)·8 + type)·n + microbatch: far below 2^63 for any grid that fits in
 * memory; a larger one raises OverflowError).
 */

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
    for (Py_ssize_t r = 0; r < p; r++) {
        PyObject *rows = PyList_GET_ITEM(grid, r);
        if (!PyList_Check(rows) || PyList_GET_SIZE(rows) > 8) {
            PyErr_SetString(PyExc_TypeError, "a rank's rows are no list of at most 8 slot lists");
            return NULL;
        }
        for (Py_ssize_t k = 0; k < PyList_GET_SIZE(rows); k++) {
            PyObject *ts = PyList_GET_ITEM(rows, k);
            long long x;
            if (!PyList_Check(ts)) {
                PyErr_SetString(PyExc_TypeError, "a slot list is no list");
                return NULL;
            }
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

/* ---- Small scans over int lists (the periodic proofs' and the timings' set-up) ---- */

PyDoc_STRVAR(op_slots_doc,
"op_slots(ops, num_stages, m, code_of)\n--\n\n"
"pipeoffload.passes.steady_timing.op_slots: ``(code_of[kind]*num_stages + layer group)*m +\n"
"microbatch`` of each ``(kind, layer group, microbatch)``; KeyError for a kind code_of lacks.");

static PyObject *op_slots(PyObject *self, PyObject *args) {
    PyObject *ops, *code_of;
    long long S, m;
    if (!PyArg_ParseTuple(args, "OLLO!:op_slots", &ops, &S, &m, &PyDict_Type, &code_of))
        return NULL;
    PyObject *seq = PySequence_Fast(ops, "ops must be a sequence");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out && i < n; i++) {
        PyObject *op = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_Check(op) || PyTuple_GET_SIZE(op) < 3) {
            PyErr_SetString(PyExc_TypeError, "an op is no (kind, layer group, microbatch) tuple");
            Py_CLEAR(out);
            break;
        }
        PyObject *code = PyDict_GetItemWithError(code_of, PyTuple_GET_ITEM(op, 0));
        if (!code) {
            if (!PyErr_Occurred())
                PyErr_SetObject(PyExc_KeyError, PyTuple_GET_ITEM(op, 0));
            Py_CLEAR(out);
            break;
        }
        long long c = PyLong_AsLongLong(code), s = PyLong_AsLongLong(PyTuple_GET_ITEM(op, 1)),
                  j = PyLong_AsLongLong(PyTuple_GET_ITEM(op, 2));
        PyObject *v = PyErr_Occurred() ? NULL : PyLong_FromLongLong((c * S + s) * m + j);
        if (!v) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, v);
    }
    Py_DECREF(seq);
    return out;
}

/* An int list's items as long long (a fresh array; NULL with an exception). */
static long long *ll_array(PyObject *list, Py_ssize_t *n) {
    if (!PyList_Check(list)) {
        PyErr_SetString(PyExc_TypeError, "expected a list of ints");
        return NULL;
    }
    *n = PyList_GET_SIZE(list);
    long long *x = PyMem_Malloc(sizeof(long long) * (size_t)(*n ? *n : 1));
    if (!x) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < *n; i++)
        if (ll_item(list, i, &x[i]) < 0) {
            PyMem_Free(x);
            return NULL;
        }
    return x;
}

PyDoc_STRVAR(period_range_doc,
"period_range(codes, period)\n--\n\n"
"pipeoffload.passes.steady_timing._period_range: ``(lo, hi)``, the longest run (the first\n"
"of equal ones) where ``codes[i + period] == codes[i] + 1``, widened by ``period``; (0, 0) if none.");

static PyObject *period_range(PyObject *self, PyObject *args) {
    PyObject *codes;
    Py_ssize_t period, n;
    if (!PyArg_ParseTuple(args, "O!n:period_range", &PyList_Type, &codes, &period))
        return NULL;
    long long *x = ll_array(codes, &n);
    if (!x)
        return NULL;
    Py_ssize_t best_lo = 0, best_hi = 0, run = -1;
    if (period > 0)
        for (Py_ssize_t i = 0; i + period <= n; i++) {
            int same = i + period < n && x[i + period] - x[i] == 1;
            if (same && run < 0)
                run = i;
            if (!same && run >= 0) {
                if (i - run > best_hi - best_lo) {
                    best_lo = run;
                    best_hi = i;
                }
                run = -1;
            }
        }
    PyMem_Free(x);
    if (best_lo == 0 && best_hi == 0)
        return Py_BuildValue("(nn)", (Py_ssize_t)0, (Py_ssize_t)0);
    return Py_BuildValue("(nn)", best_lo, best_hi + period);
}

PyDoc_STRVAR(stretch_doc,
"stretch(ts, a, c, T)\n--\n\n"
"pipeoffload.schedules.v_reorder_periods._stretch for c <= a <= len(ts): the widest [s, e)\n"
"around a with ts[i] == ts[i - c] + T for every i in [s + c, e).");

static PyObject *stretch(PyObject *self, PyObject *args) {
    PyObject *ts;
    Py_ssize_t a, c, n;
    long long T;
    if (!PyArg_ParseTuple(args, "O!nnL:stretch", &PyList_Type, &ts, &a, &c, &T))
        return NULL;
    if (c < 0 || a < c || a > PyList_GET_SIZE(ts)) {
        PyErr_SetString(PyExc_ValueError, "stretch needs 0 <= c <= a <= len(ts)");
        return NULL;
    }
    long long *x = ll_array(ts, &n);
    if (!x)
        return NULL;
    Py_ssize_t e = a, s = 0;
    while (e < n && x[e] - x[e - c] == T)
        e++;
    for (Py_ssize_t i = a - 1; i >= c; i--)
        if (x[i] - x[i - c] != T) {
            s = i - c + 1;
            break;
        }
    PyMem_Free(x);
    return Py_BuildValue("(nn)", s, e);
}

PyDoc_STRVAR(slot_order_doc,
"slot_order(grid, n)\n--\n\n"
"pipeoffload.schedules.v_reorder._squeeze's slot order: every op of ``grid`` (per rank, per\n"
"type, the slot of each microbatch) as ``((slot*p + rank)*8 + type)*n + microbatch``, sorted.");

static PyObject *slot_order(PyObject *self, PyObject *args) {
    PyObject *grid;
    long long n;
    if (!PyArg_ParseTuple(args, "O!L:slot_order", &PyList_Type, &grid, &n))
        return NULL;
    const Py_ssize_t p = PyList_GET_SIZE(grid);
    Py_ssize_t total = 0;
    for (Py_ssize_t r = 0; r < p; r++) {
        PyObject *rows = PyList_GET_ITEM(grid, r);
        if (!PyList_Check(rows) || PyList_GET_SIZE(rows) > 8) {
            PyErr_SetString(PyExc_TypeError, "a rank's rows are no list of at most 8 slot lists");
            return NULL;
        }
        for (Py_ssize_t k = 0; k < PyList_GET_SIZE(rows); k++) {
            if (!PyList_Check(PyList_GET_ITEM(rows, k))) {
                PyErr_SetString(PyExc_TypeError, "a slot list is no list");
                return NULL;
            }
            total += PyList_GET_SIZE(PyList_GET_ITEM(rows, k));
        }
    }
    long long *keys = PyMem_Malloc(sizeof(long long) * (size_t)(total ? total : 1));
    if (!keys)
        return PyErr_NoMemory();
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
    qsort(keys, (size_t)total, sizeof(long long), ll_cmp);
    PyObject *out = PyList_New(total);
    for (Py_ssize_t i = 0; out && i < total; i++) {
        PyObject *v = PyLong_FromLongLong(keys[i]);
        if (!v)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, i, v);
    }
    PyMem_Free(keys);
    return out;
}

/* Floor modulo and division by a positive d, as Python's. */
static long long fmod_ll(long long x, long long d) {
    long long r = x % d;
    return r < 0 ? r + d : r;
}

static long long fdiv_ll(long long x, long long d) {
    return (x - fmod_ll(x, d)) / d;
}

PyDoc_STRVAR(family_peak_doc,
"family_peak(p, params, period)\n--\n\n"
"pipeoffload.schedules.v_auto._peak: the highest steady-state peak of the family member\n"
"``params`` = (f1, b1, b0, d0, d1, k) for p ranks (phases modulo ``period``).");

static PyObject *family_peak(PyObject *self, PyObject *args) {
    long long p, f1, b1, b0, d0, d1, k, P;
    if (!PyArg_ParseTuple(args, "L(LLLLLL)L:family_peak", &p, &f1, &b1, &b0, &d0, &d1, &k, &P))
        return NULL;
    if (p < 1 || P < 1 || P > 64) {
        PyErr_SetString(PyExc_ValueError, "family_peak needs p >= 1 and 1 <= period <= 64");
        return NULL;
    }
    long long n0 = k < p - 1 ? k : p - 1;
#define PH_S(r) (d0 * ((r) < n0 ? (r) : n0) + d1 * ((r) - n0 > 0 ? (r) - n0 : 0))
    long long last = PH_S(p - 1);
    long long pF = fmod_ll(last, P), pf = fmod_ll(f1 - (p - 1), P), pB = fmod_ll(b1 + last, P),
              pb = fmod_ll(b0 - (p - 1), P);
    long long f_last = last + 1 + fmod_ll(pf - pF - 1, P);
    long long b_first = f_last + p - 1 + 1 + fmod_ll(b1 - f1 - 1, P);
    long long b0_last = b_first + last + 1 + fmod_ll(pb - pB - 1, P);
    long long best = 0;
    long long a_hi = n0 < 5 ? n0 : 5, c_hi = p - 1 < n0 + 5 ? p - 1 : n0 + 5;
    for (long long r = 0; r <= c_hi; r++) {
        if (r > a_hi && r < n0)
            continue;  /* the ranks 0..min(n0, 5) and n0..min(p - 1, n0 + 5) */
        long long s = PH_S(r);
        long long ph[4] = {fmod_ll(s, P), fmod_ll(f1 - r, P), fmod_ll(b1 + s, P), fmod_ll(b0 - r, P)};
        /* _w_phases: each W the first free phase after its B (chunk 1's first). */
        int used[64] = {0};
        long long w[2];
        for (int i = 0; i < 4; i++)
            used[ph[i]] = 1;
        for (int i = 0; i < 2; i++) {
            long long bph = ph[2 + i];
            int found = 0;
            for (long long j = 1; j < P && !found; j++) {
                long long q = fmod_ll(bph + j, P);
                if (!used[q]) {
                    used[q] = 1;
                    w[i] = q;
                    found = 1;
                }
            }
            if (!found) {
                PyErr_SetString(PyExc_ValueError, "no free W phase: the params are no block of the family");
                return NULL;
            }
        }
        long long f_r = f_last + p - 1 - r, big_b = b_first + s, b_r = b0_last + p - 1 - r;
        long long e1 = big_b + 1 + fmod_ll(w[0] - big_b - 1, P);
        long long e0 = b_r + 1 + fmod_ll(w[1] - b_r - 1, P);
        long long rs = fmod_ll(s, P), r0 = fmod_ll(e0, P), rf = fmod_ll(f_r, P), r1 = fmod_ll(e1, P);
        long long excess = LLONG_MIN;
        for (long long t = 0; t < P; t++) {  /* _phase_excess */
            long long v = (t < r0) + (t < r1) - (t < rs) - (t < rf);
            if (v > excess)
                excess = v;
        }
        long long cnt = fdiv_ll(e0, P) - fdiv_ll(s, P) + fdiv_ll(e1, P) - fdiv_ll(f_r, P) + excess;
        if (cnt > best)
            best = cnt;
    }
#undef PH_S
    return PyLong_FromLongLong(best);
}

/* ---- The grid lowering's sweeps (pipeoffload.schedules.v_grid_lowering) ----
 *
 * A grid row is a list of one-character labels: F f B b W w (a rank's two forwards, two
 * backwards, two weight-gradient ops) or " " (empty). Counts, dependency slots and levels
 * stay in the sweeps' Python dicts and lists, changed in place.
 */

static PyObject *label_obj[7];  /* "F" "f" "B" "b" "W" "w" " ", made at import */
static const int LABEL_DELTA[7] = {1, 1, 0, 0, -1, -1, 0};
#define EMPTY_LABEL 6

/* The label index of a cell (0..5, 6 for empty); -1 with an exception for anything else. */
static int label_index(PyObject *c) {
    if (PyUnicode_Check(c) && PyUnicode_GET_LENGTH(c) == 1) {
        switch (PyUnicode_READ_CHAR(c, 0)) {
        case 'F': return 0;
        case 'f': return 1;
        case 'B': return 2;
        case 'b': return 3;
        case 'W': return 4;
        case 'w': return 5;
        case ' ': return EMPTY_LABEL;
        }
    }
    PyErr_SetString(PyExc_KeyError, "a grid cell is no label");
    return -1;
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
            if (done) {
                PyObject *a = PyLong_FromLongLong(min_lb), *b = PyLong_FromLongLong(after_lb);
                int rc = a && b && PyObject_SetAttrString(skip, "min_lb", a) == 0 &&
                         PyObject_SetAttrString(skip, "after_lb", b) == 0 ? 0 : -1;
                Py_XDECREF(a);
                Py_XDECREF(b);
                if (rc < 0)
                    goto out;
            }
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
    if (skip != Py_None && done) {
        PyObject *a = PyLong_FromLongLong(min_lb), *b = PyLong_FromLongLong(after_lb);
        int rc = a && b && PyObject_SetAttrString(skip, "min_lb", a) == 0 &&
                 PyObject_SetAttrString(skip, "after_lb", b) == 0 ? 0 : -1;
        Py_XDECREF(a);
        Py_XDECREF(b);
        if (rc < 0)
            goto out;
    }
    result = Py_True;
    Py_INCREF(result);
out:
    Py_XDECREF(done);
    PyMem_Free(thr); PyMem_Free(dep_off); PyMem_Free(dep); PyMem_Free(pm.at);
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
            Py_UCS4 ch = PyUnicode_READ_CHAR(row, t);
            int c = ch == 'F' ? 0 : ch == 'f' ? 1 : ch == 'B' ? 2 : ch == 'b' ? 3 : ch == 'W' ? 4 : ch == 'w' ? 5 :
                    ch == ' ' ? 6 : -1;
            if (c < 0) {
                PyErr_SetString(PyExc_KeyError, "time_grid: a cell is no label");
                goto out;
            }
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
            Py_UCS4 ch = PyUnicode_READ_CHAR(PyList_GET_ITEM(rows, r), t);
            int c = ch == 'F' ? 0 : ch == 'f' ? 1 : ch == 'B' ? 2 : ch == 'b' ? 3 : ch == 'W' ? 4 : ch == 'w' ? 5 : 6;
            if (c == 6)
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

PyDoc_STRVAR(shape_counts_doc,
"shape_counts(kinds, stages, mbs, rank_of, S, m)\n--\n\n"
"pipeoffload.passes.validate._check_shape_compact's tables over compact orders (per rank,\n"
"array('b') kinds and array('l') layer groups and microbatches): the four bytearrays, or None\n"
"at the first op the checks refuse (the Python loop then names it).");

static PyObject *shape_counts(PyObject *self, PyObject *args) {
    PyObject *kinds, *stages, *mbs, *rank_of_l;
    Py_ssize_t S, m;
    if (!PyArg_ParseTuple(args, "O!O!O!O!nn:shape_counts", &PyList_Type, &kinds, &PyList_Type, &stages, &PyList_Type,
                          &mbs, &PyList_Type, &rank_of_l, &S, &m))
        return NULL;
    const Py_ssize_t p = PyList_GET_SIZE(kinds);
    if (S <= 0 || m <= 0 || PyList_GET_SIZE(stages) != p || PyList_GET_SIZE(mbs) != p || PyList_GET_SIZE(rank_of_l) != S)
        Py_RETURN_NONE;
    Py_ssize_t *rank_of = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)S);
    PyObject *counts = PyList_New(4), *result = NULL;
    unsigned char *cnt[4] = {NULL, NULL, NULL, NULL};
    if (!rank_of || !counts) {
        PyErr_NoMemory();
        goto out;
    }
    for (int k = 0; k < 4; k++) {
        PyObject *b = PyByteArray_FromStringAndSize(NULL, S * m);
        if (!b)
            goto out;
        memset(PyByteArray_AS_STRING(b), 0, (size_t)(S * m));
        PyList_SET_ITEM(counts, k, b);
        cnt[k] = (unsigned char *)PyByteArray_AS_STRING(b);
    }
    if (!indices(rank_of_l, S, PY_SSIZE_T_MAX, rank_of))
        goto refuse;
    for (Py_ssize_t r = 0; r < p; r++) {
        Py_buffer kb, sb, jb;
        if (PyObject_GetBuffer(PyList_GET_ITEM(kinds, r), &kb, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
            goto out;
        if (PyObject_GetBuffer(PyList_GET_ITEM(stages, r), &sb, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
            PyBuffer_Release(&kb);
            goto out;
        }
        if (PyObject_GetBuffer(PyList_GET_ITEM(mbs, r), &jb, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
            PyBuffer_Release(&kb);
            PyBuffer_Release(&sb);
            goto out;
        }
        int fine = kb.itemsize == 1 && sb.itemsize == sizeof(long) && jb.itemsize == sizeof(long) &&
                   kb.format && sb.format && jb.format && kb.format[0] == 'b' && sb.format[0] == 'l' &&
                   jb.format[0] == 'l' && kb.len == sb.len / (Py_ssize_t)sizeof(long) && sb.len == jb.len;
        const signed char *ks = kb.buf;
        const long *ss = sb.buf, *js = jb.buf;
        for (Py_ssize_t i = 0; fine && i < kb.len; i++) {
            int k = ks[i];
            if (k >= 4)
                continue;  /* not a compute op */
            long stage = ss[i], j = js[i];
            if (k < 0 || stage < 0 || stage >= S || j < 0 || j >= m || rank_of[stage] != r) {
                fine = 0;
                break;
            }
            Py_ssize_t idx = (Py_ssize_t)stage * m + j;
            /* a second copy, or B or W where BW is (or BW where either is): the Python loop names it */
            if (cnt[k][idx] || ((k == 1 || k == 2) ? cnt[3][idx] : (k == 3 && (cnt[1][idx] || cnt[2][idx]))))
                fine = 0;
            else
                cnt[k][idx] = 1;
        }
        PyBuffer_Release(&kb);
        PyBuffer_Release(&sb);
        PyBuffer_Release(&jb);
        if (!fine)
            goto refuse;
    }
    result = counts;
    counts = NULL;
    goto out;
refuse:
    result = Py_None;
    Py_INCREF(result);
out:
    Py_XDECREF(counts);
    PyMem_Free(rank_of);
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
            int c;
            if (is_str) {
                Py_UCS4 ch = PyUnicode_READ_CHAR(row, t);
                c = ch == 'F' ? 0 : ch == 'f' ? 1 : ch == 'B' ? 2 : ch == 'b' ? 3 : ch == 'W' ? 4 : ch == 'w' ? 5 :
                    ch == ' ' ? 6 : -1;
                if (c < 0)
                    PyErr_SetString(PyExc_KeyError, "a grid cell is no label");
            } else
                c = label_index(PyList_GET_ITEM(row, t));
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

PyDoc_STRVAR(compact_triples_doc,
"compact_triples(per_rank, S, kind_type, kind_code)\n--\n\n"
"pipeoffload.ir.CompactOrders.from_triples's arrays for per-rank lists of (kind, layer group,\n"
"microbatch) tuples: (kinds, stages, mbs), or None where it returns None (a triple not an\n"
"OpKind with an int layer group in [0, S) and an int microbatch, or not three long), or\n"
"NotImplemented for an input it does not read (an item no tuple, a microbatch beyond a C long):\n"
"the Python method runs then.");

static PyObject *compact_triples(PyObject *self, PyObject *args) {
    PyObject *per_rank, *kind_type, *kind_code;
    Py_ssize_t S;
    if (!PyArg_ParseTuple(args, "O!nOO!:compact_triples", &PyList_Type, &per_rank, &S, &kind_type, &PyDict_Type,
                          &kind_code))
        return NULL;
    const Py_ssize_t p = PyList_GET_SIZE(per_rank);
    PyObject *kinds = PyList_New(p), *stages = PyList_New(p), *mbs = PyList_New(p), *result = NULL;
    signed char *kb = NULL;
    long *sb = NULL, *jb = NULL;
    if (!kinds || !stages || !mbs)
        goto out;
    for (Py_ssize_t r = 0; r < p; r++) {
        PyObject *lst = PyList_GET_ITEM(per_rank, r);
        if (!PyList_Check(lst) && !PyTuple_Check(lst)) {
            result = Py_NotImplemented;
            Py_INCREF(result);
            goto out;
        }
        Py_ssize_t n = PySequence_Fast_GET_SIZE(lst);
        kb = PyMem_Malloc((size_t)(n ? n : 1));
        sb = PyMem_Malloc(sizeof(long) * (size_t)(n ? n : 1));
        jb = PyMem_Malloc(sizeof(long) * (size_t)(n ? n : 1));
        if (!kb || !sb || !jb) {
            PyErr_NoMemory();
            goto out;
        }
        int verdict = 1;  /* 1 fine, 0 None (as from_triples), -1 not read here */
        for (Py_ssize_t i = 0; i < n && verdict == 1; i++) {
            PyObject *op = PySequence_Fast_GET_ITEM(lst, i);
            if (!PyTuple_Check(op)) {
                verdict = -1;
                break;
            }
            if (PyTuple_GET_SIZE(op) != 3) {
                verdict = 0;
                break;
            }
            PyObject *k = PyTuple_GET_ITEM(op, 0), *s = PyTuple_GET_ITEM(op, 1), *j = PyTuple_GET_ITEM(op, 2);
            if ((PyObject *)Py_TYPE(k) != kind_type || !PyLong_CheckExact(s) || !PyLong_CheckExact(j)) {
                verdict = 0;
                break;
            }
            int overflow = 0;
            long sv = PyLong_AsLongAndOverflow(s, &overflow), jv;
            if (overflow || sv < 0 || sv >= S) {
                verdict = overflow ? -1 : 0;
                break;
            }
            jv = PyLong_AsLongAndOverflow(j, &overflow);
            if (overflow) {
                verdict = -1;
                break;
            }
            PyObject *code = PyDict_GetItemWithError(kind_code, k);
            long cv = code ? PyLong_AsLong(code) : -1;
            if (!code || cv < -128 || cv > 127) {
                if (PyErr_Occurred())
                    goto out;
                verdict = -1;
                break;
            }
            kb[i] = (signed char)cv;
            sb[i] = sv;
            jb[i] = jv;
        }
        if (verdict != 1) {
            result = verdict == 0 ? Py_None : Py_NotImplemented;
            Py_INCREF(result);
            goto out;
        }
        PyObject *ka = PyObject_CallFunction(array_type, "sy#", "b", (const char *)kb, n);
        PyObject *sa = ka ? PyObject_CallFunction(array_type, "sy#", "l", (const char *)sb, n * (Py_ssize_t)sizeof(long)) : NULL;
        PyObject *ja = sa ? PyObject_CallFunction(array_type, "sy#", "l", (const char *)jb, n * (Py_ssize_t)sizeof(long)) : NULL;
        if (!ja) {
            Py_XDECREF(ka);
            Py_XDECREF(sa);
            goto out;
        }
        PyList_SET_ITEM(kinds, r, ka);
        PyList_SET_ITEM(stages, r, sa);
        PyList_SET_ITEM(mbs, r, ja);
        PyMem_Free(kb); PyMem_Free(sb); PyMem_Free(jb);
        kb = NULL; sb = jb = NULL;
    }
    result = Py_BuildValue("(OOO)", kinds, stages, mbs);
out:
    PyMem_Free(kb); PyMem_Free(sb); PyMem_Free(jb);
    Py_XDECREF(kinds); Py_XDECREF(stages); Py_XDECREF(mbs);
    return result;
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
    Py_ssize_t total = 0;
    for (Py_ssize_t k = 0; k < nk; k++) {
        if (!PyList_Check(PyList_GET_ITEM(rows, k))) {
            PyErr_SetString(PyExc_TypeError, "slot_ordered: a slot list is no list");
            return NULL;
        }
        total += PyList_GET_SIZE(PyList_GET_ITEM(rows, k));
    }
    long long *keys = PyMem_Malloc(sizeof(long long) * (size_t)(total ? total : 1));
    if (!keys)
        return PyErr_NoMemory();
    Py_ssize_t x = 0;
    for (Py_ssize_t k = 0; k < nk; k++) {
        PyObject *ts = PyList_GET_ITEM(rows, k);
        for (Py_ssize_t j = 0; j < PyList_GET_SIZE(ts); j++) {
            long long t;
            if (ll_item(ts, j, &t) < 0) {
                PyMem_Free(keys);
                return NULL;
            }
            keys[x++] = (t * 8 + k) * n + j;
        }
    }
    qsort(keys, (size_t)total, sizeof(long long), ll_cmp);
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

static PyMethodDef methods[] = {
    {"time_compact", time_compact, METH_VARARGS, time_compact_doc},
    {"time_in_runs", time_in_runs, METH_VARARGS, time_in_runs_doc},
    {"steady_run", steady_run, METH_VARARGS, steady_run_doc},
    {"refill_run", refill_run, METH_VARARGS, refill_run_doc},
    {"squeeze_run", squeeze_run, METH_VARARGS, squeeze_run_doc},
    {"with_weights", with_weights, METH_VARARGS, with_weights_doc},
    {"reorder_visits", reorder_visits, METH_VARARGS, reorder_visits_doc},
    {"op_slots", op_slots, METH_VARARGS, op_slots_doc},
    {"period_range", period_range, METH_VARARGS, period_range_doc},
    {"stretch", stretch, METH_VARARGS, stretch_doc},
    {"slot_order", slot_order, METH_VARARGS, slot_order_doc},
    {"family_peak", family_peak, METH_VARARGS, family_peak_doc},
    {"hole_column", hole_column, METH_VARARGS, hole_column_doc},
    {"squeeze_column", squeeze_column, METH_VARARGS, squeeze_column_doc},
    {"reorder_bytes", reorder_bytes, METH_VARARGS, reorder_bytes_doc},
    {"time_grid", time_grid, METH_VARARGS, time_grid_doc},
    {"shape_counts", shape_counts, METH_VARARGS, shape_counts_doc},
    {"grid_peaks", grid_peaks, METH_VARARGS, grid_peaks_doc},
    {"compact_triples", compact_triples, METH_VARARGS, compact_triples_doc},
    {"slot_ordered", slot_ordered, METH_VARARGS, slot_ordered_doc},
    {"op_row", op_row, METH_VARARGS, op_row_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_engine",
    "The timing engine's per-op loops in C (optional; pipeoffload.passes.timing falls back to Python).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__engine(void) {
    PyObject *array_module = PyImport_ImportModule("array");
    if (!array_module)
        return NULL;
    array_type = PyObject_GetAttrString(array_module, "array");
    Py_DECREF(array_module);
    if (!array_type)
        return NULL;
    const char *labels = "FfBbWw ";
    for (int c = 0; c < 7; c++) {
        label_obj[c] = PyUnicode_FromStringAndSize(labels + c, 1);
        if (!label_obj[c])
            return NULL;
        PyUnicode_InternInPlace(&label_obj[c]);
    }
    return PyModule_Create(&module);
}
