// Softmax backward: dx = y * (dy - sum(y * dy)) over each row, given the forward's output y and
// the gradient dy of it. Two reads and one write per element: y and dy are read once, held on
// chip, and dx is written from them. fp32 arithmetic on fp32 / bf16 / fp16 storage.
//
// The row sum S = sum(y * dy) is order-free (training_common.cuh, FreeSum): a first reduction
// finds the exact max of |y * dy| over the row, which fixes a power-of-two scale under which
// every product becomes a 64-bit integer and V of them cannot overflow; the integers are then
// summed in any order. So dx's bits depend only on the row's values and V: not on B, on the
// row's position or alignment, on the strides of y and dy, or on the size class. The bound is
// the products' own max, not max|dy| (y is the forward's output, but nothing checks that it
// lies in [0, 1]).
//
// Accuracy where dy - S cancels (a confident row: y ~ 1 at the entry whose dy makes up S):
// each product enters the sum exactly (y * dy rounded plus its FMA-exact rounding error), the
// sum leaves as the pair hi + lo, and dx = y * (dy - S) is formed by softmax_bwd_out with about
// one rounding. Summing the rounded products and rounding S, then dy - S and the product, gave
// 1.4 x PyTorch's error there at V = 262144 (its y * dy - y * S cancels its own product's
// rounding); the fixed point's rounding of V terms is ~2^-40 of the largest product.
//
// Size classes, chosen by kernels/cuda_training_plans.py as for the forward, each holding two
// values per element (y and dy), so half the forward's elements per thread:
//   bwd_warp      V <= 128: one warp per row, element-wise loads, shuffle reductions.
//   bwd_warpvec   V <= 512: one warp per row, 16-byte vectors with a head / tail peel.
//   bwd_row       V <= 16384: one block per row, the row in registers.
//   bwd_cluster   V <= 131072 (sm_90): a cluster of up to 8 CTAs per row, each holding a slice;
//                 the CTAs meet twice through distributed shared memory (the max of |y * dy|,
//                 then the fixed-point sum).
//   bwd_loop      longer rows (and, before sm_90, rows past 16384): three passes over the row
//                 (the bound, the sum, the output), the re-reads mostly served by L2. On sm_90
//                 a cluster of 8 CTAs shares each row, so the row's re-read working set per SM
//                 is an eighth of it and stays in L2 at any batch size.
//
// Layout: y and dy may each have any row stride (a unit stride within the row); dx is
// contiguous. The head / tail peel follows y's alignment; dy's body is read as vectors when
// dy shares y's alignment in that row, element by element otherwise, and dx is stored as vectors
// when it does. All of that changes how elements are moved, never how they are combined.
#include "softmax_common.cuh"
#include "cluster_common.cuh"
#include "training_common.cuh"


// ---- warp per row, element-wise -----------------------------------------------------------
// Lane l holds elements l, l+32, ... of y and dy; padding is 0 (a zero product).
template <class Fmt, int EW, int WPB>
__device__ __forceinline__ void bwd_warp_body(const typename Fmt::T* __restrict__ y, long long y_stride,
                                              const typename Fmt::T* __restrict__ dy, long long dy_stride,
                                              typename Fmt::T* __restrict__ dx, long long n_rows, int n_cols) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const long long step = static_cast<long long>(gridDim.x) * WPB;
    for (long long row = static_cast<long long>(blockIdx.x) * WPB + warp; row < n_rows; row += step) {
        const typename Fmt::T* yr = y + row * y_stride;
        const typename Fmt::T* dr = dy + row * dy_stride;
        typename Fmt::T* xr = dx + row * n_cols;
        float a[EW], b[EW];
#pragma unroll
        for (int i = 0; i < EW; ++i) {
            const int c = i * 32 + lane;
            a[i] = c < n_cols ? Fmt::load1(yr + c) : 0.0f;
            b[i] = c < n_cols ? Fmt::load1(dr + c) : 0.0f;
        }
        unsigned bound = 0u;
#pragma unroll
        for (int i = 0; i < EW; ++i) bound = max(bound, abs_bits(a[i] * b[i]));
        const FreeSum fs(warp_umax(bound), n_cols);
        long long s = 0;
#pragma unroll
        for (int i = 0; i < EW; ++i) s += fs.term_product(a[i], b[i]);
        const float2 S = fs.finish_pair(warp_sum_fixed(s));
#pragma unroll
        for (int i = 0; i < EW; ++i) {
            const int c = i * 32 + lane;
            if (c < n_cols) Fmt::store1(xr + c, softmax_bwd_out(a[i], b[i], S));
        }
    }
}

// ---- warp (RPB rows a block), block (C == 1) or cluster (C > 1) per row ----------------------
// As fused_row_body of softmax_fused.cu: NT threads share a slice of the row; thread t holds
// body vectors t, t + NT, ... plus at most one head and one tail element, of y and of dy.
// PACKED holds both as the loaded 16-bit pairs and widens them in each pass.
template <class Fmt, int NT, int E, int C, int RPB, bool PACKED>
__device__ __forceinline__ void bwd_row_body(const typename Fmt::T* __restrict__ y, long long y_stride,
                                             const typename Fmt::T* __restrict__ dy, long long dy_stride,
                                             typename Fmt::T* __restrict__ dx, long long n_rows, int n_cols) {
    typedef typename Fmt::T T;
    constexpr int VEC = Fmt::VEC;
    constexpr int NV = E / VEC;
    constexpr int NW = NT / 32;
    static_assert(E % VEC == 0, "elements per thread must be whole vectors");
    static_assert(NT % 32 == 0 && NT >= 32 && NT * RPB <= 1024, "block size");
    static_assert(C >= 1 && C <= 8, "portable cluster size");
    static_assert(RPB == 1 || (NT == 32 && C == 1), "several rows per block only for warp rows");
    constexpr int NVF = PACKED ? 1 : NV;
    constexpr int NVR = PACKED ? NV : 1;

    __shared__ unsigned red_a[NW];
    __shared__ long long red_s[NW];
    __shared__ Meet<C, 1, 1> meet;

    const int tid = (RPB == 1) ? static_cast<int>(threadIdx.x) : static_cast<int>(threadIdx.x) % NT;
    const int sub = (RPB == 1) ? 0 : static_cast<int>(threadIdx.x) / NT;
    const unsigned rank = (C > 1) ? cluster_rank() : 0u;
    const int chunk = (C > 1) ? ((n_cols + C - 1) / C + 7) / 8 * 8 : n_cols;
    const int start = min(static_cast<int>(rank) * chunk, n_cols);
    const int len = min(n_cols - start, chunk);
    const long long row_step = static_cast<long long>(gridDim.x / C) * RPB;
    // Zeros the compiler cannot see as zeros (xor_words): one per pass that re-reads held data.
    const unsigned zero_a = static_cast<unsigned>(n_cols >> 31);
    const unsigned zero_b = static_cast<unsigned>(n_rows >> 63);
    const uint4 zero4 = make_uint4(0u, 0u, 0u, 0u);

    if (C > 1) meet_init(meet);
    unsigned parity = 0;
    for (long long row = static_cast<long long>(blockIdx.x / C) * RPB + sub; row < n_rows;
         row += row_step, parity ^= 1u) {
        const T* ys = y + row * y_stride + start;
        const T* ds = dy + row * dy_stride + start;
        T* xs = dx + row * n_cols + start;
        const SliceGeom<VEC, T> g(ys, len);
        const bool d_vec = same_alignment(ds, ys);
        const bool o_vec = same_alignment(xs, ys);
        const uint4* yv = reinterpret_cast<const uint4*>(ys + g.head);
        const T* db = ds + g.head;

        // Every load issued before the first use. Vectors past the slice hold zeros.
        float fy[NVF][VEC], fd[NVF][VEC];
        uint4 ry[NVR], rd[NVR];
#pragma unroll
        for (int j = 0; j < NV; ++j) {
            const int vi = j * NT + tid;
            if constexpr (PACKED) {
                ry[j] = vi < g.nvec ? ld_once(yv + vi) : zero4;
                rd[j] = vi < g.nvec ? load_vec_any<Fmt>(db + vi * VEC, d_vec) : zero4;
            } else if (vi < g.nvec) {
                Fmt::unpack(ld_once(yv + vi), fy[j]);
                Fmt::unpack(load_vec_any<Fmt>(db + vi * VEC, d_vec), fd[j]);
            } else {
#pragma unroll
                for (int k = 0; k < VEC; ++k) fy[j][k] = fd[j][k] = 0.0f;
            }
        }
        const float hy = tid < g.head ? Fmt::load1(ys + tid) : 0.0f;
        const float hd = tid < g.head ? Fmt::load1(ds + tid) : 0.0f;
        const float ty = tid < g.tail ? Fmt::load1(ys + g.tail0 + tid) : 0.0f;
        const float td = tid < g.tail ? Fmt::load1(ds + g.tail0 + tid) : 0.0f;

        // Pass 1: the bound, max |y * dy| (as bits: NaN above inf above any number).
        unsigned bound = max(abs_bits(hy * hd), abs_bits(ty * td));
#pragma unroll
        for (int j = 0; j < NV; ++j) {
            float a[VEC], b[VEC];
            if constexpr (PACKED) {
                Fmt::unpack(ry[j], a);
                Fmt::unpack(rd[j], b);
            } else {
#pragma unroll
                for (int k = 0; k < VEC; ++k) a[k] = fy[j][k], b[k] = fd[j][k];
            }
#pragma unroll
            for (int k = 0; k < VEC; ++k) bound = max(bound, abs_bits(a[k] * b[k]));
        }
        bound = block_umax<NW>(bound, red_a);
        if constexpr (C > 1) {
            const unsigned w[1] = {bound};
            meet_a(meet, w, rank, parity);
#pragma unroll
            for (int c = 0; c < C; ++c) bound = max(bound, meet.w32[c]);
        }
        const FreeSum fs(bound, n_cols);

        // Pass 2: the products again (the same expressions, so the same values), exactly in
        // fixed point. Infinite products (a row of overflowing values) are counted instead, from
        // memory, element by element: rare enough not to need a second unrolled copy.
        long long s = 0;
        if (fs.finite()) {
            s = fs.fixed_product(hy, hd) + fs.fixed_product(ty, td);
#pragma unroll
            for (int j = 0; j < NV; ++j) {
                float a[VEC], b[VEC];
                if constexpr (PACKED) {
                    Fmt::unpack(xor_words(ry[j], zero_a), a);
                    Fmt::unpack(xor_words(rd[j], zero_a), b);
                } else {
#pragma unroll
                    for (int k = 0; k < VEC; ++k) a[k] = fy[j][k], b[k] = xor_float(fd[j][k], zero_a);
                }
#pragma unroll
                for (int k = 0; k < VEC; ++k) s += fs.fixed_product(a[k], b[k]);
            }
        } else {
            for (int i = tid; i < len; i += NT) s += FreeSum::count(Fmt::load1(ys + i) * Fmt::load1(ds + i));
        }
        s = block_sum_fixed<NW>(s, red_s);
        if constexpr (C > 1) {
            const long long w[1] = {s};
            meet_b(meet, w, rank, parity);
            s = 0;
#pragma unroll
            for (int c = 0; c < C; ++c) s += meet.w64[c];
        }
        const float2 S = fs.finish_pair(s);

        // Pass 3: dx = y * (dy - S), S = hi + lo.
        T* xb = xs + g.head;
#pragma unroll
        for (int j = 0; j < NV; ++j) {
            const int vi = j * NT + tid;
            if (vi < g.nvec) {
                float a[VEC], b[VEC], o[VEC];
                if constexpr (PACKED) {
                    Fmt::unpack(xor_words(ry[j], zero_b), a);
                    Fmt::unpack(xor_words(rd[j], zero_b), b);
                } else {
#pragma unroll
                    for (int k = 0; k < VEC; ++k) a[k] = fy[j][k], b[k] = fd[j][k];
                }
#pragma unroll
                for (int k = 0; k < VEC; ++k) o[k] = softmax_bwd_out(a[k], b[k], S);
                if (o_vec) {
                    st_once(reinterpret_cast<uint4*>(xb) + vi, Fmt::pack(o));
                } else {
#pragma unroll
                    for (int k = 0; k < VEC; ++k) Fmt::store1(xb + vi * VEC + k, o[k]);
                }
            }
        }
        if (tid < g.head) Fmt::store1(xs + tid, softmax_bwd_out(hy, hd, S));
        if (tid < g.tail) Fmt::store1(xs + g.tail0 + tid, softmax_bwd_out(ty, td, S));
    }
}

// ---- rows too long to hold: three passes, by a block or a cluster -----------------------------
// Each CTA walks its slice (the whole row when C == 1) U vectors of y and of dy at a time per
// thread: the bound, the fixed-point sum, then the output. The first two passes read through
// the read-only path (__ldg) so the data stays in L2 for the next.
template <class Fmt, int NT, int EL, int C>
__device__ __forceinline__ void bwd_loop_body(const typename Fmt::T* __restrict__ y, long long y_stride,
                                              const typename Fmt::T* __restrict__ dy, long long dy_stride,
                                              typename Fmt::T* __restrict__ dx, long long n_rows, int n_cols) {
    typedef typename Fmt::T T;
    constexpr int VEC = Fmt::VEC;
    constexpr int NW = NT / 32;
    constexpr int U = EL / VEC;
    static_assert(EL % VEC == 0, "elements per step must be whole vectors");
    static_assert(C >= 1 && C <= 8, "portable cluster size");
    __shared__ unsigned red_a[NW];
    __shared__ long long red_s[NW];
    __shared__ Meet<C, 1, 1> meet;
    const int tid = threadIdx.x;
    const unsigned rank = (C > 1) ? cluster_rank() : 0u;
    const int chunk = (C > 1) ? ((n_cols + C - 1) / C + 7) / 8 * 8 : n_cols;
    const int start = min(static_cast<int>(rank) * chunk, n_cols);
    const int len = min(n_cols - start, chunk);

    if (C > 1) meet_init(meet);
    unsigned parity = 0;
    for (long long row = blockIdx.x / C; row < n_rows; row += gridDim.x / C, parity ^= 1u) {
        const T* ys = y + row * y_stride + start;
        const T* ds = dy + row * dy_stride + start;
        T* xs = dx + row * n_cols + start;
        const SliceGeom<VEC, T> g(ys, len);
        const bool d_vec = same_alignment(ds, ys);
        const bool o_vec = same_alignment(xs, ys);
        const uint4* yv = reinterpret_cast<const uint4*>(ys + g.head);
        const T* db = ds + g.head;
        const float hy = tid < g.head ? Fmt::load1_cached(ys + tid) : 0.0f;
        const float hd = tid < g.head ? Fmt::load1_cached(ds + tid) : 0.0f;
        const float ty = tid < g.tail ? Fmt::load1_cached(ys + g.tail0 + tid) : 0.0f;
        const float td = tid < g.tail ? Fmt::load1_cached(ds + g.tail0 + tid) : 0.0f;

        // Runs f(ra, rb, vi0) on every U-vector step of the slice: ra, rb the raw vectors of y
        // and dy (zero words past the slice; widened by f one vector at a time, which keeps the
        // registers of 16-bit storage at half those of fp32 values), vector u having index
        // vi0 + u * NT.
        auto walk = [&](auto f, bool cached) {
            for (int base = 0; base < g.nvec; base += U * NT) {
                uint4 ra[U], rb[U];
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int vi = base + u * NT + tid;
                    const bool in = vi < g.nvec;
                    ra[u] = in ? (cached ? __ldg(yv + vi) : ld_once(yv + vi)) : make_uint4(0u, 0u, 0u, 0u);
                    rb[u] = in ? load_vec_any<Fmt>(db + vi * VEC, d_vec) : make_uint4(0u, 0u, 0u, 0u);
                }
                f(ra, rb, base + tid);
            }
        };

        unsigned bound = max(abs_bits(hy * hd), abs_bits(ty * td));
        walk(
            [&](const uint4 (&ra)[U], const uint4 (&rb)[U], int) {
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    float a[VEC], b[VEC];
                    Fmt::unpack(ra[u], a);
                    Fmt::unpack(rb[u], b);
#pragma unroll
                    for (int k = 0; k < VEC; ++k) bound = max(bound, abs_bits(a[k] * b[k]));
                }
            },
            true);
        bound = block_umax<NW>(bound, red_a);
        if constexpr (C > 1) {
            const unsigned w[1] = {bound};
            meet_a(meet, w, rank, parity);
#pragma unroll
            for (int c = 0; c < C; ++c) bound = max(bound, meet.w32[c]);
        }
        const FreeSum fs(bound, n_cols);

        long long s = 0;
        if (fs.finite()) {
            s = fs.fixed_product(hy, hd) + fs.fixed_product(ty, td);
            walk(
                [&](const uint4 (&ra)[U], const uint4 (&rb)[U], int) {
#pragma unroll
                    for (int u = 0; u < U; ++u) {
                        float a[VEC], b[VEC];
                        Fmt::unpack(ra[u], a);
                        Fmt::unpack(rb[u], b);
#pragma unroll
                        for (int k = 0; k < VEC; ++k) s += fs.fixed_product(a[k], b[k]);
                    }
                },
                true);
        } else {  // infinite products: counted element by element (see bwd_row_body)
            for (int i = tid; i < len; i += NT) s += FreeSum::count(Fmt::load1(ys + i) * Fmt::load1(ds + i));
        }
        s = block_sum_fixed<NW>(s, red_s);
        if constexpr (C > 1) {
            const long long w[1] = {s};
            meet_b(meet, w, rank, parity);
            s = 0;
#pragma unroll
            for (int c = 0; c < C; ++c) s += meet.w64[c];
        }
        const float2 S = fs.finish_pair(s);

        if (tid < g.head) Fmt::store1(xs + tid, softmax_bwd_out(hy, hd, S));
        if (tid < g.tail) Fmt::store1(xs + g.tail0 + tid, softmax_bwd_out(ty, td, S));
        T* xb = xs + g.head;
        walk(
            [&](const uint4 (&ra)[U], const uint4 (&rb)[U], int vi0) {
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int vi = vi0 + u * NT;
                    if (vi < g.nvec) {
                        float a[VEC], b[VEC], o[VEC];
                        Fmt::unpack(ra[u], a);
                        Fmt::unpack(rb[u], b);
#pragma unroll
                        for (int k = 0; k < VEC; ++k) o[k] = softmax_bwd_out(a[k], b[k], S);
                        if (o_vec) {
                            st_once(reinterpret_cast<uint4*>(xb) + vi, Fmt::pack(o));
                        } else {
#pragma unroll
                            for (int k = 0; k < VEC; ++k) Fmt::store1(xb + vi * VEC + k, o[k]);
                        }
                    }
                }
            },
            false);
        __syncthreads();  // the block reductions' slots are read by all before the next row
    }
}

// ---- kernel entry points ------------------------------------------------------------------
// Launch bounds ask for 1024 resident threads per SM: at most 64 registers a thread.
#define BWD_ARGS(FMT)                                                                                \
    const FMT::T *__restrict__ y, long long y_stride, const FMT::T *__restrict__ dy, long long dy_stride, \
        FMT::T *__restrict__ dx, long long n_rows, int n_cols

#define SOFTMAX_BWD_WARP(NAME, FMT, EW, WPB)                                                     \
    extern "C" __global__ void __launch_bounds__((WPB) * 32, 1024 / ((WPB) * 32)) NAME(BWD_ARGS(FMT)) { \
        bwd_warp_body<FMT, EW, WPB>(y, y_stride, dy, dy_stride, dx, n_rows, n_cols);               \
    }

#define SOFTMAX_BWD_WARPVEC(NAME, FMT, E, RPB)                                                      \
    extern "C" __global__ void __launch_bounds__(32 * (RPB), 1024 / (32 * (RPB))) NAME(BWD_ARGS(FMT)) {  \
        bwd_row_body<FMT, 32, E, 1, RPB, false>(y, y_stride, dy, dy_stride, dx, n_rows, n_cols);    \
    }

#define SOFTMAX_BWD_ROW(NAME, FMT, NT, E, PACKED)                                                   \
    extern "C" __global__ void __launch_bounds__(NT, 1024 / (NT)) NAME(BWD_ARGS(FMT)) {                  \
        bwd_row_body<FMT, NT, E, 1, 1, PACKED>(y, y_stride, dy, dy_stride, dx, n_rows, n_cols);     \
    }

#define SOFTMAX_BWD_LOOP(NAME, FMT, NT, EL)                                                         \
    extern "C" __global__ void __launch_bounds__(NT, 1024 / (NT)) NAME(BWD_ARGS(FMT)) {                  \
        bwd_loop_body<FMT, NT, EL, 1>(y, y_stride, dy, dy_stride, dx, n_rows, n_cols);              \
    }

// Clusters exist from sm_90 on; before it these entry points are left out and the dispatcher
// does not ask for them.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define SOFTMAX_BWD_CLUSTER(NAME, FMT, NT, E, C, PACKED)                                            \
    extern "C" __global__ void __cluster_dims__(C, 1, 1) __launch_bounds__(NT, 1024 / (NT))         \
        NAME(BWD_ARGS(FMT)) {                                                                            \
        bwd_row_body<FMT, NT, E, C, 1, PACKED>(y, y_stride, dy, dy_stride, dx, n_rows, n_cols);     \
    }
#define SOFTMAX_BWD_LOOP_CLUSTER(NAME, FMT, NT, EL, C)                                              \
    extern "C" __global__ void __cluster_dims__(C, 1, 1) __launch_bounds__(NT, 1024 / (NT))         \
        NAME(BWD_ARGS(FMT)) {                                                                            \
        bwd_loop_body<FMT, NT, EL, C>(y, y_stride, dy, dy_stride, dx, n_rows, n_cols);              \
    }
#else
#define SOFTMAX_BWD_CLUSTER(NAME, FMT, NT, E, C, PACKED)
#define SOFTMAX_BWD_LOOP_CLUSTER(NAME, FMT, NT, EL, C)
#endif
