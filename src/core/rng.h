/* Deterministic random numbers: xoshiro256** seeded through splitmix64.
 * The whole state is four words, saved in checkpoints for bitwise resume. */
#ifndef DT_RNG_H
#define DT_RNG_H
#include <stdint.h>

typedef struct { uint64_t s[4]; } dt_rng;

void dt_rng_seed(dt_rng *r, uint64_t seed);
uint64_t dt_rng_u64(dt_rng *r);
/* uniform in [0, 1) with 24 random bits */
float dt_rng_uniform(dt_rng *r);
/* uniform integer in [0, n) without modulo bias */
uint64_t dt_rng_below(dt_rng *r, uint64_t n);
/* standard normal (Box-Muller, double precision internally) */
double dt_rng_normal(dt_rng *r);

/* Counter-based draws for initialisation that does not depend on the layout: the value
 * at (key, index) is a pure function of both (splitmix64's output at position index of
 * the stream seeded by key), so any rank draws exactly the elements of its shard. */
uint64_t dt_rng_key(uint64_t seed, const char *name);   /* seed XOR FNV-1a-64(name) */
double dt_rng_normal_at(uint64_t key, uint64_t index); /* standard normal, Box-Muller */

#endif
