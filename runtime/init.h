/* init.h — deterministic parameter initialisation that does not depend on
 * the mesh (internal to libmesh).
 *
 * Every element's initial value is a pure function of (seed, parameter
 * name, global element index): a Philox-4x32-10 counter-based generator
 * (Salmon et al., SC'11) keyed by the seed and a hash of the name, with the
 * element index as the counter. A rank holding any slice of a parameter
 * fills exactly the values the whole parameter would have there, so every
 * sharding materialises the same global model.
 */
#ifndef MESH_INIT_H
#define MESH_INIT_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* uint64_t */

/* Philox-4x32-10 of counter (c0, c1) under key (k0, k1): four 32-bit words. */
void mesh__philox(uint32_t out[4], uint64_t counter, uint64_t key);

/* The key of a parameter: the seed and a 64-bit hash (FNV-1a) of its name. */
uint64_t mesh__init_key(uint64_t seed, const char *name);

/* Fills out[0..n) with the values of global elements first .. first+n-1:
 * normal with mean 0 and standard deviation `std` (Box-Muller on the
 * element's own Philox output). */
void mesh__init_normal(float *out, size_t n, uint64_t first, uint64_t key, float std);

/* Fills with a constant (zeros, ones). */
void mesh__init_fill(float *out, size_t n, float value);

#endif
