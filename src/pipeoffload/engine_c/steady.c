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
