/*
 * tools/capacity.c - whether a problem fits this machine's memory (capacity.h).
 */
#define _DEFAULT_SOURCE /* sysconf's _SC_AVPHYS_PAGES, where /proc/meminfo is missing */
#include "capacity.h"

#include "core/dtype.h"
#include "core/gpu.h"
#include "core/tensors.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* Bytes of one role's buffer, at least one element (harness.c's role_bytes, in double). */
static double role_bytes(const attn_problem *p, attn_role role) {
  int64_t n = attn_role_numel(p, role);
  return (double)(n > 0 ? n : 1) * (double)attn_dtype_size(attn_role_dtype(p, role));
}

double h_tensor_bytes(const attn_problem *p, int backward) {
  double bytes = 0.0;
  for (int r = 0; r < ATTN_ROLE_COUNT; ++r)
    if (attn_role_needed(p, (attn_role)r, backward)) bytes += role_bytes(p, (attn_role)r);
  return bytes;
}

/* Bytes of a role's buffer at a given element size (the reference's results: f64, or the naive
 * run's in the problem's dtype). */
static double role_bytes_as(const attn_problem *p, attn_role role, size_t element) {
  int64_t n = attn_role_numel(p, role);
  return (double)(n > 0 ? n : 1) * (double)element;
}

/* What the oracle (harness.c: h_oracle_make) keeps beside the data: the reference's out, lse and
 * (backward) dq in f64, dk and dv as f64 sums (counted for every key: a full check has them all),
 * the same twice again in the problem's dtype for f16/bf16 (the naive and the at-dtype runs),
 * once more in f64 for a f16/bf16 backward (the run fed each candidate's out and lse), and per
 * thread an f64 accumulator of one (batch, kv head)'s key gradients per run. */
static double oracle_bytes(const attn_problem *p, int backward) {
  const int low = p->dtype == ATTN_DTYPE_F16 || p->dtype == ATTN_DTYPE_BF16;
  const size_t dtype = attn_dtype_size((attn_dtype)p->dtype);
  const size_t stat = attn_dtype_size(attn_stat_dtype((attn_dtype)p->dtype));
  const double at_dtype = low ? 2.0 : 0.0; /* runs whose results are in the dtype */
  double bytes = role_bytes_as(p, ATTN_ROLE_OUT, 8) + role_bytes_as(p, ATTN_ROLE_LSE, 8);
  bytes +=
      at_dtype * (role_bytes_as(p, ATTN_ROLE_OUT, dtype) + role_bytes_as(p, ATTN_ROLE_LSE, stat));
  if (!backward) return bytes;
  const double runs = 1.0 + at_dtype;
  if (low) /* the fed run: its out, lse, dq, dk and dv in f64 */
    bytes += role_bytes_as(p, ATTN_ROLE_OUT, 8) + role_bytes_as(p, ATTN_ROLE_LSE, 8) +
             role_bytes_as(p, ATTN_ROLE_DQ, 8) + role_bytes_as(p, ATTN_ROLE_DK, 8) +
             role_bytes_as(p, ATTN_ROLE_DV, 8);
  bytes += role_bytes_as(p, ATTN_ROLE_DQ, 8) + at_dtype * role_bytes_as(p, ATTN_ROLE_DQ, dtype);
  bytes += runs * (role_bytes_as(p, ATTN_ROLE_DK, 8) + role_bytes_as(p, ATTN_ROLE_DV, 8));
  int threads = 1;
#ifdef _OPENMP
  threads = omp_get_max_threads();
#endif
  const double keys = (double)(p->varlen == ATTN_VARLEN_PACKED ? p->total_k : p->seqlen_k);
  const double dv = (double)(p->head_dim_v > 0 ? p->head_dim_v : p->head_dim);
  bytes += (double)threads * keys * ((double)p->head_dim + dv) * runs * 8.0;
  return bytes;
}

h_need h_need_of(const attn_problem *p, int backward, h_use use) {
  h_need need = {0.0, 0.0};
  double run = h_tensor_bytes(p, backward), largest = 0.0;
  for (int r = 0; r < ATTN_ROLE_COUNT; ++r)
    if (attn_role_needed(p, (attn_role)r, backward) && role_bytes(p, (attn_role)r) > largest)
      largest = role_bytes(p, (attn_role)r);
  if (p->device == ATTN_DEVICE_CPU)
    need.host = run;
  else if (use == H_USE_TUNE) /* each scratch tensor is made on the host, copied, then freed */
    need.host = largest, need.device = run;
  else /* made on the host, then copied to the device; the host copy stays for the comparison */
    need.host = need.device = run;
  if (use == H_USE_CHECK) need.host += oracle_bytes(p, backward);
  return need;
}

/* The first number in a file, or -1 (also for "max", cgroup v2's "no limit"). */
static double read_number(const char *path) {
  FILE *f = fopen(path, "r");
  if (f == NULL) return -1.0;
  unsigned long long v = 0;
  int ok = fscanf(f, "%llu", &v) == 1;
  fclose(f);
  return ok ? (double)v : -1.0;
}

/* Room left under the memory limit of this process's control group as a container sees it (v2,
 * then v1), or -1 when there is none: in a container MemAvailable is the host's, and going past
 * the group's limit is the OOM killer, not a failed allocation. */
static double cgroup_room(void) {
  static const char *const files[2][2] = {
      {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
      {"/sys/fs/cgroup/memory/memory.limit_in_bytes",
       "/sys/fs/cgroup/memory/memory.usage_in_bytes"}};
  for (int v = 0; v < 2; ++v) {
    double limit = read_number(files[v][0]), used = read_number(files[v][1]);
    if (limit < 0.0 || used < 0.0) continue;
    if (limit >= 0x1p60) return -1.0; /* "unlimited" is written as a page-rounded 2^63 in v1 */
    return limit > used ? limit - used : 0.0;
  }
  return -1.0;
}

/* Room left under this process's address-space limit (ulimit -v), or -1 when there is none:
 * past it malloc fails however much memory the machine has. */
static double rlimit_room(void) {
  struct rlimit limit;
  if (getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return -1.0;
  double used = 0.0;
  FILE *f = fopen("/proc/self/status", "r");
  if (f != NULL) {
    char line[256];
    unsigned long long kib = 0;
    while (fgets(line, sizeof line, f) != NULL)
      if (sscanf(line, "VmSize: %llu kB", &kib) == 1) used = (double)kib * 1024.0;
    fclose(f);
  }
  double cap = (double)limit.rlim_cur;
  return cap > used ? cap - used : 0.0;
}

double h_host_available(void) {
  double available = 0.0;
  FILE *f = fopen("/proc/meminfo", "r");
  if (f != NULL) {
    char line[256];
    unsigned long long kib = 0;
    int found = 0;
    while (!found && fgets(line, sizeof line, f) != NULL)
      found = sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
    fclose(f);
    if (found) available = (double)kib * 1024.0;
  }
#ifdef _SC_AVPHYS_PAGES
  if (available == 0.0) {
    long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) available = (double)pages * (double)page;
  }
#endif
  double rooms[2] = {cgroup_room(), rlimit_room()};
  for (int i = 0; i < 2; ++i)
    if (rooms[i] >= 0.0 && (available == 0.0 || rooms[i] < available)) available = rooms[i];
  return available;
}

void h_format_bytes(double bytes, char *buf, size_t size) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (u < 4 && bytes >= 1024.0) bytes /= 1024.0, ++u;
  if (u == 0)
    snprintf(buf, size, "%.0f B", bytes);
  else
    snprintf(buf, size, bytes < 1e4 ? "%.1f %s" : "%.3g %s", bytes, units[u]);
}

int h_fits(const attn_problem *p, h_need need, const char *what, char *why, size_t why_size) {
  char needed[64], have[64];
  double available = h_host_available();
  if (available > 0.0 && need.host > available) {
    h_format_bytes(need.host, needed, sizeof needed);
    h_format_bytes(available, have, sizeof have);
    snprintf(why, why_size, "needs %s of host memory (%s), more than the %s available", needed,
             what, have);
    return 0;
  }
  if (p->device == ATTN_DEVICE_CPU || need.device <= 0.0) return 1;
  /* Nothing in the GPU services says how much device memory is free; one allocation of the whole
   * amount answers, and fails at once when it is too much. */
  h_format_bytes(need.device, needed, sizeof needed);
  const attn_gpu_ops *gpu = attn_gpu();
  if (gpu == NULL) return 1; /* the device check says why the problem cannot run */
  if (need.device >= (double)SIZE_MAX) {
    snprintf(why, why_size, "needs %s of memory on cuda:%d (%s), more than any GPU has", needed,
             (int)p->device_index, what);
    return 0;
  }
  void *probe = NULL;
  char reason[256] = "";
  if (gpu->alloc(p->device_index, (size_t)need.device, &probe, reason, sizeof reason) !=
      ATTN_STATUS_OK) {
    snprintf(why, why_size,
             "needs %s of memory on cuda:%d (%s), and that much cannot be allocated "
             "there (%s)",
             needed, (int)p->device_index, what, reason);
    return 0;
  }
  gpu->release(p->device_index, probe);
  return 1;
}
