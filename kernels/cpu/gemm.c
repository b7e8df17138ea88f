/* gemm.c — the CPU kernels' matrix products: the same bits on any number
 * of threads.
 *
 * OpenBLAS splits a product among its threads by their count, and its
 * results change in their last bits with that count (0.3.21 on this
 * project's machines: 1 and 2 threads differ in about a fifth of a
 * 512 x 64 x 64 product's outputs), so a run's numbers would depend on
 * --threads, and a rank's on how many ranks share its process. So OpenBLAS
 * runs single-threaded here, and kcpu__gemm cuts C into blocks whose
 * bounds depend on the shape alone: GEMM_BLOCK rows, or columns, a block
 * (across the side whose cut makes each call pack the smaller operand
 * again: rows when M >= N), and one block for a product of fewer than
 * GEMM_SMALL multiply-adds or too narrow to cut. Each block is one
 * OpenBLAS call, and the blocks are shared out among the calling thread
 * and its workers: each output is computed by the same call whatever the
 * thread count. (It costs a few percent against OpenBLAS's own threads:
 * about 3.5% on 2 cores for a 4-layer, 256-wide GPT, nothing on gpt-tiny.)
 *
 * Every thread that multiplies (a rank's, in a process of several) has its
 * own workers, kcpu threads - 1 of them (kcpu_set_threads: the process's
 * ranks share its cores), started at its first product of several blocks
 * and ended with the thread (or kept to the process's end, for the main
 * thread). A child of fork() has none of them: its first product starts its
 * own (the parent's pool is left alone). Only this file calls OpenBLAS's
 * products.
 */
#include "kcpu_gemm_impl.h"

#include <cblas.h>     /* defines: cblas_sgemm, openblas_set_num_threads */
#include <pthread.h>   /* defines: pthread_*, PTHREAD_ONCE_INIT */
#include <stdatomic.h> /* defines: atomic_int */
#include <stddef.h>    /* defines: size_t */
#include <stdlib.h>    /* defines: calloc, free */

#include "kcpu.h" /* kcpu_threads_available, kcpu_set_threads */

enum {
    GEMM_BLOCK = 128,       /* rows (or columns) of C per block */
    GEMM_SMALL = 1 << 18,   /* multiply-adds under which a product is one block */
    GEMM_MAX_WORKERS = 255, /* (more threads than that are not used) */
};

/* One product's arguments, row-major: C = alpha op(A) op(B) + beta C. */
typedef struct gemm_job {
    int ta, tb, M, N, K;
    float alpha, beta;
    const float *A, *B;
    float *C;
    int lda, ldb, ldc;
    int by_rows, blocks; /* the cut: row blocks or column blocks, how many */
    int step;            /* rows (columns) a block: the whole side for one */
} gemm_job;

/* A thread's workers. Everything but tid is read and written under mu. */
typedef struct gemm_pool {
    pthread_mutex_t mu;
    pthread_cond_t work;  /* a job was posted, or quit */
    pthread_cond_t idle;  /* a worker left the job */
    const gemm_job *job;  /* the job being done, NULL between jobs */
    int next;             /* its next block to take */
    int busy;             /* workers inside it */
    unsigned gen;         /* jobs posted so far */
    int quit;
    unsigned epoch;       /* gemm_epoch when made: another is a parent's, before a fork */
    int n;                /* workers */
    pthread_t tid[];
} gemm_pool;

static atomic_int gemm_threads;  /* kcpu_set_threads' count; 0: every core */
static pthread_once_t gemm_once = PTHREAD_ONCE_INIT;
static pthread_key_t gemm_key;   /* the calling thread's pool */
static atomic_uint gemm_epoch;   /* forks so far (in this process's line) */

static void gemm_forked(void) { atomic_fetch_add(&gemm_epoch, 1); }

void kcpu_set_threads(int n) { atomic_store(&gemm_threads, n > 0 ? n : 0); }

static int gemm_thread_count(void)
{
    int n = atomic_load(&gemm_threads);
    if (n <= 0) n = kcpu_threads_available();
    return n < 1 ? 1 : n > GEMM_MAX_WORKERS + 1 ? GEMM_MAX_WORKERS + 1 : n;
}

/* Block b of job j: one single-threaded OpenBLAS call. */
static void gemm_block(const gemm_job *j, int b)
{
    int M = j->M, N = j->N, r0 = 0, c0 = 0;
    if (j->by_rows) {
        r0 = b * j->step;
        M = M - r0 < j->step ? M - r0 : j->step;
    } else {
        c0 = b * j->step;
        N = N - c0 < j->step ? N - c0 : j->step;
    }
    /* op(A)'s rows r0..: A's rows, or with ta its columns; op(B)'s columns
     * c0..: B's columns, or with tb its rows */
    const float *A = j->A + (j->ta ? (size_t)r0 : (size_t)r0 * (size_t)j->lda);
    const float *B = j->B + (j->tb ? (size_t)c0 * (size_t)j->ldb : (size_t)c0);
    float *C = j->C + (size_t)r0 * (size_t)j->ldc + (size_t)c0;
    cblas_sgemm(CblasRowMajor, j->ta ? CblasTrans : CblasNoTrans, j->tb ? CblasTrans : CblasNoTrans, M, N, j->K,
                j->alpha, A, j->lda, B, j->ldb, j->beta, C, j->ldc);
}

/* Takes and does blocks of the pool's job until none is left; called and
 * returns with mu held. */
static void gemm_take(gemm_pool *p)
{
    const gemm_job *j = p->job;
    while (j && p->next < j->blocks) {
        int b = p->next++;
        pthread_mutex_unlock(&p->mu);
        gemm_block(j, b);
        pthread_mutex_lock(&p->mu);
    }
}

static void *gemm_worker(void *arg)
{
    gemm_pool *p = arg;
    unsigned seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->gen == seen) pthread_cond_wait(&p->work, &p->mu);
        if (p->quit) break;
        seen = p->gen;
        p->busy++;
        gemm_take(p); /* (a job already done has no block left, or is gone) */
        if (--p->busy == 0) pthread_cond_signal(&p->idle);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void gemm_pool_free(void *arg)
{
    gemm_pool *p = arg;
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n; i++) pthread_join(p->tid[i], NULL);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->idle);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

static void gemm_init(void)
{
    openblas_set_num_threads(1);
    (void)pthread_key_create(&gemm_key, gemm_pool_free);
    (void)pthread_atfork(NULL, NULL, gemm_forked);
}

/* The calling thread's pool of n workers, made (or made again, for another
 * count) now; NULL if it cannot be: then the caller does every block. */
static gemm_pool *gemm_pool_of(int n)
{
    gemm_pool *p = pthread_getspecific(gemm_key);
    if (p && p->epoch != atomic_load(&gemm_epoch)) p = NULL; /* a parent's: its workers are not here */
    if (p && p->n == n) return p;
    gemm_pool_free(p);
    (void)pthread_setspecific(gemm_key, NULL);
    if (!(p = calloc(1, sizeof *p + (size_t)n * sizeof(pthread_t)))) return NULL;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->idle, NULL);
    p->epoch = atomic_load(&gemm_epoch);
    for (; p->n < n; p->n++)
        if (pthread_create(&p->tid[p->n], NULL, gemm_worker, p) != 0) break; /* fewer: still the same bits */
    (void)pthread_setspecific(gemm_key, p);
    return p;
}

void kcpu__gemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                float beta, float *C, int ldc)
{
    pthread_once(&gemm_once, gemm_init);
    if (M <= 0 || N <= 0) return;
    gemm_job j = {ta, tb, M, N, K, alpha, beta, A, B, C, lda, ldb, ldc, 1, 1, M};
    if ((double)M * N * K >= GEMM_SMALL) {
        /* a row block packs all of op(B) again, a column block op(A) */
        int rows = M >= 2 * GEMM_BLOCK && (M >= N || N < 2 * GEMM_BLOCK);
        if (rows)
            j.blocks = (M + GEMM_BLOCK - 1) / GEMM_BLOCK, j.step = GEMM_BLOCK;
        else if (N >= 2 * GEMM_BLOCK)
            j.by_rows = 0, j.blocks = (N + GEMM_BLOCK - 1) / GEMM_BLOCK, j.step = GEMM_BLOCK;
    }
    /* (the count only for a product of several blocks: attention's tiles
     * come here thousands of times a step) */
    int threads = j.blocks > 1 ? gemm_thread_count() : 1;
    gemm_pool *p = threads > 1 ? gemm_pool_of(threads - 1) : NULL;
    if (!p) {
        for (int b = 0; b < j.blocks; b++) gemm_block(&j, b);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->job = &j;
    p->next = 0;
    p->gen++;
    pthread_cond_broadcast(&p->work);
    gemm_take(p);
    while (p->busy > 0) pthread_cond_wait(&p->idle, &p->mu);
    p->job = NULL;
    pthread_mutex_unlock(&p->mu);
}
