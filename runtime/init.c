/* init.c — counter-based deterministic initialisation (init.h). */
#include "init.h"

#include <math.h> /* sqrt, log, cos */

/* Philox-4x32-10: ten rounds of two 32x32->64 multiplies and a key bump. */
void mesh__philox(uint32_t out[4], uint64_t counter, uint64_t key) {
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

uint64_t mesh__init_key(uint64_t seed, const char *name) {
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 1099511628211ull;
    /* mix the seed in so that two seeds give unrelated keys */
    uint32_t o[4];
    mesh__philox(o, h, seed);
    return ((uint64_t)o[0] << 32) | o[1];
}

/* (0, 1]: never 0, so the logarithm is finite. */
static double unit(uint32_t x) { return ((double)x + 1.0) / 4294967296.0; }

void mesh__init_normal(float *out, size_t n, uint64_t first, uint64_t key, float std) {
    for (size_t i = 0; i < n; i++) {
        uint32_t o[4];
        mesh__philox(o, first + i, key);
        double r = sqrt(-2.0 * log(unit(o[0])));
        double z = r * cos(6.283185307179586476925 * unit(o[1]));
        out[i] = (float)(z * std);
    }
}

void mesh__init_fill(float *out, size_t n, float value) {
    for (size_t i = 0; i < n; i++) out[i] = value;
}
