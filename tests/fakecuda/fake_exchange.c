/* A test producer of DLPack's C exchange API (the struct torch.Tensor and cuda.core's
 * StridedMemoryView expose as __dlpack_c_exchange_api__), so the CPU suite can check how the
 * dispatch core reads such tensors: fields, flags, the producer's stream, an export that fails,
 * and that every exported tensor's deleter runs exactly once.
 *
 * fake_exchange.Tensor(ptr, shape, strides=None, code=2, bits=32, lanes=1, device_type=2,
 *                      device_id=0, flags=0, fail=False)   (a Python subclass may say requires_grad)
 * fake_exchange.set_stream(handle, fail=False)   current_work_stream's answer (0: NULL)
 * fake_exchange.live() / exported()              managed tensors alive now / ever made
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../vyre_cuda/_dlpack.h"

typedef struct {
    PyObject_HEAD
    uintptr_t ptr;
    int ndim;
    int64_t shape[8];
    int64_t strides[8];
    int has_strides;
    int code, bits, lanes, device_type, device_id, fail;
    uint64_t flags;
} Tensor;

typedef struct {
    vyre_DLManagedTensorVersioned managed;
    int64_t shape[8];
    int64_t strides[8];
} Export;

static long live_count = 0, exported_count = 0;
static uintptr_t current_stream = 0;
static int stream_fails = 0;

static void deleter(vyre_DLManagedTensorVersioned* t) {
    PyGILState_STATE g = PyGILState_Ensure();
    Py_XDECREF((PyObject*)t->manager_ctx);
    live_count--;
    free(t);
    PyGILState_Release(g);
}

static int from_py_object(void* obj, vyre_DLManagedTensorVersioned** out) {
    Tensor* self = (Tensor*)obj;
    if (self->fail) {
        PyErr_SetString(PyExc_RuntimeError, "fake_exchange: this tensor refuses export");
        return -1;
    }
    Export* e = (Export*)calloc(1, sizeof(Export));
    if (!e) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(e->shape, self->shape, sizeof(e->shape));
    memcpy(e->strides, self->strides, sizeof(e->strides));
    e->managed.version.major = 1;
    e->managed.version.minor = 3;
    e->managed.manager_ctx = obj;
    Py_INCREF((PyObject*)obj);
    e->managed.deleter = deleter;
    e->managed.flags = self->flags;
    vyre_DLTensor* t = &e->managed.dl_tensor;
    t->data = (void*)self->ptr;
    t->device.device_type = self->device_type;
    t->device.device_id = self->device_id;
    t->ndim = self->ndim;
    t->dtype.code = (uint8_t)self->code;
    t->dtype.bits = (uint8_t)self->bits;
    t->dtype.lanes = (uint16_t)self->lanes;
    t->shape = e->shape;
    t->strides = self->has_strides ? e->strides : NULL;
    t->byte_offset = 0;
    live_count++;
    exported_count++;
    *out = &e->managed;
    return 0;
}

static int work_stream(int32_t device_type, int32_t device_id, void** out) {
    (void)device_type;
    (void)device_id;
    if (stream_fails) {
        PyErr_SetString(PyExc_RuntimeError, "fake_exchange: no current stream");
        return -1;
    }
    *out = (void*)current_stream;
    return 0;
}

static vyre_DLPackExchangeAPI api = {
    {{1, 3}, NULL}, NULL, from_py_object, NULL, NULL, work_stream,
};

static int read_shape(PyObject* seq, int64_t* dst, int* n) {
    PyObject* fast = PySequence_Fast(seq, "shape and strides must be sequences");
    if (!fast) return -1;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(fast);
    if (len > 8) {
        Py_DECREF(fast);
        PyErr_SetString(PyExc_ValueError, "at most 8 dimensions");
        return -1;
    }
    for (Py_ssize_t i = 0; i < len; i++) dst[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
    Py_DECREF(fast);
    *n = (int)len;
    return PyErr_Occurred() ? -1 : 0;
}

static int Tensor_init(Tensor* self, PyObject* args, PyObject* kw) {
    static char* names[] = {"ptr", "shape", "strides", "code", "bits", "lanes", "device_type", "device_id",
                            "flags", "fail", NULL};
    unsigned long long ptr = 0, flags = 0;
    PyObject *shape = NULL, *strides = Py_None;
    self->code = 2;
    self->bits = 32;
    self->lanes = 1;
    self->device_type = 2;
    self->device_id = 0;
    self->fail = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "KO|OiiiiiKp", names, &ptr, &shape, &strides, &self->code, &self->bits,
                                     &self->lanes, &self->device_type, &self->device_id, &flags, &self->fail))
        return -1;
    self->ptr = (uintptr_t)ptr;
    self->flags = flags;
    if (read_shape(shape, self->shape, &self->ndim) < 0) return -1;
    self->has_strides = strides != Py_None;
    if (self->has_strides) {
        int n = 0;
        if (read_shape(strides, self->strides, &n) < 0) return -1;
        if (n != self->ndim) {
            PyErr_SetString(PyExc_ValueError, "strides must match shape");
            return -1;
        }
    }
    return 0;
}

/* __dlpack__ / __dlpack_device__ as well, as torch and cuda.core have: the reader exports a tensor
 * through them when the exchange API fails it (its export, or the current stream) */
static void capsule_destructor(PyObject* capsule) {
    if (PyCapsule_IsValid(capsule, "dltensor_versioned")) {
        vyre_DLManagedTensorVersioned* t = PyCapsule_GetPointer(capsule, "dltensor_versioned");
        if (t && t->deleter) t->deleter(t);
    }
}

static PyObject* Tensor_dlpack(PyObject* self, PyObject* args, PyObject* kw) {
    vyre_DLManagedTensorVersioned* t = NULL;
    (void)args;
    (void)kw;
    if (from_py_object(self, &t) < 0) return NULL;
    return PyCapsule_New(t, "dltensor_versioned", capsule_destructor);
}

static PyObject* Tensor_dlpack_device(PyObject* self, PyObject* unused) {
    (void)unused;
    return Py_BuildValue("(ii)", ((Tensor*)self)->device_type, ((Tensor*)self)->device_id);
}

static PyMethodDef tensor_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))Tensor_dlpack, METH_VARARGS | METH_KEYWORDS, NULL},
    {"__dlpack_device__", Tensor_dlpack_device, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

/* a buffer protocol that refuses, as CuPy's arrays have: the core must not take it for a host
 * buffer, nor pay the refusal on every dispatch */
static int Tensor_getbuffer(PyObject* self, Py_buffer* view, int flags) {
    (void)self;
    (void)view;
    (void)flags;
    PyErr_SetString(PyExc_TypeError, "fake_exchange.Tensor: no implicit host view");
    return -1;
}

static PyBufferProcs tensor_buffer = {Tensor_getbuffer, NULL};

static PyTypeObject TensorType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fake_exchange.Tensor",
    .tp_basicsize = sizeof(Tensor),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Tensor_init,
    .tp_methods = tensor_methods,
    .tp_as_buffer = &tensor_buffer,
};

static PyObject* set_stream(PyObject* m, PyObject* args, PyObject* kw) {
    static char* names[] = {"handle", "fail", NULL};
    unsigned long long handle = 0;
    int fail = 0;
    (void)m;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "K|p", names, &handle, &fail)) return NULL;
    current_stream = (uintptr_t)handle;
    stream_fails = fail;
    Py_RETURN_NONE;
}

static PyObject* live(PyObject* m, PyObject* unused) {
    (void)m;
    (void)unused;
    return PyLong_FromLong(live_count);
}

static PyObject* exported(PyObject* m, PyObject* unused) {
    (void)m;
    (void)unused;
    return PyLong_FromLong(exported_count);
}

static PyMethodDef methods[] = {
    {"set_stream", (PyCFunction)(void (*)(void))set_stream, METH_VARARGS | METH_KEYWORDS, NULL},
    {"live", live, METH_NOARGS, NULL},
    {"exported", exported, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "fake_exchange", NULL, -1, methods};

PyMODINIT_FUNC PyInit_fake_exchange(void) {
    if (PyType_Ready(&TensorType) < 0) return NULL;
    PyObject* cap = PyCapsule_New(&api, "dlpack_exchange_api", NULL);
    if (!cap || PyDict_SetItemString(TensorType.tp_dict, "__dlpack_c_exchange_api__", cap) < 0) return NULL;
    Py_DECREF(cap);
    PyType_Modified(&TensorType);
    PyObject* m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&TensorType);
    if (PyModule_AddObject(m, "Tensor", (PyObject*)&TensorType) < 0) return NULL;
    return m;
}
