/* The stand-in device's event as a C type (benchmarks/standin.py builds it): the same behaviour as
 * standin.StandinEvent, with record() a C method as torch.Event's is (torch/csrc/Event.cpp,
 * THPEvent_record), so the benchmark does not bill a Python frame per record to flightrec's device path.
 * What it does not model: cudaEventRecord, nor torch's argument parsing and current-stream lookup. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <time.h>

typedef struct {
    PyObject_HEAD
    long long t_ns; /* -1: not recorded */
} Event;

static long long created = 0;

static PyObject *event_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *device = NULL;
    if (!PyArg_ParseTuple(args, "|O", &device)) return NULL;
    Event *self = (Event *)type->tp_alloc(type, 0);
    if (self != NULL) {
        self->t_ns = -1;
        created++;
    }
    return (PyObject *)self;
}

static PyObject *event_record(Event *self, PyObject *unused)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    self->t_ns = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    Py_RETURN_NONE;
}

static PyObject *event_query(Event *self, PyObject *unused)
{
    return PyBool_FromLong(self->t_ns >= 0);
}

static PyObject *event_synchronize(Event *self, PyObject *unused)
{
    Py_RETURN_NONE;
}

static PyTypeObject EventType;

static PyObject *event_elapsed_time(Event *self, PyObject *end)
{
    if (!PyObject_TypeCheck(end, &EventType)) {
        PyErr_SetString(PyExc_TypeError, "elapsed_time: the end must be a stand-in event");
        return NULL;
    }
    long long until = ((Event *)end)->t_ns;
    if (self->t_ns < 0 || until < 0) {
        PyErr_SetString(PyExc_ValueError, "both events must be recorded before calculating elapsed time");
        return NULL;
    }
    return PyFloat_FromDouble((double)(until - self->t_ns) / 1e6);
}

static PyMethodDef event_methods[] = {
    {"record", (PyCFunction)event_record, METH_NOARGS, NULL},
    {"query", (PyCFunction)event_query, METH_NOARGS, NULL},
    {"synchronize", (PyCFunction)event_synchronize, METH_NOARGS, NULL},
    {"elapsed_time", (PyCFunction)event_elapsed_time, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject EventType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "standin_event.StandinEvent",
    .tp_basicsize = sizeof(Event),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = event_new,
    .tp_methods = event_methods,
};

static PyObject *events_created(PyObject *module, PyObject *unused)
{
    return PyLong_FromLongLong(created);
}

static PyMethodDef module_methods[] = {
    {"created", events_created, METH_NOARGS, "how many stand-in events were made"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "standin_event", NULL, -1, module_methods};

PyMODINIT_FUNC PyInit_standin_event(void)
{
    if (PyType_Ready(&EventType) < 0) return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) return NULL;
    Py_INCREF(&EventType);
    if (PyModule_AddObject(module, "StandinEvent", (PyObject *)&EventType) < 0) {
        Py_DECREF(&EventType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
