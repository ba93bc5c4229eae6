/* Context parallelism (seed 000; ring attention, Liu et al. 2023): the sequence of each
 * micro-batch split over parallel.cp ranks, attention computed with the keys and values
 * passed around the cp ring. Load balance for causal attention: the T positions are cut
 * into 2·cp chunks and rank i holds chunks i and 2·cp−1−i, so every rank's queries see
 * the same number of keys. */
#ifndef DT_CONTEXT_PARALLEL_H
#define DT_CONTEXT_PARALLEL_H
#include <stdint.h>

#include "../core/status.h"

/* Whether T positions split into 2·cp equal chunks; DT_EINPUT with one line if not (a
 * sequence the chunking would have to pad is refused, not padded). */
dt_status dt_cp_check(int T, int cp);
/* The global positions of rank's T/cp rows, ascending (chunk i, then chunk 2·cp−1−i). */
void dt_cp_positions(int T, int cp, int rank, int *pos);
/* Causal attention work of the rank's queries: the (query, key) pairs they score. */
int64_t dt_cp_attention_pairs(int T, int cp, int rank);

#endif
