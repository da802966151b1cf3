/*
 * tools/capacity.h - whether a problem fits this machine's memory, asked before any data is made.
 *
 * The library accepts every problem whose tensors have at most 2^56 elements (SPEC.md), far more
 * than any machine holds. Left alone, `attn check` of such a problem allocates lazily (calloc
 * succeeds under overcommit) and then grinds for minutes filling pages, or is killed. The commands
 * ask here first and refuse a problem that cannot fit with one message saying how much it needs
 * and how much there is; the harness asks again before allocating the data of each run.
 *
 * Sizes are doubles: a byte count of a huge problem can exceed size_t, and a message needs no more
 * than three digits of it.
 */
#ifndef ATTN_TOOLS_CAPACITY_H
#define ATTN_TOOLS_CAPACITY_H

#include "attn.h"

#include <stddef.h>

/* What a command does with a problem, which decides the memory it needs. */
typedef enum h_use {
  H_USE_RUN,   /* one run: its tensors, on the host and for a GPU problem on the device as well
                  (the harness keeps the host copy), e.g. timing */
  H_USE_TUNE,  /* the tuner's scratch tensors: on the problem's device; a GPU problem's pass
                  through the host one tensor at a time */
  H_USE_CHECK, /* a run compared with the reference: also the reference's f64 results on the
                  host (and for f16/bf16 the naive run's), as the oracle of harness.h keeps them */
} h_use;

/* Bytes of memory needed, on the host and on the problem's GPU (0 for a CPU problem). */
typedef struct h_need {
  double host, device;
} h_need;

/* Bytes of the tensors of one run of the problem: inputs and outputs, and with backward dout and
 * the gradients too, at their dtypes (at least one element each, as the harness allocates). */
double h_tensor_bytes(const attn_problem *problem, int backward);

/* What a use of the problem needs, before any implementation's workspace (the harness checks each
 * plan's own when it makes it). */
h_need h_need_of(const attn_problem *problem, int backward, h_use use);

/* Bytes of host memory available now (Linux: MemAvailable, less where the control group's limit
 * or the address-space limit, ulimit -v, leaves less room), 0 when unknown. */
double h_host_available(void);

/* 1 when need fits: host bytes within what is available now, and a GPU problem's device bytes
 * allocatable on its device (probed with one allocation, released at once). Else 0 and one
 * sentence in why, "needs 21.4 GiB of host memory ..., more than the 7.9 GiB available". what
 * names what is counted, e.g. "its tensors, and the reference's f64 results". */
int h_fits(const attn_problem *problem, h_need need, const char *what, char *why, size_t why_size);

/* A byte count for people: "512 B", "3.0 KiB", "21.4 GiB", "1.2e+06 TiB". */
void h_format_bytes(double bytes, char *buf, size_t size);

#endif /* ATTN_TOOLS_CAPACITY_H */
