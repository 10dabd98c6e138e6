// Thread-block cluster and mbarrier primitives (sm_90) shared by the CUDA C kernels whose CTAs
// meet through distributed shared memory: softmax_fused.cu, softmax_backward.cu and
// cross_entropy.cu. Raw PTX, so no cooperative_groups header is needed; header-free like
// softmax_common.cuh (which must come first), and pasted in place of its #include line by
// kernels/cuda_build.py (expand_includes).


// ---- cluster primitives ------------------------------------------------------------------------
// No memory ordering: for a rendezvous whose data is ordered otherwise (an mbarrier's init, by
// fence.mbarrier_init), so the arrival need not wait for this thread's earlier stores.
__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
    asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
}
// The address of `local`'s twin in the shared memory of the CTA of cluster rank `rank`.
__device__ __forceinline__ unsigned dsmem_address(const void* local, unsigned rank) {
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(local));
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(addr), "r"(rank));
    return remote;
}
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}

// ---- mbarriers ---------------------------------------------------------------------------------
__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
// The barrier completes its phase once this arrival is in and `bytes` have landed.
__device__ __forceinline__ void mbar_expect_bytes(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_%=;\n"
        "}\n" ::"r"(smem_u32(bar)),
        "r"(parity)
        : "memory");
}

// ---- pushes into a peer's shared memory --------------------------------------------------------
// A 32- or 64-bit word into `slot`'s twin in the CTA of rank `rank`, counted in bytes on that
// CTA's twin of `bar` (st.async: no fence, nothing waits for this CTA's earlier global stores).
__device__ __forceinline__ void push_b32(const void* slot, unsigned v, const unsigned long long* bar, unsigned rank) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(
                     dsmem_address(slot, rank)),
                 "r"(v), "r"(dsmem_address(bar, rank))
                 : "memory");
}
__device__ __forceinline__ void push_b64(const void* slot, long long v, const unsigned long long* bar,
                                         unsigned rank) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];\n" ::"r"(
                     dsmem_address(slot, rank)),
                 "l"(v), "r"(dsmem_address(bar, rank))
                 : "memory");
}

// A meeting's two mbarriers (any struct M with `unsigned long long bar[2]`) initialised for the
// cluster. Every thread calls it once, before the first meeting; peers may push only after it
// returns.
template <class M>
__device__ __forceinline__ void meet_init(M& mt) {
    if (threadIdx.x == 0) {
        mbar_init(&mt.bar[0], 1);
        mbar_init(&mt.bar[1], 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    cluster_arrive_relaxed();
    cluster_wait();
}

// v ^ z with z == 0 at run time but not provably so at compile time. Widening the same packed
// words in two passes would otherwise be merged into one by the compiler (nvcc and ptxas alike),
// keeping every fp32 copy live between the passes: exactly the registers the packed form is
// there to save. Each pass gets its own zero, so no two passes look alike.
__device__ __forceinline__ uint4 xor_words(uint4 v, unsigned z) {
    return make_uint4(v.x ^ z, v.y ^ z, v.z ^ z, v.w ^ z);
}
