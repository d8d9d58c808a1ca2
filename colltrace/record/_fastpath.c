/* colltrace's C fast path: the traced wrapper of one torch.distributed function, for the calls
 * that repeat (a training loop issues the same few thousand calls again and again).
 *
 * It does what the generated Python wrapper's fast path does (colltrace/record/shim.py,
 * _TEMPLATE, Recorder.anchor/returned for the backend-sequence read at every 32nd record, and
 * Recorder.watch for an async call's Work), with the same objects, and hands every other call to
 * that Python wrapper unchanged: a thread it has not seen, a call inside a traced call, a key not
 * in the thread's cache, a call of several backend collectives (object, coalesced), a p2p call
 * that reads the backend's sequence number. It changes nothing before it knows it will finish
 * the record itself, so handing over is always safe.
 *
 * Also here: Work.wait (Waiter), the FSDP/ZeRO adapters' serving scope (Serving), the C fields
 * of the recorder's hot integers (the cells), and the frame walk that finds the running module.
 *
 * Built by hatch_build.py when a C compiler is there; without it the Python wrapper does all.
 * COLLTRACE_PURE=1 turns it off.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* The running modules are read from the interpreter's own frame chain (frame_self below). Its
 * layout is internal and changes between releases: written for 3.11 and 3.12 (only 3.11 is
 * tested here); other versions get no frame_self and colltrace walks sys._getframe() in Python. */
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030D0000
#define COLLTRACE_FRAMES 1
#define Py_BUILD_CORE
#include "internal/pycore_frame.h"
#undef Py_BUILD_CORE
#endif

/* the slot layout of schema 1 (colltrace/trace/schema.py; shim._load_fastpath checks the exported
 * constants against it and leaves the module unused if they differ) */
#define SLOT_SIZE 128
#define RING_HEADER_SIZE 4096
#define HEAD_OFFSET 24
#define HEAD_MASK 63
#define OFF_HEAD 8
#define OFF_SEQ 48
#define OFF_MID 56 /* the static mid part; the backend's seq is its first 8 bytes */
#define OFF_BSEQ 56
#define OFF_STEP 84
#define OFF_MICRO 88
#define OFF_T_ISSUE 92
#define OFF_T_DONE 100
#define OFF_WAIT 108
#define OFF_FLAGS 9
#define FLAG_DONE 2
#define SLOT_USED 116
#define HEAD_LEN 40
#define MID_LEN 28
#define FLAG_ASYNC 1
#define FLAG_DEVICE 128 /* CUDA tensors: done when the device is (Recorder.on_device, Python) */
#define PENDING_MAX 8192 /* recorder._PENDING_MAX */

#define KEY_VALUE 0
#define KEY_SHAPE 1
#define KEY_DTYPE 2
#define MAX_ITEMS 16

/* -- cells ------------------------------------------------------------------------------------
 * The integers the hot path reads and writes on every call, kept as C fields of the Python objects
 * that own them: the Recorder, its TraceWriter, the Context, each ThreadState and each group's
 * sequence counter derive from these types (colltrace/record/cells.py). Python code reads and
 * writes the same attributes as ever (member descriptors); this file reads and writes the fields
 * themselves, without making, looking up or freeing a Python int. */

typedef struct {
    PyObject_HEAD
    int64_t seq;      /* the group's last sequence number */
    int64_t last_idx; /* idx of the group's last record */
    char anchor_next; /* read the backend's sequence number after the next record */
} SeqCells;

typedef struct {
    PyObject_HEAD
    int64_t step;       /* optimizer steps completed */
    int64_t micro_step; /* root forwards since the last optimizer step */
} ContextCells;

typedef struct {
    PyObject_HEAD
    PyObject *serve;  /* what an adapter says the thread's collectives serve, or None */
    PyObject *static_; /* the thread's cache: key -> (head, mid, counter, flags) */
    int depth;        /* > 0: inside a traced call */
    char prefetch;    /* inside a framework's prefetch (FSDP's _prefetch_unshard) */
} ThreadCells;

typedef struct {
    PyObject_HEAD
    int64_t last_idx; /* idx of the last record appended */
} WriterCells;

typedef struct {
    PyObject_HEAD
    int64_t last_progress_ns; /* when a collective was last issued or seen done (the hang watchdog) */
} RecorderCells;

static PyMemberDef seq_cells_members[] = {
    {"seq", T_LONGLONG, offsetof(SeqCells, seq), 0, NULL},
    {"last_idx", T_LONGLONG, offsetof(SeqCells, last_idx), 0, NULL},
    {"anchor_next", T_BOOL, offsetof(SeqCells, anchor_next), 0, NULL},
    {NULL},
};

static PyMemberDef context_cells_members[] = {
    {"step", T_LONGLONG, offsetof(ContextCells, step), 0, NULL},
    {"micro_step", T_LONGLONG, offsetof(ContextCells, micro_step), 0, NULL},
    {NULL},
};

static PyMemberDef thread_cells_members[] = {
    {"serve", T_OBJECT_EX, offsetof(ThreadCells, serve), 0, NULL},
    {"static", T_OBJECT_EX, offsetof(ThreadCells, static_), 0, NULL},
    {"depth", T_INT, offsetof(ThreadCells, depth), 0, NULL},
    {"prefetch", T_BOOL, offsetof(ThreadCells, prefetch), 0, NULL},
    {NULL},
};

static PyMemberDef writer_cells_members[] = {
    {"last_idx", T_LONGLONG, offsetof(WriterCells, last_idx), 0, NULL},
    {NULL},
};

static PyMemberDef recorder_cells_members[] = {
    {"last_progress_ns", T_LONGLONG, offsetof(RecorderCells, last_progress_ns), 0, NULL},
    {NULL},
};

static int
thread_cells_traverse(ThreadCells *self, visitproc visit, void *arg)
{
    Py_VISIT(self->serve);
    Py_VISIT(self->static_);
    return 0;
}

static int
thread_cells_clear(ThreadCells *self)
{
    Py_CLEAR(self->serve);
    Py_CLEAR(self->static_);
    return 0;
}

static void
thread_cells_dealloc(ThreadCells *self)
{
    PyObject_GC_UnTrack(self);
    thread_cells_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

#define CELLS_TYPE(var, name, type, members)                                                                 \
    static PyTypeObject var = {                                                                              \
        PyVarObject_HEAD_INIT(NULL, 0).tp_name = "colltrace.record._fastpath." name,                       \
        .tp_basicsize = sizeof(type),                                                                        \
        .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,                                                \
        .tp_new = PyType_GenericNew,                                                                         \
        .tp_members = members,                                                                               \
        .tp_doc = "The hot integers of a colltrace recorder object, as C fields (see cells.py).",            \
    };

CELLS_TYPE(SeqCellsType, "SeqCells", SeqCells, seq_cells_members)
CELLS_TYPE(ContextCellsType, "ContextCells", ContextCells, context_cells_members)
CELLS_TYPE(WriterCellsType, "WriterCells", WriterCells, writer_cells_members)
CELLS_TYPE(RecorderCellsType, "RecorderCells", RecorderCells, recorder_cells_members)

static PyTypeObject ThreadCellsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "colltrace.record._fastpath.ThreadCells",
    .tp_basicsize = sizeof(ThreadCells),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_traverse = (traverseproc)thread_cells_traverse,
    .tp_clear = (inquiry)thread_cells_clear,
    .tp_dealloc = (destructor)thread_cells_dealloc,
    .tp_members = thread_cells_members,
    .tp_doc = "A thread's serving scope, call cache, depth and prefetch, as C fields (see cells.py).",
};

#define SEQ(o) ((SeqCells *)(o))
#define CTX(o) ((ContextCells *)(o))
#define TS(o) ((ThreadCells *)(o))
#define WRITER(o) ((WriterCells *)(o))
#define REC(o) ((RecorderCells *)(o))

static PyObject *s_pending, *s_shed, *s_backend_seq, *s_recorder, *s_writer, *s_counter, *s_capacity, *s_full,
    *s_mv, *s_ctx, *s_shape, *s_dtype, *s_offset_of, *s_pg, *s_default_pg, *s_get_seq;

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
    Py_ssize_t group_item; /* the key item that is the call's group, or -1 */
    int what[MAX_ITEMS];
    Py_ssize_t pos[MAX_ITEMS];
    PyObject *kw[MAX_ITEMS];
    PyObject *dflt[MAX_ITEMS];
    long python_flags; /* calls with these flags go to the Python wrapper (shim._PYTHON_FLAGS) */
    long bseq_mask;
    PyObject *dict; /* __wrapped__, __name__, __doc__, __colltrace__ (functools.update_wrapper) */
    PyObject *weakrefs;
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

/* the slot at off if it still holds record idx (the ring may have moved on since), else NULL:
 * TraceWriter._live_offset */
static inline char *
live_slot(Py_buffer *view, int64_t off, int64_t idx)
{
    if (off < 0 || off + SLOT_SIZE > view->len)
        return NULL;
    char *slot = (char *)view->buf + off;
    int64_t marker;
    memcpy(&marker, slot, 8);
    return marker == idx + 1 ? slot : NULL;
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
            /* ours is interned, and so are the names of a call written in the source: those
             * match by identity; a name built at run time (**kwargs) may need comparing */
            PyObject *name = PyTuple_GET_ITEM(kwnames, j);
            if (name == self->kw[i] || (!PyUnicode_CHECK_INTERNED(name) && PyUnicode_Compare(name, self->kw[i]) == 0))
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

/* Learn the fixed parts of recorder rec (0), or -1 with an exception. Everything is fetched into
 * locals first and stored at the end, with no Python code in between: another thread may be inside
 * a call of this wrapper, and it keeps its own references (see Parts). */
static int
know_recorder(Traced *self, PyObject *rec)
{
    if (rec == self->c_rec)
        return 0;
    PyObject *writer = NULL, *ctx = NULL, *ids = NULL, *mv = NULL, *pending = NULL, *v = NULL;
    int64_t cap = 0;
    int full;
    if (!PyObject_TypeCheck(rec, &RecorderCellsType)) {
        PyErr_SetString(PyExc_TypeError, "the recorder is not a RecorderCells");
        return -1;
    }
    if (!(writer = PyObject_GetAttr(rec, s_writer)) || !PyObject_TypeCheck(writer, &WriterCellsType) ||
        !(ctx = PyObject_GetAttr(rec, s_ctx)) || !PyObject_TypeCheck(ctx, &ContextCellsType) ||
        !(ids = PyObject_GetAttr(writer, s_counter)) || get_i64(writer, s_capacity, &cap) < 0 || cap <= 0 ||
        !(v = PyObject_GetAttr(writer, s_full)) || (full = PyObject_IsTrue(v)) < 0 ||
        (!full && !(mv = PyObject_GetAttr(writer, s_mv))) || !(pending = PyObject_GetAttr(rec, s_pending)) ||
        !PyDict_Check(pending)) {
        Py_XDECREF(writer);
        Py_XDECREF(ctx);
        Py_XDECREF(ids);
        Py_XDECREF(mv);
        Py_XDECREF(pending);
        Py_XDECREF(v);
        return -1;
    }
    Py_DECREF(v);
    PyObject *old_rec = self->c_rec, *old_writer = self->c_writer, *old_ctx = self->c_ctx, *old_ids = self->c_ids,
             *old_mv = self->c_mv, *old_pending = self->c_pending;
    Py_INCREF(rec);
    self->c_rec = rec;
    self->c_writer = writer;
    self->c_ctx = ctx;
    self->c_ids = ids;
    self->c_mv = mv;
    self->c_pending = pending;
    self->c_cap = cap;
    self->c_full = full;
    Py_XDECREF(old_rec);
    Py_XDECREF(old_writer);
    Py_XDECREF(old_ctx);
    Py_XDECREF(old_ids);
    Py_XDECREF(old_mv);
    Py_XDECREF(old_pending);
    return 0;
}

static PyObject *
hand_over(Traced *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    return PyObject_Vectorcall(self->slow, args, nargsf, kwnames);
}

/* An exception that is not an Exception (KeyboardInterrupt, SystemExit) must reach the caller,
 * as it would through the Python wrapper; any other error of the shim's own is dropped. */
static int
must_raise(void)
{
    return PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_Exception);
}

static PyObject *
traced_call(Traced *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    /* strong references held for the whole call: the wrapper's cached parts may be replaced by
     * another thread while this one is inside the collective (the GIL is released there) */
    PyObject *rec = NULL, *ts = NULL, *attribution = NULL, *key = NULL, *cache = NULL, *entry = NULL;
    PyObject *counter = NULL, *writer = NULL, *ctx = NULL, *ids = NULL, *mv = NULL, *pending = NULL;
    PyObject *result = NULL, *v = NULL, *anchor = NULL;
    int64_t t_issue, seq, idx, cap, step, micro, off = -1, last_idx, bseq = -1;
    int full, truth = 0, handed = 0, direct = 0;
    long flags;
    Py_buffer view;

    if (!self->orig || !self->slow || !self->shim)
        return PyErr_Format(PyExc_RuntimeError, "colltrace: traced wrapper used after it was cleared");

    /* -- everything that can fail or hand over, before anything changes ---------------------- */
    rec = PyObject_GetAttr(self->shim, s_recorder);
    if (!rec || rec == Py_None) {
        direct = rec != NULL; /* not recording: the original, as the Python wrapper does */
        goto over;
    }
    {
        PyObject *ident = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
        if (!ident)
            goto over;
        ts = PyDict_GetItemWithError(self->threads, ident); /* borrowed */
        Py_DECREF(ident);
        if (!ts || !PyObject_TypeCheck(ts, &ThreadCellsType))
            goto over; /* a thread not seen yet: the Python wrapper makes its state */
        Py_INCREF(ts);
    }
    if (TS(ts)->depth) {
        /* inside a traced call (all_gather_into_tensor calls all_gather_single): counted once, by
         * the outer call; the original, as the Python wrapper does */
        direct = 1;
        goto over;
    }
    t_issue = now_ns();
    if (!(attribution = TS(ts)->serve))
        goto over;
    Py_INCREF(attribution);
    if ((truth = attribution == Py_None ? 0 : PyObject_IsTrue(attribution)) < 0)
        goto over;
    if (!truth) {
        Py_DECREF(attribution);
        if (!(attribution = PyObject_CallOneArg(self->current, ts)))
            goto over;
    }
    if (!(key = build_key(self, args, nargs, kwnames, attribution)))
        goto over;
    if (!(cache = TS(ts)->static_) || !PyDict_Check(cache)) {
        cache = NULL;
        goto over;
    }
    Py_INCREF(cache);
    entry = PyDict_GetItemWithError(cache, key); /* (head, mid, counter, flags) */
    if (!entry || !PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 4)
        goto over;
    Py_INCREF(entry); /* Python code may drop it from the cache before the slot is written */
    PyObject *head = PyTuple_GET_ITEM(entry, 0), *mid = PyTuple_GET_ITEM(entry, 1);
    counter = PyTuple_GET_ITEM(entry, 2);
    if (!PyObject_TypeCheck(counter, &SeqCellsType)) {
        counter = NULL;
        goto over;
    }
    Py_INCREF(counter);
    flags = PyLong_AsLong(PyTuple_GET_ITEM(entry, 3));
    if ((flags == -1 && PyErr_Occurred()) || (flags & self->python_flags))
        goto over;
    if (!PyBytes_Check(head) || PyBytes_GET_SIZE(head) != HEAD_LEN || !PyBytes_Check(mid) ||
        PyBytes_GET_SIZE(mid) != MID_LEN)
        goto over;
    if (know_recorder(self, rec) < 0)
        goto over;
    writer = self->c_writer;
    Py_INCREF(writer);
    ctx = self->c_ctx;
    Py_INCREF(ctx);
    ids = self->c_ids;
    Py_INCREF(ids);
    pending = self->c_pending;
    Py_INCREF(pending);
    Py_XINCREF(self->c_mv);
    mv = self->c_mv; /* NULL in full mode: read at each use */
    full = self->c_full;
    cap = self->c_cap;
    if (full && get_i64(writer, s_capacity, &cap) < 0) /* full mode grows the file */
        goto over;
    step = CTX(ctx)->step;
    micro = CTX(ctx)->micro_step;
    if (SEQ(counter)->anchor_next)
        goto over; /* this record reads the backend's sequence number */
    seq = SEQ(counter)->seq;
    if (!((seq + 1) & self->bseq_mask)) {
        /* every 32nd record reads it after the call, unless reading is off: Recorder.anchor for a
         * call of one backend collective on a group (p2p, whose counter has no pg, is Python's) */
        if (!(v = PyObject_GetAttr(rec, s_backend_seq)) || (truth = PyObject_IsTrue(v)) < 0)
            goto over;
        Py_CLEAR(v);
        if (truth) {
            if (self->group_item < 0 || !(v = PyObject_GetAttr(counter, s_pg)) || v == Py_None)
                goto over;
            Py_CLEAR(v);
            anchor = argument(self, self->group_item, args, nargs, kwnames);
            if (anchor == Py_None)
                anchor = PyObject_GetAttr(rec, s_default_pg);
            else
                Py_INCREF(anchor);
            if (!anchor || anchor == Py_None)
                goto over;
            if (SEQ(counter)->seq != seq)
                goto over; /* another thread took a seq while attributes were read */
        }
    }

    /* -- the record: from here on it is ours to finish (no Python code runs between reading the
     *    seq and writing it back, so two threads on one group cannot both take it) ------------ */
    SEQ(counter)->seq = seq + 1;
    if (!(v = PyIter_Next(ids)))
        goto lost;
    idx = PyLong_AsLongLong(v);
    if (idx < 0)
        goto lost;
    if (idx < cap)
        off = RING_HEADER_SIZE + idx * SLOT_SIZE;
    else if (!full)
        off = RING_HEADER_SIZE + (idx % cap) * SLOT_SIZE;
    else {
        PyObject *o = PyObject_CallMethodOneArg(writer, s_offset_of, v); /* grows the file */
        off = o ? PyLong_AsLongLong(o) : -1;
        Py_XDECREF(o);
        if (off < 0)
            goto lost;
    }
    Py_CLEAR(v);
    if (!mv && !(mv = PyObject_GetAttr(writer, s_mv)))
        goto lost;
    if (PyObject_GetBuffer(mv, &view, PyBUF_WRITABLE) < 0)
        goto lost;
    if (off + SLOT_SIZE > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "slot beyond the ring");
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
        __atomic_thread_fence(__ATOMIC_RELEASE); /* the marker goes last: it commits the slot */
        put_i64(slot, idx + 1);
        if (!(idx & HEAD_MASK))
            put_i64((char *)view.buf + HEAD_OFFSET, idx + 1);
    }
    PyBuffer_Release(&view);
    if (full)
        Py_CLEAR(mv);
    WRITER(writer)->last_idx = idx;
    SEQ(counter)->last_idx = idx;
    REC(rec)->last_progress_ns = t_issue;
    TS(ts)->depth = 1;

    /* -- the call ---------------------------------------------------------------------------- */
    result = PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
    TS(ts)->depth = 0;
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

    /* -- the backend's seq after an anchored call: Recorder.returned -------------------------- */
    if (anchor) {
        PyObject *b = PyObject_CallMethodNoArgs(anchor, s_get_seq);
        if (b) {
            bseq = PyLong_AsLongLong(b);
            Py_DECREF(b);
        }
        if (!b || (bseq == -1 && PyErr_Occurred())) {
            bseq = -1;
            if (must_raise()) { /* KeyboardInterrupt: it wins, as in the Python wrapper */
                Py_CLEAR(result);
                goto done;
            }
            PyErr_Clear();
            if (PyObject_SetAttr(rec, s_backend_seq, Py_False) < 0) /* Recorder.returned: stop reading */
                PyErr_Clear();
        }
    }

    /* -- an async call is done when its Work is seen done: Recorder.watch, in C ------------- */
    if ((flags & FLAG_ASYNC) && result != Py_None) {
        if (bseq >= 0 && (mv || (mv = PyObject_GetAttr(writer, s_mv))) &&
            PyObject_GetBuffer(mv, &view, PyBUF_WRITABLE) == 0) { /* writer.set_backend_seq */
            char *slot = live_slot(&view, off, idx);
            if (slot)
                put_i64(slot + OFF_BSEQ, bseq);
            PyBuffer_Release(&view);
        }
        PyErr_Clear();
        if (PyList_CheckExact(result)) { /* several Works for one record: Recorder.watch counts them */
            PyObject *r = PyObject_CallMethod(rec, "watch", "LlO", (long long)idx, flags, result);
            Py_XDECREF(r);
        }
        else {
            PyObject *watched = Py_BuildValue("(LlO)", (long long)idx, flags, Py_None); /* alone */
            if (!watched || PyDict_SetItem(pending, result, watched) < 0)
                PyErr_Clear(); /* an unhashable result: its completion stays unknown, as in Python */
            Py_XDECREF(watched);
            if (PyDict_GET_SIZE(pending) > PENDING_MAX) {
                PyObject *r = PyObject_CallMethodNoArgs(rec, s_shed);
                Py_XDECREF(r);
            }
        }
        goto completed;
    }

    /* -- a blocking call is done when it returns ---------------------------------------------- */
    {
        int64_t t = now_ns();
        if (full)
            cap = 0; /* full mode: slots are never reused */
        last_idx = WRITER(writer)->last_idx;
        if (full || last_idx - idx < cap) {
            if (!mv)
                mv = PyObject_GetAttr(writer, s_mv); /* full mode may have grown the file */
            if (mv && PyObject_GetBuffer(mv, &view, PyBUF_WRITABLE) == 0) {
                if (off + SLOT_SIZE <= view.len) {
                    char *slot = (char *)view.buf + off;
                    if (bseq >= 0)
                        put_i64(slot + OFF_BSEQ, bseq);
                    put_i64(slot + OFF_T_DONE, t);
                    put_i64(slot + OFF_WAIT, t - t_issue);
                }
                PyBuffer_Release(&view);
            }
        } /* else the ring moved past this slot meanwhile: nothing to complete */
        if (!must_raise())
            PyErr_Clear();
        REC(rec)->last_progress_ns = t;
    }

completed:
    if (must_raise()) { /* KeyboardInterrupt and the like, raised while completing */
        Py_CLEAR(result);
        goto done;
    }
    PyErr_Clear();
    goto done;

over: /* hand the call over, untouched (after letting go of what this call held) */
    if (must_raise())
        goto done; /* result is NULL: the exception goes to the caller */
    PyErr_Clear();
    handed = 1;
    goto done;

lost: /* the record could not be written: said once by Shim.failed (which stops recording when the
       * trace cannot be written), and the call still runs */
    if (must_raise())
        goto done;
    {
        PyObject *et, *ev, *etb;
        PyErr_Fetch(&et, &ev, &etb);
        PyErr_NormalizeException(&et, &ev, &etb);
        if (!ev)
            ev = PyObject_CallFunction(PyExc_RuntimeError, "s", "the slot could not be written");
        PyObject *r = ev ? PyObject_CallMethod(self->shim, "failed", "OsO", rec, "recording (C fast path) failed", ev)
                         : NULL;
        Py_XDECREF(r);
        Py_XDECREF(et);
        Py_XDECREF(ev);
        Py_XDECREF(etb);
        PyErr_Clear();
    }
    Py_CLEAR(v);
    result = PyObject_Vectorcall(self->orig, args, nargsf, kwnames);

done:
    Py_XDECREF(anchor);
    Py_XDECREF(rec);
    Py_XDECREF(ts);
    Py_XDECREF(attribution);
    Py_XDECREF(key);
    Py_XDECREF(cache);
    Py_XDECREF(entry);
    Py_XDECREF(counter);
    Py_XDECREF(writer);
    Py_XDECREF(ctx);
    Py_XDECREF(ids);
    Py_XDECREF(mv);
    Py_XDECREF(pending);
    Py_XDECREF(v);
    if (handed)
        return direct ? PyObject_Vectorcall(self->orig, args, nargsf, kwnames) : hand_over(self, args, nargsf, kwnames);
    return result;
}

static PyObject *
traced_tp_call(Traced *self, PyObject *args, PyObject *kwargs)
{
    return PyVectorcall_Call((PyObject *)self, args, kwargs);
}

/* Traced(orig, slow, shim, threads, current, plan, python_flags, bseq_mask) */
static PyObject *
traced_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *orig, *slow, *shim, *threads, *current, *plan;
    long python_flags, bseq_mask;
    if (!PyArg_ParseTuple(args, "OOOO!OO!ll", &orig, &slow, &shim, &PyDict_Type, &threads, &current,
                          &PyTuple_Type, &plan, &python_flags, &bseq_mask))
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
    self->python_flags = python_flags;
    self->bseq_mask = bseq_mask;
    self->group_item = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        int what;
        Py_ssize_t pos;
        PyObject *var, *kw, *dflt;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(items, i), "iOnUO", &what, &var, &pos, &kw, &dflt)) {
            Py_DECREF(self);
            return NULL;
        }
        if (what < KEY_VALUE || what > KEY_DTYPE || pos < 0) {
            Py_DECREF(self);
            PyErr_SetString(PyExc_ValueError, "a key item is (0|1|2, name, position >= 0, keyword, default)");
            return NULL;
        }
        self->what[i] = what;
        self->pos[i] = pos;
        if (what == KEY_VALUE && PyUnicode_Check(var) && PyUnicode_CompareWithASCIIString(var, "group") == 0)
            self->group_item = i;
        Py_INCREF(kw);
        PyUnicode_InternInPlace(&kw);
        if (!PyUnicode_CHECK_INTERNED(kw)) { /* argument() matches interned names by identity */
            Py_DECREF(kw);
            Py_DECREF(self);
            PyErr_SetString(PyExc_ValueError, "a keyword could not be interned");
            return NULL;
        }
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
    Py_VISIT(self->plan);
    Py_VISIT(self->key_id);
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
    if (self->weakrefs)
        PyObject_ClearWeakRefs((PyObject *)self);
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

/* like a function: bound when it is a class attribute (and, as Py_TPFLAGS_METHOD_DESCRIPTOR says,
 * called with the instance first when called through one, without a bound method made) */
static PyObject *
traced_descr_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, obj);
}

/* copy, deepcopy and pickle see the wrapper as what it stands for: the module attribute it
 * replaced (found again by __module__ and __qualname__, as a function is) */
static PyObject *
traced_reduce(PyObject *self, PyObject *unused)
{
    return PyObject_GetAttrString(self, "__qualname__");
}

static PyMethodDef traced_methods[] = {
    {"__reduce__", traced_reduce, METH_NOARGS, NULL},
    {NULL},
};

static PyGetSetDef traced_getset[] = {
    {"plan", (getter)traced_get_plan, NULL, "how the key of a call is built (ops.key_plan)", NULL},
    {"slow", (getter)traced_get_slow, NULL, "the Python wrapper this one hands calls over to", NULL},
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL},
};

static PyTypeObject TracedType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "colltrace.record._fastpath.Traced",
    .tp_basicsize = sizeof(Traced),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_vectorcall_offset = offsetof(Traced, vectorcall),
    .tp_call = (ternaryfunc)traced_tp_call,
    .tp_new = traced_new,
    .tp_traverse = (traverseproc)traced_traverse,
    .tp_clear = (inquiry)traced_clear,
    .tp_dealloc = (destructor)traced_dealloc,
    .tp_getset = traced_getset,
    .tp_dictoffset = offsetof(Traced, dict),
    .tp_weaklistoffset = offsetof(Traced, weakrefs),
    .tp_descr_get = traced_descr_get,
    .tp_methods = traced_methods,
    .tp_doc = "The traced wrapper of one torch.distributed function (the C fast path).",
};

/* -- Work.wait ----------------------------------------------------------------------------------
 * Waiter(orig, slow, shim): Work.wait, traced. A Work the recorder watches alone (its pending
 * entry is (idx, flags, None)) is completed here: the time blocked in wait() and the done time go
 * into its slot, if the ring has not moved past it. Everything else (no recorder, a Work not
 * watched, several Works of one record, wait(timeout) that timed out, an error, full mode) goes to
 * the Python wrapper `slow`, or straight to the original when nothing is watched. */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *orig, *slow, *shim;
    PyObject *dict;
    PyObject *weakrefs;
} Waiter;

static PyObject *
waiter_call(Waiter *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *rec = NULL, *pending = NULL, *entry = NULL, *writer = NULL, *mv = NULL, *v = NULL;
    PyObject *result = NULL;
    int handed = 0, plain = 0, truth;
    int64_t idx, cap, t0, t1;
    long flags;
    Py_buffer view;

    if (!self->orig || !self->slow || !self->shim)
        return PyErr_Format(PyExc_RuntimeError, "colltrace: traced wait used after it was cleared");
    if (nargs < 1)
        goto over;
    rec = PyObject_GetAttr(self->shim, s_recorder);
    if (!rec || rec == Py_None) {
        plain = 1;
        goto over;
    }
    if (!PyObject_TypeCheck(rec, &RecorderCellsType) || !(pending = PyObject_GetAttr(rec, s_pending)) ||
        !PyDict_Check(pending))
        goto over;
    if (PyDict_GET_SIZE(pending) == 0) {
        plain = 1;
        goto over;
    }
    entry = PyDict_GetItemWithError(pending, args[0]); /* borrowed */
    if (!entry) {
        plain = !PyErr_Occurred();
        goto over;
    }
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 3 || PyTuple_GET_ITEM(entry, 2) != Py_None)
        goto over; /* several Works for one record: the Python wrapper counts them */
    Py_INCREF(entry);
    idx = PyLong_AsLongLong(PyTuple_GET_ITEM(entry, 0));
    flags = PyLong_AsLong(PyTuple_GET_ITEM(entry, 1));
    if (PyErr_Occurred() || idx < 0 || (flags & FLAG_DEVICE))
        goto over; /* on the device, wait() returning does not mean done: the Python wrapper asks */
    if (!(writer = PyObject_GetAttr(rec, s_writer)) || !(v = PyObject_GetAttr(writer, s_full)) ||
        (truth = PyObject_IsTrue(v)) != 0)
        goto over; /* full mode: the Python wrapper */
    Py_CLEAR(v);
    if (get_i64(writer, s_capacity, &cap) < 0 || cap <= 0 || !(mv = PyObject_GetAttr(writer, s_mv)))
        goto over;
    if (PyDict_DelItem(pending, args[0]) < 0) /* ours now: the watchdog's poll will not see it */
        goto over;

    t0 = now_ns();
    result = PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
    t1 = now_ns();
    if (!result || result == Py_False) { /* raised, or wait(timeout) gave up: Recorder.waited */
        PyObject *et, *ev, *etb;
        PyErr_Fetch(&et, &ev, &etb);
        if (!result || PyDict_SetItem(pending, args[0], entry) == 0) {
            PyObject *r = PyObject_CallMethod(rec, "waited", "OLLOO", entry, (long long)t0, (long long)t1, Py_False,
                                              result ? Py_False : Py_True);
            Py_XDECREF(r);
        }
        if (must_raise()) { /* KeyboardInterrupt while recording: it wins */
            Py_XDECREF(et);
            Py_XDECREF(ev);
            Py_XDECREF(etb);
            Py_CLEAR(result);
            goto done;
        }
        PyErr_Clear();
        PyErr_Restore(et, ev, etb);
        goto done;
    }
    if (PyObject_GetBuffer(mv, &view, PyBUF_WRITABLE) == 0) {
        char *slot = live_slot(&view, RING_HEADER_SIZE + (idx % cap) * SLOT_SIZE, idx);
        if (slot) {
            int64_t wait;
            memcpy(&wait, slot + OFF_WAIT, 8);
            put_i64(slot + OFF_WAIT, wait + (t1 - t0));
            put_i64(slot + OFF_T_DONE, t1);
            slot[OFF_FLAGS] = (char)((flags | FLAG_DONE) & 0xff);
        }
        PyBuffer_Release(&view);
    }
    else
        PyErr_Clear(); /* the slot is left as it was; the wait returned all the same */
    REC(rec)->last_progress_ns = t1;
    goto done;

over:
    if (must_raise())
        goto done;
    PyErr_Clear();
    handed = 1;

done:
    Py_XDECREF(rec);
    Py_XDECREF(pending);
    Py_XDECREF(entry);
    Py_XDECREF(writer);
    Py_XDECREF(mv);
    Py_XDECREF(v);
    if (handed)
        return PyObject_Vectorcall(plain ? self->orig : self->slow, args, nargsf, kwnames);
    return result;
}

static PyObject *
waiter_tp_call(Waiter *self, PyObject *args, PyObject *kwargs)
{
    return PyVectorcall_Call((PyObject *)self, args, kwargs);
}

static PyObject *
waiter_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *orig, *slow, *shim;
    if (!PyArg_ParseTuple(args, "OOO", &orig, &slow, &shim))
        return NULL;
    Waiter *self = (Waiter *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->vectorcall = (vectorcallfunc)waiter_call;
    Py_INCREF(orig);
    self->orig = orig;
    Py_INCREF(slow);
    self->slow = slow;
    Py_INCREF(shim);
    self->shim = shim;
    return (PyObject *)self;
}

static int
waiter_traverse(Waiter *self, visitproc visit, void *arg)
{
    Py_VISIT(self->orig);
    Py_VISIT(self->slow);
    Py_VISIT(self->shim);
    Py_VISIT(self->dict);
    return 0;
}

static int
waiter_clear(Waiter *self)
{
    Py_CLEAR(self->orig);
    Py_CLEAR(self->slow);
    Py_CLEAR(self->shim);
    Py_CLEAR(self->dict);
    return 0;
}

static void
waiter_dealloc(Waiter *self)
{
    PyObject_GC_UnTrack(self);
    if (self->weakrefs)
        PyObject_ClearWeakRefs((PyObject *)self);
    waiter_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
waiter_get_slow(Waiter *self, void *closure)
{
    Py_INCREF(self->slow);
    return self->slow;
}

static PyGetSetDef waiter_getset[] = {
    {"slow", (getter)waiter_get_slow, NULL, "the Python wrapper this one hands calls over to", NULL},
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL},
};

static PyTypeObject WaiterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "colltrace.record._fastpath.Waiter",
    .tp_basicsize = sizeof(Waiter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_vectorcall_offset = offsetof(Waiter, vectorcall),
    .tp_call = (ternaryfunc)waiter_tp_call,
    .tp_new = waiter_new,
    .tp_traverse = (traverseproc)waiter_traverse,
    .tp_clear = (inquiry)waiter_clear,
    .tp_dealloc = (destructor)waiter_dealloc,
    .tp_getset = waiter_getset,
    .tp_dictoffset = offsetof(Waiter, dict),
    .tp_weaklistoffset = offsetof(Waiter, weakrefs),
    .tp_descr_get = traced_descr_get,
    .tp_doc = "Work.wait, traced (the C fast path).",
};

/* -- serving scope -------------------------------------------------------------------------------
 * Serving(orig, decide, threads, state, index, prefetch, on_error): a framework's own method (FSDP's unshard,
 * post_backward, prefetch), run with this thread's ThreadState telling the collectives it issues
 * what they serve. With prefetch false: ts.serve = decide(ts, args[index]) for the duration of the
 * call (None: left as it is). With prefetch true: ts.prefetch is set instead, decide is not called.
 * colltrace/record/adapter.py has its Python twin; the decisions stay in Python, this only spares
 * the Python wrapper's call layer (an FSDP2 step runs it a few dozen times). An error inside the
 * decision leaves the scope as it is and goes to on_error(exc) (None: dropped); the method always
 * runs. */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *orig, *decide, *threads, *state, *on_error;
    Py_ssize_t index;
    int prefetch;
    PyObject *dict;
    PyObject *weakrefs;
} Serving;

/* the decision raised: on_error(exc) hears of it (an error of its own is dropped) */
static void
serving_error(Serving *self)
{
    if (!PyErr_Occurred() || must_raise() || !self->on_error || self->on_error == Py_None) {
        if (!must_raise())
            PyErr_Clear();
        return;
    }
    PyObject *et, *ev, *etb;
    PyErr_Fetch(&et, &ev, &etb);
    PyErr_NormalizeException(&et, &ev, &etb);
    if (ev && etb)
        PyException_SetTraceback(ev, etb);
    if (ev) {
        PyObject *r = PyObject_CallOneArg(self->on_error, ev);
        Py_XDECREF(r);
    }
    Py_XDECREF(et);
    Py_XDECREF(ev);
    Py_XDECREF(etb);
    if (!must_raise())
        PyErr_Clear();
}

/* this thread's ThreadState (new ref), made by state() the first time; NULL with an exception */
static PyObject *
thread_state(PyObject *threads, PyObject *state)
{
    PyObject *ident = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
    if (!ident)
        return NULL;
    PyObject *ts = PyDict_GetItemWithError(threads, ident); /* borrowed */
    Py_DECREF(ident);
    if (ts)
        Py_INCREF(ts);
    else if (PyErr_Occurred() || !(ts = PyObject_CallNoArgs(state)))
        return NULL;
    if (!PyObject_TypeCheck(ts, &ThreadCellsType)) {
        Py_DECREF(ts);
        PyErr_SetString(PyExc_TypeError, "the thread state is not a ThreadCells");
        return NULL;
    }
    return ts;
}

static PyObject *
serving_call(Serving *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *ts, *value, *old, *result;
    if (!self->orig || !self->decide || !self->threads || !self->state)
        return PyErr_Format(PyExc_RuntimeError, "colltrace: serving wrapper used after it was cleared");
    if (!(ts = thread_state(self->threads, self->state))) {
        serving_error(self);
        goto plain;
    }
    if (self->prefetch) {
        char was = TS(ts)->prefetch;
        TS(ts)->prefetch = 1;
        result = PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
        TS(ts)->prefetch = was;
        Py_DECREF(ts);
        return result;
    }
    if (nargs <= self->index) {
        Py_DECREF(ts);
        goto plain;
    }
    {
        PyObject *pair[2] = {ts, args[self->index]};
        value = PyObject_Vectorcall(self->decide, pair, 2, NULL);
    }
    if (!value || value == Py_None) {
        if (!value)
            serving_error(self);
        Py_XDECREF(value);
        Py_DECREF(ts);
        goto plain;
    }
    old = TS(ts)->serve; /* its reference is ours until it is put back */
    TS(ts)->serve = value;
    result = PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
    value = TS(ts)->serve; /* what the method leaves (nested scopes put theirs back) */
    TS(ts)->serve = old;
    Py_XDECREF(value);
    Py_DECREF(ts);
    return result;

plain:
    if (must_raise())
        return NULL;
    PyErr_Clear();
    return PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
}

static PyObject *
serving_tp_call(Serving *self, PyObject *args, PyObject *kwargs)
{
    return PyVectorcall_Call((PyObject *)self, args, kwargs);
}

static PyObject *
serving_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *orig, *decide, *threads, *state, *on_error = Py_None;
    Py_ssize_t index;
    int prefetch;
    if (!PyArg_ParseTuple(args, "OOO!Onp|O", &orig, &decide, &PyDict_Type, &threads, &state, &index, &prefetch,
                          &on_error))
        return NULL;
    if (index < 0) {
        PyErr_SetString(PyExc_ValueError, "index must be >= 0");
        return NULL;
    }
    Serving *self = (Serving *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->vectorcall = (vectorcallfunc)serving_call;
    Py_INCREF(orig);
    self->orig = orig;
    Py_INCREF(decide);
    self->decide = decide;
    Py_INCREF(threads);
    self->threads = threads;
    Py_INCREF(state);
    self->state = state;
    Py_INCREF(on_error);
    self->on_error = on_error;
    self->index = index;
    self->prefetch = prefetch;
    return (PyObject *)self;
}

static int
serving_traverse(Serving *self, visitproc visit, void *arg)
{
    Py_VISIT(self->orig);
    Py_VISIT(self->decide);
    Py_VISIT(self->threads);
    Py_VISIT(self->state);
    Py_VISIT(self->on_error);
    Py_VISIT(self->dict);
    return 0;
}

static int
serving_clear(Serving *self)
{
    Py_CLEAR(self->orig);
    Py_CLEAR(self->decide);
    Py_CLEAR(self->threads);
    Py_CLEAR(self->state);
    Py_CLEAR(self->on_error);
    Py_CLEAR(self->dict);
    return 0;
}

static void
serving_dealloc(Serving *self)
{
    PyObject_GC_UnTrack(self);
    if (self->weakrefs)
        PyObject_ClearWeakRefs((PyObject *)self);
    serving_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
serving_get_decide(Serving *self, void *closure)
{
    Py_INCREF(self->decide);
    return self->decide;
}

static PyGetSetDef serving_getset[] = {
    {"decide", (getter)serving_get_decide, NULL, "decide(ts, arg): the serving scope of a call, or None", NULL},
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL},
};

static PyTypeObject ServingType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "colltrace.record._fastpath.Serving",
    .tp_basicsize = sizeof(Serving),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_vectorcall_offset = offsetof(Serving, vectorcall),
    .tp_call = (ternaryfunc)serving_tp_call,
    .tp_new = serving_new,
    .tp_traverse = (traverseproc)serving_traverse,
    .tp_clear = (inquiry)serving_clear,
    .tp_dealloc = (destructor)serving_dealloc,
    .tp_getset = serving_getset,
    .tp_dictoffset = offsetof(Serving, dict),
    .tp_weaklistoffset = offsetof(Serving, weakrefs),
    .tp_descr_get = traced_descr_get,
    .tp_methods = traced_methods,
    .tp_doc = "A framework method run with the thread's serving scope set (the C fast path; adapter.py).",
};

#ifdef COLLTRACE_FRAMES
/* frame_self(wrapped, call_impl, outermost): the `self` of the innermost (or outermost) frame on
 * this thread's stack running either code object (nn.Module.__call__ and Module._call_impl), or
 * None. The twin of context._frame_self; no frame object is made and no locals dict is built. */
static PyObject *
frame_self(PyObject *unused, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyCode_Check(args[0]) || !PyCode_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "frame_self(wrapped: code, call_impl: code, outermost: bool)");
        return NULL;
    }
    PyCodeObject *wrapped = (PyCodeObject *)args[0], *call_impl = (PyCodeObject *)args[1];
    int outermost = PyObject_IsTrue(args[2]);
    if (outermost < 0)
        return NULL;
    PyObject *found = NULL;
    for (_PyInterpreterFrame *f = PyThreadState_Get()->cframe->current_frame; f; f = f->previous) {
        if ((f->f_code != wrapped && f->f_code != call_impl) || _PyFrame_IsIncomplete(f))
            continue;
        if (f->f_code->co_argcount < 1)
            continue;
        PyObject *self = f->localsplus[0];
        if (self && PyCell_Check(self)) /* a closure captures self (_call_impl's hooks) */
            self = PyCell_GET(self);
        if (!self)
            continue;
        found = self;
        if (!outermost)
            break;
    }
    if (!found)
        Py_RETURN_NONE;
    Py_INCREF(found);
    return found;
}
#endif

static PyMethodDef module_methods[] = {
#ifdef COLLTRACE_FRAMES
    {"frame_self", (PyCFunction)(void (*)(void))frame_self, METH_FASTCALL,
     "frame_self(wrapped, call_impl, outermost): the self of the innermost (outermost) module call running"},
#endif
    {NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastpath", "colltrace's C fast path for repeated collective calls.", -1, module_methods,
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
    INTERN(s_backend_seq, "backend_seq");
    INTERN(s_writer, "writer");
    INTERN(s_counter, "counter");
    INTERN(s_capacity, "capacity");
    INTERN(s_full, "full");
    INTERN(s_mv, "mv");
    INTERN(s_ctx, "ctx");
    INTERN(s_shape, "shape");
    INTERN(s_dtype, "dtype");
    INTERN(s_offset_of, "offset_of");
    INTERN(s_pg, "pg");
    INTERN(s_default_pg, "default_pg");
    INTERN(s_get_seq, "_get_sequence_number_for_group");
    if (PyType_Ready(&TracedType) < 0 || PyType_Ready(&WaiterType) < 0 || PyType_Ready(&ServingType) < 0 || PyType_Ready(&SeqCellsType) < 0 ||
        PyType_Ready(&ContextCellsType) < 0 || PyType_Ready(&ThreadCellsType) < 0 ||
        PyType_Ready(&WriterCellsType) < 0 || PyType_Ready(&RecorderCellsType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    PyTypeObject *cells[] = {&SeqCellsType, &ContextCellsType, &ThreadCellsType, &WriterCellsType, &RecorderCellsType};
    for (size_t i = 0; i < sizeof(cells) / sizeof(cells[0]); i++) {
        Py_INCREF(cells[i]);
        if (PyModule_AddObject(m, strrchr(cells[i]->tp_name, '.') + 1, (PyObject *)cells[i]) < 0) {
            Py_DECREF(cells[i]);
            Py_DECREF(m);
            return NULL;
        }
    }
    Py_INCREF(&TracedType);
    if (PyModule_AddObject(m, "Traced", (PyObject *)&TracedType) < 0) {
        Py_DECREF(&TracedType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&WaiterType);
    if (PyModule_AddObject(m, "Waiter", (PyObject *)&WaiterType) < 0) {
        Py_DECREF(&WaiterType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&ServingType);
    if (PyModule_AddObject(m, "Serving", (PyObject *)&ServingType) < 0) {
        Py_DECREF(&ServingType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "SLOT_SIZE", SLOT_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "OFF_FLAGS", OFF_FLAGS) < 0 || PyModule_AddIntConstant(m, "FLAG_DONE", FLAG_DONE) < 0 ||
        PyModule_AddIntConstant(m, "FLAG_DEVICE", FLAG_DEVICE) < 0 ||
        PyModule_AddIntConstant(m, "RING_HEADER_SIZE", RING_HEADER_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "OFF_T_DONE", OFF_T_DONE) < 0 ||
        PyModule_AddIntConstant(m, "OFF_WAIT", OFF_WAIT) < 0 ||
        PyModule_AddIntConstant(m, "OFF_T_ISSUE", OFF_T_ISSUE) < 0 ||
        PyModule_AddIntConstant(m, "OFF_SEQ", OFF_SEQ) < 0 || PyModule_AddIntConstant(m, "OFF_BSEQ", OFF_BSEQ) < 0 || PyModule_AddIntConstant(m, "OFF_STEP", OFF_STEP) < 0 ||
        PyModule_AddIntConstant(m, "HEAD_OFFSET", HEAD_OFFSET) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
