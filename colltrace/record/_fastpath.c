/* colltrace's C fast path: the traced wrapper of one torch.distributed function, for the calls
 * that repeat (a training loop issues the same few thousand calls again and again).
 *
 * It does what the generated Python wrapper's fast path does (colltrace/record/shim.py,
 * _TEMPLATE, and Recorder.watch for an async call's Work), with the same objects, and hands
 * every other call to that Python wrapper
 * unchanged: a thread it has not seen, a call inside a traced call, a key not in the thread's
 * cache, a record that reads the backend's sequence number. It changes nothing
 * before it knows it will finish the record itself, so handing over is always safe.
 *
 * Built by hatch_build.py when a C compiler is there; without it the Python wrapper does all.
 * COLLTRACE_PURE=1 turns it off.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* the slot layout of schema 1 (colltrace/trace/schema.py, checked at construction) */
#define SLOT_SIZE 128
#define RING_HEADER_SIZE 4096
#define HEAD_OFFSET 24
#define HEAD_MASK 63
#define OFF_HEAD 8
#define OFF_SEQ 48
#define OFF_MID 56
#define OFF_STEP 84
#define OFF_MICRO 88
#define OFF_T_ISSUE 92
#define OFF_T_DONE 100
#define OFF_WAIT 108
#define SLOT_USED 116
#define HEAD_LEN 40
#define MID_LEN 28
#define FLAG_ASYNC 1
#define PENDING_MAX 8192 /* recorder._PENDING_MAX */

#define KEY_VALUE 0
#define KEY_SHAPE 1
#define KEY_DTYPE 2
#define MAX_ITEMS 16

static PyObject *s_pending, *s_shed, *s_recorder, *s_depth, *s_serve, *s_static, *s_seq, *s_anchor_next, *s_writer, *s_counter,
    *s_capacity, *s_full, *s_mv, *s_ctx, *s_step, *s_micro_step, *s_last_idx, *s_last_progress_ns, *s_shape,
    *s_dtype, *s_offset_of, *s_failed, *s_one, *s_zero;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *orig;    /* the torch function */
    PyObject *slow;    /* the generated Python wrapper: handles every call this one hands over */
    PyObject *shim;    /* .recorder */
    PyObject *threads; /* thread id -> ThreadState */
    PyObject *current; /* Context.current(ts): attribution when no adapter serves */
    PyObject *plan; /* ops.key_plan's (key_id, items) */
    PyObject *key_id;
    Py_ssize_t n_items;
    int what[MAX_ITEMS];
    Py_ssize_t pos[MAX_ITEMS];
    PyObject *kw[MAX_ITEMS];
    PyObject *dflt[MAX_ITEMS];
    long anchor_flags;
    long bseq_mask;
    PyObject *dict; /* __wrapped__, __name__, __doc__, __colltrace__ (functools.update_wrapper) */
    /* the recorder's parts that do not change while it records (the ring is not remapped but
     * in full mode, where mv is read each time) */
    PyObject *c_rec, *c_writer, *c_ctx, *c_ids, *c_mv, *c_pending;
    int64_t c_cap;
    int c_full;
} Traced;

static inline int64_t
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline void
put_i64(char *p, int64_t v)
{
    memcpy(p, &v, 8); /* little-endian hosts only: checked at import */
}

static inline void
put_i32(char *p, int32_t v)
{
    memcpy(p, &v, 4);
}

/* the argument at position pos or keyword kw, else dflt (borrowed) */
static PyObject *
argument(Traced *self, Py_ssize_t i, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (self->pos[i] < nargs)
        return args[self->pos[i]];
    if (kwnames) {
        Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t j = 0; j < nkw; j++) {
            PyObject *name = PyTuple_GET_ITEM(kwnames, j);
            if (name == self->kw[i] || PyUnicode_Compare(name, self->kw[i]) == 0)
                return args[nargs + j];
        }
    }
    return self->dflt[i];
}

/* a Python int attribute as int64, or -1 with an exception */
static int
get_i64(PyObject *obj, PyObject *name, int64_t *out)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (!v)
        return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int
set_i64(PyObject *obj, PyObject *name, int64_t value)
{
    PyObject *v = PyLong_FromLongLong(value);
    if (!v)
        return -1;
    int r = PyObject_SetAttr(obj, name, v);
    Py_DECREF(v);
    return r;
}

/* The key of this call: (key_id, *items, attribution), as ops.key_plan says. New ref, or NULL
 * with an exception (AttributeError: not a tensor, the Python wrapper will say so). */
static PyObject *
build_key(Traced *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject *attribution)
{
    PyObject *key = PyTuple_New(self->n_items + 2);
    if (!key)
        return NULL;
    Py_INCREF(self->key_id);
    PyTuple_SET_ITEM(key, 0, self->key_id);
    for (Py_ssize_t i = 0; i < self->n_items; i++) {
        PyObject *arg = argument(self, i, args, nargs, kwnames);
        PyObject *v;
        if (self->what[i] == KEY_VALUE) {
            Py_INCREF(arg);
            v = arg;
        }
        else {
            v = PyObject_GetAttr(arg, self->what[i] == KEY_SHAPE ? s_shape : s_dtype);
            if (!v) {
                Py_DECREF(key);
                return NULL;
            }
        }
        PyTuple_SET_ITEM(key, i + 1, v);
    }
    Py_INCREF(attribution);
    PyTuple_SET_ITEM(key, self->n_items + 1, attribution);
    return key;
}

static void
forget_recorder(Traced *self)
{
    Py_CLEAR(self->c_rec);
    Py_CLEAR(self->c_writer);
    Py_CLEAR(self->c_ctx);
    Py_CLEAR(self->c_ids);
    Py_CLEAR(self->c_mv);
    Py_CLEAR(self->c_pending);
}

/* the cached parts of recorder rec: 0, or -1 with an exception */
static int
know_recorder(Traced *self, PyObject *rec)
{
    if (rec == self->c_rec)
        return 0;
    forget_recorder(self);
    PyObject *writer = PyObject_GetAttr(rec, s_writer);
    if (!writer)
        return -1;
    self->c_writer = writer;
    if (!(self->c_ctx = PyObject_GetAttr(rec, s_ctx)) || !(self->c_ids = PyObject_GetAttr(writer, s_counter)) ||
        get_i64(writer, s_capacity, &self->c_cap) < 0 || self->c_cap <= 0)
        goto fail;
    PyObject *v = PyObject_GetAttr(writer, s_full);
    if (!v)
        goto fail;
    self->c_full = PyObject_IsTrue(v);
    Py_DECREF(v);
    if (!self->c_full && !(self->c_mv = PyObject_GetAttr(writer, s_mv)))
        goto fail;
    if (!(self->c_pending = PyObject_GetAttr(rec, s_pending)) || !PyDict_Check(self->c_pending))
        goto fail;
    Py_INCREF(rec);
    self->c_rec = rec;
    return 0;
fail:
    forget_recorder(self);
    return -1;
}

static PyObject *
hand_over(Traced *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    return PyObject_Vectorcall(self->slow, args, nargsf, kwnames);
}

static PyObject *
traced_call(Traced *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *rec = NULL, *ts = NULL, *attribution = NULL, *key = NULL, *cache = NULL, *counter = NULL;
    PyObject *writer = NULL, *ctx = NULL, *mv = NULL, *result = NULL, *v = NULL;
    int64_t t_issue, seq, idx, cap, step, micro, off, last_idx;
    Py_buffer view;

    /* -- everything that can fail or hand over, before anything changes ---------------------- */
    rec = PyObject_GetAttr(self->shim, s_recorder);
    if (!rec || rec == Py_None)
        goto over;
    {
        PyObject *ident = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
        if (!ident)
            goto over;
        ts = PyDict_GetItemWithError(self->threads, ident); /* borrowed */
        Py_DECREF(ident);
        if (!ts)
            goto over; /* a thread not seen yet: the Python wrapper makes its state */
        Py_INCREF(ts);
    }
    v = PyObject_GetAttr(ts, s_depth);
    if (!v)
        goto over;
    int depth = PyObject_IsTrue(v);
    Py_CLEAR(v);
    if (depth)
        goto over; /* inside a traced call: the Python wrapper calls the original */
    t_issue = now_ns();
    attribution = PyObject_GetAttr(ts, s_serve);
    if (!attribution)
        goto over;
    if (!PyObject_IsTrue(attribution)) {
        Py_DECREF(attribution);
        attribution = PyObject_CallOneArg(self->current, ts);
        if (!attribution)
            goto over;
    }
    key = build_key(self, args, nargs, kwnames, attribution);
    if (!key)
        goto over;
    cache = PyObject_GetAttr(ts, s_static);
    if (!cache || !PyDict_Check(cache))
        goto over;
    PyObject *entry = PyDict_GetItemWithError(cache, key); /* borrowed: (head, mid, counter, flags) */
    if (!entry || !PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 4)
        goto over;
    PyObject *head = PyTuple_GET_ITEM(entry, 0), *mid = PyTuple_GET_ITEM(entry, 1);
    counter = PyTuple_GET_ITEM(entry, 2);
    Py_INCREF(counter);
    long flags = PyLong_AsLong(PyTuple_GET_ITEM(entry, 3));
    if ((flags == -1 && PyErr_Occurred()) || (flags & self->anchor_flags))
        goto over;
    if (!PyBytes_Check(head) || PyBytes_GET_SIZE(head) != HEAD_LEN || !PyBytes_Check(mid) ||
        PyBytes_GET_SIZE(mid) != MID_LEN)
        goto over;
    v = PyObject_GetAttr(counter, s_anchor_next);
    if (!v)
        goto over;
    int anchor_next = PyObject_IsTrue(v);
    Py_CLEAR(v);
    if (get_i64(counter, s_seq, &seq) < 0)
        goto over;
    if (anchor_next || !((seq + 1) & self->bseq_mask))
        goto over; /* this record reads the backend's sequence number */
    if (know_recorder(self, rec) < 0)
        goto over;
    writer = self->c_writer;
    Py_INCREF(writer);
    ctx = self->c_ctx;
    Py_INCREF(ctx);
    cap = self->c_cap;
    int full = self->c_full;
    if (get_i64(ctx, s_step, &step) < 0 || get_i64(ctx, s_micro_step, &micro) < 0)
        goto over;

    /* -- the record: from here on it is ours to finish ---------------------------------------- */
    v = PyIter_Next(self->c_ids);
    if (!v)
        goto over; /* nothing was written; the Python wrapper takes the next number */
    idx = PyLong_AsLongLong(v);
    if (idx < cap)
        off = RING_HEADER_SIZE + idx * SLOT_SIZE;
    else if (!full)
        off = RING_HEADER_SIZE + (idx % cap) * SLOT_SIZE;
    else {
        PyObject *o = PyObject_CallMethodOneArg(writer, s_offset_of, v); /* grows the file */
        off = o ? PyLong_AsLongLong(o) : -1;
        Py_XDECREF(o);
    }
    Py_CLEAR(v);
    if (off < 0 || set_i64(counter, s_seq, seq + 1) < 0)
        goto lost;
    mv = self->c_mv ? (Py_INCREF(self->c_mv), self->c_mv) : PyObject_GetAttr(writer, s_mv);
    if (!mv || PyObject_GetBuffer(mv, &view, PyBUF_WRITABLE) < 0)
        goto lost;
    if (off + SLOT_SIZE > view.len) {
        PyBuffer_Release(&view);
        goto lost;
    }
    {
        char *slot = (char *)view.buf + off;
        memset(slot, 0, SLOT_USED);
        memcpy(slot + OFF_HEAD, PyBytes_AS_STRING(head), HEAD_LEN);
        put_i64(slot + OFF_SEQ, seq + 1);
        memcpy(slot + OFF_MID, PyBytes_AS_STRING(mid), MID_LEN);
        put_i32(slot + OFF_STEP, (int32_t)step);
        put_i32(slot + OFF_MICRO, (int32_t)micro);
        put_i64(slot + OFF_T_ISSUE, t_issue);
        __atomic_signal_fence(__ATOMIC_SEQ_CST); /* the marker goes last: it commits the slot */
        put_i64(slot, idx + 1);
        if (!(idx & HEAD_MASK))
            put_i64((char *)view.buf + HEAD_OFFSET, idx + 1);
    }
    PyBuffer_Release(&view);
    Py_CLEAR(mv);
    if (set_i64(writer, s_last_idx, idx) < 0 || set_i64(counter, s_last_idx, idx) < 0 ||
        set_i64(rec, s_last_progress_ns, t_issue) < 0 || PyObject_SetAttr(ts, s_depth, s_one) < 0)
        goto lost;

    /* -- the call ---------------------------------------------------------------------------- */
    result = PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
    {
        PyObject *et, *ev, *etb;
        PyErr_Fetch(&et, &ev, &etb);
        PyObject_SetAttr(ts, s_depth, s_zero);
        PyErr_Clear();
        PyErr_Restore(et, ev, etb);
    }
    if (!result) { /* rec.failed(idx, flags, exc): the error record says the exception came from here */
        PyObject *et, *ev, *etb;
        PyErr_Fetch(&et, &ev, &etb);
        PyErr_NormalizeException(&et, &ev, &etb);
        if (ev && etb)
            PyException_SetTraceback(ev, etb);
        PyObject *r = PyObject_CallMethod(rec, "failed", "LlO", (long long)idx, flags, ev ? ev : Py_None);
        Py_XDECREF(r);
        PyErr_Clear();
        PyErr_Restore(et, ev, etb);
        goto done;
    }

    /* -- an async call is done when its Work is seen done: Recorder.watch, in C ------------- */
    if ((flags & FLAG_ASYNC) && result != Py_None) {
        PyObject *entry2 = Py_BuildValue("(Ll[i])", (long long)idx, flags, 1);
        if (!entry2 || PyDict_SetItem(self->c_pending, result, entry2) < 0)
            PyErr_Clear(); /* an unhashable result: its completion stays unknown, as in Python */
        Py_XDECREF(entry2);
        if (PyDict_GET_SIZE(self->c_pending) > PENDING_MAX) {
            PyObject *r = PyObject_CallMethodNoArgs(rec, s_shed);
            Py_XDECREF(r);
            PyErr_Clear();
        }
        goto done;
    }

    /* -- a blocking call is done when it returns ---------------------------------------------- */
    {
        int64_t t = now_ns();
        if (get_i64(writer, s_last_idx, &last_idx) < 0 || (!full && last_idx - idx >= cap)) {
            PyErr_Clear(); /* the ring moved past this slot meanwhile: nothing to complete */
            goto done;
        }
        mv = self->c_mv ? (Py_INCREF(self->c_mv), self->c_mv) : PyObject_GetAttr(writer, s_mv); /* full mode may have grown the file */
        if (mv && PyObject_GetBuffer(mv, &view, PyBUF_WRITABLE) == 0) {
            if (off + SLOT_SIZE <= view.len) {
                char *slot = (char *)view.buf + off;
                put_i64(slot + OFF_T_DONE, t);
                put_i64(slot + OFF_WAIT, t - t_issue);
            }
            PyBuffer_Release(&view);
        }
        if (set_i64(rec, s_last_progress_ns, t) < 0)
            PyErr_Clear();
        PyErr_Clear();
    }
    goto done;

over: /* hand the call over, untouched */
    PyErr_Clear();
    Py_XDECREF(rec);
    Py_XDECREF(ts);
    Py_XDECREF(attribution);
    Py_XDECREF(key);
    Py_XDECREF(cache);
    Py_XDECREF(counter);
    Py_XDECREF(writer);
    Py_XDECREF(ctx);
    Py_XDECREF(v);
    return hand_over(self, args, nargsf, kwnames);

lost: /* the record could not be written (the trace is broken): the call still runs */
    PyErr_Clear();
    Py_XDECREF(mv);
    mv = NULL;
    result = PyObject_Vectorcall(self->orig, args, nargsf, kwnames);

done:
    Py_XDECREF(mv);
    Py_XDECREF(rec);
    Py_XDECREF(ts);
    Py_XDECREF(attribution);
    Py_XDECREF(key);
    Py_XDECREF(cache);
    Py_XDECREF(counter);
    Py_XDECREF(writer);
    Py_XDECREF(ctx);
    return result;
}

static PyObject *
traced_tp_call(Traced *self, PyObject *args, PyObject *kwargs)
{
    return PyVectorcall_Call((PyObject *)self, args, kwargs);
}

/* Traced(orig, slow, shim, threads, current, plan, anchor_flags, bseq_mask) */
static PyObject *
traced_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *orig, *slow, *shim, *threads, *current, *plan;
    long anchor_flags, bseq_mask;
    if (!PyArg_ParseTuple(args, "OOOO!OO!ll", &orig, &slow, &shim, &PyDict_Type, &threads, &current,
                          &PyTuple_Type, &plan, &anchor_flags, &bseq_mask))
        return NULL;
    PyObject *key_id, *items;
    if (!PyArg_ParseTuple(plan, "OO!", &key_id, &PyTuple_Type, &items))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    if (n > MAX_ITEMS) {
        PyErr_SetString(PyExc_ValueError, "too many key items");
        return NULL;
    }
    Traced *self = (Traced *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->vectorcall = (vectorcallfunc)traced_call;
    Py_INCREF(orig);
    self->orig = orig;
    Py_INCREF(slow);
    self->slow = slow;
    Py_INCREF(shim);
    self->shim = shim;
    Py_INCREF(threads);
    self->threads = threads;
    Py_INCREF(current);
    self->current = current;
    Py_INCREF(key_id);
    self->key_id = key_id;
    Py_INCREF(plan);
    self->plan = plan;
    self->anchor_flags = anchor_flags;
    self->bseq_mask = bseq_mask;
    for (Py_ssize_t i = 0; i < n; i++) {
        int what;
        Py_ssize_t pos;
        PyObject *var, *kw, *dflt;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(items, i), "iOnUO", &what, &var, &pos, &kw, &dflt)) {
            Py_DECREF(self);
            return NULL;
        }
        self->what[i] = what;
        self->pos[i] = pos;
        Py_INCREF(kw);
        PyUnicode_InternInPlace(&kw);
        self->kw[i] = kw;
        Py_INCREF(dflt);
        self->dflt[i] = dflt;
        self->n_items = i + 1;
    }
    return (PyObject *)self;
}

static int
traced_traverse(Traced *self, visitproc visit, void *arg)
{
    Py_VISIT(self->orig);
    Py_VISIT(self->slow);
    Py_VISIT(self->shim);
    Py_VISIT(self->threads);
    Py_VISIT(self->current);
    Py_VISIT(self->dict);
    Py_VISIT(self->c_rec);
    Py_VISIT(self->c_writer);
    Py_VISIT(self->c_ctx);
    Py_VISIT(self->c_ids);
    Py_VISIT(self->c_mv);
    Py_VISIT(self->c_pending);
    for (Py_ssize_t i = 0; i < self->n_items; i++)
        Py_VISIT(self->dflt[i]);
    return 0;
}

static int
traced_clear(Traced *self)
{
    Py_CLEAR(self->orig);
    Py_CLEAR(self->slow);
    Py_CLEAR(self->shim);
    Py_CLEAR(self->threads);
    Py_CLEAR(self->current);
    Py_CLEAR(self->key_id);
    Py_CLEAR(self->plan);
    Py_CLEAR(self->dict);
    forget_recorder(self);
    for (Py_ssize_t i = 0; i < self->n_items; i++) {
        Py_CLEAR(self->kw[i]);
        Py_CLEAR(self->dflt[i]);
    }
    self->n_items = 0;
    return 0;
}

static void
traced_dealloc(Traced *self)
{
    PyObject_GC_UnTrack(self);
    traced_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
traced_get_slow(Traced *self, void *closure)
{
    Py_INCREF(self->slow);
    return self->slow;
}

static PyObject *
traced_get_plan(Traced *self, void *closure)
{
    Py_INCREF(self->plan);
    return self->plan;
}

static PyGetSetDef traced_getset[] = {
    {"plan", (getter)traced_get_plan, NULL, "how the key of a call is built (ops.key_plan)", NULL},
    {"slow", (getter)traced_get_slow, NULL, "the Python wrapper this one hands calls over to", NULL},
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL},
};

static PyTypeObject TracedType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "colltrace.record._fastpath.Traced",
    .tp_basicsize = sizeof(Traced),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Traced, vectorcall),
    .tp_call = (ternaryfunc)traced_tp_call,
    .tp_new = traced_new,
    .tp_traverse = (traverseproc)traced_traverse,
    .tp_clear = (inquiry)traced_clear,
    .tp_dealloc = (destructor)traced_dealloc,
    .tp_getset = traced_getset,
    .tp_dictoffset = offsetof(Traced, dict),
    .tp_doc = "The traced wrapper of one torch.distributed function (the C fast path).",
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastpath", "colltrace's C fast path for repeated collective calls.", -1, NULL,
};

#define INTERN(var, text)                                                                                    \
    if (!((var) = PyUnicode_InternFromString(text)))                                                         \
        return NULL;

PyMODINIT_FUNC
PyInit__fastpath(void)
{
    const uint16_t probe = 1;
    if (*(const uint8_t *)&probe != 1) {
        PyErr_SetString(PyExc_ImportError, "the C fast path writes little-endian slots only");
        return NULL;
    }
    INTERN(s_recorder, "recorder");
    INTERN(s_pending, "pending");
    INTERN(s_shed, "_shed");
    INTERN(s_depth, "depth");
    INTERN(s_serve, "serve");
    INTERN(s_static, "static");
    INTERN(s_seq, "seq");
    INTERN(s_anchor_next, "anchor_next");
    INTERN(s_writer, "writer");
    INTERN(s_counter, "counter");
    INTERN(s_capacity, "capacity");
    INTERN(s_full, "full");
    INTERN(s_mv, "mv");
    INTERN(s_ctx, "ctx");
    INTERN(s_step, "step");
    INTERN(s_micro_step, "micro_step");
    INTERN(s_last_idx, "last_idx");
    INTERN(s_last_progress_ns, "last_progress_ns");
    INTERN(s_shape, "shape");
    INTERN(s_dtype, "dtype");
    INTERN(s_offset_of, "offset_of");
    INTERN(s_failed, "failed");
    if (!(s_one = PyLong_FromLong(1)) || !(s_zero = PyLong_FromLong(0)))
        return NULL;
    if (PyType_Ready(&TracedType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    Py_INCREF(&TracedType);
    if (PyModule_AddObject(m, "Traced", (PyObject *)&TracedType) < 0) {
        Py_DECREF(&TracedType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "SLOT_SIZE", SLOT_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "RING_HEADER_SIZE", RING_HEADER_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "OFF_T_DONE", OFF_T_DONE) < 0 ||
        PyModule_AddIntConstant(m, "OFF_WAIT", OFF_WAIT) < 0 ||
        PyModule_AddIntConstant(m, "OFF_T_ISSUE", OFF_T_ISSUE) < 0 ||
        PyModule_AddIntConstant(m, "OFF_SEQ", OFF_SEQ) < 0 || PyModule_AddIntConstant(m, "OFF_STEP", OFF_STEP) < 0 ||
        PyModule_AddIntConstant(m, "HEAD_OFFSET", HEAD_OFFSET) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
