/* Reads a tensor's shape and dtype and a process group's sequence number straight from PyTorch's C++
 * objects, for the recorder's hot path.
 *
 * Why: after a real collective, torch's Python getters (`.is_cpu`, `.shape`, `.dtype`) and the
 * pybind call `ProcessGroup._get_sequence_number_for_group()` cost the recorder ~2 of its ~4.5 µs
 * per call, which PyTorch's own C++ recorder does not pay (docs/overhead.md). Reading the same
 * values from the C++ objects costs tens of nanoseconds. The price is a build against the installed
 * torch's headers, tied to that exact release: `flightrec build-ext` makes it (flightrec/record/cpp_reader.py),
 * and without it the recorder reads the same values through Python.
 *
 * Only the plain cases are read here, exactly as the Python getters would return them: a tensor of
 * type exactly torch.Tensor or torch.nn.Parameter (a subclass may override `.shape` through
 * __torch_function__), with concrete sizes; a ProcessGroup of exactly PyTorch's own class (a
 * Python subclass may override the counter). Anything else is left to the Python getters.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <algorithm>

#include <pybind11/pybind11.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

namespace {

PyTypeObject *tensor_type = nullptr, *parameter_type = nullptr, *size_type = nullptr, *pg_type = nullptr;

/* The last (shape, dtype) pairs built, by a hash of their content: a training loop sends the same few
 * shapes again and again, and a reused pair costs no allocation. The pairs built are untracked by
 * the garbage collector (the ring keeps each for thousands of calls, so collections would scan them
 * for nothing); they hold only ints and a dtype, so they cannot be part of a cycle. */
constexpr int kCacheSlots = 64;
constexpr size_t kCachedDims = 8;

struct CachedPair {
    PyObject *pair = nullptr;
    int as_tuple = 0;
    c10::ScalarType dtype = c10::ScalarType::Undefined;
    size_t dims = 0;
    int64_t sizes[kCachedDims] = {};
};

CachedPair pair_cache[kCacheSlots];

PyObject *new_pair(c10::IntArrayRef sizes, c10::ScalarType scalar_type, int shape_as_tuple)
{
    Py_ssize_t dims = static_cast<Py_ssize_t>(sizes.size());
    PyObject *shape = shape_as_tuple ? PyTuple_New(dims) : size_type->tp_alloc(size_type, dims);
    if (shape == nullptr) return nullptr;
    for (Py_ssize_t i = 0; i < dims; i++) {
        PyObject *size = PyLong_FromLongLong(sizes[i]);
        if (size == nullptr) {
            Py_DECREF(shape);
            return nullptr;
        }
        PyTuple_SET_ITEM(shape, i, size);
    }
    PyObject *dtype = reinterpret_cast<PyObject *>(torch::getTHPDtype(scalar_type));
    PyObject *pair = PyTuple_Pack(2, shape, dtype);
    if (pair != nullptr) PyObject_GC_UnTrack(shape); /* ints only: no cycle possible */
    Py_DECREF(shape);
    if (pair != nullptr) PyObject_GC_UnTrack(pair);
    return pair;
}

/* The pair for these sizes and dtype: a cached one when the same was asked for lately (new ref). */
PyObject *pair_for(c10::IntArrayRef sizes, c10::ScalarType scalar_type, int shape_as_tuple)
{
    size_t hash = static_cast<size_t>(scalar_type) * 31u + static_cast<size_t>(shape_as_tuple) + sizes.size() * 7u;
    for (int64_t size : sizes) hash = hash * 1000003u ^ static_cast<size_t>(size);
    CachedPair &slot = pair_cache[(hash ^ (hash >> 17)) % kCacheSlots];
    bool cacheable = sizes.size() <= kCachedDims;
    if (cacheable && slot.pair != nullptr && slot.as_tuple == shape_as_tuple && slot.dtype == scalar_type &&
        slot.dims == sizes.size() && std::equal(sizes.begin(), sizes.end(), slot.sizes)) {
        Py_INCREF(slot.pair);
        return slot.pair;
    }
    PyObject *pair = new_pair(sizes, scalar_type, shape_as_tuple);
    if (pair != nullptr && cacheable) {
        Py_INCREF(pair);
        Py_XSETREF(slot.pair, pair);
        slot.as_tuple = shape_as_tuple;
        slot.dtype = scalar_type;
        slot.dims = sizes.size();
        std::copy(sizes.begin(), sizes.end(), slot.sizes);
    }
    return pair;
}

/* 1: *out = (shape, dtype) of a plain tensor (new ref; shape a tuple or a torch.Size as asked) and
 * *device_type = its c10::DeviceType (0: the CPU; the hot path names the others, as `tensor.device.type`
 * does, once per type); -1: not a plain tensor (ask Python). No error is left set. Device tensors are
 * read here too: through torch's getters they cost ~0.6 µs more per op (`.device.type` builds a
 * device object and a string per call). */
int tensor_meta(PyObject *obj, int shape_as_tuple, PyObject **out, int *device_type)
{
    PyTypeObject *type = Py_TYPE(obj);
    if (type != tensor_type && type != parameter_type) return -1;
    try {
        const at::Tensor &tensor = THPVariable_Unpack(obj);
        if (!tensor.defined()) return -1;
        const c10::TensorImpl *impl = tensor.unsafeGetTensorImpl();
        if (impl->has_symbolic_sizes_strides()) return -1;
        caffe2::TypeMeta meta = impl->dtype();  /* a copy: torch 2.1-2.4 declare toScalarType() non-const */
        *out = pair_for(impl->sizes(), meta.toScalarType(), shape_as_tuple);
        if (*out == nullptr) {
            PyErr_Clear();
            return -1;
        }
        *device_type = static_cast<int>(impl->device_type());
        return 1;
    } catch (...) {
        PyErr_Clear();
        return -1;
    }
}


/* ProcessGroup._get_sequence_number_for_group, bound to one group, without pybind's dispatch or
 * the release and retaking of the GIL around it (the counter read takes no lock the GIL guards). */
struct SeqReader {
    PyObject_HEAD
    PyObject *pg_object; /* keeps the group alive while the reader is */
    c10d::ProcessGroup *pg;
    /* The group's default backend, for its type: ProcessGroup::setBackend never replaces the backend
     * of a type once set, so only a change of the default type (checked on every read) moves it. */
    c10::intrusive_ptr<c10d::Backend> *backend;
    c10d::ProcessGroup::BackendType backend_type;
    vectorcallfunc vectorcall;
};

/* What ProcessGroup::getSequenceNumberForGroup() returns, without its map lookup and reference
 * counting on every read. Throws where it throws. */
uint64_t group_counter(SeqReader *reader)
{
    c10d::ProcessGroup::BackendType type = reader->pg->getBackendType();
    if (reader->backend != nullptr && type == reader->backend_type) return (*reader->backend)->getSequenceNumberForGroup();
    uint64_t value = reader->pg->getSequenceNumberForGroup(); /* the checks, and their errors */
    auto *backend = new c10::intrusive_ptr<c10d::Backend>(reader->pg->getDefaultBackend());
    delete reader->backend;
    reader->backend = backend;
    reader->backend_type = type;
    return value;
}

PyObject *seq_reader_call(PyObject *self, PyObject *const *, size_t nargsf, PyObject *kwnames)
{
    if (PyVectorcall_NARGS(nargsf) != 0 || (kwnames != nullptr && PyTuple_GET_SIZE(kwnames) != 0)) {
        PyErr_SetString(PyExc_TypeError, "a sequence-number reader takes no arguments");
        return nullptr;
    }
    try {
        return PyLong_FromUnsignedLongLong(group_counter(reinterpret_cast<SeqReader *>(self)));
    } catch (const std::exception &exc) {
        PyErr_SetString(PyExc_RuntimeError, exc.what());
        return nullptr;
    }
}

void seq_reader_dealloc(PyObject *self)
{
    delete reinterpret_cast<SeqReader *>(self)->backend;
    Py_XDECREF(reinterpret_cast<SeqReader *>(self)->pg_object);
    Py_TYPE(self)->tp_free(self);
}

PyTypeObject SeqReaderType = {PyVarObject_HEAD_INIT(nullptr, 0)};

/* The counter of a SeqReader, for the C hot path without a Python call or int; -2 when `reader` is
 * not one or the read fails (the caller then calls it, which raises the error). */
long long read_seq(PyObject *reader)
{
    if (Py_TYPE(reader) != &SeqReaderType) return -2;
    try {
        return static_cast<long long>(group_counter(reinterpret_cast<SeqReader *>(reader)));
    } catch (...) {
        return -2;
    }
}

/* What the C hot path (_fastpath.c) calls, handed over in a capsule; the version is checked there. */
struct PeekApi {
    int version;
    int (*tensor_meta)(PyObject *, int, PyObject **, int *);
    long long (*read_seq)(PyObject *);
};

PeekApi peek_api = {3, tensor_meta, read_seq};

PyObject *seq_reader(PyObject *, PyObject *pg)
{
    if (Py_TYPE(pg) != pg_type) Py_RETURN_NONE; /* a subclass may override the counter: keep its method */
    c10d::ProcessGroup *raw = nullptr;
    try {
        raw = pybind11::handle(pg).cast<c10d::ProcessGroup *>();
    } catch (...) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (raw == nullptr) Py_RETURN_NONE;
    SeqReader *reader = PyObject_New(SeqReader, &SeqReaderType);
    if (reader == nullptr) return nullptr;
    Py_INCREF(pg);
    reader->pg_object = pg;
    reader->pg = raw;
    reader->backend = nullptr;
    reader->vectorcall = seq_reader_call;
    return reinterpret_cast<PyObject *>(reader);
}

/* shape_and_dtype(tensor) -> (shape, dtype) for a plain CPU tensor, else None: for tests. */
PyObject *shape_and_dtype(PyObject *, PyObject *tensor)
{
    PyObject *pair = nullptr;
    int device_type = -1;
    if (tensor_meta(tensor, 0, &pair, &device_type) == 1) {
        if (device_type == static_cast<int>(c10::DeviceType::CPU)) return pair;
        Py_DECREF(pair);
    }
    Py_RETURN_NONE;
}

PyObject *configure(PyObject *, PyObject *args)
{
    PyObject *tensor, *parameter, *size, *pg;
    if (!PyArg_ParseTuple(args, "O!O!O!O!", &PyType_Type, &tensor, &PyType_Type, &parameter, &PyType_Type, &size,
                          &PyType_Type, &pg))
        return nullptr;
    if (!PyType_IsSubtype(reinterpret_cast<PyTypeObject *>(size), &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "torch.Size is expected to be a tuple subclass");
        return nullptr;
    }
    PyTypeObject **slots[] = {&tensor_type, &parameter_type, &size_type, &pg_type};
    PyObject *types[] = {tensor, parameter, size, pg};
    for (int i = 0; i < 4; i++) { /* a second call replaces, and lets go of, the types of the first */
        Py_INCREF(types[i]);
        Py_XDECREF(reinterpret_cast<PyObject *>(*slots[i]));
        *slots[i] = reinterpret_cast<PyTypeObject *>(types[i]);
    }
    return PyCapsule_New(&peek_api, "flightrec.record._torchpeek.api", nullptr);
}

PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(torch.Tensor, torch.nn.Parameter, torch.Size, ProcessGroup) -> the hot path's capsule"},
    {"seq_reader", seq_reader, METH_O, "seq_reader(pg) -> a callable reading its counter, or None"},
    {"shape_and_dtype", shape_and_dtype, METH_O, "shape_and_dtype(tensor) -> (shape, dtype) or None"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "flightrec.record._torchpeek", "torch's C++ objects read directly.", -1,
                          methods};

} // namespace

PyMODINIT_FUNC PyInit__torchpeek(void)
{
    SeqReaderType.tp_name = "flightrec.record._torchpeek.SeqReader";
    SeqReaderType.tp_basicsize = sizeof(SeqReader);
    SeqReaderType.tp_dealloc = seq_reader_dealloc;
    SeqReaderType.tp_vectorcall_offset = offsetof(SeqReader, vectorcall);
    SeqReaderType.tp_call = PyVectorcall_Call;
    SeqReaderType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
    SeqReaderType.tp_doc = "A process group's sequence-number counter, read without pybind.";
    if (PyType_Ready(&SeqReaderType) < 0) return nullptr;
    return PyModule_Create(&module_def);
}
