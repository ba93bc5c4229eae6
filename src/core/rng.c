#include "rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void dt_rng_seed(dt_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t dt_rng_u64(dt_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

float dt_rng_uniform(dt_rng *r) { return (float)(dt_rng_u64(r) >> 40) * (1.0f / 16777216.0f); }

uint64_t dt_rng_below(dt_rng *r, uint64_t n) {
    if (n <= 1) return 0;
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = dt_rng_u64(r);
    while (x >= limit);
    return x % n;
}

double dt_rng_normal(dt_rng *r) {
    double u1 = ((double)(dt_rng_u64(r) >> 11) + 1.0) * (1.0 / 9007199254740993.0); /* (0,1] */
    double u2 = (double)(dt_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

uint64_t dt_rng_key(uint64_t seed, const char *name) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a-64 */
    for (; *name; name++) h = (h ^ (unsigned char)*name) * 1099511628211ULL;
    return seed ^ h;
}

/* splitmix64's c-th output (0-based) for the stream that starts at key */
static uint64_t splitmix64_at(uint64_t key, uint64_t c) {
    uint64_t x = key + c * 0x9e3779b97f4a7c15ULL;
    return splitmix64(&x);
}

double dt_rng_normal_at(uint64_t key, uint64_t index) {
    uint64_t a = splitmix64_at(key, 2 * index), b = splitmix64_at(key, 2 * index + 1);
    double u1 = ((double)(a >> 11) + 1.0) * (1.0 / 9007199254740993.0); /* (0,1] */
    double u2 = (double)(b >> 11) * (1.0 / 9007199254740992.0);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
