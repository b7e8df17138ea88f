/* check_graph.c — recording the dataflow graph while the checker runs.
 *
 * The checker calls these after an op or operator has produced a valid
 * tensor; each appends a node to c->graph (when recording) and stores its
 * id in the result value, so later uses can name it as an input.
 */
#include <string.h> /* strcmp, memcpy */

#include "check.h"

static int node_of(const value *v) { return v->kind == V_TENSOR && v->node > 0 ? v->node - 1 : -1; }

static void shape_into(g_node *n, const value *v) {
    n->rank = v->rank;
    n->is_int = v->is_int;
    if (v->rank > 0) memcpy(n->dims, v->dims, (size_t)v->rank * sizeof v->dims[0]);
}

/* No tensor may have more than 2^50 elements (a petabyte of bf16): beyond
 * any device, and it keeps every size the compiler computes within 64 bits. */
enum { GRAPH_MAX_ELEMS_LOG2 = 50 };

void graph_note_tensor(checker *c, value *v, g_node *n) {
    if (v->kind != V_TENSOR) return;
    int64_t e = 1;
    for (int i = 0; i < v->rank; i++)
        if (__builtin_mul_overflow(e, v->dims[i], &e) || e > ((int64_t)1 << GRAPH_MAX_ELEMS_LOG2)) {
            check_error(c, v->where, "this tensor, %s, has more than 2^%d elements", shape_str(c, v),
                        GRAPH_MAX_ELEMS_LOG2);
            *v = value_err();
            return;
        }
    if (!c->graph) return;
    shape_into(n, v);
    if (!n->where.end && !n->where.start) n->where = v->where;
    int id = graph_add(c->graph, n);
    if (id >= 0) v->node = id + 1;
}

/* Appends an op node whose inputs are the given tensors (non-tensor
 * arguments are skipped); returns the node, or NULL if an input was not
 * recorded (then nothing is appended). */
static g_node *op_node(g_node *n, g_op op, loc where, const value *const *ins, int n_ins) {
    memset(n, 0, sizeof *n);
    n->op = op;
    n->where = where;
    for (int i = 0; i < n_ins && n->n_in < GRAPH_MAX_IN; i++) {
        if (ins[i]->kind != V_TENSOR) continue;
        int id = node_of(ins[i]);
        if (id < 0) return NULL;
        n->in[n->n_in++] = id;
    }
    return n;
}

static const value *named_arg(const value *const *named, const char *const *names, int n, const char *key) {
    for (int i = 0; i < n; i++)
        if (named[i] && strcmp(names[i], key) == 0) return named[i];
    return NULL;
}

static double num(const value *v, double dflt) {
    if (!v) return dflt;
    return v->kind == V_INT ? (double)v->i : v->kind == V_FLOAT ? v->f : dflt;
}

void graph_note_op(checker *c, const ast_node *call, value *result, const value *args, int n_args,
                   const value *const *named, const char *const *names, int n_named) {
    if (!c->graph || result->kind != V_TENSOR) return;
    static const struct { const char *name; g_op op; } map[] = {
        {"embed", G_EMBED}, {"arange", G_ARANGE}, {"matmul", G_MATMUL}, {"transpose", G_TRANSPOSE},
        {"linear", G_MATMUL}, {"layernorm", G_LAYERNORM}, {"rmsnorm", G_RMSNORM}, {"rope", G_ROPE},
        {"attention", G_ATTENTION}, {"gelu", G_GELU}, {"silu", G_SILU}, {"swiglu", G_SWIGLU},
        {"moe", G_MOE}, {"cross_entropy", G_CROSS_ENTROPY},
    };
    g_op op = G_OP_COUNT;
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(map[i].name, call->name) == 0) op = map[i].op;
    if (op == G_OP_COUNT) return;
    const value *ins[GRAPH_MAX_IN];
    int n_ins = n_args < GRAPH_MAX_IN ? n_args : GRAPH_MAX_IN;
    for (int i = 0; i < n_ins; i++) ins[i] = &args[i];
    int linear_bias = op == G_MATMUL && strcmp(call->name, "linear") == 0 && n_args == 3;
    g_node n;
    if (!op_node(&n, op, call->loc, ins, linear_bias ? 2 : n_ins)) return;
    const value *h = named_arg(named, names, n_named, "heads");
    n.heads = h ? h->i : 0;
    const value *kv = named_arg(named, names, n_named, "kv_heads");
    n.kv_heads = kv ? kv->i : n.heads;
    const value *causal = named_arg(named, names, n_named, "causal");
    n.causal = causal ? (int)causal->i : 1;
    n.eps = num(named_arg(named, names, n_named, "eps"), op == G_RMSNORM ? 1e-6 : 1e-5);
    n.theta = num(named_arg(named, names, n_named, "theta"), 10000.0);
    const value *k = named_arg(named, names, n_named, "top_k");
    n.top_k = k ? k->i : 2;
    n.capacity = num(named_arg(named, names, n_named, "capacity"), 1.25);
    n.aux_loss = num(named_arg(named, names, n_named, "aux_loss"), 0.01);
    const value *act = named_arg(named, names, n_named, "act");
    n.act_gelu = act && strcmp(act->s, "gelu") == 0;
    const value *vocab = named_arg(named, names, n_named, "vocab");
    n.vocab = vocab ? vocab->i : 0;
    n.arange_ids = op == G_EMBED && args[0].kind == V_TENSOR && args[0].i > 0;
    if (linear_bias) {
        /* linear(x, w, b) is matmul then bias_add, so a row-parallel
         * product can be reduced before its bias is added */
        value mm = *result;
        graph_note_tensor(c, &mm, &n);
        const value *bias_ins[2] = {&mm, &args[2]};
        if (!op_node(&n, G_BIAS_ADD, call->loc, bias_ins, 2)) return;
    }
    graph_note_tensor(c, result, &n);
}

void graph_note_binary(checker *c, int op, value *result, const value *a, const value *b) {
    if (!c->graph || result->kind != V_TENSOR) return;
    const value *ins[2] = {a, b};
    g_op g = op == '@' ? G_MATMUL : op == '+' ? G_ADD : op == '-' ? G_SUB : G_MUL;
    int scalar = a->kind != V_TENSOR || b->kind != V_TENSOR;
    g_node n;
    if (scalar) g = G_SCALE;
    if (!op_node(&n, g, result->where, ins, 2)) return;
    if (scalar) {
        const value *k = a->kind == V_TENSOR ? b : a;
        double x = k->kind == V_INT ? (double)k->i : k->f;
        n.scale = op == '/' ? 1.0 / x : x;
    }
    graph_note_tensor(c, result, &n);
}
