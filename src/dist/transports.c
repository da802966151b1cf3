/*
 * src/dist/transports.c - THE list of transports, and the loading of their run-time modules.
 *
 * A transport is a module (libattn_<name>.so) exporting attn_transport_<name>_entry(), which
 * returns its table (dist/transport.h). Adding one is a line here, its source in src/dist/ and a
 * MODULE target in CMakeLists.txt. Modules are found where the GPU modules are
 * (attn_module_open, src/module/loader.c). A module loaded once stays loaded: its table is used
 * by plans that may outlive any one caller.
 */
#include "dist/dist.h"

#include "module/module.h"

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
    {ATTN_DIST_TRANSPORT_TEST_LOOPBACK, "loopback (tests only)", "libattn_test_loopback.so",
     "attn_transport_loopback_entry"},
};
#define TRANSPORT_COUNT (sizeof transports / sizeof transports[0])

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static const attn_transport_ops *loaded[TRANSPORT_COUNT];

/* attn_module_open's check of a transport module: its table must have this interface. */
static int accept_ops(void *symbol, void *arg, char *why, size_t why_size) {
  attn_transport_entry_fn entry;
  /* POSIX's way from dlsym's data pointer to a function pointer, without ISO C's cast. */
  memcpy(&entry, &symbol, sizeof entry);
  const attn_transport_ops *ops = entry();
  if (ops == NULL || ops->abi != ATTN_TRANSPORT_ABI) {
    snprintf(why, why_size, "built for transport interface %d, libattn needs %d",
             ops == NULL ? -1 : (int)ops->abi, ATTN_TRANSPORT_ABI);
    return 0;
  }
  *(const attn_transport_ops **)arg = ops;
  return 1;
}

static const attn_transport_ops *open_module(const transport_entry *t, char *why, size_t why_size) {
  const attn_transport_ops *ops = NULL;
  char path[1024];
  if (attn_module_open(t->file, t->entry, accept_ops, &ops, path, sizeof path, why, why_size) ==
      NULL)
    return NULL;
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
