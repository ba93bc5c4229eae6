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

#endif
