/*
 * src/core/format.c - attn_format (declared in ctx.h), alone in its file because the GPU modules
 * compile it too: with dtype.c and tensors.c it is all of the core that their code calls.
 */
#include "core/ctx.h"

#include <stdarg.h>
#include <stdio.h>

void attn_format(char *buf, size_t size, const char *fmt, ...) {
  if (buf == NULL || size == 0) return;
  va_list args;
  va_start(args, fmt);
  vsnprintf(buf, size, fmt, args);
  va_end(args);
}
