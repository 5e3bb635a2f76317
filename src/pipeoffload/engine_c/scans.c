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
    Py_ssize_t total;
    long long *keys = sorted_slot_keys(grid, n, &total);
    if (!keys)
        return NULL;
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
