/* exec_loss.c — the loss's terms, kept on the device until the step reads
 * them (exec_impl.h).
 *
 * A micro-batch's loss is the sum of its terms: the cross-entropy's mean
 * and each moe layer's load-balancing loss times its coefficient. Their
 * kernels write them into a small device array (exec__loss_term) instead
 * of handing them to the host one by one, which on a GPU made the host
 * wait for the device after every micro-batch and every moe layer; the
 * host reads the array once, when the step (or an evaluation) takes its
 * loss, and adds the terms up in the order they were made, in double, as
 * it did when they came back one by one: the same bits.
 */
#include "exec_impl.h"

#include <stdio.h>  /* snprintf */
#include <string.h> /* memset */

int exec__loss_open(mesh__exec *ex)
{
    void *p = NULL;
    size_t bytes = (size_t)(EX_LOSS_SLOTS + 1) * sizeof(float); /* the last: where an unused term goes */
    if (ex->host_arena) {
        p = exec__host_calloc(ex, EX_LOSS_SLOTS + 1, sizeof(float));
    } else if (dev_alloc(ex->dev, &p, bytes) != MESH_OK) { /* the device says how full it is */
        snprintf(ex->error, sizeof ex->error, "rank %d: %s", ex->rank, dev_last_error(ex->dev));
        ex->lslots = NULL;
        return -2;
    }
    ex->lslots = p;
    return p ? 0 : -1;
}

void exec__loss_close(mesh__exec *ex)
{
    if (!ex->lslots) return;
    if (ex->host_arena) exec__host_free(ex, ex->lslots, (size_t)(EX_LOSS_SLOTS + 1) * sizeof(float));
    else dev_free(ex->dev, ex->lslots);
    ex->lslots = NULL;
}

void exec__loss_begin(mesh__exec *ex, double start)
{
    ex->lacc = start;
    ex->lcur = 0;
    ex->n_lslots = ex->n_lterms = 0;
}

float *exec__loss_dump(mesh__exec *ex) { return ex->lslots + EX_LOSS_SLOTS; }

/* Adds the terms recorded so far (the device's values read once) into
 * lcur and, at each micro-batch's end, lcur into lacc. */
static int flush(mesh__exec *ex)
{
    float v[EX_LOSS_SLOTS];
    if (ex->n_lslots > 0 && exec__to_host(ex, v, ex->lslots, (size_t)ex->n_lslots * sizeof *v) != 0) return -1;
    for (int i = 0; i < ex->n_lterms; i++) {
        const ex_lterm *t = &ex->lterms[i];
        if (t->slot == EX_LOSS_END) {
            ex->lacc += ex->lcur;
            ex->lcur = 0;
        } else {
            ex->lcur += t->slot >= 0 ? t->coef * (double)v[t->slot] : t->coef;
        }
    }
    ex->n_lslots = ex->n_lterms = 0;
    return 0;
}

/* Room for one more term (and a slot if `slot`): the recorded ones
 * flushed when full. */
static int room(mesh__exec *ex, int slot)
{
    if (ex->n_lterms < EX_LOSS_TERMS && (!slot || ex->n_lslots < EX_LOSS_SLOTS)) return 0;
    return flush(ex);
}

float *exec__loss_term(mesh__exec *ex, double coef)
{
    if (room(ex, 1) != 0) return NULL;
    ex->lterms[ex->n_lterms++] = (ex_lterm){ex->n_lslots, coef};
    return ex->lslots + ex->n_lslots++;
}

int exec__loss_value(mesh__exec *ex, double v)
{
    if (room(ex, 0) != 0) return -1;
    ex->lterms[ex->n_lterms++] = (ex_lterm){-1, v};
    return 0;
}

int exec__loss_micro_end(mesh__exec *ex)
{
    if (room(ex, 0) != 0) return -1;
    ex->lterms[ex->n_lterms++] = (ex_lterm){EX_LOSS_END, 0};
    return 0;
}

int exec__loss_take(mesh__exec *ex, double *total)
{
    if (flush(ex) != 0) return -1;
    *total = ex->lacc;
    return 0;
}
