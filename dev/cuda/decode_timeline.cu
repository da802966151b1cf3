/*
 * dev/cuda/decode_timeline.cu - where a decode call's time goes, CTA by CTA: the split-KV decode
 * kernels of src/impl/cuda/cuda_decode.cu built with ATTN_CUDA_DECODE_TIMELINE, so each CTA's thread
 * 0 stamps %globaltimer at its events into a device ring (cuda_decode.cu's tl_store):
 *   split kernel: 0 start, 1 the previous kernel done (griddepcontrol.wait returned), 2 the first
 *                 tile landed, 3 the last tile done, 4 the partial (or result) written, 5 exit
 *                 (after the cluster's or the grid's merge, if any);
 *   merge kernel: 0 start, 1 the split kernel done, 2 exit.
 * The problem is issue 14's (bf16, Hq = 32, Hkv = 8, D = 128, every sequence full), run as
 * decode_bench runs it: 20 calls captured in a CUDA graph and replayed; the stamps of the last
 * replay give each call's timeline, relative to the first CTA start of the call (T0), as the median
 * over calls 4..15 of: the previous call's last exit, and the first / median / last CTA at each
 * event; and the SM clock the CTAs ran at (their clock64 cycles over their globaltimer time). The
 * GPU's clocks rise only after some milliseconds of work: the graph is first replayed for
 * TIMELINE_WARM_MS milliseconds (default 200), as an engine's steady decoding would keep it. The
 * data paths follow ATTN_CUDA_DECODE (docs/DECODE.md), read like a plan does.
 *
 * build (from the repository root; sm_90a or sm_90):
 *   nvcc -std=c++17 -O3 -Iinclude -Isrc -gencode=arch=compute_90,code=sm_90 \
 *        dev/cuda/decode_timeline.cu -o decode_timeline
 * usage: decode_timeline B Tk [Tq [page [half_waves [csv]]]]
 *   page 0: a dense cache; half_waves: the split heuristic's (2: one wave, "splitkv"; 1:
 *   "splitkv_half"; 4: "splitkv_waves2"); csv: a file for the raw stamps of call 10.
 */
#define ATTN_CUDA_DECODE_TIMELINE 1
#include "impl/cuda/cuda_decode.cu"

#include <algorithm>
#include <cstdio>
#include <vector>

namespace {

using namespace attn_cuda_decode;
typedef unsigned long long u64;

void check(cudaError_t e, const char *what) {
  if (e != cudaSuccess) {
    fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    exit(1);
  }
}

void *device_bf16(size_t n, uint64_t seed) {
  std::vector<__nv_bfloat16> h(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    h[i] = __float2bfloat16((float)((x >> 40) & 0xFFFF) / 32768.0f - 1.0f);
  }
  void *d;
  check(cudaMalloc(&d, n * 2), "cudaMalloc");
  check(cudaMemcpy(d, h.data(), n * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
  return d;
}

double pct(std::vector<double> v, double q) { /* q in [0, 1] of v; NaN when empty */
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v[(size_t)(q * (double)(v.size() - 1) + 0.5)];
}

} // namespace

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: decode_timeline B Tk [Tq [page [half_waves [csv]]]]\n");
    return 2;
  }
  const int B = atoi(argv[1]), Tk = atoi(argv[2]), Tq = argc > 3 ? atoi(argv[3]) : 1;
  const int page = argc > 4 ? atoi(argv[4]) : 16, half_waves = argc > 5 ? atoi(argv[5]) : 2;
  const char *csv = argc > 6 ? argv[6] : nullptr;
  const int HQ = 32, HKV = 8, D = 128, CALLS = 20;
  const int group = HQ / HKV, chunks = attn_cuda_decode_row_chunks(group, Tq);

  attn_cuda_decode_params p;
  memset(&p, 0, sizeof p);
  p.batch = B, p.seqlen_q = Tq, p.seqlen_k = Tk, p.heads_q = HQ, p.heads_kv = HKV, p.group = group;
  p.d = D, p.dv = D;
  p.scale = 1.0f / sqrtf((float)D);
  p.window_left = -1, p.window_right = Tq > 1 ? 0 : -1; /* Tq > 1: causal, as decode_bench's tq4 */
  p.align_bottom_right = 1;
  p.q = device_bf16((size_t)B * Tq * HQ * D, 1);
  p.q_b = (int64_t)Tq * HQ * D, p.q_r = HQ * D, p.q_h = D;
  check(cudaMalloc(&p.out, (size_t)B * Tq * HQ * D * 2), "cudaMalloc out");
  p.o_b = p.q_b, p.o_r = p.q_r, p.o_h = p.q_h;
  check(cudaMalloc(&p.lse, (size_t)B * HQ * Tq * 4), "cudaMalloc lse");
  p.lse_b = (int64_t)HQ * Tq, p.lse_h = Tq, p.lse_r = 1;
  const size_t kv = (size_t)B * Tk * HKV * D;
  p.k = device_bf16(kv, 2), p.v = device_bf16(kv, 3);
  p.k_r = p.v_r = HKV * D, p.k_h = p.v_h = D;
  if (page > 0) { /* each sequence's own pages, shuffled over the pool */
    const int M = (Tk + page - 1) / page, N = B * M;
    std::vector<int32_t> table(N), lens(B, Tk);
    for (int i = 0; i < N; ++i) table[i] = i;
    uint64_t x = 12345;
    for (int i = N - 1; i > 0; --i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      std::swap(table[i], table[(int)(x % (uint64_t)(i + 1))]);
    }
    int32_t *dt, *dl;
    check(cudaMalloc(&dt, sizeof(int32_t) * N), "cudaMalloc table");
    check(cudaMalloc(&dl, sizeof(int32_t) * B), "cudaMalloc lens");
    check(cudaMemcpy(dt, table.data(), sizeof(int32_t) * N, cudaMemcpyHostToDevice), "table");
    check(cudaMemcpy(dl, lens.data(), sizeof(int32_t) * B, cudaMemcpyHostToDevice), "lens");
    p.block_table = dt, p.bt_b = M, p.bt_p = 1;
    p.page_size = page, p.num_pages = N, p.cache_seqlens = dl;
    p.k_b = p.v_b = (int64_t)page * HKV * D;
  } else {
    p.k_b = p.v_b = (int64_t)Tk * HKV * D;
  }
  p.variant = attn_cuda_decode_variant();
  p.splits = attn_cuda_decode_splits(0, B, HKV, chunks, Tk, D, D, half_waves, p.variant);
  p.heads = attn_cuda_decode_heads(0, B, HKV, Tk, D, D, p.variant);
  const size_t ws = attn_cuda_decode_workspace(B, HKV, chunks, p.splits, D);
  if (ws > 0) check(cudaMalloc(&p.partials, ws), "cudaMalloc workspace");

  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  char why[256] = "";
  auto call = [&](int i) {
    p.timeline_call = i;
    if (attn_cuda_decode_forward(&p, 1, s, why, sizeof why) != ATTN_STATUS_OK) {
      fprintf(stderr, "decode: %s\n", why);
      exit(1);
    }
  };
  for (int i = 0; i < 3; ++i) call(CALLS + i);
  check(cudaStreamSynchronize(s), "warm-up");
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "capture");
  for (int i = 0; i < CALLS; ++i) call(i);
  check(cudaStreamEndCapture(s, &graph), "end capture");
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  const double warm_ms = getenv("TIMELINE_WARM_MS") ? atof(getenv("TIMELINE_WARM_MS")) : 200.0;
  for (float spent = 0.0f; spent < warm_ms;) { /* batches of 10 replays until warm_ms have passed */
    cudaEventRecord(e0, s);
    for (int r = 0; r < 10; ++r) check(cudaGraphLaunch(exec, s), "warm-up replay");
    cudaEventRecord(e1, s);
    check(cudaEventSynchronize(e1), "warm-up sync");
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    spent += ms;
  }
  std::vector<double> per_call;
  for (int r = 0; r < 7; ++r) {
    cudaEventRecord(e0, s);
    check(cudaGraphLaunch(exec, s), "replay");
    cudaEventRecord(e1, s);
    check(cudaEventSynchronize(e1), "replay sync");
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    if (r >= 2) per_call.push_back(ms * 1e3 / CALLS);
  }
  const size_t ring = sizeof(u64) * kTlCalls * kTlCtas * kTlEvents;
  std::vector<u64> sp(ring / 8), mg(ring / 8);
  check(cudaMemcpyFromSymbol(sp.data(), g_tl_split, ring), "split stamps");
  check(cudaMemcpyFromSymbol(mg.data(), g_tl_merge, ring), "merge stamps");
  auto at = [&](std::vector<u64> &v, int c, int cta, int e) -> u64 & {
    return v[((size_t)c * kTlCtas + cta) * kTlEvents + e];
  };
  const int split_ctas = std::min(p.splits * HKV * chunks * B, kTlCtas);
  const int merge_ctas = std::min(B * HKV * chunks * kRows, kTlCtas);
  auto first_start = [&](int c) {
    u64 t = ~0ull;
    for (int i = 0; i < split_ctas; ++i)
      if (at(sp, c, i, 0) != 0) t = std::min(t, at(sp, c, i, 0));
    return t;
  };
  auto last_exit = [&](int c) { /* the call's last CTA exit, merge kernel included */
    u64 t = 0;
    for (int i = 0; i < split_ctas; ++i) t = std::max(t, at(sp, c, i, 5));
    for (int i = 0; i < merge_ctas; ++i) t = std::max(t, at(mg, c, i, 2));
    return t;
  };
  int merges = 0;
  for (int i = 0; i < merge_ctas; ++i) merges += at(mg, 10, i, 0) != 0;
  std::vector<double> ghz; /* the SM clock of call 10's split CTAs */
  for (int i = 0; i < split_ctas; ++i)
    if (at(sp, 10, i, 0) != 0 && at(sp, 10, i, 5) > at(sp, 10, i, 0))
      ghz.push_back((double)at(sp, 10, i, 6) / (double)(at(sp, 10, i, 5) - at(sp, 10, i, 0)));
  printf("timeline B=%d Tk=%d Tq=%d page=%d half_waves=%d ATTN_CUDA_DECODE=%s warm-up %.0f ms: splits %d, "
         "split CTAs %d, merge CTAs %d; %.2f us per call (graph of %d, median of 5 replays); SM clock %.2f GHz\n",
         B, Tk, Tq, page, half_waves, getenv("ATTN_CUDA_DECODE") ? getenv("ATTN_CUDA_DECODE") : "(default)",
         warm_ms, p.splits, split_ctas, merges, pct(per_call, 0.5), CALLS, pct(ghz, 0.5));
  /* per event: median over calls of (first, median, last CTA) relative to T0 */
  struct Row {
    const char *name;
    bool merge;
    int event;
  };
  const Row rows[] = {{"split start", false, 0},  {"split wait done", false, 1}, {"split tile 0 landed", false, 2},
                      {"split tiles done", false, 3}, {"split partial out", false, 4}, {"split exit", false, 5},
                      {"merge start", true, 0},   {"merge wait done", true, 1},  {"merge exit", true, 2}};
  printf("  us from the call's first CTA start (median over calls 4-15): first / median / last CTA\n");
  std::vector<double> prev, next;
  for (int c = 4; c <= 15; ++c) {
    const double t0 = (double)first_start(c);
    prev.push_back(((double)last_exit(c - 1) - t0) * 1e-3);
    next.push_back(((double)first_start(c + 1) - t0) * 1e-3);
  }
  printf("  %-22s %8.2f\n", "previous call's exit", pct(prev, 0.5));
  for (const Row &r : rows) {
    std::vector<double> lo, mid, hi;
    for (int c = 4; c <= 15; ++c) {
      const double t0 = (double)first_start(c);
      std::vector<double> v;
      const int n = r.merge ? merge_ctas : split_ctas;
      for (int i = 0; i < n; ++i) {
        const u64 st = at(r.merge ? mg : sp, c, i, 0), t = at(r.merge ? mg : sp, c, i, r.event);
        if (st != 0 && t != 0) v.push_back(((double)t - t0) * 1e-3);
      }
      if (v.empty()) continue;
      lo.push_back(pct(v, 0.0)), mid.push_back(pct(v, 0.5)), hi.push_back(pct(v, 1.0));
    }
    if (lo.empty()) continue;
    printf("  %-22s %8.2f %8.2f %8.2f\n", r.name, pct(lo, 0.5), pct(mid, 0.5), pct(hi, 0.5));
  }
  printf("  %-22s %8.2f\n", "next call's first start", pct(next, 0.5));
  /* per CTA phases (median and max over the CTAs of call 10) and the SMs used */
  const char *phase[] = {"wait", "first tile", "other tiles", "epilogue", "merge in kernel"};
  printf("  call 10, per split CTA (median / max us):");
  for (int e = 0; e < 5; ++e) {
    std::vector<double> v;
    for (int i = 0; i < split_ctas; ++i) /* CTAs with tiles (an empty split stamps no first tile) */
      if (at(sp, 10, i, 0) != 0 && at(sp, 10, i, 2) != 0)
        v.push_back(((double)at(sp, 10, i, e + 1) - (double)at(sp, 10, i, e)) * 1e-3);
    printf(" %s %.2f / %.2f;", phase[e], pct(v, 0.5), pct(v, 1.0));
  }
  std::vector<int> per_sm(1024, 0);
  int sms = 0, most = 0;
  for (int i = 0; i < split_ctas; ++i)
    if (at(sp, 10, i, 0) != 0) {
      int &n = per_sm[at(sp, 10, i, kTlEvents - 1) & 1023];
      sms += n == 0, most = std::max(most, ++n);
    }
  u64 tick = ~0ull; /* the timer's resolution: the smallest nonzero step between stamps */
  std::vector<u64> all;
  for (int i = 0; i < split_ctas; ++i) all.push_back(at(sp, 10, i, 0));
  std::sort(all.begin(), all.end());
  for (size_t i = 1; i < all.size(); ++i)
    if (all[i] > all[i - 1]) tick = std::min(tick, all[i] - all[i - 1]);
  printf("\n  call 10: %d SMs, at most %d CTAs on one; smallest step between CTA starts %llu ns\n", sms, most,
         tick);
  if (csv != nullptr) {
    FILE *f = fopen(csv, "w");
    if (f != nullptr) {
      const double t0 = (double)first_start(10);
      fprintf(f, "kernel,cta,sm,e0,e1,e2,e3,e4,e5\n");
      for (int k = 0; k < 2; ++k) {
        std::vector<u64> &v = k ? mg : sp;
        const int n = k ? merge_ctas : split_ctas, ne = k ? 3 : 6;
        for (int i = 0; i < n; ++i) {
          if (at(v, 10, i, 0) == 0) continue;
          fprintf(f, "%s,%d,%llu", k ? "merge" : "split", i, at(v, 10, i, kTlEvents - 1));
          for (int e = 0; e < ne; ++e) fprintf(f, ",%.3f", ((double)at(v, 10, i, e) - t0) * 1e-3);
          fprintf(f, "\n");
        }
      }
      fclose(f);
    }
  }
  return 0;
}
