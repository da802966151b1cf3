/*
 * src/module/entry.c - the one exported symbol of a GPU module (module.h). Compiled into each
 * module with ATTN_MODULE_TABLE naming that module's table function (attn_cuda_module, ...), so
 * every module exports the same name and the loader needs no per-module knowledge.
 */
#include "module/module.h"

#ifndef ATTN_MODULE_TABLE
#error "compile with -DATTN_MODULE_TABLE=<the module's table function>"
#endif

const attn_module_table *ATTN_MODULE_TABLE(void);

/* The name must be ATTN_MODULE_ENTRY's. */
__attribute__((visibility("default"))) const attn_module_table *attn_module_entry_v3(void);
const attn_module_table *attn_module_entry_v3(void) { return ATTN_MODULE_TABLE(); }
