/* The recorder's hot path in C: the common call of a wrapped collective, recorded without a single
 * Python frame.
 *
 * Why: in Python the wrapper, its `begin` and `finish` cost ~4 us of interpretation per call, and
 * after a real collective (a hand-off to the backend's thread and back) ~8 us, against PyTorch's
 * own C++ recorder at ~2 us. This file does exactly what `patching._leaf_wrapper` and
 * `Recorder.compile`'s `begin`/`finish` do for the common case, writing the same Entry,
 * GroupState and ThreadState slots (found by their member descriptors, so the Python classes stay
 * the single definition of the layout). Device ops (NCCL, HCCL: `patching._call_on_device`) are
 * handled too: forced async, the Work followed and polled, calling into Python only for the device
 * events (`DeviceTiming.before` / `waited`). Any call it does not handle (CPU tensors of a group whose
 * Works complete after their wait, a batch or coalescing block, a group seen for the first time, a
 * C++-issued op to record, a receive from any source, a value it cannot read) goes to the Python
 * wrapper, the reference, before anything is changed; per-entry stacks are never handled here. The
 * module is optional: without a compiler the package is pure Python and records the same entries.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <structmember.h>
#include <time.h>

#if PY_VERSION_HEX >= 0x030B0000 /* PyFrame_GetLasti */
#define FASTPATH_SUPPORTED 1
#else
#define FASTPATH_SUPPORTED 0 /* builds, but every call takes the Python wrapper */
static int PyFrame_GetLasti(PyFrameObject *frame) { return -1; }
#endif

#define NPARAMS 7 /* group, inputs, outputs, async_op, reduce_op, endpoint (global), endpoint (group rank) */

/* ------------------------------------------------------------------ slot layout */

/* Entry's storage (`EntryBase`; flightrec/record/entry.py's `Entry` subclasses it and adds the behaviour): the
 * numbers an op changes on every call are C integers written in place, the rest object references.
 * Why: as Python slots each number was a new int object per op, freeing the one it replaced, and
 * after a collective (a switch to the backend's thread and back: caches cold) that churn was most of
 * what recording an op cost. */
#define NO_TIME LLONG_MIN /* an optional time not known: None in Python */

typedef struct {
    PyObject_HEAD
    long long id, seq, pg_seq, peer, root, unit, t_enqueue_ns, t_complete_ns, t_dev_start_ns, t_dev_end_ns;
    long long timed_start, timed_end; /* the ids of the ops whose start / end `events` hold (device_timing.py) */
    char is_async;
    char state; /* an index into STATE_NAMES (entry.STATES), read and written as its name */
    PyObject *group, *kind, *op, *api, *reduce_op, *inputs, *outputs, *error, *thread, *site, *stack,
        *source, *work, *device, *events;
} EntryObject;

#define ENTRY_OBJECTS(X) X(group) X(kind) X(op) X(api) X(reduce_op) X(inputs) X(outputs) X(error) \
    X(thread) X(site) X(stack) X(source) X(work) X(device) X(events)

/* flightrec/record/entry.py's STATES (tests/recorder/test_recorder_units.py checks they are the same) */
enum { ENQUEUED, STARTED, COMPLETED, FAILED, UNKNOWN, N_STATES };
static const char *STATE_TEXT[N_STATES] = {"enqueued", "started", "completed", "failed", "unknown"};
static PyObject *STATE_NAMES[N_STATES]; /* interned */
#define EN(obj) ((EntryObject *)(obj))
#define E_(field) offsetof(EntryObject, field)

/* A storage type's object fields: all None when made, visited and cleared for the garbage collector. */
#define STORAGE_FUNCTIONS(prefix, Type, OBJECTS)                          \
    static Type *prefix##_alloc(PyTypeObject *type)                      \
    {                                                                    \
        Type *self = (Type *)type->tp_alloc(type, 0);                    \
        if (self == NULL) return NULL;                                   \
        OBJECTS(STORAGE_NONE)                                            \
        return self;                                                     \
    }                                                                    \
    static int prefix##_traverse(Type *self, visitproc visit, void *arg) \
    {                                                                    \
        OBJECTS(STORAGE_VISIT)                                           \
        return 0;                                                        \
    }                                                                    \
    static int prefix##_clear(Type *self)                                \
    {                                                                    \
        OBJECTS(STORAGE_CLEAR)                                           \
        return 0;                                                        \
    }                                                                    \
    static void prefix##_dealloc(Type *self)                             \
    {                                                                    \
        PyObject_GC_UnTrack(self);                                       \
        prefix##_clear(self);                                            \
        Py_TYPE(self)->tp_free((PyObject *)self);                        \
    }
#define STORAGE_TYPE(var, prefix, Type, name, getset, methods, doc)                  \
    static PyTypeObject var = {                                           \
        PyVarObject_HEAD_INIT(NULL, 0)                                    \
        .tp_name = "flightrec.record._fastpath." name,                           \
        .tp_basicsize = sizeof(Type),                                     \
        .tp_dealloc = (destructor)prefix##_dealloc,                       \
        .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, \
        .tp_doc = doc,                                                    \
        .tp_traverse = (traverseproc)prefix##_traverse,                   \
        .tp_clear = (inquiry)prefix##_clear,                              \
        .tp_members = prefix##_members,                                   \
        .tp_getset = getset,                                              \
        .tp_methods = methods,                                            \
        .tp_new = prefix##_new,                                           \
    };
#define STORAGE_NONE(field) Py_INCREF(Py_None); self->field = Py_None;
#define STORAGE_VISIT(field) Py_VISIT(self->field);
#define STORAGE_CLEAR(field) Py_CLEAR(self->field);

STORAGE_FUNCTIONS(entry, EntryObject, ENTRY_OBJECTS)

static PyObject *entry_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    EntryObject *self = entry_alloc(type);
    if (self == NULL) return NULL;
    self->id = self->seq = self->pg_seq = self->peer = self->root = self->unit = -1;
    self->timed_start = self->timed_end = -1;
    self->t_enqueue_ns = 0;
    self->t_complete_ns = self->t_dev_start_ns = self->t_dev_end_ns = NO_TIME;
    self->state = STARTED;
    return (PyObject *)self;
}

/* t_complete_ns, t_dev_start_ns, t_dev_end_ns: an int, or None while not known */
static PyObject *entry_get_time(EntryObject *self, void *offset)
{
    long long value = *(long long *)((char *)self + (Py_ssize_t)offset);
    if (value == NO_TIME) Py_RETURN_NONE;
    return PyLong_FromLongLong(value);
}

static int entry_set_time(EntryObject *self, PyObject *value, void *offset)
{
    long long v = NO_TIME;
    if (value != NULL && value != Py_None) {
        v = PyLong_AsLongLong(value);
        if (v == -1 && PyErr_Occurred()) return -1;
        if (v == NO_TIME) {
            PyErr_SetString(PyExc_OverflowError, "time out of range");
            return -1;
        }
    }
    *(long long *)((char *)self + (Py_ssize_t)offset) = v;
    return 0;
}

#define INT_MEMBER(field) {#field, T_LONGLONG, E_(field), 0, NULL},
#define OBJECT_MEMBER(field) {#field, T_OBJECT, E_(field), 0, NULL},
static PyMemberDef entry_members[] = {
    INT_MEMBER(id) INT_MEMBER(seq) INT_MEMBER(pg_seq) INT_MEMBER(peer) INT_MEMBER(root) INT_MEMBER(unit)
    INT_MEMBER(t_enqueue_ns) INT_MEMBER(timed_start) INT_MEMBER(timed_end)
    {"is_async", T_BOOL, E_(is_async), 0, NULL},
    ENTRY_OBJECTS(OBJECT_MEMBER)
    {NULL},
};
#undef INT_MEMBER
#undef OBJECT_MEMBER

/* state: one of entry.STATES, kept as its index so that the hot path changes it with a byte store */
static PyObject *entry_get_state(EntryObject *self, void *closure)
{
    PyObject *name = STATE_NAMES[(int)self->state];
    Py_INCREF(name);
    return name;
}

static int entry_set_state(EntryObject *self, PyObject *value, void *closure)
{
    for (int i = 0; value != NULL && PyUnicode_Check(value) && i < N_STATES; i++) {
        if (value == STATE_NAMES[i] || PyUnicode_Compare(value, STATE_NAMES[i]) == 0) {
            self->state = (char)i;
            return 0;
        }
    }
    PyErr_Format(PyExc_ValueError, "an entry's state is one of enqueued, started, completed, failed, unknown; not %R",
                 value);
    return -1;
}

#define TIME_GETSET(field) {#field, (getter)entry_get_time, (setter)entry_set_time, NULL, (void *)E_(field)},
static PyGetSetDef entry_getset[] = {
    TIME_GETSET(t_complete_ns) TIME_GETSET(t_dev_start_ns) TIME_GETSET(t_dev_end_ns)
    {"state", (getter)entry_get_state, (setter)entry_set_state, NULL, NULL},
    {NULL},
};
#undef TIME_GETSET

STORAGE_TYPE(EntryBaseType, entry, EntryObject, "EntryBase", entry_getset, NULL,
             "The fields of a recorded op (flightrec.record.entry.Entry), numbers stored as C integers.")

/* The ring's id counter (Ring.next_id): itertools.count's behaviour, with the count readable from C,
 * so the hot path takes an id without making an int object. */
typedef struct {
    PyObject_HEAD
    long long next;
} Counter;

static PyObject *counter_next(Counter *self)
{
    return PyLong_FromLongLong(self->next++);
}

static PyObject *counter_iter(PyObject *self)
{
    Py_INCREF(self);
    return self;
}

static PyMemberDef counter_members[] = {
    {"next", T_LONGLONG, offsetof(Counter, next), READONLY, "the id the next call hands out"},
    {NULL},
};

static PyTypeObject CounterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "flightrec.record._fastpath.Counter",
    .tp_basicsize = sizeof(Counter),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Counter(): 0, 1, 2, ... like itertools.count(), readable by the C hot path.",
    .tp_iter = counter_iter,
    .tp_iternext = (iternextfunc)counter_next,
    .tp_members = counter_members,
    .tp_new = PyType_GenericNew,
};

/* The latest async op of the C hot path whose Work nobody waited on yet (Recorder.async_slot): its
 * Work and Entry, or None and None. Most code waits on an async op before issuing the next, so the
 * Work.wait wrapper finds it here with a pointer compare; when the slot is taken, an op goes to
 * Recorder.by_work (a dict by id(Work), an int made and freed per op, and a dict's insert, lookup
 * and removal). The recorder's Python side reads both (in_flight, poll_works, the Python wait). */
typedef struct {
    PyObject_HEAD
    PyObject *work, *entry;
} AsyncSlot;

#define SLOT_OBJECTS(X) X(work) X(entry)
STORAGE_FUNCTIONS(async_slot, AsyncSlot, SLOT_OBJECTS)

static PyObject *async_slot_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    return (PyObject *)async_slot_alloc(type);
}

/* Empties the slot: both fields in one step, so that no other thread sees it half emptied (the C
 * hot path would fill a slot whose work is None, and the second half of a Python `slot.work =
 * slot.entry = None` would then drop the new entry). */
static void slot_empty(AsyncSlot *self)
{
    PyObject *work = self->work, *entry = self->entry;
    Py_INCREF(Py_None);
    Py_INCREF(Py_None);
    self->work = self->entry = Py_None;
    Py_XDECREF(work);
    Py_XDECREF(entry);
}

static PyObject *async_slot_release(AsyncSlot *self, PyObject *entry)
{
    if (self->entry != entry) Py_RETURN_FALSE;
    slot_empty(self);
    Py_RETURN_TRUE;
}

static PyMethodDef async_slot_methods[] = {
    {"release", (PyCFunction)async_slot_release, METH_O, "release(entry): empty the slot if it holds entry"},
    {NULL},
};

static PyMemberDef async_slot_members[] = {
    {"work", T_OBJECT, offsetof(AsyncSlot, work), 0, "the Work, or None"},
    {"entry", T_OBJECT, offsetof(AsyncSlot, entry), 0, "its Entry, or None"},
    {NULL},
};

STORAGE_TYPE(AsyncSlotType, async_slot, AsyncSlot, "AsyncSlot", NULL, async_slot_methods,
             "AsyncSlot(): the latest async op of the C hot path not waited on yet (work, entry).")


/* GroupState's storage (`GroupBase`; flightrec/record/groups.py's `GroupState` subclasses it): its counters
 * are C integers, for the same reason as Entry's. */
typedef struct {
    PyObject_HEAD
    long long coll_seq, last_pg_seq, busy;
    long long steps_gen; /* bumped by Recorder._seq_after whenever a learned step changes: Leaf's step cache */
    PyObject *pg, *name, *desc, *backend, *ranks, *rank_in_group, *sent, *received, *read_seq, *steps;
} GroupObject;

#define GROUP_OBJECTS(X) X(pg) X(name) X(desc) X(backend) X(ranks) X(rank_in_group) X(sent) X(received) \
    X(read_seq) X(steps)
#define GR(obj) ((GroupObject *)(obj))

STORAGE_FUNCTIONS(group, GroupObject, GROUP_OBJECTS)

static PyObject *group_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    return (PyObject *)group_alloc(type); /* counters 0 */
}

#define INT_MEMBER(field) {#field, T_LONGLONG, offsetof(GroupObject, field), 0, NULL},
#define OBJECT_MEMBER(field) {#field, T_OBJECT, offsetof(GroupObject, field), 0, NULL},
static PyMemberDef group_members[] = {
    INT_MEMBER(coll_seq) INT_MEMBER(last_pg_seq) INT_MEMBER(busy) INT_MEMBER(steps_gen)
    GROUP_OBJECTS(OBJECT_MEMBER)
    {NULL},
};
#undef INT_MEMBER
#undef OBJECT_MEMBER

STORAGE_TYPE(GroupBaseType, group, GroupObject, "GroupBase", NULL, NULL,
             "The fields of a process group's bookkeeping (flightrec.record.groups.GroupState), counters as C integers.")

typedef struct {
    Py_ssize_t in_leaf, api, unit, thread_name;
} ThreadLayout;

static PyTypeObject *entry_type, *group_type, *thread_type;
static ThreadLayout T;

/* constants shared by every wrapper */
static PyObject *s_active, *s_state, *s_default_pg, *s_shape, *s_dtype, *s_is_cpu;
static PyObject *s_python, *s_cpu, *s_empty;
static PyObject *s_device, *s_type, *s_device_timing, *s_before, *s_waited, *s_async_op, *s_is_cuda, *s_cuda;
static PyObject *empty_tuple;
static PyObject *s_poll_soon, *s_poll_due; /* Recorder.poll_soon (a catch-up of the polled ops) and when */
/* DeviceTiming's field read by the C copy of its hot methods (record/device_timing.py), and the event's method */
static PyObject *s_ready, *s_record;

#define SLOT(obj, offset) (*(PyObject **)((char *)(obj) + (offset)))

static inline void set_slot(PyObject *obj, Py_ssize_t offset, PyObject *value) /* borrows value */
{
    PyObject *old = SLOT(obj, offset);
    if (old == value) return; /* a reused entry mostly keeps its values: no refcount writes */
    Py_INCREF(value);
    SLOT(obj, offset) = value;
    Py_XDECREF(old);
}

static inline void set_slot_steal(PyObject *obj, Py_ssize_t offset, PyObject *value)
{
    PyObject *old = SLOT(obj, offset);
    SLOT(obj, offset) = value;
    Py_XDECREF(old);
}

static int slot_offset(PyTypeObject *type, const char *name, Py_ssize_t *out)
{
    PyObject *descr = PyDict_GetItemString(type->tp_dict, name);
    if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        PyErr_Format(PyExc_TypeError, "%s.%s is not a __slots__ member", type->tp_name, name);
        return -1;
    }
    PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
    if (member->type != T_OBJECT_EX) {
        PyErr_Format(PyExc_TypeError, "%s.%s is not an object slot", type->tp_name, name);
        return -1;
    }
    *out = member->offset;
    return 0;
}

#define OFFSET(type, layout, field) \
    if (slot_offset(type, #field, &layout.field) < 0) return NULL;

/* What flightrec/record/_torchpeek.cpp hands over, when built for the installed torch (flightrec/record/cpp_reader.py). */
typedef struct {
    int version;
    /* 1 read (*device_type: its c10::DeviceType, 0 the CPU), -1 ask Python */
    int (*tensor_meta)(PyObject *tensor, int shape_as_tuple, PyObject **out, int *device_type);
    long long (*read_seq)(PyObject *reader); /* a SeqReader's counter, or -2: not one, or it failed (call it) */
} PeekApi;

#define PEEK_API_VERSION 3

static const PeekApi *peek;

static PyObject *configure(PyObject *module, PyObject *args)
{
    PyTypeObject *entry, *group, *thread;
    PyObject *peek_capsule = Py_None;
    if (!PyArg_ParseTuple(args, "O!O!O!|O", &PyType_Type, &entry, &PyType_Type, &group, &PyType_Type, &thread,
                          &peek_capsule))
        return NULL;
    const PeekApi *peek_api = NULL;
    if (peek_capsule != Py_None) {
        peek_api = PyCapsule_GetPointer(peek_capsule, "flightrec.record._torchpeek.api");
        if (peek_api == NULL) return NULL;
        if (peek_api->version != PEEK_API_VERSION) {
            PyErr_Format(PyExc_ValueError, "flightrec.record._torchpeek API version %d, expected %d", peek_api->version,
                         PEEK_API_VERSION);
            return NULL;
        }
    }
    if (!PyType_IsSubtype(entry, &EntryBaseType) || entry->tp_basicsize != EntryBaseType.tp_basicsize) {
        PyErr_Format(PyExc_TypeError, "%s does not keep its fields in flightrec.record._fastpath.EntryBase", entry->tp_name);
        return NULL;
    }
    if (!PyType_IsSubtype(group, &GroupBaseType) || group->tp_basicsize != GroupBaseType.tp_basicsize) {
        PyErr_Format(PyExc_TypeError, "%s does not keep its fields in flightrec.record._fastpath.GroupBase", group->tp_name);
        return NULL;
    }
    OFFSET(thread, T, in_leaf) OFFSET(thread, T, api) OFFSET(thread, T, unit) OFFSET(thread, T, thread_name)
    Py_INCREF(entry); Py_XSETREF(entry_type, entry);
    Py_INCREF(group); Py_XSETREF(group_type, group);
    Py_INCREF(thread); Py_XSETREF(thread_type, thread);
    peek = peek_api; /* the capsule's module stays imported (sys.modules) for the process's life */
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ the wrapper */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *dict; /* __name__, __wrapped__, ... (functools.update_wrapper) */
    PyObject *original, *slow, *rec_dict, *local, *by_pg, *pending, *slots, *ids, *world_dict, *tensor_type;
    PyObject *by_work, *work_type, *async_slot;
    PyObject *finish, *seq_after, *record_failure, *on_finish_error, *site_cache, *frame_class;
    PyObject *async_apis, *api_name, *op_name, *kind;
    /* device ops (NCCL, HCCL): patching._call_on_device's common case */
    PyObject *stream_group_type, *polled, *wait_failed, *device_tail;
    PyObject *work_wait; /* Work.wait as flightrec found it: a blocking op's own wait needs none of its wrapper */
    PyObject *forced_from, *forced_kwnames; /* the last kwnames given and the same plus "async_op" */
    PyObject *async_fill; /* the defaults before async_op: ((default,) or None per parameter) */
    PyObject *names[NPARAMS], *defaults[NPARAMS];
    Py_ssize_t positions[NPARAMS];
    Py_ssize_t capacity, site_cache_limit, trust_after, recheck_every, async_position;
    Py_ssize_t poll_soon_at; /* Recorder.poll_soon_at: the ids between catch-ups of `polled` (poll_soon) */
    int is_coll, is_send, always_async, has_endpoint, has_async, enabled;
    /* one-entry caches for the common case of one training thread calling from one place */
    uint64_t tls_id;      /* PyThreadState_GetID of tls_state: unique per thread state, never reused */
    PyObject *tls_state;  /* that thread's ThreadState */
    PyObject *site_code;  /* the last call site: its code, offset and (code, offset) tuple */
    int site_lasti;
    PyObject *site;
    PyObject *last_pair, *last_meta; /* a lone tensor's (shape, dtype) and its 1-tuple, reused when the same */
    /* the trusted counter step of (step_group, step_api) as group.steps held it at step_gen: it saves
     * the dict, list and int reads (six cache lines, cold after the backend's thread switch) */
    PyObject *step_group, *step_api;
    long long step, step_gen;
} Leaf;

#define LEAF_OBJECTS(X) \
    X(dict) X(original) X(slow) X(rec_dict) X(local) X(by_pg) X(pending) X(slots) X(ids) X(world_dict) \
    X(tensor_type) X(by_work) X(work_type) X(async_slot) X(finish) X(seq_after) X(record_failure) X(on_finish_error) X(site_cache) \
    X(frame_class) X(async_apis) X(api_name) X(op_name) X(kind) X(stream_group_type) X(polled) X(wait_failed) \
    X(device_tail) X(work_wait) X(tls_state) X(site_code) X(site) X(last_pair) X(last_meta) X(step_group) \
    X(step_api) X(forced_from) X(forced_kwnames) X(async_fill)

static inline long long as_ll(PyObject *value, int *ok)
{
    if (value == NULL || !PyLong_CheckExact(value)) {
        *ok = 0;
        return 0;
    }
    long long v = PyLong_AsLongLong(value);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        *ok = 0;
    }
    return v;
}

static inline long long monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* the clock behind time.monotonic_ns() on Linux */
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* A new tuple of immutable values, out of the garbage collector's sight: the ring keeps it for
 * thousands of calls, long enough to be promoted, and every collection the program runs would scan
 * it for nothing. Such a tuple cannot be part of a cycle. */
static inline PyObject *untracked(PyObject *tuple)
{
    if (tuple != NULL) PyObject_GC_UnTrack(tuple);
    return tuple;
}

/* The device type of a tensor that is not on the CPU (`tensor.device.type`, interned), new ref; NULL: unreadable.
 * `is_cuda` first: `device.type` makes a device object and a string per call (~0.25 us). */
static PyObject *device_type_of(PyObject *tensor)
{
    PyObject *is_cuda = PyObject_GetAttr(tensor, s_is_cuda);
    Py_XDECREF(is_cuda);
    if (is_cuda == Py_True) {
        Py_INCREF(s_cuda);
        return s_cuda;
    }
    PyErr_Clear();
    PyObject *device = PyObject_GetAttr(tensor, s_device);
    PyObject *type = device ? PyObject_GetAttr(device, s_type) : NULL;
    Py_XDECREF(device);
    if (type != NULL && !PyUnicode_CheckExact(type)) Py_CLEAR(type);
    if (type != NULL) PyUnicode_InternInPlace(&type); /* "cuda" made once, not a new string per op */
    PyErr_Clear();
    return type;
}

/* `tensor.device.type` of the torch reader's device type `index` (c10::DeviceType), borrowed: asked of
 * torch's getters once per type (the name is theirs: "cuda", "meta", torch_npu's "npu"), then kept. */
#define DEVICE_TYPES 64
static PyObject *device_names[DEVICE_TYPES];

static PyObject *device_name(PyObject *tensor, int index)
{
    if (index <= 0 || index >= DEVICE_TYPES) return NULL;
    if (device_names[index] == NULL) device_names[index] = device_type_of(tensor); /* held for the process's life */
    return device_names[index];
}

/* (shape, dtype) of a tensor (new ref), or NULL with no error set when it is not one. The shape is
 * kept as torch.Size for a lone tensor and as a tuple for a list item, as the Python path does. A
 * tensor on a device (NCCL, HCCL) sets *device to its device type (new ref). */
static PyObject *shape_and_dtype(Leaf *self, PyObject *tensor, int shape_as_tuple, PyObject **device)
{
    PyObject *pair = NULL, *shape = NULL, *dtype = NULL;
    if (peek != NULL) {
        int device_type = -1;
        if (peek->tensor_meta(tensor, shape_as_tuple, &pair, &device_type) > 0) {
            if (device_type == 0) return pair; /* c10::DeviceType::CPU */
            PyObject *name = device_name(tensor, device_type);
            if (name != NULL) {
                Py_INCREF(name);
                *device = name;
                return pair;
            }
            Py_CLEAR(pair);
            PyErr_Clear();
            return NULL;
        }
    }
    if (!PyObject_TypeCheck(tensor, (PyTypeObject *)self->tensor_type)) return NULL;
    PyObject *is_cpu = PyObject_GetAttr(tensor, s_is_cpu);
    if (is_cpu == NULL) goto done;
    Py_DECREF(is_cpu);
    if (is_cpu == Py_False) goto on_device;
    if (is_cpu != Py_True) goto done;
    goto read;
on_device:
    if ((*device = device_type_of(tensor)) == NULL) goto done;
read:
    if ((shape = PyObject_GetAttr(tensor, s_shape)) == NULL) goto done;
    if (shape_as_tuple) Py_SETREF(shape, untracked(PySequence_Tuple(shape)));
    if (shape != NULL && (dtype = PyObject_GetAttr(tensor, s_dtype)) != NULL) pair = untracked(PyTuple_Pack(2, shape, dtype));
done:
    Py_XDECREF(shape);
    Py_XDECREF(dtype);
    if (pair == NULL && *device != NULL) Py_CLEAR(*device);
    PyErr_Clear();
    return pair;
}

/* Shape and dtype of a tensor, or of a flat list of them, as the Python path keeps them:
 * 1 = described into *out (new ref), 0 = not the common case (Python path). When the tensor (of a
 * list: its first, as `recorder._describe` looks) is not on the CPU, *device is its device type (new ref). */
static int describe(Leaf *self, PyObject *value, PyObject **out, PyObject **device)
{
    if (!PyList_CheckExact(value) && !PyTuple_CheckExact(value)) {
        PyObject *pair = shape_and_dtype(self, value, 0, device);
        if (pair != NULL && pair == self->last_pair) {
            *out = self->last_meta;
            Py_INCREF(*out);
        } else {
            *out = pair ? untracked(PyTuple_Pack(1, pair)) : NULL;
            if (*out != NULL) {
                Py_INCREF(pair);
                Py_XSETREF(self->last_pair, pair);
                Py_INCREF(*out);
                Py_XSETREF(self->last_meta, *out);
            }
        }
        Py_XDECREF(pair);
        PyErr_Clear();
        return *out != NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(value);
    PyObject **items = PySequence_Fast_ITEMS(value);
    PyObject *meta = untracked(PyTuple_New(n)); /* filled with (shape, dtype) pairs only */
    for (Py_ssize_t i = 0; meta != NULL && i < n; i++) {
        PyObject *other = NULL; /* only the first tensor's device names the op's */
        PyObject *pair = shape_and_dtype(self, items[i], 1, i == 0 ? device : &other);
        Py_XDECREF(other);
        if (pair == NULL) Py_CLEAR(meta);
        else PyTuple_SET_ITEM(meta, i, pair);
    }
    PyErr_Clear();
    *out = meta;
    return meta != NULL;
}

/* A peer or root as a global rank (patching's _endpoint): 1 = *out set, 0 = Python path. */
static int endpoint(PyObject *global_rank, PyObject *group_rank, PyObject *group, int is_root, long long *out)
{
    int ok = 1;
    if (global_rank != Py_None) {
        *out = as_ll(global_rank, &ok);
        return ok;
    }
    PyObject *ranks = GR(group)->ranks;
    if (ranks == NULL || !PyList_CheckExact(ranks)) return 0;
    Py_ssize_t n = PyList_GET_SIZE(ranks);
    if (group_rank != Py_None) {
        long long index = as_ll(group_rank, &ok);
        if (!ok) return 0;
        if (index < 0 || index >= n) { *out = -1; return 1; }
        *out = as_ll(PyList_GET_ITEM(ranks, index), &ok);
        return ok;
    }
    if (!is_root) { *out = -1; return 1; }
    if (n == 0) { *out = -1; return 1; }
    *out = as_ll(PyList_GET_ITEM(ranks, 0), &ok);
    return ok;
}

/* stacks.call_site: the innermost frame of the user's code, as (code, f_lasti); with none on the stack
 * (SITE_WALK_LIMIT frames walked), the first library frame. Each code object's class (stacks.PASS,
 * LIBRARY, USER: stacks.frame_class) is cached by its id, shared with the Python path.
 * The C wrapper has no frame, so the walk starts at its caller. New ref, or Py_None. */
#define SITE_PASS 0
#define SITE_LIBRARY 1
#define SITE_USER 2
#define SITE_WALK_LIMIT 256

static int site_class(Leaf *self, PyCodeObject *code)
{
    PyObject *key = PyLong_FromVoidPtr(code);
    if (key == NULL) {
        PyErr_Clear();
        return SITE_LIBRARY;
    }
    PyObject *known = PyDict_GetItemWithError(self->site_cache, key);
    if (known != NULL && PyTuple_CheckExact(known) && PyTuple_GET_SIZE(known) == 2
        && PyTuple_GET_ITEM(known, 0) == (PyObject *)code && PyLong_CheckExact(PyTuple_GET_ITEM(known, 1))) {
        Py_DECREF(key);
        return (int)PyLong_AsLong(PyTuple_GET_ITEM(known, 1));
    }
    PyErr_Clear();
    int cls = SITE_LIBRARY;
    PyObject *found = PyObject_CallOneArg(self->frame_class, code->co_filename);
    if (found != NULL && PyLong_CheckExact(found)) {
        cls = (int)PyLong_AsLong(found);
        if (PyDict_GET_SIZE(self->site_cache) >= self->site_cache_limit) PyDict_Clear(self->site_cache);
        PyObject *entry = PyTuple_Pack(2, (PyObject *)code, found);
        if (entry == NULL || PyDict_SetItem(self->site_cache, key, entry) < 0) PyErr_Clear();
        Py_XDECREF(entry);
    }
    if (PyErr_Occurred()) PyErr_Clear();
    Py_XDECREF(found);
    Py_DECREF(key);
    return cls;
}

static PyObject *site_of(PyCodeObject *code, int offset)
{
    PyObject *lasti = PyLong_FromLong(offset);
    PyObject *site = lasti ? PyTuple_Pack(2, (PyObject *)code, lasti) : NULL;
    Py_XDECREF(lasti);
    if (site == NULL) PyErr_Clear();
    return site;
}

static PyObject *call_site(Leaf *self)
{
    PyFrameObject *frame = PyEval_GetFrame();
    Py_XINCREF(frame);
    int depth = 0;
    PyObject *fallback = NULL; /* the first library frame's site */
    while (frame != NULL && depth < SITE_WALK_LIMIT) {
        PyCodeObject *code = PyFrame_GetCode(frame);
        if (depth == 0 && (PyObject *)code == self->site_code && PyFrame_GetLasti(frame) == self->site_lasti) {
            Py_DECREF(code); /* the same caller, at the same place, as last time */
            Py_DECREF(frame);
            Py_INCREF(self->site);
            return self->site;
        }
        int cls = site_class(self, code);
        if (cls == SITE_USER) {
            int offset = PyFrame_GetLasti(frame);
            PyObject *site = site_of(code, offset);
            Py_DECREF(frame);
            Py_XDECREF(fallback);
            if (site == NULL) {
                Py_DECREF(code);
                Py_RETURN_NONE;
            }
            /* the cache is valid only when the caller itself is the site (not a frame of ours) */
            Py_XSETREF(self->site_code, (PyObject *)code);
            Py_INCREF(site);
            Py_XSETREF(self->site, site);
            self->site_lasti = depth == 0 ? offset : -2;
            return site;
        }
        if (cls == SITE_LIBRARY && fallback == NULL) fallback = site_of(code, PyFrame_GetLasti(frame));
        Py_DECREF(code);
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
        depth++;
    }
    Py_XDECREF(frame);
    if (fallback != NULL) return fallback;
    Py_RETURN_NONE;
}

/* The call raised: tell `notify(a, b, exception)` (it records the failure) and raise it on as is. */
static void notify_raised(PyObject *notify, PyObject *a, PyObject *b)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (traceback != NULL) PyException_SetTraceback(value, traceback);
    PyObject *done = PyObject_CallFunctionObjArgs(notify, a, b, value, NULL);
    Py_XDECREF(done);
    PyErr_Clear();
    PyErr_Restore(type, value, traceback);
}

static inline int str_equal(PyObject *a, PyObject *b)
{
    return a == b || (a != NULL && PyUnicode_CheckExact(a) && PyUnicode_Compare(a, b) == 0);
}

static inline PyObject *call_slow(Leaf *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    return PyObject_Vectorcall(self->slow, args, nargsf, kwnames);
}

/* The counter step of `api` on `group` once Recorder._seq_after trusts it: 1 with *step set, else 0.
 * The Leaf keeps a copy of the last one found, which the group's steps_gen retires. */
static int trusted_step(Leaf *self, PyObject *group, PyObject *api, long long *step)
{
    if (self->step_group == group && self->step_api == api && self->step_gen == GR(group)->steps_gen) {
        *step = self->step;
        return 1;
    }
    PyObject *steps = GR(group)->steps;
    PyObject *learned = steps && PyDict_CheckExact(steps) ? PyDict_GetItemWithError(steps, api) : NULL;
    int ok = 1;
    if (learned == NULL || !PyList_CheckExact(learned) || PyList_GET_SIZE(learned) != 2
        || as_ll(PyList_GET_ITEM(learned, 1), &ok) < self->trust_after || !ok) {
        PyErr_Clear();
        return 0;
    }
    long long value = as_ll(PyList_GET_ITEM(learned, 0), &ok);
    if (!ok) return 0;
    Py_INCREF(group);
    Py_XSETREF(self->step_group, group);
    Py_INCREF(api);
    Py_XSETREF(self->step_api, api);
    self->step = *step = value;
    self->step_gen = GR(group)->steps_gen;
    return 1;
}

/* The group's backend counter, read through the torch reader when it is one (-2: not read) */
static long long read_counter(PyObject *group, int *ok)
{
    PyObject *read_seq = GR(group)->read_seq;
    long long seq = peek != NULL && read_seq != NULL ? peek->read_seq(read_seq) : -2;
    if (seq == -2) { /* not the torch reader's: call it */
        PyObject *seq_obj = read_seq ? PyObject_CallNoArgs(read_seq) : NULL;
        seq = as_ll(seq_obj, ok);
        Py_XDECREF(seq_obj);
    }
    return seq;
}

/* Recorder.finish's first half: the counter after the call (Recorder._seq_after: read, or predicted
 * once learned) and the group no longer busy. */
static void settle_seq(Leaf *self, PyObject *entry, PyObject *group, long long record_id, long long seq_before)
{
    int ok = 1;
    long long seq_after = -1, step;
    if (seq_before >= 0 && record_id % self->recheck_every && trusted_step(self, group, EN(entry)->api, &step)) {
        seq_after = seq_before + step;
    } else if (seq_before < 0) { /* no counter before the call: _seq_after reads it, learning nothing */
        seq_after = read_counter(group, &ok);
    } else {
        PyObject *read = PyObject_CallFunctionObjArgs(self->seq_after, entry, group, NULL); /* learns the step */
        seq_after = as_ll(read, &ok);
        Py_XDECREF(read);
    }
    if (!ok || PyErr_Occurred()) {
        PyErr_Clear();
        seq_after = -1;
    }
    if (seq_after >= 0) {
        EN(entry)->pg_seq = seq_after;
        if (seq_after > GR(group)->last_pg_seq) GR(group)->last_pg_seq = seq_after;
    }
    GR(group)->busy--;
    PyErr_Clear();
}

/* An async op's Work, where its Work.wait finds it: the async slot when it is free (no dict for the common
 * `work = ...(async_op=True); work.wait()`), else by_work, keyed by the Work's address (the entry holds
 * the Work, so the address is not reused). The watchdog polls both. */
static void file_async(Leaf *self, PyObject *entry, PyObject *work)
{
    AsyncSlot *slot = (AsyncSlot *)self->async_slot;
    if (slot->work == Py_None) {
        set_slot(self->async_slot, offsetof(AsyncSlot, work), work);
        set_slot(self->async_slot, offsetof(AsyncSlot, entry), entry);
        return;
    }
    PyObject *key = PyLong_FromVoidPtr(work);
    if (key == NULL || PyDict_SetItem(self->by_work, key, entry) < 0) PyErr_Clear();
    Py_XDECREF(key);
}

/* Recorder.finish for a CPU call that returned None (blocking: complete now) or a Work (async:
 * Recorder.watch_work's CPU case, completed by Work.wait or the watchdog's poll). A C-path op is in
 * no table while it runs: its thread's ThreadState.in_leaf holds it (Recorder.in_flight). */
static void finish_cpu(Leaf *self, PyObject *entry, PyObject *group, long long record_id, long long seq_before,
                       PyObject *work)
{
    settle_seq(self, entry, group, record_id, seq_before);
    if (work == Py_None) {
        EN(entry)->t_complete_ns = monotonic_ns();
        EN(entry)->state = COMPLETED;
    } else {
        set_slot(entry, E_(work), work);
        file_async(self, entry, work);
    }
    PyErr_Clear();
}

/* This thread's ThreadState (Recorder.thread_state made it), looked up once per thread; NULL: Python path */
static PyObject *thread_state(PyObject *local, uint64_t *cached_id, PyObject **cached)
{
    uint64_t thread_id = PyThreadState_GetID(PyThreadState_Get());
    if (*cached != NULL && thread_id == *cached_id) return *cached;
    PyObject *tls = PyObject_GetAttr(local, s_state);
    if (tls == NULL) { PyErr_Clear(); return NULL; }
    if (Py_TYPE(tls) != thread_type) { Py_DECREF(tls); return NULL; }
    Py_XSETREF(*cached, tls); /* keeps it alive, and this thread's for the next call */
    *cached_id = thread_id;
    return tls;
}

/* ------------------------------------------------------------------ device ops */

#define FORCED_MAX 24 /* arguments a forced-async call may have (positional and keyword) */

/* The arguments of a blocking device call issued async (patching._force_async): `async_op` set to
 * True where it was given; else, for a call with no keywords, passed by position after the defaults
 * of the parameters before it (`async_fill`, fastpath.py); else added as a keyword. Why by
 * position: a keyword makes torch's decorators (`*args, **kwargs`) build and copy a dict per call,
 * ~0.2 µs. 0 = *out and *out_nargs filled, -1 = Python path. */
static int force_async(Leaf *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **out,
                       Py_ssize_t *out_nargs, PyObject **out_kwnames)
{
    Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
    Py_ssize_t at = self->async_position;
    if (nargs + nkw + 1 > FORCED_MAX || at + 1 > FORCED_MAX) return -1;
    memcpy(out, args, (size_t)(nargs + nkw) * sizeof(PyObject *));
    *out_kwnames = kwnames;
    *out_nargs = nargs;
    if (at >= 0 && at < nargs) {
        out[at] = Py_True;
        return 0;
    }
    if (at >= nargs && nkw == 0 && PyTuple_GET_SIZE(self->async_fill) == at) {
        Py_ssize_t p = nargs;
        for (; p < at; p++) {
            PyObject *fill = PyTuple_GET_ITEM(self->async_fill, p);
            if (!PyTuple_CheckExact(fill) || PyTuple_GET_SIZE(fill) != 1) break; /* no default: as keyword */
            out[p] = PyTuple_GET_ITEM(fill, 0);
        }
        if (p == at) {
            out[at] = Py_True;
            *out_nargs = at + 1;
            return 0;
        }
    }
    for (Py_ssize_t k = 0; k < nkw; k++) {
        if (str_equal(PyTuple_GET_ITEM(kwnames, k), s_async_op)) {
            out[nargs + k] = Py_True;
            return 0;
        }
    }
    PyObject *from = kwnames != NULL ? kwnames : Py_None;
    if (from != self->forced_from || self->forced_kwnames == NULL) { /* kwnames are mostly the caller's constants */
        PyObject *forced = PyTuple_New(nkw + 1);
        if (forced == NULL) return -1;
        for (Py_ssize_t k = 0; k < nkw; k++) {
            PyObject *name = PyTuple_GET_ITEM(kwnames, k);
            Py_INCREF(name);
            PyTuple_SET_ITEM(forced, k, name);
        }
        Py_INCREF(s_async_op);
        PyTuple_SET_ITEM(forced, nkw, s_async_op);
        Py_INCREF(from); /* held, so its address is not reused by another tuple */
        Py_XSETREF(self->forced_from, from);
        Py_XSETREF(self->forced_kwnames, forced);
    }
    out[nargs + nkw] = Py_True;
    *out_kwnames = self->forced_kwnames;
    return 0;
}

/* ------------------------------------------------------------------ device events */

/* DeviceTiming.before and .waited (record/device_timing.py, the reference) in their common case, with no
 * Python frame: the entry's own events (made by `before` at its first op on the device, kept while the
 * ring reuses the entry) re-recorded on the current stream and marked with the op's id. Anything else
 * (a device not in DeviceTiming.ready, an entry without events for it, a capture under way, an error)
 * returns -1: the caller then calls the Python method, which handles it. */

/* 0: `device` is in DeviceTiming.ready and its stream is not being captured into a graph; -1: otherwise */
static PyObject *ready_of_timing, *ready_dict; /* the last DeviceTiming asked and its `ready` (never reassigned) */

static PyObject *timing_ready_dict(PyObject *timing)
{
    if (timing == ready_of_timing) return ready_dict;
    PyObject *d = PyObject_GenericGetDict(timing, NULL);
    PyObject *ready = d != NULL ? PyDict_GetItemWithError(d, s_ready) : NULL;
    Py_XDECREF(d);
    if (ready == NULL || !PyDict_CheckExact(ready)) {
        PyErr_Clear();
        return NULL;
    }
    Py_INCREF(timing);
    Py_INCREF(ready);
    Py_XSETREF(ready_of_timing, timing); /* held: its address cannot be reused by another while cached */
    Py_XSETREF(ready_dict, ready);
    return ready;
}

static int timing_ready(PyObject *timing, PyObject *device)
{
    PyObject *ready = timing_ready_dict(timing);
    PyObject *check = ready != NULL ? PyDict_GetItemWithError(ready, device) : NULL;
    int out = -1;
    if (check == Py_None) {
        out = 0; /* that device cannot capture */
    } else if (check != NULL) {
        Py_INCREF(check);
        PyObject *said = PyObject_CallNoArgs(check);
        out = said != NULL && PyObject_IsTrue(said) == 0 ? 0 : -1;
        Py_XDECREF(said);
        Py_DECREF(check);
    }
    PyErr_Clear();
    return out;
}

/* The entry's events[index].record(), if they are events of `device`: 0 done, -1 not. */
static int record_event(EntryObject *e, PyObject *device, int index)
{
    PyObject *events = e->events;
    if (!PyTuple_CheckExact(events) || PyTuple_GET_SIZE(events) != 3) return -1;
    PyObject *own = PyTuple_GET_ITEM(events, 0);
    if (own != device && !(PyUnicode_Check(own) && PyUnicode_Check(device) && PyUnicode_Compare(own, device) == 0)) {
        PyErr_Clear();
        return -1;
    }
    Py_INCREF(events); /* record() may run Python code that replaces them */
    PyObject *done = PyObject_CallMethodNoArgs(PyTuple_GET_ITEM(events, index), s_record);
    Py_DECREF(events);
    if (done == NULL) {
        PyErr_Clear();
        return -1;
    }
    Py_DECREF(done);
    return 0;
}

/* DeviceTiming.before's common case: the start event. 0: recorded; -1: the Python method decides. */
static int timing_start(PyObject *timing, PyObject *entry, PyObject *device)
{
    EntryObject *e = EN(entry);
    if (timing_ready(timing, device) < 0) return -1;
    if (PyTuple_CheckExact(e->events) && PyTuple_GET_SIZE(e->events) == 0) {
        e->timed_start = -1; /* an entry past DeviceTiming's cap on events: host times only */
        return 0;
    }
    e->timed_start = e->timed_end = -1; /* what they held is not this op's (a dump checks) */
    if (record_event(e, device, 1) < 0) return -1;
    e->timed_start = e->id;
    return 0;
}

/* DeviceTiming.waited's common case: the end event, unless the op is not timed or has its end. 0: done;
 * -1: the Python method decides. `since_issue` 0: right after the call (a blocking op), when no capture
 * can have begun since its start, so the capture query is not asked again. */
static int timing_end(PyObject *timing, PyObject *entry, int since_issue)
{
    EntryObject *e = EN(entry);
    if (e->timed_start != e->id || e->timed_end == e->id) return 0;
    PyObject *events = e->events;
    if (!PyTuple_CheckExact(events) || PyTuple_GET_SIZE(events) != 3) return -1;
    PyObject *device = PyTuple_GET_ITEM(events, 0);
    if (since_issue && timing_ready(timing, device) < 0) return -1;
    if (record_event(e, device, 2) < 0) return -1;
    e->timed_end = e->id;
    return 0;
}

/* Recorder._file_polled's rule: the op with id `record_id` goes into `polled` right after this. When it
 * will be the only one there, the catch-up falls due poll_soon_at ids later
 * (Recorder.poll_due); when it is past that, its ops are polled now, on this thread (Recorder.poll_soon,
 * armed as catch_up_due, which may put the next further on), rather than at the watchdog's next tick,
 * before the ring wraps over ops not seen complete, and the next is due poll_soon_at ids later. Counted
 * in ids, not in ops filed: the ring also turns for the other ops (a CPU group's) in between. An error
 * is left to the tick, which polls too. */
static void poll_soon(Leaf *self, long long record_id)
{
    if (self->poll_soon_at <= 0) return;
    int first = PyDict_GET_SIZE(self->polled) == 0;
    if (!first) {
        PyObject *due = PyDict_GetItemWithError(self->rec_dict, s_poll_due);
        int ok = 1;
        if (due == NULL || (as_ll(due, &ok) > record_id && ok)) {
            PyErr_Clear();
            return;
        }
    }
    PyObject *next = PyLong_FromLongLong(record_id + self->poll_soon_at);
    if (next == NULL || PyDict_SetItem(self->rec_dict, s_poll_due, next) < 0) {
        Py_XDECREF(next);
        PyErr_Clear();
        return;
    }
    Py_DECREF(next);
    if (first) return;
    PyObject *wake = PyDict_GetItemWithError(self->rec_dict, s_poll_soon);
    if (wake != NULL && wake != Py_None) {
        PyObject *done = PyObject_CallNoArgs(wake);
        Py_XDECREF(done);
    }
    PyErr_Clear();
}

/* Recorder.watch_work's device case: the Work kept on the entry, the entry polled by the watchdog
 * (Work.is_completed, then Work.exception: a failure is found there) and, for an async op, found by
 * its Work.wait (`file_async`, as a CPU op's). Its future is not watched: NCCL (and torch_npu's
 * HCCL) complete it with its value as soon as the op is queued, so it can never carry the op's error
 * (record/recorder.py `watch_work`). The op is filed after the catch-up it makes due (`_file_polled`
 * too): that catch-up would complete it (the stand-in's ops end at once) before its caller's wait,
 * which would then find no op of its own and take the Python path (~2,000 instructions per catch-up). */
static void watch_device(Leaf *self, PyObject *entry, PyObject *work, int blocking, PyObject *key)
{
    set_slot(entry, E_(work), work);
    poll_soon(self, EN(entry)->id);
    if (key == NULL || PyDict_SetItem(self->polled, key, entry) < 0) PyErr_Clear(); /* key: the entry's id */
    if (!blocking) file_async(self, entry, work); /* its wait (Work.wait) places the end event */
}

/* patching._call_on_device after the call, for the C hot path's device op (`result` stolen). The
 * common case, a Work not captured into a graph, is done here; the rest goes to `device_tail`, its
 * Python copy. The thread's in_leaf holds the entry until the op is filed where the watchdog looks
 * (`polled`); a blocking op's wait then runs outside it, as in the Python path. */
static PyObject *finish_device(Leaf *self, PyObject *tls, PyObject *entry, PyObject *group, long long record_id,
                               long long seq_before, PyObject *result, PyObject *timing, int captured, int blocking,
                               PyObject *key)
{
    if (result == NULL) {
        set_slot(tls, T.in_leaf, Py_False);
        notify_raised(self->record_failure, entry, group);
        return NULL;
    }
    if (captured || !PyObject_TypeCheck(result, (PyTypeObject *)self->work_type)) {
        set_slot(tls, T.in_leaf, Py_False);
        PyObject *out = PyObject_CallFunctionObjArgs(self->device_tail, entry, group, result,
                                                     captured ? Py_True : Py_False, blocking ? Py_True : Py_False, NULL);
        Py_DECREF(result);
        return out;
    }
    settle_seq(self, entry, group, record_id, seq_before);
    watch_device(self, entry, result, blocking, key);
    set_slot(tls, T.in_leaf, Py_False);
    if (!blocking) return result; /* its end is timed when the training code waits on its Work */
    /* the current stream now waits for the op (its host call returns at once); a blocking op is not
     * in by_work, so the Work.wait wrapper would only hand it to the wait it wraps: called directly */
    PyObject *waited = PyObject_CallOneArg(self->work_wait, result);
    if (waited == NULL) { /* told as the Work.wait wrapper tells it (unless its future already failed it) */
        notify_raised(self->wait_failed, entry, result);
        Py_DECREF(result);
        return NULL;
    }
    Py_DECREF(waited);
    /* the end event, with no second capture check: no capture can have begun since the call */
    if (timing_end(timing, entry, 0) < 0) {
        waited = PyObject_CallMethodObjArgs(timing, s_waited, entry, Py_False, NULL);
        Py_XDECREF(waited);
        PyErr_Clear(); /* DeviceTiming.waited warns of its own errors */
    }
    Py_DECREF(result);
    Py_RETURN_NONE;
}

static PyObject *leaf_call(PyObject *self_, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Leaf *self = (Leaf *)self_;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (!self->enabled) return call_slow(self, args, nargsf, kwnames);

    if (PyDict_GetItemWithError(self->rec_dict, s_active) != Py_True) { /* Recorder.active */
        PyErr_Clear();
        return call_slow(self, args, nargsf, kwnames);
    }
    PyObject *tls = thread_state(self->local, &self->tls_id, &self->tls_state);
    if (tls == NULL) return call_slow(self, args, nargsf, kwnames);
    if (SLOT(tls, T.in_leaf) != Py_False) return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    if (SLOT(tls, T.unit) != Py_None) return call_slow(self, args, nargsf, kwnames);

    /* ---- read the call: nothing is changed until every fact is known */
    PyObject *v[NPARAMS];
    for (int i = 0; i < NPARAMS; i++) {
        Py_ssize_t pos = self->positions[i];
        v[i] = (pos >= 0 && pos < nargs) ? args[pos] : self->defaults[i];
    }
    if (kwnames != NULL) {
        Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t k = 0; k < nkw; k++) {
            PyObject *name = PyTuple_GET_ITEM(kwnames, k);
            for (int i = 0; i < NPARAMS; i++) {
                if (self->names[i] != NULL && str_equal(name, self->names[i]))
                    v[i] = args[nargs + k]; /* no break: all_reduce reads `tensor` as input and output */
            }
        }
    }
    PyObject *pg = v[0];
    if (pg == Py_None) {
        pg = PyDict_GetItemWithError(self->world_dict, s_default_pg); /* c10d._world._default_pg */
        if (pg == NULL) { PyErr_Clear(); return call_slow(self, args, nargsf, kwnames); }
    }
    PyObject *group = PyDict_GetItemWithError(self->by_pg, pg);
    if (group == NULL || (Py_TYPE(group) != group_type && Py_TYPE(group) != (PyTypeObject *)self->stream_group_type)) {
        PyErr_Clear();
        return call_slow(self, args, nargsf, kwnames); /* unseen group, or not a member */
    }
    Py_INCREF(group); /* the reads below may run Python code (a property, a thread switch) */
    PyObject *inputs = NULL, *outputs = NULL;
    PyObject *device = NULL, *out_device = NULL, *timing = NULL; /* a device op's device type, and its DeviceTiming */
    PyObject *forced[FORCED_MAX];
    PyObject *const *call_args = args;
    size_t call_nargsf = nargsf;
    PyObject *call_kwnames = kwnames;
    int blocking = 0;
    long long end = -1;
    if (self->has_endpoint && !endpoint(v[5], v[6], group, self->is_coll, &end)) goto slow;
    if (!self->is_coll && end < 0) goto slow; /* a receive from any source */
    PyObject *api = SLOT(tls, T.api);
    if (api == NULL || api == Py_None || !PyUnicode_Check(api) || PyUnicode_GET_LENGTH(api) == 0) api = self->api_name;
    int is_async = 0;
    if (self->always_async && (is_async = PySet_Contains(self->async_apis, api)) < 0) goto slow;
    if (!is_async && v[3] != Py_None && (is_async = PyObject_IsTrue(v[3])) < 0) goto slow;
    if (v[1] != Py_None && !describe(self, v[1], &inputs, &device)) goto slow;
    if (v[2] != Py_None) {
        if (v[2] == v[1]) {
            outputs = inputs;
            Py_XINCREF(outputs);
        } else if (!describe(self, v[2], &outputs, &out_device)) {
            goto slow;
        }
    }
    if (out_device != NULL) { /* recorder._describe: the outputs' device, described last, names the op's */
        Py_XSETREF(device, out_device);
        out_device = NULL;
    }
    if (device != NULL) { /* a device op (patching._call_on_device): forced async, timed with events */
        if (!is_async && !self->has_async && !self->is_coll) goto slow; /* blocking send/recv: its async twin */
        timing = PyDict_GetItemWithError(self->rec_dict, s_device_timing); /* replaceable: read per call */
        if (timing == NULL) goto slow;
        Py_INCREF(timing);
        blocking = !is_async && self->has_async;
        if (blocking) {
            Py_ssize_t forced_nargs;
            if (force_async(self, args, nargs, kwnames, forced, &forced_nargs, &call_kwnames) < 0) goto slow;
            call_args = forced;
            call_nargsf = (size_t)forced_nargs;
        }
    } else if (Py_TYPE(group) != group_type) {
        goto slow; /* CPU tensors of a group whose Works complete after their wait: the Python path */
    }
    int ok = 1;
    long long seq_before = read_counter(group, &ok);
    if (!ok || seq_before > GR(group)->last_pg_seq) goto slow; /* C++-issued ops to record first: the Python path does */
    goto record;
slow:
    PyErr_Clear();
    Py_XDECREF(inputs);
    Py_XDECREF(outputs);
    Py_XDECREF(device);
    Py_XDECREF(out_device);
    Py_XDECREF(timing);
    Py_DECREF(group);
    return call_slow(self, args, nargsf, kwnames);

record:;
    /* ---- record (Recorder.compile's begin) */
    long long now = monotonic_ns();
    long long record_id = ((Counter *)self->ids)->next++; /* Ring.next_id */
    GR(group)->busy++;
    Py_ssize_t slot = (Py_ssize_t)(record_id % self->capacity);
    PyObject *entry = PyList_GET_ITEM(self->slots, slot);
    if (entry != Py_None && Py_TYPE(entry) == entry_type
        && (EN(entry)->state == COMPLETED || EN(entry)->state == FAILED)
        && str_equal(EN(entry)->source, s_python) && EN(entry)->work == Py_None) {
        Py_INCREF(entry); /* Entry.reset */
        EntryObject *e = EN(entry);
        e->id = record_id;
        e->peer = e->root = e->unit = -1;
        e->t_complete_ns = e->t_dev_start_ns = e->t_dev_end_ns = NO_TIME;
        set_slot(entry, E_(group), GR(group)->name);
        set_slot(entry, E_(kind), self->kind);
        set_slot(entry, E_(op), self->op_name);
        set_slot(entry, E_(api), api);
        set_slot(entry, E_(reduce_op), Py_None);
        e->state = STARTED;
        set_slot(entry, E_(error), Py_None);
        set_slot(entry, E_(stack), Py_None);
    } else {
        PyObject *dropped = entry; /* the slot's entry, its op still pending (or not the Python path's) */
        Py_INCREF(dropped); /* Entry() runs Python code: another thread may replace it in the slot meanwhile */
        PyObject *rid = PyLong_FromLongLong(record_id);
        entry = rid ? PyObject_CallFunctionObjArgs((PyObject *)entry_type, rid, GR(group)->name, self->kind,
                                                   self->op_name, api, NULL) : NULL;
        Py_XDECREF(rid);
        if (entry != NULL && Py_TYPE(entry) == entry_type && Py_TYPE(dropped) == entry_type
            && EN(dropped)->events != NULL && PyTuple_CheckExact(EN(dropped)->events)) {
            /* Entry.take_events: its events, which nothing reads now (dumps read the ring) */
            EN(dropped)->timed_start = EN(dropped)->timed_end = -1;
            PyObject *events = EN(dropped)->events;
            Py_INCREF(Py_None);
            EN(dropped)->events = Py_None;
            Py_XSETREF(EN(entry)->events, events); /* the dropped entry's reference, moved */
        }
        Py_DECREF(dropped);
        if (entry == NULL || Py_TYPE(entry) != entry_type) {
            PyErr_Clear();
            Py_XDECREF(entry);
            GR(group)->busy--;
            Py_XDECREF(inputs);
            Py_XDECREF(outputs);
            Py_XDECREF(device);
            Py_XDECREF(timing);
            Py_DECREF(group);
            PyErr_Clear();
            return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
        }
    }
    set_slot(entry, E_(device), device != NULL ? device : s_cpu);
    EntryObject *e = EN(entry);
    if (self->is_coll) {
        e->seq = ++GR(group)->coll_seq;
        if (self->has_endpoint) e->root = end;
        set_slot(entry, E_(reduce_op), v[4]);
    } else {
        PyObject *peer = PyLong_FromLongLong(end);
        PyObject *counts = self->is_send ? GR(group)->sent : GR(group)->received;
        PyObject *count = peer ? PyDict_GetItemWithError(counts, peer) : NULL;
        int count_ok = 1;
        long long previous = count ? as_ll(count, &count_ok) : 0;
        PyObject *seq = PyLong_FromLongLong(previous + 1);
        if (seq && peer && PyDict_SetItem(counts, peer, seq) < 0) PyErr_Clear();
        Py_XDECREF(seq);
        Py_XDECREF(peer);
        e->seq = previous + 1;
        e->peer = end;
    }
    e->pg_seq = seq_before >= 0 ? seq_before + 1 : -1;
    set_slot_steal(entry, E_(inputs), inputs ? inputs : (Py_INCREF(empty_tuple), empty_tuple));
    set_slot_steal(entry, E_(outputs), outputs ? outputs : (Py_INCREF(empty_tuple), empty_tuple));
    e->is_async = (char)is_async;
    e->t_enqueue_ns = now;
    set_slot(entry, E_(thread), SLOT(tls, T.thread_name) ? SLOT(tls, T.thread_name) : s_empty);
    set_slot_steal(entry, E_(site), call_site(self));
    if (PyList_GET_ITEM(self->slots, slot) != entry) {
        Py_INCREF(entry);
        PyList_SetItem(self->slots, slot, entry); /* Ring.put: steals the new reference */
    }
    PyErr_Clear();

    /* ---- the call: the watchdog finds the op through its thread's in_leaf (Recorder.in_flight) */
    set_slot(tls, T.in_leaf, entry);
    if (timing != NULL) { /* a start event on the current stream, unless it is being captured into a graph */
        int captured = 0;
        PyObject *key = PyLong_FromLongLong(record_id); /* the entry's id: its key in `polled` */
        if (key == NULL) PyErr_Clear();
        if (timing_start(timing, entry, device) < 0) {
            PyObject *said = PyObject_CallMethodOneArg(timing, s_before, entry);
            captured = said != NULL && PyObject_IsTrue(said) == 1;
            Py_XDECREF(said);
            PyErr_Clear(); /* DeviceTiming.before warns of its own errors */
        }
        PyObject *result = PyObject_Vectorcall(self->original, call_args, call_nargsf, call_kwnames);
        result = finish_device(self, tls, entry, group, record_id, seq_before, result, timing, captured, blocking, key);
        Py_XDECREF(key);
        Py_DECREF(timing);
        Py_DECREF(device);
        Py_DECREF(group);
        Py_DECREF(entry);
        return result;
    }
    PyObject *result = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    set_slot(tls, T.in_leaf, Py_False);
    if (result == NULL) {
        notify_raised(self->record_failure, entry, group);
    } else if (result == Py_None || Py_TYPE(result) == (PyTypeObject *)self->work_type) {
        finish_cpu(self, entry, group, record_id, seq_before, result);
    } else {
        PyObject *done = PyObject_CallFunctionObjArgs(self->finish, entry, group, result, NULL);
        if (done == NULL) {
            PyObject *type, *value, *traceback;
            PyErr_Fetch(&type, &value, &traceback);
            PyErr_NormalizeException(&type, &value, &traceback);
            PyObject *warned = PyObject_CallOneArg(self->on_finish_error, value ? value : Py_None);
            Py_XDECREF(warned);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(traceback);
            PyErr_Clear();
        }
        Py_XDECREF(done);
    }
    Py_DECREF(group);
    Py_DECREF(entry);
    return result;
}

/* ------------------------------------------------------------------ type plumbing */

static int leaf_traverse(Leaf *self, visitproc visit, void *arg)
{
#define VISIT(field) Py_VISIT(self->field);
    LEAF_OBJECTS(VISIT)
#undef VISIT
    for (int i = 0; i < NPARAMS; i++) {
        Py_VISIT(self->names[i]);
        Py_VISIT(self->defaults[i]);
    }
    return 0;
}

static int leaf_clear(Leaf *self)
{
#define CLEAR(field) Py_CLEAR(self->field);
    LEAF_OBJECTS(CLEAR)
#undef CLEAR
    for (int i = 0; i < NPARAMS; i++) {
        Py_CLEAR(self->names[i]);
        Py_CLEAR(self->defaults[i]);
    }
    self->enabled = 0;
    return 0;
}

static void leaf_dealloc(Leaf *self)
{
    PyObject_GC_UnTrack(self);
    leaf_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int take(PyObject *config, const char *key, PyObject **out)
{
    PyObject *value = PyDict_GetItemString(config, key);
    if (value == NULL) {
        PyErr_Format(PyExc_KeyError, "Leaf config is missing %s", key);
        return -1;
    }
    Py_INCREF(value);
    Py_XSETREF(*out, value);
    return 0;
}

static int take_int(PyObject *config, const char *key, Py_ssize_t *out)
{
    PyObject *value = PyDict_GetItemString(config, key);
    if (value == NULL) {
        PyErr_Format(PyExc_KeyError, "Leaf config is missing %s", key);
        return -1;
    }
    *out = PyLong_AsSsize_t(value);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int leaf_init(Leaf *self, PyObject *args, PyObject *kwargs)
{
    PyObject *config, *params;
    if (entry_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "flightrec.record._fastpath.configure() was not called");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "O!", &PyDict_Type, &config)) return -1;
#define TAKE(field) if (strcmp(#field, "dict") && strcmp(#field, "tls_state") && strcmp(#field, "site_code") \
                         && strcmp(#field, "site") && strncmp(#field, "last_", 5) && strncmp(#field, "step_", 5) \
                         && strncmp(#field, "forced_", 7) && take(config, #field, &self->field) < 0) return -1;
    LEAF_OBJECTS(TAKE)
#undef TAKE
    if (!PyTuple_CheckExact(self->async_fill)) {
        PyErr_SetString(PyExc_TypeError, "Leaf config: async_fill must be a tuple");
        return -1;
    }
    Py_ssize_t flag;
    if (take_int(config, "capacity", &self->capacity) < 0 || take_int(config, "site_cache_limit", &self->site_cache_limit) < 0
        || take_int(config, "trust_after", &self->trust_after) < 0 || take_int(config, "recheck_every", &self->recheck_every) < 0
        || take_int(config, "poll_soon_at", &self->poll_soon_at) < 0)
        return -1;
    if (take_int(config, "is_coll", &flag) < 0) return -1;
    self->is_coll = (int)flag;
    if (take_int(config, "is_send", &flag) < 0) return -1;
    self->is_send = (int)flag;
    if (take_int(config, "always_async", &flag) < 0) return -1;
    self->always_async = (int)flag;
    if (take_int(config, "has_endpoint", &flag) < 0) return -1;
    self->has_endpoint = (int)flag;
    if (take_int(config, "has_async", &flag) < 0) return -1;
    self->has_async = (int)flag;
    if (take_int(config, "async_position", &self->async_position) < 0) return -1;
    if (self->capacity < 1 || self->recheck_every < 1 || !PyList_CheckExact(self->slots)
        || PyList_GET_SIZE(self->slots) != self->capacity || !PyDict_CheckExact(self->by_pg)
        || !PyDict_CheckExact(self->pending) || !PyDict_CheckExact(self->site_cache) || !PyType_Check(self->tensor_type)
        || !PyDict_CheckExact(self->by_work) || !PyType_Check(self->work_type) || !Py_IS_TYPE(self->async_slot, &AsyncSlotType)
        || !PyDict_CheckExact(self->rec_dict) || !PyDict_CheckExact(self->world_dict) || !Py_IS_TYPE(self->ids, &CounterType)
        || !PyDict_CheckExact(self->polled) || !PyType_Check(self->stream_group_type)
        || !PyType_IsSubtype((PyTypeObject *)self->stream_group_type, group_type)
        || ((PyTypeObject *)self->stream_group_type)->tp_basicsize != group_type->tp_basicsize) {
        PyErr_SetString(PyExc_TypeError, "Leaf config has the wrong types");
        return -1;
    }
    params = PyDict_GetItemString(config, "params"); /* ((name or None, position, default), ...) x 7 */
    if (params == NULL || !PyTuple_CheckExact(params) || PyTuple_GET_SIZE(params) != NPARAMS) {
        PyErr_SetString(PyExc_TypeError, "Leaf config needs params: seven (name, position, default)");
        return -1;
    }
    for (int i = 0; i < NPARAMS; i++) {
        PyObject *name, *def;
        Py_ssize_t position;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(params, i), "OnO", &name, &position, &def)) return -1;
        if (name == Py_None) {
            name = NULL;
            position = -1;
        } else {
            Py_INCREF(name);
            PyUnicode_InternInPlace(&name);
        }
        Py_XSETREF(self->names[i], name);
        Py_INCREF(def);
        Py_XSETREF(self->defaults[i], def);
        self->positions[i] = position;
    }
    self->vectorcall = leaf_call;
    self->enabled = FASTPATH_SUPPORTED;
    return 0;
}

static PyObject *leaf_tp_call(PyObject *self, PyObject *args, PyObject *kwargs)
{
    return PyVectorcall_Call(self, args, kwargs);
}

static PyMemberDef leaf_members[] = {
    {"enabled", T_INT, offsetof(Leaf, enabled), 0, "0: every call takes the Python wrapper"},
    {"slow", T_OBJECT, offsetof(Leaf, slow), READONLY, "the Python wrapper, the reference"},
    {NULL},
};

static PyGetSetDef leaf_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict},
    {NULL},
};

static PyTypeObject LeafType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "flightrec.record._fastpath.Leaf",
    .tp_basicsize = sizeof(Leaf),
    .tp_dealloc = (destructor)leaf_dealloc,
    .tp_vectorcall_offset = offsetof(Leaf, vectorcall),
    .tp_call = leaf_tp_call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A recorded torch.distributed API: the common call in C, every other in the Python wrapper.",
    .tp_traverse = (traverseproc)leaf_traverse,
    .tp_clear = (inquiry)leaf_clear,
    .tp_members = leaf_members,
    .tp_getset = leaf_getset,
    .tp_dictoffset = offsetof(Leaf, dict),
    .tp_init = (initproc)leaf_init,
    .tp_new = PyType_GenericNew,
};

/* ------------------------------------------------------------------ Work.wait */

/* Work.wait, wrapped: every wait of every Work passes here (PyTorch's own blocking collectives
 * wait on theirs), so the common cases cost no Python frame: a Work we do not follow, and the
 * completion of one we do, and the end event of a device op. A receive from any source goes to the
 * Python wrapper.
 *
 * The completion's bookkeeping is done before the wait blocks, while the caches are warm: the entry
 * leaves by_work and lets go of its Work, and for the watchdog its thread's in_leaf holds it while it
 * waits (Recorder.in_flight). After the wait only the entry itself is written. A wait that raises or
 * times out puts everything back first. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *dict;
    PyObject *original, *slow, *by_work, *pending, *wait_failed, *local, *async_slot, *rec_dict;
    uint64_t tls_id;     /* as in Leaf: this thread's ThreadState, looked up once per thread */
    PyObject *tls_state;
    int enabled;
} Wait;

#define WAIT_OBJECTS(X) X(dict) X(original) X(slow) X(by_work) X(pending) X(wait_failed) X(local) X(async_slot) \
    X(rec_dict) X(tls_state)

static void drop(PyObject *dict, PyObject *key)
{
    if (key != NULL && PyDict_DelItem(dict, key) < 0) PyErr_Clear();
}

static PyObject *wait_call(PyObject *self_, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Wait *self = (Wait *)self_;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (!self->enabled || nargs < 1) return PyObject_Vectorcall(self->slow, args, nargsf, kwnames);
    PyObject *work = args[0];
    AsyncSlot *slot = (AsyncSlot *)self->async_slot;
    PyObject *entry, *key = NULL;
    if (slot->work == work) {
        entry = slot->entry;
    } else {
        if (PyDict_GET_SIZE(self->by_work) == 0) return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
        key = PyLong_FromVoidPtr(work);
        entry = key ? PyDict_GetItemWithError(self->by_work, key) : NULL;
        if (entry == NULL) {
            Py_XDECREF(key);
            if (PyErr_Occurred()) { PyErr_Clear(); return PyObject_Vectorcall(self->slow, args, nargsf, kwnames); }
            return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
        }
    }
    Py_INCREF(entry);
    PyObject *tls = thread_state(self->local, &self->tls_id, &self->tls_state);
    if (tls == NULL || Py_TYPE(entry) != entry_type || EN(entry)->work != work || !PyUnicode_Check(EN(entry)->kind))
        goto slow;
    if (!PyUnicode_Check(EN(entry)->device)) goto slow;
    if (PyUnicode_CompareWithASCIIString(EN(entry)->device, "cpu") != 0) {
        /* a device op (NCCL, HCCL): its wait only makes the current stream wait for it; the end event
         * goes there (Recorder.device_waited: DeviceTiming.waited, then out of by_work); its Work,
         * polled, completes it */
        PyObject *result = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
        if (result == NULL) {
            notify_raised(self->wait_failed, entry, work);
        } else {
            PyObject *timing = PyDict_GetItemWithError(self->rec_dict, s_device_timing);
            Py_XINCREF(timing);
            if (timing != NULL && timing_end(timing, entry, 1) < 0) {
                PyObject *done = PyObject_CallMethodOneArg(timing, s_waited, entry);
                Py_XDECREF(done);
            }
            Py_XDECREF(timing);
            PyErr_Clear(); /* DeviceTiming.waited warns of its own errors */
            if (slot->entry == entry) { /* its poll (`polled`) completes it */
                slot_empty(slot);
            } else {
                if (key == NULL) key = PyLong_FromVoidPtr(work);
                if (key == NULL || PyDict_GET_SIZE(self->by_work) == 0 || PyDict_DelItem(self->by_work, key) < 0)
                    PyErr_Clear();
            }
        }
        Py_DECREF(entry);
        Py_XDECREF(key);
        return result;
    }
    PyObject *kind = EN(entry)->kind; /* "coll" or "p2p": the length tells them apart */
    if (PyUnicode_GET_LENGTH(kind) == 3 && PyUnicode_CompareWithASCIIString(kind, "p2p") == 0 && EN(entry)->peer < 0)
        goto slow;
    Py_INCREF(tls);
    PyObject *outer = SLOT(tls, T.in_leaf); /* False, or set by a wrapped call that waits inside */
    Py_INCREF(outer);
    set_slot(tls, T.in_leaf, entry);
    EN(entry)->work = NULL; /* the caller's reference (args[0]) keeps the Work alive meanwhile */
    if (key == NULL) { /* out of the slot */
        slot_empty(slot);
    } else {
        drop(self->by_work, key);
    }
    PyObject *result = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    set_slot(tls, T.in_leaf, outer);
    if (result != NULL && result != Py_False) { /* wait(timeout) returns False on timeout */
        EN(entry)->t_complete_ns = monotonic_ns();
        EN(entry)->state = COMPLETED;
        Py_INCREF(Py_None);
        Py_XSETREF(EN(entry)->work, Py_None); /* NULL, unless another thread released it meanwhile */
        Py_DECREF(work); /* the entry's reference, taken away before the wait */
        if (PyDict_GET_SIZE(self->pending) > 0) { /* recorded by the Python wrapper */
            PyObject *id = PyLong_FromLongLong(EN(entry)->id);
            drop(self->pending, id);
            Py_XDECREF(id);
        }
    } else { /* still running or failed: followed as before the wait, in by_work */
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback); /* the wait's error, raised on below */
        Py_XSETREF(EN(entry)->work, work); /* takes back the entry's reference */
        if (key == NULL) key = PyLong_FromVoidPtr(work);
        if (key == NULL || PyDict_SetItem(self->by_work, key, entry) < 0) PyErr_Clear();
        PyErr_Restore(type, value, traceback);
        if (result == NULL) notify_raised(self->wait_failed, entry, work);
    }
    Py_DECREF(outer);
    Py_DECREF(tls);
    Py_DECREF(entry);
    Py_XDECREF(key);
    return result;
slow:
    Py_DECREF(entry);
    Py_XDECREF(key);
    return PyObject_Vectorcall(self->slow, args, nargsf, kwnames);
}

static int wait_traverse(Wait *self, visitproc visit, void *arg)
{
#define VISIT(field) Py_VISIT(self->field);
    WAIT_OBJECTS(VISIT)
#undef VISIT
    return 0;
}

static int wait_clear(Wait *self)
{
#define CLEAR(field) Py_CLEAR(self->field);
    WAIT_OBJECTS(CLEAR)
#undef CLEAR
    self->enabled = 0;
    return 0;
}

static void wait_dealloc(Wait *self)
{
    PyObject_GC_UnTrack(self);
    wait_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int wait_init(Wait *self, PyObject *args, PyObject *kwargs)
{
    PyObject *config;
    if (entry_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "flightrec.record._fastpath.configure() was not called");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "O!", &PyDict_Type, &config)) return -1;
#define TAKE(field) if (strcmp(#field, "dict") && strcmp(#field, "tls_state") && take(config, #field, &self->field) < 0) \
        return -1;
    WAIT_OBJECTS(TAKE)
#undef TAKE
    if (!PyDict_CheckExact(self->by_work) || !PyDict_CheckExact(self->pending) || !Py_IS_TYPE(self->async_slot, &AsyncSlotType)
        || !PyDict_CheckExact(self->rec_dict)) {
        PyErr_SetString(PyExc_TypeError, "Wait config has the wrong types");
        return -1;
    }
    self->vectorcall = wait_call;
    self->enabled = 1;
    return 0;
}

static PyObject *wait_descr_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, obj);
}

static PyMemberDef wait_members[] = {
    {"enabled", T_INT, offsetof(Wait, enabled), 0, "0: every wait takes the Python wrapper"},
    {NULL},
};

static PyTypeObject WaitType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "flightrec.record._fastpath.Wait",
    .tp_basicsize = sizeof(Wait),
    .tp_dealloc = (destructor)wait_dealloc,
    .tp_vectorcall_offset = offsetof(Wait, vectorcall),
    .tp_call = leaf_tp_call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "Work.wait, wrapped: the common waits in C, every other in the Python wrapper.",
    .tp_traverse = (traverseproc)wait_traverse,
    .tp_clear = (inquiry)wait_clear,
    .tp_members = wait_members,
    .tp_getset = leaf_getset,
    .tp_descr_get = wait_descr_get,
    .tp_dictoffset = offsetof(Wait, dict),
    .tp_init = (initproc)wait_init,
    .tp_new = PyType_GenericNew,
};

/* del dict[key] if there, raising nothing (a miss costs no KeyError) */
static void discard(PyObject *dict, PyObject *key)
{
    if (key == NULL) { PyErr_Clear(); return; }
    PyObject *found = PyDict_GetItemWithError(dict, key);
    if (found != NULL && PyDict_DelItem(dict, key) < 0) PyErr_Clear();
    if (found == NULL) PyErr_Clear();
}

/* Recorder.complete_unmeasured for many entries at once: the watchdog's poll found them done (a
 * device stream's ops, or ops of a backend polled one by one). Each is completed with no time (a
 * poll's moment is not the op's end), lets go of its Work and leaves every table, as
 * Recorder._release does: one C loop instead of a Python call per op with the GIL held. */
static PyObject *complete_unmeasured(PyObject *module, PyObject *args)
{
    PyObject *entries, *by_work, *pending, *polled, *slot;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O", &PyList_Type, &entries, &PyDict_Type, &by_work, &PyDict_Type, &pending,
                          &PyDict_Type, &polled, &slot))
        return NULL;
    if (entry_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "complete_unmeasured before configure()");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(entries);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyObject_TypeCheck(PyList_GET_ITEM(entries, i), entry_type)) {
            PyErr_SetString(PyExc_TypeError, "complete_unmeasured: not an Entry");
            return NULL;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *entry = PyList_GET_ITEM(entries, i);
        EntryObject *e = EN(entry);
        if (e->state != ENQUEUED && e->state != STARTED) continue; /* settled meanwhile (failed): as it is */
        e->t_complete_ns = NO_TIME;
        e->state = COMPLETED;
        PyObject *work = e->work;
        Py_INCREF(Py_None);
        e->work = Py_None;
        if (work != NULL && work != Py_None && PyDict_GET_SIZE(by_work) > 0) {
            PyObject *key = PyLong_FromVoidPtr(work);
            discard(by_work, key);
            Py_XDECREF(key);
        }
        Py_XDECREF(work);
        if (Py_IS_TYPE(slot, &AsyncSlotType) && ((AsyncSlot *)slot)->entry == entry) slot_empty((AsyncSlot *)slot);
        PyObject *id = PyLong_FromLongLong(e->id);
        if (PyDict_GET_SIZE(pending) > 0) discard(pending, id);
        discard(polled, id);
        Py_XDECREF(id);
    }
    Py_RETURN_NONE;
}

/* Recorder.poll_works's walk over `polled` (the device and late ops the watchdog polls): each entry
 * sorted, with no Python frame per op, into (stale keys to drop, in-order streams: lists of their
 * entries, oldest first, with no tuple per op; others and misses: (key, entry, Work) tuples).
 * A stream is (group, peer for p2p else -1, device) of an op on a device whose backend completes one
 * stream's Works in issue order (`in_order`: (group, device) -> bool, Recorder._in_order's cache);
 * `misses` are ops whose (group, device) is not in that cache yet: Python sorts them. */
static PyObject *scan_polled(PyObject *module, PyObject *args)
{
    PyObject *polled, *in_order;
    if (!PyArg_ParseTuple(args, "O!O!", &PyDict_Type, &polled, &PyDict_Type, &in_order)) return NULL;
    if (entry_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "scan_polled before configure()");
        return NULL;
    }
    PyObject *stale = PyList_New(0), *streams = PyDict_New(), *others = PyList_New(0), *misses = PyList_New(0);
    if (stale == NULL || streams == NULL || others == NULL || misses == NULL) goto fail;
    Py_ssize_t pos = 0;
    PyObject *key, *entry;
    /* consecutive ops are mostly of one group and device, one stream: looked up once per run */
    PyObject *last_group = NULL, *last_device = NULL, *last_ordered = NULL, *last_ops = NULL;
    long long last_peer = 0;
    while (PyDict_Next(polled, &pos, &key, &entry)) {
        if (!PyObject_TypeCheck(entry, entry_type)) {
            PyErr_SetString(PyExc_TypeError, "scan_polled: not an Entry");
            goto fail;
        }
        EntryObject *e = EN(entry);
        PyObject *work = e->work;
        if (work == NULL || work == Py_None || (e->state != ENQUEUED && e->state != STARTED)) {
            if (PyList_Append(stale, key) < 0) goto fail;
            continue;
        }
        int is_cpu = e->device == NULL || !PyUnicode_Check(e->device) || str_equal(e->device, s_cpu);
        PyObject *ordered = NULL;
        if (!is_cpu) {
            if (e->group == last_group && e->device == last_device) {
                ordered = last_ordered;
            } else {
                PyObject *where = PyTuple_Pack(2, e->group, e->device);
                ordered = where ? PyDict_GetItemWithError(in_order, where) : NULL;
                Py_XDECREF(where);
                if (ordered == NULL && PyErr_Occurred()) goto fail;
                last_group = e->group, last_device = e->device, last_ordered = ordered, last_ops = NULL;
            }
        }
        int rc;
        if (is_cpu || ordered == NULL || ordered == Py_False) {
            PyObject *item = PyTuple_Pack(3, key, entry, work);
            rc = item ? PyList_Append(is_cpu || ordered == Py_False ? others : misses, item) : -1;
            Py_XDECREF(item);
        } else {
            int p2p = e->kind != NULL && PyUnicode_Check(e->kind) && PyUnicode_GET_LENGTH(e->kind) == 3;
            long long peer_rank = p2p ? e->peer : -1;
            PyObject *ops = last_ops != NULL && peer_rank == last_peer ? last_ops : NULL;
            if (ops == NULL) {
                PyObject *peer = PyLong_FromLongLong(peer_rank);
                PyObject *stream = peer ? PyTuple_Pack(3, e->group, peer, e->device) : NULL;
                ops = stream ? PyDict_GetItemWithError(streams, stream) : NULL;
                if (stream != NULL && ops == NULL && !PyErr_Occurred()) {
                    ops = PyList_New(0);
                    if (ops != NULL && PyDict_SetItem(streams, stream, ops) < 0) Py_CLEAR(ops);
                    Py_XDECREF(ops); /* the dict holds it */
                }
                Py_XDECREF(stream);
                Py_XDECREF(peer);
                last_ops = ops, last_peer = peer_rank;
            }
            rc = ops ? PyList_Append(ops, entry) : -1; /* its Work is read from it when the bisection asks */
        }
        if (rc < 0) goto fail;
    }
    return Py_BuildValue("(NNNN)", stale, streams, others, misses);
fail:
    Py_XDECREF(stale);
    Py_XDECREF(streams);
    Py_XDECREF(others);
    Py_XDECREF(misses);
    return NULL;
}

/* DeviceTiming.resolve's write (record/device_timing.py `_c_store`): the device times read for op
 * `record_id` into its entry, in one step under the GIL, unless the entry now holds another op or its
 * events were re-recorded since they were read (a training thread reusing it). True when written. */
static PyObject *store_device_times(PyObject *module, PyObject *args)
{
    PyObject *entry, *end;
    long long record_id, start_ns, end_ns = NO_TIME;
    if (!PyArg_ParseTuple(args, "O!LLO", &EntryBaseType, &entry, &record_id, &start_ns, &end)) return NULL;
    if (end != Py_None) {
        end_ns = PyLong_AsLongLong(end);
        if (end_ns == -1 && PyErr_Occurred()) return NULL;
    }
    EntryObject *e = EN(entry);
    if (start_ns == NO_TIME || e->id != record_id || e->timed_start != record_id
        || (end_ns != NO_TIME && e->timed_end != record_id))
        Py_RETURN_FALSE;
    e->t_dev_start_ns = start_ns;
    if (end_ns != NO_TIME) e->t_dev_end_ns = end_ns;
    Py_RETURN_TRUE;
}

/* Recorder.in_flight's filter for the watchdog's timeout check: the pending entries among the values
 * of `tables` (dicts) that were issued before `before_ns`, with no Python frame per op (the tables
 * hold every device op until the watchdog polls it: a Python walk cost ~0.3 µs per op, each tick).
 * An entry in two tables is listed twice; a value that is not an Entry goes back to Python (TypeError). */
static PyObject *issued_before(PyObject *module, PyObject *args)
{
    PyObject *tables;
    long long before_ns;
    if (!PyArg_ParseTuple(args, "O!L", &PyTuple_Type, &tables, &before_ns)) return NULL;
    if (entry_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "issued_before before configure()");
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    for (Py_ssize_t t = 0; t < PyTuple_GET_SIZE(tables); t++) {
        PyObject *table = PyTuple_GET_ITEM(tables, t);
        if (!PyDict_Check(table)) {
            PyErr_SetString(PyExc_TypeError, "issued_before: not a dict");
            goto fail;
        }
        Py_ssize_t pos = 0;
        PyObject *key, *entry;
        while (PyDict_Next(table, &pos, &key, &entry)) {
            if (!PyObject_TypeCheck(entry, entry_type)) {
                PyErr_SetString(PyExc_TypeError, "issued_before: not an Entry");
                goto fail;
            }
            EntryObject *e = EN(entry);
            if ((e->state == ENQUEUED || e->state == STARTED) && e->t_enqueue_ns < before_ns
                && PyList_Append(out, entry) < 0)
                goto fail;
        }
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef module_methods[] = {
    {"issued_before", issued_before, METH_VARARGS,
     "issued_before(tables, before_ns) -> pending entries among the tables' values issued before it"},
    {"configure", configure, METH_VARARGS, "configure(Entry, GroupState, ThreadState): learn their slot layout"},
    {"complete_unmeasured", complete_unmeasured, METH_VARARGS,
     "complete_unmeasured(entries, by_work, pending, polled, async_slot): completed, unmeasured, released"},
    {"scan_polled", scan_polled, METH_VARARGS,
     "scan_polled(polled, in_order) -> (stale keys, streams, others, misses): Recorder.poll_works's walk"},
    {"store_device_times", store_device_times, METH_VARARGS,
     "store_device_times(entry, record_id, start_ns, end_ns_or_None) -> written: DeviceTiming.resolve's write"},
    {NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "flightrec.record._fastpath", "The recorder's hot path in C (optional).", -1, module_methods,
};

#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL;

PyMODINIT_FUNC PyInit__fastpath(void)
{
    INTERN(s_active, "active") INTERN(s_state, "state") INTERN(s_default_pg, "_default_pg")
    INTERN(s_shape, "shape") INTERN(s_dtype, "dtype") INTERN(s_is_cpu, "is_cpu")
    INTERN(s_python, "python") INTERN(s_cpu, "cpu") INTERN(s_empty, "")
    INTERN(s_device, "device") INTERN(s_type, "type") INTERN(s_device_timing, "device_timing") INTERN(s_poll_soon, "poll_soon") INTERN(s_poll_due, "poll_due") INTERN(s_before, "before")
    INTERN(s_waited, "waited")
    INTERN(s_ready, "ready") INTERN(s_record, "record")
    INTERN(s_async_op, "async_op") INTERN(s_is_cuda, "is_cuda") INTERN(s_cuda, "cuda")
    for (int i = 0; i < N_STATES; i++) INTERN(STATE_NAMES[i], STATE_TEXT[i])
    if ((empty_tuple = PyTuple_New(0)) == NULL)
        return NULL;
    if (PyType_Ready(&LeafType) < 0 || PyType_Ready(&WaitType) < 0 || PyType_Ready(&EntryBaseType) < 0
        || PyType_Ready(&GroupBaseType) < 0 || PyType_Ready(&CounterType) < 0 || PyType_Ready(&AsyncSlotType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) return NULL;
    Py_INCREF(&LeafType);
    Py_INCREF(&WaitType);
    Py_INCREF(&EntryBaseType);
    Py_INCREF(&CounterType);
    Py_INCREF(&GroupBaseType);
    Py_INCREF(&AsyncSlotType);
    if (PyModule_AddObject(module, "Leaf", (PyObject *)&LeafType) < 0
        || PyModule_AddObject(module, "Wait", (PyObject *)&WaitType) < 0
        || PyModule_AddObject(module, "EntryBase", (PyObject *)&EntryBaseType) < 0
        || PyModule_AddObject(module, "Counter", (PyObject *)&CounterType) < 0
        || PyModule_AddObject(module, "GroupBase", (PyObject *)&GroupBaseType) < 0
        || PyModule_AddObject(module, "AsyncSlot", (PyObject *)&AsyncSlotType) < 0
        || PyModule_AddIntConstant(module, "SUPPORTED", FASTPATH_SUPPORTED) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
