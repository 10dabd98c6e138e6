// v3 fused: the row is read once and written once; between the two it lives in registers.
// Adds over v2: one memory round trip instead of three, 16-byte vector accesses, fp32 maths on
// fp32/bf16/fp16 storage, and a size class per row length (picked by the Python dispatch table)
// so the per-thread arrays have compile-time sizes and stay in registers.
//
//   fused_warp    V <= 128: one warp per row, element-wise loads (nothing to peel). A block
//                 reduction would cost more than the row itself; shuffles need no barrier.
//   fused_warpvec V <= 1024: one warp per row as well, 16-byte vectors with a head/tail peel
//                 (4-8x fewer memory instructions: bf16 at V = 600 went from 1.9 to 3.1 TB/s).
//   fused_row     one block per row slice, the slice held in registers as 16-byte vectors.
//                 PACKED (16-bit formats): the vectors stay in storage form, two elements per
//                 register, so a thread holds twice the elements (and the same bytes) as fp32.
//                 C == 1: the block owns the whole row.
//                 C  > 1: a thread-block cluster owns the row, each CTA a contiguous slice;
//                 the CTAs swap their maxima, then their sums, through distributed shared memory.
//                 This keeps 200-500 KB rows on chip and spreads a few long rows over many SMs.
//   fused_online  rows too long for any of the above: three passes (max, sum, write); the
//                 re-reads are served mostly by L2.
//
// Every kind sums exp(x - max) in 64-bit fixed point (softmax_common.cuh), so a row's output
// bits depend only on its values and V: not on B, on which CTA or lane held which element, on
// the row's alignment (the head/tail peel changes how elements are loaded, never how they are
// combined), or on the size class.
//
// Instantiations are appended by kernels/softmax_cuda.py from its dispatch table, so the
// kernels compiled here are exactly the ones the dispatcher can launch.
#include "softmax_common.cuh"


// ---- cluster primitives (sm_90), as raw PTX so no cooperative_groups header is needed -------
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

// ---- mbarriers (sm_90) ------------------------------------------------------------------------
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
// ---- the cluster's two meetings per row, without fences ---------------------------------------
// Each CTA pushes its part (the slice max, then the slice's fixed-point sum) into a slot of every
// peer's shared memory with st.async, which counts its bytes on the peer's mbarrier; each CTA
// then waits on its own barrier and combines the C parts in rank order. Unlike a cluster barrier
// with release semantics, nothing here waits for the CTA's earlier global stores to drain (that
// fence was the kernels' first stall reason under Nsight Compute), so one row's stores overlap
// the next row's loads and meetings.
//
// Reuse is safe without a barrier per row: a peer can push row i + 1's max only after it has
// this CTA's row i sum, which this CTA sends after all its threads have read row i's maxima
// (the block reduction between is a __syncthreads); likewise for the sums. Phase parity is the
// row's count within the CTA, & 1.
template <int C>
struct ClusterMeet {
    long long sum_in[C];
    float max_in[C];
    unsigned long long bar[2];  // [0] the maxima, [1] the sums
};

// Every thread calls it once, before the first meeting; peers may push only after it returns.
template <int C>
__device__ __forceinline__ void meet_init(ClusterMeet<C>& mt) {
    if (threadIdx.x == 0) {
        mbar_init(&mt.bar[0], 1);
        mbar_init(&mt.bar[1], 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    cluster_arrive_relaxed();
    cluster_wait();
}

__device__ __forceinline__ void push_f32(const float* slot, float v, const unsigned long long* bar, unsigned rank) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(
                     dsmem_address(slot, rank)),
                 "r"(__float_as_uint(v)), "r"(dsmem_address(bar, rank))
                 : "memory");
}
__device__ __forceinline__ void push_s64(const long long* slot, long long v, const unsigned long long* bar,
                                         unsigned rank) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];\n" ::"r"(
                     dsmem_address(slot, rank)),
                 "l"(v), "r"(dsmem_address(bar, rank))
                 : "memory");
}

// The row's max from this CTA's `m` (the same in every thread); every thread gets it.
template <int C>
__device__ __forceinline__ float meet_max(ClusterMeet<C>& mt, float m, unsigned rank, unsigned parity) {
    const int tid = threadIdx.x;
    if (tid == 0) mbar_expect_bytes(&mt.bar[0], C * 4u);
    if (tid < C) push_f32(&mt.max_in[rank], m, &mt.bar[0], static_cast<unsigned>(tid));
    mbar_wait(&mt.bar[0], parity);
    float r = mt.max_in[0];
#pragma unroll
    for (int c = 1; c < C; ++c) r = fmaxf(r, mt.max_in[c]);
    return r;
}

// The row's fixed-point sum from this CTA's `s` (the same in every thread).
template <int C>
__device__ __forceinline__ long long meet_sum(ClusterMeet<C>& mt, long long s, unsigned rank, unsigned parity) {
    const int tid = threadIdx.x;
    if (tid == 0) mbar_expect_bytes(&mt.bar[1], C * 8u);
    if (tid < C) push_s64(&mt.sum_in[rank], s, &mt.bar[1], static_cast<unsigned>(tid));
    mbar_wait(&mt.bar[1], parity);
    long long r = 0;
#pragma unroll
    for (int c = 0; c < C; ++c) r += mt.sum_in[c];
    return r;
}

// v ^ z with z == 0 at run time but not provably so at compile time. Widening the same packed
// words in two passes would otherwise be merged into one by the compiler (nvcc and ptxas alike),
// keeping every fp32 copy and every exp live between the passes: exactly the registers the
// packed form is there to save. Each pass gets its own zero, so no two passes look alike.
__device__ __forceinline__ uint4 xor_words(uint4 v, unsigned z) {
    return make_uint4(v.x ^ z, v.y ^ z, v.z ^ z, v.w ^ z);
}

// ---- warp per row ---------------------------------------------------------------------------
// Lane l holds elements l, l+32, l+64, ...: each load instruction of the warp reads 32
// consecutive elements, so accesses coalesce at any row alignment without a peel.
template <class Fmt, int EW, int WPB>
__device__ __forceinline__ void fused_warp_body(const typename Fmt::T* __restrict__ x,
                                                typename Fmt::T* __restrict__ y,
                                                long long n_rows, int n_cols) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const float fscale = fixed_point_scale(n_cols);
    const long long stride = static_cast<long long>(gridDim.x) * WPB;
    for (long long row = static_cast<long long>(blockIdx.x) * WPB + warp; row < n_rows; row += stride) {
        const typename Fmt::T* xr = x + row * n_cols;
        typename Fmt::T* yr = y + row * n_cols;
        float v[EW];
        // All loads are issued before any use, so EW requests per lane are in flight at once.
#pragma unroll
        for (int i = 0; i < EW; ++i) {
            const int c = i * 32 + lane;
            v[i] = c < n_cols ? Fmt::load1(xr + c) : SOFTMAX_NEG_INF;
        }
        float m = v[0];
#pragma unroll
        for (int i = 1; i < EW; ++i) m = fmaxf(m, v[i]);
        m = warp_max(m);
        // Padding (-inf) contributes exp(-inf) = 0. An all -inf row gives NaN, as torch does.
        long long s = 0;
#pragma unroll
        for (int i = 0; i < EW; ++i) {
            v[i] = softmax_exp<Fmt>(v[i], m);
            s += to_fixed(v[i], fscale);
        }
        const RowScale rs = row_scale(warp_sum_fixed(s), fscale);
#pragma unroll
        for (int i = 0; i < EW; ++i) {
            const int c = i * 32 + lane;
            if (c < n_cols) Fmt::store1(yr + c, softmax_normalise<Fmt>(v[i], rs));
        }
    }
}

// ---- warp, block (C == 1) or cluster (C > 1) per row -----------------------------------------
// NT threads own a row slice; thread t holds body vectors t, t+NT, t+2NT, ... of it (a warp's
// load covers 512 consecutive bytes) plus at most one head and one tail element. Capacity:
// E * NT elements per slice; the dispatcher guarantees ceil(V / C) <= E * NT.
// NT == 32 is the vectorised warp-per-row form: RPB rows per block, one per warp, reduced with
// shuffles only (the block reductions skip shared memory for a single warp).
//
// PACKED keeps the body as the raw uint4 vectors that were loaded and widens them to fp32 in each
// pass; exp is then evaluated twice (once for the sum, once for the output) with the same
// expression, so the values written are exactly those summed. Without it the body is held
// as fp32 (E registers). For 16-bit storage PACKED halves the registers per element, which lets
// a thread keep as many bytes in flight as an fp32 thread does.
//
// A cluster meets twice through distributed shared memory: first for the row's max (each CTA's
// slice max), then for the row's fixed-point sum relative to that max. Exact max and integer
// sum make the result independent of where the slices were cut.
//
// out_vec_ok says whether y - x is a multiple of 16 bytes. Then the output slice has the same
// alignment as the input slice and the body is stored as vectors; otherwise element by element.
template <class Fmt, int NT, int E, int C, int RPB, bool PACKED>
__device__ __forceinline__ void fused_row_body(const typename Fmt::T* __restrict__ x,
                                               typename Fmt::T* __restrict__ y,
                                               long long n_rows, int n_cols, int out_vec_ok) {
    typedef typename Fmt::T T;
    constexpr int VEC = Fmt::VEC;
    constexpr int NV = E / VEC;  // vectors per thread
    constexpr int NW = NT / 32;
    static_assert(E % VEC == 0, "elements per thread must be whole vectors");
    static_assert(NT % 32 == 0 && NT >= 32 && NT * RPB <= 1024, "block size");
    static_assert(C >= 1 && C <= 8, "portable cluster size");
    static_assert(RPB == 1 || (NT == 32 && C == 1), "several rows per block only for warp rows");
    constexpr int NVF = PACKED ? 1 : NV;  // fp32 copies held (a dummy of one when PACKED)
    constexpr int NVR = PACKED ? NV : 1;  // raw vectors held (a dummy of one otherwise)

    __shared__ float red_max[NW];
    __shared__ long long red_sum[NW];
    __shared__ ClusterMeet<C> meet;  // unused when C == 1

    const int tid = (RPB == 1) ? static_cast<int>(threadIdx.x) : static_cast<int>(threadIdx.x) % NT;
    const int sub = (RPB == 1) ? 0 : static_cast<int>(threadIdx.x) / NT;
    // Slices are a multiple of 8 elements long, so when the row is 16-byte aligned every
    // slice is too. Slices past the row end are empty and contribute (-inf, 0).
    const unsigned rank = (C > 1) ? cluster_rank() : 0u;
    const int chunk = (C > 1) ? ((n_cols + C - 1) / C + 7) / 8 * 8 : n_cols;
    const int start = min(static_cast<int>(rank) * chunk, n_cols);
    const int len = min(n_cols - start, chunk);
    const float fscale = fixed_point_scale(n_cols);
    const long long row_stride = static_cast<long long>(gridDim.x / C) * RPB;
    // Zeros for xor_words: n_cols >= 1 and n_rows >= 1, so both sign words are 0.
    const unsigned zero_a = static_cast<unsigned>(n_cols >> 31);
    const unsigned zero_b = static_cast<unsigned>(n_rows >> 63);

    // Every CTA of a cluster walks the same row sequence, so all meet equally often.
    if (C > 1) meet_init(meet);
    unsigned parity = 0;
    for (long long row = static_cast<long long>(blockIdx.x / C) * RPB + sub; row < n_rows;
         row += row_stride, parity ^= 1u) {
        const T* xs = x + row * n_cols + start;
        T* ys = y + row * n_cols + start;
        const SliceGeom<VEC, T> g(xs, len);
        const uint4* xv = reinterpret_cast<const uint4*>(xs + g.head);

        // All loads are issued before the first use: E elements per thread in flight at once.
        float v[NVF][VEC];
        uint4 r[NVR];
#pragma unroll
        for (int j = 0; j < NV; ++j) {
            const int vi = j * NT + tid;
            if constexpr (PACKED) {
                // Vectors past the slice hold -inf words: no mass, and never stored.
                r[j] = vi < g.nvec ? ld_once(xv + vi)
                                   : make_uint4(Fmt::NEG_INF_WORD, Fmt::NEG_INF_WORD,
                                                Fmt::NEG_INF_WORD, Fmt::NEG_INF_WORD);
            } else if (vi < g.nvec) {
                Fmt::unpack(ld_once(xv + vi), v[j]);
            } else {
#pragma unroll
                for (int k = 0; k < VEC; ++k) v[j][k] = SOFTMAX_NEG_INF;
            }
        }
        float hv = tid < g.head ? Fmt::load1(xs + tid) : SOFTMAX_NEG_INF;
        float tv = tid < g.tail ? Fmt::load1(xs + g.tail0 + tid) : SOFTMAX_NEG_INF;

        float m = fmaxf(hv, tv);
#pragma unroll
        for (int j = 0; j < NV; ++j) {
            if constexpr (PACKED) {
                float f[VEC];
                Fmt::unpack(r[j], f);
#pragma unroll
                for (int k = 0; k < VEC; ++k) m = fmaxf(m, f[k]);
            } else {
#pragma unroll
                for (int k = 0; k < VEC; ++k) m = fmaxf(m, v[j][k]);
            }
        }
        m = block_max<NW>(m, red_max);
        if (C > 1) m = meet_max(meet, m, rank, parity);

        // exp(x - row max), kept in place (softmax_common.cuh). An all -inf row gives
        // NaN throughout, as torch does; -inf elements of any other row give 0.
        hv = softmax_exp<Fmt>(hv, m);
        tv = softmax_exp<Fmt>(tv, m);
        long long s = to_fixed(hv, fscale) + to_fixed(tv, fscale);
#pragma unroll
        for (int j = 0; j < NV; ++j) {
            if constexpr (PACKED) {
                float f[VEC];
                Fmt::unpack(xor_words(r[j], zero_a), f);
#pragma unroll
                for (int k = 0; k < VEC; ++k) s += to_fixed(softmax_exp<Fmt>(f[k], m), fscale);
            } else {
#pragma unroll
                for (int k = 0; k < VEC; ++k) {
                    v[j][k] = softmax_exp<Fmt>(v[j][k], m);
                    s += to_fixed(v[j][k], fscale);
                }
            }
        }
        s = block_sum_fixed<NW>(s, red_sum);
        if (C > 1) s = meet_sum(meet, s, rank, parity);
        const RowScale rs = row_scale(s, fscale);

        uint4* yv = reinterpret_cast<uint4*>(ys + g.head);
#pragma unroll
        for (int j = 0; j < NV; ++j) {
            const int vi = j * NT + tid;
            if (vi < g.nvec) {
                float o[VEC];
                if constexpr (PACKED) {
                    Fmt::unpack(xor_words(r[j], zero_b), o);
#pragma unroll
                    for (int k = 0; k < VEC; ++k) o[k] = softmax_normalise<Fmt>(softmax_exp<Fmt>(o[k], m), rs);
                } else {
#pragma unroll
                    for (int k = 0; k < VEC; ++k) o[k] = softmax_normalise<Fmt>(v[j][k], rs);
                }
                if (out_vec_ok) {
                    st_once(yv + vi, Fmt::pack(o));
                } else {
                    T* yp = ys + g.head + vi * VEC;
#pragma unroll
                    for (int k = 0; k < VEC; ++k) Fmt::store1(yp + k, o[k]);
                }
            }
        }
        if (tid < g.head) Fmt::store1(ys + tid, softmax_normalise<Fmt>(hv, rs));
        if (tid < g.tail) Fmt::store1(ys + g.tail0 + tid, softmax_normalise<Fmt>(tv, rs));
        // (red_max / red_sum need no barrier before the next row: each is rewritten only after
        // the other reduction's barrier, which every thread passes after reading it.)
    }
}

// ---- general fallback: three passes ----------------------------------------------------------
// For rows beyond the register capacity of a cluster: the block finds the row's max, then its
// fixed-point sum, then writes it, reading the row three times (EL elements, EL / VEC vector
// loads, in flight per thread at a time; the re-reads are served mostly by L2).
template <class Fmt, int NT, int EL>
__device__ __forceinline__ void fused_online_body(const typename Fmt::T* __restrict__ x,
                                                  typename Fmt::T* __restrict__ y,
                                                  long long n_rows, int n_cols, int out_vec_ok) {
    typedef typename Fmt::T T;
    constexpr int VEC = Fmt::VEC;
    constexpr int NW = NT / 32;
    constexpr int U = EL / VEC;
    static_assert(EL % VEC == 0, "elements per step must be whole vectors");
    __shared__ float red_m[NW];
    __shared__ long long red_s[NW];
    const int tid = threadIdx.x;
    const float fscale = fixed_point_scale(n_cols);

    for (long long row = blockIdx.x; row < n_rows; row += gridDim.x) {
        const T* xs = x + row * n_cols;
        T* ys = y + row * n_cols;
        const SliceGeom<VEC, T> g(xs, n_cols);
        const uint4* xv = reinterpret_cast<const uint4*>(xs + g.head);

        const float hx = tid < g.head ? Fmt::load1_cached(xs + tid) : SOFTMAX_NEG_INF;
        const float tx = tid < g.tail ? Fmt::load1_cached(xs + g.tail0 + tid) : SOFTMAX_NEG_INF;
        float m = fmaxf(hx, tx);
        for (int base = 0; base < g.nvec; base += U * NT) {
            float f[U][VEC];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int vi = base + u * NT + tid;
                if (vi < g.nvec) {
                    Fmt::unpack(__ldg(xv + vi), f[u]);  // keep it in L2 for the next passes
                } else {
#pragma unroll
                    for (int k = 0; k < VEC; ++k) f[u][k] = SOFTMAX_NEG_INF;
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int k = 0; k < VEC; ++k) m = fmaxf(m, f[u][k]);
        }
        m = block_max<NW>(m, red_m);

        long long s = to_fixed(softmax_exp<Fmt>(hx, m), fscale) + to_fixed(softmax_exp<Fmt>(tx, m), fscale);
        for (int base = 0; base < g.nvec; base += U * NT) {
            float f[U][VEC];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int vi = base + u * NT + tid;
                if (vi < g.nvec) {
                    Fmt::unpack(__ldg(xv + vi), f[u]);
                } else {
#pragma unroll
                    for (int k = 0; k < VEC; ++k) f[u][k] = SOFTMAX_NEG_INF;
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int k = 0; k < VEC; ++k) s += to_fixed(softmax_exp<Fmt>(f[u][k], m), fscale);
        }
        s = block_sum_fixed<NW>(s, red_s);
        const RowScale rs = row_scale(s, fscale);

        if (tid < g.head) Fmt::store1(ys + tid, softmax_normalise<Fmt>(softmax_exp<Fmt>(hx, m), rs));
        if (tid < g.tail) Fmt::store1(ys + g.tail0 + tid, softmax_normalise<Fmt>(softmax_exp<Fmt>(tx, m), rs));
        uint4* yv = reinterpret_cast<uint4*>(ys + g.head);
        for (int base = 0; base < g.nvec; base += U * NT) {
            float f[U][VEC];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int vi = base + u * NT + tid;
                if (vi < g.nvec) Fmt::unpack(ld_once(xv + vi), f[u]);
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int vi = base + u * NT + tid;
                if (vi < g.nvec) {
#pragma unroll
                    for (int k = 0; k < VEC; ++k) f[u][k] = softmax_normalise<Fmt>(softmax_exp<Fmt>(f[u][k], m), rs);
                    if (out_vec_ok) {
                        st_once(yv + vi, Fmt::pack(f[u]));
                    } else {
                        T* yp = ys + g.head + vi * VEC;
#pragma unroll
                        for (int k = 0; k < VEC; ++k) Fmt::store1(yp + k, f[u][k]);
                    }
                }
            }
        }
        __syncthreads();  // red_m / red_s are read by all before the next row overwrites them
    }
}

// ---- kernel entry points (extern "C": plain names, nothing to demangle) ---------------------
#define SOFTMAX_FUSED_WARP(NAME, FMT, EW, WPB)                                                   \
    extern "C" __global__ void __launch_bounds__((WPB) * 32, 1024 / ((WPB) * 32))                \
    NAME(const FMT::T* __restrict__ x, FMT::T* __restrict__ y, long long n_rows, int n_cols) { \
        fused_warp_body<FMT, EW, WPB>(x, y, n_rows, n_cols);                                     \
    }

// Launch bounds ask for 1024 threads' worth of CTAs per SM, i.e. at most 64 registers a thread:
// that keeps two or more CTAs resident so one CTA's loads overlap another's reductions.
#define SOFTMAX_FUSED_ROW(NAME, FMT, NT, E, PACKED)                                              \
    extern "C" __global__ void __launch_bounds__(NT, 1024 / (NT))                                \
    NAME(const FMT::T* __restrict__ x, FMT::T* __restrict__ y, long long n_rows, int n_cols,   \
         int out_vec_ok) {                                                                       \
        fused_row_body<FMT, NT, E, 1, 1, PACKED>(x, y, n_rows, n_cols, out_vec_ok);              \
    }

// One warp per row, RPB rows per block, vector accesses.
#define SOFTMAX_FUSED_WARPVEC(NAME, FMT, E, RPB)                                                 \
    extern "C" __global__ void __launch_bounds__(32 * (RPB), 1024 / (32 * (RPB)))               \
    NAME(const FMT::T* __restrict__ x, FMT::T* __restrict__ y, long long n_rows, int n_cols,   \
         int out_vec_ok) {                                                                       \
        fused_row_body<FMT, 32, E, 1, RPB, false>(x, y, n_rows, n_cols, out_vec_ok);             \
    }

// Thread-block clusters exist from sm_90 on; on older targets these entry points are left out
// and the dispatcher does not ask for them.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define SOFTMAX_FUSED_CLUSTER(NAME, FMT, NT, E, C, PACKED)                                       \
    extern "C" __global__ void __cluster_dims__(C, 1, 1) __launch_bounds__(NT, 1024 / (NT))     \
    NAME(const FMT::T* __restrict__ x, FMT::T* __restrict__ y, long long n_rows, int n_cols,   \
         int out_vec_ok) {                                                                       \
        fused_row_body<FMT, NT, E, C, 1, PACKED>(x, y, n_rows, n_cols, out_vec_ok);              \
    }
#else
#define SOFTMAX_FUSED_CLUSTER(NAME, FMT, NT, E, C, PACKED)
#endif

#define SOFTMAX_FUSED_ONLINE(NAME, FMT, NT, EL)                                                   \
    extern "C" __global__ void __launch_bounds__(NT, 1)                                          \
    NAME(const FMT::T* __restrict__ x, FMT::T* __restrict__ y, long long n_rows, int n_cols,   \
         int out_vec_ok) {                                                                       \
        fused_online_body<FMT, NT, EL>(x, y, n_rows, n_cols, out_vec_ok);                         \
    }
