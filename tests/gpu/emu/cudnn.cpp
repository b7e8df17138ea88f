/* cudnn.cpp (CPU emulation, tests/gpu/emu): cuDNN 9's backend ("graph")
 * API as NVIDIA documents it, for the graphs kernels/cuda/attention_cudnn.cu
 * builds: built as libcudnn.so.9 beside the emulated programs (found by
 * their RPATH, as attention_cudnn.cu's dlopen looks for it), calling the
 * emulated runtime inside the program (linked -rdynamic).
 *
 * Descriptors take the attributes their type documents, each with its
 * documented attribute type (else BAD_PARAM), and check at finalize what
 * they need: a tensor its type, dimensions, strides, unique id and
 * alignment; an operation its tensors, finalized, of shapes that agree
 * (pointwise inputs equal to the output's dimensions or 1, matmul
 * [..., M, K] x [..., K, N] -> [..., M, N] with batch dimensions that
 * divide the output's, reductions to dimensions that divide the input's,
 * reshapes of the same element count); an operation graph its operations
 * in an order where each virtual tensor is written once before it is
 * read, and unique ids that name one tensor each. The heuristic offers
 * one engine for any such graph (none with EMU_CUDNN_REFUSE set: a graph
 * cuDNN has no engine for; with EMU_CUDNN_REFUSE=plan one whose plan's
 * finalize refuses it, CUDNN_STATUS_NOT_SUPPORTED, as an engine without a
 * kernel for the shape does), whose plan asks for a workspace of 1 MiB.
 * EMU_CUDNN_FAIL_EXECUTE set: cudnnBackendExecute fails
 * (CUDNN_STATUS_EXECUTION_FAILED) before it runs anything.
 * cudnnBackendExecute checks the variant pack against the graph (every
 * tensor that is not virtual bound, by-value ones to host memory, the
 * others and the workspace to the handle's device's memory: else the
 * "kernel" faults) and interprets the graph in the handle's stream's
 * order, naively: every virtual tensor materialized, in fp32 unless typed
 * otherwise (2-byte types rounded to nearest even, INT32 and BOOLEAN
 * exact), products and sums in fp32 in index order. So the graph's
 * meaning is checked, not whether NVIDIA's library has a fused engine for
 * it (only a GPU shows that). cudnnGetVersion says 9.19.0, or
 * EMU_CUDNN_VERSION's number.
 */
#include <math.h>   /* expf, logf */
#include <stdarg.h> /* va_list */
#include <stdint.h> /* int64_t */
#include <stdio.h>  /* vsnprintf */
#include <stdlib.h> /* getenv, atol */
#include <string.h> /* memcpy, strcmp */

#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <vector>

#include "../../../kernels/cuda/cudnn_api.h"
#include "emu/convert.h"
#include "internal.h"

namespace {

enum {
    BAD_PARAM = 2000,
    NOT_FINALIZED = 2004,
    ATTRIBUTE_TYPE = 2010,
    DESCRIPTOR_TYPE = 2012,
    DUPLICATED = 2009,
    SHAPE = 2008,
    EXECUTION_FAILED = 5000
};

thread_local char last_error[512];
thread_local int last_status; /* fail's last */

int fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int fail(int status, const char *fmt, ...)
{
    last_status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

/* EMU_CUDNN_REFUSE's refusal at the plan (at_plan, its value `plan`) or
 * at the heuristic (any other value); false when unset. */
bool refused(bool at_plan)
{
    const char *r = getenv("EMU_CUDNN_REFUSE");
    return r && (strcmp(r, "plan") == 0) == at_plan;
}

const uint32_t MAGIC = 0xc0d11e9u;

struct Handle {
    uint32_t magic = MAGIC;
    cudaStream_t stream = nullptr;
    int device = 0;
};

struct Attr {
    int type = 0;
    std::vector<unsigned char> bytes;
    int64_t count = 0;
};

struct Desc;

/* The interpreter's view of a graph (copied at the plan's finalize). */
struct Tensor {
    int64_t uid = 0;
    int dt = 0, n = 0;
    int64_t dims[8] = {0}, strides[8] = {0};
    bool virt = false, by_value = false;
    int64_t elements() const
    {
        int64_t e = 1;
        for (int i = 0; i < n; i++)
            e *= dims[i];
        return e;
    }
};

struct Op {
    int type = 0;  /* the operation's descriptor type */
    int mode = 0;  /* pointwise mode or reduction operator */
    int64_t axis = 0;
    int x = -1, b = -1, t = -1, y = -1; /* tensor indexes (matmul: a, b, -, c) */
};

struct Program {
    std::vector<Tensor> tensors;
    std::vector<Op> ops;
};

struct Desc {
    uint32_t magic = MAGIC;
    int type = 0;
    bool finalized = false;
    std::map<int, Attr> attrs;
    std::shared_ptr<Program> prog; /* graph, engine config, plan */
    int64_t workspace = 0;         /* plan */
    const Attr *get(int name) const
    {
        auto it = attrs.find(name);
        return it == attrs.end() ? nullptr : &it->second;
    }
    int64_t i64(int name, int64_t k = 0) const
    {
        int64_t v = 0;
        memcpy(&v, get(name)->bytes.data() + 8 * k, 8);
        return v;
    }
    int i32(int name) const
    {
        int v = 0;
        memcpy(&v, get(name)->bytes.data(), 4);
        return v;
    }
    Desc *desc(int name, int64_t k = 0) const
    {
        Desc *d = nullptr;
        memcpy(&d, get(name)->bytes.data() + 8 * k, 8);
        return d;
    }
};

bool alive(const void *p, int type = -1)
{
    const Desc *d = (const Desc *)p;
    return d && d->magic == MAGIC && (type < 0 || d->type == type);
}

size_t type_size(int t)
{
    switch (t) {
    case KCDNN_TYPE_BOOLEAN: return 1;
    case KCDNN_TYPE_DATA_TYPE: case KCDNN_TYPE_FLOAT: case KCDNN_TYPE_HEUR_MODE:
    case KCDNN_TYPE_POINTWISE_MODE: case KCDNN_TYPE_REDUCTION_OPERATOR_TYPE: return 4;
    default: return 8;
    }
}

/* The attributes a descriptor type takes: (descriptor, name, type, most values). */
struct Known {
    int desc, name, type, most;
};
const Known known[] = {
    {KCDNN_TENSOR_DESCRIPTOR, KCDNN_ATTR_TENSOR_DATA_TYPE, KCDNN_TYPE_DATA_TYPE, 1},
    {KCDNN_TENSOR_DESCRIPTOR, KCDNN_ATTR_TENSOR_DIMENSIONS, KCDNN_TYPE_INT64, 8},
    {KCDNN_TENSOR_DESCRIPTOR, KCDNN_ATTR_TENSOR_STRIDES, KCDNN_TYPE_INT64, 8},
    {KCDNN_TENSOR_DESCRIPTOR, KCDNN_ATTR_TENSOR_UNIQUE_ID, KCDNN_TYPE_INT64, 1},
    {KCDNN_TENSOR_DESCRIPTOR, KCDNN_ATTR_TENSOR_BYTE_ALIGNMENT, KCDNN_TYPE_INT64, 1},
    {KCDNN_TENSOR_DESCRIPTOR, KCDNN_ATTR_TENSOR_IS_VIRTUAL, KCDNN_TYPE_BOOLEAN, 1},
    {KCDNN_TENSOR_DESCRIPTOR, KCDNN_ATTR_TENSOR_IS_BY_VALUE, KCDNN_TYPE_BOOLEAN, 1},
    {KCDNN_POINTWISE_DESCRIPTOR, KCDNN_ATTR_POINTWISE_MODE, KCDNN_TYPE_POINTWISE_MODE, 1},
    {KCDNN_POINTWISE_DESCRIPTOR, KCDNN_ATTR_POINTWISE_MATH_PREC, KCDNN_TYPE_DATA_TYPE, 1},
    {KCDNN_POINTWISE_DESCRIPTOR, KCDNN_ATTR_POINTWISE_AXIS, KCDNN_TYPE_INT64, 1},
    {KCDNN_OPERATION_POINTWISE_DESCRIPTOR, KCDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, KCDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {KCDNN_OPERATION_POINTWISE_DESCRIPTOR, KCDNN_ATTR_OPERATION_POINTWISE_XDESC, KCDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {KCDNN_OPERATION_POINTWISE_DESCRIPTOR, KCDNN_ATTR_OPERATION_POINTWISE_BDESC, KCDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {KCDNN_OPERATION_POINTWISE_DESCRIPTOR, KCDNN_ATTR_OPERATION_POINTWISE_YDESC, KCDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {KCDNN_OPERATION_POINTWISE_DESCRIPTOR, KCDNN_ATTR_OPERATION_POINTWISE_TDESC, KCDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {KCDNN_OPERATION_POINTWISE_DESCRIPTOR, KCDNN_ATTR_OPERATION_POINTWISE_ALPHA1, KCDNN_TYPE_FLOAT, 1},
    {KCDNN_OPERATION_POINTWISE_DESCRIPTOR, KCDNN_ATTR_OPERATION_POINTWISE_ALPHA2, KCDNN_TYPE_FLOAT, 1},
    {KCDNN_MATMUL_DESCRIPTOR, KCDNN_ATTR_MATMUL_COMP_TYPE, KCDNN_TYPE_DATA_TYPE, 1},
    {KCDNN_OPERATION_MATMUL_DESCRIPTOR, KCDNN_ATTR_OPERATION_MATMUL_ADESC, KCDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {KCDNN_OPERATION_MATMUL_DESCRIPTOR, KCDNN_ATTR_OPERATION_MATMUL_BDESC, KCDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {KCDNN_OPERATION_MATMUL_DESCRIPTOR, KCDNN_ATTR_OPERATION_MATMUL_CDESC, KCDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {KCDNN_OPERATION_MATMUL_DESCRIPTOR, KCDNN_ATTR_OPERATION_MATMUL_DESC, KCDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {KCDNN_REDUCTION_DESCRIPTOR, KCDNN_ATTR_REDUCTION_OPERATOR, KCDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1},
    {KCDNN_REDUCTION_DESCRIPTOR, KCDNN_ATTR_REDUCTION_COMP_TYPE, KCDNN_TYPE_DATA_TYPE, 1},
    {KCDNN_OPERATION_REDUCTION_DESCRIPTOR, KCDNN_ATTR_OPERATION_REDUCTION_DESC, KCDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {KCDNN_OPERATION_REDUCTION_DESCRIPTOR, KCDNN_ATTR_OPERATION_REDUCTION_XDESC, KCDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {KCDNN_OPERATION_REDUCTION_DESCRIPTOR, KCDNN_ATTR_OPERATION_REDUCTION_YDESC, KCDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {KCDNN_OPERATION_RESHAPE_DESCRIPTOR, KCDNN_ATTR_OPERATION_RESHAPE_XDESC, KCDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {KCDNN_OPERATION_RESHAPE_DESCRIPTOR, KCDNN_ATTR_OPERATION_RESHAPE_YDESC, KCDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {KCDNN_OPERATIONGRAPH_DESCRIPTOR, KCDNN_ATTR_OPERATIONGRAPH_OPS, KCDNN_TYPE_BACKEND_DESCRIPTOR, 256},
    {KCDNN_OPERATIONGRAPH_DESCRIPTOR, KCDNN_ATTR_OPERATIONGRAPH_HANDLE, KCDNN_TYPE_HANDLE, 1},
    {KCDNN_ENGINEHEUR_DESCRIPTOR, KCDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, KCDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {KCDNN_ENGINEHEUR_DESCRIPTOR, KCDNN_ATTR_ENGINEHEUR_MODE, KCDNN_TYPE_HEUR_MODE, 1},
    {KCDNN_EXECUTION_PLAN_DESCRIPTOR, KCDNN_ATTR_EXECUTION_PLAN_HANDLE, KCDNN_TYPE_HANDLE, 1},
    {KCDNN_EXECUTION_PLAN_DESCRIPTOR, KCDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, KCDNN_TYPE_BACKEND_DESCRIPTOR, 1},
    {KCDNN_VARIANT_PACK_DESCRIPTOR, KCDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, KCDNN_TYPE_INT64, 256},
    {KCDNN_VARIANT_PACK_DESCRIPTOR, KCDNN_ATTR_VARIANT_PACK_DATA_POINTERS, KCDNN_TYPE_VOID_PTR, 256},
    {KCDNN_VARIANT_PACK_DESCRIPTOR, KCDNN_ATTR_VARIANT_PACK_WORKSPACE, KCDNN_TYPE_VOID_PTR, 1},
};

bool has(const Desc *d, int name)
{
    return d->get(name) != nullptr;
}

/* A finalized descriptor of `type` in attribute `name` (else 0 and why). */
Desc *need(const Desc *d, int name, int type, const char *what)
{
    if (!has(d, name)) {
        fail(BAD_PARAM, "%s: attribute %d not set", what, name);
        return nullptr;
    }
    Desc *x = d->desc(name);
    if (!alive(x, type)) {
        fail(DESCRIPTOR_TYPE, "%s: attribute %d is not a descriptor of type %d", what, name, type);
        return nullptr;
    }
    if (!x->finalized) {
        fail(NOT_FINALIZED, "%s: attribute %d's descriptor is not finalized", what, name);
        return nullptr;
    }
    return x;
}

Tensor tensor_of(const Desc *t)
{
    Tensor r;
    r.dt = t->i32(KCDNN_ATTR_TENSOR_DATA_TYPE);
    r.n = (int)t->get(KCDNN_ATTR_TENSOR_DIMENSIONS)->count;
    for (int i = 0; i < r.n; i++) {
        r.dims[i] = t->i64(KCDNN_ATTR_TENSOR_DIMENSIONS, i);
        r.strides[i] = t->i64(KCDNN_ATTR_TENSOR_STRIDES, i);
    }
    r.uid = t->i64(KCDNN_ATTR_TENSOR_UNIQUE_ID);
    r.virt = has(t, KCDNN_ATTR_TENSOR_IS_VIRTUAL) && t->get(KCDNN_ATTR_TENSOR_IS_VIRTUAL)->bytes[0];
    r.by_value = has(t, KCDNN_ATTR_TENSOR_IS_BY_VALUE) && t->get(KCDNN_ATTR_TENSOR_IS_BY_VALUE)->bytes[0];
    return r;
}

int finalize_tensor(Desc *t)
{
    for (int a : {KCDNN_ATTR_TENSOR_DATA_TYPE, KCDNN_ATTR_TENSOR_DIMENSIONS, KCDNN_ATTR_TENSOR_STRIDES,
                  KCDNN_ATTR_TENSOR_UNIQUE_ID, KCDNN_ATTR_TENSOR_BYTE_ALIGNMENT})
        if (!has(t, a))
            return fail(BAD_PARAM, "tensor: attribute %d not set", a);
    if (t->get(KCDNN_ATTR_TENSOR_DIMENSIONS)->count != t->get(KCDNN_ATTR_TENSOR_STRIDES)->count)
        return fail(BAD_PARAM, "tensor: %lld dimensions, %lld strides",
                    (long long)t->get(KCDNN_ATTR_TENSOR_DIMENSIONS)->count,
                    (long long)t->get(KCDNN_ATTR_TENSOR_STRIDES)->count);
    Tensor r = tensor_of(t);
    for (int i = 0; i < r.n; i++)
        if (r.dims[i] < 1 || r.strides[i] < 0)
            return fail(BAD_PARAM, "tensor %lld: dimension %d is %lld, stride %lld", (long long)r.uid, i,
                        (long long)r.dims[i], (long long)r.strides[i]);
    int dt = r.dt;
    if (dt != KCDNN_DATA_FLOAT && dt != KCDNN_DATA_HALF && dt != KCDNN_DATA_BFLOAT16 && dt != KCDNN_DATA_INT32 &&
        dt != KCDNN_DATA_BOOLEAN)
        return fail(BAD_PARAM, "tensor %lld: data type %d not emulated", (long long)r.uid, dt);
    if (r.virt && r.by_value)
        return fail(BAD_PARAM, "tensor %lld: virtual and by value", (long long)r.uid);
    return 0;
}

/* Whether `in` broadcasts to `out`: each dimension equal or 1 (or, where
 * `divide`, a divisor: grouped heads). */
bool fits(const Tensor &in, const Tensor &out, bool divide)
{
    if (in.n != out.n)
        return false;
    for (int i = 0; i < in.n; i++)
        if (in.dims[i] != out.dims[i] && in.dims[i] != 1 && !(divide && out.dims[i] % in.dims[i] == 0))
            return false;
    return true;
}

bool binary(int mode)
{
    return mode == KCDNN_POINTWISE_ADD || mode == KCDNN_POINTWISE_MUL || mode == KCDNN_POINTWISE_DIV ||
           mode == KCDNN_POINTWISE_SUB || mode == KCDNN_POINTWISE_CMP_GE || mode == KCDNN_POINTWISE_BINARY_SELECT;
}

bool unary(int mode)
{
    return mode == KCDNN_POINTWISE_EXP || mode == KCDNN_POINTWISE_LOG || mode == KCDNN_POINTWISE_IDENTITY ||
           mode == KCDNN_POINTWISE_GEN_INDEX;
}

int finalize_op(Desc *d)
{
    const char *what = "an operation";
    switch (d->type) {
    case KCDNN_POINTWISE_DESCRIPTOR: {
        if (!has(d, KCDNN_ATTR_POINTWISE_MODE) || !has(d, KCDNN_ATTR_POINTWISE_MATH_PREC))
            return fail(BAD_PARAM, "pointwise: mode or math precision not set");
        int m = d->i32(KCDNN_ATTR_POINTWISE_MODE);
        if (!binary(m) && !unary(m))
            return fail(KCDNN_STATUS_NOT_SUPPORTED, "pointwise mode %d not emulated", m);
        if (m == KCDNN_POINTWISE_GEN_INDEX && !has(d, KCDNN_ATTR_POINTWISE_AXIS))
            return fail(BAD_PARAM, "pointwise GEN_INDEX without an axis");
        return 0;
    }
    case KCDNN_MATMUL_DESCRIPTOR:
        return has(d, KCDNN_ATTR_MATMUL_COMP_TYPE) ? 0 : fail(BAD_PARAM, "matmul: no compute type");
    case KCDNN_REDUCTION_DESCRIPTOR: {
        if (!has(d, KCDNN_ATTR_REDUCTION_OPERATOR) || !has(d, KCDNN_ATTR_REDUCTION_COMP_TYPE))
            return fail(BAD_PARAM, "reduction: operator or compute type not set");
        int r = d->i32(KCDNN_ATTR_REDUCTION_OPERATOR);
        return r == KCDNN_REDUCE_TENSOR_ADD || r == KCDNN_REDUCE_TENSOR_MAX
                   ? 0
                   : fail(KCDNN_STATUS_NOT_SUPPORTED, "reduction operator %d not emulated", r);
    }
    case KCDNN_OPERATION_POINTWISE_DESCRIPTOR: {
        Desc *pw = need(d, KCDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, KCDNN_POINTWISE_DESCRIPTOR, what);
        Desc *x = need(d, KCDNN_ATTR_OPERATION_POINTWISE_XDESC, KCDNN_TENSOR_DESCRIPTOR, what);
        Desc *y = need(d, KCDNN_ATTR_OPERATION_POINTWISE_YDESC, KCDNN_TENSOR_DESCRIPTOR, what);
        if (!pw || !x || !y)
            return last_status;
        int m = pw->i32(KCDNN_ATTR_POINTWISE_MODE);
        Tensor ty = tensor_of(y);
        if (m != KCDNN_POINTWISE_GEN_INDEX && !fits(tensor_of(x), ty, false))
            return fail(SHAPE, "pointwise %d: x does not broadcast to y", m);
        if (binary(m)) {
            Desc *b = need(d, KCDNN_ATTR_OPERATION_POINTWISE_BDESC, KCDNN_TENSOR_DESCRIPTOR, what);
            if (!b)
                return last_status;
            if (!fits(tensor_of(b), ty, false))
                return fail(SHAPE, "pointwise %d: b does not broadcast to y", m);
        }
        if (m == KCDNN_POINTWISE_BINARY_SELECT) {
            Desc *t = need(d, KCDNN_ATTR_OPERATION_POINTWISE_TDESC, KCDNN_TENSOR_DESCRIPTOR, what);
            if (!t)
                return last_status;
            if (!fits(tensor_of(t), ty, false))
                return fail(SHAPE, "pointwise select: t does not broadcast to y");
        }
        for (int a : {KCDNN_ATTR_OPERATION_POINTWISE_ALPHA1, KCDNN_ATTR_OPERATION_POINTWISE_ALPHA2})
            if (has(d, a)) {
                float v;
                memcpy(&v, d->get(a)->bytes.data(), 4);
                if (v != 1.0f)
                    return fail(KCDNN_STATUS_NOT_SUPPORTED, "pointwise alpha %g not emulated", (double)v);
            }
        return 0;
    }
    case KCDNN_OPERATION_MATMUL_DESCRIPTOR: {
        Desc *a = need(d, KCDNN_ATTR_OPERATION_MATMUL_ADESC, KCDNN_TENSOR_DESCRIPTOR, what);
        Desc *b = need(d, KCDNN_ATTR_OPERATION_MATMUL_BDESC, KCDNN_TENSOR_DESCRIPTOR, what);
        Desc *c = need(d, KCDNN_ATTR_OPERATION_MATMUL_CDESC, KCDNN_TENSOR_DESCRIPTOR, what);
        if (!a || !b || !c || !need(d, KCDNN_ATTR_OPERATION_MATMUL_DESC, KCDNN_MATMUL_DESCRIPTOR, what))
            return last_status;
        Tensor A = tensor_of(a), B = tensor_of(b), C = tensor_of(c);
        int n = C.n;
        if (n < 3 || A.n != n || B.n != n || A.dims[n - 2] != C.dims[n - 2] || B.dims[n - 1] != C.dims[n - 1] ||
            A.dims[n - 1] != B.dims[n - 2])
            return fail(SHAPE, "matmul: [.., %lld, %lld] x [.., %lld, %lld] -> [.., %lld, %lld]",
                        (long long)A.dims[n - 2], (long long)A.dims[n - 1], (long long)B.dims[n - 2],
                        (long long)B.dims[n - 1], (long long)C.dims[n - 2], (long long)C.dims[n - 1]);
        for (int i = 0; i < n - 2; i++)
            if (C.dims[i] % A.dims[i] || C.dims[i] % B.dims[i])
                return fail(SHAPE, "matmul: batch dimension %d: %lld and %lld into %lld", i,
                            (long long)A.dims[i], (long long)B.dims[i], (long long)C.dims[i]);
        return 0;
    }
    case KCDNN_OPERATION_REDUCTION_DESCRIPTOR: {
        Desc *x = need(d, KCDNN_ATTR_OPERATION_REDUCTION_XDESC, KCDNN_TENSOR_DESCRIPTOR, what);
        Desc *y = need(d, KCDNN_ATTR_OPERATION_REDUCTION_YDESC, KCDNN_TENSOR_DESCRIPTOR, what);
        if (!x || !y || !need(d, KCDNN_ATTR_OPERATION_REDUCTION_DESC, KCDNN_REDUCTION_DESCRIPTOR, what))
            return last_status;
        return fits(tensor_of(y), tensor_of(x), true) ? 0 : fail(SHAPE, "reduction: y does not divide x");
    }
    case KCDNN_OPERATION_RESHAPE_DESCRIPTOR: {
        Desc *x = need(d, KCDNN_ATTR_OPERATION_RESHAPE_XDESC, KCDNN_TENSOR_DESCRIPTOR, what);
        Desc *y = need(d, KCDNN_ATTR_OPERATION_RESHAPE_YDESC, KCDNN_TENSOR_DESCRIPTOR, what);
        if (!x || !y)
            return last_status;
        return tensor_of(x).elements() == tensor_of(y).elements() ? 0
                                                                  : fail(SHAPE, "reshape: element counts differ");
    }
    default:
        return 0;
    }
}

/* The operation graph's program: its tensors (by descriptor) and ops. */
int finalize_graph(Desc *g)
{
    if (!has(g, KCDNN_ATTR_OPERATIONGRAPH_OPS) || !has(g, KCDNN_ATTR_OPERATIONGRAPH_HANDLE))
        return fail(BAD_PARAM, "operation graph: operations or handle not set");
    auto prog = std::make_shared<Program>();
    std::map<const Desc *, int> index;
    std::map<int64_t, const Desc *> uids;
    std::vector<bool> written;
    const int DUP = -2; /* (a tensor whose unique id another one has) */
    auto tensor = [&](const Desc *t) -> int {
        auto it = index.find(t);
        if (it != index.end())
            return it->second;
        Tensor r = tensor_of(t);
        if (uids.count(r.uid))
            return DUP;
        uids[r.uid] = t;
        index[t] = (int)prog->tensors.size();
        prog->tensors.push_back(r);
        written.push_back(false);
        return index[t];
    };
    const Attr *ops = g->get(KCDNN_ATTR_OPERATIONGRAPH_OPS);
    for (int64_t i = 0; i < ops->count; i++) {
        Desc *d = g->desc(KCDNN_ATTR_OPERATIONGRAPH_OPS, i);
        if (!alive(d) || !d->finalized)
            return fail(NOT_FINALIZED, "operation graph: operation %lld is not finalized", (long long)i);
        Op op;
        op.type = d->type;
        int in[3] = {-1, -1, -1}, out = -1;
        auto t = [&](int name) { return has(d, name) ? tensor(d->desc(name)) : -1; };
        switch (d->type) {
        case KCDNN_OPERATION_POINTWISE_DESCRIPTOR: {
            Desc *pw = d->desc(KCDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR);
            op.mode = pw->i32(KCDNN_ATTR_POINTWISE_MODE);
            if (op.mode == KCDNN_POINTWISE_GEN_INDEX)
                op.axis = pw->i64(KCDNN_ATTR_POINTWISE_AXIS);
            in[0] = op.x = t(KCDNN_ATTR_OPERATION_POINTWISE_XDESC);
            in[1] = op.b = binary(op.mode) ? t(KCDNN_ATTR_OPERATION_POINTWISE_BDESC) : -1;
            in[2] = op.t = op.mode == KCDNN_POINTWISE_BINARY_SELECT ? t(KCDNN_ATTR_OPERATION_POINTWISE_TDESC) : -1;
            out = op.y = t(KCDNN_ATTR_OPERATION_POINTWISE_YDESC);
            break;
        }
        case KCDNN_OPERATION_MATMUL_DESCRIPTOR:
            in[0] = op.x = t(KCDNN_ATTR_OPERATION_MATMUL_ADESC);
            in[1] = op.b = t(KCDNN_ATTR_OPERATION_MATMUL_BDESC);
            out = op.y = t(KCDNN_ATTR_OPERATION_MATMUL_CDESC);
            break;
        case KCDNN_OPERATION_REDUCTION_DESCRIPTOR:
            op.mode = d->desc(KCDNN_ATTR_OPERATION_REDUCTION_DESC)->i32(KCDNN_ATTR_REDUCTION_OPERATOR);
            in[0] = op.x = t(KCDNN_ATTR_OPERATION_REDUCTION_XDESC);
            out = op.y = t(KCDNN_ATTR_OPERATION_REDUCTION_YDESC);
            break;
        case KCDNN_OPERATION_RESHAPE_DESCRIPTOR:
            in[0] = op.x = t(KCDNN_ATTR_OPERATION_RESHAPE_XDESC);
            out = op.y = t(KCDNN_ATTR_OPERATION_RESHAPE_YDESC);
            break;
        default:
            return fail(KCDNN_STATUS_NOT_SUPPORTED, "operation graph: operation type %d not emulated", d->type);
        }
        if (in[0] == DUP || in[1] == DUP || in[2] == DUP || out == DUP)
            return fail(DUPLICATED, "operation graph: operation %lld: a unique id names two tensors", (long long)i);
        for (int k = 0; k < 3; k++) {
            if (in[k] >= 0 && prog->tensors[in[k]].virt && !written[in[k]])
                return fail(BAD_PARAM, "operation graph: operation %lld reads virtual tensor %lld before any "
                                       "operation writes it",
                            (long long)i, (long long)prog->tensors[in[k]].uid);
        }
        if (written[out] || prog->tensors[out].by_value)
            return fail(BAD_PARAM, "operation graph: tensor %lld written twice, or by value",
                        (long long)prog->tensors[out].uid);
        written[out] = true;
        prog->ops.push_back(op);
    }
    g->prog = prog;
    return 0;
}

/* ---- the interpreter ------------------------------------------------------ */

float load_dt(const void *base, int64_t off, int dt)
{
    switch (dt) {
    case KCDNN_DATA_FLOAT: return ((const float *)base)[off];
    case KCDNN_DATA_HALF: return emu_f16_to_f32(((const uint16_t *)base)[off]);
    case KCDNN_DATA_BFLOAT16: return emu_bf16_to_f32(((const uint16_t *)base)[off]);
    case KCDNN_DATA_INT32: return (float)((const int32_t *)base)[off];
    default: return (float)((const unsigned char *)base)[off];
    }
}

/* v as a value of type dt (2-byte types rounded, integers exact). */
float round_dt(float v, int dt)
{
    switch (dt) {
    case KCDNN_DATA_HALF: return emu_f16_to_f32(emu_f32_to_f16(v));
    case KCDNN_DATA_BFLOAT16: return emu_bf16_to_f32(emu_f32_to_bf16(v));
    case KCDNN_DATA_BOOLEAN: return v != 0.0f ? 1.0f : 0.0f;
    default: return v;
    }
}

void store_dt(void *base, int64_t off, int dt, float v)
{
    switch (dt) {
    case KCDNN_DATA_FLOAT: ((float *)base)[off] = v; break;
    case KCDNN_DATA_HALF: ((uint16_t *)base)[off] = emu_f32_to_f16(v); break;
    case KCDNN_DATA_BFLOAT16: ((uint16_t *)base)[off] = emu_f32_to_bf16(v); break;
    case KCDNN_DATA_INT32: ((int32_t *)base)[off] = (int32_t)v; break;
    default: ((unsigned char *)base)[off] = v != 0.0f; break;
    }
}

struct Run {
    const Program *p;
    std::vector<void *> ptr;            /* bound tensors' memory */
    std::vector<float> value;           /* by-value tensors' */
    std::vector<std::vector<float>> vt; /* virtual tensors, by logical index */

    /* the logical index's coordinates in tensor t */
    static void coords(const Tensor &t, int64_t i, int64_t *c)
    {
        for (int k = t.n - 1; k >= 0; k--) {
            c[k] = i % t.dims[k];
            i /= t.dims[k];
        }
    }
    /* tensor s's element at output coordinates c (dims of s divide) */
    float at(int s, const Tensor &out, const int64_t *c) const
    {
        const Tensor &t = p->tensors[s];
        if (t.by_value)
            return value[s];
        int64_t li = 0, off = 0;
        for (int k = 0; k < t.n; k++) {
            int64_t ck = t.dims[k] == out.dims[k] ? c[k] : c[k] / (out.dims[k] / t.dims[k]);
            li = li * t.dims[k] + ck;
            off += ck * t.strides[k];
        }
        return t.virt ? vt[s][li] : load_dt(ptr[s], off, t.dt);
    }
    void put(int s, int64_t li, const int64_t *c, float v)
    {
        const Tensor &t = p->tensors[s];
        if (t.virt) {
            vt[s][li] = round_dt(v, t.dt);
            return;
        }
        int64_t off = 0;
        for (int k = 0; k < t.n; k++)
            off += c[k] * t.strides[k];
        store_dt(ptr[s], off, t.dt, v);
    }

    void pointwise(const Op &op)
    {
        const Tensor &y = p->tensors[op.y];
        int64_t c[8];
        for (int64_t i = 0; i < y.elements(); i++) {
            coords(y, i, c);
            float x = op.mode == KCDNN_POINTWISE_GEN_INDEX ? (float)c[op.axis] : at(op.x, y, c);
            float b = op.b >= 0 ? at(op.b, y, c) : 0.0f, r = x;
            switch (op.mode) {
            case KCDNN_POINTWISE_ADD: r = x + b; break;
            case KCDNN_POINTWISE_MUL: r = x * b; break;
            case KCDNN_POINTWISE_DIV: r = x / b; break;
            case KCDNN_POINTWISE_SUB: r = x - b; break;
            case KCDNN_POINTWISE_EXP: r = expf(x); break;
            case KCDNN_POINTWISE_LOG: r = logf(x); break;
            case KCDNN_POINTWISE_CMP_GE: r = x >= b ? 1.0f : 0.0f; break;
            case KCDNN_POINTWISE_BINARY_SELECT: r = at(op.t, y, c) != 0.0f ? x : b; break;
            default: break; /* IDENTITY, GEN_INDEX */
            }
            put(op.y, i, c, r);
        }
    }

    void matmul(const Op &op)
    {
        const Tensor &C = p->tensors[op.y], &A = p->tensors[op.x];
        int n = C.n;
        int64_t K = A.dims[n - 1], c[8], ca[8], cb[8];
        Tensor ao = C, bo = C; /* the shapes A's and B's coordinates are given in */
        ao.dims[n - 1] = K;
        bo.dims[n - 2] = K;
        for (int64_t i = 0; i < C.elements(); i++) {
            coords(C, i, c);
            memcpy(ca, c, sizeof ca);
            memcpy(cb, c, sizeof cb);
            float s = 0.0f;
            for (int64_t k = 0; k < K; k++) {
                /* A at (batch, m, k), B at (batch, k, n), in C's batch */
                ca[n - 1] = k;
                cb[n - 2] = k;
                s += at(op.x, ao, ca) * at(op.b, bo, cb);
            }
            put(op.y, i, c, s);
        }
    }

    void reduction(const Op &op)
    {
        const Tensor &x = p->tensors[op.x], &y = p->tensors[op.y];
        std::vector<float> acc((size_t)y.elements(), op.mode == KCDNN_REDUCE_TENSOR_MAX ? -INFINITY : 0.0f);
        int64_t c[8];
        for (int64_t i = 0; i < x.elements(); i++) {
            coords(x, i, c);
            int64_t li = 0;
            for (int k = 0; k < y.n; k++)
                li = li * y.dims[k] + c[k] / (x.dims[k] / y.dims[k]);
            float v = at(op.x, x, c);
            acc[li] = op.mode == KCDNN_REDUCE_TENSOR_MAX ? (v > acc[li] ? v : acc[li]) : acc[li] + v;
        }
        for (int64_t i = 0; i < y.elements(); i++) {
            coords(y, i, c);
            put(op.y, i, c, acc[i]);
        }
    }

    /* y: x's elements read through y's dimensions and strides */
    int reshape(const Op &op)
    {
        const Tensor &x = p->tensors[op.x], &y = p->tensors[op.y];
        std::map<int64_t, int64_t> where; /* x's offset -> its logical index */
        int64_t c[8];
        if (x.virt)
            for (int64_t i = 0; i < x.elements(); i++) {
                coords(x, i, c);
                int64_t off = 0;
                for (int k = 0; k < x.n; k++)
                    off += c[k] * x.strides[k];
                if (!where.emplace(off, i).second)
                    return fail(KCDNN_STATUS_NOT_SUPPORTED, "reshape of tensor %lld: its strides overlap",
                                (long long)x.uid);
            }
        for (int64_t i = 0; i < y.elements(); i++) {
            coords(y, i, c);
            int64_t off = 0;
            for (int k = 0; k < y.n; k++)
                off += c[k] * y.strides[k];
            float v;
            if (x.virt) {
                auto it = where.find(off);
                if (it == where.end())
                    return fail(KCDNN_STATUS_NOT_SUPPORTED, "reshape of tensor %lld: offset %lld not in it",
                                (long long)x.uid, (long long)off);
                v = vt[op.x][it->second];
            } else {
                v = load_dt(ptr[op.x], off, x.dt);
            }
            put(op.y, i, c, v);
        }
        return 0;
    }

    void run()
    {
        vt.resize(p->tensors.size());
        for (size_t i = 0; i < p->tensors.size(); i++)
            if (p->tensors[i].virt)
                vt[i].assign((size_t)p->tensors[i].elements(), 0.0f);
        for (const Op &op : p->ops) {
            switch (op.type) {
            case KCDNN_OPERATION_POINTWISE_DESCRIPTOR: pointwise(op); break;
            case KCDNN_OPERATION_MATMUL_DESCRIPTOR: matmul(op); break;
            case KCDNN_OPERATION_REDUCTION_DESCRIPTOR: reduction(op); break;
            default:
                if (reshape(op) != 0) {
                    emu::diag("cudnnBackendExecute: %s", last_error);
                    emu::set_sticky(cudaErrorLaunchFailure);
                    return;
                }
            }
        }
    }
};

size_t dt_size(int dt)
{
    return dt == KCDNN_DATA_FLOAT || dt == KCDNN_DATA_INT32 ? 4 : dt == KCDNN_DATA_BOOLEAN ? 1 : 2;
}

/* The bytes from a tensor's first element to past its last. */
size_t extent(const Tensor &t)
{
    int64_t last = 0;
    for (int k = 0; k < t.n; k++)
        last += (t.dims[k] - 1) * t.strides[k];
    return (size_t)(last + 1) * dt_size(t.dt);
}

} /* namespace */

extern "C" {

size_t cudnnGetVersion(void)
{
    const char *v = getenv("EMU_CUDNN_VERSION");
    return v && *v ? (size_t)atol(v) : 91900;
}

const char *cudnnGetErrorString(kcdnn_status s)
{
    switch (s) {
    case 0: return "CUDNN_STATUS_SUCCESS";
    case BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case NOT_FINALIZED: return "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED";
    case ATTRIBUTE_TYPE: return "CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE";
    case DESCRIPTOR_TYPE: return "CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE";
    case DUPLICATED: return "CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES";
    case SHAPE: return "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH";
    case KCDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    case EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED";
    default: return "CUDNN_STATUS_(unknown)";
    }
}

void cudnnGetLastErrorString(char *message, size_t max_size)
{
    if (message && max_size > 0) {
        snprintf(message, max_size, "%s", last_error);
        last_error[0] = '\0';
    }
}

kcdnn_status cudnnCreate(kcdnn_handle *h)
{
    if (!h)
        return fail(BAD_PARAM, "cudnnCreate: NULL");
    Handle *x = new Handle;
    x->device = emu::current_device();
    *h = x;
    return 0;
}

kcdnn_status cudnnDestroy(kcdnn_handle h)
{
    Handle *x = (Handle *)h;
    if (!x || x->magic != MAGIC)
        return fail(BAD_PARAM, "cudnnDestroy: not a handle");
    x->magic = 0;
    delete x;
    return 0;
}

kcdnn_status cudnnSetStream(kcdnn_handle h, void *stream)
{
    Handle *x = (Handle *)h;
    if (!x || x->magic != MAGIC)
        return fail(BAD_PARAM, "cudnnSetStream: not a handle");
    if (!emu::stream_ok((cudaStream_t)stream) || emu::stream_device((cudaStream_t)stream) != x->device)
        return fail(BAD_PARAM, "cudnnSetStream: not a stream of the handle's device %d", x->device);
    x->stream = (cudaStream_t)stream;
    return 0;
}

kcdnn_status cudnnBackendCreateDescriptor(int type, kcdnn_desc *d)
{
    if (!d)
        return fail(BAD_PARAM, "cudnnBackendCreateDescriptor: NULL");
    Desc *x = new Desc;
    x->type = type;
    *d = x;
    return 0;
}

kcdnn_status cudnnBackendDestroyDescriptor(kcdnn_desc d)
{
    if (!alive(d))
        return fail(BAD_PARAM, "cudnnBackendDestroyDescriptor: not a descriptor");
    ((Desc *)d)->magic = 0;
    delete (Desc *)d;
    return 0;
}

kcdnn_status cudnnBackendSetAttribute(kcdnn_desc d, int name, int type, int64_t count, const void *values)
{
    Desc *x = (Desc *)d;
    if (!alive(x) || !values || count < 1)
        return fail(BAD_PARAM, "cudnnBackendSetAttribute(%d): no descriptor, values or count", name);
    if (x->finalized)
        return fail(BAD_PARAM, "cudnnBackendSetAttribute(%d): the descriptor is finalized", name);
    for (const Known &k : known)
        if (k.desc == x->type && k.name == name) {
            if (k.type != type)
                return fail(ATTRIBUTE_TYPE, "cudnnBackendSetAttribute(%d): type %d, documented %d", name, type,
                            k.type);
            if (count > k.most)
                return fail(BAD_PARAM, "cudnnBackendSetAttribute(%d): %lld values, at most %d", name,
                            (long long)count, k.most);
            Attr a;
            a.type = type;
            a.count = count;
            a.bytes.assign((const unsigned char *)values, (const unsigned char *)values + count * type_size(type));
            if (type == KCDNN_TYPE_BACKEND_DESCRIPTOR)
                for (int64_t i = 0; i < count; i++) {
                    void *p;
                    memcpy(&p, a.bytes.data() + 8 * i, 8);
                    if (!alive(p))
                        return fail(BAD_PARAM, "cudnnBackendSetAttribute(%d): value %lld is not a descriptor",
                                    name, (long long)i);
                }
            x->attrs[name] = a;
            return 0;
        }
    return fail(BAD_PARAM, "cudnnBackendSetAttribute: descriptor type %d has no attribute %d (emulated)", x->type,
                name);
}

kcdnn_status cudnnBackendFinalize(kcdnn_desc d)
{
    Desc *x = (Desc *)d;
    if (!alive(x))
        return fail(BAD_PARAM, "cudnnBackendFinalize: not a descriptor");
    if (x->finalized)
        return fail(BAD_PARAM, "cudnnBackendFinalize: finalized twice");
    int s = 0;
    switch (x->type) {
    case KCDNN_TENSOR_DESCRIPTOR: s = finalize_tensor(x); break;
    case KCDNN_OPERATIONGRAPH_DESCRIPTOR: s = finalize_graph(x); break;
    case KCDNN_ENGINEHEUR_DESCRIPTOR: {
        Desc *g = need(x, KCDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, KCDNN_OPERATIONGRAPH_DESCRIPTOR, "heuristic");
        if (!g)
            return last_status;
        if (!has(x, KCDNN_ATTR_ENGINEHEUR_MODE))
            return fail(BAD_PARAM, "heuristic: no mode");
        x->prog = refused(false) ? nullptr : g->prog;
        break;
    }
    case KCDNN_EXECUTION_PLAN_DESCRIPTOR: {
        if (!has(x, KCDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG))
            return fail(BAD_PARAM, "plan: no engine config");
        Desc *c = x->desc(KCDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG);
        if (!alive(c, KCDNN_ENGINECFG_DESCRIPTOR) || !c->prog)
            return fail(BAD_PARAM, "plan: the engine config is not one of a heuristic's results");
        if (refused(true))
            return fail(KCDNN_STATUS_NOT_SUPPORTED, "EMU_CUDNN_REFUSE=plan: the engine has no kernel for the graph");
        x->prog = c->prog;
        x->workspace = 1 << 20;
        break;
    }
    case KCDNN_VARIANT_PACK_DESCRIPTOR:
        if (!has(x, KCDNN_ATTR_VARIANT_PACK_UNIQUE_IDS) || !has(x, KCDNN_ATTR_VARIANT_PACK_DATA_POINTERS) ||
            !has(x, KCDNN_ATTR_VARIANT_PACK_WORKSPACE))
            return fail(BAD_PARAM, "variant pack: ids, pointers or workspace not set");
        if (x->get(KCDNN_ATTR_VARIANT_PACK_UNIQUE_IDS)->count != x->get(KCDNN_ATTR_VARIANT_PACK_DATA_POINTERS)->count)
            return fail(BAD_PARAM, "variant pack: as many ids as pointers");
        break;
    case KCDNN_ENGINECFG_DESCRIPTOR:
        return fail(BAD_PARAM, "engine config: made by the heuristic (emulated)");
    default: s = finalize_op(x); break;
    }
    if (s == 0)
        x->finalized = true;
    return s;
}

kcdnn_status cudnnBackendGetAttribute(kcdnn_desc d, int name, int type, int64_t requested, int64_t *count,
                                      void *values)
{
    Desc *x = (Desc *)d;
    if (!alive(x) || !x->finalized || !count)
        return fail(BAD_PARAM, "cudnnBackendGetAttribute(%d): not a finalized descriptor, or no count", name);
    if (x->type == KCDNN_ENGINEHEUR_DESCRIPTOR && name == KCDNN_ATTR_ENGINEHEUR_RESULTS) {
        if (type != KCDNN_TYPE_BACKEND_DESCRIPTOR)
            return fail(ATTRIBUTE_TYPE, "heuristic results: type %d", type);
        *count = x->prog ? 1 : 0;
        if (requested >= 1 && x->prog) {
            Desc *c = nullptr;
            memcpy(&c, values, 8);
            if (!alive(c, KCDNN_ENGINECFG_DESCRIPTOR))
                return fail(BAD_PARAM, "heuristic results: not an engine config descriptor");
            c->prog = x->prog;
            c->finalized = true;
        }
        return 0;
    }
    if (x->type == KCDNN_EXECUTION_PLAN_DESCRIPTOR && name == KCDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE) {
        if (type != KCDNN_TYPE_INT64 || requested < 1 || !values)
            return fail(ATTRIBUTE_TYPE, "plan workspace: type %d, %lld values", type, (long long)requested);
        memcpy(values, &x->workspace, 8);
        *count = 1;
        return 0;
    }
    return fail(KCDNN_STATUS_NOT_SUPPORTED, "cudnnBackendGetAttribute(%d) of type %d: not emulated", name, x->type);
}

kcdnn_status cudnnBackendExecute(kcdnn_handle h, kcdnn_desc plan, kcdnn_desc pack)
{
    Handle *hd = (Handle *)h;
    Desc *pl = (Desc *)plan, *pk = (Desc *)pack;
    if (!hd || hd->magic != MAGIC)
        return fail(BAD_PARAM, "cudnnBackendExecute: not a handle");
    if (!alive(pl, KCDNN_EXECUTION_PLAN_DESCRIPTOR) || !pl->finalized || !alive(pk, KCDNN_VARIANT_PACK_DESCRIPTOR) ||
        !pk->finalized)
        return fail(BAD_PARAM, "cudnnBackendExecute: not a finalized plan and variant pack");
    if (emu::sticky_error(hd->device) != cudaSuccess)
        return fail(EXECUTION_FAILED, "cudnnBackendExecute: the device has faulted");
    if (getenv("EMU_CUDNN_FAIL_EXECUTE"))
        return fail(EXECUTION_FAILED, "cudnnBackendExecute: EMU_CUDNN_FAIL_EXECUTE");
    auto r = std::make_shared<Run>();
    r->p = pl->prog.get();
    std::shared_ptr<Program> keep = pl->prog;
    size_t nt = r->p->tensors.size();
    r->ptr.assign(nt, nullptr);
    r->value.assign(nt, 0.0f);
    const Attr *ids = pk->get(KCDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
    std::vector<bool> bound(nt, false);
    for (int64_t i = 0; i < ids->count; i++) {
        int64_t uid = pk->i64(KCDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, i);
        void *p = nullptr;
        memcpy(&p, pk->get(KCDNN_ATTR_VARIANT_PACK_DATA_POINTERS)->bytes.data() + 8 * i, 8);
        size_t j = 0;
        while (j < nt && r->p->tensors[j].uid != uid)
            j++;
        if (j == nt || r->p->tensors[j].virt)
            return fail(BAD_PARAM, "cudnnBackendExecute: id %lld is no bound tensor of the graph", (long long)uid);
        if (bound[j])
            return fail(DUPLICATED, "cudnnBackendExecute: id %lld bound twice", (long long)uid);
        bound[j] = true;
        const Tensor &t = r->p->tensors[j];
        if (!p)
            return fail(BAD_PARAM, "cudnnBackendExecute: tensor %lld's pointer is NULL", (long long)uid);
        if (t.by_value) {
            if (emu::device_of(p, 1) >= 0)
                return fail(BAD_PARAM, "cudnnBackendExecute: by-value tensor %lld points to device memory",
                            (long long)uid);
            r->value[j] = load_dt(p, 0, t.dt); /* read now, as the library copies it */
        } else {
            if (emu::device_of(p, extent(t)) != hd->device) {
                emu::diag("cudnnBackendExecute: tensor %lld (%p, %zu bytes) is not in device %d's memory: the "
                          "kernel faults",
                          (long long)uid, p, extent(t), hd->device);
                emu::set_sticky(cudaErrorIllegalAddress, hd->device);
                return 0;
            }
            r->ptr[j] = p;
        }
    }
    for (size_t j = 0; j < nt; j++)
        if (!r->p->tensors[j].virt && !bound[j])
            return fail(BAD_PARAM, "cudnnBackendExecute: tensor %lld not in the variant pack",
                        (long long)r->p->tensors[j].uid);
    void *ws = nullptr;
    memcpy(&ws, pk->get(KCDNN_ATTR_VARIANT_PACK_WORKSPACE)->bytes.data(), 8);
    if (pl->workspace > 0 && emu::device_of(ws, (size_t)pl->workspace) != hd->device) {
        emu::diag("cudnnBackendExecute: the workspace (%p) is not %lld bytes of device %d's memory", ws,
                  (long long)pl->workspace, hd->device);
        emu::set_sticky(cudaErrorIllegalAddress, hd->device);
        return 0;
    }
    cudaStream_t s = hd->stream;
    if (!emu::stream_ok(s) || emu::stream_device(s) != hd->device)
        return fail(BAD_PARAM, "cudnnBackendExecute: the handle's stream is not its device's");
    emu::stream_run(s, [r, keep] { r->run(); });
    return 0;
}

} /* extern "C" */
