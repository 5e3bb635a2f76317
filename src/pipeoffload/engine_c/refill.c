/* pipeoffload.schedules.w_refill._Refill._run_py, in place. */

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
             *waiting = NULL, *partial_o = NULL, *consulted = NULL, *pos = NULL, *ops_of = NULL, *periodic = NULL,
             *S_o = NULL,
             *M_o = NULL, *deps = NULL, *end = NULL, *clock = NULL, *origin_o = NULL, *dur = NULL, *mem = NULL,
             *level = NULL, *peak = NULL, *idle = NULL, *started = NULL, *first = NULL, *order = NULL,
             *rank_of = NULL;
    PyObject **slots[] = {&skeleton, &pending, &caps, &done_l, &lim_l, &blocked_l, &waiting, &partial_o, &consulted,
                          &pos, &ops_of, &periodic};
    const char *names[] = {"skeleton", "pending", "caps", "done", "lim", "blocked", "waiting", "partial",
                           "consulted", "pos", "ops_of", "periodic"};
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
                    /* by the period where the skeleton is periodic there, else pos (which searches) */
                    int found = periodic != Py_None ? periodic_position(periodic, qr, missing, f.M, &k) : 0;
                    if (found < 0) {
                        failed = 1;
                        break;
                    }
                    if (!found) {
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
