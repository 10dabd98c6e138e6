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
//                 ES > 0: each thread keeps ES more elements in shared memory (cp.async), so
//                 8-CTA clusters hold rows of up to 1 MB on chip. (Clusters of up to 16 CTAs,
//                 a non-portable size on sm_90, compile and launch too; reports/profiles.md
//                 says why the dispatch table does not use them.)
//   fused_split   P CTAs per row, each a slice in registers and shared memory as above,
//                 meeting through a per-row workspace in global memory (no cluster needed, so
//                 P is not bounded by 16): rows past the largest cluster class; a small batch
//                 is cut finer, over about one CTA per SM.
//   fused_loop    rows too long for any of the above: P CTAs per row meet as split does, each
//                 walking its slice in three passes (max, sum, write); the re-reads are served
//                 mostly by L2.
//
// Every kind sums exp(x - max) in 64-bit fixed point (softmax_common.cuh), so a row's output
// bits depend only on its values and V: not on B, on which CTA or lane held which element, on
// the row's alignment (the head/tail peel changes how elements are loaded, never how they are
// combined), or on the size class.
//
// Instantiations are appended by kernels/softmax_cuda.py from its dispatch table, so the
// kernels compiled here are exactly the ones the dispatcher can launch.
#include "softmax_common.cuh"
#include "cluster_common.cuh"


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

// The row's max from this CTA's `m` (the same in every thread); every thread gets it.
template <int C>
__device__ __forceinline__ float meet_max(ClusterMeet<C>& mt, float m, unsigned rank, unsigned parity) {
    const int tid = threadIdx.x;
    if (tid == 0) mbar_expect_bytes(&mt.bar[0], C * 4u);
    if (tid < C) push_b32(&mt.max_in[rank], __float_as_uint(m), &mt.bar[0], static_cast<unsigned>(tid));
    mbar_wait(&mt.bar[0], parity);
    float r = mt.max_in[0];
#pragma unroll
    for (int c = 1; c < C; ++c) r = fmax_nan(r, mt.max_in[c]);
    return r;
}

// The row's fixed-point sum from this CTA's `s` (the same in every thread).
template <int C>
__device__ __forceinline__ long long meet_sum(ClusterMeet<C>& mt, long long s, unsigned rank, unsigned parity) {
    const int tid = threadIdx.x;
    if (tid == 0) mbar_expect_bytes(&mt.bar[1], C * 8u);
    if (tid < C) push_b64(&mt.sum_in[rank], s, &mt.bar[1], static_cast<unsigned>(tid));
    mbar_wait(&mt.bar[1], parity);
    long long r = 0;
#pragma unroll
    for (int c = 0; c < C; ++c) r += mt.sum_in[c];
    return r;
}

// ---- meetings through global memory: the split and loop paths ----------------------------
// P CTAs share a row, each its own slice, and meet twice through eight 32-bit words of the row in
// a workspace that the host zeroes once and every launch leaves zeroed:
//   w[0]     the row's max as an order-preserving key (an atomic max)
//   w[1]     CTAs that have folded in their max        w[2]  likewise for their sum
//   w[3]     CTAs done with the row: the last one out zeroes the row's words for the next launch
//   w[4..5]  the row's fixed-point sum (a 64-bit atomic add: integer addition, any order)
// Thread 0 publishes the CTA's part, then polls the counter; an acquire load that sees all P
// arrivals sees every part folded in before them (each arrival is a release). The wait is
// bounded: a CTA whose partners are not resident in time (another kernel holds the SMs, or a
// capped grid gave one CTA several parts of a row) reads the whole row itself for the same
// exact max and the same integer sum, so nothing can deadlock and the bits are the same.
struct SplitArgs {
    unsigned* ws;   // 8 words per row; null when parts == 1
    int parts;      // CTAs per row
    int max_polls;  // polls of a counter before a CTA reads the row itself
};

// Float order as unsigned order: the sign bit flipped for positives, every bit for negatives.
__device__ __forceinline__ unsigned max_key(float f) {
    const unsigned u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_max(unsigned k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
__device__ __forceinline__ unsigned ld_acquire_u32(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ unsigned ld_relaxed_u32(const unsigned* p) {
    unsigned v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ unsigned long long ld_relaxed_u64(const unsigned* p) {
    unsigned long long v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];\n" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void red_max_u32(unsigned* p, unsigned v) {
    asm volatile("red.relaxed.gpu.global.max.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void red_add_u64(unsigned* p, unsigned long long v) {
    asm volatile("red.relaxed.gpu.global.add.u64 [%0], %1;\n" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void arrive_release(unsigned* p) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(p) : "memory");
}
__device__ __forceinline__ unsigned leave_acq_rel(unsigned* p) {
    unsigned old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n" : "=r"(old) : "l"(p) : "memory");
    return old;
}
__device__ __forceinline__ void zero_words4(unsigned* p) {
    asm volatile("st.relaxed.gpu.global.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"l"(p), "r"(0u) : "memory");
}
// True once `n` CTAs have arrived at *cnt; false after `max_polls` further polls without.
__device__ __forceinline__ bool await_arrivals(const unsigned* cnt, unsigned n, int max_polls) {
    unsigned pause = 32;
    for (int i = 0;; ++i) {
        if (ld_acquire_u32(cnt) >= n) return true;
        if (i >= max_polls) return false;
        asm volatile("nanosleep.u32 %0;\n" ::"r"(pause));
        pause = min(pause * 2u, 256u);
    }
}

// The whole row's max and fixed-point sum, read by this CTA alone (the fallback of a wait that
// ran out). The same values the meetings give: the max is exact in any order, the sum integer.
template <class Fmt, int NT>
__device__ __forceinline__ float streamed_max(const typename Fmt::T* xr, int n_cols, float* red) {
    float m = SOFTMAX_NEG_INF;
    for (int i = threadIdx.x; i < n_cols; i += NT) m = fmax_nan(m, Fmt::load1_cached(xr + i));
    return block_max<NT / 32>(m, red);
}
template <class Fmt, int NT>
__device__ __forceinline__ long long streamed_sum(const typename Fmt::T* xr, int n_cols, float m, float fscale,
                                               long long* red) {
    long long s = 0;
    for (int i = threadIdx.x; i < n_cols; i += NT) s += to_fixed(softmax_exp<Fmt>(Fmt::load1_cached(xr + i), m), fscale);
    return block_sum_fixed<NT / 32>(nan_row_sum(s, m), red);
}

// What thread 0 learnt at a meeting, for the whole CTA. The max and the sum have slots of their
// own; each is rewritten only after a barrier that every thread passes after reading it (the
// other meeting's), so one row's meetings never overwrite what the CTA still reads.
struct SplitMeet {
    float max;
    int max_ok;
    long long sum;
    int sum_ok;
};

// The row's max from this CTA's slice max `m` (the same in every thread); every thread gets it.
template <class Fmt, int NT>
__device__ __forceinline__ float split_meet_max(const SplitArgs& a, unsigned* w, float m,
                                                const typename Fmt::T* xr, int n_cols, SplitMeet& sm,
                                                float* red) {
    if (threadIdx.x == 0) {
        // Any NaN as the one of the largest key (0x7fffffff), so that the row's max is NaN, as
        // fmax_nan gives it on the other paths.
        red_max_u32(w, max_key(m != m ? __uint_as_float(0x7fffffffu) : m));
        arrive_release(w + 1);
        const bool ok = await_arrivals(w + 1, static_cast<unsigned>(a.parts), a.max_polls);
        sm.max_ok = ok;
        if (ok) sm.max = key_max(ld_relaxed_u32(w));
    }
    __syncthreads();
    if (sm.max_ok) return sm.max;
    return streamed_max<Fmt, NT>(xr, n_cols, red);
}

// The row's fixed-point sum from this CTA's slice sum `s`; thread 0 then leaves the row.
template <class Fmt, int NT>
__device__ __forceinline__ long long split_meet_sum(const SplitArgs& a, unsigned* w, long long s, float m,
                                                    float fscale, const typename Fmt::T* xr, int n_cols,
                                                    SplitMeet& sm, long long* red) {
    if (threadIdx.x == 0) {
        red_add_u64(w + 4, static_cast<unsigned long long>(s));
        arrive_release(w + 2);
        const bool ok = await_arrivals(w + 2, static_cast<unsigned>(a.parts), a.max_polls);
        sm.sum_ok = ok;
        if (ok) sm.sum = static_cast<long long>(ld_relaxed_u64(w + 4));
        if (leave_acq_rel(w + 3) == static_cast<unsigned>(a.parts) - 1u) {
            // Every CTA of the row has read all it needs from w: zero it for the next launch.
            zero_words4(w);
            zero_words4(w + 4);
        }
    }
    __syncthreads();
    if (sm.sum_ok) return sm.sum;
    return streamed_sum<Fmt, NT>(xr, n_cols, m, fscale, red);
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
        for (int i = 1; i < EW; ++i) m = fmax_nan(m, v[i]);
        m = exp_reference<Fmt>(warp_max(m));  // exp's reference point (softmax_common.cuh)
        // Padding (-inf) contributes exp(-inf) = 0. An all -inf row gives NaN, as torch does.
        long long s = 0;
#pragma unroll
        for (int i = 0; i < EW; ++i) {
            v[i] = softmax_exp<Fmt>(v[i], m);
            s += to_fixed(v[i], fscale);
        }
        const RowScale rs = row_scale(warp_sum_fixed(nan_row_sum(s, m)), fscale);
#pragma unroll
        for (int i = 0; i < EW; ++i) {
            const int c = i * 32 + lane;
            if (c < n_cols) Fmt::store1(yr + c, softmax_normalise<Fmt>(v[i], rs));
        }
    }
}

// ---- 16-byte copies from global into shared memory that bypass registers (sm_80+) -----------
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(smem)), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define SOFTMAX_STASH_EXP true
#else
#define SOFTMAX_STASH_EXP false
#endif

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
// SPLIT: P = parts CTAs per row instead of a cluster, meeting through global memory (above).
// Work item i is part i % P of row i / P; a CTA walks items with the grid's stride.
//
// ES > 0: each thread holds ES more elements (ES / VEC more vectors, numbered after its register
// vectors) in dynamic shared memory, copied there by cp.async without passing through
// registers, so a CTA holds NT * (E + ES) elements at the occupancy of NT * E. A thread reads
// back (and rewrites) only the vectors it copied itself, so no barrier guards them. fp32: the
// sum pass overwrites them with their exponentials, which the write pass normalises; 16-bit:
// they are kept in storage form and widened and exponentiated again in each pass, as PACKED
// does. Either way with the same expressions, so the bits are those of the register classes.
//
// out_vec_ok says whether y - x is a multiple of 16 bytes. Then the output slice has the same
// alignment as the input slice and the body is stored as vectors; otherwise element by element.
template <class Fmt, int NT, int E, int C, int RPB, bool PACKED, bool SPLIT, int ES = 0>
__device__ __forceinline__ void fused_row_body(const typename Fmt::T* __restrict__ x,
                                               typename Fmt::T* __restrict__ y,
                                               long long n_rows, int n_cols, int out_vec_ok,
                                               const SplitArgs split) {
    typedef typename Fmt::T T;
    constexpr int VEC = Fmt::VEC;
    constexpr int NV = E / VEC;  // vectors per thread
    constexpr int NW = NT / 32;
    static_assert(E % VEC == 0, "elements per thread must be whole vectors");
    static_assert(NT % 32 == 0 && NT >= 32 && NT * RPB <= 1024, "block size");
    static_assert(C >= 1 && C <= 16, "cluster size (over 8: non-portable, sm_90)");
    static_assert(RPB == 1 || (NT == 32 && C == 1), "several rows per block only for warp rows");
    static_assert(!SPLIT || (C == 1 && RPB == 1), "split rows meet in global memory, not in a cluster");
    constexpr int NVF = PACKED ? 1 : NV;  // fp32 copies held (a dummy of one when PACKED)
    constexpr int NVR = PACKED ? NV : 1;  // raw vectors held (a dummy of one otherwise)
    constexpr int NS = ES / VEC;          // vectors per thread in shared memory
    // fp32 storage: the sum pass writes its exponentials over the stashed inputs (same size), so
    // the write pass only normalises them; 16-bit storage has no room and exponentiates again.
    // (The same values either way: this changes no bit.) Before sm_90 the split class, the only
    // stashed one there, exponentiates again too: keeping the exponentials costs registers that
    // sm_80's ptxas does not find within the 64 the launch bounds allow (it spills).
    constexpr bool STASH_EXP = sizeof(T) == sizeof(float) && SOFTMAX_STASH_EXP;
    static_assert(ES % VEC == 0, "shared-memory elements per thread must be whole vectors");
    static_assert(ES == 0 || RPB == 1, "shared-memory slices only for block rows");

    extern __shared__ uint4 stash[];  // NS * NT vectors when ES > 0: [s * NT + tid]
    __shared__ float red_max[NW];
    __shared__ long long red_sum[NW];
    __shared__ ClusterMeet<C> meet;  // unused when C == 1
    __shared__ SplitMeet smeet;      // unused unless SPLIT

    const int tid = (RPB == 1) ? static_cast<int>(threadIdx.x) : static_cast<int>(threadIdx.x) % NT;
    const int sub = (RPB == 1) ? 0 : static_cast<int>(threadIdx.x) / NT;
    // Slices are a multiple of 8 elements long, so when the row is 16-byte aligned every
    // slice is too. Slices past the row end are empty and contribute (-inf, 0).
    const int parts = SPLIT ? split.parts : C;
    const unsigned rank = (C > 1) ? cluster_rank() : 0u;
    const int chunk = parts > 1 ? ((n_cols + parts - 1) / parts + 7) / 8 * 8 : n_cols;
    const float fscale = fixed_point_scale(n_cols);
    // Work items: rows (a cluster's CTAs walk the same ones, so all meet equally often), or
    // (row, part) pairs for SPLIT.
    const long long n_items = SPLIT ? n_rows * parts : n_rows;
    const long long first = SPLIT ? static_cast<long long>(blockIdx.x)
                                  : static_cast<long long>(blockIdx.x / C) * RPB + sub;
    const long long step = SPLIT ? static_cast<long long>(gridDim.x) : static_cast<long long>(gridDim.x / C) * RPB;
    // Zeros for xor_words: n_cols >= 1 and n_rows >= 1, so both sign words are 0.
    const unsigned zero_a = static_cast<unsigned>(n_cols >> 31);
    const unsigned zero_b = static_cast<unsigned>(n_rows >> 63);

    if (C > 1) meet_init(meet);
    unsigned parity = 0;
    for (long long item = first; item < n_items; item += step, parity ^= 1u) {
        long long row = item;
        int part = static_cast<int>(rank);
        if constexpr (SPLIT) {
            row = item / parts;
            part = static_cast<int>(item - row * parts);
        }
        const int start = min(part * chunk, n_cols);
        const int len = min(n_cols - start, chunk);
        const T* xr = x + row * n_cols;
        const T* xs = xr + start;
        T* ys = y + row * n_cols + start;
        unsigned* w = SPLIT ? split.ws + 8 * row : nullptr;
        const SliceGeom<VEC, T> g(xs, len);
        const uint4* xv = reinterpret_cast<const uint4*>(xs + g.head);

        // All loads are issued before the first use: E (+ ES) elements per thread in flight.
        if constexpr (NS > 0) {
#pragma unroll
            for (int q = 0; q < NS; ++q) {
                const int vi = (NV + q) * NT + tid;
                if (vi < g.nvec) cp_async16(&stash[q * NT + tid], xv + vi);
            }
            cp_async_commit();
        }
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

        float m = fmax_nan(hv, tv);
#pragma unroll
        for (int j = 0; j < NV; ++j) {
            if constexpr (PACKED) {
                float f[VEC];
                Fmt::unpack(r[j], f);
#pragma unroll
                for (int k = 0; k < VEC; ++k) m = fmax_nan(m, f[k]);
            } else {
#pragma unroll
                for (int k = 0; k < VEC; ++k) m = fmax_nan(m, v[j][k]);
            }
        }
        if constexpr (NS > 0) {
            cp_async_wait_all();
#pragma unroll
            for (int q = 0; q < NS; ++q) {
                if ((NV + q) * NT + tid < g.nvec) {
                    float f[VEC];
                    Fmt::unpack(stash[q * NT + tid], f);
#pragma unroll
                    for (int k = 0; k < VEC; ++k) m = fmax_nan(m, f[k]);
                }
            }
        }
        m = block_max<NW>(m, red_max);
        if (C > 1) m = meet_max(meet, m, rank, parity);
        if (SPLIT && parts > 1) m = split_meet_max<Fmt, NT>(split, w, m, xr, n_cols, smeet, red_max);
        m = exp_reference<Fmt>(m);  // from here on exp's reference point (softmax_common.cuh)

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
#pragma unroll
        for (int q = 0; q < NS; ++q) {
            if ((NV + q) * NT + tid < g.nvec) {
                float f[VEC];
                Fmt::unpack(stash[q * NT + tid], f);
#pragma unroll
                for (int k = 0; k < VEC; ++k) {
                    f[k] = softmax_exp<Fmt>(f[k], m);
                    s += to_fixed(f[k], fscale);
                }
                if constexpr (STASH_EXP) stash[q * NT + tid] = Fmt::pack(f);
            }
        }
        s = block_sum_fixed<NW>(nan_row_sum(s, m), red_sum);
        if (C > 1) s = meet_sum(meet, s, rank, parity);
        if (SPLIT && parts > 1) s = split_meet_sum<Fmt, NT>(split, w, s, m, fscale, xr, n_cols, smeet, red_sum);
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
#pragma unroll
        for (int q = 0; q < NS; ++q) {
            const int vi = (NV + q) * NT + tid;
            if (vi < g.nvec) {
                float o[VEC];
                Fmt::unpack(stash[q * NT + tid], o);
#pragma unroll
                for (int k = 0; k < VEC; ++k)
                    o[k] = softmax_normalise<Fmt>(STASH_EXP ? o[k] : softmax_exp<Fmt>(o[k], m), rs);
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
// For rows beyond the register capacity of every split: P CTAs share a row (meeting as split
// does when P > 1), and each finds its slice's max, then its fixed-point sum, then writes it,
// reading the slice three times (EL elements, EL / VEC vector loads, in flight per thread at a
// time; the re-reads are served mostly by L2, which holds a slice of every resident CTA).
template <class Fmt, int NT, int EL>
__device__ __forceinline__ void fused_loop_body(const typename Fmt::T* __restrict__ x,
                                                typename Fmt::T* __restrict__ y,
                                                long long n_rows, int n_cols, int out_vec_ok,
                                                const SplitArgs split) {
    typedef typename Fmt::T T;
    constexpr int VEC = Fmt::VEC;
    constexpr int NW = NT / 32;
    constexpr int U = EL / VEC;
    static_assert(EL % VEC == 0, "elements per step must be whole vectors");
    __shared__ float red_m[NW];
    __shared__ long long red_s[NW];
    __shared__ SplitMeet smeet;
    const int tid = threadIdx.x;
    const float fscale = fixed_point_scale(n_cols);
    const int parts = split.parts;
    const long long chunk = parts > 1 ? ((static_cast<long long>(n_cols) + parts - 1) / parts + 7) / 8 * 8 : n_cols;
    const long long n_items = n_rows * parts;

    for (long long item = blockIdx.x; item < n_items; item += gridDim.x) {
        const long long row = item / parts;
        const long long part = item - row * parts;
        const int start = static_cast<int>(min(part * chunk, static_cast<long long>(n_cols)));
        const int len = static_cast<int>(min(static_cast<long long>(n_cols - start), chunk));
        const T* xr = x + row * n_cols;
        const T* xs = xr + start;
        T* ys = y + row * n_cols + start;
        unsigned* w = parts > 1 ? split.ws + 8 * row : nullptr;
        const SliceGeom<VEC, T> g(xs, len);
        const uint4* xv = reinterpret_cast<const uint4*>(xs + g.head);

        const float hx = tid < g.head ? Fmt::load1_cached(xs + tid) : SOFTMAX_NEG_INF;
        const float tx = tid < g.tail ? Fmt::load1_cached(xs + g.tail0 + tid) : SOFTMAX_NEG_INF;
        float m = fmax_nan(hx, tx);
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
                for (int k = 0; k < VEC; ++k) m = fmax_nan(m, f[u][k]);
        }
        m = block_max<NW>(m, red_m);
        if (parts > 1) m = split_meet_max<Fmt, NT>(split, w, m, xr, n_cols, smeet, red_m);
        m = exp_reference<Fmt>(m);

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
        s = block_sum_fixed<NW>(nan_row_sum(s, m), red_s);
        if (parts > 1) s = split_meet_sum<Fmt, NT>(split, w, s, m, fscale, xr, n_cols, smeet, red_s);
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
        fused_row_body<FMT, NT, E, 1, 1, PACKED, false>(x, y, n_rows, n_cols, out_vec_ok,        \
                                                        SplitArgs{nullptr, 1, 0});               \
    }

// One warp per row, RPB rows per block, vector accesses.
#define SOFTMAX_FUSED_WARPVEC(NAME, FMT, E, RPB)                                                 \
    extern "C" __global__ void __launch_bounds__(32 * (RPB), 1024 / (32 * (RPB)))               \
    NAME(const FMT::T* __restrict__ x, FMT::T* __restrict__ y, long long n_rows, int n_cols,   \
         int out_vec_ok) {                                                                       \
        fused_row_body<FMT, 32, E, 1, RPB, false, false>(x, y, n_rows, n_cols, out_vec_ok,       \
                                                         SplitArgs{nullptr, 1, 0});              \
    }

// Thread-block clusters exist from sm_90 on; on older targets these entry points are left out
// and the dispatcher does not ask for them. Clusters of more than 8 CTAs are launched only
// after cudaFuncAttributeNonPortableClusterSizeAllowed is set on the function (kernels/softmax_cuda.py).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define SOFTMAX_FUSED_CLUSTER(NAME, FMT, NT, E, C, PACKED, ES)                                   \
    extern "C" __global__ void __cluster_dims__(C, 1, 1) __launch_bounds__(NT, 1024 / (NT))     \
    NAME(const FMT::T* __restrict__ x, FMT::T* __restrict__ y, long long n_rows, int n_cols,   \
         int out_vec_ok) {                                                                       \
        fused_row_body<FMT, NT, E, C, 1, PACKED, false, ES>(x, y, n_rows, n_cols, out_vec_ok,    \
                                                            SplitArgs{nullptr, 1, 0});           \
    }
#else
#define SOFTMAX_FUSED_CLUSTER(NAME, FMT, NT, E, C, PACKED, ES)
#endif

// P = parts CTAs per row meeting in global memory: any architecture (no cluster).
#define SOFTMAX_FUSED_SPLIT(NAME, FMT, NT, E, PACKED, ES)                                        \
    extern "C" __global__ void __launch_bounds__(NT, 1024 / (NT))                                \
    NAME(const FMT::T* __restrict__ x, FMT::T* __restrict__ y, long long n_rows, int n_cols,   \
         int out_vec_ok, unsigned* ws, int parts, int max_polls) {                              \
        fused_row_body<FMT, NT, E, 1, 1, PACKED, true, ES>(x, y, n_rows, n_cols, out_vec_ok,     \
                                                           SplitArgs{ws, parts, max_polls});     \
    }

#define SOFTMAX_FUSED_LOOP(NAME, FMT, NT, EL)                                                     \
    extern "C" __global__ void __launch_bounds__(NT, 1)                                          \
    NAME(const FMT::T* __restrict__ x, FMT::T* __restrict__ y, long long n_rows, int n_cols,   \
         int out_vec_ok, unsigned* ws, int parts, int max_polls) {                              \
        fused_loop_body<FMT, NT, EL>(x, y, n_rows, n_cols, out_vec_ok, SplitArgs{ws, parts, max_polls}); \
    }
