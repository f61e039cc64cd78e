// The floor of a compiled front end (benchmarks/native_floor/run.py builds and times it): a C-level lazy array whose binary operator builds an op node
// (interned structural key, merged leaf tuple, flags) and registers the result as pending (a
// weakref with a callback in a dict), as fusetree's Python operator does.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

typedef struct {
    PyObject_HEAD
    PyObject *op, *dtype, *shape, *args, *leaves, *device;
    Py_ssize_t key, uid, flags, lo;
    unsigned long long mask;
} Node;

static PyTypeObject NodeType;
static PyObject *KEYS, *PENDING, *RULES, *DROP;
static Py_ssize_t UID = 1;

static void Node_dealloc(Node *n) {
    Py_XDECREF(n->op); Py_XDECREF(n->dtype); Py_XDECREF(n->shape); Py_XDECREF(n->args);
    Py_XDECREF(n->leaves); Py_XDECREF(n->device);
    Py_TYPE(n)->tp_free((PyObject *)n);
}
static PyMemberDef Node_members[] = {
    {"op", T_OBJECT, offsetof(Node, op), READONLY, NULL},
    {"shape", T_OBJECT, offsetof(Node, shape), READONLY, NULL},
    {"leaves", T_OBJECT, offsetof(Node, leaves), READONLY, NULL},
    {"key", T_PYSSIZET, offsetof(Node, key), READONLY, NULL},
    {NULL}};
static PyTypeObject NodeType = {PyVarObject_HEAD_INIT(NULL, 0).tp_name = "floor.Node", .tp_basicsize = sizeof(Node),
    .tp_dealloc = (destructor)Node_dealloc, .tp_flags = Py_TPFLAGS_DEFAULT, .tp_members = Node_members};

typedef struct {
    PyObject_HEAD
    Node *node;
    PyObject *pref;
    PyObject *weaklist;
} Arr;
static PyTypeObject ArrType;

static Py_ssize_t intern(PyObject *t) {
    PyObject *k = PyDict_GetItemWithError(KEYS, t);
    if (k) return PyLong_AsSsize_t(k);
    Py_ssize_t v = PyDict_GET_SIZE(KEYS);
    PyObject *pv = PyLong_FromSsize_t(v);
    PyDict_SetItem(KEYS, t, pv); Py_DECREF(pv);
    return v;
}

static PyObject *wrap(Node *n) {
    Arr *a = PyObject_New(Arr, &ArrType);
    a->node = n; a->weaklist = NULL;
    a->pref = PyWeakref_NewRef((PyObject *)a, DROP);
    PyObject *id = PyLong_FromVoidPtr(a->pref);
    PyDict_SetItem(PENDING, id, a->pref); Py_DECREF(id);
    return (PyObject *)a;
}

static PyObject *binop(PyObject *name, PyObject *x, PyObject *y) {
    if (Py_TYPE(x) != &ArrType || Py_TYPE(y) != &ArrType) Py_RETURN_NOTIMPLEMENTED;
    Node *a = ((Arr *)x)->node, *b = ((Arr *)y)->node;
    if (a->shape != b->shape && PyObject_RichCompareBool(a->shape, b->shape, Py_EQ) != 1) Py_RETURN_NOTIMPLEMENTED;
    PyObject *rk = PyTuple_Pack(3, name, a->dtype, b->dtype);
    PyObject *out = PyDict_GetItemWithError(RULES, rk);
    Py_DECREF(rk);
    if (!out) Py_RETURN_NOTIMPLEMENTED;
    PyObject *la = PyTuple_GET_SIZE(a->leaves) ? (Py_INCREF(a->leaves), a->leaves) : PyTuple_Pack(1, (PyObject *)a);
    PyObject *lb = PyTuple_GET_SIZE(b->leaves) ? (Py_INCREF(b->leaves), b->leaves) : PyTuple_Pack(1, (PyObject *)b);
    PyObject *leaves = PySequence_Concat(la, lb);
    Py_DECREF(la); Py_DECREF(lb);
    PyObject *ka = PyLong_FromSsize_t(a->key), *kb = PyLong_FromSsize_t(b->key);
    PyObject *ck = PyTuple_Pack(2, ka, kb);
    PyObject *no_attrs = PyTuple_New(0);
    PyObject *kt = PyTuple_Pack(5, name, out, no_attrs, ck, Py_None);
    Py_DECREF(ka); Py_DECREF(kb); Py_DECREF(ck); Py_DECREF(no_attrs);
    Node *n = PyObject_New(Node, &NodeType);
    n->key = intern(kt); Py_DECREF(kt);
    Py_INCREF(name); n->op = name; Py_INCREF(out); n->dtype = out; Py_INCREF(a->shape); n->shape = a->shape;
    n->args = PyTuple_Pack(2, (PyObject *)a, (PyObject *)b); n->leaves = leaves;
    Py_INCREF(a->device); n->device = a->device;
    n->uid = UID++; n->flags = (a->flags > b->flags ? a->flags : b->flags) + 256;
    n->lo = a->lo < b->lo ? a->lo : b->lo; n->mask = a->mask | b->mask;
    return wrap(n);
}

static PyObject *S_mul, *S_add;
static PyObject *Arr_mul(PyObject *x, PyObject *y) { return binop(S_mul, x, y); }
static PyObject *Arr_add(PyObject *x, PyObject *y) { return binop(S_add, x, y); }
static void Arr_dealloc(Arr *a) {
    if (a->weaklist) PyObject_ClearWeakRefs((PyObject *)a);
    Py_XDECREF(a->pref); Py_DECREF(a->node);
    PyObject_Free(a);
}
static PyNumberMethods Arr_num = {.nb_multiply = Arr_mul, .nb_add = Arr_add};
static PyTypeObject ArrType = {PyVarObject_HEAD_INIT(NULL, 0).tp_name = "floor.Arr", .tp_basicsize = sizeof(Arr),
    .tp_dealloc = (destructor)Arr_dealloc, .tp_flags = Py_TPFLAGS_DEFAULT, .tp_as_number = &Arr_num,
    .tp_weaklistoffset = offsetof(Arr, weaklist)};

static PyObject *leaf(PyObject *self, PyObject *args) {
    PyObject *dtype, *shape, *device;
    if (!PyArg_ParseTuple(args, "OOO", &dtype, &shape, &device)) return NULL;
    Node *n = PyObject_New(Node, &NodeType);
    Py_INCREF(dtype); Py_INCREF(shape); Py_INCREF(device);
    n->op = PyUnicode_FromString("buffer"); n->dtype = dtype; n->shape = shape; n->device = device;
    n->args = PyTuple_New(0); n->leaves = PyTuple_New(0);
    n->uid = UID++; n->key = n->uid + 1000000; n->flags = 0; n->lo = 1LL << 62; n->mask = 1ULL << (n->uid % 64);
    Arr *a = PyObject_New(Arr, &ArrType); a->node = n; a->pref = NULL; a->weaklist = NULL;
    return (PyObject *)a;
}
static PyObject *drop(PyObject *self, PyObject *ref) {
    PyObject *id = PyLong_FromVoidPtr(ref);
    if (PyDict_DelItem(PENDING, id) < 0) PyErr_Clear();
    Py_DECREF(id);
    Py_RETURN_NONE;
}
static PyMethodDef methods[] = {{"leaf", leaf, METH_VARARGS, NULL}, {"drop", drop, METH_O, NULL}, {NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "floor", NULL, -1, methods};
PyMODINIT_FUNC PyInit_floor(void) {
    if (PyType_Ready(&NodeType) < 0 || PyType_Ready(&ArrType) < 0) return NULL;
    PyObject *m = PyModule_Create(&mod);
    KEYS = PyDict_New(); PENDING = PyDict_New(); RULES = PyDict_New();
    S_mul = PyUnicode_InternFromString("multiply"); S_add = PyUnicode_InternFromString("add");
    PyModule_AddObject(m, "KEYS", KEYS); Py_INCREF(KEYS);
    PyModule_AddObject(m, "PENDING", PENDING); Py_INCREF(PENDING);
    PyModule_AddObject(m, "RULES", RULES); Py_INCREF(RULES);
    DROP = PyObject_GetAttrString(m, "drop");
    return m;
}
