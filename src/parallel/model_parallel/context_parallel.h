/* Context parallelism (ring attention, Liu et al. 2023; docs/parallelism.md, "Context
 * parallelism"): the sequence of each micro-batch split over parallel.cp ranks, attention
 * computed with the keys and values passed around the cp ring. Load balance for causal attention: the
 * T positions are cut into 2·cp chunks and rank i holds chunks i and 2·cp−1−i, so every
 * rank's queries see the same number of keys. */
#ifndef DT_CONTEXT_PARALLEL_H
#define DT_CONTEXT_PARALLEL_H
#include <stdint.h>

#include "../../comm/comm.h"
#include "../../core/config.h"
#include "../../core/status.h"
#include "../../model/gpt.h"
#include "../layout/layout.h"

/* Whether T positions split into 2·cp equal chunks; DT_EINPUT with one line if not (a
 * sequence the chunking would have to pad is refused, not padded). */
dt_status dt_cp_check(int T, int cp);
/* The global positions of rank's T/cp rows, ascending (chunk i, then chunk 2·cp−1−i). */
void dt_cp_positions(int T, int cp, int rank, int *pos);
/* Causal attention work of the rank's queries: the (query, key) pairs they score. */
int64_t dt_cp_attention_pairs(int T, int cp, int rank);
/* Layouts context parallelism does not run (yet) fail here, before any work, one line. */
dt_status dt_cp_check_config(const dt_layout *L);

/* Ring attention on model (its rank in the cp group cp; micro-batches of at most max_B
 * sequences of T positions, T/cp of them here): the model's columns become this rank's
 * positions (dt_cp_positions) and its attention the ring's. Forward: each rank's q|k|v
 * rows (the kernels' layout; q rides along, 1.5x the bytes keys and values need) travel
 * once around the ring (non-blocking, the next block in flight
 * while the current one computes), merged by the online-softmax rule; backward: each
 * block's dk, dv travel with it and arrive back at their owner after the last step.
 * Allocates the ring's buffers once (dt_cp_detach frees them). Identity when cp has one
 * rank. */
dt_status dt_cp_attach(gpt_model *m, dt_comm *cp, int max_B, int T, int row_block);
void dt_cp_detach(gpt_model *m);
/* Bitwise mode (row_block > 0: T / parallel.cp_chunks; cp_chunks.c): the canonical
 * sequence chunks instead of the ring, attached on a group of one too. */
dt_status dt_cp_chunks_attach(gpt_model *m, dt_comm *cp, int max_B, int T, int row_block);
void dt_cp_chunks_detach(gpt_model *m);
/* Bytes of its buffers for one rank (Q = parallel.cp_chunks; 0 when Q <= 1). */
size_t dt_cp_chunks_bytes(int B, int T, int cp, int C, int I, int tp, int Q); /* I: the MLP's width */
/* Bytes of the ring's buffers for one rank (the estimate's workspace). */
size_t dt_cp_ring_bytes(int B, int T, int cp, int C, int tp);
/* The layout's context-parallel buffers for one rank: the ring's or the chunks' (the
 * estimate's workspace, and the measured one). */
size_t dt_cp_bytes(const dt_layout *L);

#endif
