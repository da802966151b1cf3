/*
 * src/dist/transports.c - THE list of transports, and the loading of their run-time modules.
 *
 * A transport is a module (libattn_<name>.so) exporting attn_transport_<name>_entry(), which
 * returns its table (dist/transport.h). Adding one is a line here, its source in src/dist/ and a
 * MODULE target in CMakeLists.txt. Modules are looked for in the folders of $ATTN_MODULE_PATH
 * (separated by ':'), then beside the object holding libattn (so an installed or built tree finds
 * its own), then by the dynamic loader's search. A module loaded once stays loaded: its table is
 * used by plans that may outlive any one caller.
 */
#define _GNU_SOURCE /* dladdr */
#include "dist/dist.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct transport_entry {
  int32_t transport; /* attn_dist_transport */
  const char *name;
  const char *file;  /* the module's file name */
  const char *entry; /* its entry function */
} transport_entry;

static const transport_entry transports[] = {
    {ATTN_DIST_TRANSPORT_MPI, "mpi", "libattn_mpi.so", "attn_transport_mpi_entry"},
    {ATTN_DIST_TRANSPORT_NCCL, "nccl", "libattn_nccl.so", "attn_transport_nccl_entry"},
};
#define TRANSPORT_COUNT (sizeof transports / sizeof transports[0])

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static const attn_transport_ops *loaded[TRANSPORT_COUNT];

/* Tries dlopen on one path; on success resolves the entry and checks the table. */
static const attn_transport_ops *try_open(const transport_entry *t, const char *path, char *why,
                                          size_t why_size) {
  void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (handle == NULL) {
    const char *err = dlerror();
    snprintf(why, why_size, "%s", err != NULL ? err : path);
    return NULL;
  }
  attn_transport_entry_fn entry;
  void *symbol = dlsym(handle, t->entry);
  /* POSIX's way from dlsym's data pointer to a function pointer, without ISO C's cast. */
  memcpy(&entry, &symbol, sizeof entry);
  if (symbol == NULL) {
    snprintf(why, why_size, "%s exports no %s", path, t->entry);
    dlclose(handle);
    return NULL;
  }
  const attn_transport_ops *ops = entry();
  if (ops == NULL || ops->abi != ATTN_TRANSPORT_ABI) {
    snprintf(why, why_size, "%s is built for transport interface %d, libattn needs %d", path,
             ops == NULL ? -1 : (int)ops->abi, ATTN_TRANSPORT_ABI);
    dlclose(handle);
    return NULL;
  }
  return ops;
}

static const attn_transport_ops *open_module(const transport_entry *t, char *why, size_t why_size) {
  char path[4096];
  char first_error[512] = "";
  const char *env = getenv("ATTN_MODULE_PATH");
  if (env != NULL && env[0] != '\0') {
    const char *at = env;
    while (*at != '\0') {
      size_t len = strcspn(at, ":");
      if (len > 0 && len < sizeof path - strlen(t->file) - 2) {
        snprintf(path, sizeof path, "%.*s/%s", (int)len, at, t->file);
        const attn_transport_ops *ops = try_open(t, path, why, why_size);
        if (ops != NULL) return ops;
        if (first_error[0] == '\0') snprintf(first_error, sizeof first_error, "%s", why);
      }
      at += len;
      if (*at == ':') ++at;
    }
  }
  /* Any object of libattn names its file; a data object avoids casting a function pointer. */
  static const char anchor = 0;
  Dl_info info;
  if (dladdr(&anchor, &info) != 0 && info.dli_fname != NULL) {
    const char *slash = strrchr(info.dli_fname, '/');
    if (slash != NULL) {
      snprintf(path, sizeof path, "%.*s/%s", (int)(slash - info.dli_fname), info.dli_fname,
               t->file);
      const attn_transport_ops *ops = try_open(t, path, why, why_size);
      if (ops != NULL) return ops;
    }
  }
  const attn_transport_ops *ops = try_open(t, t->file, why, why_size);
  if (ops == NULL && first_error[0] != '\0') snprintf(why, why_size, "%s", first_error);
  return ops;
}

attn_status attn_dist_load_transport(int32_t transport, const attn_transport_ops **ops, char *why,
                                     size_t why_size) {
  *ops = NULL;
  for (size_t i = 0; i < TRANSPORT_COUNT; ++i) {
    if (transports[i].transport != transport) continue;
    pthread_mutex_lock(&load_lock);
    if (loaded[i] == NULL) {
      char err[1024] = "";
      loaded[i] = open_module(&transports[i], err, sizeof err);
      if (loaded[i] == NULL)
        snprintf(why, why_size,
                 "the %s transport module %s could not be loaded (%s); build libattn "
                 "with %s found, or set ATTN_MODULE_PATH to its folder",
                 transports[i].name, transports[i].file, err, transports[i].name);
    }
    *ops = loaded[i];
    pthread_mutex_unlock(&load_lock);
    return *ops != NULL ? ATTN_STATUS_OK : ATTN_STATUS_IO_ERROR;
  }
  snprintf(why, why_size, "transport=%d is not an attn_dist_transport (MPI = 0, NCCL = 1)",
           (int)transport);
  return ATTN_STATUS_INVALID_ARGUMENT;
}

int32_t attn_dist_transport_available(int32_t transport, char *why, size_t size) {
  const attn_transport_ops *ops;
  char err[1200] = "";
  attn_status status = attn_dist_load_transport(transport, &ops, err, sizeof err);
  if (why != NULL && size > 0) snprintf(why, size, "%s", status == ATTN_STATUS_OK ? "" : err);
  return status == ATTN_STATUS_OK;
}
