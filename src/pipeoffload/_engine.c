/* The package's per-op loops in C, each the twin of one Python loop (named in its docstring),
 * op for op and float for float:
 *   engine_c/timing.c   the timing pass's list scheduling (passes.timing)
 *   engine_c/inplace.c  helpers for loops that work in place on their Python state
 *   engine_c/steady.c   the periodic timing's engine (passes.steady_timing)
 *   engine_c/refill.c   the W refill's greedy (schedules.w_refill)
 *   engine_c/reorder.c  the V slot reorder's W placement, squeeze and visits (schedules.v_reorder)
 *   engine_c/scans.c    small scans: op slots, periodic ranges and stretches, V-auto's family peaks
 *   engine_c/grid.c     the grid rules' sweeps, peaks and timing (schedules.v_grid_lowering)
 *   engine_c/block.c    the building-block reorder's scan and op table rows (schedules.building_block)
 *   engine_c/compact.c  compact orders (ir) and the validator's shape tables (passes.validate)
 * One translation unit: this file includes the parts in dependency order, then the module table.
 *
 * Why: the planner times several hundred schedules of 10^5-10^6 ops each (docs/planner.md §4g), and
 * V-auto at p = 64 is about thirty lowerings of 5·10^4 ops each (docs/algorithms.md §9.14, §9.16):
 * in Python each op costs 1-2 µs of interpreter work, here tens of nanoseconds.
 *
 * Guarantees: each function returns what its twin returns and leaves the state it shares as the
 * twin would (IEEE doubles, the same comparisons and additions in the same order; nothing is
 * reassociated). Where an input is outside what it reads it says so without changing anything
 * (None or NotImplemented, as its docstring says) and the caller runs the twin;
 * tests/test_engine_c.py and tests/test_engine_c_loops.py compare every pair. Built optionally
 * (setup.py): without a C compiler the package runs the Python loops (pipeoffload.native chooses).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine_c/timing.c"
#include "engine_c/inplace.c"
#include "engine_c/steady.c"
#include "engine_c/refill.c"
#include "engine_c/reorder.c"
#include "engine_c/scans.c"
#include "engine_c/grid.c"
#include "engine_c/block.c"
#include "engine_c/compact.c"

static PyMethodDef methods[] = {
    {"time_compact", time_compact, METH_VARARGS, time_compact_doc},
    {"time_in_runs", time_in_runs, METH_VARARGS, time_in_runs_doc},
    {"steady_run", steady_run, METH_VARARGS, steady_run_doc},
    {"inputs_from", inputs_from, METH_VARARGS, inputs_from_doc},
    {"rank_peak", rank_peak, METH_VARARGS, rank_peak_doc},
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
    {"grid_dependencies_hold", grid_dependencies_hold, METH_VARARGS, grid_dependencies_doc},
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
