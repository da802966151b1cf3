/*
 * src/core/dtype.c - the public dtype queries and conversions.
 */
#include "core/dtype.h"

size_t attn_dtype_size(attn_dtype dtype) {
  switch (dtype) {
  case ATTN_DTYPE_F32: return 4;
  case ATTN_DTYPE_F16: return 2;
  case ATTN_DTYPE_BF16: return 2;
  case ATTN_DTYPE_F64: return 8;
  case ATTN_DTYPE_U8: return 1;
  case ATTN_DTYPE_I32: return 4;
  case ATTN_DTYPE_F8E4M3: return 1;
  case ATTN_DTYPE_COUNT: break;
  }
  return 0;
}

const char *attn_dtype_name(attn_dtype dtype) {
  switch (dtype) {
  case ATTN_DTYPE_F32: return "f32";
  case ATTN_DTYPE_F16: return "f16";
  case ATTN_DTYPE_BF16: return "bf16";
  case ATTN_DTYPE_F64: return "f64";
  case ATTN_DTYPE_U8: return "u8";
  case ATTN_DTYPE_I32: return "i32";
  case ATTN_DTYPE_F8E4M3: return "f8e4m3";
  case ATTN_DTYPE_COUNT: break;
  }
  return "unknown";
}

/* The public conversions are dtype.h's inline ones, so a user's values round exactly as the
 * library's own. */
uint16_t attn_f32_to_bf16(float value) { return attn_inline_f32_to_bf16(value); }
float attn_bf16_to_f32(uint16_t bits) { return attn_inline_bf16_to_f32(bits); }
uint16_t attn_f32_to_f16(float value) { return attn_inline_f32_to_f16(value); }
float attn_f16_to_f32(uint16_t bits) { return attn_inline_f16_to_f32(bits); }
uint8_t attn_f32_to_f8e4m3(float value) { return attn_inline_f64_to_f8e4m3(value); }
float attn_f8e4m3_to_f32(uint8_t bits) { return attn_inline_f8e4m3_to_f32(bits); }
