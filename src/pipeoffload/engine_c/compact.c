/* Compact orders (pipeoffload.ir.CompactOrders) and the validator's shape tables
 * (pipeoffload.passes.validate._check_shape_compact). */

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
