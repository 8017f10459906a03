/* Decode a PyTorch flight-recorder pickle straight into columns.

   Why: a 2,000-entry ring unpickled into Python dicts, then taken apart field by field, costs ~3 ms
   of CPU per rank, which at 16,384 ranks is most of the analysis. Here the pickle's opcodes build a
   compact tree of nodes (no Python objects), and the ring's entries become one column per field:
   integers as int64 bytes with a missing mask, anything else coded against its distinct values. The
   fields that make up an op (group, name, sizes, dtypes, frames) become one op code per entry and
   one Python value per distinct op.

   Safety: only plain containers and scalars are decoded. Any opcode that could run code (GLOBAL,
   REDUCE, BUILD, persistent ids...), any text-protocol opcode, a malformed stream, a nesting deeper
   than MAX_DEPTH or anything else unexpected returns None: the caller then uses the restricted
   Python unpickler (analyzers/safe_pickle.py), which decides and explains. This decoder never raises
   for bad input and never returns a result Python's unpickler would not give.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define NEW_NONE() (Py_INCREF(Py_None), Py_None)

enum { K_NONE, K_FALSE, K_TRUE, K_INT, K_FLOAT, K_STR, K_BYTES, K_LIST, K_TUPLE, K_DICT };

#define MAX_DEPTH 64
#define NO_NODE (-1)

typedef struct {
    uint8_t kind;
    uint8_t hashed;
    uint32_t len;  /* str/bytes: bytes; list/tuple: items; dict: keys and values (2 per item) */
    uint64_t hash;
    union {
        int64_t i;
        double f;
        const char *s;
        struct { int32_t first, last; } ch;  /* chunks of kids, in order */
    } v;
} Node;

typedef struct { int32_t start, count, next; } Chunk;

typedef struct {
    Node *nodes; size_t n_nodes, cap_nodes;
    int32_t *kids; size_t n_kids, cap_kids;
    Chunk *chunks; size_t n_chunks, cap_chunks;
    int32_t *stack; size_t sp, cap_stack;
    size_t *marks; size_t n_marks, cap_marks;
    int32_t *memo; size_t cap_memo, memo_count, memo_hi, limit;
} VM;

static VM vm;  /* reused between calls (the GIL is held throughout) */

static int grow(void **buf, size_t *cap, size_t need, size_t item) {
    if (need <= *cap) return 0;
    size_t cap2 = *cap ? *cap : 1024;
    while (cap2 < need) cap2 *= 2;
    void *p = realloc(*buf, cap2 * item);
    if (!p) return -1;
    *buf = p;
    *cap = cap2;
    return 0;
}

#define GROW(arr, cap, need) ((need) <= (cap) ? 0 : grow((void **)&(arr), &(cap), (need), sizeof(*(arr))))

static inline int32_t new_node(uint8_t kind) {
    if (vm.n_nodes >= INT32_MAX || GROW(vm.nodes, vm.cap_nodes, vm.n_nodes + 1)) return NO_NODE;
    Node *n = &vm.nodes[vm.n_nodes];
    n->kind = kind;
    n->hashed = 0;
    n->len = 0;
    n->hash = 0;
    n->v.i = 0;
    if (kind == K_LIST || kind == K_TUPLE || kind == K_DICT) { n->v.ch.first = -1; n->v.ch.last = -1; }
    return (int32_t)vm.n_nodes++;
}

static inline int push(int32_t node) {
    if (node == NO_NODE || GROW(vm.stack, vm.cap_stack, vm.sp + 1)) return -1;
    vm.stack[vm.sp++] = node;
    return 0;
}

static size_t floor_(void) { return vm.n_marks ? vm.marks[vm.n_marks - 1] : 0; }

/* Append stack[from:to] to container `c` as its next chunk (extending the last one when adjacent). */
static int add_kids(int32_t c, size_t from, size_t to) {
    size_t count = to - from;
    if (count == 0) return 0;
    if (vm.n_kids + count >= INT32_MAX || GROW(vm.kids, vm.cap_kids, vm.n_kids + count)) return -1;
    memcpy(vm.kids + vm.n_kids, vm.stack + from, count * sizeof(int32_t));
    Node *n = &vm.nodes[c];
    if (n->len + count >= INT32_MAX) return -1;
    n->len += (uint32_t)count;
    if (n->v.ch.last >= 0) {
        Chunk *last = &vm.chunks[n->v.ch.last];
        if ((size_t)(last->start + last->count) == vm.n_kids) {
            last->count += (int32_t)count;
            vm.n_kids += count;
            return 0;
        }
    }
    if (GROW(vm.chunks, vm.cap_chunks, vm.n_chunks + 1)) return -1;
    int32_t k = (int32_t)vm.n_chunks++;
    vm.chunks[k].start = (int32_t)vm.n_kids;
    vm.chunks[k].count = (int32_t)count;
    vm.chunks[k].next = -1;
    n = &vm.nodes[c];
    if (n->v.ch.last >= 0) vm.chunks[n->v.ch.last].next = k; else n->v.ch.first = k;
    n->v.ch.last = k;
    vm.n_kids += count;
    return 0;
}

/* A container built from the items above the last mark (LIST, TUPLE, DICT) or the top `count` items. */
static int collect(uint8_t kind, size_t from) {
    int32_t c = new_node(kind);
    if (c == NO_NODE) return -1;
    if (kind == K_DICT && (vm.sp - from) % 2) return -1;
    if (add_kids(c, from, vm.sp)) return -1;
    vm.sp = from;
    return push(c);
}

static int memo_put(size_t idx) {
    if (vm.sp <= floor_() || idx > vm.limit) return -1;  /* more memo slots than bytes: hand-made, not ours */
    if (idx >= vm.cap_memo) {
        size_t old = vm.cap_memo;
        if (GROW(vm.memo, vm.cap_memo, idx + 1)) return -1;
        for (size_t j = old; j < vm.cap_memo; j++) vm.memo[j] = NO_NODE;
    }
    if (vm.memo[idx] == NO_NODE) vm.memo_count++;
    if (idx + 1 > vm.memo_hi) vm.memo_hi = idx + 1;
    vm.memo[idx] = vm.stack[vm.sp - 1];
    return 0;
}

static int memo_get(size_t idx) {
    if (idx >= vm.cap_memo || vm.memo[idx] == NO_NODE) return -1;
    return push(vm.memo[idx]);
}

static inline uint64_t le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int k = n - 1; k >= 0; k--) v = (v << 8) | p[k];
    return v;
}

static int text(uint8_t kind, const unsigned char *p, size_t n, size_t *i, int width) {
    if (*i + width > n) return -1;
    uint64_t len = le(p + *i, width);
    *i += width;
    if (len > n - *i || len >= INT32_MAX) return -1;
    int32_t s = new_node(kind);
    if (s == NO_NODE) return -1;
    vm.nodes[s].v.s = (const char *)p + *i;
    vm.nodes[s].len = (uint32_t)len;
    *i += len;
    return push(s);
}

static int integer(int64_t value) {
    int32_t k = new_node(K_INT);
    if (k == NO_NODE) return -1;
    vm.nodes[k].v.i = value;
    return push(k);
}

/* Run the opcodes; the root node, or NO_NODE for anything this decoder does not take. */
static int32_t run(const unsigned char *p, size_t n) {
    size_t i = 0;
    for (size_t j = 0; j < vm.memo_hi && j < vm.cap_memo; j++) vm.memo[j] = NO_NODE;
    vm.n_nodes = vm.n_kids = vm.n_chunks = vm.sp = vm.n_marks = vm.memo_count = vm.memo_hi = 0;
    vm.limit = n;
#define NEED(k) do { if (i + (k) > n) return NO_NODE; } while (0)
#define OK(x) do { if ((x) != 0) return NO_NODE; } while (0)
#define ABOVE_MARK(k) do { if (vm.sp < floor_() + (k)) return NO_NODE; } while (0)
    while (i < n) {
        unsigned char op = p[i++];
        switch (op) {
        case 0x80: NEED(1); if (p[i] > 5) return NO_NODE; i++; break;  /* PROTO */
        case 0x95:  /* FRAME: transparent, but it must fit (as Python's unpickler checks) */
            NEED(8);
            if (le(p + i, 8) > n - i - 8) return NO_NODE;
            i += 8;
            break;
        case '(':
            OK(GROW(vm.marks, vm.cap_marks, vm.n_marks + 1));
            vm.marks[vm.n_marks++] = vm.sp;
            break;
        case '.':  /* STOP */
            if (vm.sp <= floor_()) return NO_NODE;
            return vm.stack[vm.sp - 1];
        case '0':  /* POP: an item, else the mark */
            if (vm.sp > floor_()) vm.sp--;
            else if (vm.n_marks) vm.n_marks--;
            else return NO_NODE;
            break;
        case '1':  /* POP_MARK */
            if (!vm.n_marks) return NO_NODE;
            vm.sp = vm.marks[--vm.n_marks];
            break;
        case '2': ABOVE_MARK(1); OK(push(vm.stack[vm.sp - 1])); break;  /* DUP */
        case 'J': NEED(4); OK(integer((int32_t)(uint32_t)le(p + i, 4))); i += 4; break;
        case 'K': NEED(1); OK(integer(p[i])); i += 1; break;
        case 'M': NEED(2); OK(integer((int64_t)le(p + i, 2))); i += 2; break;
        case 0x8a: {  /* LONG1: little-endian two's complement, up to 8 bytes here */
            NEED(1);
            int nb = p[i++];
            if (nb > 8) return NO_NODE;
            NEED((size_t)nb);
            uint64_t u = nb ? le(p + i, nb) : 0;
            if (nb && nb < 8 && (p[i + nb - 1] & 0x80)) u |= ~(uint64_t)0 << (8 * nb);
            i += nb;
            OK(integer((int64_t)u));
            break;
        }
        case 'N': OK(push(new_node(K_NONE))); break;
        case 0x88: OK(push(new_node(K_TRUE))); break;
        case 0x89: OK(push(new_node(K_FALSE))); break;
        case 'G': {  /* BINFLOAT: big-endian double */
            NEED(8);
            uint64_t u = 0;
            for (int k = 0; k < 8; k++) u = (u << 8) | p[i + k];
            i += 8;
            int32_t f = new_node(K_FLOAT);
            if (f == NO_NODE) return NO_NODE;
            memcpy(&vm.nodes[f].v.f, &u, 8);
            OK(push(f));
            break;
        }
        case 'X': OK(text(K_STR, p, n, &i, 4)); break;
        case 0x8c: OK(text(K_STR, p, n, &i, 1)); break;
        case 0x8d: OK(text(K_STR, p, n, &i, 8)); break;
        case 'B': OK(text(K_BYTES, p, n, &i, 4)); break;
        case 'C': OK(text(K_BYTES, p, n, &i, 1)); break;
        case 0x8e: OK(text(K_BYTES, p, n, &i, 8)); break;
        case ']': OK(push(new_node(K_LIST))); break;
        case ')': OK(push(new_node(K_TUPLE))); break;
        case '}': OK(push(new_node(K_DICT))); break;
        case 'l': case 't': case 'd': {  /* LIST, TUPLE, DICT from the items above the mark */
            if (!vm.n_marks) return NO_NODE;
            size_t from = vm.marks[--vm.n_marks];
            OK(collect(op == 'l' ? K_LIST : op == 't' ? K_TUPLE : K_DICT, from));
            break;
        }
        case 0x85: case 0x86: case 0x87: {  /* TUPLE1..3 */
            size_t k = (size_t)(op - 0x84);
            ABOVE_MARK(k);
            OK(collect(K_TUPLE, vm.sp - k));
            break;
        }
        case 'a': case 's': {  /* APPEND (one item), SETITEM (a key and a value): onto the item below them */
            size_t k = op == 'a' ? 1 : 2;
            ABOVE_MARK(k + 1);
            int32_t c = vm.stack[vm.sp - k - 1];
            if (vm.nodes[c].kind != (op == 'a' ? K_LIST : K_DICT)) return NO_NODE;
            OK(add_kids(c, vm.sp - k, vm.sp));
            vm.sp -= k;
            break;
        }
        case 'e': case 'u': {  /* APPENDS, SETITEMS: onto the item below the mark */
            if (!vm.n_marks) return NO_NODE;
            size_t from = vm.marks[--vm.n_marks];
            if (from <= floor_() || from == 0) return NO_NODE;
            int32_t c = vm.stack[from - 1];
            if (vm.nodes[c].kind != (op == 'e' ? K_LIST : K_DICT)) return NO_NODE;
            if (op == 'u' && (vm.sp - from) % 2) return NO_NODE;
            OK(add_kids(c, from, vm.sp));
            vm.sp = from;
            break;
        }
        case 'q': NEED(1); OK(memo_put(p[i])); i += 1; break;
        case 'r': NEED(4); OK(memo_put((size_t)le(p + i, 4))); i += 4; break;
        case 0x94: OK(memo_put(vm.memo_count)); break;
        case 'h': NEED(1); OK(memo_get(p[i])); i += 1; break;
        case 'j': NEED(4); OK(memo_get((size_t)le(p + i, 4))); i += 4; break;
        default: return NO_NODE;  /* globals, reduce, build, persistent ids, sets, text opcodes, ... */
        }
    }
    return NO_NODE;  /* no STOP */
#undef NEED
#undef OK
#undef ABOVE_MARK
}

/* ---- reading the tree ---- */

typedef struct { int32_t chunk, pos; } Iter;

static inline Iter iter(int32_t c) { Iter it = { vm.nodes[c].v.ch.first, 0 }; return it; }

static inline int32_t next(Iter *it) {
    while (it->chunk >= 0) {
        Chunk *ch = &vm.chunks[it->chunk];
        if (it->pos < ch->count) return vm.kids[ch->start + it->pos++];
        it->chunk = ch->next;
        it->pos = 0;
    }
    return NO_NODE;
}

static inline uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdULL;
    return h ^ (h >> 33);
}

static uint64_t bytes_hash(const char *s, uint32_t n) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (uint32_t k = 0; k < n; k++) h = (h ^ (unsigned char)s[k]) * 0x100000001b3ULL;
    return h;
}

/* Structural hash; -1 on nesting deeper than MAX_DEPTH (a cycle, or hostile input). */
static int node_hash(int32_t x, int depth, uint64_t *out) {
    Node *n = &vm.nodes[x];
    if (n->hashed) { *out = n->hash; return 0; }
    if (depth > MAX_DEPTH) return -1;
    uint64_t h = mix(0x12345, n->kind);
    switch (n->kind) {
    case K_INT: h = mix(h, (uint64_t)n->v.i); break;
    case K_FLOAT: { uint64_t u; memcpy(&u, &n->v.f, 8); h = mix(h, u); break; }
    case K_STR: case K_BYTES: h = mix(h, bytes_hash(n->v.s, n->len)); break;
    case K_LIST: case K_TUPLE: case K_DICT: {
        Iter it = iter(x);
        int32_t k;
        h = mix(h, n->len);
        while ((k = next(&it)) != NO_NODE) {
            uint64_t hk;
            if (node_hash(k, depth + 1, &hk)) return -1;
            h = mix(h, hk);
        }
        break;
    }
    default: break;
    }
    n = &vm.nodes[x];
    n->hash = h;
    n->hashed = 1;
    *out = h;
    return 0;
}

static int node_equal(int32_t a, int32_t b, int depth) {
    if (a == b) return 1;
    if (a == NO_NODE || b == NO_NODE || depth > MAX_DEPTH) return 0;
    Node *x = &vm.nodes[a], *y = &vm.nodes[b];
    if (x->kind != y->kind || x->len != y->len) return 0;
    if (x->hashed && y->hashed && x->hash != y->hash) return 0;
    switch (x->kind) {
    case K_INT: return x->v.i == y->v.i;
    case K_FLOAT: return memcmp(&x->v.f, &y->v.f, 8) == 0;
    case K_STR: case K_BYTES: return x->len == 0 || x->v.s == y->v.s || memcmp(x->v.s, y->v.s, x->len) == 0;
    case K_LIST: case K_TUPLE: case K_DICT: {
        Iter i = iter(a), j = iter(b);
        for (;;) {
            int32_t p = next(&i), q = next(&j);
            if (p == NO_NODE || q == NO_NODE) return p == q;
            if (!node_equal(p, q, depth + 1)) return 0;
        }
    }
    default: return 1;
    }
}

static PyObject *to_python(int32_t x, int depth) {
    if (depth > MAX_DEPTH) return NULL;
    Node *n = &vm.nodes[x];
    switch (n->kind) {
    case K_NONE: Py_RETURN_NONE;
    case K_TRUE: Py_RETURN_TRUE;
    case K_FALSE: Py_RETURN_FALSE;
    case K_INT: return PyLong_FromLongLong(n->v.i);
    case K_FLOAT: return PyFloat_FromDouble(n->v.f);
    case K_STR: return PyUnicode_DecodeUTF8(n->v.s, n->len, "surrogatepass");
    case K_BYTES: return PyBytes_FromStringAndSize(n->v.s, n->len);
    case K_LIST: case K_TUPLE: {
        PyObject *out = n->kind == K_LIST ? PyList_New(n->len) : PyTuple_New(n->len);
        if (!out) return NULL;
        Iter it = iter(x);
        int32_t k;
        Py_ssize_t j = 0;
        while ((k = next(&it)) != NO_NODE) {
            PyObject *item = to_python(k, depth + 1);
            if (!item) { Py_DECREF(out); return NULL; }
            if (PyList_Check(out)) PyList_SET_ITEM(out, j, item); else PyTuple_SET_ITEM(out, j, item);
            j++;
        }
        return out;
    }
    case K_DICT: {
        PyObject *out = PyDict_New();
        if (!out) return NULL;
        Iter it = iter(x);
        int32_t k, v;
        while ((k = next(&it)) != NO_NODE && (v = next(&it)) != NO_NODE) {
            PyObject *key = to_python(k, depth + 1);
            PyObject *value = key ? to_python(v, depth + 1) : NULL;
            int bad = !value || PyDict_SetItem(out, key, value) < 0;  /* an unhashable key fails here */
            Py_XDECREF(key);
            Py_XDECREF(value);
            if (bad) { Py_DECREF(out); return NULL; }
        }
        return out;
    }
    default: return NULL;
    }
}

/* ---- the entries as columns ---- */

typedef struct {
    const char *name; uint32_t len;
    int32_t *cell;  /* node per entry, NO_NODE where absent */
    int template_slot;  /* index into the template fields, or -1 */
} Field;

typedef struct {
    Field *f; size_t n, cap;
} Fields;

static int32_t field_index(Fields *fs, Node *key, size_t hint, size_t rows, PyObject *templates) {
    if (hint < fs->n && fs->f[hint].len == key->len
        && (fs->f[hint].name == key->v.s || memcmp(fs->f[hint].name, key->v.s, key->len) == 0))
        return (int32_t)hint;  /* the usual case: every record lists its fields in one order */
    for (size_t j = 0; j < fs->n; j++)
        if (fs->f[j].len == key->len && memcmp(fs->f[j].name, key->v.s, key->len) == 0) return (int32_t)j;
    if (GROW(fs->f, fs->cap, fs->n + 1)) return -1;
    Field *f = &fs->f[fs->n];
    f->name = key->v.s;
    f->len = key->len;
    f->template_slot = -1;
    f->cell = malloc(rows ? rows * sizeof(int32_t) : 1);
    if (!f->cell) return -1;
    for (size_t r = 0; r < rows; r++) f->cell[r] = NO_NODE;
    Py_ssize_t nt = PyTuple_GET_SIZE(templates);
    for (Py_ssize_t t = 0; t < nt; t++) {
        Py_ssize_t len;
        const char *s = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(templates, t), &len);
        if (s && (size_t)len == key->len && memcmp(s, key->v.s, key->len) == 0) f->template_slot = (int)t;
    }
    return (int32_t)fs->n++;
}

static void free_fields(Fields *fs) {
    for (size_t j = 0; j < fs->n; j++) free(fs->f[j].cell);
    free(fs->f);
}

static PyObject *field_name(Field *f) { return PyUnicode_DecodeUTF8(f->name, f->len, "surrogatepass"); }

/* Distinct values of `cell` (by structure): int32 codes (-1 absent) and the list of values. */
static PyObject *coded(int32_t *cell, size_t rows, int absent_is_none) {
    size_t cap = 16;
    while (cap < 2 * rows) cap *= 2;
    int32_t *table = malloc(cap * sizeof(int32_t));  /* slot -> unique id */
    int32_t *first = malloc((rows ? rows : 1) * sizeof(int32_t));  /* unique id -> node */
    PyObject *codes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(rows * sizeof(int32_t)));
    PyObject *uniques = PyList_New(0), *out = NULL;
    if (!table || !first || !codes || !uniques) goto done;
    for (size_t s = 0; s < cap; s++) table[s] = -1;
    int32_t *code = (int32_t *)PyBytes_AS_STRING(codes);
    int32_t distinct = 0;
    for (size_t r = 0; r < rows; r++) {
        int32_t x = cell[r];
        if (x == NO_NODE || (absent_is_none && vm.nodes[x].kind == K_NONE)) { code[r] = -1; continue; }
        uint64_t h;
        if (node_hash(x, 0, &h)) goto done;
        size_t s = (size_t)h & (cap - 1);
        while (table[s] >= 0 && !node_equal(first[table[s]], x, 0)) s = (s + 1) & (cap - 1);
        if (table[s] < 0) {
            PyObject *v = to_python(x, 0);
            if (!v || PyList_Append(uniques, v) < 0) { Py_XDECREF(v); goto done; }
            Py_DECREF(v);
            first[distinct] = x;
            table[s] = distinct++;
        }
        code[r] = table[s];
    }
    out = Py_BuildValue("(sOO)", "c", codes, uniques);
done:
    free(table);
    free(first);
    Py_XDECREF(codes);
    Py_XDECREF(uniques);
    return out;
}

/* A column of scalars: ("i", int64 bytes, missing bytes), ("b", ...) or ("f", float64 bytes, ...), else coded. */
static PyObject *column(int32_t *cell, size_t rows) {
    int ints = 0, bools = 0, floats = 0, other = 0;
    for (size_t r = 0; r < rows && !other; r++) {
        if (cell[r] == NO_NODE) continue;
        switch (vm.nodes[cell[r]].kind) {
        case K_NONE: break;
        case K_INT: ints = 1; break;
        case K_TRUE: case K_FALSE: bools = 1; break;
        case K_FLOAT: floats = 1; break;
        default: other = 1;
        }
    }
    if (other || (bools && (ints || floats))) return coded(cell, rows, 1);
    const char *kind = floats ? "f" : bools ? "b" : "i";
    size_t width = bools ? 1 : 8;
    PyObject *values = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(rows * width));
    PyObject *missing = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)rows);
    if (!values || !missing) { Py_XDECREF(values); Py_XDECREF(missing); return NULL; }
    char *v = PyBytes_AS_STRING(values), *m = PyBytes_AS_STRING(missing);
    for (size_t r = 0; r < rows; r++) {
        Node *n = cell[r] == NO_NODE ? NULL : &vm.nodes[cell[r]];
        int absent = !n || n->kind == K_NONE;
        m[r] = (char)absent;
        if (bools) v[r] = (char)(!absent && n->kind == K_TRUE);
        else if (floats) { double d = absent ? 0.0 : n->kind == K_INT ? (double)n->v.i : n->v.f; memcpy(v + 8 * r, &d, 8); }
        else { int64_t x = absent ? 0 : n->v.i; memcpy(v + 8 * r, &x, 8); }
    }
    PyObject *out = Py_BuildValue("(sOO)", kind, values, missing);
    Py_DECREF(values);
    Py_DECREF(missing);
    return out;
}

/* Op codes: entries whose template fields are all equal share a code (numbered by first appearance). */
static PyObject *op_codes(Fields *fs, size_t rows, Py_ssize_t nt, PyObject **firsts_out) {
    int32_t *slot_field = malloc((nt ? nt : 1) * sizeof(int32_t));
    size_t cap = 16;
    while (cap < 2 * rows) cap *= 2;
    int32_t *table = malloc(cap * sizeof(int32_t));
    int32_t *first = malloc((rows ? rows : 1) * sizeof(int32_t));
    PyObject *codes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(rows * sizeof(int32_t)));
    PyObject *firsts = NULL, *out = NULL;
    if (!slot_field || !table || !first || !codes) goto done;
    for (Py_ssize_t t = 0; t < nt; t++) slot_field[t] = -1;
    for (size_t j = 0; j < fs->n; j++) if (fs->f[j].template_slot >= 0) slot_field[fs->f[j].template_slot] = (int32_t)j;
    for (size_t s = 0; s < cap; s++) table[s] = -1;
    int32_t *code = (int32_t *)PyBytes_AS_STRING(codes);
    int32_t distinct = 0;
    for (size_t r = 0; r < rows; r++) {
        uint64_t h = 0x9ae16a3b2f90404fULL;
        for (Py_ssize_t t = 0; t < nt; t++) {
            int32_t x = slot_field[t] >= 0 ? fs->f[slot_field[t]].cell[r] : NO_NODE;
            uint64_t hx = 0x51;
            if (x != NO_NODE && node_hash(x, 0, &hx)) goto done;
            h = mix(h, hx);
        }
        size_t s = (size_t)h & (cap - 1);
        for (;;) {
            if (table[s] < 0) { first[distinct] = (int32_t)r; table[s] = distinct++; break; }
            int32_t other = first[table[s]], same = 1;
            for (Py_ssize_t t = 0; t < nt && same; t++) {
                if (slot_field[t] < 0) continue;
                int32_t *cell = fs->f[slot_field[t]].cell;
                same = node_equal(cell[other], cell[r], 0);
            }
            if (same) break;
            s = (s + 1) & (cap - 1);
        }
        code[r] = table[s];
    }
    firsts = PyList_New(distinct);
    if (!firsts) goto done;
    for (int32_t d = 0; d < distinct; d++) {
        PyObject *row = PyLong_FromLong(first[d]);
        if (!row) goto done;
        PyList_SET_ITEM(firsts, d, row);
    }
    out = codes;
    codes = NULL;
    *firsts_out = firsts;
    firsts = NULL;
done:
    free(slot_field);
    free(table);
    free(first);
    Py_XDECREF(codes);
    Py_XDECREF(firsts);
    return out;
}

/* (names, columns, op codes, per template field the values of each op) for the `entries` list. */
static PyObject *entries_columns(int32_t list, PyObject *templates) {
    size_t rows = vm.nodes[list].len;
    Fields fs = { NULL, 0, 0 };
    PyObject *names = NULL, *cols = NULL, *codes = NULL, *firsts = NULL, *tvalues = NULL, *digests = NULL, *out = NULL;
    Iter it = iter(list);
    int32_t e;
    size_t r = 0;
    while ((e = next(&it)) != NO_NODE) {
        if (vm.nodes[e].kind != K_DICT) goto done;
        Iter kv = iter(e);
        int32_t k, v;
        size_t hint = 0;
        while ((k = next(&kv)) != NO_NODE && (v = next(&kv)) != NO_NODE) {
            if (vm.nodes[k].kind != K_STR) goto done;
            int32_t f = field_index(&fs, &vm.nodes[k], hint, rows, templates);
            if (f < 0) goto done;
            fs.f[f].cell[r] = v;
            hint = (size_t)f + 1;
        }
        r++;
    }
    Py_ssize_t nt = PyTuple_GET_SIZE(templates);
    names = PyList_New(0);
    cols = PyDict_New();
    tvalues = PyDict_New();
    if (!names || !cols || !tvalues) goto done;
    codes = op_codes(&fs, rows, nt, &firsts);
    if (!codes) goto done;
    digests = PyDict_New();  /* per op field: its values over the ops, in order (equal rings share them) */
    if (!digests) goto done;
    for (size_t j = 0; j < fs.n; j++) {
        if (fs.f[j].template_slot < 0) continue;
        uint64_t digest = 0x2545f4914f6cdd1dULL;
        for (Py_ssize_t d = 0; d < PyList_GET_SIZE(firsts); d++) {
            int32_t x = fs.f[j].cell[PyLong_AsLong(PyList_GET_ITEM(firsts, d))];
            uint64_t h = 0x51;
            if (x != NO_NODE && node_hash(x, 0, &h)) goto done;
            digest = mix(digest, h);
        }
        PyObject *name = field_name(&fs.f[j]);
        PyObject *value = name ? PyLong_FromUnsignedLongLong(digest | 1) : NULL;  /* never 0 */
        int bad = !value || PyDict_SetItem(digests, name, value) < 0;
        Py_XDECREF(name);
        Py_XDECREF(value);
        if (bad) goto done;
    }
    for (size_t j = 0; j < fs.n; j++) {
        PyObject *name = field_name(&fs.f[j]);
        if (!name || PyList_Append(names, name) < 0) { Py_XDECREF(name); goto done; }
        PyObject *value;
        if (fs.f[j].template_slot >= 0) {  /* the value at each op's first entry */
            Py_ssize_t nd = PyList_GET_SIZE(firsts);
            value = PyList_New(nd);
            for (Py_ssize_t d = 0; value && d < nd; d++) {
                int32_t x = fs.f[j].cell[PyLong_AsLong(PyList_GET_ITEM(firsts, d))];
                PyObject *item = x == NO_NODE ? NEW_NONE() : to_python(x, 0);
                if (!item) { Py_CLEAR(value); break; }
                PyList_SET_ITEM(value, d, item);
            }
            if (!value || PyDict_SetItem(tvalues, name, value) < 0) { Py_XDECREF(value); Py_DECREF(name); goto done; }
        } else {
            value = column(fs.f[j].cell, rows);
            if (!value || PyDict_SetItem(cols, name, value) < 0) { Py_XDECREF(value); Py_DECREF(name); goto done; }
        }
        Py_DECREF(value);
        Py_DECREF(name);
    }
    out = Py_BuildValue("(nOOOOO)", (Py_ssize_t)rows, names, cols, codes, tvalues, digests);
done:
    free_fields(&fs);
    Py_XDECREF(names);
    Py_XDECREF(cols);
    Py_XDECREF(codes);
    Py_XDECREF(firsts);
    Py_XDECREF(tvalues);
    Py_XDECREF(digests);
    return out;
}

static PyObject *decode(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer buf;
    PyObject *templates;
    if (!PyArg_ParseTuple(args, "y*O!", &buf, &PyTuple_Type, &templates)) return NULL;
    for (Py_ssize_t t = 0; t < PyTuple_GET_SIZE(templates); t++)
        if (!PyUnicode_Check(PyTuple_GET_ITEM(templates, t))) {
            PyBuffer_Release(&buf);
            PyErr_SetString(PyExc_TypeError, "template fields must be str");
            return NULL;
        }
    PyObject *top = NULL, *entries = NEW_NONE(), *out = NULL;
    int32_t root = (size_t)buf.len < ((size_t)1 << 31) ? run(buf.buf, (size_t)buf.len) : NO_NODE;
    if (root == NO_NODE || vm.nodes[root].kind != K_DICT) goto fallback;
    top = PyDict_New();
    if (!top) goto fallback;
    Iter it = iter(root);
    int32_t k, v;
    while ((k = next(&it)) != NO_NODE && (v = next(&it)) != NO_NODE) {
        Node *key = &vm.nodes[k];
        if (key->kind == K_STR && key->len == 7 && memcmp(key->v.s, "entries", 7) == 0
            && vm.nodes[v].kind == K_LIST) {
            PyObject *cols = entries_columns(v, templates);
            if (!cols) goto fallback;
            Py_SETREF(entries, cols);
            if (PyDict_DelItemString(top, "entries") < 0) PyErr_Clear();
            continue;
        }
        PyObject *pk = to_python(k, 0);
        PyObject *pv = pk ? to_python(v, 0) : NULL;
        int bad = !pv || PyDict_SetItem(top, pk, pv) < 0;
        if (!bad && PyUnicode_Check(pk) && PyUnicode_CompareWithASCIIString(pk, "entries") == 0) {
            goto fallback_refs;  /* `entries` that is not a list: the Python reader explains */
        }
        Py_XDECREF(pk);
        Py_XDECREF(pv);
        if (bad) goto fallback;
        continue;
    fallback_refs:
        Py_XDECREF(pk);
        Py_XDECREF(pv);
        goto fallback;
    }
    out = PyTuple_Pack(2, top, entries);
    Py_DECREF(top);
    Py_DECREF(entries);
    PyBuffer_Release(&buf);
    return out;
fallback:
    PyErr_Clear();
    Py_XDECREF(top);
    Py_XDECREF(entries);
    PyBuffer_Release(&buf);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS,
     "decode(data, template_fields) -> (top, entries) | None: a PyTorch flight-recorder pickle as columns"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_pickle_columns", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__pickle_columns(void) { return PyModule_Create(&module); }
