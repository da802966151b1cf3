/*
 * bench/dist_bench.c - attn_dist_bench: one sharded problem timed under mpiexec (the distributed
 * layer's benchmark; issue 12). Every rank prints its median time per pass and where it went
 * (blocks, waits), rank 0 the global throughput and how much of the communication was hidden.
 *
 *   mpiexec -n 4 attn_dist_bench "b1 hq32 hkv8 sq16384 d128 causal" --mesh seq:4 --layout zigzag
 *   mpiexec -n 1 attn_dist_bench "b1 hq32 hkv8 sq16384 d128 causal" --mesh seq:1 --threads 16
 *
 * Options: --mesh dim:n[,dim:n...] (dims: batch, heads, seq, none; default seq:<ranks>),
 * --strategy ring|alltoall, --layout contiguous|zigzag, --threads T (per rank), --iters N (default
 * 5), --forward (forward only; default forward + backward), --timeout S, --gpu (CUDA tensors over
 * NCCL: rank r on GPU r mod the GPUs it sees; built when NCCL was found, ATTN_BENCH_NCCL):
 *
 *   mpiexec -n 2 attn_dist_bench "b1 hq32 hkv8 sq131072 d128 bf16 causal" --gpu --layout zigzag
 *   mpiexec -n 1 attn_dist_bench "b1 hq32 hkv8 sq131072 d128 bf16 causal" --gpu --mesh seq:1
 *
 * Hidden communication: a ring step's transfer is also timed alone (the same bytes to the next
 * rank, no compute); hidden = 1 - wait / (steps - 1) x alone, the share of the transfer time the
 * blocks covered. Data are random; the result is not checked here (tests/mpi does that).
 */
#include "attn.h"
#include "attn_dist.h"

#include <math.h>
#include <mpi.h>
#ifdef ATTN_BENCH_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, size;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int parse_mesh(const char *text, attn_dist_spec *spec) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", text);
  spec->num_axes = 0;
  for (char *tok = strtok(buf, ","); tok != NULL; tok = strtok(NULL, ",")) {
    char *colon = strchr(tok, ':');
    if (colon == NULL || spec->num_axes == ATTN_DIST_MAX_AXES) return 0;
    *colon = '\0';
    int dim = strcmp(tok, "batch") == 0   ? ATTN_DIST_DIM_BATCH
              : strcmp(tok, "heads") == 0 ? ATTN_DIST_DIM_HEADS
              : strcmp(tok, "seq") == 0   ? ATTN_DIST_DIM_SEQUENCE
              : strcmp(tok, "none") == 0  ? ATTN_DIST_DIM_NONE
                                          : -1;
    if (dim < 0) return 0;
    spec->axis_dim[spec->num_axes] = dim;
    spec->axis_size[spec->num_axes] = atoi(colon + 1);
    spec->num_axes++;
  }
  return spec->num_axes > 0;
}

static int on_gpu = 0; /* --gpu: tensors on this rank's GPU, transport NCCL */

static void fill(void *data, attn_dtype dt, int64_t n, unsigned seed);

/* A tensor of n elements (random when seed != 0), in host memory or on this rank's GPU. */
static void *tensor(attn_dtype dt, int64_t n, unsigned seed) {
  const size_t bytes = (size_t)n * attn_dtype_size(dt) + 16;
  void *host = calloc(bytes, 1);
  if (host != NULL && seed != 0) fill(host, dt, n, seed);
#ifdef ATTN_BENCH_NCCL
  if (on_gpu) {
    void *dev = NULL;
    if (host == NULL || cudaMalloc(&dev, bytes) != cudaSuccess ||
        cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
      fprintf(stderr, "rank %d: no device memory for %zu bytes\n", rank, bytes);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    free(host);
    return dev;
  }
#endif
  return host;
}

static void release(void *p) {
#ifdef ATTN_BENCH_NCCL
  if (on_gpu) {
    cudaFree(p);
    return;
  }
#endif
  free(p);
}

static void fill(void *data, attn_dtype dt, int64_t n, unsigned seed) {
  for (int64_t i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    float x = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
    if (dt == ATTN_DTYPE_F32)
      ((float *)data)[i] = x;
    else { /* bf16 / f16 bits of small values: the top half of the f32 is bf16; f16 gets 1.0 */
      uint32_t u;
      memcpy(&u, &x, 4);
      ((uint16_t *)data)[i] = dt == ATTN_DTYPE_BF16 ? (uint16_t)(u >> 16) : (uint16_t)0x3c00;
    }
  }
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const char *problem_text = NULL;
  attn_dist_spec spec;
  attn_dist_spec_init(&spec);
  int iters = 5, threads = 0, backward = 1;
  for (int i = 1; i < argc; ++i) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : "";
    if (strcmp(a, "--mesh") == 0 && ++i) {
      if (!parse_mesh(v, &spec)) {
        if (rank == 0)
          fprintf(stderr, "--mesh %s: expected dim:n[,dim:n] with dim batch|heads|seq|none\n", v);
        MPI_Finalize();
        return 2;
      }
    } else if (strcmp(a, "--strategy") == 0 && ++i) {
      spec.strategy =
          strcmp(v, "alltoall") == 0 ? ATTN_DIST_STRATEGY_ALL_TO_ALL : ATTN_DIST_STRATEGY_RING;
    } else if (strcmp(a, "--layout") == 0 && ++i) {
      spec.layout =
          strcmp(v, "zigzag") == 0 ? ATTN_DIST_LAYOUT_ZIGZAG : ATTN_DIST_LAYOUT_CONTIGUOUS;
    } else if (strcmp(a, "--threads") == 0 && ++i) {
      threads = atoi(v);
    } else if (strcmp(a, "--iters") == 0 && ++i) {
      iters = atoi(v) > 0 ? atoi(v) : 1;
    } else if (strcmp(a, "--timeout") == 0 && ++i) {
      spec.timeout_seconds = atof(v);
    } else if (strcmp(a, "--forward") == 0) {
      backward = 0;
    } else if (strcmp(a, "--gpu") == 0) {
#ifdef ATTN_BENCH_NCCL
      on_gpu = 1;
#else
      if (rank == 0) fprintf(stderr, "--gpu: this attn_dist_bench was built without NCCL\n");
      MPI_Finalize();
      return 2;
#endif
    } else if (a[0] != '-') {
      problem_text = a;
    } else {
      if (rank == 0) fprintf(stderr, "unknown option %s\n", a);
      MPI_Finalize();
      return 2;
    }
  }
  if (problem_text == NULL) {
    if (rank == 0)
      fprintf(stderr, "usage: attn_dist_bench \"<problem string>\" [--mesh seq:N] ...\n");
    MPI_Finalize();
    return 2;
  }
  attn_ctx *ctx;
  attn_ctx_create(&ctx);
  if (threads > 0) attn_ctx_set_num_threads(ctx, threads);
  attn_problem p;
  attn_dist_plan *plan = NULL;
  MPI_Comm comm = MPI_COMM_WORLD;
  void *comm_arg = &comm;
  int32_t transport = ATTN_DIST_TRANSPORT_MPI;
#ifdef ATTN_BENCH_NCCL
  ncclComm_t nccl = NULL;
  cudaStream_t stream = NULL;
  int device = 0;
  if (on_gpu) { /* one GPU per rank, one NCCL communicator over the MPI ranks */
    int count = 1;
    cudaGetDeviceCount(&count);
    device = rank % (count > 0 ? count : 1);
    cudaSetDevice(device);
    ncclUniqueId id;
    if (rank == 0) ncclGetUniqueId(&id);
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (ncclCommInitRank(&nccl, size, id, rank) != ncclSuccess) {
      fprintf(stderr, "rank %d: ncclCommInitRank failed\n", rank);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    comm_arg = &nccl, transport = ATTN_DIST_TRANSPORT_NCCL;
  }
#endif
  int parsed = attn_problem_parse(ctx, problem_text, &p) == ATTN_STATUS_OK;
#ifdef ATTN_BENCH_NCCL
  if (on_gpu) p.device = ATTN_DEVICE_CUDA, p.device_index = device;
#endif
  if (!parsed ||
      attn_dist_plan_create(ctx, &p, &spec, transport, comm_arg, NULL, &plan) != ATTN_STATUS_OK) {
    if (rank == 0) fprintf(stderr, "attn_dist_bench: %s\n", attn_ctx_last_error(ctx));
    attn_ctx_destroy(ctx);
    MPI_Finalize();
    return 1;
  }
  attn_problem l;
  attn_dist_plan_local_problem(plan, &l, NULL);
  const attn_dtype dt = (attn_dtype)l.dtype;
  const size_t es = attn_dtype_size(dt);
  const int64_t Dv = l.head_dim_v ? l.head_dim_v : l.head_dim;
  const int64_t nq = l.batch * l.seqlen_q * l.heads_q * l.head_dim,
                nk = l.batch * l.seqlen_k * l.heads_kv * l.head_dim;
  const int64_t nv = l.batch * l.seqlen_k * l.heads_kv * Dv,
                no = l.batch * l.seqlen_q * l.heads_q * Dv;
  (void)es;
  void *q = tensor(dt, nq, 1u + (unsigned)rank), *k = tensor(dt, nk, 2u + (unsigned)rank);
  void *v = tensor(dt, nv, 3u + (unsigned)rank), *dout = tensor(dt, no, 4u + (unsigned)rank);
  void *out = tensor(dt, no, 0), *dq = tensor(dt, nq, 0), *dk = tensor(dt, nk, 0);
  void *dv = tensor(dt, nv, 0);
  void *lse = tensor(ATTN_DTYPE_F32, l.batch * l.heads_q * l.seqlen_q, 0);
#ifdef ATTN_BENCH_NCCL
  if (on_gpu) attn_dist_plan_set_stream(plan, stream);
#endif
  attn_inputs in;
  attn_inputs_init(&in);
  in.q = attn_tensor_dense(q), in.k = attn_tensor_dense(k), in.v = attn_tensor_dense(v);
  attn_outputs o;
  attn_outputs_init(&o);
  o.out = attn_tensor_dense(out), o.lse = attn_tensor_dense(lse);
  attn_grads g;
  attn_grads_init(&g);
  g.dq = attn_tensor_dense(dq), g.dk = attn_tensor_dense(dk), g.dv = attn_tensor_dense(dv);
  attn_tensor dout_t = attn_tensor_dense(dout);

  double *times = calloc((size_t)iters, sizeof(double)),
         *waits = calloc((size_t)iters, sizeof(double));
  double *computes = calloc((size_t)iters, sizeof(double));
  /* Per run, the time neither in the blocks nor waiting: the ring's host loops (merges, sums,
   * writing results out) and packing, the part a faster block cannot hide. */
  double *hosts = calloc((size_t)iters, sizeof(double));
  int steps = 0, blocks = 0, ok = 1;
  int64_t bytes = 0;
  for (int it = -1; it < iters && ok; ++it) { /* it = -1: warm-up (scratch, caches) */
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    attn_dist_stats fs, bs;
    memset(&bs, 0, sizeof bs);
    ok = attn_dist_plan_forward(plan, &in, &o) == ATTN_STATUS_OK;
    attn_dist_plan_last_stats(plan, &fs);
    if (ok && backward) {
      ok = attn_dist_plan_backward(plan, &in, &o, &dout_t, &g) == ATTN_STATUS_OK;
      attn_dist_plan_last_stats(plan, &bs);
    }
#ifdef ATTN_BENCH_NCCL
    if (on_gpu) cudaStreamSynchronize(stream); /* the passes return with their work queued */
#endif
    const double t = MPI_Wtime() - t0;
    if (it >= 0) {
      times[it] = t, waits[it] = fs.wait_seconds + bs.wait_seconds;
      computes[it] = fs.compute_seconds + bs.compute_seconds;
      hosts[it] = t - waits[it] - computes[it];
      steps = fs.steps + bs.steps, bytes = fs.bytes_sent + bs.bytes_sent;
      blocks = fs.blocks + bs.blocks;
    }
  }
  if (!ok) fprintf(stderr, "rank %d: %s\n", rank, attn_ctx_last_error(ctx));
  /* The same bytes as one ring step, alone: what each transfer costs when nothing hides it. */
  double alone = 0.0;
  if (size > 1 && steps > 1 && !on_gpu) { /* host memory only: a GPU's link is NCCL's */
    const size_t step_bytes = (size_t)(bytes / (steps > 0 ? steps : 1));
    char *sbuf = calloc(step_bytes + 1, 1), *rbuf = calloc(step_bytes + 1, 1);
    double samples[5];
    for (int r = 0; r < 5; ++r) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      MPI_Sendrecv(sbuf, (int)step_bytes, MPI_BYTE, (rank + 1) % size, 9, rbuf, (int)step_bytes,
                   MPI_BYTE, (rank + size - 1) % size, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      samples[r] = MPI_Wtime() - t0;
    }
    alone = median(samples, 5);
    free(sbuf), free(rbuf);
  }
  const double t = median(times, iters), w = median(waits, iters), c = median(computes, iters);
  const double host = median(hosts, iters);
  double worst = 0.0;
  MPI_Reduce(&t, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  printf(
      "rank %d: %.3f ms per %s, blocks %.3f ms, waiting %.3f ms, outside both %.3f ms, %d steps, "
      "%d block calls, %.1f MB sent\n",
      rank, 1e3 * t, backward ? "forward+backward" : "forward", 1e3 * c, 1e3 * w, 1e3 * host, steps,
      blocks, (double)bytes / 1e6);
  fflush(stdout);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0 && ok) {
    const double Dg = (double)p.head_dim, Dvg = (double)(p.head_dim_v ? p.head_dim_v : p.head_dim);
    double pairs = (double)p.batch * (double)p.heads_q * (double)p.seqlen_q * (double)p.seqlen_k;
    if (p.causal) pairs *= 0.5;
    double flops = 2.0 * pairs * (Dg + Dvg); /* S = Q K^T and O = P V */
    if (backward) flops *= 3.5;              /* + dV, dP, dQ, dK (and S again): 2.5x forward */
    const double hidden = steps > 1 && alone > 0 ? 1.0 - w / ((steps - 1) * alone) : 0.0;
    printf("%s, %d ranks (%s): %.3f ms (slowest rank), %.2f GFLOP/s; transfer alone %.3f ms per "
           "step, hidden %.0f%%\n",
           problem_text, size, attn_dist_plan_impl_name(plan), 1e3 * worst, flops / worst / 1e9,
           1e3 * alone, 100.0 * (hidden < 0 ? 0 : hidden));
  }
  attn_dist_plan_destroy(plan);
  attn_ctx_destroy(ctx);
  release(q), release(k), release(v), release(out), release(dout), release(dq), release(dk);
  release(dv), release(lse);
#ifdef ATTN_BENCH_NCCL
  if (on_gpu) cudaStreamDestroy(stream), ncclCommDestroy(nccl);
#endif
  free(times), free(waits), free(computes), free(hosts);
  MPI_Finalize();
  return ok ? 0 : 1;
}
