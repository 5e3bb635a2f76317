/* pipeoffload.passes.steady_timing._Engine._run_py, in place. */

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
             *done_l = NULL, *lim_l = NULL, *waiting = NULL, *blocked_l = NULL, *locate = NULL, *m_o = NULL,
             *periodic = NULL, *rank_of = NULL;
    PyObject **slots[] = {&codes, &rel, &end, &durc, &origin_o, &clock, &first, &done_l, &lim_l, &waiting,
                          &blocked_l, &locate, &m_o, &periodic, &rank_of};
    const char *names[] = {"codes", "rel", "end", "durc", "origin", "clock", "first", "done", "lim", "waiting",
                           "blocked", "locate", "m", "periodic", "rank_of"};
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
                if (locate != Py_None && periodic != Py_None) {
                    /* _Engine._demand with _run_with_skip's locate: the op's rank and its index by
                     * the period, or nothing when it is outside the periodic range */
                    long long qq;
                    Py_ssize_t k;
                    int found = ll_item(rank_of, (Py_ssize_t)((missing / m) % (d.n / 3)), &qq) < 0 ? -1 :
                                qq < 0 || qq >= p ? -2 : periodic_position(periodic, (Py_ssize_t)qq, missing, m, &k);
                    if (found == -2)
                        PyErr_SetString(PyExc_IndexError, "steady_run: a rank out of range");
                    if (found < 0) {
                        failed = 1;
                        break;
                    }
                    if (found && qq != r && k >= lim[qq]) {
                        int stopped = done[qq] == lim[qq] && !blocked[qq];
                        lim[qq] = k + 1;
                        if (stopped && ready_push(&q, (Py_ssize_t)qq) < 0) {
                            failed = 1;
                            break;
                        }
                    }
                } else if (locate != Py_None) {  /* _Engine._demand */
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

PyDoc_STRVAR(inputs_from_doc,
"inputs_from(deps, rank_of, codes, reading, low, ranges, refs, periods, m, allowed, tails)\n--\n\n"
"pipeoffload.passes.steady_timing.inputs_from's loop, with its ``allowed`` and ``tails`` sets\n"
"(per rank, a set or None) made by the caller: whether every input of the ops ``reading`` is\n"
"at index >= low[q] of its rank's list.");

static PyObject *inputs_from(PyObject *self, PyObject *args) {
    PyObject *deps, *rank_of, *codes, *reading, *low, *ranges, *refs, *periods, *allowed, *tails;
    long long m;
    if (!PyArg_ParseTuple(args, "O!O!O!OO!O!O!O!LO!O!:inputs_from", &PyList_Type, &deps, &PyList_Type, &rank_of,
                          &PyList_Type, &codes, &reading, &PyList_Type, &low, &PyList_Type, &ranges, &PyList_Type,
                          &refs, &PyList_Type, &periods, &m, &PyList_Type, &allowed, &PyList_Type, &tails))
        return NULL;
    const Py_ssize_t S = PyList_GET_SIZE(deps) / 3, p = PyList_GET_SIZE(codes);
    if (m <= 0 || S <= 0 || PyList_GET_SIZE(rank_of) < S || PyList_GET_SIZE(low) != p ||
        PyList_GET_SIZE(ranges) != p || PyList_GET_SIZE(refs) != p || PyList_GET_SIZE(periods) != p ||
        PyList_GET_SIZE(allowed) != p || PyList_GET_SIZE(tails) != p) {
        PyErr_SetString(PyExc_ValueError, "inputs_from: one entry per rank in every per-rank list");
        return NULL;
    }
    Deps d;
    int got = deps_read(&d, deps);
    if (got <= 0) {
        deps_free(&d);
        if (got == 0)
            PyErr_SetString(PyExc_TypeError, "inputs_from: deps are no (offset, latency) rows");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(reading, "reading must be a sequence"), *result = NULL;
    int holds = 1;
    if (!seq)
        goto out;
    for (Py_ssize_t a = 0; holds && a < PySequence_Fast_GET_SIZE(seq); a++) {
        PyObject *ops = PySequence_Fast_GET_ITEM(seq, a);
        if (!PyList_Check(ops)) {
            PyErr_SetString(PyExc_TypeError, "inputs_from: each reading entry must be a list of slots");
            goto out;
        }
        for (Py_ssize_t i = 0; holds && i < PyList_GET_SIZE(ops); i++) {
            long long x;
            if (ll_item(ops, i, &x) < 0)
                goto out;
            long long own = x / m, mb = x % m;
            if (own < 0 || own >= d.n) {
                PyErr_SetString(PyExc_IndexError, "inputs_from: an op with no dependency row");
                goto out;
            }
            for (Py_ssize_t k = d.off[own]; holds && k < d.off[own + 1]; k++) {
                long long y = d.base[k] + mb, qq;
                if (ll_item(rank_of, (Py_ssize_t)((y / m) % S), &qq) < 0)
                    goto out;
                if (qq < 0 || qq >= p) {
                    PyErr_SetString(PyExc_IndexError, "inputs_from: a rank out of range");
                    goto out;
                }
                Py_ssize_t q = (Py_ssize_t)qq;
                PyObject *al = PyList_GET_ITEM(allowed, q);
                if (al != Py_None) {
                    PyObject *yo = PyLong_FromLongLong(y);
                    int in = yo ? PySet_Contains(al, yo) : -1;
                    Py_XDECREF(yo);
                    if (in < 0)
                        goto out;
                    holds = in;
                    continue;
                }
                PyObject *rng = PyList_GET_ITEM(ranges, q);
                Py_ssize_t lo, hi;
                long long per, lq;
                if (!PyTuple_Check(rng) || PyTuple_GET_SIZE(rng) != 2 ||
                    !PyArg_ParseTuple(rng, "nn", &lo, &hi) || ll_item(periods, q, &per) < 0 || ll_item(low, q, &lq) < 0)
                    goto out;
                PyObject *ref = PyList_GET_ITEM(refs, q);
                if (!PyDict_Check(ref)) {
                    PyErr_SetString(PyExc_TypeError, "inputs_from: a first period is no dict");
                    goto out;
                }
                Py_ssize_t at = period_index(y, PyList_GET_ITEM(codes, q), lo, hi, ref, m, per);
                if (at == -2)
                    goto out;
                if (at == -1) {
                    PyObject *yo = PyLong_FromLongLong(y), *tl = PyList_GET_ITEM(tails, q);
                    int in = yo && tl != Py_None ? PySet_Contains(tl, yo) : -1;
                    Py_XDECREF(yo);
                    if (in < 0) {
                        if (!PyErr_Occurred())
                            PyErr_SetString(PyExc_TypeError, "inputs_from: a rank with no tail set");
                        goto out;
                    }
                    holds = in;
                } else if (at < lq)
                    holds = 0;
            }
        }
    }
    result = PyBool_FromLong(holds);
out:
    Py_XDECREF(seq);
    deps_free(&d);
    return result;
}

PyDoc_STRVAR(rank_peak_doc,
"rank_peak(codes, memc, m, a, b)\n--\n\n"
"pipeoffload.passes.steady_timing._rank_peak before rounding: the highest running sum (at\n"
"least 0.0) of the deltas memc[x // m] of the rank's ops ``codes`` in order, leaving out the\n"
"shifted periods [a, b) (a = b = -1: none); None when the period before ``a`` does not sum to\n"
"0 exactly, NotImplemented when a delta is not a float (the Python function runs then).");

static PyObject *rank_peak(PyObject *self, PyObject *args) {
    PyObject *codes, *memc;
    long long m;
    Py_ssize_t a, b;
    if (!PyArg_ParseTuple(args, "O!O!Lnn:rank_peak", &PyList_Type, &codes, &PyList_Type, &memc, &m, &a, &b))
        return NULL;
    const Py_ssize_t n = PyList_GET_SIZE(codes), nm = PyList_GET_SIZE(memc);
    if (m <= 0) {
        PyErr_SetString(PyExc_ValueError, "rank_peak: m must be positive");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nm; i++)
        if (!PyFloat_CheckExact(PyList_GET_ITEM(memc, i)))
            Py_RETURN_NOTIMPLEMENTED;
#define DELTA_OF(i, out)                                                                          \
    do {                                                                                          \
        long long x_;                                                                             \
        if (ll_item(codes, (i), &x_) < 0)                                                         \
            return NULL;                                                                          \
        if (x_ < 0 || x_ / m >= nm) {                                                             \
            PyErr_SetString(PyExc_IndexError, "rank_peak: an op with no delta");                 \
            return NULL;                                                                          \
        }                                                                                         \
        (out) = PyFloat_AS_DOUBLE(PyList_GET_ITEM(memc, (Py_ssize_t)(x_ / m)));                  \
    } while (0)
    int cut = a >= 0;
    if (cut) {
        Py_ssize_t per = n / m;
        double sum = 0.0, v;
        if (a - per < 0 || a > n || b < a || b > n) {
            PyErr_SetString(PyExc_ValueError, "rank_peak: the shifted periods are outside the rank's ops");
            return NULL;
        }
        for (Py_ssize_t i = a - per; i < a; i++) {
            DELTA_OF(i, v);
            sum += v;
        }
        if (sum != 0.0)
            Py_RETURN_NONE;
    }
    double level = 0.0, top = 0.0, v;
    int any = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (cut && i >= a && i < b)
            continue;
        DELTA_OF(i, v);
        level = any ? level + v : v;
        if (!any || level > top)
            top = level;
        any = 1;
    }
#undef DELTA_OF
    double best = 0.0;  /* max(0.0, max(levels, default=0.0)) */
    if (any && top > best)
        best = top;
    return PyFloat_FromDouble(best);
}
