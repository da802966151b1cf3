/*
 * src/core/philox.h - the dropout rule of SPEC.md: Philox4x32-10 (Salmon et al., "Parallel random
 * numbers: as easy as 1, 2, 3", SC'11) keyed by the 64-bit seed and countered by (i, j >> 2, h, b).
 *
 * One definition for every backend: host C includes it as is, and CUDA code can include it with
 * ATTN_HOST_DEVICE defined as __host__ __device__, so the bits are the same everywhere.
 */
#ifndef ATTN_CORE_PHILOX_H
#define ATTN_CORE_PHILOX_H

#include <stdint.h>

#ifndef ATTN_HOST_DEVICE
#define ATTN_HOST_DEVICE
#endif

#define ATTN_PHILOX_M0 0xD2511F53u
#define ATTN_PHILOX_M1 0xCD9E8D57u
#define ATTN_PHILOX_W0 0x9E3779B9u
#define ATTN_PHILOX_W1 0xBB67AE85u

/* Ten rounds of Philox4x32 on ctr with key; the four output words go to out. */
static inline ATTN_HOST_DEVICE void attn_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2],
                                                      uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = (uint64_t)ATTN_PHILOX_M0 * c0;
    uint64_t p1 = (uint64_t)ATTN_PHILOX_M1 * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
    uint32_t n1 = (uint32_t)p1;
    uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    uint32_t n3 = (uint32_t)p0;
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += ATTN_PHILOX_W0;
    k1 += ATTN_PHILOX_W1;
  }
  out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/* floor(p * 2^32): a random word r keeps its element iff r >= threshold. 0 <= p < 1. */
static inline ATTN_HOST_DEVICE uint32_t attn_dropout_threshold(double p) {
  return (uint32_t)(p * 4294967296.0);
}

/* Whether element (b, h, i, j) survives dropout; i, j are positions within the sequence and b the
 * batch or varlen sequence index. Four consecutive j share one Philox call; fast paths exploit that. */
static inline ATTN_HOST_DEVICE int attn_dropout_keep(uint64_t seed, uint32_t threshold, int64_t b,
                                                     int64_t h, int64_t i, int64_t j) {
  const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  const uint32_t ctr[4] = {(uint32_t)i, (uint32_t)(j >> 2), (uint32_t)h, (uint32_t)b};
  uint32_t r[4];
  attn_philox4x32_10(ctr, key, r);
  return r[j & 3] >= threshold;
}

#endif /* ATTN_CORE_PHILOX_H */
