/*
 * attn.h - the public contract of libattn, a library of exact attention kernels.
 *
 * This is the only header a user includes. It defines the function every implementation computes
 * (SPEC.md in the source tree), the objects that hold it, and the calls that run it. Everything here
 * compiles as C11 and as C++; no CUDA header is included.
 *
 * Shape of the API (FFTW / cuDNN style):
 *
 *   attn_ctx_create        one per thread of use; holds the last error message and the log callback
 *   attn_problem_init      fills an attn_problem with defaults; the caller sets sizes and features
 *   attn_plan_create       validates the problem and selects an implementation through the registry
 *   attn_plan_forward      out (and optionally lse, probabilities) from q, k, v and the optional inputs
 *   attn_plan_backward     dq, dk, dv (and optionally dbias, dsinks) from dout, out and lse
 *   attn_plan_destroy
 *   attn_forward / attn_backward   one-call conveniences that create, run and destroy a plan
 *
 * Ownership: the library borrows every tensor, workspace and stream it is given for the duration of
 * the call and keeps none of them. Objects made by a _create are freed by the matching _destroy,
 * which accepts NULL. An _init function fills caller memory and never allocates.
 *
 * Errors: every fallible call returns an attn_status (0 = ATTN_STATUS_OK). When a call that takes a
 * context fails, attn_ctx_last_error() holds a message naming the argument and the rule that was
 * broken, for example "heads_q=6 is not a multiple of heads_kv=4". The library never prints, exits
 * or aborts; diagnostics go to a log callback that is silent unless the user installs one.
 *
 * Thread safety: functions that take no context (version, status strings, the registry listing) may
 * be called from any thread at any time. A context, and every plan made from it, may be used by one
 * thread at a time; use one context per thread for concurrent work. Distinct contexts share nothing
 * mutable.
 *
 * ABI policy: status codes and enum values are only ever appended. Public structs are filled by their
 * _init function; a change to a function's signature is made as a new function with a _v2 suffix,
 * never by changing the old one. ATTN_VERSION_MAJOR changes only when that promise is broken.
 */
#ifndef ATTN_H
#define ATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(ATTN_SHARED_BUILD)
#define ATTN_API __declspec(dllexport)
#elif defined(__GNUC__)
#define ATTN_API __attribute__((visibility("default")))
#else
#define ATTN_API
#endif

/* ---------------------------------------------------------------------------------------------
 * Version
 * ------------------------------------------------------------------------------------------- */

#define ATTN_VERSION_MAJOR 0
#define ATTN_VERSION_MINOR 1
#define ATTN_VERSION_PATCH 0
/* One integer that orders versions: major * 10000 + minor * 100 + patch. */
#define ATTN_VERSION (ATTN_VERSION_MAJOR * 10000 + ATTN_VERSION_MINOR * 100 + ATTN_VERSION_PATCH)

/* The version of the library linked at run time; equals ATTN_VERSION when header and library match. */
ATTN_API int32_t attn_version(void);
/* "MAJOR.MINOR.PATCH" of the library linked at run time. Static storage; never NULL. */
ATTN_API const char *attn_version_string(void);

/* ---------------------------------------------------------------------------------------------
 * Status codes. One table generates the enum and the strings; codes are only ever appended.
 * ------------------------------------------------------------------------------------------- */

#define ATTN_STATUS_MAP(X)                                                                         \
  X(OK, 0, "ok")                                                                                   \
  X(INVALID_ARGUMENT, 1, "invalid argument")                                                       \
  X(UNSUPPORTED, 2, "unsupported by the implementation")                                          \
  X(OUT_OF_MEMORY, 3, "out of memory")                                                             \
  X(DEVICE_ERROR, 4, "device error")                                                               \
  X(IO_ERROR, 5, "input/output error")                                                             \
  X(INTERNAL, 6, "internal error")

typedef enum attn_status {
#define ATTN_STATUS_ENUM_(name, code, text) ATTN_STATUS_##name = code,
  ATTN_STATUS_MAP(ATTN_STATUS_ENUM_)
#undef ATTN_STATUS_ENUM_
  ATTN_STATUS_COUNT
} attn_status;

/* A short English description of a status ("invalid argument"); "unknown status" for a value outside
 * the table. Static storage; never NULL. */
ATTN_API const char *attn_status_string(attn_status status);

/* ---------------------------------------------------------------------------------------------
 * Enumerations of the problem description
 * ------------------------------------------------------------------------------------------- */

typedef enum attn_dtype {
  ATTN_DTYPE_F32 = 0,
  ATTN_DTYPE_F16 = 1,
  ATTN_DTYPE_BF16 = 2,
  ATTN_DTYPE_F64 = 3, /* the reference implementation only: for gradient checks and oracles */
  ATTN_DTYPE_U8 = 4,  /* masks */
  ATTN_DTYPE_I32 = 5, /* segment ids, sequence lengths */
  /* OCP FP8 E4M3FN (torch.float8_e4m3fn): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no
   * infinities, one NaN pattern (S.1111.111), largest finite value 448. q, k, v of a forward-only
   * problem with per-tensor descale factors; out is bf16, f16 or f32 (attn_problem.out_dtype).
   * docs/FP8.md defines the computation. */
  ATTN_DTYPE_F8E4M3 = 6,
  ATTN_DTYPE_COUNT
} attn_dtype;

/* Size in bytes of one element; 0 for a value outside the enum. */
ATTN_API size_t attn_dtype_size(attn_dtype dtype);
/* "f32", "f16", "bf16", "f64", "u8", "i32", "f8e4m3"; "unknown" outside the enum. */
ATTN_API const char *attn_dtype_name(attn_dtype dtype);

/* Conversions between f32 and the 16-bit formats, held in uint16_t: bf16 (bfloat16) and f16 (IEEE
 * binary16). f32 -> 16 bits rounds to nearest, ties to even (what PyTorch's .to() and the GPU
 * conversions do), overflows to infinity and keeps NaN a NaN; 16 bits -> f32 is exact. These are
 * the library's own conversions, so values prepared with them are the ones it reads. */
ATTN_API uint16_t attn_f32_to_bf16(float value);
ATTN_API float attn_bf16_to_f32(uint16_t bits);
ATTN_API uint16_t attn_f32_to_f16(float value);
ATTN_API float attn_f16_to_f32(uint16_t bits);
/* The same for f8e4m3 (OCP E4M3FN) in a uint8_t. f32 -> e4m3 rounds to nearest, ties to even, and
 * saturates: a finite value beyond 448 in magnitude (and an infinity) becomes +-448, as NVIDIA's
 * __NV_SATFINITE conversion and quantisers do (e4m3 has no infinity); NaN becomes NaN (0x7f, with
 * the sign). e4m3 -> f32 is exact. */
ATTN_API uint8_t attn_f32_to_f8e4m3(float value);
ATTN_API float attn_f8e4m3_to_f32(uint8_t bits);

/* The two operations of SPEC.md. Both compute the same function; scaled_dot_product_attention
 * materialises the scores of one (batch, head) and may return the probabilities. */
typedef enum attn_operation {
  ATTN_OPERATION_FLASH_ATTENTION = 0,
  ATTN_OPERATION_SCALED_DOT_PRODUCT_ATTENTION = 1,
  ATTN_OPERATION_COUNT
} attn_operation;

/* Where the diagonal of a causal mask or a window sits when Tq != Tk. Bottom-right puts the last
 * query on the last key (offset o = Tk - Tq: FlashAttention >= 2.1, cuDNN); top-left puts the first
 * query on the first key (o = 0: PyTorch's is_causal). */
typedef enum attn_align {
  ATTN_ALIGN_BOTTOM_RIGHT = 0,
  ATTN_ALIGN_TOP_LEFT = 1,
  ATTN_ALIGN_COUNT
} attn_align;

typedef enum attn_alibi {
  ATTN_ALIBI_NONE = 0,
  ATTN_ALIBI_PER_HEAD = 1,       /* slopes [Hq] */
  ATTN_ALIBI_PER_BATCH_HEAD = 2, /* slopes [B, Hq] */
  ATTN_ALIBI_COUNT
} attn_alibi;

/* Descale factors of an f8e4m3 problem (docs/FP8.md): q, k and v are read as q_descale * q, and so
 * on, in f32. FlashAttention-3 takes one factor per (batch entry, KV head); one per tensor is its
 * broadcast, the form of per-tensor quantisation. */
typedef enum attn_descale {
  ATTN_DESCALE_NONE = 0,             /* every factor 1: the descale tensors are not read */
  ATTN_DESCALE_TENSOR = 1,           /* q_descale, k_descale, v_descale: [1] each */
  ATTN_DESCALE_PER_BATCH_KV_HEAD = 2, /* [B, Hkv] each: query head h reads (b, h / (Hq / Hkv)) */
  ATTN_DESCALE_COUNT
} attn_descale;

typedef enum attn_varlen {
  ATTN_VARLEN_NONE = 0,
  /* Packed ("THD"): q is [total_q, Hq, D], k and v [total_k, Hkv, D|Dv], out [total_q, Hq, Dv],
   * lse [Hq, total_q]; sequence b owns rows cu_seqlens[b] .. cu_seqlens[b+1]-1. seqlen_q/k of the
   * problem are the maximum sequence lengths. */
  ATTN_VARLEN_PACKED = 1,
  /* Padded: dense [B, T, H, D] tensors of which the first seqlens[b] rows of batch b are real. Rows
   * of out past seqlens_q[b] are written as 0 and lse as -inf. */
  ATTN_VARLEN_PADDED = 2,
  ATTN_VARLEN_COUNT
} attn_varlen;

/* Where the tensors of a problem live. The plan selects an implementation that runs there. */
typedef enum attn_device {
  ATTN_DEVICE_CPU = 0,
  ATTN_DEVICE_CUDA = 1,
  ATTN_DEVICE_COUNT
} attn_device;

/* ---------------------------------------------------------------------------------------------
 * The problem: everything that decides the computation except the data. A plan is made for one
 * problem and runs it any number of times on different data.
 * ------------------------------------------------------------------------------------------- */

typedef struct attn_problem {
  int32_t operation; /* attn_operation; default FLASH_ATTENTION */
  int32_t dtype;     /* attn_dtype of q, k, v, out, dout, dq, dk, dv, probs; default F32 */
  int32_t device;    /* attn_device where every tensor lives; default CPU */
  int32_t device_index; /* which GPU for ATTN_DEVICE_CUDA; default 0 */

  int64_t batch;        /* B >= 1; for packed varlen the number of sequences */
  int64_t seqlen_q;     /* Tq >= 0; the maximum length for varlen; Tq = 0 is an empty problem */
  int64_t seqlen_k;     /* Tk >= 0; Tk = 0 makes every row fully masked; the maximum length for
                           varlen and paged caches */
  int64_t heads_q;      /* Hq >= 1 */
  int64_t heads_kv;     /* Hkv >= 1, Hq % Hkv == 0; query head h reads kv head h / (Hq / Hkv) */
  int64_t head_dim;     /* D >= 1 */
  int64_t head_dim_v;   /* Dv >= 1; 0 (the default) means Dv = D */

  double scale;         /* softmax scale s; 0 (the default) means 1 / sqrt(D) */
  int32_t causal;       /* 0 or 1; causal is the window (left, 0) */
  int32_t align;        /* attn_align of causal masks, windows and ALiBi; default BOTTOM_RIGHT */
  int64_t window_left;  /* keys visible before the diagonal; -1 (default) = unbounded */
  int64_t window_right; /* keys visible after the diagonal; -1 (default) = unbounded */
  double softcap;       /* cap > 0: x = cap * tanh(x / cap), bias and ALiBi inside; 0 = off */
  double dropout_p;     /* 0 <= p < 1; the seed is given with each run (attn_inputs) */

  /* Optional inputs: whether they are given, and their shapes. */
  int32_t has_bias;       /* additive bias of bias_dtype, shape bias_shape */
  int32_t bias_dtype;     /* F32, F16 or BF16 (F64 with an F64 problem); default F32 */
  int64_t bias_shape[4];  /* [B or 1, Hq or Hkv or 1, Tq or 1, Tk or 1]; Hkv is shared per group */
  int32_t has_mask;       /* u8 keep mask (0 = masked, nonzero = keep), shape mask_shape */
  int64_t mask_shape[4];  /* [B or 1, Hq or 1, Tq or 1, Tk or 1] */
  int32_t alibi;          /* attn_alibi; slopes are f32 (f64 with an F64 problem) */
  int64_t num_sinks;      /* S >= 0 sink logits per row (raw: not scaled, biased or capped) */
  int32_t sinks_shared;   /* 0: sinks [Hq, S]; 1: one [S] shared by all heads */
  int32_t has_segment_ids; /* q_segment_ids [B, Tq], kv_segment_ids [B, Tk], i32, negative = pad */
  int32_t varlen;         /* attn_varlen; default NONE */
  int64_t total_q;        /* packed varlen: rows of q (cu_seqlens_q[B]); otherwise ignored */
  int64_t total_k;        /* packed varlen: rows of k and v (cu_seqlens_k[B]); otherwise ignored */

  /* Paged KV cache (inference; docs/DECODE.md). page_size > 0 makes k and v pools of pages,
   * [num_pages, page_size, Hkv, D|Dv], that sequence b reads through row b of block_table: its key
   * j is row j % page_size of page block_table[b, j / page_size]. Sequence b holds
   * len_k[b] = cache_seqlens[b] + seqlen_new keys (at most seqlen_k); causal masks, windows and
   * ALiBi align to len_k[b] as to Tk. Queries are dense [B, Tq, Hq, D], Tq >= 1 (decode,
   * speculative verification, chunked prefill). Forward only; varlen must be NONE. */
  int64_t page_size;         /* rows per page; 0 (default) = k and v are dense, not paged */
  int64_t num_pages;         /* pages in the pool; 0 = batch * max_pages_per_seq */
  int64_t max_pages_per_seq; /* columns of block_table; 0 = ceil(seqlen_k / page_size) */
  int64_t seqlen_new;        /* rows of k_new and v_new the call first writes into each sequence's
                                pages at positions cache_seqlens[b] ..; 0 (default) = none */

  /* fp8 (docs/FP8.md). */
  int32_t out_dtype; /* attn_dtype of out and probs; -1 (default) = the problem's dtype, bf16 for
                        an f8e4m3 problem. Another value must equal dtype, except that an f8e4m3
                        problem takes bf16, f16 or f32 */
  int32_t descale;   /* attn_descale of an f8e4m3 problem (NONE for any other); default NONE */
} attn_problem;

/* Fills *problem with the defaults above and zero sizes. Never allocates. */
ATTN_API void attn_problem_init(attn_problem *problem);

/* The tensors of a problem, by role: the fields of attn_inputs, attn_outputs, the dout argument
 * and attn_grads. Values are only ever appended. */
typedef enum attn_role {
  ATTN_ROLE_Q,
  ATTN_ROLE_K,
  ATTN_ROLE_V,
  ATTN_ROLE_BIAS,
  ATTN_ROLE_MASK,
  ATTN_ROLE_ALIBI, /* alibi_slopes */
  ATTN_ROLE_SINKS,
  ATTN_ROLE_Q_SEGMENT_IDS,
  ATTN_ROLE_KV_SEGMENT_IDS,
  ATTN_ROLE_OUT,
  ATTN_ROLE_LSE,
  ATTN_ROLE_PROBS,
  ATTN_ROLE_DOUT,
  ATTN_ROLE_DQ,
  ATTN_ROLE_DK,
  ATTN_ROLE_DV,
  ATTN_ROLE_DBIAS,
  ATTN_ROLE_DSINKS,
  /* Inputs of a paged KV cache (problem.page_size > 0; docs/DECODE.md). */
  ATTN_ROLE_BLOCK_TABLE,
  ATTN_ROLE_K_NEW,
  ATTN_ROLE_V_NEW,
  /* Descale factors of an f8e4m3 problem (problem.descale != NONE; docs/FP8.md). */
  ATTN_ROLE_Q_DESCALE,
  ATTN_ROLE_K_DESCALE,
  ATTN_ROLE_V_DESCALE,
  ATTN_ROLE_COUNT
} attn_role;

/* "q", "k", ..., "dsinks": the name of the struct field that holds the role's tensor
 * ("alibi_slopes" for ATTN_ROLE_ALIBI); "unknown" outside the enum. Static storage. */
ATTN_API const char *attn_role_name(attn_role role);

/* ---------------------------------------------------------------------------------------------
 * Tensors: a borrowed pointer and strides. Shapes come from the problem; each tensor's dimensions
 * are listed at the field that holds it.
 * ------------------------------------------------------------------------------------------- */

#define ATTN_MAX_DIMS 4

typedef struct attn_tensor {
  void *data;                    /* borrowed for the call; NULL = not given */
  int64_t stride[ATTN_MAX_DIMS]; /* in elements, one per dimension of the tensor's shape (entries
                                    past its last dimension are ignored). See below. */
} attn_tensor;

/* Strides. The four strides are read as one: when all four are 0 (what attn_tensor_dense and the
 * _init functions give) the tensor is dense in C order for its shape and every stride is implied;
 * otherwise every stride is taken as written, and a stride of 0 then broadcasts an input along
 * that dimension (one slice read for every index). Outputs must not broadcast or overlap.
 *   - PyTorch's attention layout [B, H, T, D] (contiguous, as scaled_dot_product_attention takes
 *     it) is the library's [B, T, H, D] read with strides {H*T*D, D, T*D, 1}: a torch tensor's
 *     strides (s0, s1, s2, s3) over [B, H, T, D] are passed as {s0, s2, s1, s3}; no copy.
 *   - Broadcasting every dimension of size > 1 would write all-zero strides, which mean dense: give
 *     a dimension of size 1 (any stride is harmless there) or an entry past the last dimension a
 *     nonzero stride to mark the strides as explicit, e.g. alibi slopes [Hq] shared by every head:
 *     {0, 1, 0, 0}.
 * Strides are in elements (not bytes) and may differ between tensors and between runs of a plan. */

/* A dense tensor over data. */
ATTN_API attn_tensor attn_tensor_dense(void *data);

/* The data of one run, forward or backward. Fields of features the problem does not use are ignored.
 * The dtype of each tensor is fixed by the problem. */
typedef struct attn_inputs {
  attn_tensor q;              /* [B, Tq, Hq, D]; packed: [total_q, Hq, D] */
  attn_tensor k;              /* [B, Tk, Hkv, D]; packed: [total_k, Hkv, D];
                                 paged: [num_pages, page_size, Hkv, D] */
  attn_tensor v;              /* [B, Tk, Hkv, Dv]; packed: [total_k, Hkv, Dv];
                                 paged: [num_pages, page_size, Hkv, Dv] */
  attn_tensor bias;           /* problem.bias_shape, problem.bias_dtype */
  attn_tensor mask;           /* problem.mask_shape, u8 */
  attn_tensor alibi_slopes;   /* [Hq] or [B, Hq] */
  attn_tensor sinks;          /* [Hq, S] or [S] */
  attn_tensor q_segment_ids;  /* [B, Tq] i32 */
  attn_tensor kv_segment_ids; /* [B, Tk] i32 */
  const int32_t *cu_seqlens_q; /* packed: [B + 1], starts at 0, non-decreasing, ends at total_q */
  const int32_t *cu_seqlens_k; /* packed: [B + 1], likewise, ends at total_k */
  const int32_t *seqlens_q;    /* padded: [B], each in 0..Tq */
  const int32_t *seqlens_k;    /* padded: [B], each in 0..Tk */
  uint64_t dropout_seed;       /* Philox key of SPEC.md; vary it from step to step */
  /* Paged KV cache (problem.page_size > 0); k and v are then the page pools. */
  attn_tensor block_table;      /* [B, max_pages_per_seq] i32 page indices; the entries of pages
                                   past len_k[b] are never read (-1 is fine there) */
  const int32_t *cache_seqlens; /* [B], each >= 0: keys in the cache before the append */
  attn_tensor k_new;            /* seqlen_new > 0: [B, seqlen_new, Hkv, D], written into k (which
                                   is then both read and written) at rows cache_seqlens[b] .. */
  attn_tensor v_new;            /* seqlen_new > 0: [B, seqlen_new, Hkv, Dv], likewise into v */
  /* Descale factors of an f8e4m3 problem, f32 (problem.descale: [1] each, or [B, Hkv] each). */
  attn_tensor q_descale;
  attn_tensor k_descale;
  attn_tensor v_descale;
} attn_inputs;

/* Fills *inputs with NULL tensors and seed 0. Never allocates. */
ATTN_API void attn_inputs_init(attn_inputs *inputs);

/* Results of the forward pass; also the out and lse handed to the backward pass. */
typedef struct attn_outputs {
  attn_tensor out;   /* [B, Tq, Hq, Dv]; packed: [total_q, Hq, Dv], of the problem's out dtype
                        (its dtype, or out_dtype of an f8e4m3 problem). Required. */
  attn_tensor lse;   /* [B, Hq, Tq]; packed: [Hq, total_q]. Always f32, also for f16 and bf16
                        problems (f64 only with an F64 problem); natural log; -inf on fully masked
                        and padded rows. Optional in the forward pass, required by the backward
                        pass. */
  attn_tensor probs; /* [B, Hq, Tq, Tk] of out's dtype: the probabilities after dropout,
                        P'/Z. scaled_dot_product_attention only; optional. Varlen: indexed by
                        sequence and in-sequence position, zero outside each sequence. */
} attn_outputs;

/* Results of the backward pass. */
typedef struct attn_grads {
  attn_tensor dq;     /* like q. Required. */
  attn_tensor dk;     /* like k. Required. */
  attn_tensor dv;     /* like v. Required. */
  attn_tensor dbias;  /* like bias (its shape and dtype), summed over its broadcast dims. Optional. */
  attn_tensor dsinks; /* like sinks, f32 (f64 with an F64 problem). Optional. */
} attn_grads;

ATTN_API void attn_outputs_init(attn_outputs *outputs);
ATTN_API void attn_grads_init(attn_grads *grads);

/* ---------------------------------------------------------------------------------------------
 * Context
 * ------------------------------------------------------------------------------------------- */

typedef struct attn_ctx attn_ctx;

typedef enum attn_log_level {
  ATTN_LOG_LEVEL_ERROR = 0,
  ATTN_LOG_LEVEL_WARNING = 1,
  ATTN_LOG_LEVEL_INFO = 2,
  ATTN_LOG_LEVEL_DEBUG = 3,
  ATTN_LOG_LEVEL_COUNT
} attn_log_level;

/* Receives one message (no trailing newline). Called on the thread that made the call. */
typedef void (*attn_log_fn)(void *user, attn_log_level level, const char *message);

/* Creates a context. Returns OUT_OF_MEMORY (and *ctx = NULL) when allocation fails, and
 * INVALID_ARGUMENT when ctx is NULL. */
ATTN_API attn_status attn_ctx_create(attn_ctx **ctx);
/* Frees a context. Plans made from it must be destroyed first. NULL is harmless. */
ATTN_API void attn_ctx_destroy(attn_ctx *ctx);
/* The message of the last failed call made with this context, "" when the last call succeeded.
 * Valid until the next call with the context. Never NULL (a NULL ctx gives a fixed message). */
ATTN_API const char *attn_ctx_last_error(const attn_ctx *ctx);
/* The status of the last call made with this context. */
ATTN_API attn_status attn_ctx_last_status(const attn_ctx *ctx);
/* Installs a log callback receiving messages of level <= max_level; fn = NULL silences (default). */
ATTN_API attn_status attn_ctx_set_log_callback(attn_ctx *ctx, attn_log_fn fn, void *user,
                                               attn_log_level max_level);
/* Threads the CPU implementations may use; 0 (default) means the implementation's choice. */
ATTN_API attn_status attn_ctx_set_num_threads(attn_ctx *ctx, int32_t num_threads);

/* ---------------------------------------------------------------------------------------------
 * Tensor shapes of a problem: what to allocate for each role (attn_role, above).
 * ------------------------------------------------------------------------------------------- */

/* The tensor of one role for a problem, as the library reads or writes it densely: its number of
 * dimensions, shape (the dimensions at its field above; entries past ndim are set to 1), element
 * count and dtype (lse, alibi slopes, sinks and dsinks are f32 whatever the problem's dtype, f64
 * for an F64 problem). A role the problem does not use (bias without has_bias, probs for the flash
 * operation, ...) has ndim 0 and numel 0. Any output pointer may be NULL, and ctx too (then no
 * message is kept). INVALID_ARGUMENT, naming the rule, for an invalid problem or a role outside
 * the enum. */
ATTN_API attn_status attn_problem_tensor(attn_ctx *ctx, const attn_problem *problem,
                                         attn_role role, int32_t *ndim /* out */,
                                         int64_t shape[ATTN_MAX_DIMS] /* out */,
                                         int64_t *numel /* out */, attn_dtype *dtype /* out */);
/* The element count of attn_problem_tensor without a context: 0 for a role the problem does not
 * use, -1 for an invalid problem or role. Allocate numel * attn_dtype_size(dtype) bytes. */
ATTN_API int64_t attn_problem_numel(const attn_problem *problem, attn_role role);

/* ---------------------------------------------------------------------------------------------
 * Registry: the implementations of this library, in order of preference.
 *
 * The CPU implementations (cpu, ref) are part of the library. The GPU ones live in modules that the
 * library loads at run time, the first time any function below (or a plan) needs the list:
 * libattn_cudnn.so (cudnn; needs the CUDA runtime and cuDNN 9) and libattn_cuda.so (cuda; needs the
 * CUDA runtime). They are looked for in the folders of $ATTN_MODULE_PATH (colon-separated; when set,
 * nowhere else), else in the folder of the library itself, then by the dynamic loader's own search
 * (rpath, LD_LIBRARY_PATH, the system folders). A module that is absent or cannot load leaves the
 * others working; attn_module_info says which loaded and why one did not. libattn_gpu.a, made
 * beside the modules, is the static library with them linked in: it loads nothing.
 * ------------------------------------------------------------------------------------------- */

/* What became of one GPU module. */
typedef struct attn_module_status {
  const char *name;    /* "cudnn", "cuda" */
  int32_t loaded;      /* 1 when its implementations are in the registry */
  const char *path;    /* the file loaded or tried last; "" when none was found */
  const char *message; /* why it is not loaded (dlopen's error, a wrong ABI, not found); "" if it is */
} attn_module_status;

/* Number of modules the library knows (loaded or not). */
ATTN_API int32_t attn_module_count(void);
/* Status of module index (0 .. count-1); INVALID_ARGUMENT outside that range. The strings are the
 * library's and live as long as the process. */
ATTN_API attn_status attn_module_info(int32_t index, attn_module_status *status /* out */);

/* Number of registered implementations (the reference is always present and always last). */
ATTN_API int32_t attn_impl_count(void);
/* Name of implementation index (0 .. count-1), e.g. "ref"; NULL outside that range. */
ATTN_API const char *attn_impl_name(int32_t index);
/* OK when the named implementation can run the problem; UNSUPPORTED with the reason in the
 * context's last error when it cannot; INVALID_ARGUMENT for an invalid problem or unknown name. */
ATTN_API attn_status attn_impl_supports(attn_ctx *ctx, const char *name,
                                        const attn_problem *problem);

/* ---------------------------------------------------------------------------------------------
 * Plans
 * ------------------------------------------------------------------------------------------- */

typedef struct attn_plan attn_plan;

/* How a plan picks its implementation. Zero fields mean "let the library choose". */
typedef struct attn_select {
  const char *impl;   /* an implementation's name (attn_impl_name); NULL = any */
  const char *config; /* one of that implementation's configuration names; NULL = its choice */
  /* Filters of the executor (see "Executor" below); 0 = no constraint. */
  int32_t platform; /* attn_platform: only implementations of this platform; default AUTO */
  int32_t backend;  /* attn_backend: only implementations on this kind of device; default ANY */
} attn_select;

ATTN_API void attn_select_init(attn_select *select);

/* Validates the problem (INVALID_ARGUMENT naming the rule otherwise) and selects an implementation
 * and configuration among the registered ones that support it and match select (NULL = no
 * constraint), through the executor's chain: the caller's explicit choice, the context's in-memory
 * cache, the persistent cache, autotuning, heuristics (the first supporting implementation in
 * registry order and its default configuration); see "Executor" below. A problem no implementation
 * supports gives UNSUPPORTED with each implementation's reason. The plan copies the problem; it
 * borrows the context, which must outlive it. */
ATTN_API attn_status attn_plan_create(attn_ctx *ctx, const attn_problem *problem,
                                      const attn_select *select, attn_plan **plan /* out */);
/* Frees a plan. NULL is harmless. Using a plan after it is destroyed (or after its context is) is
 * undefined; a destroyed plan passed again to a plan call is caught best-effort (the call returns
 * INVALID_ARGUMENT, destroy does nothing), not promised. */
ATTN_API void attn_plan_destroy(attn_plan *plan);

/* Bytes of workspace the forward and backward passes need (either pointer may be NULL). The
 * workspace is scratch for the duration of one call: nothing passes through it from the forward to
 * the backward pass (the backward reads out and lse from its `forward` argument), so one buffer of
 * max(forward_bytes, backward_bytes) serves both passes of a plan, and any number of plans, as
 * long as no two calls use it at the same time (on a GPU: calls queued on one stream, or ordered
 * by events; a call returns before the device is done with its workspace). The sizes are fixed
 * when the plan is made. */
ATTN_API attn_status attn_plan_workspace_size(const attn_plan *plan, size_t *forward_bytes,
                                              size_t *backward_bytes);
/* The selected implementation's name and configuration. Owned by the plan; never NULL. */
ATTN_API const char *attn_plan_impl_name(const attn_plan *plan);
ATTN_API const char *attn_plan_config_name(const attn_plan *plan);
/* The stream (a cudaStream_t) GPU implementations run on; NULL = the default stream. Borrowed. */
ATTN_API attn_status attn_plan_set_stream(attn_plan *plan, void *stream);

/* Forward pass. workspace: at least the forward size of attn_plan_workspace_size, on the problem's
 * device; NULL with a nonzero size makes a CPU plan allocate it for the call (a plan given its
 * workspace never allocates). Outputs must not overlap inputs or each other. */
ATTN_API attn_status attn_plan_forward(attn_plan *plan, const attn_inputs *inputs, void *workspace,
                                       size_t workspace_size, const attn_outputs *outputs /* out */);

/* Backward pass. forward holds out and lse of the forward pass on the same inputs (probs is
 * ignored); dout is like out. Gradients are written, not accumulated. UNSUPPORTED, with the reason,
 * for a problem without one: a paged KV cache (docs/DECODE.md), an f8e4m3 problem (docs/FP8.md). */
ATTN_API attn_status attn_plan_backward(attn_plan *plan, const attn_inputs *inputs,
                                        const attn_outputs *forward, const attn_tensor *dout,
                                        void *workspace, size_t workspace_size,
                                        const attn_grads *grads /* out */);

/* One-call conveniences: create a plan with no selection constraint, run it with a workspace the
 * call allocates, destroy it. On a GPU, a pass that needs workspace gets device memory and the call
 * waits for the device before freeing it (so such a call returns with the pass done). */
ATTN_API attn_status attn_forward(attn_ctx *ctx, const attn_problem *problem,
                                  const attn_inputs *inputs, const attn_outputs *outputs /* out */);
ATTN_API attn_status attn_backward(attn_ctx *ctx, const attn_problem *problem,
                                   const attn_inputs *inputs, const attn_outputs *forward,
                                   const attn_tensor *dout, const attn_grads *grads /* out */);

/* ---------------------------------------------------------------------------------------------
 * Problem strings: one canonical text form of a problem, read by the `attn` command, written in
 * cache keys and log lines, e.g. "b4 hq32 hkv8 sq4096 sk4096 d128 bf16 causal window=256,0".
 *
 * Tokens, separated by spaces, in any order when parsed and in this order when written:
 *   b<B> hq<Hq> hkv<Hkv> sq<Tq> sk<Tk> d<D>   sizes (parse defaults: b1, hkv = hq, sk = sq)
 *   dv<Dv>                 head_dim_v when it differs from D
 *   f32 | f16 | bf16 | f64 | f8e4m3   dtype (parse default f32; fp8 and e4m3 read as f8e4m3)
 *   out=<dtype>            out_dtype when not the default (an f8e4m3 problem's f16 or f32 out)
 *   descale=tensor | descale=bhkv    an f8e4m3 problem's descale factors ([1] or [B, Hkv] each)
 *   causal                 window=<L>,<R>   (-1 = unbounded)     align=tl (top-left; br default)
 *   scale=<s>  softcap=<c>  dropout=<p>
 *   bias=<B>x<H>x<Tq>x<Tk>[:<dtype>]   mask=<B>x<H>x<Tq>x<Tk>   alibi=h|bh
 *   sinks=<S>[:shared]     segments       varlen=packed:<total_q>,<total_k> | varlen=padded
 *   op=sdpa (op=flash is the default)     device=cuda[:<index>] (device=cpu is the default)
 *   paged=<page_size>[,<num_pages>[,<max_pages_per_seq>]]   new=<seqlen_new>   (paged KV cache)
 * Fields at their defaults are not written.
 * ------------------------------------------------------------------------------------------- */

/* Writes the canonical string of the problem's fields into buf (NUL-terminated, truncated to
 * size - 1 characters; buf may be NULL when size is 0) and returns the length of the whole string,
 * like snprintf. The problem is not validated; a NULL problem gives "". Thread safe. */
ATTN_API size_t attn_problem_to_string(const attn_problem *problem, char *buf, size_t size);
/* Parses a problem string into *problem (filled by attn_problem_init first, then by the tokens).
 * INVALID_ARGUMENT naming the token and what was expected when a token is not understood, and
 * naming both tokens when two set one field ("b1 b2", "bf16 f16"); the result is not validated
 * (attn_plan_create does that, so "scale=nan" parses and is refused there by its rule).
 * attn_problem_parse(attn_problem_to_string(p)) gives back p's fields. */
ATTN_API attn_status attn_problem_parse(attn_ctx *ctx, const char *text, attn_problem *problem /* out */);

/* ---------------------------------------------------------------------------------------------
 * Executor: how attn_plan_create chooses an implementation and configuration.
 *
 * The chain, for a plan whose caller did not name both the implementation and the configuration:
 *   1. candidates: every registered implementation that matches select (impl, platform, backend),
 *      runs on the problem's device and supports the problem, with each of its configurations (only
 *      select.config when it is given: a caller's configuration is honoured on every path below);
 *   2. the context's in-memory cache, keyed by device fingerprint, candidate implementations and
 *      their versions, pass (forward or forward+backward), threads and the canonical problem string;
 *   3. the persistent cache file (re-read whenever the file changes); a hit is copied to memory;
 *   4. autotuning, when the policy allows it and says so on a miss: every candidate is timed on
 *      scratch data of the problem's shape; the fastest successful one wins, is kept in memory and,
 *      when the policy persists, merged into the cache file;
 *   5. heuristics: the first candidate implementation in registry order and its default
 *      configuration (for scaled_dot_product_attention on platform AUTO, cuDNN first).
 * A caller's explicit implementation plus configuration skips the chain and is never cached; only
 * measured results are ever written to the cache file.
 * ------------------------------------------------------------------------------------------- */

/* The family of an implementation; attn_select.platform filters on it. */
typedef enum attn_platform {
  ATTN_PLATFORM_AUTO = 0, /* any platform */
  ATTN_PLATFORM_REF = 1,  /* the reference */
  ATTN_PLATFORM_CPU = 2,  /* optimised CPU implementations */
  ATTN_PLATFORM_CUDA = 3, /* libattn's own CUDA kernels */
  ATTN_PLATFORM_CUDNN = 4, /* NVIDIA cuDNN */
  ATTN_PLATFORM_COUNT
} attn_platform;

/* The kind of device an implementation runs on; attn_select.backend filters on it. */
typedef enum attn_backend {
  ATTN_BACKEND_ANY = 0,
  ATTN_BACKEND_CPU = 1,
  ATTN_BACKEND_GPU = 2,
  ATTN_BACKEND_COUNT
} attn_backend;

/* "auto", "ref", "cpu", "cuda", "cudnn"; "unknown" outside the enum. Static storage. */
ATTN_API const char *attn_platform_name(attn_platform platform);

/* Applies an EasyDeL-style attention mechanism name: "vanilla" (the reference), "sdpa"
 * (scaled_dot_product_attention on any platform, cuDNN preferred), "flash" (flash_attention on any
 * platform), "cudnn" (platform cuDNN); or a platform name ("ref", "cpu", "cuda", "auto"). Sets
 * problem->operation where the name implies one (problem may be NULL otherwise) and select's
 * platform; other fields are kept. INVALID_ARGUMENT for an unknown name. */
ATTN_API attn_status attn_select_mechanism(attn_ctx *ctx, const char *name,
                                           attn_problem *problem /* in, out */,
                                           attn_select *select /* in, out */);

/* Platform, device (attn_device), and version of implementation index; -1 outside the range. */
ATTN_API int32_t attn_impl_platform(int32_t index);
ATTN_API int32_t attn_impl_device(int32_t index);
ATTN_API int32_t attn_impl_version(int32_t index);
/* The configurations the named implementation offers for a (valid) problem: how many, the name of
 * one (written into buf like snprintf), and the name of its heuristic default. INVALID_ARGUMENT for
 * an invalid problem, unknown name or index out of range; UNSUPPORTED when it cannot run the
 * problem. */
ATTN_API attn_status attn_impl_config_count(attn_ctx *ctx, const char *name,
                                            const attn_problem *problem, int32_t *count /* out */);
ATTN_API attn_status attn_impl_config_name(attn_ctx *ctx, const char *name,
                                           const attn_problem *problem, int32_t index, char *buf,
                                           size_t size);
ATTN_API attn_status attn_impl_config_default(attn_ctx *ctx, const char *name,
                                              const attn_problem *problem, char *buf, size_t size);

/* What a cache miss does. */
typedef enum attn_on_miss {
  ATTN_ON_MISS_HEURISTICS = 0, /* take the heuristic pick (FFTW_ESTIMATE): plan creation stays cheap */
  ATTN_ON_MISS_AUTOTUNE = 1,   /* time the candidates (FFTW_MEASURE), if allow_autotune */
  ATTN_ON_MISS_COUNT
} attn_on_miss;

/* The executor's policy, one per context. */
typedef struct attn_policy {
  int32_t allow_autotune; /* 0 forbids timing anything, whatever on_miss says; default 1 */
  int32_t on_miss;        /* attn_on_miss; default HEURISTICS (ATTN_AUTOTUNE=1 in the environment
                             of attn_policy_init makes it AUTOTUNE) */
  int32_t tune_backward;  /* 1: time forward + backward (training); 0 (default): forward only */
  int32_t warmup_iters;   /* untimed runs per candidate; default 5 */
  int32_t measure_iters;  /* at most this many timed runs per candidate; default 100. Measuring
                             stops early once the median of the runs so far moves by less than 1%
                             over 5 more runs (after at least 10), or when max_seconds is spent */
  double max_seconds;     /* time budget per candidate (warm-up included; at least one timed run
                             is made); default 2 */
  int32_t persist;        /* 1 (default): measured results are merged into the cache file; the
                             file is read either way */
  const char *cache_path; /* the cache file; NULL (default) = $ATTN_CACHE_PATH, else
                             $XDG_CACHE_HOME/libattn/cache.txt, else ~/.cache/libattn/cache.txt;
                             "" = no cache file. Copied by attn_ctx_set_policy. */
  int32_t deterministic;  /* 1: select only configurations their implementation declares to repeat
                             their results bit for bit (not cuda's "atomic" backward, say), unless
                             select.config names one; 0 (default): any configuration, all within
                             SPEC.md's tolerances */
} attn_policy;

/* Fills *policy with the defaults above. Never allocates. */
ATTN_API void attn_policy_init(attn_policy *policy);
/* Sets the context's policy (a copy; cache_path is copied too, up to 4095 characters).
 * INVALID_ARGUMENT naming the field for a value out of range. The in-memory cache is kept. */
ATTN_API attn_status attn_ctx_set_policy(attn_ctx *ctx, const attn_policy *policy);
/* The context's policy; cache_path points into the context (valid as long as the context, with
 * the value of the last attn_ctx_set_policy), so get, change, set is safe. */
ATTN_API attn_status attn_ctx_get_policy(const attn_ctx *ctx, attn_policy *policy /* out */);

typedef enum attn_event_kind {
  ATTN_EVENT_KIND_OVERRIDE = 0,         /* the caller named implementation and configuration */
  ATTN_EVENT_KIND_CACHE_HIT_MEMORY = 1, /* found in the context's in-memory cache */
  ATTN_EVENT_KIND_CACHE_HIT_DISK = 2,   /* found in the cache file (and copied to memory) */
  ATTN_EVENT_KIND_TUNE_START = 3,       /* autotuning begins; count = number of candidates */
  ATTN_EVENT_KIND_TUNE_CANDIDATE = 4,   /* one candidate measured (time_us) or failed (status) */
  ATTN_EVENT_KIND_TUNE_FINISH = 5,      /* the winner and its time */
  ATTN_EVENT_KIND_HEURISTIC = 6,        /* the heuristic pick */
  ATTN_EVENT_KIND_FAILURE = 7,          /* something went wrong and was survived (message) */
  ATTN_EVENT_KIND_COUNT
} attn_event_kind;

/* One report of the executor. Every pointer is valid only during the callback. */
typedef struct attn_event {
  int32_t kind;        /* attn_event_kind */
  const char *problem; /* canonical problem string; never NULL */
  const char *impl;    /* implementation concerned; "" when none */
  const char *config;  /* configuration concerned; "" when none */
  double time_us;      /* TUNE_CANDIDATE, TUNE_FINISH, cache hits: median microseconds per run */
  int32_t status;      /* attn_status: of the failed candidate or operation; OK otherwise */
  int32_t index;       /* TUNE_CANDIDATE: 0-based candidate number */
  int32_t count;       /* TUNE_START, TUNE_CANDIDATE: number of candidates */
  const char *message; /* one line for humans; never NULL */
} attn_event;

typedef void (*attn_event_fn)(void *user, const attn_event *event);

/* Installs an event callback (NULL = none, the default). Called on the thread making the plan. */
ATTN_API attn_status attn_ctx_set_event_callback(attn_ctx *ctx, attn_event_fn fn, void *user);

/* ---------------------------------------------------------------------------------------------
 * The persistent configuration cache ("wisdom"): a text file whose first line is
 * "libattn-cache 1", then one measured result per line. Writers take an advisory lock on
 * "<path>.lock", re-read and merge, write "<path>.tmp" and rename it over the file, so concurrent
 * processes lose no entry and a crash never leaves a torn file. A file that is corrupt, truncated
 * or of another format version is ignored with a log message, and never overwritten when its first
 * line is not this format's. Entries of an implementation whose version changed are ignored.
 * ------------------------------------------------------------------------------------------- */

/* The cache file the policy resolves to, written into buf like snprintf; "" when there is none. */
ATTN_API attn_status attn_cache_get_path(attn_ctx *ctx, char *buf, size_t size);
/* Entries in the context's in-memory cache and in the cache file (re-read if it changed; 0 when
 * absent or unreadable). Either pointer may be NULL. */
ATTN_API attn_status attn_cache_count(attn_ctx *ctx, int64_t *memory /* out */,
                                      int64_t *disk /* out */);
/* Forgets the in-memory cache (the cache file is untouched). */
ATTN_API attn_status attn_cache_clear(attn_ctx *ctx);
/* Reads the entries of a cache file at path into the in-memory cache. IO_ERROR when it cannot be
 * read, INVALID_ARGUMENT when its first line is not "libattn-cache 1" (malformed lines are
 * skipped with a log message). */
ATTN_API attn_status attn_cache_import(attn_ctx *ctx, const char *path);
/* Merges the in-memory entries and those of the cache file into the file at path, with the lock
 * and atomic replace above. IO_ERROR when it cannot be written (or is not a cache file). */
ATTN_API attn_status attn_cache_export(attn_ctx *ctx, const char *path);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ATTN_H */
