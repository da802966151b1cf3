/*
 * src/module/module.h - the contract between the core library and a GPU module.
 *
 * The core (libattn.so / libattn.a) depends on libc, libm and OpenMP only. Implementations that
 * need a GPU stack live in modules, shared objects the core loads at run time with dlopen (the way
 * cuDNN loads its sub-libraries and ggml its backends): libattn_cuda.so (src/impl/cuda, needs the
 * CUDA runtime) and libattn_cudnn.so (src/impl/cudnn, needs cuDNN as well). A module that is absent,
 * or whose own libraries do not load, leaves the CPU implementations working and says why through
 * attn_module_info(). Modules are listed once, in loader.c.
 *
 * A module exports one symbol, ATTN_MODULE_ENTRY, a function returning its table. The table names
 * the ABI the module was compiled against and the sizes of the structs both sides share, so a
 * module from another build of libattn is refused with the reason instead of misread.
 */
#ifndef ATTN_MODULE_MODULE_H
#define ATTN_MODULE_MODULE_H

#include "core/gpu.h"
#include "dist/device.h"
#include "impl/impl.h"

/* Bumped whenever attn_module_table, attn_impl, attn_run, attn_gpu_ops or attn_dist_device_ops
 * change meaning; the entry's name carries it, so a module of another ABI is not even called.
 * 2: the table's dist (the ring's device operations). 3: attn_run's positions in pieces and
 * progress hook. */
#define ATTN_MODULE_ABI 3
#define ATTN_MODULE_ENTRY "attn_module_entry_v3"

typedef struct attn_module_table {
  int32_t abi;         /* ATTN_MODULE_ABI of the module's build */
  size_t problem_size; /* sizeof(attn_problem), sizeof(attn_impl), ... of the module's build */
  size_t impl_size;
  size_t run_size;
  size_t gpu_ops_size;
  const char *name;              /* "cuda", "cudnn": the N of libattn_N.so */
  const attn_impl *const *impls; /* in order of preference */
  int32_t impl_count;
  const attn_gpu_ops *gpu; /* the CUDA runtime services of gpu.h, or NULL */
  /* What the project's own tests may call inside the module (a struct of the module's, e.g.
   * attn_cudnn_test_hooks), or NULL: a module exports nothing else, so tests reach it here. */
  const void *test_hooks;
  /* The distributed ring's device operations (dist/device.h), or NULL (cudnn: its kernels are
   * cuDNN's; the ring takes these from the cuda module). */
  const attn_dist_device_ops *dist;
} attn_module_table;

/* The type of ATTN_MODULE_ENTRY. */
typedef const attn_module_table *(*attn_module_entry_fn)(void);

/* Fills the ABI fields of a module's table; modules start their table with it. */
#define ATTN_MODULE_TABLE_HEADER                                                                   \
  ATTN_MODULE_ABI, sizeof(attn_problem), sizeof(attn_impl), sizeof(attn_run), sizeof(attn_gpu_ops)

/* ---- the core's side (loader.c) ---------------------------------------------------------------- */

/* Loads every module once (thread safe; later calls return at once). */
void attn_modules_load(void);

/* The implementations of the loaded modules, in the registry's order; *count may be 0. Valid for
 * the life of the process (modules are never unloaded). */
const attn_impl *const *attn_module_impls(int32_t *count);

/* The GPU services of the first loaded module that has them, or NULL. */
const attn_gpu_ops *attn_module_gpu(void);

/* What a caller of attn_module_open checks in the symbol it found: 1 keeps the module, 0 (with the
 * reason in why) closes it and the search goes on. */
typedef int (*attn_module_accept_fn)(void *symbol, void *arg, char *why, size_t why_size);

/* The one search for run-time modules, GPU implementations and distributed transports alike:
 * the folders of $ATTN_MODULE_PATH when it is set (and nowhere else), otherwise the folder of the
 * object holding the core, then the dynamic loader's search by file name. Opens `file` there
 * (RTLD_NOW | RTLD_LOCAL), looks up `symbol` and asks accept; returns the symbol of the first copy
 * accepted, which is never closed, or NULL with the reason in why. path gets the file loaded, or
 * the one that failed ("" when none was found). Callers serialise their own calls. */
void *attn_module_open(const char *file, const char *symbol, attn_module_accept_fn accept, void *arg,
                       char *path, size_t path_size, char *why, size_t why_size);

/* The ring's device operations of the first loaded module that has them, or NULL. */
const attn_dist_device_ops *attn_module_dist_ops(void);

/* The table of the loaded module of that name ("cuda", "cudnn"), or NULL; for tests. */
const attn_module_table *attn_module_table_named(const char *name);

#endif /* ATTN_MODULE_MODULE_H */
