/*
 * src/impl/cuda/cuda_mbarrier.cuh - shared-memory mbarriers (sm_90) and the one-dimensional bulk
 * copy that completes on them: what the Hopper forward and backward (sm90/) and the decode
 * kernel's bulk K/V copies (cuda_decode.cu) wait on. Callers compile these only for sm_90.
 */
#ifndef ATTN_IMPL_CUDA_CUDA_MBARRIER_CUH
#define ATTN_IMPL_CUDA_CUDA_MBARRIER_CUH

#include <stdint.h>

namespace attn_cuda {

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
/* One arrival that also says how many bytes the copies completing on this phase will bring. */
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/* Waits until the phase of the given parity has completed (a barrier starts in phase 0, so
 * waiting for parity 1 on a fresh barrier returns at once: how a producer finds empty buffers). */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile("{\n.reg .pred done;\nWAIT:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
               "@!done bra WAIT;\n}\n" ::"r"(bar),
               "r"(parity)
               : "memory");
}

/* bytes (a multiple of 16, both addresses 16-byte aligned) global -> shared by the copy engine,
 * counted on bar's transaction count. */
__device__ __forceinline__ void bulk_load(uint32_t dst, const void *src, uint32_t bytes,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

} // namespace attn_cuda

#endif /* ATTN_IMPL_CUDA_CUDA_MBARRIER_CUH */
