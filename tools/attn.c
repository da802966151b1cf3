/*
 * tools/attn.c - the `attn` command: information, benchmarks, tuning and checks from the shell.
 *
 *   attn info                    library version, CPU, GPUs, implementations, cache file
 *   attn bench [opts] PROBLEM... check each supporting implementation x configuration against the
 *                                f64 reference (a sample of a large problem's rows), then time it;
 *                                a table, --csv or --json
 *   attn tune [opts] PROBLEM...  autotune into the persistent cache (progress bar on a terminal)
 *   attn check [opts] PROBLEM... compare every implementation with the reference; print the errors
 *
 * A PROBLEM is one argument in the canonical problem string syntax (attn.h), e.g.
 *   attn bench "b4 hq32 hkv8 sq4096 sk4096 d128 bf16 causal"
 * and runs where its device says: on the CPU, or with device=cuda[:N] on that GPU, whose data the
 * harness copies there and back (harness.h), checked against the same host reference.
 *
 * Exit codes, for scripts: 0 success; 1 a check failed (check, or the validation step of bench);
 * 2 usage error (unknown option, unreadable or invalid problem); 3 library error (out of memory,
 * a problem larger than the memory there is, no implementation can run a problem, I/O).
 */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "core/device.h"
#include "capacity.h"
#include "harness.h"
#include "peak.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXIT_OK 0
#define EXIT_CHECK 1
#define EXIT_USAGE 2
#define EXIT_LIBRARY 3

typedef struct options {
  int backward;
  const char *impl, *config, *cache;
  int platform; /* attn_platform */
  int reps, warmup;
  double min_time, max_seconds;
  int iters;
  int threads;
  uint64_t seed;
  int csv, json, quiet;
  int nproblems;
  char **problems;
} options;

static const char *usage_main =
    "usage: attn <command> [options] [PROBLEM...]\n"
    "\n"
    "commands:\n"
    "  info     library version, CPU features, GPUs, implementations, cache file\n"
    "  bench    validate, then time every supporting implementation and configuration\n"
    "  tune     autotune problems into the persistent configuration cache\n"
    "  check    compare every implementation with the reference and print the errors\n"
    "  help     this text; `attn <command> --help` describes a command\n"
    "\n"
    "A PROBLEM is one argument, e.g. \"b4 hq32 hkv8 sq4096 sk4096 d128 bf16 causal\".\n"
    "Tokens: b<B> hq<Hq> hkv<Hkv> sq<Tq> sk<Tk> d<D> dv<Dv> f32|f16|bf16|f64 causal\n"
    "  window=L,R align=tl scale=S softcap=C dropout=P bias=BxHxTqxTk[:dtype] mask=BxHxTqxTk\n"
    "  alibi=h|bh sinks=S[:shared] segments varlen=packed:TQ,TK|padded op=sdpa device=cuda[:N]\n"
    "A problem runs on its device: the CPU, or with device=cuda[:N] that GPU (`attn info` lists\n"
    "them); bench and check compare either with the f64 reference on the CPU.\n"
    "\n"
    "A problem that cannot run here (no such device, no implementation, more memory than there\n"
    "is) is refused with one line before anything is measured.\n"
    "\n"
    "exit codes: 0 ok, 1 check failure, 2 usage error, 3 library error\n";

static const char *usage_bench =
    "usage: attn bench [options] [PROBLEM...]\n"
    "Checks each implementation x configuration that supports the problem against the f64\n"
    "reference (SPEC.md tolerances), then times it: warm-up, then the median of the runs.\n"
    "GFLOP/s counts forward 4*B*Hq*Tq*Tk*D (halved when causal), backward 2.5x that; %peak\n"
    "divides by this machine's f32 FMA peak, measured before the first CPU problem, times the\n"
    "threads used. A GPU problem (device=cuda[:N]) runs its inputs, outputs and workspace in\n"
    "device memory, each timed run ending when the GPU has finished; its table shows TFLOP/s and\n"
    "no %peak (nothing measures a GPU peak: peak_fraction is empty in --csv, null in --json).\n"
    "The f64 reference runs once per problem, on every CPU of the host. A problem whose\n"
    "reference costs more than 2^31 multiply-adds has a seeded sample checked (256 query rows\n"
    "with the first, last and tile-boundary ones, and for --backward the keys of one or two\n"
    "(batch, kv head) slices); the line above the table says which rows were checked.\n"
    "ATTN_BENCH_ROWS=all checks every row, =N samples N query rows; `attn check` checks all.\n"
    "Decode problems (sq <= 16, forward) also show KV GB/s, the K and V bytes the visible keys\n"
    "hold over the median time, and %bw, that over the memory read rate measured before the\n"
    "first one (STREAM-style); paged caches: paged=<page_size>[,<pages>[,<max_pages>]] new=<n>.\n"
    "Without a PROBLEM it runs the default table (`make bench`, the README's main job).\n"
    "  --backward       time forward + backward (and check the gradients)\n"
    "  --impl NAME      only this implementation     --config NAME  only this configuration\n"
    "  --platform P     only this platform (ref, cpu, cuda, cudnn)\n"
    "  --reps N         at least N timed runs (default 5)\n"
    "  --min-time S     and at least S seconds of them (default 0.2)\n"
    "  --warmup N       untimed runs first (default 2)\n"
    "  --threads N      threads for CPU implementations (default: their choice)\n"
    "  --seed N         seed of the random inputs (default 1)\n"
    "  --csv | --json   machine-readable output instead of the table\n"
    "exit: 0 all passed the check, 1 one failed it (it is not timed), 2 usage, 3 library error\n";

static const char *usage_tune =
    "usage: attn tune [options] PROBLEM...\n"
    "Autotunes each problem (every supporting implementation x configuration is timed on scratch\n"
    "data) and merges the winner into the persistent cache; plans made later with the same\n"
    "problem, device and implementations find it there. Results already cached are reported, not\n"
    "measured again.\n"
    "  --backward       time forward + backward (training)\n"
    "  --impl NAME      tune only this implementation's configurations\n"
    "  --platform P     only this platform (ref, cpu, cuda, cudnn)\n"
    "  --cache PATH     the cache file (default: $ATTN_CACHE_PATH, "
    "$XDG_CACHE_HOME/libattn/cache.txt\n"
    "                   or ~/.cache/libattn/cache.txt)\n"
    "  --warmup N       untimed runs per candidate (default 5)\n"
    "  --iters N        at most N timed runs per candidate (default 100; stops early once the\n"
    "                   median settles)\n"
    "  --max-seconds S  time budget per candidate (default 2)\n"
    "  --threads N      threads for CPU implementations\n"
    "  --quiet          no progress bar\n"
    "exit: 0 tuned (or found), 2 usage, 3 library error (e.g. the cache cannot be written)\n";

static const char *usage_check =
    "usage: attn check [options] PROBLEM...\n"
    "Compares every implementation x configuration that supports each problem with the f64\n"
    "reference and prints max |error| against the tolerance of SPEC.md for out and lse (and dq,\n"
    "dk, dv with --backward) over every row. A GPU problem (device=cuda[:N]) runs on that GPU\n"
    "on the same inputs, copied there; its outputs come back to the host to be compared.\n"
    "  --backward       check the gradients too\n"
    "  --impl NAME      only this implementation     --platform P  only this platform\n"
    "  --seed N         seed of the random inputs (default 1)\n"
    "  --threads N      threads for CPU implementations\n"
    "exit: 0 every comparison passed, 1 one failed, 2 usage, 3 library error\n";

static const char *usage_info =
    "usage: attn info [--cache PATH]\n"
    "Prints the library version, this CPU and its instruction sets, the usable GPUs (or why\n"
    "there are none), the registered implementations in order of preference, and the cache\n"
    "file with its entry count.\n"
    "exit: 0 ok, 2 usage\n";

static int usage_error(const char *usage, const char *fmt, const char *arg) {
  fprintf(stderr, "attn: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n%s", usage);
  return EXIT_USAGE;
}

/* A whole number option in [lo, hi]: 1 with *out set, else 0 with the message printed, naming the
 * option and its rule, e.g. "--threads: -3 is not a whole number >= 0". */
static int whole_option(const char *usage, const char *option, const char *text, long long lo,
                        long long hi, long long *out) {
  char *end;
  errno = 0;
  long long v = strtoll(text, &end, 10);
  int number = end != text && *end == '\0' && errno == 0;
  if (number && v >= lo && v <= hi) {
    *out = v;
    return 1;
  }
  fprintf(stderr, "attn: %s: %s is not a whole number %s %lld\n%s", option, text,
          number && v > hi ? "<=" : ">=", number && v > hi ? hi : lo, usage);
  return 0;
}

/* The seed: any whole number of 64 bits. */
static int seed_option(const char *usage, const char *text, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(text, &end, 10);
  if (end != text && *end == '\0' && errno == 0 && strchr(text, '-') == NULL) {
    *out = (uint64_t)v;
    return 1;
  }
  fprintf(stderr, "attn: --seed: %s is not a whole number from 0 to %llu\n%s", text,
          (unsigned long long)UINT64_MAX, usage);
  return 0;
}

/* The implementations' names, "ref, cpu, ...", for the message of an unknown one. */
static void impl_names(char *buf, size_t size) {
  size_t len = 0;
  buf[0] = '\0';
  for (int32_t i = 0; i < attn_impl_count() && len < size; ++i)
    len += (size_t)snprintf(buf + len, size - len, "%s%s", i ? ", " : "", attn_impl_name(i));
}

/* Parses options; returns -1 to go on, or an exit code. */
static int parse_options(int argc, char **argv, const char *usage, options *o) {
  memset(o, 0, sizeof *o);
  o->reps = 5, o->warmup = -1, o->min_time = 0.2, o->iters = 100, o->max_seconds = 2.0, o->seed = 1;
  o->problems = calloc((size_t)argc, sizeof *o->problems);
  for (int i = 0; i < argc; ++i) {
    const char *a = argv[i];
    const char *next = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED_VALUE                                                                                 \
  if (next == NULL) return usage_error(usage, "option %s needs a value", a);                       \
  ++i
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(usage, stdout);
      return EXIT_OK;
    } else if (strcmp(a, "--backward") == 0) {
      o->backward = 1;
    } else if (strcmp(a, "--csv") == 0) {
      o->csv = 1;
    } else if (strcmp(a, "--json") == 0) {
      o->json = 1;
    } else if (strcmp(a, "--quiet") == 0) {
      o->quiet = 1;
    } else if (strcmp(a, "--impl") == 0) {
      NEED_VALUE;
      o->impl = next;
    } else if (strcmp(a, "--config") == 0) {
      NEED_VALUE;
      o->config = next;
    } else if (strcmp(a, "--cache") == 0) {
      NEED_VALUE;
      o->cache = next;
    } else if (strcmp(a, "--platform") == 0) {
      NEED_VALUE;
      int found = -1;
      for (int p = 0; p < ATTN_PLATFORM_COUNT; ++p)
        if (strcmp(next, attn_platform_name((attn_platform)p)) == 0) found = p;
      if (found < 0)
        return usage_error(usage, "--platform %s: use auto, ref, cpu, cuda or cudnn", next);
      o->platform = found;
    } else if (strcmp(a, "--reps") == 0 || strcmp(a, "--iters") == 0) {
      NEED_VALUE;
      long long v;
      if (!whole_option(usage, a, next, 1, INT_MAX, &v)) return EXIT_USAGE;
      *(strcmp(a, "--reps") == 0 ? &o->reps : &o->iters) = (int)v;
    } else if (strcmp(a, "--warmup") == 0 || strcmp(a, "--threads") == 0) {
      NEED_VALUE;
      long long v;
      if (!whole_option(usage, a, next, 0, INT_MAX, &v)) return EXIT_USAGE;
      *(strcmp(a, "--warmup") == 0 ? &o->warmup : &o->threads) = (int)v;
    } else if (strcmp(a, "--seed") == 0) {
      NEED_VALUE;
      if (!seed_option(usage, next, &o->seed)) return EXIT_USAGE;
    } else if (strcmp(a, "--min-time") == 0 || strcmp(a, "--max-seconds") == 0) {
      NEED_VALUE;
      char *end;
      double d = strtod(next, &end);
      if (*end != '\0' || end == next || !(d >= 0.0) || !isfinite(d)) {
        fprintf(stderr, "attn: %s: %s is not a number of seconds >= 0\n%s", a, next, usage);
        return EXIT_USAGE;
      }
      if (strcmp(a, "--min-time") == 0)
        o->min_time = d;
      else
        o->max_seconds = d > 0 ? d : 1e-6;
    } else if (a[0] == '-' && a[1] == '-') {
      return usage_error(usage, "unknown option %s", a);
    } else {
      o->problems[o->nproblems++] = argv[i];
    }
#undef NEED_VALUE
  }
  if (o->csv && o->json) return usage_error(usage, "%s", "--csv and --json exclude each other");
  if (o->impl != NULL) { /* refused here, before any measuring, rather than as an empty table */
    int known = 0;
    for (int32_t i = 0; i < attn_impl_count(); ++i)
      known |= strcmp(o->impl, attn_impl_name(i)) == 0;
    if (!known) {
      char names[512];
      impl_names(names, sizeof names);
      fprintf(stderr,
              "attn: --impl %s: no implementation has that name (available here: %s; "
              "`attn info` says why any other is missing)\n%s",
              o->impl, names, usage);
      return EXIT_USAGE;
    }
  }
  return -1;
}

static attn_ctx *make_ctx(const options *o) {
  attn_ctx *ctx = NULL;
  if (attn_ctx_create(&ctx) != ATTN_STATUS_OK) return NULL;
  if (o->threads > 0) attn_ctx_set_num_threads(ctx, o->threads);
  return ctx;
}

/* Parses and validates a problem string; an exit code on failure, -1 on success. */
static int read_problem(attn_ctx *ctx, const char *text, attn_problem *p) {
  if (attn_problem_parse(ctx, text, p) != ATTN_STATUS_OK) {
    fprintf(stderr, "attn: %s\n", attn_ctx_last_error(ctx));
    return EXIT_USAGE;
  }
  attn_status st = attn_impl_supports(ctx, "ref", p); /* the reference runs every valid problem */
  if (st == ATTN_STATUS_INVALID_ARGUMENT) {
    fprintf(stderr, "attn: problem \"%s\" is invalid: %s\n", text, attn_ctx_last_error(ctx));
    return EXIT_USAGE;
  }
  return -1;
}

/* Calls fn for each implementation x configuration that matches the options and supports p (fn
 * NULL: only counts them). Why the implementations of p's device that do not support it say so
 * goes to skipped as "name: why; ..." when it is not NULL, else to the table as "  skipped:"
 * lines. */
typedef int (*candidate_fn)(void *user, const char *impl, const char *config);

static int each_candidate(attn_ctx *ctx, const attn_problem *p, const options *o, candidate_fn fn,
                          void *user, int *count, char *skipped, size_t skipped_size) {
  *count = 0;
  size_t said = 0;
  if (skipped != NULL) skipped[0] = '\0';
  for (int32_t i = 0; i < attn_impl_count(); ++i) {
    const char *name = attn_impl_name(i);
    if (o->impl != NULL && strcmp(o->impl, name) != 0) continue;
    if (o->platform != ATTN_PLATFORM_AUTO && attn_impl_platform(i) != o->platform) continue;
    if (attn_impl_device(i) != p->device) continue; /* runs elsewhere: nothing to say */
    if (attn_impl_supports(ctx, name, p) != ATTN_STATUS_OK) {
      if (skipped == NULL && !o->csv && !o->json)
        printf("  skipped: %s\n", attn_ctx_last_error(ctx));
      else if (skipped != NULL && said < skipped_size)
        said += (size_t)snprintf(skipped + said, skipped_size - said, "%s%s", said ? "; " : "",
                                 attn_ctx_last_error(ctx));
      continue;
    }
    int32_t n = 0;
    attn_impl_config_count(ctx, name, p, &n);
    for (int32_t c = 0; c < n; ++c) {
      char config[128];
      attn_impl_config_name(ctx, name, p, c, config, sizeof config);
      if (o->config != NULL && strcmp(o->config, config) != 0) continue;
      ++*count;
      if (fn == NULL) continue;
      int rc = fn(user, name, config);
      if (rc >= 0) return rc;
    }
  }
  return -1;
}

/* The device a problem runs on, as `attn info` and problem strings write it: cpu, cuda:N. */
static const char *device_label(const attn_problem *p, char *buf, size_t size) {
  if (p->device == ATTN_DEVICE_CPU)
    snprintf(buf, size, "cpu");
  else
    snprintf(buf, size, "cuda:%d", (int)p->device_index);
  return buf;
}

/* Whether the problem can run here at all: its device present, an implementation matching the
 * options for it, and memory for what the command does with it (use; backward: with the
 * gradients). Otherwise 0, with one message on stderr saying why, before anything is measured
 * or a table started. */
static int runnable_here(attn_ctx *ctx, const attn_problem *p, const char *text, const options *o,
                         h_use use) {
  char why[2048], skipped[1536], device[32];
  if (!h_device_usable(p, why, sizeof why)) {
    fprintf(stderr, "attn: \"%s\": %s\n", text, why);
    return 0;
  }
  int count = 0;
  each_candidate(ctx, p, o, NULL, NULL, &count, skipped, sizeof skipped);
  if (count == 0) {
    fprintf(stderr, "attn: \"%s\": no implementation that runs on %s%s supports it%s%s%s\n",
            text, device_label(p, device, sizeof device),
            o->impl || o->config || o->platform != ATTN_PLATFORM_AUTO ? " and matches the options"
                                                                      : "",
            skipped[0] ? " (" : "", skipped, skipped[0] ? ")" : "");
    return 0;
  }
  const char *what = use == H_USE_CHECK
                         ? "its tensors, and the reference's f64 results"
                         : "its tensors";
  if (!h_fits(p, h_need_of(p, o->backward, use), what, why, sizeof why)) {
    fprintf(stderr, "attn: \"%s\" cannot run here: %s\n", text, why);
    return 0;
  }
  return 1;
}

/* ---- bench and check --------------------------------------------------------------------------- */

/* `attn bench` without a PROBLEM: small enough that the f64 reference, timed beside the fast
 * implementations, keeps the whole table around a minute on a 2-core machine. */
static const char *const default_forward[] = {
    "b1 hq8 hkv8 sq512 sk512 d64 f32",              /* the plain problem */
    "b1 hq8 hkv8 sq512 sk512 d64 f32 causal",       /* causal */
    "b1 hq8 hkv2 sq512 sk512 d64 f32 causal",       /* grouped-query: 4 query heads per kv head */
    "b1 hq8 hkv8 sq512 sk512 d64 bf16 causal",      /* bf16 inputs, f32 accumulation */
    "b1 hq8 hkv8 sq512 sk512 d64 f16 causal",       /* f16 inputs */
    "b1 hq8 hkv8 sq512 sk512 d64 f32 window=127,0", /* sliding window of 128 keys */
    "b8 hq16 hkv4 sq1 sk4096 d64 bf16 paged=16",     /* decode from a paged KV cache: KV GB/s */
};
static const char *const default_backward[] = {
    "b1 hq8 hkv8 sq512 sk512 d64 f32 causal",  /* backward: dq, dk, dv */
    "b1 hq8 hkv2 sq512 sk512 d64 bf16 causal", /* backward, bf16, grouped-query */
};

/* The machine's f32 FMA rate for the %peak column: one thread's, times the threads the CPU
 * implementations use (--threads, else every logical CPU: their default). */
typedef struct machine_peak {
  double gflops;
  int threads;
} machine_peak;

static machine_peak measure_machine(const options *o, int print) {
  const attn_cpu_info *cpu = attn_cpu_info_get();
  bench_peak one = bench_measure_peak(0.5);
  machine_peak m = {one.gflops, o->threads > 0 ? o->threads : cpu->logical_cpus};
  if (print)
    printf("machine: %s, %d logical CPUs; f32 FMA peak %.1f GFLOP/s per thread (%s), %%peak "
           "against %d thread%s = %.1f GFLOP/s\n\n",
           cpu->model, cpu->logical_cpus, one.gflops, one.isa, m.threads, m.threads == 1 ? "" : "s",
           one.gflops * m.threads);
  return m;
}

typedef struct bench_state {
  attn_ctx *ctx;
  const options *o;
  const char *text;
  attn_problem problem;
  h_oracle *oracle; /* the problem's reference, made once for all its candidates */
  int failed, library_error, rows;
  double peak_gflops; /* of the machine, for the threads used; 0 for a GPU problem (none) */
  int decode;         /* Tq <= 16: K+V GB/s is the rate that matters (docs/DECODE.md) */
  double read_gbps;   /* the CPU's measured memory read rate, for %bw; 0 for a GPU problem */
} bench_state;

static void json_string(const char *s) {
  putchar('"');
  for (; *s; ++s) {
    if (*s == '"' || *s == '\\') putchar('\\');
    putchar(*s);
  }
  putchar('"');
}

static int bench_one(void *user, const char *impl, const char *config) {
  bench_state *b = user;
  const options *o = b->o;
  h_check c = h_check_run(b->ctx, b->oracle, impl, config);
  double median = 0.0, gflops = 0.0;
  int runs = 0;
  const char *verdict = "ok";
  double ratio = 0.0;
  for (int i = 0; i < c.compared; ++i)
    if (c.tol[i] > 0) ratio = fmax(ratio, c.err[i] / c.tol[i]);
  char why[1024] = "";
  if (c.status != ATTN_STATUS_OK) {
    verdict = "error";
    snprintf(why, sizeof why, "%s", attn_ctx_last_error(b->ctx));
    b->library_error = 1;
  } else if (!c.ok) {
    verdict = "FAIL";
    b->failed = 1;
  } else {
    int warmup = o->warmup >= 0 ? o->warmup : 2;
    attn_status st =
        h_time(b->ctx, b->oracle, impl, config, warmup, o->reps, o->min_time, &median, &runs);
    if (st != ATTN_STATUS_OK) {
      verdict = "error";
      snprintf(why, sizeof why, "%s", attn_ctx_last_error(b->ctx));
      b->library_error = 1;
    } else if (median > 0) {
      gflops = h_flops(&b->problem, o->backward) / (median * 1e3);
    }
  }
  /* Decode problems: K+V bytes read per second, and the fraction of the measured read rate. */
  const double kv_gbps = b->decode && median > 0 ? h_kv_bytes(&b->problem) / (median * 1e3) : 0.0;
  const double bw_fraction = b->read_gbps > 0 ? kv_gbps / b->read_gbps : 0.0;
  char kv_text[32] = "", bw_text[32] = "";
  if (b->decode) snprintf(kv_text, sizeof kv_text, "%.4g", kv_gbps);
  if (b->decode && b->read_gbps > 0) snprintf(bw_text, sizeof bw_text, "%.4g", bw_fraction);
  /* The fraction of the machine's peak, where there is one: the tool measures the CPU's f32 FMA
   * rate, but nothing that stands for a GPU's (its tensor-core peak depends on the dtype, the clocks
   * and the part), so a GPU row leaves the column blank rather than invent a number. */
  const int on_gpu = b->problem.device != ATTN_DEVICE_CPU;
  double peak_fraction = !on_gpu && b->peak_gflops > 0 ? gflops / b->peak_gflops : 0.0;
  char peak_text[32] = "";
  const h_rows *checked = h_oracle_rows(b->oracle);
  if (o->csv) {
    if (!on_gpu) snprintf(peak_text, sizeof peak_text, "%.4g", peak_fraction);
    printf("\"%s\",%s,%s,%s,%.3g,%.3f,%.4g,%s,%d,%lld,%lld,%lld,%lld,%s,%s\n", b->text, impl,
           config, verdict, ratio, median, gflops, peak_text, runs,
           (long long)checked->query_checked, (long long)checked->query_total,
           (long long)checked->key_checked, (long long)checked->key_total, kv_text, bw_text);
  } else if (o->json) {
    if (on_gpu)
      snprintf(peak_text, sizeof peak_text, "null");
    else
      snprintf(peak_text, sizeof peak_text, "%.4g", peak_fraction);
    printf("%s  {\"problem\": ", b->rows ? ",\n" : "");
    json_string(b->text);
    printf(", \"impl\": ");
    json_string(impl);
    printf(", \"config\": ");
    json_string(config);
    printf(", \"check\": \"%s\", \"err_over_tol\": %.3g, \"median_us\": %.3f, \"gflops\": %.4g, "
           "\"peak_fraction\": %s, \"runs\": %d, \"pass\": \"%s\", \"checked_query_rows\": %lld, "
           "\"query_rows\": %lld, \"checked_key_rows\": %lld, \"key_rows\": %lld, "
           "\"check_seed\": %llu, \"kv_gbps\": %s, \"bw_fraction\": %s}",
           verdict, ratio, median, gflops, peak_text, runs, o->backward ? "fwd+bwd" : "fwd",
           (long long)checked->query_checked, (long long)checked->query_total,
           (long long)checked->key_checked, (long long)checked->key_total,
           (unsigned long long)checked->seed, kv_text[0] ? kv_text : "null",
           bw_text[0] ? bw_text : "null");
  } else {
    /* A GPU's rate reads in TFLOP/s, as GPU rates are quoted (the table's header names the unit). */
    if (on_gpu)
      snprintf(peak_text, sizeof peak_text, "%7s", "-");
    else
      snprintf(peak_text, sizeof peak_text, "%6.1f%%", 100.0 * peak_fraction);
    char kv_cols[64] = "", bw_cell[32] = "-";
    if (b->read_gbps > 0) snprintf(bw_cell, sizeof bw_cell, "%.1f%%", 100.0 * bw_fraction);
    if (b->decode) snprintf(kv_cols, sizeof kv_cols, " %9.1f %6s", kv_gbps, bw_cell);
    printf("  %-8s %-16s %-5s %8.3g %12.1f %9.3f %s %5d%s%s%s\n", impl, config, verdict, ratio,
           median, on_gpu ? gflops * 1e-3 : gflops, peak_text, runs, kv_cols, why[0] ? "  " : "",
           why);
  }
  b->rows++;
  return -1;
}

static int check_one(void *user, const char *impl, const char *config) {
  bench_state *b = user;
  h_check c = h_check_run(b->ctx, b->oracle, impl, config);
  if (c.status != ATTN_STATUS_OK) {
    printf("  %-8s %-16s error: %s\n", impl, config, attn_ctx_last_error(b->ctx));
    b->library_error = 1;
    return -1;
  }
  static const char *const names[5] = {"out", "lse", "dq", "dk", "dv"};
  printf("  %-8s %-16s %s ", impl, config, c.ok ? "ok  " : "FAIL");
  for (int i = 0; i < c.compared; ++i)
    printf(" %s %.2e/%.2e%s", names[i], c.err[i], c.tol[i], c.err[i] <= c.tol[i] ? "" : "!");
  printf("\n");
  if (!c.ok) b->failed = 1;
  return -1;
}

static int run_problems_with(options *o, int check);

/* ATTN_BENCH_ROWS: how many query rows bench checks against the reference: "all" (or 0) every one,
 * N a seeded sample of N (and N / 2 keys per slice) whenever there are more, unset or "auto" a
 * sample of H_SAMPLE_ROWS for a problem whose reference costs more than H_FULL_CHECK_WORK. */
static int read_sample_rows(int64_t *rows) {
  const char *text = getenv("ATTN_BENCH_ROWS");
  *rows = H_SAMPLE_AUTO;
  if (text == NULL || text[0] == '\0' || strcmp(text, "auto") == 0) return 1;
  if (strcmp(text, "all") == 0) return *rows = 0, 1;
  char *end;
  long long v = strtoll(text, &end, 10);
  if (*end == '\0' && end != text && v >= 0) return *rows = v, 1;
  fprintf(stderr, "attn: ATTN_BENCH_ROWS=%s: use auto, all, or a whole number of query rows\n",
          text);
  return 0;
}

static int run_problems(int argc, char **argv, const char *usage, int check) {
  options o;
  int rc = parse_options(argc, argv, usage, &o);
  if (rc >= 0) return free(o.problems), rc;
  if (o.nproblems == 0 && check)
    return free(o.problems), usage_error(usage, "%s", "no PROBLEM given");
  if (o.nproblems == 0) { /* the default table: forward problems, then backward ones */
    free(o.problems);
    o.nproblems = (int)(sizeof default_forward / sizeof *default_forward);
    o.problems = malloc(sizeof(char *) * (size_t)o.nproblems);
    if (o.problems == NULL) return EXIT_LIBRARY;
    for (int i = 0; i < o.nproblems; ++i) o.problems[i] = (char *)default_forward[i];
    if (!o.backward) {
      int rc_fwd = run_problems_with(&o, check);
      o.backward = 1;
      o.nproblems = (int)(sizeof default_backward / sizeof *default_backward);
      for (int i = 0; i < o.nproblems; ++i) o.problems[i] = (char *)default_backward[i];
      int rc_bwd = run_problems_with(&o, check);
      free(o.problems);
      return rc_fwd > rc_bwd ? rc_fwd : rc_bwd;
    }
  }
  rc = run_problems_with(&o, check);
  free(o.problems);
  return rc;
}

/* bench or check over o->problems; returns the exit code. */
static int run_problems_with(options *o_in, int check) {
  options o = *o_in;
  int rc = -1;
  attn_ctx *ctx = make_ctx(&o);
  if (ctx == NULL) return EXIT_LIBRARY;
  static machine_peak peak;       /* measured once per process, before the first CPU problem */
  static double read_gbps;        /* likewise, before the first CPU decode problem */
  static int32_t gpu_stated = -1; /* the GPU whose fingerprint the table stated last */
  int failed = 0, library_error = 0, rows = 0;
  int64_t sample_rows = H_SAMPLE_AUTO;
  if (!check && !read_sample_rows(&sample_rows)) {
    attn_ctx_destroy(ctx);
    return EXIT_USAGE;
  }
  if (!check && o.csv)
    printf("problem,impl,config,check,err_over_tol,median_us,gflops,peak_fraction,runs,"
           "checked_query_rows,query_rows,checked_key_rows,key_rows,kv_gbps,bw_fraction\n");
  if (!check && o.json) printf("[\n");
  for (int i = 0; i < o.nproblems && rc < 0; ++i) {
    bench_state b;
    memset(&b, 0, sizeof b);
    b.ctx = ctx, b.o = &o, b.text = o.problems[i], b.rows = rows;
    rc = read_problem(ctx, b.text, &b.problem);
    if (rc >= 0) break;
    char canonical[1024];
    attn_problem_to_string(&b.problem, canonical, sizeof canonical);
    const int on_gpu = b.problem.device != ATTN_DEVICE_CPU;
    const int table = check || (!o.csv && !o.json);
    /* Bench and check both compare with the reference, so both need its copies. */
    if (!runnable_here(ctx, &b.problem, b.text, &o, H_USE_CHECK)) {
      library_error = 1;
      continue;
    }
    if (!check && !on_gpu && peak.gflops == 0.0) peak = measure_machine(&o, table);
    if (!on_gpu) b.peak_gflops = peak.gflops * peak.threads;
    b.decode = b.problem.seqlen_q <= 16 && !o.backward;
    if (!check && !on_gpu && b.decode && read_gbps == 0.0) {
      read_gbps = bench_measure_read_gbps(o.threads, 1.0);
      if (table)
        printf("memory: read %.1f GB/s (STREAM-style sum of 512 MiB, %d thread%s): %%bw of a "
               "decode problem divides its K+V GB/s by it\n\n",
               read_gbps, peak.threads, peak.threads == 1 ? "" : "s");
    }
    if (!on_gpu && b.decode) b.read_gbps = read_gbps;
    if (table && on_gpu && gpu_stated != b.problem.device_index) {
      char fingerprint[512];
      attn_device_fingerprint(ATTN_DEVICE_CUDA, b.problem.device_index, fingerprint,
                              sizeof fingerprint);
      printf("gpu %d: %s\n\n", (int)b.problem.device_index, fingerprint);
      gpu_stated = b.problem.device_index;
    }
    if (table) printf("%s%s\n", canonical, o.backward ? "  (forward + backward)" : "");
    /* The reference once for every candidate (harness.h): bench samples the rows of a large
     * problem, check compares them all. */
    if (h_oracle_make(ctx, &b.problem, o.backward, o.seed, check ? 0 : sample_rows, &b.oracle) !=
        ATTN_STATUS_OK) {
      fprintf(stderr, "attn: \"%s\": %s\n", b.text, attn_ctx_last_error(ctx)); /* said once */
      library_error = 1;
      continue;
    }
    if (table) {
      char rows[512];
      h_oracle_describe(b.oracle, rows, sizeof rows);
      printf("  checked against the f64 reference: %s\n", rows);
      if (!check)
        printf("  %-8s %-16s %-5s %8s %12s %9s %7s %5s%s\n", "impl", "config", "check", "err/tol",
               "median_us", on_gpu ? "TFLOP/s" : "GFLOP/s", "%peak", "runs",
               b.decode ? "  KV GB/s    %bw" : "");
    }
    int count = 0;
    each_candidate(ctx, &b.problem, &o, check ? check_one : bench_one, &b, &count, NULL, 0);
    h_oracle_free(b.oracle);
    failed |= b.failed;
    library_error |= b.library_error;
    rows = b.rows;
  }
  if (!check && o.json && rc < 0) printf("\n]\n");
  attn_ctx_destroy(ctx);
  if (rc >= 0) return rc;
  return failed ? EXIT_CHECK : library_error ? EXIT_LIBRARY : EXIT_OK;
}

/* ---- tune -------------------------------------------------------------------------------------- */

typedef struct tune_state {
  int tty, quiet;
  int kind;    /* the last event's kind */
  int started; /* a TUNE_START since the plan began: measuring was tried */
  int warnings;
  char failure[512]; /* the last failure's message: why tuning gave up, when it did */
} tune_state;

static void tune_event(void *user, const attn_event *ev) {
  tune_state *t = user;
  if (ev->kind == ATTN_EVENT_KIND_FAILURE) {
    fprintf(stderr, "attn: warning: %s\n", ev->message);
    snprintf(t->failure, sizeof t->failure, "%s", ev->message);
    t->warnings++;
    return;
  }
  t->kind = ev->kind;
  if (ev->kind == ATTN_EVENT_KIND_TUNE_START) t->started = 1;
  if (ev->kind == ATTN_EVENT_KIND_TUNE_CANDIDATE && t->tty && !t->quiet) {
    int width = 30, done = (ev->index + 1) * width / (ev->count > 0 ? ev->count : 1);
    printf("\r  [%.*s%*s] %d/%d %-28.28s", done, "##############################", width - done, "",
           (int)ev->index + 1, (int)ev->count, ev->message);
    fflush(stdout);
  }
  if (ev->kind == ATTN_EVENT_KIND_TUNE_FINISH && t->tty && !t->quiet) printf("\r%*s\r", 80, "");
}

static int cmd_tune(int argc, char **argv) {
  options o;
  int rc = parse_options(argc, argv, usage_tune, &o);
  if (rc >= 0) return free(o.problems), rc;
  if (o.nproblems == 0) return free(o.problems), usage_error(usage_tune, "%s", "no PROBLEM given");
  attn_ctx *ctx = make_ctx(&o);
  if (ctx == NULL) return free(o.problems), EXIT_LIBRARY;
  attn_policy pol;
  attn_policy_init(&pol);
  pol.allow_autotune = 1;
  pol.on_miss = ATTN_ON_MISS_AUTOTUNE;
  pol.persist = 1;
  pol.tune_backward = o.backward;
  pol.warmup_iters = o.warmup >= 0 ? o.warmup : 5;
  pol.measure_iters = o.iters;
  pol.max_seconds = o.max_seconds;
  pol.cache_path = o.cache;
  attn_ctx_set_policy(ctx, &pol);
  tune_state t = {isatty(STDOUT_FILENO), o.quiet, -1, 0, 0, ""};
  attn_ctx_set_event_callback(ctx, tune_event, &t);
  char path[4096];
  attn_cache_get_path(ctx, path, sizeof path);
  if (path[0] == '\0') {
    fprintf(stderr, "attn: no cache file: set --cache, ATTN_CACHE_PATH, XDG_CACHE_HOME or HOME\n");
    rc = EXIT_LIBRARY;
  }
  int library_error = 0;
  for (int i = 0; i < o.nproblems && rc < 0; ++i) {
    attn_problem p;
    rc = read_problem(ctx, o.problems[i], &p);
    if (rc >= 0) break;
    /* The tuner times candidates on scratch tensors of the problem's size, on its device. */
    if (!runnable_here(ctx, &p, o.problems[i], &o, H_USE_TUNE)) {
      library_error = 1;
      continue;
    }
    attn_select sel;
    attn_select_init(&sel);
    sel.impl = o.impl;
    sel.platform = o.platform;
    t.kind = -1;
    t.started = 0;
    t.failure[0] = '\0';
    int warnings = t.warnings;
    attn_plan *plan = NULL;
    attn_status st = attn_plan_create(ctx, &p, &sel, &plan);
    char canonical[1024];
    attn_problem_to_string(&p, canonical, sizeof canonical);
    if (st != ATTN_STATUS_OK) {
      fprintf(stderr, "attn: %s: %s\n", canonical, attn_ctx_last_error(ctx));
      library_error = 1;
      continue;
    }
    /* Measuring began but chose nothing: every candidate (or the scratch data) failed and the plan
     * fell back to the heuristic's pick, which is not a tuning result. */
    if (t.started && t.kind != ATTN_EVENT_KIND_TUNE_FINISH) {
      fprintf(stderr, "attn: %s: not tuned: %s\n", canonical,
              t.failure[0] ? t.failure : "no candidate could be timed");
      library_error = 1;
      attn_plan_destroy(plan);
      continue;
    }
    const char *how = t.kind == ATTN_EVENT_KIND_TUNE_FINISH        ? "tuned"
                      : t.kind == ATTN_EVENT_KIND_CACHE_HIT_DISK   ? "already in the cache"
                      : t.kind == ATTN_EVENT_KIND_CACHE_HIT_MEMORY ? "already tuned"
                      : t.kind == ATTN_EVENT_KIND_HEURISTIC ? "the only candidate: nothing to tune"
                      : t.kind == ATTN_EVENT_KIND_OVERRIDE  ? "the only candidate: nothing to tune"
                                                            : "selected";
    printf("%s -> %s %s (%s)\n", canonical, attn_plan_impl_name(plan), attn_plan_config_name(plan),
           how);
    if (t.kind == ATTN_EVENT_KIND_TUNE_FINISH && t.warnings > warnings) library_error = 1;
    attn_plan_destroy(plan);
  }
  int64_t disk = 0;
  attn_cache_count(ctx, NULL, &disk);
  if (rc < 0 && path[0] != '\0') printf("cache: %s (%lld entries)\n", path, (long long)disk);
  attn_ctx_destroy(ctx);
  free(o.problems);
  if (rc >= 0) return rc;
  return library_error ? EXIT_LIBRARY : EXIT_OK;
}

/* ---- info -------------------------------------------------------------------------------------- */

static int cmd_info(int argc, char **argv) {
  options o;
  int rc = parse_options(argc, argv, usage_info, &o);
  free(o.problems);
  if (rc >= 0) return rc;
  if (o.nproblems > 0)
    return usage_error(usage_info, "info takes no PROBLEM (got \"%s\")", argv[0]);
  attn_ctx *ctx = make_ctx(&o);
  if (ctx == NULL) return EXIT_LIBRARY;
  if (o.cache != NULL) {
    attn_policy pol;
    attn_policy_init(&pol);
    pol.cache_path = o.cache;
    attn_ctx_set_policy(ctx, &pol);
  }
  const attn_cpu_info *cpu = attn_cpu_info_get();
  char fp[512];
  attn_device_fingerprint(ATTN_DEVICE_CPU, 0, fp, sizeof fp);
  printf("libattn %s\n", attn_version_string());
  printf("cpu: %s, %d logical CPUs\n", cpu->model, cpu->logical_cpus);
  printf("cpu features: %s\n", cpu->feature_names[0] ? cpu->feature_names : "(none detected)");
  /* The GPU modules: which loaded, from where, and why one did not (tests/test_modules.sh). */
  printf("gpu modules:\n");
  for (int32_t i = 0; i < attn_module_count(); ++i) {
    attn_module_status m;
    if (attn_module_info(i, &m) != ATTN_STATUS_OK) continue;
    if (m.loaded)
      printf("  %-6s loaded from %s\n", m.name, m.path);
    else
      printf("  %-6s not loaded: %s\n", m.name, m.message);
  }
  /* Only usable GPUs get a "gpu N:" line: scripts (tests/test_cli_gpu.sh) look for one. */
  char why[512];
  int32_t gpus = h_gpu_count(why, sizeof why);
  if (gpus == 0) printf("gpus: none usable: %s\n", why);
  for (int32_t i = 0; i < gpus; ++i) {
    char gfp[512];
    attn_device_fingerprint(ATTN_DEVICE_CUDA, i, gfp, sizeof gfp);
    printf("gpu %d: %s\n", (int)i, gfp);
  }
  printf("fingerprint: %s\n", fp);
  printf("implementations, in order of preference:\n");
  for (int32_t i = 0; i < attn_impl_count(); ++i)
    printf("  %-10s platform %-6s device %-5s version %d\n", attn_impl_name(i),
           attn_platform_name((attn_platform)attn_impl_platform(i)),
           attn_impl_device(i) == ATTN_DEVICE_CUDA ? "cuda" : "cpu", (int)attn_impl_version(i));
  char path[4096];
  attn_cache_get_path(ctx, path, sizeof path);
  int64_t disk = 0;
  attn_cache_count(ctx, NULL, &disk);
  attn_policy pol;
  attn_ctx_get_policy(ctx, &pol);
  printf("cache: %s (%lld entries)\n", path[0] ? path : "(none)", (long long)disk);
  printf("policy: on a cache miss %s%s (ATTN_AUTOTUNE=1 autotunes, =0 never measures)\n",
         pol.allow_autotune && pol.on_miss == ATTN_ON_MISS_AUTOTUNE ? "autotune" : "heuristics",
         pol.allow_autotune ? "" : ", autotuning disabled");
  attn_ctx_destroy(ctx);
  return EXIT_OK;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fputs(usage_main, stderr);
    return EXIT_USAGE;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
    fputs(usage_main, stdout);
    return EXIT_OK;
  }
  if (strcmp(cmd, "--version") == 0) {
    printf("attn (libattn) %s\n", attn_version_string());
    return EXIT_OK;
  }
  if (strcmp(cmd, "info") == 0) return cmd_info(argc - 2, argv + 2);
  if (strcmp(cmd, "bench") == 0) return run_problems(argc - 2, argv + 2, usage_bench, 0);
  if (strcmp(cmd, "check") == 0) return run_problems(argc - 2, argv + 2, usage_check, 1);
  if (strcmp(cmd, "tune") == 0) return cmd_tune(argc - 2, argv + 2);
  fprintf(stderr, "attn: unknown command \"%s\"\n%s", cmd, usage_main);
  return EXIT_USAGE;
}
