/* exec_mem.c — where a tensor lives in the arena (exec_impl.h): the value,
 * gradient and statistics of any tensor at any iteration, on this rank's
 * stage, chunk and slot. */
#include "exec_impl.h"

#include <stdint.h> /* uint16_t, uint32_t */
#include <stdio.h>  /* snprintf */
#include <stdlib.h> /* malloc, free */
#include <string.h> /* memcpy */

int64_t exec__last_dim(const plan_tensor *t) { return t->rank ? t->dims[t->rank - 1] : 1; }

static int dev_failed(mesh__exec *ex, const char *what, mesh_status st)
{
    if (st == MESH_OK) return 0;
    if (!ex->dev_failed)
        snprintf(ex->error, sizeof ex->error, "rank %d: %s: %.700s", ex->rank, what, dev_last_error(ex->dev));
    ex->dev_failed = 1;
    return -1;
}

/* The kernels' stream (kern_cuda.c's own; NULL on the CPU): copies and
 * fills go on it, in order with the kernels. */
#define S(ex) ((dev_stream *)(ex)->kern.stream)

int exec__fill(mesh__exec *ex, void *p, int byte, size_t bytes)
{
    return dev_failed(ex, "clearing device memory", dev_memset(ex->dev, p, byte, bytes, S(ex)));
}

int exec__to_dev(mesh__exec *ex, void *dst, const void *src, size_t bytes)
{
    return dev_failed(ex, "a copy to the device", dev_copy(ex->dev, dst, src, bytes, DEV_HOST_TO_DEVICE, S(ex)));
}

int exec__dcopy(mesh__exec *ex, void *dst, const void *src, size_t bytes)
{
    return dev_failed(ex, "a copy on the device", dev_copy(ex->dev, dst, src, bytes, DEV_DEVICE_TO_DEVICE, S(ex)));
}

int exec__dmove(mesh__exec *ex, void *dst, const void *src, size_t bytes)
{
    unsigned char *d = dst;
    const unsigned char *s = src;
    if (d == s) return 0;
    size_t step = d < s && (size_t)(s - d) < bytes ? (size_t)(s - d) : bytes; /* copies that do not overlap */
    for (size_t k = 0; step > 0 && k < bytes; k += step)
        if (exec__dcopy(ex, d + k, s + k, bytes - k < step ? bytes - k : step) != 0) return -1;
    return 0;
}

int exec__to_host(mesh__exec *ex, void *dst, const void *src, size_t bytes)
{
    if (dev_failed(ex, "a copy from the device", dev_copy(ex->dev, dst, src, bytes, DEV_DEVICE_TO_HOST, S(ex))))
        return -1;
    return ex->gpu ? dev_failed(ex, "waiting for the device", dev_stream_sync(ex->dev, S(ex))) : 0;
}

/* bf16 staging: on the stack for the per-step scalars (the loss, its
 * seed), else a buffer for the call (init, checkpoints, logits). */
enum { STAGE_ON_STACK = 64 };

int exec__floats_to_dev(mesh__exec *ex, void *dst, const float *src, size_t n)
{
    if (ex->esize == 4) return exec__to_dev(ex, dst, src, n * sizeof *src);
    uint16_t stack[STAGE_ON_STACK] = {0}, *h = n <= STAGE_ON_STACK ? stack : malloc(n * sizeof *h);
    if (!h) return dev_failed(ex, "a copy to the device", MESH_ERR_NOMEM);
    kcpu_pack16(h, src, n, ex->prec);
    int rc = exec__to_dev(ex, dst, h, n * sizeof *h);
    if (h != stack) free(h);
    return rc;
}

int exec__floats_to_host(mesh__exec *ex, float *dst, const void *src, size_t n)
{
    if (ex->esize == 4) return exec__to_host(ex, dst, src, n * sizeof *dst);
    uint16_t stack[STAGE_ON_STACK] = {0}, *h = n <= STAGE_ON_STACK ? stack : malloc(n * sizeof *h);
    if (!h) return dev_failed(ex, "a copy from the device", MESH_ERR_NOMEM);
    int rc = exec__to_host(ex, h, src, n * sizeof *h);
    if (rc == 0) kcpu_unpack16(dst, h, n, ex->prec);
    if (h != stack) free(h);
    return rc;
}

float *exec__at(const mesh__exec *ex, float *p, size_t k)
{
    return (float *)(void *)((unsigned char *)p + k * (size_t)ex->esize);
}

int exec__kern_done(mesh__exec *ex, int rc)
{
    dev_guard(ex->dev, 0);
    return rc;
}

int exec__kern_failed(mesh__exec *ex, const char *what)
{
    if (!ex->dev_failed) snprintf(ex->error, sizeof ex->error, "rank %d: %s: %.700s", ex->rank, what, ex->kern.error);
    ex->dev_failed = 1;
    return -1;
}

void exec__round(const mesh__exec *ex, float *x, size_t n)
{
    /* (2-byte storage, a GPU's, is bf16 itself: nothing to emulate) */
    if (ex->prec == KCPU_FP32 || !x || ex->esize == 2) return;
    dev_guard(ex->dev, 1); /* a CPU kernel of its own */
    kcpu_round(x, n, ex->prec);
    dev_guard(ex->dev, 0);
}

int exec__gstage_begin(mesh__exec *ex, int c, int it)
{
    const plan_tensor *t = &ex->p->tensors[c];
    int64_t at = ex->gstage_at;
    exec__gstage_drop(ex);
    if (ex->prec == KCPU_FP32) return 0;
    /* the params whose fp32 gradients the kernel adds to itself (kern.dw32:
     * a matmul's weight, an embedding's table, a norm's weight and bias, a
     * bias: memplan_grad_fp32) are not staged */
    ex->kern.dw32 = memplan_grad_fused(ex->p, c);
    for (int k = 0; k < t->n_in; k++) {
        if (!memplan_grad_staged(ex->p, c, k)) continue;
        int in = memplan_grad_param(ex->p, c, k);
        size_t n = ex->numel[in];
        if (exec__fill(ex, ex->arena + at, 0, n * (size_t)ex->esize) != 0) return exec__gstage_drop(ex), -1;
        ex->gst_id[ex->gst_n] = in;
        ex->gst_buf[ex->gst_n++] = (float *)(void *)(ex->arena + at);
        at += memplan_round(&ex->mp, (int64_t)n * ex->esize);
    }
    ex->gst_it = it;
    return 0;
}

void exec__gstage_drop(mesh__exec *ex)
{
    ex->gst_n = 0;
    ex->kern.dw32 = 0;
}

int exec__gstage_staged(const mesh__exec *ex, int id)
{
    for (int k = 0; k < ex->gst_n; k++)
        if (ex->gst_id[k] == id) return 1;
    return 0;
}

int exec__gstage_end(mesh__exec *ex)
{
    int n = ex->gst_n;
    exec__gstage_drop(ex); /* (exec__gptr gives the fp32 gradients again) */
    for (int k = 0; k < n; k++) {
        float *g = exec__gptr(ex, ex->gst_id[k], ex->gst_it);
        if (EXEC_KERN(ex, accumulate, g, ex->gst_buf[k], ex->numel[ex->gst_id[k]], 0) != 0)
            return exec__kern_failed(ex, "adding an op's contribution to its params' fp32 gradients");
    }
    return 0;
}

float *exec__master(const mesh__exec *ex, int id, int it)
{
    if (ex->prec == KCPU_FP32) return NULL;
    float *m0 = (float *)(void *)(ex->arena + ex->optim_at);
    return m0 + 2 * ex->opt_elems + ex->opt_at[id] + (size_t)exec__param_copy(ex, id, it) * ex->shard[id];
}

const mem_buf *exec__buf_of(const mesh__exec *ex, int id) { return memplan_buf(&ex->mp, ex->stage, id); }

int exec__in_stack(const mesh__exec *ex, int id)
{
    return ex->stack >= 0 && ex->p->tensors[id].region == ex->stack;
}

/* The first layer of chunk c. */
static int chunk_start(const mesh__exec *ex, int c)
{
    int f = 0;
    for (int k = 0; k < c; k++) f += (int)ex->p->chunk_layers[k];
    return f;
}

/* The copy of a param at iteration it: a layer-stack param's copies are
 * the layers of the stage's chunks, in chunk order. */
int64_t exec__param_copy(const mesh__exec *ex, int id, int it)
{
    if (!exec__in_stack(ex, id)) return it > 0 ? it : 0;
    int64_t base = 0;
    for (int c = ex->stage; c < ex->chunks; c += ex->p->pp) {
        int f = chunk_start(ex, c), n = (int)ex->p->chunk_layers[c];
        if (it >= f && it < f + n) return base + it - f;
        base += n;
    }
    return 0;
}

/* The iteration of a param's copy k (exec__param_copy's inverse). */
int exec__copy_it(const mesh__exec *ex, int id, int k)
{
    if (!exec__in_stack(ex, id)) return k;
    for (int c = ex->stage; c < ex->chunks; c += ex->p->pp) {
        if (k < (int)ex->p->chunk_layers[c]) return chunk_start(ex, c) + k;
        k -= (int)ex->p->chunk_layers[c];
    }
    return 0;
}

/* The copy of an activation at iteration it in the unit being run: a
 * layer-stack tensor's iterations start at the chunk's first layer. */
static int64_t local_it(const mesh__exec *ex, int id, int it)
{
    if (exec__in_stack(ex, id)) it -= ex->first_layer;
    return it > 0 ? it : 0;
}

/* Is tensor id a value carried into the layer stack? */
static int carried_entry(const mesh__exec *ex, int id, int *which)
{
    if (ex->stack < 0) return 0;
    const plan_region *g = &ex->p->regions[ex->stack];
    for (int c = 0; c < g->n_carry; c++)
        if (g->carry[c].entry == id) {
            if (which) *which = c;
            return 1;
        }
    return 0;
}

/* Where a later pipeline chunk receives carried value c: the start of its slot. */
int64_t exec__recv_at(const mesh__exec *ex, int c)
{
    int64_t at = ex->slots_at + ex->slot * ex->ms->slot_bytes;
    const plan_region *g = &ex->p->regions[ex->stack];
    for (int k = 0; k < c; k++) at += memplan_buf(&ex->mp, ex->stage, g->carry[k].exit)->bytes;
    return at;
}

int exec__staged(const mesh__exec *ex, int id)
{
    return ex->p->setup.zero >= 2 && ex->p->tensors[id].op == G_PARAM && exec__buf_of(ex, id)->zoffset >= 0;
}

/* Where copy it of a staged param is: its gradient (grad = 1) or with
 * zero 3 its value gathered whole. The staging area holds the gradients
 * (the params outside the stack, two layers; fp32, so 4 / esize times the
 * values' layout), then the values (outside the stack, two layers): a
 * layer's iterations alternate in both. */
static float *staged(const mesh__exec *ex, int id, int it, int grad)
{
    const mem_buf *b = exec__buf_of(ex, id);
    const mem_stage *ms = ex->ms;
    int64_t r = grad ? 4 / ex->esize : 1; /* the gradients are fp32: their blocks are r times the values' */
    int64_t at = grad ? 0 : (4 / ex->esize) * (ms->zfixed + 2 * ms->zlayer); /* (the values after the gradients) */
    at += r * b->zoffset;
    if (exec__in_stack(ex, id)) at += r * (ms->zfixed + (int64_t)(it % 2) * ms->zlayer);
    else at += r * exec__param_copy(ex, id, it) * b->bytes;
    return (float *)(void *)(ex->arena + ex->gathered_at + at);
}

/* With zero >= 2 (gradients, fp32) or zero 3 (values), a param's shard of
 * each copy in the sharded layout of its region (at region_at): the
 * optimizer state's layout (exec__optimizer_shards). */
static float *sharded(const mesh__exec *ex, int id, int it, int64_t region_at, int grad)
{
    size_t at = ex->opt_at[id] + (size_t)exec__param_copy(ex, id, it) * ex->shard[id];
    float *base = (float *)(void *)(ex->arena + region_at);
    return grad ? base + at : exec__at(ex, base, at);
}

float *exec__pshard(const mesh__exec *ex, int id, int it)
{
    size_t lo, len;
    float *m, *v;
    if (ex->p->setup.zero == 3) return sharded(ex, id, it, 0, 0);
    exec__shard_of(ex, id, it, &lo, &len, &m, &v);
    return exec__at(ex, exec__vptr(ex, id, it), lo);
}

float *exec__gshard(const mesh__exec *ex, int id, int it)
{
    size_t lo, len;
    float *m, *v;
    if (ex->p->setup.zero >= 2) return sharded(ex, id, it, ex->grads_at, 1);
    exec__shard_of(ex, id, it, &lo, &len, &m, &v);
    return exec__gptr(ex, id, it) + lo; /* (fp32) */
}

/* Value of tensor id at its iteration it (-1, a carried entry: 0). */
float *exec__vptr(const mesh__exec *ex, int id, int it)
{
    const mem_buf *b = exec__buf_of(ex, id);
    int64_t at;
    int c;
    if (ex->chunk > 0 && carried_entry(ex, id, &c)) /* received from the chunk before */
        return (float *)(void *)(ex->arena + exec__recv_at(ex, c));
    if (b->region == MEM_PERSISTENT && ex->p->setup.zero == 3) /* a param: gathered, or its own shard */
        return exec__staged(ex, id) ? staged(ex, id, it, 0) : sharded(ex, id, it, 0, 0);
    switch (b->region) {
    case MEM_PERSISTENT: at = 0; break;
    case MEM_SLOT: at = ex->slots_at + ex->slot * ex->ms->slot_bytes + ex->part_at[b->part]; break;
    case MEM_WORKSPACE: at = ex->shared_at; break;
    case MEM_RECOMPUTE: at = ex->recompute_at; break;
    default: return NULL;
    }
    int64_t copy = b->region == MEM_PERSISTENT ? exec__param_copy(ex, id, it) : local_it(ex, id, it);
    return (float *)(void *)(ex->arena + at + b->offset + copy * b->stride);
}

/* Gradient of tensor id at its iteration it. A carried value's gradient
 * alternates between its pair of buffers: the exit of iteration it uses
 * it % 2, the entry (the exit of the iteration before the stage's first)
 * the other. */
float *exec__gptr(const mesh__exec *ex, int id, int it)
{
    const mem_buf *b = exec__buf_of(ex, id);
    if (b->grad_in_value) return exec__vptr(ex, id, it); /* the loss's logits': over them */
    if (b->grad_alias >= 0) b = exec__buf_of(ex, id = b->grad_alias); /* a matmul's: its bias add's (same region) */
    int64_t at;
    for (int k = 0; k < ex->gst_n; k++) /* an op's backward in hand: its contribution, staged */
        if (ex->gst_id[k] == id) return ex->gst_buf[k];
    if (b->grad_region == MEM_PERSISTENT && ex->p->setup.zero >= 2) /* a param's: staged, or its own shard */
        return exec__staged(ex, id) ? staged(ex, id, it, 1) : sharded(ex, id, it, ex->grads_at, 1);
    switch (b->grad_region) {
    case MEM_PERSISTENT: at = ex->grads_at; break;
    case MEM_WORKSPACE: at = ex->shared_at; break;
    case MEM_PINNED: at = ex->pinned_at; break;
    default: return NULL;
    }
    if (b->carried && b->grad_region == MEM_PINNED) {
        if (ex->p->tensors[id].region < 0) it = ex->first_layer - 1; /* an entry: "the iteration before" */
        at += (int64_t)(((it % 2) + 2) % 2) * b->grad_stride; /* the pair's slots */
    } else {
        at += (b->grad_region == MEM_PERSISTENT ? exec__param_copy(ex, id, it) : local_it(ex, id, it)) * b->grad_stride;
    }
    return (float *)(void *)(ex->arena + at + b->grad_offset);
}

/* The saved statistics after tensor id's value. */
float *exec__aux_ptr(const mesh__exec *ex, int id, int it)
{
    return (float *)(void *)((unsigned char *)exec__vptr(ex, id, it) + exec__buf_of(ex, id)->bytes);
}

/* Which copy of tensor id a consumer in region r at iteration it reads:
 * inside the same region, that iteration's; a carried entry, the previous
 * iteration's exit (the entry itself, iteration -1, at iteration 0); a
 * region's tensor seen from outside, its last iteration's. */
static int resolve(const mesh__exec *ex, int id, int r, int it, int *copy)
{
    const plan *p = ex->p;
    int tr = p->tensors[id].region;
    *copy = 0;
    if (tr >= 0 && tr == r) {
        *copy = it;
        return id;
    }
    if (tr < 0) {
        for (int q = 0; q < p->n_regions; q++)
            for (int c = 0; c < p->regions[q].n_carry; c++) {
                if (p->regions[q].carry[c].entry != id) continue;
                if (q == r && it > ex->first_layer) {
                    *copy = it - 1;
                    return p->regions[q].carry[c].exit;
                }
                *copy = -1;
            }
        return id;
    }
    *copy = ex->iters[id] - 1;
    return id;
}

float *exec__val_in(const mesh__exec *ex, int id, int r, int it)
{
    int copy, t = resolve(ex, id, r, it, &copy);
    return exec__vptr(ex, t, copy);
}

float *exec__grad_in(const mesh__exec *ex, int id, int r, int it)
{
    int copy, t = resolve(ex, id, r, it, &copy);
    return exec__gptr(ex, t, copy);
}

/* Is tensor id split over tp (and along which dim, if so)? */
int exec__split_tp(const mesh__exec *ex, int id)
{
    return ex->p->setup.tp > 1 && ex->p->tensors[id].pl.kind[1] == PL_SPLIT;
}

/* Is param id split over ep (an expert's weights, along its first dim)? */
int exec__split_ep(const mesh__exec *ex, int id)
{
    const plan_tensor *t = &ex->p->tensors[id];
    return ex->p->setup.ep > 1 && t->op == G_PARAM && t->pl.kind[3] == PL_SPLIT;
}

/* The group param id's optimizer state is sharded over with ZeRO: its
 * data-parallel group (dp x ep for a dense param, dp for an expert's);
 * NULL without ZeRO or for a group of one. */
comm *exec__zcomm(const mesh__exec *ex, int id)
{
    if (!ex->zero) return NULL;
    return exec__split_ep(ex, id) ? ex->axis[0] : ex->data;
}

/* The last of tensor id's dims on this rank. */
int exec__lastd(const mesh__exec *ex, int id)
{
    const plan_tensor *t = &ex->p->tensors[id];
    return t->rank ? (int)ex->ld[id][t->rank - 1] : 1;
}

/* Switches to chunk c of the stage: its layers, and its slot's parts
 * (chunk 0 starts with the part before the stack, a later one with what
 * it receives; the last ends with the part after). */
void exec__set_chunk(mesh__exec *ex, int c)
{
    ex->chunk = c;
    ex->first_layer = chunk_start(ex, c);
    ex->n_layers = ex->stack >= 0 ? (int)ex->p->chunk_layers[c] : 0;
    ex->part_at[MEM_PART_PRE] = 0;
    ex->part_at[MEM_PART_LAYER] = c == 0 ? ex->mp.part_bytes[MEM_PART_PRE] : ex->mp.recv_bytes;
    ex->part_at[MEM_PART_POST] = ex->part_at[MEM_PART_LAYER] + (int64_t)ex->n_layers * ex->mp.part_bytes[MEM_PART_LAYER];
}
