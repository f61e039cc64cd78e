/* fusetree._native: the front end's hottest paths in C (optional; the pure-Python versions in
 * fusetree/ir/node.py and fusetree/frontend/array.py are the definition and the fallback).
 *
 * What is here, each doing exactly what its Python twin does on its fast path:
 *   make_op(op, args, dtype, shape, device, attrs=())  ir.node.make_op (merge_leaves' common
 *                                                      two-operand cases too; the rest in Python)
 *   make_float(value)                                  ir.node.make_scalar for a Python float
 *   wrap(node)                                         frontend.array.wrap
 *   operator(name, kind, fallback)                     an Array operator / one-operand function:
 *       the memoized-rule fast path of frontend.array._binary / _unary / unary_function, calling
 *       ``fallback`` (the Python version) for anything else. While deferred stores are queued it
 *       shows buffer operands to the queue first (frontend.array._watch's job).
 *
 * The module imports nothing from fusetree: ``setup_nodes`` and ``setup_arrays`` hand it the
 * classes, dicts and functions it uses, and it writes the Python classes' __slots__ directly (by
 * the member descriptors' offsets). Nodes and arrays built here are ordinary instances of those
 * classes. Set FUSETREE_NATIVE=0 to run without it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#define SLOT(o, off) (*(PyObject **)((char *)(o) + (off)))

/* ------------------------------------------------------------------------------------------ */
/* state from setup_nodes */

static PyTypeObject *NodeT, *ScalarT;
static Py_ssize_t N_args, N_attrs, N_device, N_dtype, N_flags, N_key, N_leaves, N_lo, N_mask,
    N_memo, N_op, N_shape, N_uid, S_value, S_weak;
static PyObject *KEYS;          /* ir.node._KEYS: structural tuple -> int */
static PyObject *INTERN;        /* ir.node.intern_key (a miss: locks, appends the description) */
static PyObject *MERGE;         /* ir.node.merge_leaves (shared leaves) */
static PyObject *VERIFYFN;      /* ir.node.verify */
static PyObject *MAKE_OP_PY;    /* ir.node.make_op (the Python definition) */
static PyObject *NODE_GLOBALS;  /* ir.node's namespace: VERIFY, WATCH */
static PyObject *UIDS;          /* ir.node._uids (itertools.count) */
static PyObject *FLOAT_DT, *FLOAT_KEY;
#define LO_NONE_VALUE (1LL << 62) /* a node's ``lo`` with no op node below it (ir.node: 1 << 62) */
static PyObject *LO_NONE;         /* the same as a Python int */
static long long FLAG_BITS, ONE_LEVEL, F_REDUCE, F_EXPAND;
static PyObject *EMPTY, *EMPTY_STR;
static PyObject *S_buffer, *S_matmul, *S_scalar, *S_reduce, *S_expand, *S_VERIFY, *S_WATCH, *S_TAPE,
    *S_current, *S_fuse;

/* state from setup_arrays */
static PyTypeObject *ArrayT;
static Py_ssize_t A_base, A_node, A_pmark, A_pref, A_views;
static PyObject *DROP; /* this module's drop (the pending arrays' weak-reference callback) */
static PyObject *PENDING, *REALIZE, *ARRAY_GLOBALS, *CONFIG_GLOBALS, *RULES1, *RULES2,
    *MAKE_SCALAR_PY;
static long long TOO_DEEP;
static long long EXACT_INT;

static Py_ssize_t
slot_offset(PyTypeObject *t, const char *name)
{
    PyObject *d = PyObject_GetAttrString((PyObject *)t, name);
    if (d == NULL)
        return -1;
    if (Py_TYPE(d) != &PyMemberDescr_Type) {
        PyErr_Format(PyExc_TypeError, "%s.%s is not a __slots__ member", t->tp_name, name);
        Py_DECREF(d);
        return -1;
    }
    PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
    Py_ssize_t off = m->offset;
    Py_DECREF(d);
    if (m->type != T_OBJECT_EX) {
        PyErr_Format(PyExc_TypeError, "%s.%s: unexpected member type", t->tp_name, name);
        return -1;
    }
    return off;
}

static int
get_ll(PyObject *dict, const char *name, long long *out)
{
    PyObject *v = PyDict_GetItemString(dict, name); /* borrowed */
    if (v == NULL) {
        PyErr_Format(PyExc_KeyError, "setup: missing %s", name);
        return -1;
    }
    *out = PyLong_AsLongLong(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static PyObject *
get_obj(PyObject *dict, const char *name)
{
    PyObject *v = PyDict_GetItemString(dict, name);
    if (v == NULL) {
        PyErr_Format(PyExc_KeyError, "setup: missing %s", name);
        return NULL;
    }
    Py_INCREF(v);
    return v;
}

static PyObject *
setup_nodes_impl(PyObject *d)
{
    if (!PyDict_Check(d)) {
        PyErr_SetString(PyExc_TypeError, "setup_nodes takes a dict");
        return NULL;
    }
    PyObject *node = get_obj(d, "Node"), *scalar = get_obj(d, "Scalar");
    if (node == NULL || scalar == NULL)
        return NULL;
    NodeT = (PyTypeObject *)node;
    ScalarT = (PyTypeObject *)scalar;
#define OFF(var, t, name) if ((var = slot_offset(t, name)) < 0) return NULL;
    OFF(N_args, NodeT, "args") OFF(N_attrs, NodeT, "attrs") OFF(N_device, NodeT, "device")
    OFF(N_dtype, NodeT, "dtype") OFF(N_flags, NodeT, "flags") OFF(N_key, NodeT, "key")
    OFF(N_leaves, NodeT, "leaves") OFF(N_lo, NodeT, "lo") OFF(N_mask, NodeT, "mask")
    OFF(N_memo, NodeT, "memo") OFF(N_op, NodeT, "op") OFF(N_shape, NodeT, "shape")
    OFF(N_uid, NodeT, "uid") OFF(S_value, ScalarT, "value") OFF(S_weak, ScalarT, "weak")
    if (!(KEYS = get_obj(d, "KEYS")) || !(INTERN = get_obj(d, "intern_key")) ||
        !(MERGE = get_obj(d, "merge_leaves")) || !(VERIFYFN = get_obj(d, "verify")) ||
        !(MAKE_OP_PY = get_obj(d, "make_op")) || !(NODE_GLOBALS = get_obj(d, "globals")) ||
        !(UIDS = get_obj(d, "uids")) || !(FLOAT_DT = get_obj(d, "FLOAT_DT")) ||
        !(FLOAT_KEY = get_obj(d, "FLOAT_KEY")))
        return NULL;
    if (get_ll(d, "FLAG_BITS", &FLAG_BITS) || get_ll(d, "ONE_LEVEL", &ONE_LEVEL) ||
        get_ll(d, "REDUCE", &F_REDUCE) || get_ll(d, "EXPAND", &F_EXPAND))
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
setup_arrays_impl(PyObject *d)
{
    if (!PyDict_Check(d)) {
        PyErr_SetString(PyExc_TypeError, "setup_arrays takes a dict");
        return NULL;
    }
    PyObject *arr = get_obj(d, "Array");
    if (arr == NULL)
        return NULL;
    ArrayT = (PyTypeObject *)arr;
    OFF(A_base, ArrayT, "_base") OFF(A_node, ArrayT, "_node") OFF(A_pmark, ArrayT, "_pmark")
    OFF(A_pref, ArrayT, "_pref") OFF(A_views, ArrayT, "_views")
#undef OFF
    if (!(PENDING = get_obj(d, "PENDING")) ||
        !(REALIZE = get_obj(d, "realize")) || !(ARRAY_GLOBALS = get_obj(d, "globals")) ||
        !(CONFIG_GLOBALS = get_obj(d, "config_globals")) || !(RULES1 = get_obj(d, "RULES1")) ||
        !(RULES2 = get_obj(d, "RULES2")) || !(MAKE_SCALAR_PY = get_obj(d, "make_scalar")))
        return NULL;
    if (get_ll(d, "TOO_DEEP", &TOO_DEEP) || get_ll(d, "EXACT_INT", &EXACT_INT))
        return NULL;
    Py_RETURN_NONE;
}

/* A failed setup leaves the module unusable (every entry point refuses or falls back), never half set */
static PyObject *
setup_nodes(PyObject *self, PyObject *d)
{
    PyObject *r = setup_nodes_impl(d);
    if (r == NULL) {
        NodeT = ScalarT = NULL;
        ArrayT = NULL;
    }
    return r;
}

static PyObject *
setup_arrays(PyObject *self, PyObject *d)
{
    PyObject *r = NodeT == NULL ? (PyErr_SetString(PyExc_RuntimeError, "setup_nodes first"), NULL)
                                : setup_arrays_impl(d);
    if (r == NULL)
        ArrayT = NULL;
    return r;
}

static int
ready(int arrays)
{
    if (NodeT == NULL || (arrays && ArrayT == NULL)) {
        PyErr_SetString(PyExc_RuntimeError, "fusetree._native is not set up");
        return 0;
    }
    return 1;
}

/* ------------------------------------------------------------------------------------------ */
/* nodes */

static inline int
is_str(PyObject *a, PyObject *b)
{
    /* op names are interned literals almost always: identity first, then equality */
    return a == b || (PyUnicode_Check(a) && PyUnicode_Compare(a, b) == 0);
}

static inline int
node_ok(PyObject *n)
{
    return PyObject_TypeCheck(n, NodeT) && SLOT(n, N_leaves) != NULL && SLOT(n, N_key) != NULL &&
           SLOT(n, N_flags) != NULL && SLOT(n, N_lo) != NULL && SLOT(n, N_mask) != NULL;
}

/* n.leaves or (n,) as a new reference */
static inline PyObject *
leaves_of(PyObject *n)
{
    PyObject *l = SLOT(n, N_leaves);
    if (PyTuple_GET_SIZE(l) > 0) {
        Py_INCREF(l);
        return l;
    }
    return PyTuple_Pack(1, n);
}

static PyObject *
intern(PyObject *t)
{
    PyObject *k = PyDict_GetItemWithError(KEYS, t);
    if (k != NULL) {
        Py_INCREF(k);
        return k;
    }
    if (PyErr_Occurred())
        return NULL;
    return PyObject_CallOneArg(INTERN, t);
}

static inline void
set_slot(PyObject *o, Py_ssize_t off, PyObject *v) /* steals v */
{
    PyObject *old = SLOT(o, off);
    SLOT(o, off) = v;
    Py_XDECREF(old);
}

/* (a.leaves or (a,)) + (b.leaves or (b,)): the leaves of two operands sharing none */
static PyObject *
concat_leaves(PyObject *a, PyObject *b)
{
    PyObject *x = SLOT(a, N_leaves), *y = SLOT(b, N_leaves);
    Py_ssize_t nx = PyTuple_GET_SIZE(x), ny = PyTuple_GET_SIZE(y);
    Py_ssize_t kx = nx ? nx : 1, ky = ny ? ny : 1;
    PyObject *leaves = PyTuple_New(kx + ky);
    if (leaves == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < kx; i++) {
        PyObject *v = nx ? PyTuple_GET_ITEM(x, i) : a;
        Py_INCREF(v);
        PyTuple_SET_ITEM(leaves, i, v);
    }
    for (Py_ssize_t i = 0; i < ky; i++) {
        PyObject *v = ny ? PyTuple_GET_ITEM(y, i) : b;
        Py_INCREF(v);
        PyTuple_SET_ITEM(leaves, kx + i, v);
    }
    return leaves;
}

/* ir.node.merge_leaves(args) in Python: sets *leaves and *sharing (new references); -1 on error */
static int
merge_py(PyObject *args, PyObject **leaves, PyObject **sharing)
{
    PyObject *r = PyObject_CallOneArg(MERGE, args);
    if (r == NULL)
        return -1;
    *leaves = PyTuple_GET_ITEM(r, 0);
    *sharing = PyTuple_GET_ITEM(r, 1);
    Py_INCREF(*leaves);
    Py_INCREF(*sharing);
    Py_DECREF(r);
    return 0;
}

static PyObject *
iota(Py_ssize_t n, Py_ssize_t start)
{
    PyObject *t = PyTuple_New(n - start);
    if (t == NULL)
        return NULL;
    for (Py_ssize_t i = start; i < n; i++) {
        PyObject *v = PyLong_FromSsize_t(i);
        if (v == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i - start, v);
    }
    return t;
}

static Py_ssize_t
find(PyObject *t, Py_ssize_t n, PyObject *x) /* identity: nodes compare by identity */
{
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyTuple_GET_ITEM(t, i) == x)
            return i;
    return -1;
}

/* ir.node.merge_leaves for two operands whose Bloom masks overlap, its common cases: b a leaf of a's
 * tree, b's leaves ending a's, b with at most 8 leaves. Sets *leaves and *sharing (new references)
 * and returns 1; 0 when the Python definition must run; -1 on error. */
static int
merge2(PyObject *a, PyObject *b, PyObject **leaves, PyObject **sharing)
{
    PyObject *first = leaves_of(a);
    if (first == NULL)
        return -1;
    Py_ssize_t n = PyTuple_GET_SIZE(first);
    PyObject *second = SLOT(b, N_leaves);
    Py_ssize_t k = PyTuple_GET_SIZE(second);
    PyObject *m0 = NULL, *m1 = NULL;
    if (k == 0) { /* (x*y) + x: a tree and one of its own leaves */
        Py_ssize_t j = find(first, n, b);
        if (j < 0) { /* a Bloom false positive */
            Py_DECREF(first);
            *leaves = concat_leaves(a, b);
            if (*leaves == NULL)
                return -1;
            Py_INCREF(Py_None);
            *sharing = Py_None;
            return 1;
        }
        m0 = iota(n, 0);
        m1 = m0 ? Py_BuildValue("(n)", j) : NULL;
    } else if (k <= n) {
        for (Py_ssize_t i = 0; i < k; i++)
            if (PyTuple_GET_ITEM(first, n - k + i) != PyTuple_GET_ITEM(second, i))
                goto small;
        m0 = iota(n, 0); /* b's tree ends a's (evaluate(h, c), h = o * tanh(c)) */
        m1 = m0 ? iota(n, n - k) : NULL;
    } else {
        goto small;
    }
    if (m1 == NULL)
        goto fail;
    *sharing = PyTuple_Pack(2, m0, m1);
    Py_DECREF(m0);
    Py_DECREF(m1);
    if (*sharing == NULL) {
        Py_DECREF(first);
        return -1;
    }
    *leaves = first;
    return 1;
small:
    if (k > 8) {
        Py_DECREF(first);
        return 0;
    }
    {
        PyObject *merged = PyTuple_New(n + k), *where = PyTuple_New(k);
        if (merged == NULL || where == NULL) {
            Py_XDECREF(merged);
            Py_XDECREF(where);
            goto fail;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_INCREF(PyTuple_GET_ITEM(first, i));
            PyTuple_SET_ITEM(merged, i, PyTuple_GET_ITEM(first, i));
        }
        Py_ssize_t m = n;
        for (Py_ssize_t i = 0; i < k; i++) {
            PyObject *leaf = PyTuple_GET_ITEM(second, i);
            Py_ssize_t j = find(merged, m, leaf);
            if (j < 0) {
                j = m++;
                Py_INCREF(leaf);
                PyTuple_SET_ITEM(merged, j, leaf);
            }
            PyObject *v = PyLong_FromSsize_t(j);
            if (v == NULL) {
                Py_DECREF(merged); /* (unfilled items are NULL: tupledealloc skips them) */
                Py_DECREF(where);
                goto fail;
            }
            PyTuple_SET_ITEM(where, i, v);
        }
        Py_DECREF(first);
        if (m < n + k && _PyTuple_Resize(&merged, m) < 0) {
            Py_DECREF(where);
            return -1;
        }
        *leaves = merged;
        if (m == n + k) { /* a Bloom false positive */
            Py_DECREF(where);
            Py_INCREF(Py_None);
            *sharing = Py_None;
            return 1;
        }
        m0 = iota(n, 0);
        *sharing = m0 ? PyTuple_Pack(2, m0, where) : NULL;
        Py_XDECREF(m0);
        Py_DECREF(where);
        if (*sharing == NULL) {
            Py_CLEAR(*leaves);
            return -1;
        }
        return 1;
    }
fail:
    Py_XDECREF(m0);
    Py_XDECREF(m1);
    Py_DECREF(first);
    return -1;
}

/* the op node; NULL with an exception set on error. Arguments are borrowed. */
static PyObject *
make_op_c(PyObject *op, PyObject *args, PyObject *dtype, PyObject *shape, PyObject *device,
          PyObject *attrs)
{
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    PyObject *leaves = NULL, *sharing = NULL, *ckeys = NULL;
    long long flags, lo;
    unsigned long long mask;
    for (Py_ssize_t i = 0; i < n; i++)
        if (!node_ok(PyTuple_GET_ITEM(args, i)))
            return PyObject_Vectorcall(MAKE_OP_PY, (PyObject *[]){op, args, dtype, shape, device, attrs}, 6, NULL);
    if (n == 2) {
        PyObject *a0 = PyTuple_GET_ITEM(args, 0), *a1 = PyTuple_GET_ITEM(args, 1);
        unsigned long long m0 = PyLong_AsUnsignedLongLong(SLOT(a0, N_mask));
        unsigned long long m1 = PyLong_AsUnsignedLongLong(SLOT(a1, N_mask));
        long long f0 = PyLong_AsLongLong(SLOT(a0, N_flags)), f1 = PyLong_AsLongLong(SLOT(a1, N_flags));
        long long l0 = PyLong_AsLongLong(SLOT(a0, N_lo)), l1 = PyLong_AsLongLong(SLOT(a1, N_lo));
        if (PyErr_Occurred())
            return NULL;
        if (m0 & m1) { /* a leaf may be shared: the common cases here, the rest in Python */
            int done = merge2(a0, a1, &leaves, &sharing);
            if (done < 0 || (!done && merge_py(args, &leaves, &sharing) < 0))
                return NULL;
        } else {
            leaves = concat_leaves(a0, a1);
            if (leaves == NULL)
                return NULL;
            sharing = Py_None;
            Py_INCREF(sharing);
        }
        ckeys = PyTuple_Pack(2, SLOT(a0, N_key), SLOT(a1, N_key));
        flags = ((f0 | f1) & FLAG_BITS) | (((f0 > f1 ? f0 : f1) & ~FLAG_BITS) + ONE_LEVEL);
        lo = l0 < l1 ? l0 : l1;
        mask = m0 | m1;
    } else {
        if (n == 1) {
            leaves = leaves_of(PyTuple_GET_ITEM(args, 0));
            if (leaves == NULL)
                return NULL;
            sharing = Py_None;
            Py_INCREF(sharing);
        } else if (merge_py(args, &leaves, &sharing) < 0) {
            return NULL;
        }
        ckeys = PyTuple_New(n);
        if (ckeys == NULL)
            goto fail;
        long long all = 0, deepest = 0;
        lo = LO_NONE_VALUE;
        mask = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *a = PyTuple_GET_ITEM(args, i);
            long long f = PyLong_AsLongLong(SLOT(a, N_flags)), l = PyLong_AsLongLong(SLOT(a, N_lo));
            mask |= PyLong_AsUnsignedLongLong(SLOT(a, N_mask));
            if (PyErr_Occurred())
                goto fail;
            all |= f;
            if (f > deepest)
                deepest = f;
            if (l < lo)
                lo = l;
            Py_INCREF(SLOT(a, N_key));
            PyTuple_SET_ITEM(ckeys, i, SLOT(a, N_key));
        }
        flags = (all & FLAG_BITS) | ((deepest & ~FLAG_BITS) + ONE_LEVEL);
    }
    if (ckeys == NULL)
        goto fail;
    if (is_str(op, S_reduce))
        flags |= F_REDUCE;
    else if (is_str(op, S_expand))
        flags |= F_EXPAND;
    PyObject *kt = PyTuple_Pack(5, op, dtype, attrs, ckeys, sharing);
    if (kt == NULL)
        goto fail;
    PyObject *key = intern(kt);
    Py_DECREF(kt);
    if (key == NULL)
        goto fail;
    PyObject *node = NodeT->tp_alloc(NodeT, 0);
    PyObject *uid = node ? PyIter_Next(UIDS) : NULL;
    long long u = uid ? PyLong_AsLongLong(uid) : -1;
    PyObject *pflags = PyLong_FromLongLong(flags), *plo = PyLong_FromLongLong(lo < u ? lo : u);
    PyObject *pmask = PyLong_FromUnsignedLongLong(mask);
    if (node == NULL || uid == NULL || PyErr_Occurred() || !pflags || !plo || !pmask) {
        Py_XDECREF(node); Py_XDECREF(uid); Py_XDECREF(pflags); Py_XDECREF(plo); Py_XDECREF(pmask);
        Py_DECREF(key);
        goto fail;
    }
    Py_INCREF(op); Py_INCREF(dtype); Py_INCREF(shape); Py_INCREF(args); Py_INCREF(attrs);
    Py_INCREF(device); Py_INCREF(Py_None);
    set_slot(node, N_op, op);
    set_slot(node, N_dtype, dtype);
    set_slot(node, N_shape, shape);
    set_slot(node, N_args, args);
    set_slot(node, N_attrs, attrs);
    set_slot(node, N_key, key);
    set_slot(node, N_leaves, leaves);
    set_slot(node, N_uid, uid);
    set_slot(node, N_device, device);
    set_slot(node, N_flags, pflags);
    set_slot(node, N_lo, plo);
    set_slot(node, N_mask, pmask);
    set_slot(node, N_memo, Py_None);
    Py_DECREF(ckeys);
    Py_DECREF(sharing);
    PyObject *verify = PyDict_GetItemWithError(NODE_GLOBALS, S_VERIFY);
    if (verify != NULL && PyObject_IsTrue(verify)) {
        PyObject *r = PyObject_CallOneArg(VERIFYFN, node);
        if (r == NULL) {
            Py_DECREF(node);
            return NULL;
        }
        Py_DECREF(r);
    }
    return node;
fail:
    Py_XDECREF(leaves);
    Py_XDECREF(sharing);
    Py_XDECREF(ckeys);
    return NULL;
}

static PyObject *
py_make_op(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (!ready(0))
        return NULL;
    if (kwnames != NULL || nargs < 5 || nargs > 6 || !PyTuple_Check(args[1]))
        return PyObject_Vectorcall(MAKE_OP_PY, args, nargs, kwnames);
    return make_op_c(args[0], args[1], args[2], args[3], args[4], nargs == 6 ? args[5] : EMPTY);
}

/* make_scalar(v) for a Python float */
static PyObject *
make_float(PyObject *v)
{
    PyObject *n = ScalarT->tp_alloc(ScalarT, 0);
    if (n == NULL)
        return NULL;
    PyObject *zero = PyLong_FromLong(0);
    Py_INCREF(S_scalar); Py_INCREF(FLOAT_DT); Py_INCREF(EMPTY); Py_INCREF(EMPTY); Py_INCREF(FLOAT_KEY);
    Py_INCREF(EMPTY); Py_INCREF(EMPTY_STR); Py_INCREF(LO_NONE); Py_INCREF(Py_None); Py_INCREF(v);
    Py_INCREF((PyObject *)&PyFloat_Type);
    set_slot(n, N_op, S_scalar);
    set_slot(n, N_dtype, FLOAT_DT);
    set_slot(n, N_shape, EMPTY);
    set_slot(n, N_args, EMPTY);
    set_slot(n, N_attrs, EMPTY);
    set_slot(n, N_key, FLOAT_KEY);
    set_slot(n, N_leaves, EMPTY);
    Py_INCREF(zero);
    set_slot(n, N_uid, zero);
    set_slot(n, N_device, EMPTY_STR);
    set_slot(n, N_flags, zero);
    set_slot(n, N_lo, LO_NONE);
    Py_INCREF(zero);
    set_slot(n, N_mask, zero);
    set_slot(n, N_memo, Py_None);
    set_slot(n, S_value, v);
    set_slot(n, S_weak, (PyObject *)&PyFloat_Type);
    return n;
}

static PyObject *
py_make_float(PyObject *self, PyObject *v)
{
    if (!ready(0))
        return NULL;
    if (!PyFloat_CheckExact(v)) {
        PyErr_SetString(PyExc_TypeError, "make_float takes a Python float");
        return NULL;
    }
    return make_float(v);
}

/* ------------------------------------------------------------------------------------------ */
/* arrays */

/* frontend.array.wrap; steals ``node`` */
static PyObject *
wrap_c(PyObject *node)
{
    if (node == NULL)
        return NULL;
    PyObject *a = ArrayT->tp_alloc(ArrayT, 0);
    if (a == NULL) {
        Py_DECREF(node);
        return NULL;
    }
    Py_INCREF(Py_None); Py_INCREF(Py_None);
    set_slot(a, A_node, node);
    set_slot(a, A_base, Py_None);
    set_slot(a, A_views, Py_None);
    if (PyTuple_GET_SIZE(SLOT(node, N_leaves)) > 0 || is_str(SLOT(node, N_op), S_matmul)) {
        PyObject *r = PyWeakref_NewRef(a, DROP);
        if (r == NULL) {
            Py_DECREF(a);
            return NULL;
        }
        set_slot(a, A_pref, r);
        PyObject *mark = PyIter_Next(UIDS);
        if (mark == NULL) {
            Py_DECREF(a);
            return NULL;
        }
        set_slot(a, A_pmark, mark);
        PyObject *id = PyLong_FromVoidPtr(r);
        if (id == NULL || PyDict_SetItem(PENDING, id, r) < 0) {
            Py_XDECREF(id);
            Py_DECREF(a);
            return NULL;
        }
        Py_DECREF(id);
        long long flags = PyLong_AsLongLong(SLOT(node, N_flags));
        if (flags >= TOO_DEEP) { /* a long chain of pending ops (a loop that never reads): run it */
            PyObject *t = PyTuple_Pack(1, a);
            PyObject *res = t ? PyObject_CallOneArg(REALIZE, t) : NULL;
            Py_XDECREF(t);
            if (res == NULL) {
                Py_DECREF(a);
                return NULL;
            }
            Py_DECREF(res);
        }
    } else {
        Py_INCREF(Py_None);
        set_slot(a, A_pref, Py_None);
    }
    return a;
}

/* engine.state.drop: a pending array died (its weak reference's callback) */
static PyObject *
py_drop(PyObject *self, PyObject *ref)
{
    if (PENDING == NULL)
        Py_RETURN_NONE;
    PyObject *id = PyLong_FromVoidPtr(ref);
    if (id == NULL)
        return NULL;
    if (PyDict_DelItem(PENDING, id) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_KeyError)) {
            Py_DECREF(id);
            return NULL;
        }
        PyErr_Clear();
    }
    Py_DECREF(id);
    Py_RETURN_NONE;
}

static PyObject *
py_wrap(PyObject *self, PyObject *node)
{
    if (!ready(1))
        return NULL;
    if (!node_ok(node)) {
        PyErr_SetString(PyExc_TypeError, "wrap takes an IR node");
        return NULL;
    }
    Py_INCREF(node);
    return wrap_c(node);
}

/* ------------------------------------------------------------------------------------------ */
/* operators */

enum { BINARY = 0, REFLECTED = 1, UNARY = 2 };

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *name;     /* the op-table name ("multiply") */
    PyObject *fallback; /* the Python operator */
    PyObject *qualname; /* the method name ("__mul__") */
    PyObject *dict;     /* attributes set from Python (__doc__, __signature__) */
    int kind;
} Operator;

/* 1 when the fast path may run: no gradient trace, fusion on */
static inline int
fast_mode(void)
{
    PyObject *t = PyDict_GetItemWithError(ARRAY_GLOBALS, S_TAPE);
    if (t != NULL && t != Py_None)
        return 0;
    PyObject *cur = PyDict_GetItemWithError(CONFIG_GLOBALS, S_current);
    if (cur == NULL)
        return 0;
    PyObject *f = PyObject_GetAttr(cur, S_fuse);
    if (f == NULL) {
        PyErr_Clear();
        return 0;
    }
    Py_DECREF(f);
    return f == Py_True;
}

/* frontend.array._watch for array operands: while deferred stores are queued (ir.node.WATCH), each
 * buffer operand is shown to the store queue, which flushes when it reads a queued target. Runs
 * before the operands' nodes are read (a flush can give pending operands memory). -1: error. */
static int
watch_operands(PyObject *x, PyObject *y)
{
    PyObject *ops[2] = {x, y};
    for (int i = 0; i < 2 && ops[i] != NULL; i++) {
        PyObject *w = PyDict_GetItemWithError(NODE_GLOBALS, S_WATCH);
        if (w == NULL)
            return PyErr_Occurred() ? -1 : 0;
        if (w == Py_None)
            return 0; /* (flushed by an earlier operand) */
        if (Py_TYPE(ops[i]) != ArrayT)
            continue;
        PyObject *n = SLOT(ops[i], A_node);
        if (n == NULL || !is_str(SLOT(n, N_op), S_buffer))
            continue;
        Py_INCREF(w);
        Py_INCREF(n);
        PyObject *r = PyObject_CallOneArg(w, n);
        Py_DECREF(n);
        Py_DECREF(w);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
    }
    return 0;
}

static PyObject *
rule_out(PyObject *rules, PyObject *k0, PyObject *k1, PyObject *k2)
{
    PyObject *k = k2 ? PyTuple_Pack(3, k0, k1, k2) : PyTuple_Pack(2, k0, k1);
    if (k == NULL)
        return NULL;
    PyObject *r = PyDict_GetItemWithError(rules, k); /* borrowed */
    Py_DECREF(k);
    if (r == NULL || !PyTuple_Check(r) || PyTuple_GET_SIZE(r) < 1)
        return NULL;
    return PyTuple_GET_ITEM(r, 0);
}

/* An operator's result, wrap(make_op(name, args, out, a.shape, a.device)); steals ``args`` (a
 * tuple holding ``a``, so its shape and device stay alive), ``out`` is borrowed from a rule table */
static PyObject *
result(PyObject *name, PyObject *args, PyObject *out, PyObject *a)
{
    if (args == NULL)
        return NULL;
    Py_INCREF(out); /* (make_op may run Python code) */
    PyObject *node = make_op_c(name, args, out, SLOT(a, N_shape), SLOT(a, N_device), EMPTY);
    Py_DECREF(out);
    Py_DECREF(args);
    return wrap_c(node);
}

static PyObject *
operator_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Operator *o = (Operator *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || ArrayT == NULL || NodeT == NULL)
        goto fallback;
    if (o->kind == UNARY) {
        if (nargs != 1 || Py_TYPE(args[0]) != ArrayT || !fast_mode())
            goto fallback;
        if (watch_operands(args[0], NULL) < 0)
            return NULL;
        PyObject *a = SLOT(args[0], A_node);
        if (a == NULL || is_str(SLOT(a, N_op), S_scalar))
            goto fallback;
        PyObject *out = rule_out(RULES1, o->name, SLOT(a, N_dtype), NULL);
        if (out == NULL)
            goto fallback;
        return result(o->name, PyTuple_Pack(1, a), out, a);
    }
    if (nargs != 2 || Py_TYPE(args[0]) != ArrayT)
        goto fallback;
    PyObject *other = args[1];
    PyTypeObject *t = Py_TYPE(other);
    int both = t == ArrayT && o->kind == BINARY;
    if (!both && t != &PyFloat_Type && t != &PyLong_Type)
        goto fallback;
    if (t == &PyLong_Type) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(other, &overflow);
        if (overflow || v > EXACT_INT || v < -EXACT_INT)
            goto fallback;
    }
    if (!fast_mode())
        goto fallback;
    if (watch_operands(args[0], both ? other : NULL) < 0)
        return NULL;
    PyObject *a = SLOT(args[0], A_node);
    if (a == NULL)
        goto fallback;
    if (both) {
        PyObject *b = SLOT(other, A_node);
        if (b == NULL || is_str(SLOT(a, N_op), S_matmul))
            goto fallback;
        PyObject *da = SLOT(a, N_device), *db = SLOT(b, N_device);
        if (da != db && PyObject_RichCompareBool(da, db, Py_EQ) != 1)
            goto fallback;
        PyObject *sa = SLOT(a, N_shape), *sb = SLOT(b, N_shape);
        if (sa != sb && PyObject_RichCompareBool(sa, sb, Py_EQ) != 1)
            goto fallback;
        PyObject *out = rule_out(RULES2, o->name, SLOT(a, N_dtype), SLOT(b, N_dtype));
        if (out == NULL)
            goto fallback;
        return result(o->name, PyTuple_Pack(2, a, b), out, a);
    }
    {
        if (o->kind == REFLECTED && is_str(SLOT(a, N_op), S_matmul))
            goto fallback;
        PyObject *out = o->kind == REFLECTED ? rule_out(RULES2, o->name, (PyObject *)t, SLOT(a, N_dtype))
                                             : rule_out(RULES2, o->name, SLOT(a, N_dtype), (PyObject *)t);
        if (out == NULL)
            goto fallback;
        Py_INCREF(out); /* the scalar's construction may run Python code */
        PyObject *s = t == &PyFloat_Type ? make_float(other) : PyObject_CallOneArg(MAKE_SCALAR_PY, other);
        if (s == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyObject *r = result(o->name, o->kind == REFLECTED ? PyTuple_Pack(2, s, a) : PyTuple_Pack(2, a, s), out, a);
        Py_DECREF(s);
        Py_DECREF(out);
        return r;
    }
fallback:
    if (PyErr_Occurred())
        PyErr_Clear(); /* a failed fast-path probe (a dict lookup) falls back quietly */
    return PyObject_Vectorcall(o->fallback, args, nargsf, kwnames);
}

static PyObject *
operator_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, obj);
}

static void
operator_dealloc(PyObject *self)
{
    Operator *o = (Operator *)self;
    PyObject_GC_UnTrack(self);
    Py_XDECREF(o->name);
    Py_XDECREF(o->fallback);
    Py_XDECREF(o->qualname);
    Py_XDECREF(o->dict);
    PyObject_GC_Del(self);
}

static int
operator_traverse(PyObject *self, visitproc visit, void *arg)
{
    Operator *o = (Operator *)self;
    Py_VISIT(o->fallback);
    Py_VISIT(o->dict);
    return 0;
}

static PyObject *
operator_getattro(PyObject *self, PyObject *name)
{
    /* __name__, __doc__, __qualname__, __module__, __wrapped__: the Python operator's */
    Operator *o = (Operator *)self;
    if (PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, "__wrapped__") == 0) {
        Py_INCREF(o->fallback);
        return o->fallback;
    }
    PyObject *r = PyObject_GenericGetAttr(self, name);
    if (r != NULL || !PyErr_ExceptionMatches(PyExc_AttributeError))
        return r;
    PyErr_Clear();
    return PyObject_GetAttr(o->fallback, name);
}

static PyObject *
operator_repr(PyObject *self)
{
    Operator *o = (Operator *)self;
    return PyUnicode_FromFormat("<fusetree operator %U (%U)>", o->qualname, o->name);
}

static PyTypeObject OperatorType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fusetree._native.Operator",
    .tp_basicsize = sizeof(Operator),
    .tp_dealloc = operator_dealloc,
    .tp_vectorcall_offset = offsetof(Operator, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_repr = operator_repr,
    .tp_getattro = operator_getattro,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_traverse = operator_traverse,
    .tp_dictoffset = offsetof(Operator, dict),
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_descr_get = operator_get,
    .tp_doc = "An Array operator: the memoized-rule fast path in C, the Python operator otherwise.",
};

static PyObject *
py_operator(PyObject *self, PyObject *args)
{
    PyObject *name, *fallback, *qualname;
    int kind;
    if (!PyArg_ParseTuple(args, "UiOU", &name, &kind, &fallback, &qualname))
        return NULL;
    if (kind < BINARY || kind > UNARY || !PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_ValueError, "operator(name, kind 0-2, fallback callable, qualname)");
        return NULL;
    }
    Operator *o = PyObject_GC_New(Operator, &OperatorType);
    if (o == NULL)
        return NULL;
    o->vectorcall = operator_call;
    Py_INCREF(name);
    Py_INCREF(fallback);
    Py_INCREF(qualname);
    PyUnicode_InternInPlace(&name);
    o->name = name;
    o->fallback = fallback;
    o->qualname = qualname;
    o->dict = NULL;
    o->kind = kind;
    PyObject_GC_Track((PyObject *)o);
    return (PyObject *)o;
}

/* ------------------------------------------------------------------------------------------ */

static PyMethodDef methods[] = {
    {"setup_nodes", setup_nodes, METH_O, "Hand the IR's classes and tables to the module."},
    {"setup_arrays", setup_arrays, METH_O, "Hand the front end's classes and tables to the module."},
    {"make_op", (PyCFunction)(void (*)(void))py_make_op, METH_FASTCALL | METH_KEYWORDS,
     "make_op(op, args, dtype, shape, device, attrs=()): ir.node.make_op in C."},
    {"make_float", py_make_float, METH_O, "ir.node.make_scalar for a Python float."},
    {"wrap", py_wrap, METH_O, "frontend.array.wrap in C."},
    {"drop", py_drop, METH_O, "engine.state.drop in C (PENDING.pop(id(ref), None))."},
    {"operator", py_operator, METH_VARARGS,
     "operator(name, kind, fallback, qualname): an Array operator (kind 0 binary, 1 reflected, "
     "2 one operand) with the fast path in C."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "fusetree._native",
                                    "The front end's hot paths in C (see _native.c).", -1, methods};

PyMODINIT_FUNC
PyInit__native(void)
{
    if (PyType_Ready(&OperatorType) < 0)
        return NULL;
    EMPTY = PyTuple_New(0);
    EMPTY_STR = PyUnicode_InternFromString("");
    S_buffer = PyUnicode_InternFromString("buffer");
    S_matmul = PyUnicode_InternFromString("matmul");
    S_scalar = PyUnicode_InternFromString("scalar");
    S_reduce = PyUnicode_InternFromString("reduce");
    S_expand = PyUnicode_InternFromString("expand");
    S_VERIFY = PyUnicode_InternFromString("VERIFY");
    S_WATCH = PyUnicode_InternFromString("WATCH");
    S_TAPE = PyUnicode_InternFromString("TAPE");
    S_current = PyUnicode_InternFromString("current");
    S_fuse = PyUnicode_InternFromString("fuse");
    if (!EMPTY || !EMPTY_STR || !S_buffer || !S_matmul || !S_scalar || !S_reduce || !S_expand || !S_VERIFY ||
        !S_WATCH || !S_TAPE || !S_current || !S_fuse)
        return NULL;
    LO_NONE = PyLong_FromLongLong(LO_NONE_VALUE);
    PyObject *m = LO_NONE ? PyModule_Create(&module) : NULL;
    if (m != NULL && (DROP = PyObject_GetAttrString(m, "drop")) == NULL)
        Py_CLEAR(m);
    return m;
}
