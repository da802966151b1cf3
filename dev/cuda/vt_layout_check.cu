/*
 * dev/cuda/vt_layout_check.cu - a host-only check (no GPU needed) of the sm90 fp8 forward's V^T
 * bookkeeping (src/impl/cuda/sm90/sm90_fwd_fp8.cuh): for each key-block layout the library builds
 * (128 keys at D = 128 and 256; 192 keys at D = 128, the half panel padded) and for
 * dense, padded and packed varlen problems of odd lengths, it replays on the CPU
 *   - the pre-pass vt_kernel's writes (the same slices, the same VtLayout::offset, vt_col0 and
 *     vt_head_bytes calls) into a workspace of vt_bytes, every byte first marked unwritten, and
 *   - the kernel's reads: each key block's TMA box (VtLayout::box_row, kRows rows of 128 bytes,
 *     zeros past the map's rows as the copy engine fills them) and, in that tile, each P V
 *     product's rows (VtLayout::pv_at, N = Dv rows of 32 bytes),
 * and checks that the byte a product reads for (O column d, its 32-key step's byte t) is V's
 * element (key of the block's step, permuted by vt_key as P's fragment is, d), zero past the
 * sequence's keys, never an unwritten byte (which could hold a NaN) and never outside the
 * workspace or the tile. The swizzle is left out: the copy engine applies it and wgmma undoes it
 * within the same 1024-byte atoms, whose alignment the kernel's static_asserts and 1024-aligned
 * tiles keep.
 *
 * Why: the 192-key variants changed V^T's layout for every configuration, and such a change is
 * checked here before any device time is spent on it.
 *
 * build + run (any machine with nvcc):
 *   nvcc -std=c++17 -O2 -Iinclude -Isrc -gencode=arch=compute_90a,code=sm_90a dev/cuda/vt_layout_check.cu -o vtcheck && ./vtcheck
 */
#include "impl/cuda/sm90/sm90_fwd_fp8.cuh"

#include <stdio.h>
#include <string.h>

#include <vector>

using namespace attn_cuda;
using namespace attn_cuda::sm90;

static int failures = 0, checked = 0;

/* V's element (sequence-relative key of batch b, KV head g, column d) as a distinct nonzero id;
 * the workspace holds ids, 0 for the pre-pass's zeros, -1 for a byte never written */
static int64_t id_of(const attn_cuda_params &p, int b, int64_t key, int g, int d) {
  return 1 + (((int64_t)b * (p.seqlen_k + 1) + key) * p.heads_kv + g) * p.dv + d;
}

static Seq host_seq(const attn_cuda_params &p, const std::vector<int> &lens, int b) {
  Seq s{0, 0, p.seqlen_q, p.seqlen_k};
  if (p.varlen == ATTN_CUDA_VARLEN_PACKED) {
    for (int i = 0; i < b; ++i) s.k0 += lens[i];
    s.len_k = lens[b];
  } else if (p.varlen == ATTN_CUDA_VARLEN_PADDED) {
    s.len_k = lens[b];
  }
  return s;
}

template <int kDv, int kBN>
static void check(const char *what, int varlen, const std::vector<int> &lens, int heads_kv) {
  using Vt = VtLayout<kDv, kBN>;
  attn_cuda_params p;
  memset(&p, 0, sizeof p);
  p.batch = (int)lens.size(), p.heads_kv = heads_kv, p.d = p.dv = kDv, p.varlen = varlen;
  for (int l : lens) p.seqlen_k = l > p.seqlen_k ? l : p.seqlen_k, p.total_k += l;
  p.vt_cols = vt_columns(p);
  const size_t bytes = vt_bytes(p);
  std::vector<int64_t> ws(bytes, -1);
  int bad = 0;
  auto fail = [&](const char *msg, int b, int g, int64_t a, int64_t c) {
    if (bad++ < 5)
      printf("FAIL %s D=%d keys=%d: %s (b %d g %d: %lld, %lld)\n", what, kDv, kBN, msg, b, g,
             (long long)a, (long long)c);
  };
  /* the pre-pass: launch_fwd90_fp8's grid, vt_kernel's loops */
  const int slices = (int)((p.seqlen_k + kVtBlock - 1) / kVtBlock * (kVtBlock / 64));
  for (int b = 0; b < p.batch; ++b)
    for (int g = 0; g < p.heads_kv; ++g)
      for (int x = 0; x < slices; ++x) {
        const int j0 = x * 64;
        const Seq sq = host_seq(p, lens, b);
        const int region = (sq.len_k + kVtBlock - 1) / kVtBlock * kVtBlock;
        if (j0 >= region) continue;
        const int64_t base =
            ((int64_t)(varlen == ATTN_CUDA_VARLEN_PACKED ? 0 : b) * p.heads_kv + g) *
            vt_head_bytes(p);
        const int64_t k0 = vt_col0(p, sq, b) + j0;
        for (int c = 0; c < kDv * 4; ++c) {
          const int d = c % kDv, grp = c / kDv;
          const int64_t at = base + Vt::offset(d, k0 + grp * 16);
          if (at % 16 != 0 || at < 0 || at + 16 > (int64_t)bytes) {
            fail("a 16-byte store misaligned or outside the workspace", b, g, at, (int64_t)bytes);
            continue;
          }
          for (int e = 0; e < 16; ++e) {
            const int64_t key = j0 + grp * 16 + vt_key(e);
            const int64_t v = key < sq.len_k ? id_of(p, b, key, g, d) : 0;
            if (ws[at + e] != -1 && ws[at + e] != v)
              fail("two stores to one byte", b, g, at + e, v);
            ws[at + e] = v;
          }
        }
      }
  /* the kernel: every key block of every sequence, the map [B'][rows][Hkv][128] */
  const int64_t head_bytes = vt_head_bytes(p), map_rows = head_bytes / 128;
  for (int b = 0; b < p.batch; ++b)
    for (int g = 0; g < p.heads_kv; ++g) {
      const Seq sq = host_seq(p, lens, b);
      const int vt0 = (int)vt_col0(p, sq, b);
      const int64_t head0 =
          ((int64_t)(varlen == ATTN_CUDA_VARLEN_PACKED ? 0 : b) * p.heads_kv + g) * head_bytes;
      for (int n = 0; n * kBN < sq.len_k; ++n) {
        const int row0 = Vt::box_row(vt0, n);
        for (int kk = 0; kk < kBN / 32; ++kk)
          for (int d = 0; d < kDv; ++d)
            for (int t = 0; t < 32; ++t) {
              const int64_t in_tile = Vt::pv_at(kk) + (int64_t)d * 128 + t;
              if (in_tile >= Vt::kRows * 128) {
                fail("a product reads past the tile", b, g, in_tile, n);
                continue;
              }
              const int64_t row = row0 + in_tile / 128;
              const int64_t got = row < map_rows ? ws[head0 + row * 128 + in_tile % 128] : 0;
              const int64_t key = (int64_t)n * kBN + 32 * kk + 16 * (t / 16) + vt_key(t % 16);
              const int64_t want = key < sq.len_k ? id_of(p, b, key, g, d) : 0;
              ++checked;
              if (got != want) fail("a product reads the wrong byte", b, g, got, want);
            }
      }
    }
  failures += bad != 0;
  printf("%s %s D=%d keys=%d lens", bad ? "FAIL" : "PASS", what, kDv, kBN);
  for (int l : lens) printf(" %d", l);
  printf(" (workspace %zu bytes)\n", bytes);
}

template <int kDv, int kBN> static void check_all() {
  static const int lengths[] = {1, 63, 127, 128, 129, 191, 192, 193, 383, 384, 385, 1000};
  for (int l : lengths) check<kDv, kBN>("dense", ATTN_CUDA_VARLEN_NONE, {l, l}, 2);
  check<kDv, kBN>("padded", ATTN_CUDA_VARLEN_PADDED, {385, 0, 1, 200}, 3);
  check<kDv, kBN>("packed", ATTN_CUDA_VARLEN_PACKED, {385, 0, 1, 200, 383, 192}, 2);
  check<kDv, kBN>("packed", ATTN_CUDA_VARLEN_PACKED, {1000, 129}, 1);
}

int main() {
  check_all<128, 128>(); /* sm90_fp8, sm90_fp8_pingpong at D = 128 */
  check_all<256, 128>(); /* the same at D = 256 */
  check_all<128, 192>(); /* sm90_fp8_n192 */
  printf("vt_layout_check: %d failed, %d bytes read checked\n", failures, checked);
  return failures != 0;
}
