/*
 * src/module/loader.c - finds and loads the GPU modules (module.h), once per process.
 *
 * Where a module is looked for: each folder of $ATTN_MODULE_PATH when it is set (and nowhere else,
 * so a user or a test can point the library at one build, or at an empty folder to run CPU-only);
 * otherwise the folder of the object that holds this code (libattn.so, or the program that linked
 * libattn.a), then the dynamic loader's own search by file name (the caller's rpath,
 * LD_LIBRARY_PATH, ld.so.cache). The first copy that loads and passes the ABI check is kept; a
 * module that is found but fails keeps the reason for attn_module_info.
 *
 * A build with ATTN_STATIC_GPU has the modules' tables linked in (libattn_gpu.a) and opens nothing.
 */
#define _GNU_SOURCE /* dladdr */
#include "module/module.h"

#include "core/ctx.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef ATTN_STATIC_GPU
const attn_module_table *attn_cudnn_module(void);
const attn_module_table *attn_cuda_module(void);
#endif

/* The modules, in the registry's order of preference: cuDNN's engines before our own kernels. */
typedef struct module_slot {
  const char *name;
  const char *file;
#ifdef ATTN_STATIC_GPU
  const attn_module_table *(*builtin)(void);
#endif
  const attn_module_table *table; /* NULL until loaded */
  char path[1024];
  char message[512];
} module_slot;

static module_slot slots[] = {
#ifdef ATTN_STATIC_GPU
    {"cudnn", "libattn_cudnn.so", attn_cudnn_module, NULL, "", ""},
    {"cuda", "libattn_cuda.so", attn_cuda_module, NULL, "", ""},
#else
    {"cudnn", "libattn_cudnn.so", NULL, "", ""},
    {"cuda", "libattn_cuda.so", NULL, "", ""},
#endif
};
enum { SLOT_COUNT = sizeof slots / sizeof slots[0] };

/* Every loaded module's implementations; the registry puts them before cpu and ref. */
static const attn_impl *loaded_impls[16];
static int32_t loaded_count = 0;
static const attn_gpu_ops *loaded_gpu = NULL;
static const attn_dist_device_ops *loaded_dist = NULL;
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

/* OK when the table was built from the same contract as this library; else the reason in msg. */
static int table_ok(const attn_module_table *t, const char *name, char *msg, size_t size) {
  if (t == NULL) {
    attn_format(msg, size, "its entry returned no table");
    return 0;
  }
  if (t->abi != ATTN_MODULE_ABI || t->problem_size != sizeof(attn_problem) ||
      t->impl_size != sizeof(attn_impl) || t->run_size != sizeof(attn_run) ||
      t->gpu_ops_size != sizeof(attn_gpu_ops)) {
    attn_format(msg, size,
                "built for module ABI %d (struct sizes %zu/%zu/%zu/%zu), this library has ABI %d "
                "(%zu/%zu/%zu/%zu): use the module of the same libattn build",
                (int)t->abi, t->problem_size, t->impl_size, t->run_size, t->gpu_ops_size,
                ATTN_MODULE_ABI, sizeof(attn_problem), sizeof(attn_impl), sizeof(attn_run),
                sizeof(attn_gpu_ops));
    return 0;
  }
  if (t->name == NULL || strcmp(t->name, name) != 0) {
    attn_format(msg, size, "it calls itself \"%s\", not \"%s\"", t->name ? t->name : "(null)",
                name);
    return 0;
  }
  if (t->impl_count < 0 || (t->impl_count > 0 && t->impls == NULL) ||
      loaded_count + t->impl_count > (int32_t)(sizeof loaded_impls / sizeof loaded_impls[0])) {
    attn_format(msg, size, "its table lists %d implementations", (int)t->impl_count);
    return 0;
  }
  return 1;
}

static void adopt(module_slot *s, const attn_module_table *t) {
  s->table = t;
  s->message[0] = '\0';
  for (int32_t i = 0; i < t->impl_count; ++i) loaded_impls[loaded_count++] = t->impls[i];
  if (loaded_gpu == NULL) loaded_gpu = t->gpu;
  if (loaded_dist == NULL) loaded_dist = t->dist;
}

/* dlopen's last error, or a fallback; dlerror() clears it, so it is read once. */
static const char *dl_error(void) {
  const char *e = dlerror();
  return e != NULL ? e : "unknown dlopen error";
}

/* Tries one file (a path, or a bare name for the loader's search). The accepted symbol, or NULL
 * with the reason in why. */
static void *try_open(const char *file, const char *symbol, attn_module_accept_fn accept, void *arg,
                      char *path, size_t path_size, char *why, size_t why_size) {
  attn_format(path, path_size, "%s", file);
  void *handle = dlopen(file, RTLD_NOW | RTLD_LOCAL);
  if (handle == NULL) {
    attn_format(why, why_size, "%s", dl_error());
    return NULL;
  }
  void *sym = dlsym(handle, symbol);
  if (sym == NULL) {
    attn_format(why, why_size, "%s exports no %s: not a libattn module", file, symbol);
    dlclose(handle);
    return NULL;
  }
  if (!accept(sym, arg, why, why_size)) {
    dlclose(handle);
    return NULL;
  }
  Dl_info where; /* the file the loader's search chose, for the caller's messages */
  if (dladdr(sym, &where) != 0 && where.dli_fname != NULL)
    attn_format(path, path_size, "%s", where.dli_fname);
  why[0] = '\0';
  return sym; /* never closed: what the module gave stays in use */
}

/* Tries file in one folder; NULL without a word when the folder has no such file. */
static void *try_folder(const char *folder, size_t len, int *found, const char *file,
                        const char *symbol, attn_module_accept_fn accept, void *arg, char *path,
                        size_t path_size, char *why, size_t why_size) {
  char candidate[1024];
  if (len == 0 || len + 1 + strlen(file) >= sizeof candidate) return NULL;
  memcpy(candidate, folder, len);
  candidate[len] = '/';
  strcpy(candidate + len + 1, file);
  if (access(candidate, F_OK) != 0) return NULL;
  *found = 1;
  return try_open(candidate, symbol, accept, arg, path, path_size, why, why_size);
}

void *attn_module_open(const char *file, const char *symbol, attn_module_accept_fn accept,
                       void *arg, char *path, size_t path_size, char *why, size_t why_size) {
  int found = 0;
  void *sym;
  const char *list = getenv("ATTN_MODULE_PATH");
  if (list != NULL) {
    for (const char *p = list; *p != '\0';) {
      size_t len = strcspn(p, ":");
      sym = try_folder(p, len, &found, file, symbol, accept, arg, path, path_size, why, why_size);
      if (sym != NULL) return sym;
      p += len;
      if (*p == ':') ++p;
    }
    if (!found) {
      path[0] = '\0';
      attn_format(why, why_size, "%s is in no folder of ATTN_MODULE_PATH=%s", file, list);
    }
    return NULL;
  }
  Dl_info self;
  if (dladdr(&load_once, &self) != 0 && self.dli_fname != NULL) {
    const char *slash = strrchr(self.dli_fname, '/');
    if (slash != NULL) {
      sym = try_folder(self.dli_fname, (size_t)(slash - self.dli_fname), &found, file, symbol,
                       accept, arg, path, path_size, why, why_size);
      if (sym != NULL || found) return sym; /* beside the library but broken: that reason */
    }
  }
  sym = try_open(file, symbol, accept, arg, path, path_size, why, why_size);
  /* The loader's own message says whether the file or one of its libraries is missing. */
  if (sym == NULL) path[0] = '\0';
  return sym;
}

#ifndef ATTN_STATIC_GPU
/* attn_module_open's check of a GPU module: its table must match this library; adopted if so. */
static int accept_table(void *symbol, void *arg, char *why, size_t why_size) {
  module_slot *s = arg;
  attn_module_entry_fn entry;
  /* ISO C has no function-pointer cast from void *; POSIX guarantees that this copy works. */
  memcpy(&entry, &symbol, sizeof entry);
  const attn_module_table *t = entry();
  if (!table_ok(t, s->name, why, why_size)) return 0;
  adopt(s, t);
  return 1;
}

static void load_one(module_slot *s) {
  (void)attn_module_open(s->file, ATTN_MODULE_ENTRY, accept_table, s, s->path, sizeof s->path,
                         s->message, sizeof s->message);
}
#endif

static void load_all(void) {
  for (int i = 0; i < SLOT_COUNT; ++i) {
#ifdef ATTN_STATIC_GPU
    const attn_module_table *t = slots[i].builtin();
    if (table_ok(t, slots[i].name, slots[i].message, sizeof slots[i].message)) adopt(&slots[i], t);
    attn_format(slots[i].path, sizeof slots[i].path, "(linked in)");
#else
    load_one(&slots[i]);
#endif
  }
}

void attn_modules_load(void) { pthread_once(&load_once, load_all); }

const attn_impl *const *attn_module_impls(int32_t *count) {
  attn_modules_load();
  *count = loaded_count;
  return loaded_impls;
}

const attn_gpu_ops *attn_module_gpu(void) {
  attn_modules_load();
  return loaded_gpu;
}

const attn_dist_device_ops *attn_module_dist_ops(void) {
  attn_modules_load();
  return loaded_dist;
}

const attn_module_table *attn_module_table_named(const char *name) {
  attn_modules_load();
  for (int i = 0; i < SLOT_COUNT; ++i)
    if (name != NULL && strcmp(slots[i].name, name) == 0) return slots[i].table;
  return NULL;
}

int32_t attn_module_count(void) { return SLOT_COUNT; }

attn_status attn_module_info(int32_t index, attn_module_status *status) {
  if (status == NULL || index < 0 || index >= SLOT_COUNT) return ATTN_STATUS_INVALID_ARGUMENT;
  attn_modules_load();
  const module_slot *s = &slots[index];
  status->name = s->name;
  status->loaded = s->table != NULL;
  status->path = s->path;
  status->message = s->message;
  return ATTN_STATUS_OK;
}
