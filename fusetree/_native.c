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
 *   realize_hit(arrays)                                engine.realization.realize for values whose
 *       one-kernel plan is cached and that store nothing else: key, plan lookup, allocation,
 *       leaf binding (slices of a kernel's output by offset arithmetic: bind_leaf), the backend's
 *       launch, the arrays made buffers (make_contiguous); declines the rest, changing nothing
 *   pack_launch(fmt, buf, args, call, stream, params)  the CUDA backend's struct pack and
 *       cuLaunchKernel, through the function pointer it hands over (set_launcher)
 *
 * The module imports nothing from fusetree: ``setup_nodes``, ``setup_arrays`` and ``setup_engine`` hand it the
 * classes, dicts and functions it uses, and it writes the Python classes' __slots__ directly (by
 * the member descriptors' offsets). Nodes and arrays built here are ordinary instances of those
 * classes. Set FUSETREE_NATIVE=0 to run without it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SLOT(o, off) (*(PyObject **)((char *)(o) + (off)))

/* ------------------------------------------------------------------------------------------ */
/* state from setup_nodes */

static PyTypeObject *NodeT, *ScalarT, *BufferT, *ViewLeafT;
static Py_ssize_t N_args, N_attrs, N_device, N_dtype, N_flags, N_key, N_leaves, N_lo, N_mask,
    N_memo, N_op, N_shape, N_uid, S_value, S_weak, B_data, B_layout, B_bound, B_ptr, B_span, V_src_bound,
    V_offset, V_estrides;
/* Op and scalar nodes made here are not tracked by the cyclic garbage collector: a node refers to
 * its operands (nodes), tuples, a dtype, ints and strings, never to an Array or anything that
 * refers back to it, so it is never part of a reference cycle and reference counting frees it. An
 * eager step makes thousands of them (an AdamW step over 148 tensors: ~2,000); tracked, they were
 * walked by every young-generation collection (~14% of that step). The same holds for the Arrays
 * wrapping them (wrap_c) and their weak references: an Array holds its node, a weak reference
 * to itself (the callback a module function), and later perhaps views' weak references and a
 * (weak reference, index function) pair: nothing that refers back to it. FUSETREE_GC_UNTRACK=0:
 * all tracked. */
static int UNTRACK_NODES = 1;
static PyObject *BUFFER_KEYS;   /* ir.node._BUFFER_KEYS: (dtype, ndim, layout) -> key */
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
static PyObject *MINUS_ONE;
static long long FLAG_BITS, ONE_LEVEL, F_REDUCE, F_EXPAND, F_GEMM;
static PyObject *SHORT;         /* ir.dtypes.SHORT: dtype -> its short name */
static PyObject *EMPTY, *EMPTY_STR;
static PyObject *S_shape_attr;
static PyObject *S_gemm_accumulate, *S_adjacent_columns;
static PyObject *S_views, *S_b, *S_kind, *S_i, *S_ARITHMETIC, *S_strides;
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
/* views (frontend.views / frontend.array tables, read on __getitem__'s fast path) */
static PyObject *BASIC_INDEX, *INDEX_SHAPES, *ELEMENT_STRIDES, *GEOMETRY, *VIEWS_GLOBALS, *COMPUTE_GEMM;
static Py_ssize_t V_view, V_source, V_fn, V_src_strides;

/* state from setup_engine */
static PyObject *CONTEXTS, *STATS, *TICK, *HOOK, *STORES, *LOCK, *BY_SHAPE, *BIND_LEAF, *MAKE_CONTIGUOUS,
    *SET_BUFFER, *SOURCE_BOUND, *RECENT_SOURCES;

/* Python int -> C integer. PyLong_AsLong(Long) and its unsigned twin: CPython 3.11's
 * PyLong_AsLongLong converts any int of two or more digits (>= 2**30: spans, Bloom masks, the
 * "no op below" lo) through _PyLong_AsByteArray; PyLong_AsLong loops over the digits. */
static inline long long
as_ll(PyObject *v)
{
#if LONG_MAX == LLONG_MAX
    return PyLong_AsLong(v);
#else
    return PyLong_AsLongLong(v);
#endif
}

static inline unsigned long long
as_ull(PyObject *v)
{
#if ULONG_MAX == ULLONG_MAX
    return PyLong_AsUnsignedLong(v);
#else
    return PyLong_AsUnsignedLongLong(v);
#endif
}

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
    *out = as_ll(v);
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
    PyObject *node = get_obj(d, "Node"), *scalar = get_obj(d, "Scalar"), *buffer = get_obj(d, "Buffer"),
             *viewleaf = get_obj(d, "ViewLeaf");
    if (node == NULL || scalar == NULL || buffer == NULL || viewleaf == NULL)
        return NULL;
    NodeT = (PyTypeObject *)node;
    ScalarT = (PyTypeObject *)scalar;
    BufferT = (PyTypeObject *)buffer;
    ViewLeafT = (PyTypeObject *)viewleaf;
#define OFF(var, t, name) if ((var = slot_offset(t, name)) < 0) return NULL;
    OFF(N_args, NodeT, "args") OFF(N_attrs, NodeT, "attrs") OFF(N_device, NodeT, "device")
    OFF(N_dtype, NodeT, "dtype") OFF(N_flags, NodeT, "flags") OFF(N_key, NodeT, "key")
    OFF(N_leaves, NodeT, "leaves") OFF(N_lo, NodeT, "lo") OFF(N_mask, NodeT, "mask")
    OFF(N_memo, NodeT, "memo") OFF(N_op, NodeT, "op") OFF(N_shape, NodeT, "shape")
    OFF(N_uid, NodeT, "uid") OFF(S_value, ScalarT, "value") OFF(S_weak, ScalarT, "weak")
    OFF(B_data, BufferT, "data") OFF(B_layout, BufferT, "layout") OFF(B_bound, BufferT, "bound")
    OFF(B_ptr, BufferT, "_ptr") OFF(B_span, BufferT, "_span") OFF(V_src_bound, ViewLeafT, "src_bound")
    OFF(V_offset, ViewLeafT, "offset") OFF(V_estrides, ViewLeafT, "estrides")
    OFF(V_view, ViewLeafT, "_view") OFF(V_source, ViewLeafT, "source") OFF(V_fn, ViewLeafT, "fn")
    OFF(V_src_strides, ViewLeafT, "src_strides")
    if (!(KEYS = get_obj(d, "KEYS")) || !(INTERN = get_obj(d, "intern_key")) ||
        !(MERGE = get_obj(d, "merge_leaves")) || !(VERIFYFN = get_obj(d, "verify")) ||
        !(MAKE_OP_PY = get_obj(d, "make_op")) || !(NODE_GLOBALS = get_obj(d, "globals")) ||
        !(UIDS = get_obj(d, "uids")) || !(FLOAT_DT = get_obj(d, "FLOAT_DT")) ||
        !(FLOAT_KEY = get_obj(d, "FLOAT_KEY")) || !(BUFFER_KEYS = get_obj(d, "BUFFER_KEYS")) ||
        !(SHORT = get_obj(d, "SHORT")))
        return NULL;
    if (!PyDict_Check(BUFFER_KEYS)) {
        PyErr_SetString(PyExc_TypeError, "setup_nodes: BUFFER_KEYS is a dict");
        return NULL;
    }
    if (get_ll(d, "FLAG_BITS", &FLAG_BITS) || get_ll(d, "ONE_LEVEL", &ONE_LEVEL) ||
        get_ll(d, "REDUCE", &F_REDUCE) || get_ll(d, "EXPAND", &F_EXPAND) || get_ll(d, "GEMM", &F_GEMM))
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
    if (!(BASIC_INDEX = get_obj(d, "BASIC_INDEX")) || !(INDEX_SHAPES = get_obj(d, "INDEX_SHAPES")) ||
        !(ELEMENT_STRIDES = get_obj(d, "ELEMENT_STRIDES")) || !(GEOMETRY = get_obj(d, "GEOMETRY")) ||
        !(VIEWS_GLOBALS = get_obj(d, "views_globals")) || !(COMPUTE_GEMM = get_obj(d, "compute_gemm")))
        return NULL;
    if (!PyDict_Check(BASIC_INDEX) || !PyDict_Check(INDEX_SHAPES) || !PyDict_Check(ELEMENT_STRIDES) ||
        !PyDict_Check(GEOMETRY) || !PyDict_Check(VIEWS_GLOBALS)) {
        PyErr_SetString(PyExc_TypeError, "setup_arrays: the view tables are dicts");
        return NULL;
    }
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

/* ir.node.merge_leaves for two operands whose Bloom masks overlap: b a leaf of a's tree, b's leaves
 * ending a's, any other (a scan per leaf up to 8 leaves, a table of addresses beyond). Sets
 * *leaves and *sharing (new references) and returns 1; -1 on error. */
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
    {
        /* more than 8 leaves on the right (a backward pass's trees): an open-addressing table of
         * the merged leaves' addresses instead of a scan per leaf */
        Py_ssize_t cap = 0, *table = NULL;
        if (k > 8) {
            cap = 16;
            while (cap < 2 * (n + k))
                cap *= 2;
            table = PyMem_Malloc(cap * sizeof(Py_ssize_t));
            if (table == NULL) {
                PyErr_NoMemory();
                goto fail;
            }
            for (Py_ssize_t i = 0; i < cap; i++)
                table[i] = -1;
        }
#define LEAF_SLOT(x) ((((size_t)(x)) >> 4) * 0x9E3779B97F4A7C15ULL >> 17)
        PyObject *merged = PyTuple_New(n + k), *where = PyTuple_New(k);
        if (merged == NULL || where == NULL) {
            Py_XDECREF(merged);
            Py_XDECREF(where);
            PyMem_Free(table);
            goto fail;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *x = PyTuple_GET_ITEM(first, i);
            Py_INCREF(x);
            PyTuple_SET_ITEM(merged, i, x);
            if (table != NULL) { /* (a scalar may come twice: the last index, as the Python dict) */
                size_t h = LEAF_SLOT(x) & (cap - 1);
                while (table[h] >= 0 && PyTuple_GET_ITEM(first, table[h]) != x)
                    h = (h + 1) & (cap - 1);
                table[h] = i;
            }
        }
        Py_ssize_t m = n;
        for (Py_ssize_t i = 0; i < k; i++) {
            PyObject *leaf = PyTuple_GET_ITEM(second, i);
            Py_ssize_t j = -1;
            if (table == NULL) {
                j = find(merged, m, leaf);
            } else {
                size_t h = LEAF_SLOT(leaf) & (cap - 1);
                while (table[h] >= 0 && PyTuple_GET_ITEM(merged, table[h]) != leaf)
                    h = (h + 1) & (cap - 1);
                if (table[h] >= 0)
                    j = table[h];
                else
                    table[h] = m; /* (the index it gets below) */
            }
            if (j < 0) {
                j = m++;
                Py_INCREF(leaf);
                PyTuple_SET_ITEM(merged, j, leaf);
            }
            PyObject *v = PyLong_FromSsize_t(j);
            if (v == NULL) {
                Py_DECREF(merged); /* (unfilled items are NULL: tupledealloc skips them) */
                Py_DECREF(where);
                PyMem_Free(table);
                goto fail;
            }
            PyTuple_SET_ITEM(where, i, v);
        }
#undef LEAF_SLOT
        PyMem_Free(table);
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

/* A direct-mapped memo in front of intern() for the common op node: one or two operands, no
 * attributes, no shared leaf. Entries hold strong references (no address is reused while an
 * entry names it); a hit costs no key tuple and no dict lookup. */
#define KEY_MEMO 4096
static struct key_memo {
    PyObject *op, *dtype, *k0, *k1, *key;
} KEY_MEMO_TABLE[KEY_MEMO];

static inline size_t
key_memo_slot(PyObject *op, PyObject *dtype, PyObject *k0, PyObject *k1)
{
    size_t h = (size_t)op * 0x9E3779B97F4A7C15ULL ^ (size_t)dtype * 0xC2B2AE3D27D4EB4FULL ^
               (size_t)k0 * 0x165667B19E3779F9ULL ^ (size_t)k1 * 0x27D4EB2F165667C5ULL;
    return (h >> 20) % KEY_MEMO;
}

/* the interned key of (op, dtype, (), (k0[, k1]), None); a new reference, NULL on error */
static PyObject *
memo_key(PyObject *op, PyObject *dtype, PyObject *k0, PyObject *k1)
{
    struct key_memo *e = &KEY_MEMO_TABLE[key_memo_slot(op, dtype, k0, k1)];
    if (e->key != NULL && e->op == op && e->dtype == dtype && e->k0 == k0 && e->k1 == k1)
        return Py_NewRef(e->key);
    PyObject *ck = k1 ? PyTuple_Pack(2, k0, k1) : PyTuple_Pack(1, k0);
    PyObject *kt = ck ? PyTuple_Pack(5, op, dtype, EMPTY, ck, Py_None) : NULL;
    Py_XDECREF(ck);
    if (kt == NULL)
        return NULL;
    PyObject *key = intern(kt);
    Py_DECREF(kt);
    if (key == NULL)
        return NULL;
    PyObject *old[5] = {e->op, e->dtype, e->k0, e->k1, e->key};
    e->op = Py_NewRef(op);
    e->dtype = Py_NewRef(dtype);
    e->k0 = Py_NewRef(k0);
    e->k1 = Py_XNewRef(k1);
    e->key = Py_NewRef(key);
    for (int i = 0; i < 5; i++)
        Py_XDECREF(old[i]);
    return key;
}

/* a node's ``lo`` as a C integer (the "no op below" value without converting its 3-digit int) */
static inline long long
lo_of(PyObject *n)
{
    PyObject *l = SLOT(n, N_lo);
    return l == LO_NONE ? LO_NONE_VALUE : as_ll(l);
}

/* the op node; NULL with an exception set on error. Arguments are borrowed. */
static PyObject *
make_op_c(PyObject *op, PyObject *args, PyObject *dtype, PyObject *shape, PyObject *device,
          PyObject *attrs)
{
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    PyObject *leaves = NULL, *sharing = NULL;
    long long flags, lo;
    unsigned long long mask;
    for (Py_ssize_t i = 0; i < n; i++)
        if (!node_ok(PyTuple_GET_ITEM(args, i)))
            return PyObject_Vectorcall(MAKE_OP_PY, (PyObject *[]){op, args, dtype, shape, device, attrs}, 6, NULL);
    if (n == 2) {
        PyObject *a0 = PyTuple_GET_ITEM(args, 0), *a1 = PyTuple_GET_ITEM(args, 1);
        unsigned long long m0 = as_ull(SLOT(a0, N_mask));
        unsigned long long m1 = as_ull(SLOT(a1, N_mask));
        long long f0 = as_ll(SLOT(a0, N_flags)), f1 = as_ll(SLOT(a1, N_flags));
        long long l0 = lo_of(a0), l1 = lo_of(a1);
        if (PyErr_Occurred())
            return NULL;
        if (m0 & m1) { /* a leaf may be shared */
            if (merge2(a0, a1, &leaves, &sharing) < 0)
                return NULL;
        } else {
            leaves = concat_leaves(a0, a1);
            if (leaves == NULL)
                return NULL;
            sharing = Py_None;
            Py_INCREF(sharing);
        }
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
        long long all = 0, deepest = 0;
        lo = LO_NONE_VALUE;
        mask = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *a = PyTuple_GET_ITEM(args, i);
            long long f = as_ll(SLOT(a, N_flags)), l = lo_of(a);
            mask |= as_ull(SLOT(a, N_mask));
            if (PyErr_Occurred())
                goto fail;
            all |= f;
            if (f > deepest)
                deepest = f;
            if (l < lo)
                lo = l;
        }
        flags = (all & FLAG_BITS) | ((deepest & ~FLAG_BITS) + ONE_LEVEL);
    }
    if (is_str(op, S_reduce))
        flags |= F_REDUCE;
    else if (is_str(op, S_expand))
        flags |= F_EXPAND;
    PyObject *key;
    if (sharing == Py_None && attrs == EMPTY && n >= 1 && n <= 2) {
        key = memo_key(op, dtype, SLOT(PyTuple_GET_ITEM(args, 0), N_key),
                       n == 2 ? SLOT(PyTuple_GET_ITEM(args, 1), N_key) : NULL);
    } else { /* (op, dtype, attrs, the operands' keys, sharing), interned */
        PyObject *ckeys = PyTuple_New(n), *kt = NULL;
        for (Py_ssize_t i = 0; ckeys != NULL && i < n; i++)
            PyTuple_SET_ITEM(ckeys, i, Py_NewRef(SLOT(PyTuple_GET_ITEM(args, i), N_key)));
        kt = ckeys ? PyTuple_Pack(5, op, dtype, attrs, ckeys, sharing) : NULL;
        Py_XDECREF(ckeys);
        if (kt == NULL)
            goto fail;
        key = intern(kt);
        Py_DECREF(kt);
    }
    if (key == NULL)
        goto fail;
    PyObject *node = NodeT->tp_alloc(NodeT, 0);
    if (node != NULL && UNTRACK_NODES)
        PyObject_GC_UnTrack(node); /* (see UNTRACK_NODES) */
    PyObject *uid = node ? PyIter_Next(UIDS) : NULL;
    long long u = uid ? as_ll(uid) : -1;
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
    if (UNTRACK_NODES)
        PyObject_GC_UnTrack(n);
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

/* A new instance of node class ``t`` with every Node slot set, as ir.node._new_leaf sets them: no
 * attributes and no leaves, ``args`` and ``flags`` as given, ``lo`` "no op below", ``mask`` the
 * new uid's Bloom bit. Arguments borrowed; the caller sets the class's own slots. */
static PyObject *
new_node(PyTypeObject *t, PyObject *op, PyObject *dtype, PyObject *shape, PyObject *args, PyObject *key,
         PyObject *device, long long flags)
{
    PyObject *n = t->tp_alloc(t, 0);
    PyObject *uid = n ? PyIter_Next(UIDS) : NULL;
    long long u = uid ? as_ll(uid) : -1;
    PyObject *mask = u >= 0 ? PyLong_FromUnsignedLongLong(1ULL << (u % 64)) : NULL;
    PyObject *pflags = mask ? PyLong_FromLongLong(flags) : NULL;
    if (pflags == NULL) {
        Py_XDECREF(n); Py_XDECREF(uid); Py_XDECREF(mask);
        return NULL;
    }
    Py_INCREF(op); Py_INCREF(dtype); Py_INCREF(shape); Py_INCREF(args); Py_INCREF(EMPTY);
    Py_INCREF(key); Py_INCREF(EMPTY); Py_INCREF(device); Py_INCREF(LO_NONE); Py_INCREF(Py_None);
    set_slot(n, N_op, op);
    set_slot(n, N_dtype, dtype);
    set_slot(n, N_shape, shape);
    set_slot(n, N_args, args);
    set_slot(n, N_attrs, EMPTY);
    set_slot(n, N_key, key);
    set_slot(n, N_leaves, EMPTY);
    set_slot(n, N_uid, uid);
    set_slot(n, N_device, device);
    set_slot(n, N_flags, pflags);
    set_slot(n, N_lo, LO_NONE);
    set_slot(n, N_mask, mask);
    set_slot(n, N_memo, Py_None);
    return n;
}

/* A new buffer leaf of class ``t`` (Buffer or ViewLeaf) with layout class ``lay``: new_node's slots
 * and a Buffer's own but ``data`` (nothing bound, address and span not computed yet). */
static PyObject *
new_buffer_leaf(PyTypeObject *t, PyObject *dtype, PyObject *shape, PyObject *key, PyObject *device, PyObject *lay)
{
    PyObject *n = new_node(t, S_buffer, dtype, shape, EMPTY, key, device, 0);
    if (n == NULL)
        return NULL;
    Py_INCREF(lay); Py_INCREF(Py_None); Py_INCREF(MINUS_ONE); Py_INCREF(Py_None);
    set_slot(n, B_layout, lay);
    set_slot(n, B_bound, Py_None);
    set_slot(n, B_ptr, MINUS_ONE);
    set_slot(n, B_span, Py_None);
    return n;
}

/* ir.node.make_gemm_sum(args, shape, dtype): a pending sum of GEMMs over operand buffers in pairs.
 * Arguments borrowed; a new reference. */
static PyObject *
make_gemm_sum_c(PyObject *args, PyObject *shape, PyObject *dtype)
{
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    PyObject *sh = PyDict_GetItemWithError(SHORT, dtype);
    if (sh == NULL) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_KeyError, "make_gemm_sum: dtype %R", dtype);
        return NULL;
    }
    PyObject *keys = PyTuple_New(n);
    if (keys == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = SLOT(PyTuple_GET_ITEM(args, i), N_key);
        Py_INCREF(k);
        PyTuple_SET_ITEM(keys, i, k);
    }
    PyObject *kt = Py_BuildValue("(OOnN)", S_matmul, sh, PyTuple_GET_SIZE(shape), keys);
    PyObject *key = kt ? intern(kt) : NULL;
    Py_XDECREF(kt);
    if (key == NULL)
        return NULL;
    PyObject *node = new_node(NodeT, S_matmul, dtype, shape, args, key, SLOT(PyTuple_GET_ITEM(args, 0), N_device),
                              F_GEMM);
    Py_DECREF(key);
    return node;
}

static PyObject *
py_make_gemm_sum(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!ready(0))
        return NULL;
    if (nargs != 3 || !PyTuple_Check(args[0]) || PyTuple_GET_SIZE(args[0]) < 2 || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "make_gemm_sum(operand tuple, shape tuple, dtype)");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args[0]); i++)
        if (!node_ok(PyTuple_GET_ITEM(args[0], i))) {
            PyErr_SetString(PyExc_TypeError, "make_gemm_sum: operands are IR nodes");
            return NULL;
        }
    return make_gemm_sum_c(args[0], args[1], args[2]);
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
    if (UNTRACK_NODES)
        PyObject_GC_UnTrack(a); /* (see UNTRACK_NODES) */
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
        if (UNTRACK_NODES && PyObject_GC_IsTracked(r))
            PyObject_GC_UnTrack(r);
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
        long long flags = as_ll(SLOT(node, N_flags));
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

enum { BINARY = 0, REFLECTED = 1, UNARY = 2, MATMUL = 3, GETITEM = 4, SETITEM = 5 };

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *name;     /* the op-table name ("multiply") */
    PyObject *fallback; /* the Python operator */
    PyObject *qualname; /* the method name ("__mul__") */
    PyObject *dict;     /* attributes set from Python (__doc__, __signature__) */
    int kind;
    /* the last rule-table answer: (k0, k1) -> out, strong references (an optimizer's loop asks
     * the same question thousands of times a step: no key tuple, no dict lookup) */
    PyObject *last_k0, *last_k1, *last_out;
} Operator;

/* rule_out through the operator's one-entry memo (k1 may be NULL: unary) */
static PyObject *rule_out(PyObject *rules, PyObject *k0, PyObject *k1, PyObject *k2);

static PyObject *
rule_memo(Operator *o, PyObject *rules, PyObject *k0, PyObject *k1)
{
    if (o->last_out != NULL && o->last_k0 == k0 && o->last_k1 == k1)
        return o->last_out;
    PyObject *out = rule_out(rules, o->name, k0, k1);
    if (out == NULL)
        return NULL;
    Py_INCREF(k0); Py_XINCREF(k1); Py_INCREF(out);
    Py_XSETREF(o->last_k0, k0);
    Py_XSETREF(o->last_k1, k1);
    Py_XSETREF(o->last_out, out);
    return out;
}

static PyObject *S_defer_stores;

/* config.current's ``fuse`` and ``defer_stores`` flags (*fuse, *defer): 0, or -1 with an exception
 * set. config.current is a frozen dataclass, replaced (never changed) by ft.options: its answers
 * are kept with a reference to it. */
static int
options_c(int *fuse, int *defer)
{
    static PyObject *last_cur = NULL;
    static int last_fuse = 0, last_defer = 0;
    PyObject *cur = PyDict_GetItemWithError(CONFIG_GLOBALS, S_current);
    if (cur == NULL) { /* (not set up yet: every flag off) */
        *fuse = *defer = 0;
        return PyErr_Occurred() ? -1 : 0;
    }
    if (cur != last_cur) {
        PyObject *f = PyObject_GetAttr(cur, S_fuse), *d = f ? PyObject_GetAttr(cur, S_defer_stores) : NULL;
        Py_XDECREF(f);
        Py_XDECREF(d);
        if (d == NULL)
            return -1;
        Py_INCREF(cur);
        Py_XSETREF(last_cur, cur);
        last_fuse = f == Py_True;
        last_defer = d == Py_True;
    }
    *fuse = last_fuse;
    *defer = last_defer;
    return 0;
}

/* Whether an elementwise operator's fast path may run: fusion on (a failed probe: no). While a
 * gradient is traced *tape is the trace (borrowed: the op appends its entry, as
 * frontend.array.record does), else NULL. */
static inline int
fast_mode(PyObject **tape)
{
    PyObject *t = PyDict_GetItemWithError(ARRAY_GLOBALS, S_TAPE);
    *tape = NULL;
    if (t != NULL && t != Py_None) {
        if (!PyList_Check(t))
            return 0;
        *tape = t;
    }
    int fuse, defer;
    if (options_c(&fuse, &defer) < 0) {
        PyErr_Clear();
        return 0;
    }
    return fuse;
}

/* engine.stores' queue (setup_stores): its tables and Python definitions */
static PyObject *ST_OWNERS, *ST_LOS, *ST_HIS, *ST_STORE, *ST_WATCH, *ST_FLUSH, *ST_PACKAGE;
static PyObject *ST_GLOBALS; /* engine.stores' namespace (MAX_QUEUED read from it per store) */
static Py_ssize_t T_device, T_node, T_owner, T_span, T_target, T_tnode, T_where; /* Store's slots */
static PyObject *S_MAX_QUEUED;
static PyObject *S_span, *S_stores, *S_owner, *S_node_attr, *S_where, *S_tnode;

/* bisect.bisect_left(sorted list, x); -1 on error */
static Py_ssize_t
bisect_left_c(PyObject *list, PyObject *x)
{
    Py_ssize_t a = 0, b = PyList_GET_SIZE(list);
    long long xv = as_ll(x); /* (spans are byte addresses: C integers, compared as such) */
    if (xv == -1 && PyErr_Occurred())
        return -1;
    while (a < b) {
        Py_ssize_t mid = (a + b) / 2;
        long long v = as_ll(PyList_GET_ITEM(list, mid));
        if (v == -1 && PyErr_Occurred())
            return -1;
        if (v < xv)
            a = mid + 1;
        else
            b = mid;
    }
    return a;
}

/* engine.stores._overlapping: whether [lo, hi) overlaps a queued target's span (the spans sorted
 * by start, disjoint); -1 on error */
static int
overlapping_c(PyObject *lo, PyObject *hi)
{
    Py_ssize_t a = bisect_left_c(ST_LOS, hi);
    if (a < 0)
        return -1;
    if (a == 0 || a > PyList_GET_SIZE(ST_HIS))
        return 0;
    long long h = as_ll(PyList_GET_ITEM(ST_HIS, a - 1)), l = as_ll(lo);
    if ((h == -1 || l == -1) && PyErr_Occurred())
        return -1;
    return h > l;
}

/* a buffer node's byte span (its cached ``span``), a new reference to a (lo, hi) tuple */
static PyObject *
span_of_node(PyObject *n)
{
    if (PyObject_TypeCheck(n, BufferT)) { /* (computed once, kept in _span) */
        PyObject *c = SLOT(n, B_span);
        if (c != NULL && PyTuple_CheckExact(c) && PyTuple_GET_SIZE(c) == 2)
            return Py_NewRef(c);
    }
    PyObject *sp = PyObject_GetAttr(n, S_span);
    if (sp != NULL && (!PyTuple_Check(sp) || PyTuple_GET_SIZE(sp) != 2)) {
        Py_DECREF(sp);
        PyErr_SetString(PyExc_TypeError, "a buffer's span is a (low, high) pair");
        return NULL;
    }
    return sp;
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
        if (w == ST_WATCH && ST_LOS != NULL) { /* (engine.stores._watch: the overlap test here) */
            PyObject *sp = span_of_node(n);
            if (sp == NULL)
                return -1;
            int o = overlapping_c(PyTuple_GET_ITEM(sp, 0), PyTuple_GET_ITEM(sp, 1));
            Py_DECREF(sp);
            if (o <= 0) {
                if (o < 0)
                    return -1;
                continue;
            }
        }
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

/* frontend.array._seen_broadcast: buffer n's cached view broadcast to ``shape`` (a view made by
 * frontend.array.broadcast, kept in n.bound["views"][("b", shape)]), borrowed; NULL when none */
static PyObject *
seen_broadcast(PyObject *n, PyObject *shape)
{
    if (!is_str(SLOT(n, N_op), S_buffer) || !PyObject_TypeCheck(n, BufferT))
        return NULL;
    PyObject *bound = SLOT(n, B_bound);
    if (bound == NULL || !PyDict_Check(bound))
        return NULL;
    PyObject *views = PyDict_GetItemWithError(bound, S_views);
    if (views == NULL || !PyDict_Check(views))
        return NULL;
    PyObject *k = PyTuple_Pack(2, S_b, shape);
    if (k == NULL)
        return NULL;
    PyObject *v = PyDict_GetItemWithError(views, k);
    Py_DECREF(k);
    return v;
}

/* frontend.array.matmul's fast path: two 2-D arrays in memory of one float dtype and device, no
 * gradient trace, no queued store: the pending GEMM. NULL without an error: not taken. */
static PyObject *
matmul_fast(PyObject *x, PyObject *y)
{
    PyObject *t = PyDict_GetItemWithError(ARRAY_GLOBALS, S_TAPE);
    if ((t != NULL && t != Py_None) || STORES == NULL || PyList_GET_SIZE(STORES) > 0)
        return NULL;
    PyObject *a = SLOT(x, A_node), *b = SLOT(y, A_node);
    if (a == NULL || b == NULL || !is_str(SLOT(a, N_op), S_buffer) || !is_str(SLOT(b, N_op), S_buffer))
        return NULL;
    PyObject *sa = SLOT(a, N_shape), *sb = SLOT(b, N_shape), *dt = SLOT(a, N_dtype);
    if (PyTuple_GET_SIZE(sa) != 2 || PyTuple_GET_SIZE(sb) != 2)
        return NULL;
    int eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(sa, 1), PyTuple_GET_ITEM(sb, 0), Py_EQ);
    if (eq != 1)
        return NULL;
    PyObject *db = SLOT(b, N_dtype), *va = SLOT(a, N_device), *vb = SLOT(b, N_device);
    if ((db != dt && PyObject_RichCompareBool(db, dt, Py_EQ) != 1) ||
        (va != vb && PyObject_RichCompareBool(va, vb, Py_EQ) != 1))
        return NULL;
    PyObject *kind = PyObject_GetAttr(dt, S_kind);
    if (kind == NULL)
        return NULL;
    int f = PyUnicode_Check(kind) && PyUnicode_CompareWithASCIIString(kind, "f") == 0;
    Py_DECREF(kind);
    if (!f)
        return NULL;
    PyObject *shape = PyTuple_Pack(2, PyTuple_GET_ITEM(sa, 0), PyTuple_GET_ITEM(sb, 1));
    PyObject *ops = shape ? PyTuple_Pack(2, a, b) : NULL;
    PyObject *node = ops ? make_gemm_sum_c(ops, shape, dt) : NULL;
    Py_XDECREF(shape);
    Py_XDECREF(ops);
    return wrap_c(node);
}

/* frontend.array's fold of ``x@W + h@U`` (two pending GEMM sums of one float dtype, shape and
 * device, neither computed, on a backend that accumulates products): one GEMM-sum node over both
 * operand lists. A product whose operand is an adjacent column block of the previous one's (which
 * frontend.array._gemm_sum joins into one longer-K product) is left to the Python definition, as
 * is everything else. NULL without an error: not taken. */
static PyObject *S_be, *S_data, *S_ptr; /* (set with the engine's names below) */
static PyObject *compute_gemm_c(PyObject *n); /* (with the engine's pieces below) */

static PyObject *
fold_fast(PyObject *a, PyObject *b)
{
    if (CONTEXTS == NULL || SLOT(a, N_memo) != Py_None || SLOT(b, N_memo) != Py_None)
        return NULL;
    PyObject *dt = SLOT(a, N_dtype), *sa = SLOT(a, N_shape), *sb = SLOT(b, N_shape), *dev = SLOT(a, N_device);
    if ((SLOT(b, N_dtype) != dt && PyObject_RichCompareBool(SLOT(b, N_dtype), dt, Py_EQ) != 1) ||
        (sa != sb && PyObject_RichCompareBool(sa, sb, Py_EQ) != 1) ||
        (SLOT(b, N_device) != dev && PyObject_RichCompareBool(SLOT(b, N_device), dev, Py_EQ) != 1))
        return NULL;
    PyObject *kind = PyObject_GetAttr(dt, S_kind);
    if (kind == NULL)
        return NULL;
    int f = PyUnicode_Check(kind) && PyUnicode_CompareWithASCIIString(kind, "f") == 0;
    Py_DECREF(kind);
    PyObject *ctx = f ? PyDict_GetItemWithError(CONTEXTS, dev) : NULL; /* (no context yet: Python) */
    if (ctx == NULL)
        return NULL;
    Py_INCREF(a); /* (held while Python code runs: another thread may realize their arrays) */
    Py_INCREF(b);
    PyObject *res = NULL, *be = PyObject_GetAttr(ctx, S_be), *acc = NULL, *args = NULL;
    if (be == NULL || !(acc = PyObject_GetAttr(be, S_gemm_accumulate)) || PyObject_IsTrue(acc) != 1)
        goto out;
    PyObject *aa = SLOT(a, N_args), *ba = SLOT(b, N_args);
    Py_ssize_t na = PyTuple_GET_SIZE(aa), nb = PyTuple_GET_SIZE(ba);
    if (na < 2 || nb < 2 || na % 2 || nb % 2)
        goto out;
    for (Py_ssize_t i = 0; i < nb; i += 2) { /* (each product's first operand against the one before) */
        PyObject *p = i == 0 ? PyTuple_GET_ITEM(aa, na - 2) : PyTuple_GET_ITEM(ba, i - 2), *x = PyTuple_GET_ITEM(ba, i);
        if (!PyObject_TypeCheck(p, BufferT) || !PyObject_TypeCheck(x, BufferT))
            goto out;
        PyObject *pd = PyObject_GetAttr(p, S_data), *xd = pd ? PyObject_GetAttr(x, S_data) : NULL;
        PyObject *pp = xd ? PyObject_GetAttr(p, S_ptr) : NULL, *xp = pp ? PyObject_GetAttr(x, S_ptr) : NULL;
        PyObject *adj = xp ? PyObject_VectorcallMethod(S_adjacent_columns, (PyObject *[]){be, pd, xd, pp, xp},
                                                       5 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL)
                           : NULL;
        Py_XDECREF(pd); Py_XDECREF(xd); Py_XDECREF(pp); Py_XDECREF(xp);
        int joins = adj ? PyObject_IsTrue(adj) : -1;
        Py_XDECREF(adj);
        if (joins != 0) /* (an error or a join: Python) */
            goto out;
    }
    if (!(args = PySequence_Concat(aa, ba)))
        goto out;
    res = wrap_c(make_gemm_sum_c(args, sa, dt));
out:
    Py_XDECREF(be); Py_XDECREF(acc); Py_XDECREF(args);
    Py_DECREF(a);
    Py_DECREF(b);
    return res;
}

/* frontend.views.view_key: ("i", (start, stop, step) | int | None, ...) of a basic index of ints,
 * slices and None; NULL without an error for anything else */
static PyObject *
view_key_c(PyObject *key)
{
    int tup = PyTuple_CheckExact(key);
    Py_ssize_t n = tup ? PyTuple_GET_SIZE(key) : 1;
    PyObject *out = PyTuple_New(n + 1);
    if (out == NULL)
        return NULL;
    Py_INCREF(S_i);
    PyTuple_SET_ITEM(out, 0, S_i);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = tup ? PyTuple_GET_ITEM(key, i) : key, *v;
        if (PySlice_Check(k)) {
            PySliceObject *sl = (PySliceObject *)k;
            v = PyTuple_Pack(3, sl->start, sl->stop, sl->step);
            if (v == NULL) {
                Py_DECREF(out);
                return NULL;
            }
        } else if (PyLong_CheckExact(k) || k == Py_None) {
            Py_INCREF(k);
            v = k;
        } else {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i + 1, v);
    }
    return out;
}

/* frontend.views.cached_view: buffer n's view ``vk`` made before (borrowed), or NULL */
static PyObject *
cached_view_c(PyObject *n, PyObject *vk)
{
    if (!PyObject_TypeCheck(n, BufferT))
        return NULL;
    PyObject *bound = SLOT(n, B_bound);
    if (bound == NULL || !PyDict_Check(bound))
        return NULL;
    PyObject *views = PyDict_GetItemWithError(bound, S_views);
    if (views == NULL || !PyDict_Check(views))
        return NULL;
    return PyDict_GetItemWithError(views, vk);
}

/* ir.node.make_view_leaf with its layout known (frontend.views._arithmetic_view's geometry) */
static PyObject *
make_view_leaf_c(PyObject *source, PyObject *fn, PyObject *src_strides, PyObject *offset, PyObject *shape,
                 PyObject *estrides, PyObject *dtype, PyObject *device, PyObject *lay, PyObject *key)
{
    PyObject *n = new_buffer_leaf(ViewLeafT, dtype, shape, key, device, lay);
    if (n == NULL)
        return NULL;
    Py_INCREF(Py_None); Py_INCREF(source); Py_INCREF(fn); Py_INCREF(src_strides); Py_INCREF(offset);
    Py_INCREF(estrides); Py_INCREF(Py_None);
    set_slot(n, V_view, Py_None);
    set_slot(n, V_source, source);
    set_slot(n, V_fn, fn);
    set_slot(n, V_src_strides, src_strides);
    set_slot(n, V_offset, offset);
    set_slot(n, V_estrides, estrides);
    set_slot(n, V_src_bound, Py_None);
    return n;
}

static PyObject *data_view_c(PyObject *data, PyObject *fn, PyObject *vk, PyObject *dtype, PyObject *device);

/* frontend.views._leaf_view for one leaf of a pending op: a scalar itself, a buffer's cached view,
 * a slice of a GEMM's output (computed first, as Python does) as a ViewLeaf from the memoized
 * geometry. New reference; NULL without an error: the Python definition must run. */
static PyObject *
leaf_view_c(PyObject *a, PyObject *fn, PyObject *vk)
{
    PyObject *op = SLOT(a, N_op);
    if (is_str(op, S_scalar)) {
        Py_INCREF(a);
        return a;
    }
    if (is_str(op, S_buffer)) {
        PyObject *v = cached_view_c(a, vk);
        Py_XINCREF(v);
        return v;
    }
    if (!is_str(op, S_matmul))
        return NULL;
    PyObject *arith = PyDict_GetItemWithError(VIEWS_GLOBALS, S_ARITHMETIC);
    if (arith == NULL || PySequence_Contains(arith, S_i) != 1)
        return NULL;
    PyObject *data = SLOT(a, N_memo);
    if (data == Py_None) {
        data = compute_gemm_c(a);
        if (data == NULL)
            return NULL;
    } else {
        Py_INCREF(data);
    }
    PyObject *res = data_view_c(data, fn, vk, SLOT(a, N_dtype), SLOT(a, N_device));
    Py_DECREF(data);
    return res;
}

/* frontend.views._arithmetic_view from the memoized geometry: ``fn(data)`` (basic index ``vk``) as
 * a ViewLeaf. New reference; NULL without an error when the geometry is not memoized. */
static PyObject *
data_view_c(PyObject *data, PyObject *fn, PyObject *vk, PyObject *dtype, PyObject *device)
{
    PyObject *res = NULL, *k = NULL, *g = NULL, *dshape = NULL;
    PyObject *strides = PyObject_GetAttr(data, S_strides);
    if (strides == NULL || !(k = PyTuple_Pack(2, strides, dtype)))
        goto out;
    PyObject *src_strides = PyDict_GetItemWithError(ELEMENT_STRIDES, k);
    Py_CLEAR(k);
    if (src_strides == NULL || !(dshape = PyObject_GetAttr(data, S_shape_attr)))
        goto out;
    k = PyTuple_Pack(4, dshape, src_strides, vk, dtype);
    g = k ? PyDict_GetItemWithError(GEOMETRY, k) : NULL; /* a ViewGeometry(shape, estrides, offset, layout) */
    if (g == NULL || !PyTuple_Check(g) || PyTuple_GET_SIZE(g) != 4)
        goto out;
    PyObject *lay = PyTuple_GET_ITEM(g, 3);
    if (!PyTuple_Check(lay) || PyTuple_GET_SIZE(lay) != 2)
        goto out;
    res = make_view_leaf_c(data, fn, src_strides, PyTuple_GET_ITEM(g, 2), PyTuple_GET_ITEM(g, 0),
                           PyTuple_GET_ITEM(g, 1), dtype, device, PyTuple_GET_ITEM(lay, 0),
                           PyTuple_GET_ITEM(lay, 1));
out:
    Py_XDECREF(k);
    Py_XDECREF(dshape);
    Py_XDECREF(strides);
    return res;
}

static int fold_sum_c(PyObject *self, PyObject *n); /* (below, with the engine's pieces) */

/* frontend.views._buffer_view for a Buffer (not a ViewLeaf) with no cached view ``vk``: the view
 * from the memoized geometry, cached on the buffer as the Python definition caches it, wrapped.
 * New reference; NULL without an error: the Python definition runs. */
static PyObject *
fresh_view_c(PyObject *n, PyObject *vk)
{
    PyObject *arith = PyDict_GetItemWithError(VIEWS_GLOBALS, S_ARITHMETIC);
    if (arith == NULL || PySequence_Contains(arith, S_i) != 1)
        return NULL;
    PyObject *basic = PyDict_GetItemWithError(BASIC_INDEX, vk);
    if (basic == NULL || !PyTuple_Check(basic) || PyTuple_GET_SIZE(basic) != 2)
        return NULL;
    PyObject *data = PyObject_GetAttr(n, S_data);
    if (data == NULL)
        return NULL;
    PyObject *fn = Py_NewRef(PyTuple_GET_ITEM(basic, 1));
    PyObject *v = data_view_c(data, fn, vk, SLOT(n, N_dtype), SLOT(n, N_device));
    Py_DECREF(data);
    Py_DECREF(fn);
    if (v == NULL)
        return NULL;
    PyObject *bound = SLOT(n, B_bound), *views = NULL;
    if (bound == NULL || bound == Py_None) {
        if (!(bound = PyDict_New())) {
            Py_DECREF(v);
            return NULL;
        }
        set_slot(n, B_bound, bound);
    }
    if (!PyDict_Check(bound)) {
        Py_DECREF(v);
        return NULL; /* (not this case: Python) */
    }
    views = PyDict_GetItemWithError(bound, S_views);
    if (views == NULL || !PyDict_Check(views) || PyDict_GET_SIZE(views) > 64) {
        views = PyDict_New();
        if (views == NULL || PyDict_SetItem(bound, S_views, views) < 0) {
            Py_XDECREF(views);
            Py_DECREF(v);
            return NULL;
        }
        Py_DECREF(views);
    }
    if (PyDict_SetItem(views, vk, v) < 0) {
        Py_DECREF(v);
        return NULL;
    }
    return wrap_c(v); /* (steals v) */
}

/* Array.__getitem__'s common case: a basic index seen before (its pieces memoized) of memory (a
 * cached view) or of one op over two distinct leaves (x@W + b: the gate slices of an LSTM step),
 * no gradient trace, the array not itself a view of a pending array. New reference; NULL without
 * an error: the Python definition runs. */
static PyObject *
getitem_fast(PyObject *self, PyObject *key)
{
    PyObject *t = PyDict_GetItemWithError(ARRAY_GLOBALS, S_TAPE);
    if ((t != NULL && t != Py_None) || PyErr_Occurred())
        return NULL;
    PyObject *n = SLOT(self, A_node), *base = SLOT(self, A_base);
    if (n == NULL || base != Py_None)
        return NULL;
    PyObject *vk = view_key_c(key);
    if (vk == NULL)
        return NULL;
    Py_INCREF(n); /* (a GEMM computed below runs Python code: the node and its leaves stay alive) */
    PyObject *res = NULL, *sk = NULL, *v0 = NULL, *v1 = NULL;
    int folded = fold_sum_c(self, n);
    if (folded < 0)
        goto out;
    if (folded) { /* x@W + h@U + b is memory now: sliced as memory */
        Py_SETREF(n, Py_NewRef(SLOT(self, A_node)));
    }
    if (is_str(SLOT(n, N_op), S_buffer)) {
        PyObject *v = cached_view_c(n, vk);
        if (v != NULL) {
            Py_INCREF(v);
            res = wrap_c(v);
        } else if (!PyErr_Occurred() && Py_TYPE(n) == BufferT) {
            res = fresh_view_c(n, vk); /* (memory not sliced this way before: a fresh output) */
        }
        goto out;
    }
    PyObject *basic = PyDict_GetItemWithError(BASIC_INDEX, vk);
    if (basic == NULL || !PyTuple_Check(basic) || PyTuple_GET_SIZE(basic) != 2)
        goto out;
    PyObject *fn = PyTuple_GET_ITEM(basic, 1), *args = SLOT(n, N_args), *nop = SLOT(n, N_op);
    if (PyTuple_GET_SIZE(args) != 2 || PyTuple_GET_SIZE(SLOT(n, N_leaves)) == 0 || is_str(nop, S_matmul) ||
        is_str(nop, S_reduce) || is_str(nop, S_expand))
        goto out; /* (a GEMM or a reduction at the root: Python realizes it first) */
    PyObject *a0 = PyTuple_GET_ITEM(args, 0), *a1 = PyTuple_GET_ITEM(args, 1);
    if (a0 == a1)
        goto out;
    for (int i = 0; i < 2; i++) {
        PyObject *op = SLOT(i ? a1 : a0, N_op);
        if (!is_str(op, S_buffer) && !is_str(op, S_scalar) && !is_str(op, S_matmul))
            goto out; /* (a deeper tree: the Python walk) */
    }
    sk = PyTuple_Pack(2, vk, SLOT(n, N_shape));
    PyObject *shape = sk ? PyDict_GetItemWithError(INDEX_SHAPES, sk) : NULL;
    if (shape == NULL || !PyTuple_Check(shape))
        goto out;
    Py_INCREF(shape);
    Py_INCREF(fn);
    if ((v0 = leaf_view_c(a0, fn, vk)) != NULL && (v1 = leaf_view_c(a1, fn, vk)) != NULL) {
        PyObject *pair = PyTuple_Pack(2, v0, v1);
        PyObject *node = pair ? make_op_c(SLOT(n, N_op), pair, SLOT(n, N_dtype), shape, SLOT(n, N_device),
                                          SLOT(n, N_attrs))
                              : NULL;
        Py_XDECREF(pair);
        PyObject *v = wrap_c(node); /* (steals node) */
        if (v != NULL) { /* Array._derive: the view's base, and the array's list of live views */
            PyObject *rs = PyWeakref_NewRef(self, NULL), *rv = rs ? PyWeakref_NewRef(v, NULL) : NULL;
            PyObject *b = rv ? PyTuple_Pack(2, rs, fn) : NULL;
            PyObject *views = SLOT(self, A_views);
            int ok = b != NULL;
            if (ok && (views == NULL || views == Py_None)) {
                views = PyList_New(0);
                if (views == NULL)
                    ok = 0;
                else
                    set_slot(self, A_views, views);
            } else if (ok && PyList_Check(views) && PyList_GET_SIZE(views) > 32) {
                Py_ssize_t w = 0; /* drop the dead ones */
                for (Py_ssize_t i = 0; i < PyList_GET_SIZE(views); i++) {
                    PyObject *r = PyList_GET_ITEM(views, i);
                    if (PyWeakref_Check(r) && PyWeakref_GetObject(r) != Py_None) {
                        Py_INCREF(r);
                        PyList_SetItem(views, w++, r);
                    }
                }
                ok = PyList_SetSlice(views, w, PyList_GET_SIZE(views), NULL) == 0;
            }
            if (ok && (!PyList_Check(views) || PyList_Append(views, rv) < 0))
                ok = 0;
            if (ok)
                set_slot(v, A_base, Py_NewRef(b));
            Py_XDECREF(rs); Py_XDECREF(rv); Py_XDECREF(b);
            if (!ok) {
                Py_CLEAR(v);
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_TypeError, "__getitem__: an array's _views is a list");
            }
        }
        res = v;
    }
    Py_DECREF(shape);
    Py_DECREF(fn);
out:
    Py_XDECREF(v0);
    Py_XDECREF(v1);
    Py_XDECREF(sk);
    Py_DECREF(vk);
    Py_DECREF(n);
    return res;
}

static PyObject *S_acquire, *S_release; /* (set with the engine's names below) */
static int count(PyObject *name);

/* LOCK.release(), keeping an exception being raised: 0, or -1 with an exception set (the one
 * being raised, else the release's own) */
static int
release_engine_lock(void)
{
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyObject *ul = PyObject_CallMethodNoArgs(LOCK, S_release);
    if (et != NULL) {
        Py_XDECREF(ul);
        PyErr_Restore(et, ev, tb);
        return -1;
    }
    if (ul == NULL)
        return -1;
    Py_DECREF(ul);
    return 0;
}

/* Whether ``x[...] = value`` is queued (ft.options(defer_stores=True), fusion on) */
static int
deferring_c(void)
{
    int fuse, defer;
    if (options_c(&fuse, &defer) < 0)
        return -1;
    return fuse && defer;
}

/* engine.stores.defer for ``arr[...] = value`` of the target's shape and dtype (what
 * Array.__setitem__'s fast path queues; the caller checked shape, dtype and mode): the store
 * queued (its Store, the owner table, the sorted spans, the queue's operand watch), the array
 * rebound to the value. 1: queued, 0: not this case (nothing changed: Python decides), -1: error. */
static int
defer_c(PyObject *arr, PyObject *value)
{
    PyObject *vnode = SLOT(value, A_node);
    if (vnode == NULL || is_str(SLOT(vnode, N_op), S_buffer) || is_str(SLOT(vnode, N_op), S_scalar) ||
        is_str(SLOT(vnode, N_op), S_matmul))
        return 0;
    long long fl = as_ll(SLOT(vnode, N_flags));
    if (fl == -1 && PyErr_Occurred())
        return -1;
    if (fl & (F_REDUCE | F_EXPAND))
        return 0;
    PyObject *leaves = SLOT(vnode, N_leaves);
    int array_leaf = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(leaves) && !array_leaf; i++)
        array_leaf = !is_str(SLOT(PyTuple_GET_ITEM(leaves, i), N_op), S_scalar);
    if (!array_leaf) /* (a fill: written now) */
        return 0;
    PyObject *lk = PyObject_CallMethodNoArgs(LOCK, S_acquire);
    if (lk == NULL)
        return -1;
    Py_DECREF(lk);
    int done = 0;
    Py_INCREF(vnode); /* (held while Python code runs: a view's data, the flush) */
    PyObject *key = NULL, *rec = NULL, *span = NULL, *where = NULL, *tnode = NULL;
    if (!(key = PyLong_FromVoidPtr(arr)))
        goto error;
    rec = PyDict_GetItemWithError(ST_OWNERS, key);
    if (rec == NULL && PyErr_Occurred())
        goto error;
    if (rec != NULL) {
        PyObject *owner = PyObject_GetAttr(rec, S_owner);
        if (owner == NULL)
            goto error;
        Py_DECREF(owner);
        rec = owner == arr ? Py_NewRef(rec) : NULL;
    }
    tnode = rec == NULL ? Py_NewRef(SLOT(arr, A_node)) : PyObject_GetAttr(rec, S_tnode);
    if (tnode == NULL)
        goto error;
    if (!is_str(SLOT(tnode, N_op), S_buffer))
        goto out;
    PyObject *vd = SLOT(vnode, N_device), *td = SLOT(tnode, N_device);
    if (vd != Py_None && vd != td && PyObject_RichCompareBool(vd, td, Py_EQ) != 1)
        goto out;
    if (rec != NULL) { /* a second store: not while views of the queued value live */
        PyObject *views = SLOT(arr, A_views);
        if (views != NULL && views != Py_None) {
            if (!PyList_Check(views))
                goto out;
            for (Py_ssize_t i = 0; i < PyList_GET_SIZE(views); i++) {
                PyObject *r = PyList_GET_ITEM(views, i);
                if (!PyWeakref_Check(r) || PyWeakref_GetObject(r) != Py_None)
                    goto out;
            }
        }
    } else {
        if (!(span = span_of_node(tnode)))
            goto error;
        int o = overlapping_c(PyTuple_GET_ITEM(span, 0), PyTuple_GET_ITEM(span, 1));
        if (o < 0)
            goto error;
        if (o) /* (another array over this memory has a queued store: Python flushes, stores) */
            goto out;
    }
    /* the user's statement: the first frame outside the package */
    PyFrameObject *f = PyEval_GetFrame();
    Py_XINCREF(f);
    while (f != NULL) {
        PyCodeObject *code = PyFrame_GetCode(f);
        int inside = PyUnicode_Tailmatch(code->co_filename, ST_PACKAGE, 0, PY_SSIZE_T_MAX, -1);
        Py_DECREF(code);
        if (inside < 0) {
            Py_DECREF(f);
            goto error;
        }
        if (!inside)
            break;
        PyFrameObject *b = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = b;
    }
    if (f != NULL) { /* (code, bytecode offset): the line is found when asked (stores.site_of) */
        PyCodeObject *code = PyFrame_GetCode(f);
        where = Py_BuildValue("(Oi)", (PyObject *)code, PyFrame_GetLasti(f));
        Py_DECREF(code);
        Py_DECREF(f);
    } else {
        where = Py_BuildValue("(Oi)", Py_None, 0);
    }
    if (where == NULL)
        goto error;
    if (rec != NULL) {
        if (PyObject_SetAttr(rec, S_node_attr, vnode) < 0 || PyObject_SetAttr(rec, S_where, where) < 0)
            goto error;
    } else {
        /* Store(arr, tnode, vnode, span, where), its __init__ in C */
        PyObject *target = PyObject_GetAttr(tnode, S_data);
        PyObject *st = target ? ((PyTypeObject *)ST_STORE)->tp_alloc((PyTypeObject *)ST_STORE, 0) : NULL;
        if (st == NULL) {
            Py_XDECREF(target);
            goto error;
        }
        set_slot(st, T_owner, Py_NewRef(arr));
        set_slot(st, T_tnode, Py_NewRef(tnode));
        set_slot(st, T_target, target);
        set_slot(st, T_device, Py_NewRef(SLOT(tnode, N_device)));
        set_slot(st, T_node, Py_NewRef(vnode));
        set_slot(st, T_span, Py_NewRef(span));
        set_slot(st, T_where, Py_NewRef(where));
        PyObject *lo = PyTuple_GET_ITEM(span, 0), *hi = PyTuple_GET_ITEM(span, 1);
        Py_ssize_t a = bisect_left_c(ST_LOS, lo);
        int bad = a < 0 || PyList_Append(STORES, st) < 0 || PyDict_SetItem(ST_OWNERS, key, st) < 0 ||
                  PyList_Insert(ST_LOS, a, lo) < 0 || PyList_Insert(ST_HIS, a, hi) < 0 ||
                  PyDict_SetItem(NODE_GLOBALS, S_WATCH, ST_WATCH) < 0;
        Py_DECREF(st);
        if (bad)
            goto error;
    }
    Py_INCREF(vnode);
    set_slot(arr, A_node, vnode);
    if (count(S_stores) < 0)
        goto error;
    done = 1;
    PyObject *mx = PyDict_GetItemWithError(ST_GLOBALS, S_MAX_QUEUED);
    Py_ssize_t most = mx ? PyLong_AsSsize_t(mx) : PyErr_Occurred() ? -1 : 4096;
    if (most == -1 && PyErr_Occurred())
        goto error;
    if (PyList_GET_SIZE(STORES) >= most) {
        PyObject *r = PyObject_CallNoArgs(ST_FLUSH);
        if (r == NULL)
            goto error;
        Py_DECREF(r);
    }
    goto out;
error:
    done = -1;
out:
    Py_XDECREF(key); Py_XDECREF(rec); Py_XDECREF(span); Py_XDECREF(where); Py_XDECREF(tnode);
    Py_DECREF(vnode);
    return release_engine_lock() < 0 ? -1 : done;
}

/* Array.__setitem__'s fast path: ``x[...] = value`` of a pending Array of x's shape and dtype
 * (not complex) while stores are deferred and no gradient is traced: queued by defer_c. 1: done,
 * 0: the Python definition runs, -1: error. */
static int
setitem_fast(PyObject *x, PyObject *key, PyObject *value)
{
    if (key != Py_Ellipsis || Py_TYPE(value) != ArrayT || ST_OWNERS == NULL || STORES == NULL)
        return 0;
    PyObject *t = PyDict_GetItemWithError(ARRAY_GLOBALS, S_TAPE);
    if (t != NULL && t != Py_None)
        return 0;
    int d = deferring_c();
    if (d <= 0)
        return d;
    PyObject *n = SLOT(x, A_node), *vn = SLOT(value, A_node);
    if (n == NULL || vn == NULL)
        return 0;
    PyObject *sa = SLOT(n, N_shape), *sb = SLOT(vn, N_shape), *da = SLOT(n, N_dtype), *db = SLOT(vn, N_dtype);
    if ((sa != sb && PyObject_RichCompareBool(sa, sb, Py_EQ) != 1) ||
        (da != db && PyObject_RichCompareBool(da, db, Py_EQ) != 1))
        return PyErr_Occurred() ? -1 : 0;
    static PyObject *real_dt = NULL; /* the last dtype found not complex (a reference kept) */
    if (da != real_dt) {
        PyObject *kind = PyObject_GetAttr(da, S_kind);
        if (kind == NULL)
            return -1;
        int complex = !PyUnicode_Check(kind) || PyUnicode_CompareWithASCIIString(kind, "c") == 0;
        Py_DECREF(kind);
        if (complex)
            return 0;
        Py_INCREF(da);
        Py_XSETREF(real_dt, da);
    }
    return defer_c(x, value);
}

/* frontend.array.record for an elementwise op: (name, inputs, (), out node) appended to the trace,
 * the result's uid in tape.produced, the inputs' in tape.whole. Steals ``res`` (an Array or NULL)
 * and returns it; NULL on error. ``inputs``: the operands as the user gave them (a broadcast
 * operand before its view), borrowed. */
static PyObject *
traced(PyObject *tape, PyObject *name, PyObject *inputs, PyObject *res)
{
    static PyObject *s_produced = NULL, *s_whole = NULL;
    if (res == NULL)
        goto error;
    if (s_produced == NULL && (!(s_produced = PyUnicode_InternFromString("produced")) ||
                               !(s_whole = PyUnicode_InternFromString("whole"))))
        goto error;
    PyObject *out = SLOT(res, A_node);
    PyObject *entry = PyTuple_Pack(4, name, inputs, EMPTY, out);
    if (entry == NULL)
        goto error;
    int bad = PyList_Append(tape, entry) < 0;
    Py_DECREF(entry);
    PyObject *produced = bad ? NULL : PyObject_GetAttr(tape, s_produced);
    PyObject *whole = produced ? PyObject_GetAttr(tape, s_whole) : NULL;
    bad = whole == NULL || PySet_Add(produced, SLOT(out, N_uid)) < 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(inputs) && !bad; i++)
        bad = PySet_Add(whole, SLOT(PyTuple_GET_ITEM(inputs, i), N_uid)) < 0;
    Py_XDECREF(produced);
    Py_XDECREF(whole);
    if (!bad)
        return res;
error:
    Py_XDECREF(res);
    return NULL;
}

/* result(), and while a gradient is traced (``tape`` not NULL) its trace entry, whose inputs are
 * ``given`` (borrowed; NULL: the op's own ``args``, which this steals as result does) */
static PyObject *
result_traced(PyObject *tape, PyObject *name, PyObject *args, PyObject *out, PyObject *a, PyObject *given)
{
    if (tape == NULL || args == NULL)
        return result(name, args, out, a);
    PyObject *ins = Py_NewRef(given != NULL ? given : args);
    PyObject *r = traced(tape, name, ins, result(name, args, out, a));
    Py_DECREF(ins);
    return r;
}

static PyObject *
operator_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Operator *o = (Operator *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || ArrayT == NULL || NodeT == NULL)
        goto fallback;
    PyObject *tape; /* (a gradient trace, or NULL: see fast_mode) */
    if (o->kind == UNARY) {
        if (nargs != 1 || Py_TYPE(args[0]) != ArrayT || !fast_mode(&tape))
            goto fallback;
        if (watch_operands(args[0], NULL) < 0)
            return NULL;
        PyObject *a = SLOT(args[0], A_node);
        if (a == NULL || is_str(SLOT(a, N_op), S_scalar))
            goto fallback;
        PyObject *out = rule_memo(o, RULES1, SLOT(a, N_dtype), NULL);
        if (out == NULL)
            goto fallback;
        return result_traced(tape, o->name, PyTuple_Pack(1, a), out, a, NULL);
    }
    if (o->kind == SETITEM) {
        if (nargs != 3 || Py_TYPE(args[0]) != ArrayT)
            goto fallback;
        int r = setitem_fast(args[0], args[1], args[2]);
        if (r > 0)
            Py_RETURN_NONE;
        if (r < 0)
            return NULL;
        goto fallback;
    }
    if (o->kind == GETITEM) {
        if (nargs != 2 || Py_TYPE(args[0]) != ArrayT)
            goto fallback;
        PyObject *r = getitem_fast(args[0], args[1]);
        if (r != NULL || PyErr_Occurred())
            return r;
        goto fallback;
    }
    if (o->kind == MATMUL) {
        if (nargs != 2 || Py_TYPE(args[0]) != ArrayT || Py_TYPE(args[1]) != ArrayT)
            goto fallback;
        PyObject *r = matmul_fast(args[0], args[1]);
        if (r != NULL || PyErr_Occurred())
            return r;
        goto fallback;
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
    if (!fast_mode(&tape))
        goto fallback;
    if (watch_operands(args[0], both ? other : NULL) < 0)
        return NULL;
    PyObject *a = SLOT(args[0], A_node);
    if (a == NULL)
        goto fallback;
    if (both) {
        PyObject *b = SLOT(other, A_node);
        if (b == NULL)
            goto fallback;
        if (tape != NULL && (is_str(SLOT(a, N_op), S_matmul) || is_str(SLOT(b, N_op), S_matmul)))
            goto fallback; /* (a traced GEMM fold or join: the Python operator records it) */
        if (is_str(SLOT(a, N_op), S_matmul) && is_str(SLOT(b, N_op), S_matmul)) { /* x@W + h@U */
            PyObject *r = PyUnicode_CompareWithASCIIString(o->name, "add") == 0 ? fold_fast(a, b) : NULL;
            if (r != NULL || PyErr_Occurred())
                return r;
            goto fallback; /* (the Python operator: joins, other operators) */
        }
        PyObject *da = SLOT(a, N_device), *db = SLOT(b, N_device);
        if (da != db && PyObject_RichCompareBool(da, db, Py_EQ) != 1)
            goto fallback;
        PyObject *out = rule_memo(o, RULES2, SLOT(a, N_dtype), SLOT(b, N_dtype));
        if (out == NULL)
            goto fallback;
        PyObject *sa = SLOT(a, N_shape), *sb = SLOT(b, N_shape);
        if (sa != sb && PyObject_RichCompareBool(sa, sb, Py_EQ) != 1) {
            /* a buffer broadcast to the other's shape before (x + bias, c[0] * x): its cached view
             * (frontend.array._seen_broadcast); any other broadcast: the Python operator */
            PyObject *va = NULL, *vb = seen_broadcast(b, sa);
            if (vb == NULL && (PyErr_Occurred() || (va = seen_broadcast(a, sb)) == NULL))
                goto fallback;
            /* (a trace names the operands before the broadcast, as the Python operator's does) */
            PyObject *given = tape != NULL ? PyTuple_Pack(2, a, b) : NULL;
            if (tape != NULL && given == NULL)
                return NULL;
            PyObject *r = vb != NULL ? result_traced(tape, o->name, PyTuple_Pack(2, a, vb), out, a, given)
                                     : result_traced(tape, o->name, PyTuple_Pack(2, va, b), out, b, given);
            Py_XDECREF(given);
            return r;
        }
        return result_traced(tape, o->name, PyTuple_Pack(2, a, b), out, a, NULL);
    }
    {
        if (o->kind == REFLECTED && is_str(SLOT(a, N_op), S_matmul))
            goto fallback;
        PyObject *out = o->kind == REFLECTED ? rule_memo(o, RULES2, (PyObject *)t, SLOT(a, N_dtype))
                                             : rule_memo(o, RULES2, SLOT(a, N_dtype), (PyObject *)t);
        if (out == NULL)
            goto fallback;
        Py_INCREF(out); /* the scalar's construction may run Python code */
        PyObject *s = t == &PyFloat_Type ? make_float(other) : PyObject_CallOneArg(MAKE_SCALAR_PY, other);
        if (s == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyObject *r = result_traced(tape, o->name, o->kind == REFLECTED ? PyTuple_Pack(2, s, a) : PyTuple_Pack(2, a, s),
                                    out, a, NULL);
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
    Py_XDECREF(o->last_k0);
    Py_XDECREF(o->last_k1);
    Py_XDECREF(o->last_out);
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
    if (kind < BINARY || kind > SETITEM || !PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_ValueError, "operator(name, kind 0-5, fallback callable, qualname)");
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
    o->last_k0 = o->last_k1 = o->last_out = NULL;
    PyObject_GC_Track((PyObject *)o);
    return (PyObject *)o;
}

/* ------------------------------------------------------------------------------------------ */
/* engine: a plan hit realized (engine.realization.realize's fast path) */


static long long BY_SIZE;
static PyObject *S_opts, *S_plans, *S_be, *S_single, *S_launcher, *S_geometry, *S_forms, *S_out_layouts,
    *S_outputs, *S_keyed_by_shape, *S_used, *S_bound, *S_recorder, *S_tape, *S_empty, *S_launch,
    *S_scalar_arg, *S_acquire, *S_release, *S_launches, *S_kernels, *S_plan_hits, *S_cache_hits, *S_C,
    *S_offset_form, *S_itemsize, *S_flat_launch, *S_flat, *S_flat_view_dtypes, *S_fast_empty, *S_reshape,
    *S_direct;
static PyObject *S_base, *S_flags, *S_c_contiguous, *S_dtype_attr, *S_size, *F16_DT;
static PyObject *S_gemm, *S_gemms;
static PyObject *S_pack_direct, *S_data, *S_ptr, *S_calls, *S_fmt, *S_bufaddr, *S_args, *S_stream_ptr,
    *S_launch_failed, *S_name;
/* (defined with pack_launch below) */
static int pack_slots(const char *fmt, Py_ssize_t n, PyObject **items, char *buf);
static int launch_call(PyObject *call, void *stream, void *params, int *status);
static int have_launcher(void);
static PyObject *PATHS[9], *LAYOUTS[9]; /* ((0, ()), (1, ()), ...) and ("C", ...) per root count */
#define MAX_ROOTS 8

static PyObject *
setup_engine_impl(PyObject *d)
{
    if (!PyDict_Check(d)) {
        PyErr_SetString(PyExc_TypeError, "setup_engine takes a dict");
        return NULL;
    }
    if (!(CONTEXTS = get_obj(d, "CONTEXTS")) || !(STATS = get_obj(d, "STATS")) ||
        !(TICK = get_obj(d, "TICK")) || !(HOOK = get_obj(d, "HOOK")) || !(STORES = get_obj(d, "STORES")) ||
        !(LOCK = get_obj(d, "LOCK")) || !(BY_SHAPE = get_obj(d, "BY_SHAPE")) ||
        !(BIND_LEAF = get_obj(d, "bind_leaf")) || !(MAKE_CONTIGUOUS = get_obj(d, "make_contiguous")) ||
        !(SET_BUFFER = get_obj(d, "set_buffer")) || !(SOURCE_BOUND = get_obj(d, "source_bound")) ||
        !(RECENT_SOURCES = get_obj(d, "RECENT_SOURCES")) || !(F16_DT = get_obj(d, "FLOAT16")))
        return NULL;
    if (get_ll(d, "BY_SIZE", &BY_SIZE))
        return NULL;
    if (!PyList_Check(STORES) || !PyDict_Check(CONTEXTS) || !PyDict_Check(STATS) || !PyList_Check(RECENT_SOURCES)) {
        PyErr_SetString(PyExc_TypeError, "setup_engine: STORES and RECENT_SOURCES are lists, CONTEXTS and STATS dicts");
        return NULL;
    }
    for (int k = 1; k <= MAX_ROOTS; k++) {
        PyObject *p = PyTuple_New(k), *l = PyTuple_New(k);
        if (p == NULL || l == NULL)
            return NULL;
        for (int i = 0; i < k; i++) {
            PyObject *e = Py_BuildValue("(iO)", i, EMPTY);
            if (e == NULL)
                return NULL;
            PyTuple_SET_ITEM(p, i, e);
            Py_INCREF(S_C);
            PyTuple_SET_ITEM(l, i, S_C);
        }
        Py_XSETREF(PATHS[k], p);
        Py_XSETREF(LAYOUTS[k], l);
    }
    Py_RETURN_NONE;
}

static PyObject *
setup_engine(PyObject *self, PyObject *d)
{
    PyObject *r = NodeT == NULL ? (PyErr_SetString(PyExc_RuntimeError, "setup_nodes first"), NULL)
                                : setup_engine_impl(d); /* (realize_hit also needs setup_arrays) */
    if (r == NULL)
        Py_CLEAR(CONTEXTS); /* refuses: realize_hit declines */
    return r;
}

/* STATS[name] += k */
static int
count_by(PyObject *name, long long k)
{
    PyObject *v = PyDict_GetItemWithError(STATS, name);
    if (v == NULL)
        return PyErr_Occurred() ? -1 : 0;
    long long c = as_ll(v);
    PyObject *w = c == -1 && PyErr_Occurred() ? NULL : PyLong_FromLongLong(c + k);
    if (w == NULL)
        return -1;
    int r = PyDict_SetItem(STATS, name, w);
    Py_DECREF(w);
    return r;
}

/* STATS[name] += 1 */
static int
count(PyObject *name)
{
    return count_by(name, 1);
}

/* realization.compute_gemm (run a pending GEMM sum once, memoized on its node) in C: under the
 * engine lock, the products through the backend's gemm (the first allocates the output, the
 * others accumulate into it), the launch counters; a jit recording or a device without an engine
 * context yet: the Python definition. New reference. */
static PyObject *
compute_gemm_c(PyObject *n)
{
    PyObject *m = SLOT(n, N_memo);
    if (m != Py_None)
        return Py_NewRef(m);
    if (CONTEXTS == NULL || HOOK == NULL)
        return PyObject_CallOneArg(COMPUTE_GEMM, n);
    PyObject *rec = PyObject_GetAttr(HOOK, S_recorder);
    if (rec == NULL)
        return NULL;
    Py_DECREF(rec);
    PyObject *ctx = rec == Py_None ? PyDict_GetItemWithError(CONTEXTS, SLOT(n, N_device)) : NULL;
    PyObject *args = SLOT(n, N_args);
    Py_ssize_t na = PyTuple_GET_SIZE(args);
    if (ctx == NULL || na < 2 || na % 2 || na > 16) {
        if (PyErr_Occurred())
            return NULL;
        return PyObject_CallOneArg(COMPUTE_GEMM, n);
    }
    PyObject *be = PyObject_GetAttr(ctx, S_be);
    if (be == NULL)
        return NULL;
    PyObject *lk = PyObject_CallMethodNoArgs(LOCK, S_acquire), *out = NULL, *ops[16] = {NULL};
    if (lk == NULL) {
        Py_DECREF(be);
        return NULL;
    }
    Py_DECREF(lk);
    Py_INCREF(n); /* (held while Python code runs) */
    m = SLOT(n, N_memo);
    if (m != Py_None) { /* (another thread computed it meanwhile) */
        out = Py_NewRef(m);
        goto done;
    }
    for (Py_ssize_t i = 0; i < na; i++)
        if (!(ops[i] = PyObject_GetAttr(PyTuple_GET_ITEM(args, i), S_data)))
            goto done;
    static PyObject *s_host_matmul = NULL;
    if (s_host_matmul == NULL && !(s_host_matmul = PyUnicode_InternFromString("host_matmul")))
        goto done;
    PyObject *mm = PyObject_GetAttr(be, s_host_matmul);
    if (mm == NULL)
        goto done;
    if (mm != Py_None) { /* a host backend: its products called directly, the others added in place */
        out = PyObject_Vectorcall(mm, ops, 2, NULL);
        for (Py_ssize_t i = 2; i < na && out != NULL; i += 2) {
            PyObject *r = PyObject_Vectorcall(mm, ops + i, 2, NULL);
            PyObject *sum = r ? PyNumber_InPlaceAdd(out, r) : NULL;
            Py_XDECREF(r);
            Py_SETREF(out, sum);
        }
    } else {
        out = PyObject_VectorcallMethod(S_gemm, (PyObject *[]){be, ops[0], ops[1]},
                                        3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        for (Py_ssize_t i = 2; i < na && out != NULL; i += 2) {
            PyObject *r = PyObject_VectorcallMethod(S_gemm, (PyObject *[]){be, ops[i], ops[i + 1], out, Py_True},
                                                    5 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            Py_SETREF(out, r);
        }
    }
    Py_DECREF(mm);
    if (out == NULL || count_by(S_launches, na / 2) < 0 || count_by(S_gemms, na / 2) < 0) {
        Py_CLEAR(out);
        goto done;
    }
    set_slot(n, N_memo, Py_NewRef(out));
done:
    for (Py_ssize_t i = 0; i < na; i++)
        Py_XDECREF(ops[i]);
    if (release_engine_lock() < 0)
        Py_CLEAR(out);
    Py_DECREF(n);
    Py_DECREF(be);
    return out;
}

/* attribute ``name`` of ``o`` is None (0), not None (1); -1 on error */
static int
attr_set(PyObject *o, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL)
        return -1;
    int r = v != Py_None;
    Py_DECREF(v);
    return r;
}

/* engine.realization.set_buffer(arr, data, device, node) for an array with no live views (else the
 * Python definition); no gradient tape is recording (checked by the caller). */
static int
set_buffer_c(PyObject *arr, PyObject *data, PyObject *device, PyObject *node)
{
    if (SLOT(arr, A_views) != Py_None) {
        PyObject *r = PyObject_Vectorcall(SET_BUFFER, (PyObject *[]){arr, data, device, node}, 4, NULL);
        Py_XDECREF(r);
        return r == NULL ? -1 : 0;
    }
    Py_INCREF(node);
    set_slot(arr, A_node, node);
    Py_INCREF(Py_None);
    set_slot(arr, A_base, Py_None);
    PyObject *ref = SLOT(arr, A_pref);
    if (ref != NULL && ref != Py_None) {
        PyObject *id = PyLong_FromVoidPtr(ref);
        if (id == NULL)
            return -1;
        if (PyDict_DelItem(PENDING, id) < 0) {
            if (!PyErr_ExceptionMatches(PyExc_KeyError)) {
                Py_DECREF(id);
                return -1;
            }
            PyErr_Clear();
        }
        Py_DECREF(id);
        Py_INCREF(Py_None);
        set_slot(arr, A_pref, Py_None);
    }
    return 0;
}

/* ir.node.make_contiguous(data, device, shape, dtype): a leaf for a fresh C-contiguous array (the
 * Python definition when its buffer key is not interned yet). New reference. */
static PyObject *
make_contiguous_c(PyObject *data, PyObject *device, PyObject *shape, PyObject *dt)
{
    PyObject *bk = Py_BuildValue("(OnO)", dt, PyTuple_GET_SIZE(shape), S_C);
    if (bk == NULL)
        return NULL;
    PyObject *key = PyDict_GetItemWithError(BUFFER_KEYS, bk);
    Py_DECREF(bk);
    if (key == NULL) {
        if (PyErr_Occurred())
            return NULL;
        return PyObject_Vectorcall(MAKE_CONTIGUOUS, (PyObject *[]){data, device, shape, dt}, 4, NULL);
    }
    PyObject *n = new_buffer_leaf(BufferT, dt, shape, key, device, S_C);
    if (n != NULL) {
        Py_INCREF(data);
        set_slot(n, B_data, data);
    }
    return n;
}

/* engine.realization.fold_sliced_sum before ``self`` (node ``n``) is sliced: ``GEMM + buffer`` of
 * one float dtype on a backend with ``fold_sliced_sums`` computed into memory (the buffer's data
 * added to the GEMM's output), the array a buffer over it. 1: done, 0: not this case (nothing
 * changed), -1: error. */
static int
fold_sum_c(PyObject *self, PyObject *n)
{
    static PyObject *s_fold = NULL, *s_add = NULL, *s_f = NULL;
    if (s_fold == NULL && (!(s_fold = PyUnicode_InternFromString("fold_sliced_sums")) ||
                           !(s_add = PyUnicode_InternFromString("add")) || !(s_f = PyUnicode_InternFromString("f"))))
        return -1;
    PyObject *op = SLOT(n, N_op), *args = SLOT(n, N_args);
    if (!is_str(op, s_add) || PyTuple_GET_SIZE(args) != 2 || CONTEXTS == NULL || HOOK == NULL || STORES == NULL ||
        !PyList_Check(STORES) || PyList_GET_SIZE(STORES) > 0)
        return 0;
    PyObject *g = PyTuple_GET_ITEM(args, 0), *b = PyTuple_GET_ITEM(args, 1);
    if (is_str(SLOT(g, N_op), S_buffer) && is_str(SLOT(b, N_op), S_matmul)) {
        PyObject *t = g;
        g = b;
        b = t;
    }
    PyObject *dt = SLOT(n, N_dtype);
    if (!is_str(SLOT(g, N_op), S_matmul) || !is_str(SLOT(b, N_op), S_buffer))
        return 0;
    int same = (SLOT(g, N_dtype) == dt || PyObject_RichCompareBool(SLOT(g, N_dtype), dt, Py_EQ) == 1) &&
               (SLOT(b, N_dtype) == dt || PyObject_RichCompareBool(SLOT(b, N_dtype), dt, Py_EQ) == 1);
    if (!same)
        return PyErr_Occurred() ? -1 : 0;
    PyObject *kind = PyObject_GetAttr(dt, S_kind);
    if (kind == NULL)
        return -1;
    int real = PyUnicode_Check(kind) && PyUnicode_Compare(kind, s_f) == 0;
    Py_DECREF(kind);
    int rec = attr_set(HOOK, S_recorder), tape = rec ? rec : attr_set(HOOK, S_tape);
    if (!real || rec != 0 || tape != 0)
        return rec < 0 || tape < 0 ? -1 : 0;
    PyObject *device = SLOT(n, N_device), *ctx = PyDict_GetItemWithError(CONTEXTS, device);
    if (ctx == NULL)
        return PyErr_Occurred() ? -1 : 0; /* (no kernel run on this device yet: Python decides) */
    PyObject *be = PyObject_GetAttr(ctx, S_be), *flag = be ? PyObject_GetAttr(be, s_fold) : NULL;
    if (flag == NULL) {
        Py_XDECREF(be);
        return -1;
    }
    Py_DECREF(flag);
    if (flag != Py_True) {
        Py_DECREF(be);
        return 0;
    }
    Py_INCREF(n); /* (the GEMM's Python code may run) */
    int done = -1;
    PyObject *gd = NULL, *bd = NULL, *out = NULL, *node = NULL;
    PyObject *lk = PyObject_CallMethodNoArgs(LOCK, S_acquire); /* (an RLock: compute_gemm_c takes it too) */
    if (lk == NULL)
        goto end;
    Py_DECREF(lk);
    /* a GEMM sum computed here is this array's memory: the bias is added into it (not memoized on
     * the GEMM node: another tree reading it computes it again); one computed before is read */
    int fresh = SLOT(g, N_memo) == Py_None;
    if (!(gd = compute_gemm_c(g)) || !(bd = PyObject_GetAttr(b, S_data)))
        goto unlock;
    if (fresh)
        set_slot(g, N_memo, Py_NewRef(Py_None));
    out = fresh ? PyNumber_InPlaceAdd(gd, bd) : PyNumber_Add(gd, bd);
    if (out != NULL && (node = make_contiguous_c(out, device, SLOT(n, N_shape), dt)) != NULL)
        done = set_buffer_c(self, out, device, node) < 0 ? -1 : 1;
unlock:
    if (release_engine_lock() < 0)
        done = -1;
end:
    Py_XDECREF(gd); Py_XDECREF(bd); Py_XDECREF(out); Py_XDECREF(node);
    Py_DECREF(n);
    Py_DECREF(be);
    return done;
}

/* executor.source_bound's common case: ``leaf``'s source a whole allocation of its own (a GEMM's
 * fresh output: no base, C-contiguous, not empty, not float16, element strides equal to the
 * leaf's src_strides), bound as the backend's bind does (form 1: (its 1-D reshape, 0, *element
 * strides); form 2: (pointer, *element strides)) and remembered in RECENT_SOURCES as the Python
 * definition does. NULL without an error: not this case (Python). New reference. */
static PyObject *
source_bound_c(long form, PyObject *leaf)
{
    PyObject *source = SLOT(leaf, V_source), *res = NULL, *base = NULL, *flags = NULL, *cc = NULL, *dt = NULL,
             *strides = NULL, *item = NULL, *first = NULL, *data = NULL;
    if (source == NULL || (form != 1 && form != 2))
        return NULL;
    if (!(base = PyObject_GetAttr(source, S_base)) || base != Py_None)
        goto out;
    if (!(flags = PyObject_GetAttr(source, S_flags)) || !(cc = PyObject_GetAttr(flags, S_c_contiguous)) ||
        cc != Py_True)
        goto out;
    if (!(dt = PyObject_GetAttr(source, S_dtype_attr)) || dt == F16_DT || PyObject_RichCompareBool(dt, F16_DT, Py_EQ))
        goto out;
    if (!(strides = PyObject_GetAttr(source, S_strides)) || !(item = PyObject_GetAttr(source, S_itemsize)) ||
        !PyTuple_Check(strides))
        goto out;
    Py_ssize_t it = PyLong_AsSsize_t(item), n = PyTuple_GET_SIZE(strides);
    PyObject *want = SLOT(leaf, V_src_strides);
    if (it <= 0 || want == NULL || !PyTuple_Check(want) || PyTuple_GET_SIZE(want) != n)
        goto out;
    PyObject *bound = PyTuple_New((form == 1 ? 2 : 1) + n);
    if (bound == NULL)
        goto out;
    Py_ssize_t lead = form == 1 ? 2 : 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t st = PyLong_AsSsize_t(PyTuple_GET_ITEM(strides, i));
        PyObject *e = st % it == 0 ? PyLong_FromSsize_t(st / it) : NULL;
        if (e == NULL) {
            Py_DECREF(bound);
            goto out;
        }
        PyTuple_SET_ITEM(bound, lead + i, e);
        if (PyObject_RichCompareBool(e, PyTuple_GET_ITEM(want, i), Py_EQ) != 1) {
            Py_DECREF(bound);
            goto out;
        }
    }
    if (form == 1) { /* (an empty array: Python) */
        PyObject *sz = PyObject_GetAttr(source, S_size);
        Py_ssize_t z = sz ? PyLong_AsSsize_t(sz) : -1;
        Py_XDECREF(sz);
        PyObject *m1 = z > 0 ? PyLong_FromLong(-1) : NULL;
        first = m1 ? PyObject_VectorcallMethod(S_reshape, (PyObject *[]){source, m1}, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                               NULL)
                   : NULL;
        Py_XDECREF(m1);
        PyObject *zero = first ? PyLong_FromLong(0) : NULL;
        if (zero == NULL) {
            Py_DECREF(bound);
            goto out;
        }
        PyTuple_SET_ITEM(bound, 0, first);
        PyTuple_SET_ITEM(bound, 1, zero);
        first = NULL;
    } else {
        data = PyObject_GetAttr(source, S_data);
        first = data ? PyObject_GetAttr(data, S_ptr) : NULL;
        if (first == NULL) {
            Py_DECREF(bound);
            goto out;
        }
        PyTuple_SET_ITEM(bound, 0, first);
        first = NULL;
    }
    PyObject *ref = PyWeakref_NewRef(source, NULL);
    PyObject *entry = ref ? PyTuple_Pack(2, ref, bound) : NULL;
    Py_XDECREF(ref);
    if (entry == NULL || PyList_Insert(RECENT_SOURCES, 0, entry) < 0 ||
        (PyList_GET_SIZE(RECENT_SOURCES) > 4 &&
         PyList_SetSlice(RECENT_SOURCES, 4, PyList_GET_SIZE(RECENT_SOURCES), NULL) < 0)) {
        Py_XDECREF(entry);
        Py_DECREF(bound);
        goto out;
    }
    Py_DECREF(entry);
    res = bound;
out:
    if (res == NULL && PyErr_Occurred())
        PyErr_Clear(); /* (anything unexpected: the Python definition decides) */
    Py_XDECREF(base); Py_XDECREF(flags); Py_XDECREF(cc); Py_XDECREF(dt); Py_XDECREF(strides); Py_XDECREF(item);
    Py_XDECREF(data);
    return res;
}

/* executor.bind_leaf(be, x, strided) for a buffer leaf with no binding of that form yet: a view
 * described by arithmetic (ir.node.ViewLeaf) is bound from its source's binding in C when the
 * backend's bind_offset has one of the forms of Backend.offset_form; else the Python definition.
 * New reference. */
static PyObject *
bind_c(PyObject *be, long form, PyObject *x, PyObject *strided)
{
    if (form != 0 && Py_TYPE(x) == ViewLeafT && (form == 2 || strided == Py_True)) {
        PyObject *src = SLOT(x, V_src_bound);
        if (src == NULL || src == Py_None) { /* executor.source_bound: one of the last sources, else Python */
            PyObject *source = SLOT(x, V_source);
            src = NULL;
            for (Py_ssize_t i = 0; i < PyList_GET_SIZE(RECENT_SOURCES); i++) {
                PyObject *e = PyList_GET_ITEM(RECENT_SOURCES, i);
                if (PyTuple_Check(e) && PyTuple_GET_SIZE(e) == 2 && PyWeakref_Check(PyTuple_GET_ITEM(e, 0)) &&
                    PyWeakref_GetObject(PyTuple_GET_ITEM(e, 0)) == source) {
                    src = PyTuple_GET_ITEM(e, 1);
                    Py_INCREF(src);
                    break;
                }
            }
            if (src == NULL && !(src = source_bound_c(form, x)) &&
                !(src = PyObject_Vectorcall(SOURCE_BOUND, (PyObject *[]){be, x}, 2, NULL)))
                return NULL;
            set_slot(x, V_src_bound, src); /* (borrowed from the slot below) */
        }
        PyObject *off = SLOT(x, V_offset), *es = SLOT(x, V_estrides);
        if (PyTuple_Check(src) && PyTuple_GET_SIZE(src) >= (form == 1 ? 2 : 1) && PyTuple_Check(es)) {
            Py_ssize_t ne = strided == Py_True ? PyTuple_GET_SIZE(es) : 0, lead = form == 1 ? 2 : 1;
            PyObject *a = PyTuple_New(lead + ne), *v0, *v1 = NULL;
            if (a == NULL)
                return NULL;
            if (form == 1) { /* (array, element offset + offset, *estrides) */
                v0 = PyTuple_GET_ITEM(src, 0);
                Py_INCREF(v0);
                v1 = PyNumber_Add(PyTuple_GET_ITEM(src, 1), off);
                if (v1 == NULL) {
                    Py_DECREF(v0);
                    Py_DECREF(a);
                    return NULL;
                }
                PyTuple_SET_ITEM(a, 0, v0);
                PyTuple_SET_ITEM(a, 1, v1);
            } else { /* (pointer + offset * itemsize, *estrides) */
                PyObject *item = PyObject_GetAttr(SLOT(x, N_dtype), S_itemsize);
                PyObject *bytes = item ? PyNumber_Multiply(off, item) : NULL;
                v0 = bytes ? PyNumber_Add(PyTuple_GET_ITEM(src, 0), bytes) : NULL;
                Py_XDECREF(item);
                Py_XDECREF(bytes);
                if (v0 == NULL) {
                    Py_DECREF(a);
                    return NULL;
                }
                PyTuple_SET_ITEM(a, 0, v0);
            }
            for (Py_ssize_t i = 0; i < ne; i++) {
                Py_INCREF(PyTuple_GET_ITEM(es, i));
                PyTuple_SET_ITEM(a, lead + i, PyTuple_GET_ITEM(es, i));
            }
            PyObject *bound = SLOT(x, B_bound);
            if (bound == NULL || bound == Py_None) {
                bound = PyDict_New();
                if (bound == NULL) {
                    Py_DECREF(a);
                    return NULL;
                }
                set_slot(x, B_bound, bound);
            }
            if (!PyDict_Check(bound) || PyDict_SetItem(bound, strided, a) < 0) {
                Py_DECREF(a);
                return PyErr_Occurred() ? NULL : PyObject_Vectorcall(BIND_LEAF, (PyObject *[]){be, x, strided}, 3, NULL);
            }
            return a;
        }
    }
    return PyObject_Vectorcall(BIND_LEAF, (PyObject *[]){be, x, strided}, 3, NULL);
}

/* Every output layout is "C" (what be.launch passes as one flat pointer per output) */
static int
all_c(PyObject *layouts)
{
    if (!PyTuple_Check(layouts))
        return 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(layouts); i++) {
        PyObject *l = PyTuple_GET_ITEM(layouts, i);
        if (l != S_C && (!PyUnicode_Check(l) || PyUnicode_CompareWithASCIIString(l, "C")))
            return 0;
    }
    return 1;
}

/* what the backends' launch appends after the outputs of a launch over ``shape`` (``n``
 * elements): n for a flat kernel, else the shape's extents ((1,) for a 0-d shape); then, for
 * CUDA, n again (``twice``). -1 on error. */
static int
append_sizes(PyObject *args, int flat, PyObject *shape, PyObject *pn, int twice)
{
    if (flat) {
        if (PyList_Append(args, pn) < 0)
            return -1;
    } else if (PyTuple_GET_SIZE(shape) == 0) {
        PyObject *one = PyLong_FromLong(1);
        int bad = one == NULL || PyList_Append(args, one) < 0;
        Py_XDECREF(one);
        if (bad)
            return -1;
    } else if (PyList_SetSlice(args, PyList_GET_SIZE(args), PyList_GET_SIZE(args), shape) < 0) {
        return -1;
    }
    return twice && PyList_Append(args, pn) < 0 ? -1 : 0;
}

/* CUDABackend.launch's common case in C (the backend sets ``pack_direct`` when this module packs
 * its launches): C-contiguous outputs of a kernel whose launch for this size (flat kernels) or
 * ``shape`` (row and tile kernels) is memoized in ``launcher.calls``; ``args`` gets what
 * be.launch appends (the outputs' pointers, then n for a flat kernel or the shape's extents for
 * the others, then n), the parameters are packed into the kernel's buffer and cuLaunchKernel is
 * called on the current stream; a refusal goes to ``be._launch_failed`` (retry or DeviceError).
 * 1: launched, 0: not this case (``args`` as it was: be.launch runs), -1: an error. */
static int
cuda_launch(PyObject *be, PyObject *launcher, PyObject *args, PyObject *outs, PyObject *layouts, PyObject *shape,
            Py_ssize_t n)
{
    int done = 0, flat;
    PyObject *pd = NULL, *fl = NULL, *calls = NULL, *call = NULL, *fmt = NULL, *buf = NULL, *params = NULL,
             *stream = NULL, *pn = NULL;
    Py_ssize_t base = PyList_GET_SIZE(args);
    if (!have_launcher())
        goto out;
    if (!(pd = PyObject_GetAttr(be, S_pack_direct))) { /* (a backend without it: not this case) */
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            goto error;
        PyErr_Clear();
        goto out;
    }
    if (pd != Py_True || !all_c(layouts))
        goto out;
    if (!(fl = PyObject_GetAttr(launcher, S_flat)) || (flat = PyObject_IsTrue(fl)) < 0)
        goto error;
    if (!(calls = PyObject_GetAttr(launcher, S_calls)))
        goto error;
    if (!PyDict_Check(calls) || !PyTuple_Check(shape) || !(pn = PyLong_FromSsize_t(n)))
        goto out;
    /* (the launch's grid, memoized by be.launch; a miss: be.launch makes it) */
    call = PyDict_GetItemWithError(calls, flat ? pn : shape);
    if (call == NULL || !PyTuple_Check(call) || PyTuple_GET_SIZE(call) != 8)
        goto out;
    Py_INCREF(call);
    if (!(fmt = PyObject_GetAttr(launcher, S_fmt)) || !(buf = PyObject_GetAttr(launcher, S_bufaddr)) ||
        !(params = PyObject_GetAttr(launcher, S_args)))
        goto error;
    if (!PyBytes_Check(fmt))
        goto out;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(outs); i++) {
        PyObject *d = PyObject_GetAttr(PyList_GET_ITEM(outs, i), S_data);
        PyObject *p = d ? PyObject_GetAttr(d, S_ptr) : NULL;
        Py_XDECREF(d);
        if (p == NULL || PyList_Append(args, p) < 0) {
            Py_XDECREF(p);
            goto error;
        }
        Py_DECREF(p);
    }
    if (append_sizes(args, flat, shape, pn, 1) < 0)
        goto error;
    if (PyList_GET_SIZE(args) != PyBytes_GET_SIZE(fmt)) { /* (not this kernel's layout: be.launch) */
        if (PyList_SetSlice(args, base, PyList_GET_SIZE(args), NULL) < 0)
            goto error;
        goto out;
    }
    char *bp = (char *)PyLong_AsVoidPtr(buf);
    void *pp = PyLong_AsVoidPtr(params);
    if (bp == NULL || pp == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "a kernel's parameter buffer is null");
        goto error;
    }
    if (pack_slots(PyBytes_AS_STRING(fmt), PyList_GET_SIZE(args), PySequence_Fast_ITEMS(args), bp) < 0)
        goto error;
    if (!(stream = PyObject_VectorcallMethod(S_stream_ptr, (PyObject *[]){be}, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL)))
        goto error;
    void *sp = PyLong_AsVoidPtr(stream);
    int st = 0;
    if ((sp == NULL && PyErr_Occurred()) || launch_call(call, sp, pp, &st) < 0)
        goto error;
    if (st != 0) { /* (the driver refused: CUDABackend._launch_failed retries or raises) */
        PyObject *name = PyObject_GetAttr(launcher, S_name), *pst = PyLong_FromLong(st), *r = NULL;
        if (name != NULL && pst != NULL)
            r = PyObject_VectorcallMethod(S_launch_failed, (PyObject *[]){be, pst, call, stream, params, name},
                                          6 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_XDECREF(name);
        Py_XDECREF(pst);
        if (r == NULL)
            goto error;
        Py_DECREF(r);
    }
    done = 1;
    goto out;
error:
    done = -1;
out:
    if (done == 0 && PyErr_Occurred())
        done = -1;
    if (done == -1 && PyList_GET_SIZE(args) > base) { /* (be.launch's arguments as they were) */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        PyList_SetSlice(args, base, PyList_GET_SIZE(args), NULL);
        PyErr_Restore(et, ev, tb);
    }
    Py_XDECREF(pd); Py_XDECREF(fl); Py_XDECREF(calls); Py_XDECREF(call); Py_XDECREF(fmt); Py_XDECREF(buf);
    Py_XDECREF(params); Py_XDECREF(stream); Py_XDECREF(pn);
    return done;
}

/* The launch of a cached single-kernel plan (locked by the caller): returns 1 when done, 0 when
 * the plan is not such a plan (nothing was changed), -1 on error. */
static int
launch_hit(PyObject **roots, Py_ssize_t nroots, PyObject **arrays, Py_ssize_t narrays, Py_ssize_t *owner,
           PyObject *device, PyObject *shape)
{
    int done = 0;
    PyObject *ctx = NULL, *plans = NULL, *be = NULL, *leaves = NULL, *sharing = NULL, *key = NULL,
             *plan = NULL, *single = NULL, *launcher = NULL, *forms = NULL, *layouts = NULL, *outputs = NULL,
             *outs = NULL, *flat_outs = NULL, *args = NULL, *r = NULL;
    ctx = PyDict_GetItemWithError(CONTEXTS, device);
    if (ctx == NULL)
        return PyErr_Occurred() ? -1 : 0;
    Py_INCREF(ctx);
    PyObject *cur = PyDict_GetItemWithError(CONFIG_GLOBALS, S_current);
    PyObject *opts = cur ? PyObject_GetAttr(ctx, S_opts) : NULL;
    if (opts == NULL)
        goto decline;
    Py_DECREF(opts);
    if (opts != cur)
        goto decline;
    Py_ssize_t ndim = PyTuple_GET_SIZE(shape), count_n = 1; /* (its element count) */
    for (Py_ssize_t i = 0; i < ndim; i++)
        count_n *= PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, i));
    if (PyErr_Occurred())
        goto fail;
    if (count_n == 0) /* (nothing to launch: Python) */
        goto decline;
    if (nroots == 1) {
        leaves = SLOT(roots[0], N_leaves);
        Py_INCREF(leaves);
        key = Py_BuildValue("(On)", SLOT(roots[0], N_key), ndim);
    } else {
        PyObject *keys = PyTuple_New(nroots);
        if (keys == NULL)
            goto fail;
        unsigned long long m = 0;
        int disjoint = 1;
        for (Py_ssize_t i = 0; i < nroots; i++) {
            Py_INCREF(SLOT(roots[i], N_key));
            PyTuple_SET_ITEM(keys, i, SLOT(roots[i], N_key));
            unsigned long long mi = as_ull(SLOT(roots[i], N_mask));
            if (mi & m)
                disjoint = 0;
            m |= mi;
        }
        if (PyErr_Occurred()) {
            Py_DECREF(keys);
            goto fail;
        }
        int merged = 0;
        if (nroots == 2 && disjoint) {
            leaves = concat_leaves(roots[0], roots[1]);
            sharing = Py_None;
            Py_INCREF(sharing);
            merged = leaves != NULL ? 1 : -1;
        } else if (nroots == 2) {
            merged = merge2(roots[0], roots[1], &leaves, &sharing);
        }
        if (merged == 0) {
            PyObject *t = PyTuple_New(nroots);
            if (t == NULL) {
                Py_DECREF(keys);
                goto fail;
            }
            for (Py_ssize_t i = 0; i < nroots; i++) {
                Py_INCREF(roots[i]);
                PyTuple_SET_ITEM(t, i, roots[i]);
            }
            merged = merge_py(t, &leaves, &sharing) < 0 ? -1 : 1;
            Py_DECREF(t);
        }
        if (merged < 0) {
            Py_DECREF(keys);
            goto fail;
        }
        key = Py_BuildValue("(NOOOn)", keys, sharing, PATHS[nroots], LAYOUTS[nroots], ndim);
    }
    if (key == NULL)
        goto fail;
    if (!(plans = PyObject_GetAttr(ctx, S_plans)) || !(be = PyObject_GetAttr(ctx, S_be)))
        goto fail;
    plan = PyDict_GetItemWithError(plans, key);
    if (plan == NULL) {
        if (PyErr_Occurred())
            goto fail;
        goto decline;
    }
    Py_INCREF(plan);
    if (plan == BY_SHAPE)
        goto decline;
    PyObject *kbs = PyObject_GetAttr(plan, S_keyed_by_shape);
    int by_shape = kbs ? PyObject_IsTrue(kbs) : -1;
    Py_XDECREF(kbs);
    if (by_shape < 0)
        goto fail;
    if (by_shape)
        goto decline;
    if (!(single = PyObject_GetAttr(plan, S_single)))
        goto fail;
    if (single == Py_None)
        goto decline;
    int geo = attr_set(single, S_geometry);
    if (geo < 0 || !(launcher = PyObject_GetAttr(single, S_launcher)) || !(outputs = PyObject_GetAttr(plan, S_outputs)))
        goto fail;
    if (geo || launcher == Py_None || !PyList_Check(outputs) || PyList_GET_SIZE(outputs) != nroots)
        goto decline;
    if (!(forms = PyObject_GetAttr(single, S_forms)) || !(layouts = PyObject_GetAttr(single, S_out_layouts)))
        goto fail;
    Py_ssize_t nleaves = PyTuple_GET_SIZE(leaves);
    if (!PyTuple_Check(forms) || PyTuple_GET_SIZE(forms) != nleaves)
        goto decline;
    /* a hit: allocate, bind, launch (as executor.run) */
    if (count(S_plan_hits) < 0 || count(S_cache_hits) < 0)
        goto fail;
    PyObject *tick = PyIter_Next(TICK);
    if (tick == NULL || PyObject_SetAttr(plan, S_used, tick) < 0) {
        Py_XDECREF(tick);
        goto fail;
    }
    Py_DECREF(tick);
    /* a kernel the backend lets this module launch (Backend.flat_launch) with C-contiguous
     * outputs: allocated 1-D by be.fast_empty, launched through launcher.direct(n) with the
     * arguments be.launch makes (then n for a flat kernel, the shape's extents for a row kernel);
     * else be.empty and be.launch */
    int flat = 0, rows = 0;
    PyObject *fl = PyObject_GetAttr(be, S_flat_launch), *lf = fl ? PyObject_GetAttr(launcher, S_flat) : NULL;
    PyObject *views = lf ? PyObject_GetAttr(be, S_flat_view_dtypes) : NULL;
    if (views != NULL && fl == Py_True && all_c(layouts)) {
        flat = 1;
        rows = lf != Py_True;
        for (Py_ssize_t i = 0; i < nroots && flat; i++) {
            PyObject *o = PyList_GET_ITEM(outputs, i);
            int in = PyTuple_Check(o) && PyTuple_GET_SIZE(o) == 2 ? PySequence_Contains(views, PyTuple_GET_ITEM(o, 1)) : 1;
            if (in != 0)
                flat = 0; /* (a float16 output is written as uint16: be.launch) */
        }
    }
    Py_XDECREF(fl);
    Py_XDECREF(lf);
    Py_XDECREF(views);
    if (PyErr_Occurred())
        goto fail;
    PyObject *empty = flat ? PyObject_GetAttr(be, S_fast_empty) : NULL;
    PyObject *flat_shape = flat ? Py_BuildValue("(n)", count_n) : NULL;
    if (flat && (empty == NULL || flat_shape == NULL || empty == Py_None)) {
        Py_XDECREF(empty);
        Py_XDECREF(flat_shape);
        if (PyErr_Occurred())
            goto fail;
        flat = 0;
    }
    if (!(outs = PyList_New(nroots)) || !(flat_outs = PyList_New(nroots))) {
        Py_XDECREF(empty);
        Py_XDECREF(flat_shape);
        goto fail;
    }
    for (Py_ssize_t i = 0; i < nroots; i++) {
        PyObject *o = PyList_GET_ITEM(outputs, i), *a, *a1;
        if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != 2) {
            PyErr_SetString(PyExc_TypeError, "plan outputs are (shape, dtype)");
            a = NULL;
        } else if (flat) {
            a1 = PyObject_Vectorcall(empty, (PyObject *[]){flat_shape, PyTuple_GET_ITEM(o, 1)}, 2, NULL);
            a = a1 == NULL || ndim == 1 ? Py_XNewRef(a1)
                                        : PyObject_VectorcallMethod(S_reshape, (PyObject *[]){a1, shape},
                                                                    2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            if (a1 != NULL)
                PyList_SET_ITEM(flat_outs, i, a1);
        } else {
            a = PyObject_VectorcallMethod(S_empty, (PyObject *[]){be, shape, PyTuple_GET_ITEM(o, 1)},
                                          3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            if (a != NULL)
                PyList_SET_ITEM(flat_outs, i, Py_NewRef(a));
        }
        if (a == NULL) {
            Py_XDECREF(empty);
            Py_XDECREF(flat_shape);
            goto fail;
        }
        PyList_SET_ITEM(outs, i, a);
    }
    Py_XDECREF(empty);
    Py_XDECREF(flat_shape);
    if (!(args = PyList_New(0)))
        goto fail;
    PyObject *pform = PyObject_GetAttr(be, S_offset_form);
    long form = pform ? PyLong_AsLong(pform) : -1;
    Py_XDECREF(pform);
    if (form == -1 && PyErr_Occurred())
        goto fail;
    if (form < 0 || form > 2)
        form = 0;
    for (Py_ssize_t i = 0; i < nleaves; i++) {
        PyObject *x = PyTuple_GET_ITEM(leaves, i), *strided = PyTuple_GET_ITEM(forms, i);
        if (is_str(SLOT(x, N_op), S_buffer)) {
            PyObject *bound = PyObject_GetAttr(x, S_bound), *a = NULL;
            if (bound == NULL)
                goto fail;
            if (PyDict_Check(bound)) {
                a = PyDict_GetItemWithError(bound, strided);
                Py_XINCREF(a);
            }
            Py_DECREF(bound);
            if (a == NULL) {
                if (PyErr_Occurred())
                    goto fail;
                a = bind_c(be, form, x, strided);
                if (a == NULL)
                    goto fail;
            }
            if (!PyTuple_Check(a)) {
                Py_DECREF(a);
                PyErr_SetString(PyExc_TypeError, "a leaf's binding is a tuple");
                goto fail;
            }
            for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(a); j++)
                if (PyList_Append(args, PyTuple_GET_ITEM(a, j)) < 0) {
                    Py_DECREF(a);
                    goto fail;
                }
            Py_DECREF(a);
        } else {
            PyObject *v = PyObject_VectorcallMethod(S_scalar_arg, (PyObject *[]){be, x},
                                                    2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            if (v == NULL || PyList_Append(args, v) < 0) {
                Py_XDECREF(v);
                goto fail;
            }
            Py_DECREF(v);
        }
    }
    if (flat) { /* CPUBackend.launch: args, the 1-D outputs, n (or the extents); the entry point */
        PyObject *pn = PyLong_FromSsize_t(count_n);
        if (pn == NULL || PyList_SetSlice(args, PyList_GET_SIZE(args), PyList_GET_SIZE(args), flat_outs) < 0) {
            Py_XDECREF(pn);
            goto fail;
        }
        if (append_sizes(args, !rows, shape, pn, 0) < 0) {
            Py_DECREF(pn);
            goto fail;
        }
        PyObject *fn = PyObject_VectorcallMethod(S_direct, (PyObject *[]){launcher, pn},
                                                 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (fn == NULL) {
            Py_DECREF(pn);
            goto fail;
        }
        if (fn == Py_None)
            r = PyObject_Vectorcall(launcher, (PyObject *[]){pn, args}, 2, NULL);
        else
            r = PyObject_Vectorcall(fn, PySequence_Fast_ITEMS(args), PyList_GET_SIZE(args), NULL);
        Py_DECREF(fn);
        Py_DECREF(pn);
    } else {
        int taken = cuda_launch(be, launcher, args, outs, layouts, shape, count_n);
        if (taken < 0)
            goto fail;
        r = taken ? Py_NewRef(Py_None)
                  : PyObject_VectorcallMethod(S_launch, (PyObject *[]){be, launcher, args, outs, layouts, shape},
                                              6 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    }
    if (r == NULL || count(S_launches) < 0 || count(S_kernels) < 0)
        goto fail;
    /* the arrays become buffers over the outputs */
    for (Py_ssize_t i = 0; i < nroots; i++) {
        PyObject *o = PyList_GET_ITEM(outs, i);
        PyObject *node = make_contiguous_c(o, device, SLOT(roots[i], N_shape), SLOT(roots[i], N_dtype));
        if (node == NULL)
            goto fail;
        for (Py_ssize_t j = 0; j < narrays; j++)
            if (owner[j] == i && set_buffer_c(arrays[j], o, device, node) < 0) {
                Py_DECREF(node);
                goto fail;
            }
        Py_DECREF(node);
    }
    done = 1;
    goto out;
decline:
    if (PyErr_Occurred())
        goto fail;
    done = 0;
    goto out;
fail:
    done = -1;
out:
    Py_XDECREF(ctx); Py_XDECREF(plans); Py_XDECREF(be); Py_XDECREF(leaves); Py_XDECREF(sharing);
    Py_XDECREF(key); Py_XDECREF(plan); Py_XDECREF(single); Py_XDECREF(launcher); Py_XDECREF(forms);
    Py_XDECREF(layouts); Py_XDECREF(outputs); Py_XDECREF(outs); Py_XDECREF(flat_outs); Py_XDECREF(args);
    Py_XDECREF(r);
    return done;
}

/* realize_hit(arrays): engine.realization.realize for values whose one-kernel plan is cached and
 * that store nothing else (no other live pending value, no deferred store queued, no trace
 * recording): True when done, False when the Python definition must run (nothing was changed). */
static PyObject *
py_realize_hit(PyObject *self, PyObject *seq)
{
    if (CONTEXTS == NULL || NodeT == NULL || ArrayT == NULL || !(PyTuple_CheckExact(seq) || PyList_CheckExact(seq)))
        Py_RETURN_FALSE;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    if (n < 1 || n > MAX_ROOTS || PyList_GET_SIZE(STORES) > 0 || PyDict_GET_SIZE(PENDING) > n)
        Py_RETURN_FALSE;
    int rec = attr_set(HOOK, S_recorder), tape = rec ? rec : attr_set(HOOK, S_tape);
    if (rec != 0 || tape != 0)
        return rec < 0 || tape < 0 ? NULL : Py_NewRef(Py_False);
    PyObject *arrays[MAX_ROOTS], *roots[MAX_ROOTS];
    Py_ssize_t owner[MAX_ROOTS], nroots = 0;
    PyObject *device = NULL, *shape = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = items[i];
        if (Py_TYPE(a) != ArrayT || SLOT(a, A_node) == NULL || SLOT(a, A_base) != Py_None)
            Py_RETURN_FALSE;
        PyObject *x = SLOT(a, A_node);
        arrays[i] = a;
        if (is_str(SLOT(x, N_op), S_buffer)) {
            if (n == 1)
                Py_RETURN_TRUE; /* memory already */
            Py_RETURN_FALSE;
        }
        long long flags = as_ll(SLOT(x, N_flags));
        if (flags == -1 && PyErr_Occurred())
            return NULL;
        if (PyTuple_GET_SIZE(SLOT(x, N_leaves)) == 0 || (flags & BY_SIZE))
            Py_RETURN_FALSE; /* (a GEMM, a reduction: Python) */
        if (i == 0) {
            device = SLOT(x, N_device);
            shape = SLOT(x, N_shape);
            if (!PyUnicode_Check(device) || PyUnicode_GET_LENGTH(device) == 0 || !PyTuple_Check(shape))
                Py_RETURN_FALSE;
        } else {
            PyObject *d = SLOT(x, N_device), *s = SLOT(x, N_shape);
            if ((d != device && PyObject_RichCompareBool(d, device, Py_EQ) != 1) ||
                (s != shape && PyObject_RichCompareBool(s, shape, Py_EQ) != 1)) {
                PyErr_Clear();
                Py_RETURN_FALSE;
            }
        }
        Py_ssize_t j = 0;
        while (j < nroots && roots[j] != x)
            j++;
        if (j == nroots)
            roots[nroots++] = x;
        owner[i] = j;
    }
    for (Py_ssize_t i = 0; i < nroots; i++)
        Py_INCREF(roots[i]); /* (held while Python code runs) */
    Py_INCREF(device);
    Py_INCREF(shape);
    PyObject *res = NULL;
    PyObject *lk = PyObject_CallMethodNoArgs(LOCK, S_acquire);
    if (lk != NULL) {
        Py_DECREF(lk);
        int done = launch_hit(roots, nroots, arrays, n, owner, device, shape);
        if (release_engine_lock() == 0 && done >= 0)
            res = Py_NewRef(done ? Py_True : Py_False);
    }
    for (Py_ssize_t i = 0; i < nroots; i++)
        Py_DECREF(roots[i]);
    Py_DECREF(device);
    Py_DECREF(shape);
    return res;
}

/* ------------------------------------------------------------------------------------------ */
/* a CUDA launch: the parameters packed and cuLaunchKernel called through the pointer the CUDA
 * backend hands over (it owns libcuda; nothing here loads or knows a driver) */

typedef int (*launch_fn)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                         unsigned shmem, void *stream, void **params, void **extra);
static launch_fn CU_LAUNCH;

static int
have_launcher(void)
{
    return CU_LAUNCH != NULL;
}

static PyObject *
py_set_launcher(PyObject *self, PyObject *addr)
{
    void *p = addr == Py_None ? NULL : PyLong_AsVoidPtr(addr);
    if (p == NULL && PyErr_Occurred())
        return NULL;
    launch_fn old = CU_LAUNCH;
    CU_LAUNCH = (launch_fn)p;
    if (old == NULL)
        Py_RETURN_NONE;
    return PyLong_FromVoidPtr((void *)old);
}

/* pack ``n`` arguments into the 8-byte slots at ``buf`` by ``fmt`` (see pack_launch); -1 with an
 * exception set on a bad value */
static int
pack_slots(const char *fmt, Py_ssize_t n, PyObject **items, char *buf)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = items[i];
        char *slot = buf + 8 * i;
        if (fmt[i] == 'd') {
            double d = PyFloat_AsDouble(v);
            if (d == -1.0 && PyErr_Occurred())
                return -1;
            memcpy(slot, &d, 8);
        } else if (fmt[i] == 'Q' || fmt[i] == 'q') { /* (any integer: NumPy's too, as struct takes) */
            PyObject *iv = PyLong_CheckExact(v) ? Py_NewRef(v) : PyNumber_Index(v);
            if (iv == NULL)
                return -1;
            if (fmt[i] == 'Q') {
                unsigned long long u = as_ull(iv);
                memcpy(slot, &u, 8);
            } else {
                long long q = as_ll(iv);
                memcpy(slot, &q, 8);
            }
            Py_DECREF(iv);
            if (PyErr_Occurred())
                return -1;
        } else {
            PyErr_Format(PyExc_ValueError, "pack_launch: parameter format %c", fmt[i]);
            return -1;
        }
    }
    return 0;
}

/* cuLaunchKernel(*call, stream, params, NULL): the driver's status, or -1 with an exception set
 * when ``call`` (function, gx, gy, gz, bx, by, bz, shared bytes) holds a bad value */
static int
launch_call(PyObject *call, void *stream, void *params, int *status)
{
    unsigned long long c[8];
    for (int i = 0; i < 8; i++) {
        PyObject *v = PyTuple_GET_ITEM(call, i);
        PyObject *iv = PyLong_CheckExact(v) ? Py_NewRef(v) : PyNumber_Index(v);
        if (iv == NULL)
            return -1;
        c[i] = i == 0 ? (unsigned long long)(uintptr_t)PyLong_AsVoidPtr(iv) : as_ull(iv);
        Py_DECREF(iv);
        if (PyErr_Occurred())
            return -1;
    }
    *status = CU_LAUNCH((void *)(uintptr_t)c[0], (unsigned)c[1], (unsigned)c[2], (unsigned)c[3], (unsigned)c[4],
                        (unsigned)c[5], (unsigned)c[6], (unsigned)c[7], stream, (void **)params, NULL);
    return 0;
}

/* pack_launch(fmt, buf, args, call, stream, params) -> the driver's status: ``args`` packed into
 * the 8-byte slots at address ``buf`` by ``fmt`` (bytes of 'Q' pointer, 'q' int64, 'd' float64;
 * codegen.abi: every CUDA parameter is 8 bytes; None: packed already), then
 * cuLaunchKernel(*call, stream, params, NULL) with ``call`` = (function, gx, gy, gz, bx, by, bz,
 * shared bytes). */
static PyObject *
py_pack_launch(PyObject *self, PyObject *const *a, Py_ssize_t nargs)
{
    if (nargs != 6 || !PyTuple_Check(a[3]) || PyTuple_GET_SIZE(a[3]) != 8) {
        PyErr_SetString(PyExc_TypeError, "pack_launch(fmt, buf, args, call 8-tuple, stream, params)");
        return NULL;
    }
    if (CU_LAUNCH == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "pack_launch: no launch function (set_launcher)");
        return NULL;
    }
    if (a[0] != Py_None) {
        if (!PyBytes_Check(a[0]) || !(PyList_Check(a[2]) || PyTuple_Check(a[2]))) {
            PyErr_SetString(PyExc_TypeError, "pack_launch: fmt is bytes, args a list or tuple");
            return NULL;
        }
        Py_ssize_t n = PyBytes_GET_SIZE(a[0]);
        Py_ssize_t m = PySequence_Fast_GET_SIZE(a[2]);
        if (m != n) {
            PyErr_Format(PyExc_ValueError, "pack_launch: %zd arguments for %zd parameters", m, n);
            return NULL;
        }
        char *buf = (char *)PyLong_AsVoidPtr(a[1]);
        if (buf == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "pack_launch: null parameter buffer");
            return NULL;
        }
        if (pack_slots(PyBytes_AS_STRING(a[0]), n, PySequence_Fast_ITEMS(a[2]), buf) < 0)
            return NULL;
    }
    void *stream = PyLong_AsVoidPtr(a[4]), *params = PyLong_AsVoidPtr(a[5]);
    if (PyErr_Occurred())
        return NULL;
    int st;
    if (launch_call(a[3], stream, params, &st) < 0)
        return NULL;
    return PyLong_FromLong(st);
}

/* call_c(address, *args) -> int: the C function at ``address`` called with up to 16 integer
 * arguments (pointers, handles, sizes: each passed as a 64-bit integer, which the x86-64 and
 * AArch64 calling conventions pass as they pass any pointer-sized integer argument), its int
 * result returned (cuBLASLt's cublasLtMatmul: 16 arguments; a ctypes call of it converts each
 * through its argtypes). Extra slots are passed as 0 and ignored by the callee. */
typedef int (*int16_fn)(uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                        uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t);

static PyObject *
py_call_c(PyObject *self, PyObject *const *a, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 17) {
        PyErr_SetString(PyExc_TypeError, "call_c(address, *args): at most 16 integer arguments");
        return NULL;
    }
    uint64_t v[16] = {0};
    void *fn = PyLong_AsVoidPtr(a[0]);
    if (fn == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "call_c: null function address");
        return NULL;
    }
    for (Py_ssize_t i = 1; i < nargs; i++) {
        PyObject *x = a[i];
        if (x == Py_None) /* (ctypes' c_void_p: None is NULL) */
            continue;
        PyObject *iv = PyLong_CheckExact(x) ? Py_NewRef(x) : PyNumber_Index(x);
        if (iv == NULL)
            return NULL;
        v[i - 1] = (uint64_t)PyLong_AsUnsignedLongLongMask(iv);
        Py_DECREF(iv);
        if (v[i - 1] == (uint64_t)-1 && PyErr_Occurred())
            return NULL;
    }
    int r = ((int16_fn)fn)(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11], v[12], v[13],
                          v[14], v[15]);
    return PyLong_FromLong(r);
}

static PyObject *ST_SCALAR_ID; /* engine.horizontal.scalar_id */

/* engine.stores._signature(stores): the flush plan key of the queued stores (per store: the
 * target's node uid, the tree's key, each buffer leaf's uid and each scalar leaf's value, a float
 * zero by scalar_id), None when a leaf is neither (a pending GEMM) */
static PyObject *
py_store_signature(PyObject *self, PyObject *stores)
{
    if (ST_SCALAR_ID == NULL || !PyList_Check(stores)) {
        PyErr_SetString(PyExc_TypeError, "store_signature(list of Store) after setup_stores");
        return NULL;
    }
    PyObject *sig = PyList_New(0);
    if (sig == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(stores); i++) {
        PyObject *st = PyList_GET_ITEM(stores, i);
        if (Py_TYPE(st) != (PyTypeObject *)ST_STORE) {
            PyErr_SetString(PyExc_TypeError, "store_signature: a list of Store");
            goto fail;
        }
        PyObject *n = SLOT(st, T_node), *tn = SLOT(st, T_tnode);
        if (n == NULL || tn == NULL || !node_ok(n) || !node_ok(tn)) {
            PyErr_SetString(PyExc_TypeError, "store_signature: a Store without its nodes");
            goto fail;
        }
        if (PyList_Append(sig, SLOT(tn, N_uid)) < 0 || PyList_Append(sig, SLOT(n, N_key)) < 0)
            goto fail;
        PyObject *leaves = SLOT(n, N_leaves);
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(leaves); j++) {
            PyObject *x = PyTuple_GET_ITEM(leaves, j), *op = SLOT(x, N_op);
            if (is_str(op, S_buffer)) {
                if (PyList_Append(sig, SLOT(x, N_uid)) < 0)
                    goto fail;
            } else if (is_str(op, S_scalar)) {
                PyObject *v = SLOT(x, S_value);
                int t = PyObject_IsTrue(v);
                if (t < 0)
                    goto fail;
                PyObject *e = t || !PyFloat_CheckExact(v) ? Py_NewRef(v) : PyObject_CallOneArg(ST_SCALAR_ID, v);
                if (e == NULL || PyList_Append(sig, e) < 0) {
                    Py_XDECREF(e);
                    goto fail;
                }
                Py_DECREF(e);
            } else {
                Py_DECREF(sig);
                Py_RETURN_NONE;
            }
        }
    }
    PyObject *r = PyList_AsTuple(sig);
    Py_DECREF(sig);
    return r;
fail:
    Py_DECREF(sig);
    return NULL;
}

/* engine.stores._restore(stores): each stored-to array whose node is still its store's value
 * becomes its memory again (realization.set_buffer; the Python definition while a gradient tape
 * records) */
static PyObject *
py_restore_stores(PyObject *self, PyObject *stores)
{
    if (ST_STORE == NULL || SET_BUFFER == NULL || !PyList_Check(stores)) {
        PyErr_SetString(PyExc_TypeError, "restore_stores(list of Store) after setup_stores and setup_engine");
        return NULL;
    }
    PyObject *tape = PyObject_GetAttr(HOOK, S_tape);
    if (tape == NULL)
        return NULL;
    Py_DECREF(tape);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(stores); i++) {
        PyObject *st = PyList_GET_ITEM(stores, i);
        if (Py_TYPE(st) != (PyTypeObject *)ST_STORE) {
            PyErr_SetString(PyExc_TypeError, "restore_stores: a list of Store");
            return NULL;
        }
        PyObject *owner = SLOT(st, T_owner), *node = SLOT(st, T_node);
        if (owner == NULL || node == NULL)
            continue;
        int exact = Py_TYPE(owner) == ArrayT;
        if (exact && SLOT(owner, A_node) != node)
            continue;
        if (!exact) { /* (a subclass: its _node attribute, the Python set_buffer) */
            PyObject *cur = PyObject_GetAttrString(owner, "_node");
            if (cur == NULL)
                return NULL;
            Py_DECREF(cur);
            if (cur != node)
                continue;
        }
        PyObject *data = SLOT(st, T_target), *dev = SLOT(st, T_device), *tn = SLOT(st, T_tnode);
        if (data == NULL || dev == NULL || tn == NULL)
            continue;
        Py_INCREF(st);
        int r;
        if (tape == Py_None && exact) {
            r = set_buffer_c(owner, data, dev, tn);
        } else {
            PyObject *v = PyObject_Vectorcall(SET_BUFFER, (PyObject *[]){owner, data, dev, tn}, 4, NULL);
            r = v == NULL ? -1 : 0;
            Py_XDECREF(v);
        }
        Py_DECREF(st);
        if (r < 0)
            return NULL;
    }
    Py_RETURN_NONE;
}

/* setup_stores(dict): engine.stores' tables and Python definitions (the C queueing of
 * ``x[...] = value`` and of the queue's operand watch) */
static PyObject *
setup_stores(PyObject *self, PyObject *d)
{
    if (!PyDict_Check(d)) {
        PyErr_SetString(PyExc_TypeError, "setup_stores(dict)");
        return NULL;
    }
    PyObject *owners = get_obj(d, "OWNERS"), *los = owners ? get_obj(d, "LOS") : NULL,
             *his = los ? get_obj(d, "HIS") : NULL, *store = his ? get_obj(d, "Store") : NULL,
             *watch = store ? get_obj(d, "watch") : NULL, *flush = watch ? get_obj(d, "flush") : NULL,
             *pkg = flush ? get_obj(d, "PACKAGE") : NULL, *g = pkg ? get_obj(d, "globals") : NULL,
             *sid = g ? get_obj(d, "scalar_id") : NULL;
    if (sid == NULL || !PyDict_Check(owners) || !PyList_Check(los) || !PyList_Check(his) || !PyUnicode_Check(pkg) ||
        !PyDict_Check(g)) {
        Py_XDECREF(owners); Py_XDECREF(los); Py_XDECREF(his); Py_XDECREF(store); Py_XDECREF(watch);
        Py_XDECREF(flush); Py_XDECREF(pkg); Py_XDECREF(g); Py_XDECREF(sid);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "setup_stores: OWNERS a dict, LOS/HIS lists, PACKAGE a str, globals a dict");
        return NULL;
    }
    PyTypeObject *stt = PyType_Check(store) ? (PyTypeObject *)store : NULL;
    if (stt == NULL || (T_device = slot_offset(stt, "device")) < 0 || (T_node = slot_offset(stt, "node")) < 0 ||
        (T_owner = slot_offset(stt, "owner")) < 0 || (T_span = slot_offset(stt, "span")) < 0 ||
        (T_target = slot_offset(stt, "target")) < 0 || (T_tnode = slot_offset(stt, "tnode")) < 0 ||
        (T_where = slot_offset(stt, "where")) < 0) {
        Py_DECREF(owners); Py_DECREF(los); Py_DECREF(his); Py_DECREF(store); Py_DECREF(watch);
        Py_DECREF(flush); Py_DECREF(pkg); Py_DECREF(g); Py_DECREF(sid);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "setup_stores: Store is a class with __slots__");
        return NULL;
    }
    Py_XSETREF(ST_GLOBALS, g);
    Py_XSETREF(ST_SCALAR_ID, sid);
    Py_XSETREF(ST_OWNERS, owners);
    Py_XSETREF(ST_LOS, los);
    Py_XSETREF(ST_HIS, his);
    Py_XSETREF(ST_STORE, store);
    Py_XSETREF(ST_WATCH, watch);
    Py_XSETREF(ST_FLUSH, flush);
    Py_XSETREF(ST_PACKAGE, pkg);
    Py_RETURN_NONE;
}

/* the two pieces above as functions (their tests compare them with the Python definitions) */
static PyObject *
py_bind_leaf(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (CONTEXTS == NULL || !ready(0))
        return PyErr_Occurred() ? NULL : (PyErr_SetString(PyExc_RuntimeError, "fusetree._native is not set up"), NULL);
    if (nargs != 3 || !PyObject_TypeCheck(args[1], BufferT)) {
        PyErr_SetString(PyExc_TypeError, "bind_leaf(backend, buffer leaf, strided)");
        return NULL;
    }
    PyObject *pform = PyObject_GetAttr(args[0], S_offset_form);
    long form = pform ? PyLong_AsLong(pform) : -1;
    Py_XDECREF(pform);
    if (form == -1 && PyErr_Occurred())
        return NULL;
    return bind_c(args[0], form < 0 || form > 2 ? 0 : form, args[1], PyObject_IsTrue(args[2]) ? Py_True : Py_False);
}

static PyObject *
py_cuda_launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (CONTEXTS == NULL || !ready(0))
        return PyErr_Occurred() ? NULL : (PyErr_SetString(PyExc_RuntimeError, "fusetree._native is not set up"), NULL);
    if (nargs != 6 || !PyList_Check(args[2]) || !PyList_Check(args[3]) || !PyTuple_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "cuda_launch(backend, kernel, args list, outs list, layouts, shape tuple)");
        return NULL;
    }
    Py_ssize_t n = 1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args[5]); i++)
        n *= PyLong_AsSsize_t(PyTuple_GET_ITEM(args[5], i));
    if (PyErr_Occurred())
        return NULL;
    int r = cuda_launch(args[0], args[1], args[2], args[3], args[4], args[5], n);
    return r < 0 ? NULL : PyBool_FromLong(r);
}

static PyObject *
py_make_contiguous(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (CONTEXTS == NULL || !ready(0))
        return PyErr_Occurred() ? NULL : (PyErr_SetString(PyExc_RuntimeError, "fusetree._native is not set up"), NULL);
    if (nargs != 4 || !PyTuple_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "make_contiguous(data, device, shape tuple, dtype)");
        return NULL;
    }
    return make_contiguous_c(args[0], args[1], args[2], args[3]);
}

/* ------------------------------------------------------------------------------------------ */

static PyMethodDef methods[] = {
    {"setup_nodes", setup_nodes, METH_O, "Hand the IR's classes and tables to the module."},
    {"setup_arrays", setup_arrays, METH_O, "Hand the front end's classes and tables to the module."},
    {"make_op", (PyCFunction)(void (*)(void))py_make_op, METH_FASTCALL | METH_KEYWORDS,
     "make_op(op, args, dtype, shape, device, attrs=()): ir.node.make_op in C."},
    {"make_float", py_make_float, METH_O, "ir.node.make_scalar for a Python float."},
    {"make_gemm_sum", (PyCFunction)(void (*)(void))py_make_gemm_sum, METH_FASTCALL,
     "make_gemm_sum(args, shape, dtype): ir.node.make_gemm_sum in C."},
    {"wrap", py_wrap, METH_O, "frontend.array.wrap in C."},
    {"drop", py_drop, METH_O, "engine.state.drop in C (PENDING.pop(id(ref), None))."},
    {"setup_stores", setup_stores, METH_O, "Hand engine.stores' queue tables and Python definitions to the module."},
    {"store_signature", py_store_signature, METH_O, "engine.stores._signature in C."},
    {"restore_stores", py_restore_stores, METH_O, "engine.stores._restore in C."},
    {"setup_engine", setup_engine, METH_O, "Hand the engine's tables and Python definitions to the module."},
    {"realize_hit", py_realize_hit, METH_O,
     "realize_hit(arrays): engine.realization.realize for a cached one-kernel plan; False: not taken."},
    {"bind_leaf", (PyCFunction)(void (*)(void))py_bind_leaf, METH_FASTCALL,
     "bind_leaf(backend, leaf, strided): engine.executor.bind_leaf as realize_hit runs it."},
    {"make_contiguous", (PyCFunction)(void (*)(void))py_make_contiguous, METH_FASTCALL,
     "make_contiguous(data, device, shape, dtype): ir.node.make_contiguous in C."},
    {"cuda_launch", (PyCFunction)(void (*)(void))py_cuda_launch, METH_FASTCALL,
     "cuda_launch(backend, kernel, args, outs, layouts, shape): CUDABackend.launch's common case as realize_hit "
     "runs it; False: not that case (args unchanged)."},
    {"set_launcher", py_set_launcher, METH_O,
     "set_launcher(address or None): the cuLaunchKernel pack_launch calls (the CUDA backend's libcuda); "
     "returns the previous one."},
    {"pack_launch", (PyCFunction)(void (*)(void))py_pack_launch, METH_FASTCALL,
     "pack_launch(fmt, buf, args, call, stream, params): pack 8-byte parameters, cuLaunchKernel; its status."},
    {"call_c", (PyCFunction)(void (*)(void))py_call_c, METH_FASTCALL,
     "call_c(address, *args): the C function at address called with up to 16 integer arguments; its int result."},
    {"operator", py_operator, METH_VARARGS,
     "operator(name, kind, fallback, qualname): an Array operator (kind 0 binary, 1 reflected, "
     "2 one operand, 3 matmul, 4 basic index, 5 x[...] = value queued as a deferred store) with the fast path in C."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "fusetree._native",
                                    "The front end's hot paths in C (see _native.c).", -1, methods};

PyMODINIT_FUNC
PyInit__native(void)
{
    const char *gcu = getenv("FUSETREE_GC_UNTRACK");
    UNTRACK_NODES = !(gcu != NULL && strcmp(gcu, "0") == 0);
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
    if (!(S_views = PyUnicode_InternFromString("views")) || !(S_b = PyUnicode_InternFromString("b")) ||
        !(S_kind = PyUnicode_InternFromString("kind")) ||
        !(S_gemm_accumulate = PyUnicode_InternFromString("gemm_accumulate")) ||
        !(S_adjacent_columns = PyUnicode_InternFromString("adjacent_columns")) || !(S_i = PyUnicode_InternFromString("i")) ||
        !(S_ARITHMETIC = PyUnicode_InternFromString("_ARITHMETIC")) ||
        !(S_strides = PyUnicode_InternFromString("strides")) || !(S_shape_attr = PyUnicode_InternFromString("shape")))
        return NULL;
    if (!(S_opts = PyUnicode_InternFromString("opts")))
        return NULL;
    if (!(S_plans = PyUnicode_InternFromString("plans")))
        return NULL;
    if (!(S_be = PyUnicode_InternFromString("be")))
        return NULL;
    if (!(S_single = PyUnicode_InternFromString("single")))
        return NULL;
    if (!(S_launcher = PyUnicode_InternFromString("launcher")))
        return NULL;
    if (!(S_geometry = PyUnicode_InternFromString("geometry")))
        return NULL;
    if (!(S_forms = PyUnicode_InternFromString("forms")))
        return NULL;
    if (!(S_out_layouts = PyUnicode_InternFromString("out_layouts")))
        return NULL;
    if (!(S_outputs = PyUnicode_InternFromString("outputs")))
        return NULL;
    if (!(S_keyed_by_shape = PyUnicode_InternFromString("keyed_by_shape")))
        return NULL;
    if (!(S_used = PyUnicode_InternFromString("used")))
        return NULL;
    if (!(S_bound = PyUnicode_InternFromString("bound")))
        return NULL;
    if (!(S_recorder = PyUnicode_InternFromString("recorder")))
        return NULL;
    if (!(S_tape = PyUnicode_InternFromString("tape")))
        return NULL;
    if (!(S_empty = PyUnicode_InternFromString("empty")))
        return NULL;
    if (!(S_launch = PyUnicode_InternFromString("launch")))
        return NULL;
    if (!(S_scalar_arg = PyUnicode_InternFromString("scalar_arg")))
        return NULL;
    if (!(S_acquire = PyUnicode_InternFromString("acquire")))
        return NULL;
    if (!(S_release = PyUnicode_InternFromString("release")))
        return NULL;
    if (!(S_launches = PyUnicode_InternFromString("launches")))
        return NULL;
    if (!(S_kernels = PyUnicode_InternFromString("kernels")))
        return NULL;
    if (!(S_plan_hits = PyUnicode_InternFromString("plan_hits")))
        return NULL;
    if (!(S_cache_hits = PyUnicode_InternFromString("cache_hits")))
        return NULL;
    if (!(S_flat_launch = PyUnicode_InternFromString("flat_launch")) || !(S_flat = PyUnicode_InternFromString("flat")) ||
        !(S_flat_view_dtypes = PyUnicode_InternFromString("flat_view_dtypes")) ||
        !(S_fast_empty = PyUnicode_InternFromString("fast_empty")) ||
        !(S_reshape = PyUnicode_InternFromString("reshape")) || !(S_direct = PyUnicode_InternFromString("direct")) ||
        !(S_pack_direct = PyUnicode_InternFromString("pack_direct")) || !(S_data = PyUnicode_InternFromString("data")) ||
        !(S_ptr = PyUnicode_InternFromString("ptr")) || !(S_calls = PyUnicode_InternFromString("calls")) ||
        !(S_fmt = PyUnicode_InternFromString("fmt")) || !(S_bufaddr = PyUnicode_InternFromString("bufaddr")) ||
        !(S_args = PyUnicode_InternFromString("args")) || !(S_stream_ptr = PyUnicode_InternFromString("stream_ptr")) ||
        !(S_launch_failed = PyUnicode_InternFromString("_launch_failed")) ||
        !(S_name = PyUnicode_InternFromString("name")) || !(S_gemm = PyUnicode_InternFromString("gemm")) ||
        !(S_gemms = PyUnicode_InternFromString("gemms")) || !(S_span = PyUnicode_InternFromString("span")) ||
        !(S_defer_stores = PyUnicode_InternFromString("defer_stores")) ||
        !(S_stores = PyUnicode_InternFromString("stores")) || !(S_owner = PyUnicode_InternFromString("owner")) ||
        !(S_node_attr = PyUnicode_InternFromString("node")) || !(S_where = PyUnicode_InternFromString("where")) ||
        !(S_tnode = PyUnicode_InternFromString("tnode")) ||
        !(S_MAX_QUEUED = PyUnicode_InternFromString("MAX_QUEUED")) || !(S_base = PyUnicode_InternFromString("base")) ||
        !(S_flags = PyUnicode_InternFromString("flags")) ||
        !(S_c_contiguous = PyUnicode_InternFromString("c_contiguous")) ||
        !(S_dtype_attr = PyUnicode_InternFromString("dtype")) || !(S_size = PyUnicode_InternFromString("size")))
        return NULL;
    if (!(S_C = PyUnicode_InternFromString("C")) || !(S_offset_form = PyUnicode_InternFromString("offset_form")) ||
        !(S_itemsize = PyUnicode_InternFromString("itemsize")))
        return NULL;
    if (!EMPTY || !EMPTY_STR || !S_buffer || !S_matmul || !S_scalar || !S_reduce || !S_expand || !S_VERIFY ||
        !S_WATCH || !S_TAPE || !S_current || !S_fuse)
        return NULL;
    LO_NONE = PyLong_FromLongLong(LO_NONE_VALUE);
    MINUS_ONE = PyLong_FromLong(-1);
    PyObject *m = LO_NONE && MINUS_ONE ? PyModule_Create(&module) : NULL;
    if (m != NULL && (DROP = PyObject_GetAttrString(m, "drop")) == NULL)
        Py_CLEAR(m);
    return m;
}
