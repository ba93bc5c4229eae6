/* A host simulator of the CUDA subset that src/backend/cuda/warp_mma.cuh names, so the
 * tensor-core kernels written against it (and the Llama family's, llama_kernels.cuh) run
 * on a machine with no GPU (C++ only).
 *
 * Each CUDA thread of a block is a host thread; blocks run one after another. The warp
 * primitives meet at a barrier of the warp's 32 threads and exchange operands through
 * the warp's slots, then each lane computes what the PTX manual says it receives:
 * mma.sync m16n8k16 (bf16 in, fp32 accumulate), ldmatrix x4 (plain and .trans), shuffles.
 * __syncthreads is a barrier of the block. Shared memory is a heap block of exactly the
 * launch's size (so AddressSanitizer sees overruns), filled with NaN bytes first; every
 * ldmatrix and cp.async address is checked to be 16-byte aligned and inside it, and a
 * shadow of it (sim_word) finds races between those accesses on every run: a tile read
 * before its copy landed and a barrier passed, or refilled while another thread still
 * reads it. */
#ifndef DT_WARP_SIM_H
#define DT_WARP_SIM_H
#define DT_WARP_SIM 1

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)

struct bf16 {
    uint16_t bits;
};
struct uint4 {
    unsigned x, y, z, w;
};
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
struct sim_dim3 {
    unsigned x, y, z;
};

static inline float sim_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint32_t sim_u32(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
/* fp32 -> bf16 bits, round to nearest even (NaN kept quiet) */
static inline uint16_t sim_bf16_bits(float f) {
    uint32_t u = sim_u32(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}
static inline float sim_bf16_float(uint16_t b) { return sim_f32((uint32_t)b << 16); }
/* cuda_internal.h's storage helpers: load fp32 or bf16 to fp32, store rounded to T */
static inline float ld(float x) { return x; }
static inline float ld(bf16 x) { return sim_bf16_float(x.bits); }
template <typename T> static inline T st(float x);
template <> inline float st<float>(float x) { return x; }
template <> inline bf16 st<bf16>(float x) { return bf16{sim_bf16_bits(x)}; }

/* A warp's exchange slots, two sets used alternately: a lane writes set k%2 for its k-th
 * exchange, waits at the barrier and reads; it can only write that set again after every
 * lane has passed exchange k+1's barrier, so after each has read exchange k: one barrier
 * per exchange. */
struct sim_slots {
    int op[32]; /* which exchange each lane is at: all 32 must agree */
    float f[32];
    uint32_t a[32][4], b[32][2];
    const unsigned char *addr[32];
};
struct sim_warp {
    pthread_barrier_t bar;
    sim_slots set[2];
};
/* Shared memory's shadow, per 4-byte word, for the accesses the simulator sees (ldmatrix
 * reads, cp.async writes; a kernel's plain loads and stores are not seen): who wrote it
 * last and in which barrier interval (epoch: the block's __syncthreads so far), who read it
 * in the current interval, and whether a cp.async to it is still in flight. */
struct sim_word {
    int wr_tid, wr_epoch, rd_tid, rd_epoch, rd_multi, pending;
};
struct sim_block {
    pthread_barrier_t bar;
    sim_warp *warps;
    unsigned char *smem;
    size_t smem_bytes;
    sim_word *shadow;
    pthread_mutex_t shadow_lock;
};
struct sim_copy {
    unsigned char *dst;
    unsigned char data[16];
};
struct sim_thread {
    sim_dim3 tid, bid;
    sim_block *blk;
    int epoch;                            /* __syncthreads passed so far */
    unsigned exchanges;                   /* warp exchanges so far: picks the slot set */
    std::vector<sim_copy> open;                   /* cp.async copies not yet committed */
    std::vector<std::vector<sim_copy>> committed; /* cp.async groups in flight, oldest first */
};
static thread_local sim_thread sim_self;
static sim_dim3 sim_grid, sim_bdim;
#define threadIdx (sim_self.tid)
#define blockIdx (sim_self.bid)
#define gridDim (sim_grid)
#define blockDim (sim_bdim)
#define DT_DYN_SMEM(name) unsigned char *name = sim_self.blk->smem

static inline sim_warp &sim_my_warp(void) { return sim_self.blk->warps[sim_self.tid.x / 32]; }
/* this lane's slot set for its next exchange, tagged with the exchange's kind */
enum { SIM_SHFL = 1, SIM_MMA, SIM_LDSM, SIM_LDSM_T };
static inline sim_slots &sim_slot_set(int op) {
    sim_slots &w = sim_my_warp().set[sim_self.exchanges++ & 1];
    w.op[sim_self.tid.x % 32] = op;
    return w;
}
/* after the barrier: a lane at another kind of exchange (or another shuffle distance) is
 * a kernel bug the hardware leaves undefined */
static inline void sim_agree(const sim_slots &w) {
    int l = (int)(sim_self.tid.x % 32);
    for (int L = 0; L < 32; L++)
        if (w.op[L] != w.op[l]) {
            fprintf(stderr, "warp_sim: thread %u: lane %d is at exchange %d, lane %d at %d\n", sim_self.tid.x, l,
                    w.op[l], L, w.op[L]);
            abort();
        }
}
static inline int sim_lane(void) { return (int)(sim_self.tid.x % 32); }

static inline void dt_syncthreads(void) {
    pthread_barrier_wait(&sim_self.blk->bar);
    sim_self.epoch++;
}

/* The shadow's rules (one barrier interval = one epoch): a read needs the word written
 * (cp.async landed: its thread waited) and, if another thread wrote it, a barrier since;
 * a write needs no other thread to have read or written the word in this interval, and
 * no copy to it in flight. A breach aborts naming the thread and the offset. */
static void sim_race(const char *what, unsigned char *p) {
    fprintf(stderr, "warp_sim: block (%u,%u) thread %u, shared offset %td: %s\n", sim_self.bid.x, sim_self.bid.y,
            sim_self.tid.x, p - sim_self.blk->smem, what);
    abort();
}
static void sim_shadow_read(const unsigned char *q, size_t n) {
    sim_block *blk = sim_self.blk;
    int me = (int)sim_self.tid.x, e = sim_self.epoch;
    pthread_mutex_lock(&blk->shadow_lock);
    for (size_t o = 0; o < n; o += 4) {
        sim_word &w = blk->shadow[(q + o - blk->smem) / 4];
        const char *bad = w.pending ? "read while a cp.async to it is in flight (before its wait and a barrier)"
                          : w.wr_epoch < 0 ? "read of shared memory nothing has written"
                          : w.wr_epoch == e && w.wr_tid != me ? "read of another thread's write with no barrier between"
                                                              : NULL;
        if (bad) sim_race(bad, (unsigned char *)q + o);
        if (w.rd_epoch != e) w.rd_epoch = e, w.rd_tid = me, w.rd_multi = 0;
        else if (w.rd_tid != me) w.rd_multi = 1;
    }
    pthread_mutex_unlock(&blk->shadow_lock);
}
static void sim_shadow_write_start(unsigned char *d, size_t n) {
    sim_block *blk = sim_self.blk;
    int me = (int)sim_self.tid.x, e = sim_self.epoch;
    pthread_mutex_lock(&blk->shadow_lock);
    for (size_t o = 0; o < n; o += 4) {
        sim_word &w = blk->shadow[(d + o - blk->smem) / 4];
        const char *bad = w.pending ? "cp.async to a word another copy still writes"
                          : w.rd_epoch == e && (w.rd_multi || w.rd_tid != me)
                              ? "write to a word another thread reads in this barrier interval"
                          : w.wr_epoch == e && w.wr_tid != me ? "write to a word another thread wrote in this interval"
                                                              : NULL;
        if (bad) sim_race(bad, d + o);
        w.pending = 1;
    }
    pthread_mutex_unlock(&blk->shadow_lock);
}
static void sim_shadow_write_done(unsigned char *d, size_t n) {
    sim_block *blk = sim_self.blk;
    pthread_mutex_lock(&blk->shadow_lock);
    for (size_t o = 0; o < n; o += 4) {
        sim_word &w = blk->shadow[(d + o - blk->smem) / 4];
        w.pending = 0, w.wr_tid = (int)sim_self.tid.x, w.wr_epoch = sim_self.epoch;
    }
    pthread_mutex_unlock(&blk->shadow_lock);
}
static inline void dt_syncwarp(void) { pthread_barrier_wait(&sim_my_warp().bar); }

static inline float dt_shfl_xor(float v, int m) {
    sim_slots &w = sim_slot_set(SIM_SHFL + 16 * m);
    int l = sim_lane();
    w.f[l] = v;
    pthread_barrier_wait(&sim_my_warp().bar);
    sim_agree(w);
    return w.f[l ^ m];
}

static inline void dt_mma_bf16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    sim_slots &w = sim_slot_set(SIM_MMA);
    int l = sim_lane();
    memcpy(w.a[l], a, sizeof w.a[l]);
    w.b[l][0] = b0;
    w.b[l][1] = b1;
    pthread_barrier_wait(&sim_my_warp().bar);
    sim_agree(w);
    float A[16][16], B[16][8];
    for (int L = 0; L < 32; L++) {
        int g = L >> 2, t = L & 3;
        for (int h = 0; h < 2; h++) {
            A[g][2 * t + h] = sim_bf16_float((uint16_t)(w.a[L][0] >> (16 * h)));
            A[g + 8][2 * t + h] = sim_bf16_float((uint16_t)(w.a[L][1] >> (16 * h)));
            A[g][8 + 2 * t + h] = sim_bf16_float((uint16_t)(w.a[L][2] >> (16 * h)));
            A[g + 8][8 + 2 * t + h] = sim_bf16_float((uint16_t)(w.a[L][3] >> (16 * h)));
            B[2 * t + h][g] = sim_bf16_float((uint16_t)(w.b[L][0] >> (16 * h)));
            B[8 + 2 * t + h][g] = sim_bf16_float((uint16_t)(w.b[L][1] >> (16 * h)));
        }
    }
    int g = l >> 2, t = l & 3;
    for (int e = 0; e < 4; e++) {
        int row = g + (e >> 1) * 8, col = 2 * t + (e & 1);
        float s = d[e];
        for (int k = 0; k < 16; k++) s += A[row][k] * B[k][col];
        d[e] = s;
    }
}

static inline void sim_ldsm(uint32_t r[4], const void *p, int trans) {
    sim_slots &w = sim_slot_set(trans ? SIM_LDSM_T : SIM_LDSM);
    sim_block *blk = sim_self.blk;
    int l = sim_lane();
    const unsigned char *q = (const unsigned char *)p;
    if (q < blk->smem || q + 16 > blk->smem + blk->smem_bytes || ((uintptr_t)q & 15)) {
        fprintf(stderr, "warp_sim: ldmatrix lane %d: address %+td outside shared memory (%zu bytes) or unaligned\n",
                l, q - blk->smem, blk->smem_bytes);
        abort();
    }
    sim_shadow_read(q, 16);
    w.addr[l] = q;
    pthread_barrier_wait(&sim_my_warp().bar);
    sim_agree(w);
    int g = l >> 2, t = l & 3;
    for (int j = 0; j < 4; j++) {
        uint16_t e[2];
        for (int h = 0; h < 2; h++) {
            /* matrix j's row i starts at lane 8j+i's address; 8 bf16 per row */
            int row = trans ? 2 * t + h : g, col = trans ? g : 2 * t + h;
            memcpy(&e[h], w.addr[8 * j + row] + 2 * col, 2);
        }
        r[j] = (uint32_t)e[0] | (uint32_t)e[1] << 16;
    }
}
static inline void dt_ldsm_x4(uint32_t r[4], const void *p) { sim_ldsm(r, p, 0); }
static inline void dt_ldsm_x4_t(uint32_t r[4], const void *p) { sim_ldsm(r, p, 1); }

/* cp.async: the source is read at issue (it does not change while copies are in flight
 * here); the copy lands in shared memory at the wait that retires its group, the latest
 * the hardware may, or at once with sim_cp_async_eager, the earliest. A kernel that reads
 * before it waits fails the first way; one that refills a buffer other warps still read
 * fails the second. */
static bool sim_cp_async_eager;
static inline void dt_cp_async16(void *dst, const void *src, bool valid) {
    sim_block *blk = sim_self.blk;
    unsigned char *d = (unsigned char *)dst;
    if (d < blk->smem || d + 16 > blk->smem + blk->smem_bytes || ((uintptr_t)d & 15) || ((uintptr_t)src & 15)) {
        fprintf(stderr, "warp_sim: cp.async thread %u: destination %+td outside shared memory (%zu bytes) or an "
                "address unaligned\n", sim_self.tid.x, d - blk->smem, blk->smem_bytes);
        abort();
    }
    sim_copy c;
    c.dst = d;
    if (valid) memcpy(c.data, src, 16);
    else memset(c.data, 0, 16);
    sim_shadow_write_start(d, 16);
    if (sim_cp_async_eager) memcpy(d, c.data, 16);
    sim_self.open.push_back(c);
}
static inline void dt_cp_async_commit(void) {
    sim_self.committed.push_back(sim_self.open);
    sim_self.open.clear();
}
/* copies not yet committed are not waited for */
template <int N> static inline void dt_cp_async_wait(void) {
    auto &gs = sim_self.committed;
    while (gs.size() > (size_t)N) {
        for (sim_copy &c : gs.front()) {
            if (!sim_cp_async_eager) memcpy(c.dst, c.data, 16);
            sim_shadow_write_done(c.dst, 16);
        }
        gs.erase(gs.begin());
    }
}

static inline uint32_t dt_pack_bf16(float lo, float hi) {
    return (uint32_t)sim_bf16_bits(lo) | (uint32_t)sim_bf16_bits(hi) << 16;
}
static inline float dt_bf16_lo(uint32_t u) { return sim_f32(u << 16); }
static inline float dt_bf16_hi(uint32_t u) { return sim_f32(u & 0xffff0000u); }
static inline float dt_exp2(float x) { return exp2f(x); }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }

/* Runs body() as a grid of blocks of `threads` threads (a multiple of 32) with `smem`
 * bytes of dynamic shared memory. */
template <class F> static void sim_launch(sim_dim3 grid, unsigned threads, size_t smem, F body) {
    if (smem > 227 * 1024 || threads % 32 || threads > 1024) { /* an H100's per-block limits */
        fprintf(stderr, "warp_sim: launch of %u threads with %zu bytes of shared memory: beyond the GPU's limits\n",
                threads, smem);
        abort();
    }
    sim_grid = grid;
    sim_bdim = sim_dim3{threads, 1, 1};
    unsigned nw = threads / 32;
    sim_block blk;
    blk.warps = new sim_warp[nw];
    blk.smem_bytes = smem;
    pthread_barrier_init(&blk.bar, NULL, threads);
    pthread_mutex_init(&blk.shadow_lock, NULL);
    for (unsigned i = 0; i < nw; i++) pthread_barrier_init(&blk.warps[i].bar, NULL, 32);
    struct arg {
        sim_block *blk;
        sim_dim3 bid;
        unsigned tid;
        F *body;
    };
    pthread_t *th = new pthread_t[threads];
    arg *args = new arg[threads];
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 1 << 20);
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blk.smem = (unsigned char *)malloc(smem ? smem : 1);
                memset(blk.smem, 0xff, smem); /* NaN in fp32 and bf16 */
                blk.shadow = new sim_word[smem / 4 + 1];
                for (size_t i = 0; i <= smem / 4; i++) blk.shadow[i] = sim_word{-1, -1, -1, -1, 0, 0};
                for (unsigned t = 0; t < threads; t++) {
                    args[t] = arg{&blk, sim_dim3{x, y, z}, t, &body};
                    int rc = pthread_create(
                        &th[t], &attr,
                        [](void *p) -> void * {
                            arg *a = (arg *)p;
                            sim_self.blk = a->blk;
                            sim_self.bid = a->bid;
                            sim_self.tid = sim_dim3{a->tid, 0, 0};
                            sim_self.exchanges = 0;
                            sim_self.epoch = 0;
                            sim_self.open.clear();
                            sim_self.committed.clear();
                            (*a->body)();
                            return NULL;
                        },
                        &args[t]);
                    if (rc) {
                        fprintf(stderr, "warp_sim: pthread_create: %s\n", strerror(rc));
                        abort();
                    }
                }
                for (unsigned t = 0; t < threads; t++) pthread_join(th[t], NULL);
                free(blk.smem);
                delete[] blk.shadow;
            }
    pthread_attr_destroy(&attr);
    pthread_barrier_destroy(&blk.bar);
    pthread_mutex_destroy(&blk.shadow_lock);
    for (unsigned i = 0; i < nw; i++) pthread_barrier_destroy(&blk.warps[i].bar);
    delete[] blk.warps;
    delete[] th;
    delete[] args;
}

#endif
