/*
 * gpu/decode_bench.c - times decode (issue 14) on the GPU: bf16, Hq = 32, Hkv = 8, D = 128, the
 * K and V of B sequences of Tk keys, dense or in a paged pool (each sequence's own pages in
 * shuffled order, every sequence full), through libattn's cuda split-KV configurations and cudnn
 * when its module loads (dense caches, and the paged ones cuDNN's paged attention takes; a refusal
 * is a "#" line with the reason). Prints the device's copy rate first, then one CSV row per
 * (problem, implementation, configuration).
 *
 * Validation first: every configuration's out is compared, every row, with the dense problem on
 * the cuda implementation's main forward kernel ("deterministic", checked against the reference by
 * tests/test_cuda.c) on the same keys; a largest difference above 2% of the largest |out| (a few
 * bf16 roundings) is reported as "bad" and that row is not timed. maxdiff is that relative figure.
 *
 * Timing: 20 calls captured in a CUDA graph, the graph replayed 10 times after a warm-up (replays
 * for 100 ms, a precaution: the clocks of an idle GPU rise only after some work, and an engine
 * decoding keeps them up; the H200 measured 1.8 GHz with or without it), the median replay over
 * 20 (so the time is the GPU's, not the host's launch rate; an engine runs decode steps from
 * graphs too). bench/decode_bench.py times PyTorch the same way. The copy rate is
 * cudaMemcpyAsync of 1 GiB device to device, read + written bytes over the median time.
 *
 * usage: decode_bench [max_keys [problems [variants]]]
 *   max_keys  problems with B * Tk <= max_keys (default 524288)
 *   problems  only these B x Tk of the grid, e.g. "1x8192,64x8192" (default, or "all": every one)
 *   variants  only these variants, e.g. "dense,paged16" (default, or "all": every one)
 * The decode kernel's data paths follow ATTN_CUDA_DECODE (docs/DECODE.md), so runs with different
 * values of it compare them on the same problems.
 * rows: kind,variant,B,Tk,Tq,impl,config,us,kv_gbps,pct_copy,maxdiff
 *   kind "copy": the copy rate in GB/s in kv_gbps. variant: dense, paged16, paged64, sinks,
 *   softcap, window4k (causal, 4096 keys to the left), tq4 (Tq = 4, causal); and, only when
 *   named in `variants`, densehm: the dense cache stored head-major, [B, Hkv, Tk, D] (PyTorch's
 *   layout, passed as strides), so that each KV head's keys are one contiguous run rather than
 *   256-byte rows 2 KiB apart: a probe of how the memory system serves the kernel's reads.
 * Built by bench/decode_bench.sh (gcc against libattn.a and the CUDA runtime, like gpu/cuda_bench).
 */
#include "bench_common.h"

#include <math.h>

enum { HQ = 32, HKV = 8, D = 128, GRAPH_CALLS = 20, REPLAYS = 10, WARM_MS = 100 };

typedef struct variant {
  const char *name;
  int page, tq, sinks, window;
  double softcap;
  int head_major; /* dense K and V stored [B, Hkv, Tk, D] */
} variant;

static const variant variants[] = {
    {"dense", 0, 1, 0, 0, 0.0, 0},   {"paged16", 16, 1, 0, 0, 0.0, 0}, {"paged64", 64, 1, 0, 0, 0.0, 0},
    {"sinks", 16, 1, 1, 0, 0.0, 0},  {"softcap", 16, 1, 0, 0, 30.0, 0}, {"window4k", 16, 1, 0, 4096, 0.0, 0},
    {"tq4", 16, 4, 0, 0, 0.0, 0},    {"densehm", 0, 1, 0, 0, 0.0, 1},
};
enum { V_PLAIN = 3, V_FEATURES = 7, V_HEAD_MAJOR = 7 }; /* plain grid 0..2, features 3..6 */

static double copy_rate_gbps(void) {
  const size_t bytes = (size_t)1 << 30;
  void *a, *b;
  BENCH_CUDA_CHECK(cudaMalloc(&a, bytes));
  BENCH_CUDA_CHECK(cudaMalloc(&b, bytes));
  BENCH_CUDA_CHECK(cudaMemset(a, 1, bytes));
  cudaEvent_t e0, e1;
  BENCH_CUDA_CHECK(cudaEventCreate(&e0));
  BENCH_CUDA_CHECK(cudaEventCreate(&e1));
  float ms[12];
  for (int i = -2; i < 12; ++i) {
    BENCH_CUDA_CHECK(cudaEventRecord(e0, 0));
    BENCH_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0));
    BENCH_CUDA_CHECK(cudaEventRecord(e1, 0));
    BENCH_CUDA_CHECK(cudaEventSynchronize(e1));
    if (i >= 0) BENCH_CUDA_CHECK(cudaEventElapsedTime(&ms[i], e0, e1));
  }
  BENCH_CUDA_CHECK(cudaFree(a));
  BENCH_CUDA_CHECK(cudaFree(b));
  return 2.0 * (double)bytes / (bench_median(ms, 12) * 1e-3) / 1e9;
}

/* n bf16 values on the device: a random block of 16M values repeated (real data, cheap to make). */
static void *device_random(size_t n, uint64_t seed) {
  const size_t block = (size_t)1 << 24;
  void *src = bench_random_bf16(block, seed), *d;
  BENCH_CUDA_CHECK(cudaMalloc(&d, n * 2));
  for (size_t i = 0; i < n; i += block)
    BENCH_CUDA_CHECK(cudaMemcpy((char *)d + i * 2, src, (n - i < block ? n - i : block) * 2,
                                cudaMemcpyDeviceToDevice));
  BENCH_CUDA_CHECK(cudaFree(src));
  return d;
}

static uint16_t *download_out(const attn_outputs *o, size_t n) {
  uint16_t *h = malloc(n * 2);
  BENCH_CUDA_CHECK(cudaMemcpy(h, o->out.data, n * 2, cudaMemcpyDeviceToHost));
  return h;
}

static float bf16_to_float(uint16_t x) {
  uint32_t bits = (uint32_t)x << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

typedef struct bench_data {
  void *q, *k, *v, *kpool, *vpool, *sinks, *out, *lse, *table, *lens;
  size_t max_keys;
} bench_data;

/* Runs one forward of plan; 0 on failure (message printed). */
static int forward(attn_ctx *ctx, attn_plan *plan, const attn_inputs *in, void *ws, size_t wsz,
                   attn_outputs *o) {
  if (attn_plan_forward(plan, in, ws, wsz, o) != ATTN_STATUS_OK) {
    fprintf(stderr, "forward failed: %s\n", attn_ctx_last_error(ctx));
    return 0;
  }
  return 1;
}

/* One replay of GRAPH_CALLS calls between two events on s: the graph exec, or (NULL: the capture
 * failed) the calls one by one. Its time in ms; negative when a call failed. */
static float replay_ms(attn_ctx *ctx, attn_plan *plan, const attn_inputs *in, void *ws, size_t wsz,
                       attn_outputs *o, cudaStream_t s, cudaGraphExec_t exec, cudaEvent_t e0,
                       cudaEvent_t e1) {
  BENCH_CUDA_CHECK(cudaEventRecord(e0, s));
  if (exec != NULL) BENCH_CUDA_CHECK(cudaGraphLaunch(exec, s));
  else
    for (int i = 0; i < GRAPH_CALLS; ++i)
      if (!forward(ctx, plan, in, ws, wsz, o)) return -1.0f;
  BENCH_CUDA_CHECK(cudaEventRecord(e1, s));
  BENCH_CUDA_CHECK(cudaEventSynchronize(e1));
  float t;
  BENCH_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
  return t;
}

/* Median time of one call in microseconds, from graph replays (eager calls when the capture
 * fails); negative on failure. */
static double time_plan(attn_ctx *ctx, attn_plan *plan, const attn_inputs *in, void *ws, size_t wsz,
                        attn_outputs *o, cudaStream_t s) {
  attn_plan_set_stream(plan, s);
  for (int i = 0; i < 3; ++i)
    if (!forward(ctx, plan, in, ws, wsz, o)) return -1.0;
  BENCH_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  int graphed = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
  for (int i = 0; graphed && i < GRAPH_CALLS; ++i) graphed = forward(ctx, plan, in, ws, wsz, o);
  if (cudaStreamEndCapture(s, &graph) != cudaSuccess || !graphed ||
      cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
    graphed = 0;
    (void)cudaGetLastError();
  }
  cudaEvent_t e0, e1;
  BENCH_CUDA_CHECK(cudaEventCreate(&e0));
  BENCH_CUDA_CHECK(cudaEventCreate(&e1));
  /* warm-up: replays until WARM_MS have passed, so the GPU's clocks have risen as under an
   * engine's steady decoding */
  const cudaGraphExec_t replayed = graphed ? exec : NULL;
  for (float spent = 0.0f; spent < WARM_MS;) {
    const float t = replay_ms(ctx, plan, in, ws, wsz, o, s, replayed, e0, e1);
    if (t < 0.0f) return -1.0;
    spent += t;
  }
  float ms[REPLAYS];
  for (int r = -2; r < REPLAYS; ++r) {
    const float t = replay_ms(ctx, plan, in, ws, wsz, o, s, replayed, e0, e1);
    if (t < 0.0f) return -1.0;
    if (r >= 0) ms[r] = t;
  }
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  attn_plan_set_stream(plan, NULL);
  return bench_median(ms, REPLAYS) * 1e3 / GRAPH_CALLS;
}

static void run_problem(attn_ctx *ctx, bench_data *bd, const variant *var, int B, int Tk,
                        double copy_gbps, cudaStream_t s) {
  attn_problem p;
  attn_problem_init(&p);
  p.dtype = ATTN_DTYPE_BF16, p.device = ATTN_DEVICE_CUDA;
  p.batch = B, p.seqlen_q = var->tq, p.seqlen_k = Tk, p.heads_q = HQ, p.heads_kv = HKV;
  p.head_dim = D;
  p.causal = var->window > 0 || var->tq > 1;
  p.window_left = var->window > 0 ? var->window : -1;
  p.softcap = var->softcap;
  p.num_sinks = var->sinks;
  attn_problem dense = p;
  attn_inputs in, din;
  attn_inputs_init(&in);
  in.q = attn_tensor_dense(bd->q);
  in.k = attn_tensor_dense(bd->k), in.v = attn_tensor_dense(bd->v);
  if (var->sinks) in.sinks = attn_tensor_dense(bd->sinks);
  din = in;
  if (var->page > 0) { /* each sequence's pages shuffled over the pool, holding the dense rows */
    const int P = var->page, M = Tk / P;
    p.page_size = P;
    int32_t *table = malloc(sizeof(int32_t) * (size_t)B * M), *lens = malloc(sizeof(int32_t) * B);
    uint64_t x = 12345;
    for (int i = 0; i < B * M; ++i) table[i] = i;
    for (int i = B * M - 1; i > 0; --i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      int j = (int)(x % (uint64_t)(i + 1)), t = table[i];
      table[i] = table[j], table[j] = t;
    }
    const size_t page_bytes = (size_t)P * HKV * D * 2;
    for (int b = 0; b < B; ++b) {
      lens[b] = Tk;
      for (int i = 0; i < M; ++i) {
        const size_t from = ((size_t)b * M + i) * page_bytes, to = (size_t)table[b * M + i] * page_bytes;
        BENCH_CUDA_CHECK(cudaMemcpyAsync((char *)bd->kpool + to, (char *)bd->k + from, page_bytes,
                                         cudaMemcpyDeviceToDevice, 0));
        BENCH_CUDA_CHECK(cudaMemcpyAsync((char *)bd->vpool + to, (char *)bd->v + from, page_bytes,
                                         cudaMemcpyDeviceToDevice, 0));
      }
    }
    BENCH_CUDA_CHECK(cudaMemcpy(bd->table, table, sizeof(int32_t) * (size_t)B * M, cudaMemcpyHostToDevice));
    BENCH_CUDA_CHECK(cudaMemcpy(bd->lens, lens, sizeof(int32_t) * B, cudaMemcpyHostToDevice));
    free(table), free(lens);
    in.k = attn_tensor_dense(bd->kpool), in.v = attn_tensor_dense(bd->vpool);
    in.block_table = attn_tensor_dense(bd->table);
    in.cache_seqlens = bd->lens;
  }
  if (var->head_major) { /* the same keys, each (sequence, KV head)'s rows one contiguous run */
    const size_t row = (size_t)D * 2, run = (size_t)Tk * row;
    for (int b = 0; b < B; ++b)
      for (int g = 0; g < HKV; ++g) {
        const size_t from = ((size_t)b * Tk * HKV + g) * row, to = ((size_t)b * HKV + g) * run;
        BENCH_CUDA_CHECK(cudaMemcpy2DAsync((char *)bd->kpool + to, row, (char *)bd->k + from, HKV * row, row,
                                           (size_t)Tk, cudaMemcpyDeviceToDevice, 0));
        BENCH_CUDA_CHECK(cudaMemcpy2DAsync((char *)bd->vpool + to, row, (char *)bd->v + from, HKV * row, row,
                                           (size_t)Tk, cudaMemcpyDeviceToDevice, 0));
      }
    BENCH_CUDA_CHECK(cudaDeviceSynchronize());
    attn_tensor k = {bd->kpool, {(int64_t)HKV * Tk * D, D, (int64_t)Tk * D, 1}};
    attn_tensor v = {bd->vpool, {(int64_t)HKV * Tk * D, D, (int64_t)Tk * D, 1}};
    in.k = k, in.v = v;
  }
  attn_outputs o;
  attn_outputs_init(&o);
  o.out = attn_tensor_dense(bd->out), o.lse = attn_tensor_dense(bd->lse);
  const size_t n_out = (size_t)B * var->tq * HQ * D;
  const double keys = var->window > 0 && var->window + var->tq < Tk ? var->window + var->tq : Tk;
  const double kv_bytes = (double)B * keys * HKV * D * 2 * 2;

  /* the oracle: the dense problem on the main forward kernel */
  attn_select sel;
  attn_select_init(&sel);
  sel.impl = "cuda", sel.config = "deterministic";
  attn_plan *plan = NULL;
  uint16_t *want = NULL;
  if (attn_plan_create(ctx, &dense, &sel, &plan) == ATTN_STATUS_OK) {
    size_t wsz = 0;
    attn_plan_workspace_size(plan, &wsz, NULL);
    void *ws = NULL;
    if (wsz) BENCH_CUDA_CHECK(cudaMalloc(&ws, wsz));
    if (forward(ctx, plan, &din, ws, wsz, &o)) want = download_out(&o, n_out);
    if (ws) BENCH_CUDA_CHECK(cudaFree(ws));
    attn_plan_destroy(plan);
  }
  static const char *const cands[][2] = {{"cuda", "splitkv"}, {"cuda", "splitkv_half"},
                                         {"cuda", "splitkv_waves2"}, {"cudnn", NULL}};
  for (int c = 0; c < 4; ++c) {
    attn_select_init(&sel);
    sel.impl = cands[c][0], sel.config = cands[c][1];
    if (attn_plan_create(ctx, &p, &sel, &plan) != ATTN_STATUS_OK) {
      printf("# %s %s B%d Tk%d: %s\n", var->name, cands[c][0], B, Tk, attn_ctx_last_error(ctx));
      continue;
    }
    size_t wsz = 0;
    attn_plan_workspace_size(plan, &wsz, NULL);
    void *ws = NULL;
    if (wsz) BENCH_CUDA_CHECK(cudaMalloc(&ws, wsz));
    BENCH_CUDA_CHECK(cudaMemset(bd->out, 0, n_out * 2));
    double diff = INFINITY;
    if (forward(ctx, plan, &in, ws, wsz, &o) && want != NULL) {
      uint16_t *got = download_out(&o, n_out);
      double top = 0.0;
      diff = 0.0;
      for (size_t i = 0; i < n_out; ++i) {
        double d = fabs((double)bf16_to_float(got[i]) - (double)bf16_to_float(want[i]));
        if (!(d <= diff)) diff = d; /* NaN too */
        top = fmax(top, fabs((double)bf16_to_float(want[i])));
      }
      diff /= top > 0.0 ? top : 1.0;
      free(got);
    }
    const char *config = attn_plan_config_name(plan);
    if (!(diff <= 0.02)) {
      printf("bad,%s,%d,%d,%d,%s,%s,,,,%g\n", var->name, B, Tk, var->tq, cands[c][0], config, diff);
    } else {
      double us = time_plan(ctx, plan, &in, ws, wsz, &o, s);
      double gbps = kv_bytes / (us * 1e-6) / 1e9;
      printf("row,%s,%d,%d,%d,%s,%s,%.2f,%.1f,%.1f,%.3g\n", var->name, B, Tk, var->tq, cands[c][0],
             config, us, gbps, 100.0 * gbps / copy_gbps, diff);
    }
    fflush(stdout);
    if (ws) BENCH_CUDA_CHECK(cudaFree(ws));
    attn_plan_destroy(plan);
  }
  free(want);
}

/* Whether `name` is one of the comma-separated `list` (NULL or "all": everything). */
static int listed(const char *list, const char *name) {
  if (list == NULL || strcmp(list, "all") == 0) return 1;
  const size_t n = strlen(name);
  for (const char *at = list; (at = strstr(at, name)) != NULL; at += n)
    if ((at == list || at[-1] == ',') && (at[n] == ',' || at[n] == '\0')) return 1;
  return 0;
}

static int wanted(const char *problems, const char *variants, const variant *var, int B, int Tk) {
  char name[32];
  snprintf(name, sizeof name, "%dx%d", B, Tk);
  return listed(problems, name) && listed(variants, var->name);
}

int main(int argc, char **argv) {
  const size_t max_keys = argc > 1 ? (size_t)atol(argv[1]) : (size_t)1 << 19;
  const char *problems = argc > 2 ? argv[2] : NULL, *only = argc > 3 ? argv[3] : NULL;
  attn_ctx *ctx;
  if (attn_ctx_create(&ctx) != ATTN_STATUS_OK) return 1;
  const double copy = copy_rate_gbps();
  printf("kind,variant,B,Tk,Tq,impl,config,us,kv_gbps,pct_copy,maxdiff\n");
  printf("copy,,,,,,,,%.1f,100,\n", copy);
  bench_data bd;
  memset(&bd, 0, sizeof bd);
  const size_t kv = max_keys * HKV * D;
  bd.q = device_random((size_t)256 * 4 * HQ * D, 1);
  bd.k = device_random(kv, 2), bd.v = device_random(kv, 3);
  BENCH_CUDA_CHECK(cudaMalloc(&bd.kpool, kv * 2));
  BENCH_CUDA_CHECK(cudaMalloc(&bd.vpool, kv * 2));
  float sinks[HQ];
  for (int h = 0; h < HQ; ++h) sinks[h] = 0.5f + 0.05f * (float)h;
  BENCH_CUDA_CHECK(cudaMalloc(&bd.sinks, sizeof sinks));
  BENCH_CUDA_CHECK(cudaMemcpy(bd.sinks, sinks, sizeof sinks, cudaMemcpyHostToDevice));
  BENCH_CUDA_CHECK(cudaMalloc(&bd.out, (size_t)256 * 4 * HQ * D * 2));
  BENCH_CUDA_CHECK(cudaMalloc(&bd.lse, (size_t)256 * 4 * HQ * 4));
  BENCH_CUDA_CHECK(cudaMalloc(&bd.table, sizeof(int32_t) * max_keys));
  BENCH_CUDA_CHECK(cudaMalloc(&bd.lens, sizeof(int32_t) * 256));
  cudaStream_t s;
  BENCH_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  static const int batches[] = {1, 16, 64, 256}, lens[] = {2048, 8192, 32768};
  /* the plain grid: dense, paged 16 and 64, and the head-major probe when named */
  const int head_major = only != NULL && listed(only, "densehm") && strcmp(only, "all") != 0;
  for (int bi = 0; bi < 4; ++bi)
    for (int ti = 0; ti < 3; ++ti)
      for (int v = 0; v < V_PLAIN + 1; ++v) {
        const int vi = v < V_PLAIN ? v : V_HEAD_MAJOR;
        if (vi == V_HEAD_MAJOR && !head_major) continue;
        if ((size_t)batches[bi] * lens[ti] <= max_keys &&
            wanted(problems, only, &variants[vi], batches[bi], lens[ti]))
          run_problem(ctx, &bd, &variants[vi], batches[bi], lens[ti], copy, s);
      }
  /* the features and Tq = 4 beside paged 16, at B = 1 and 16 with Tk = 8192 and 32768 */
  static const int fb[] = {1, 16}, ft[] = {8192, 32768};
  for (int bi = 0; bi < 2; ++bi)
    for (int ti = 0; ti < 2; ++ti)
      for (int v = V_PLAIN; v < V_FEATURES; ++v)
        if ((size_t)fb[bi] * ft[ti] <= max_keys && wanted(problems, only, &variants[v], fb[bi], ft[ti]))
          run_problem(ctx, &bd, &variants[v], fb[bi], ft[ti], copy, s);
  attn_ctx_destroy(ctx);
  return 0;
}
