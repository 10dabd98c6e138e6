// Cross-entropy with class-index targets, forward and backward in one pass over the logits: each
// row is read once and the gradient with respect to it written once (over the logits, if the
// caller asks), with the row's loss and log-sum-exp. fp32 arithmetic on fp32 / bf16 / fp16.
//
// PyTorch's semantics (F.cross_entropy): for a row with target t != ignore_index, class weights w
// (all 1 without), label smoothing eps and p = softmax(x),
//     loss = (1 - eps) w_t (lse - x_t) + eps / V * sum_j w_j (lse - x_j)
//     d loss / d x_j = (1 - eps) w_t (p_j - [j == t]) + eps / V * (W p_j - w_j),   W = sum_j w_j
// An ignored row has loss 0 and gradient 0 * (...) (0, or NaN where p is, as in PyTorch). The
// gradient is scaled by params[0]: 1 / (sum of the counted rows' w_t) for reduction "mean", 1
// otherwise (see ce_prologue). A target outside [0, V) that is not ignore_index gives NaN loss
// and gradient for its row: the wrapper rejects such targets on the host before they get here;
// the kernel only makes sure that one reaching it (a CUDA graph replay) reads nothing out of bounds.
//
// Precision where it matters:
//   * every sum is order-free, so a row's bits depend only on its values, its target and V:
//     the exp sum as in the forward (64-bit fixed point relative to the max, whose own term
//     is exactly 2^K; each term rounded rather than truncated, see to_fixed_rn); the smoothing
//     sum sum_j w_j (x_j - max) in the FreeSum fixed point of training_common.cuh, bounded by
//     max|w| * (max - min) (exact max and min of the row);
//   * lse - x_t = (max - x_t) + log1p((s - 2^K) / 2^K), with s - 2^K exact in integers: a
//     confident row (p_t near 1) keeps its loss's digits instead of losing them to lse - x_t,
//     down to the fixed point's unit 2^-K (K = 62 - ceil(log2 V): 2^-45 at V = 128256);
//   * p_t - 1 at the target = (e_t 2^K - s) / s, e_t 2^K being the very term summed: again an
//     exact integer difference, so the gradient of a confident row keeps its digits.
//
// Size classes as the forward's (kernels/cuda_training_plans.py), each thread holding its
// share of the logits: ce_warp, ce_warpvec, ce_row, ce_cluster (sm_90) and ce_loop (three
// passes; a cluster of 8 CTAs per row on sm_90). The column of the target is handled by the one
// thread that holds it (its "owner"): it loads x_t before any store of the row, rewrites the
// target's gradient after its own bulk store of it, and writes the row's loss; so writing the
// gradient over the logits is safe.
#include "softmax_common.cuh"
#include "cluster_common.cuh"
#include "training_common.cuh"


// The prologue's params (see ce_prologue), read where they are used, through an opaque load
// each time: a plain load would be hoisted out of the row loop and its value, with everything
// computed from it, held in registers for the kernel's life, registers the row itself needs.
__device__ __forceinline__ float param_ld(const float* p) {
    float v;
    asm volatile("ld.global.nc.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}
#define CE_G(params) param_ld((params) + 0)      // the gradient scale (1 / W for "mean", else 1)
#define CE_W_ALL(params) param_ld((params) + 1)  // sum of all class weights (V without weights)
#define CE_W_MAX(params) param_ld((params) + 2)  // max |class weight| (1 without weights)

// A row's target and the gradient's coefficients, the same in every thread.
struct CeRow {
    bool valid;  // t != ignore_index
    bool ok;     // valid and 0 <= t < V
    float ga;    // g * ((1 - eps) w_t + eps W / V): every p_j's coefficient (0 ignored, NaN bad target)
    float gc;    // g * eps / V: times w_j, subtracted from every element
};
__device__ __forceinline__ CeRow ce_row(long long t, long long ignore_index, int n_cols, const float* weight,
                                        const float* params, float eps) {
    CeRow r;
    r.valid = t != ignore_index;
    r.ok = r.valid && static_cast<unsigned long long>(t) < static_cast<unsigned long long>(n_cols);
    const float wt = r.ok ? (weight != nullptr ? __ldg(weight + t) : 1.0f) : 0.0f;
    const float other = r.valid ? SOFTMAX_NAN : 0.0f;
    const float g = CE_G(params), eps_v = eps / static_cast<float>(n_cols);
    // Without smoothing the sum of all class weights takes no part: where it is inf (a class
    // weighted inf), 0 * inf would make every row's coefficient NaN.
    r.ga = r.ok ? g * fmaf(1.0f - eps, wt, eps > 0.0f ? eps_v * CE_W_ALL(params) : 0.0f) : other;
    r.gc = r.ok ? g * eps_v : other;
    return r;
}

// The weight of column c where the gradient or the smoothing sum needs it (1 without weights).
__device__ __forceinline__ float class_weight(const float* weight, long long c) {
    return weight != nullptr ? __ldg(weight + c) : 1.0f;
}

// What the row's reductions give: the max m, the exp sum s (fixed point, scale fscale) and,
// with smoothing, q = sum_j w_j (x_j - m) as a float.
struct CeSums {
    float m;
    float pscale;  // p_j = exp(x_j - m) * pscale (NaN unless m is finite)
    float L;       // log(sum exp(x - m)) = lse - m (NaN unless m is finite)
    long long s;
    float q;
};
__device__ __forceinline__ CeSums ce_sums(float m, long long s, float q, float fscale) {
    CeSums r;
    const bool fin = abs_bits(m) < 0x7f800000u;
    r.m = m;
    r.s = s;
    r.q = q;
    r.pscale = fin ? fscale / static_cast<float>(s) : SOFTMAX_NAN;
    const long long one = static_cast<long long>(fscale);  // the max's own term, 2^K
    r.L = fin ? log1pf(static_cast<float>(s - one) / fscale) : SOFTMAX_NAN;
    return r;
}

// The smoothing sum's bound: max|w| * (max - min) >= |w_j (x_j - max)| for every j (rounding is
// monotone), itself order-free.
__device__ __forceinline__ FreeSum smoothing_sum(const float* params, float m, float mn, int n_cols) {
    return FreeSum(abs_bits(CE_W_MAX(params) * (m - mn)), n_cols);
}

// The owner's part: writes the row's loss and returns the target's gradient, which the owner
// stores after its bulk store of the same element.
__device__ __forceinline__ float ce_target(long long t, float xt, const CeRow& r, const CeSums& z, const float* weight,
                                           const float* params, float eps, int n_cols, float fscale, float* loss) {
    const float et = fast_exp(xt - z.m);  // the same expression as the bulk's: the same value
    const float pt = et * z.pscale;
    const float pm1 = z.pscale == z.pscale
                          ? static_cast<float>(to_fixed_rn(et, fscale) - z.s) / static_cast<float>(z.s)
                          : SOFTMAX_NAN;
    const float w_t = weight != nullptr ? __ldg(weight + t) : 1.0f;
    const float alpha = (1.0f - eps) * w_t;
    const float g = CE_G(params), eps_v = eps / static_cast<float>(n_cols), w_all = CE_W_ALL(params);
    float l = alpha * ((z.m - xt) + z.L);
    if (eps > 0.0f) l = fmaf(eps_v, fmaf(w_all, z.L, -z.q), l);
    *loss = l;
    return fmaf(g * alpha, pm1, eps > 0.0f ? fmaf(g * eps_v * w_all, pt, -(r.gc * w_t)) : 0.0f);  // as ce_row's
}

// The row's log-sum-exp, and the loss of a row without an owner (ignored: 0; bad target: NaN).
__device__ __forceinline__ void ce_row_outputs(const CeRow& r, const CeSums& z, float* loss, float* lse) {
    *lse = z.L == z.L ? z.m + z.L : z.m;  // +-inf rows give +-inf, as torch.logsumexp
    if (!r.ok) *loss = r.valid ? SOFTMAX_NAN : 0.0f;
}

#define CE_PARAMS(T)                                                                                   \
    const T *x, long long x_stride, T *grad, long long g_stride, const long long *__restrict__ target, \
        long long n_rows, int n_cols, long long ignore_index, const float *__restrict__ weight,        \
        const float *__restrict__ params, float eps, float *__restrict__ loss, float *__restrict__ lse
// x and grad are not __restrict__: the gradient may be written over the logits.

// ---- warp per row, element-wise -----------------------------------------------------------
template <class Fmt, int EW, int WPB>
__device__ __forceinline__ void ce_warp_body(CE_PARAMS(typename Fmt::T)) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const long long step = static_cast<long long>(gridDim.x) * WPB;
    const float fscale = fixed_point_scale(n_cols);
    const bool smooth = eps > 0.0f;
    for (long long row = static_cast<long long>(blockIdx.x) * WPB + warp; row < n_rows; row += step) {
        const typename Fmt::T* xr = x + row * x_stride;
        typename Fmt::T* gr = grad + row * g_stride;
        float v[EW];
#pragma unroll
        for (int i = 0; i < EW; ++i) {
            const int c = i * 32 + lane;
            v[i] = c < n_cols ? Fmt::load1(xr + c) : SOFTMAX_NEG_INF;
        }
        const long long t = __ldg(target + row);
        const CeRow r = ce_row(t, ignore_index, n_cols, weight, params, eps);
        const bool owner = r.ok && static_cast<int>(t & 31) == lane;
        const float xt = owner ? Fmt::load1(xr + t) : 0.0f;

        float m = v[0], mn = -SOFTMAX_NEG_INF;
#pragma unroll
        for (int i = 0; i < EW; ++i) {
            m = fmax_nan(m, v[i]);
            if (i * 32 + lane < n_cols) mn = fmin_nan(mn, v[i]);
        }
        block_max_min_nan<1>(m, mn, nullptr);
        long long q = 0;
        const FreeSum fq = smoothing_sum(params, m, mn, n_cols);
        if (smooth) {
#pragma unroll
            for (int i = 0; i < EW; ++i) {
                const int c = i * 32 + lane;
                if (c < n_cols) q += fq.term(class_weight(weight, c) * (v[i] - m));
            }
        }
        long long s = 0;
#pragma unroll
        for (int i = 0; i < EW; ++i) {
            v[i] = fast_exp(v[i] - m);
            s += to_fixed_rn(v[i], fscale);
        }
        block_sum_fixed2<1>(s, q, nullptr);
        const CeSums z = ce_sums(m, s, smooth ? fq.finish(q) : 0.0f, fscale);
        const float gt = owner ? ce_target(t, xt, r, z, weight, params, eps, n_cols, fscale, loss + row) : 0.0f;
        if (lane == 0) ce_row_outputs(r, z, loss + row, lse + row);
        const float* wg = smooth ? weight : nullptr;  // per-column weights in the gradient, if any
#pragma unroll
        for (int i = 0; i < EW; ++i) {
            const int c = i * 32 + lane;
            if (c < n_cols) Fmt::store1(gr + c, fmaf(v[i] * z.pscale, r.ga, -(r.gc * class_weight(wg, c))));
        }
        if (owner) Fmt::store1(gr + t, gt);
    }
}

// ---- warp (RPB rows a block), block (C == 1) or cluster (C > 1) per row ----------------------
// The slicing, loads and packing of fused_row_body (softmax_fused.cu); padding is -inf (no
// mass), and kept out of the min and the smoothing sum by the slice bounds.
template <class Fmt, int NT, int E, int C, int RPB, bool PACKED>
__device__ __forceinline__ void ce_row_body(CE_PARAMS(typename Fmt::T)) {
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

    __shared__ float2 red_m[NW];
    __shared__ longlong2 red_s[NW];
    __shared__ Meet<C, 2, 2> meet;

    const int tid = (RPB == 1) ? static_cast<int>(threadIdx.x) : static_cast<int>(threadIdx.x) % NT;
    const int sub = (RPB == 1) ? 0 : static_cast<int>(threadIdx.x) / NT;
    const unsigned rank = (C > 1) ? cluster_rank() : 0u;
    const int chunk = (C > 1) ? ((n_cols + C - 1) / C + 7) / 8 * 8 : n_cols;
    const int start = min(static_cast<int>(rank) * chunk, n_cols);
    const int len = min(n_cols - start, chunk);
    const float fscale = fixed_point_scale(n_cols);
    const long long row_step = static_cast<long long>(gridDim.x / C) * RPB;
    const unsigned zero_a = static_cast<unsigned>(n_cols >> 31);
    const unsigned zero_b = static_cast<unsigned>(n_rows >> 63);
    const unsigned zero_c = static_cast<unsigned>(x_stride >> 63);
    const bool smooth = eps > 0.0f;
    const float* wg = smooth ? weight : nullptr;  // per-column weights in the gradient, if any

    if (C > 1) meet_init(meet);
    unsigned parity = 0;
    for (long long row = static_cast<long long>(blockIdx.x / C) * RPB + sub; row < n_rows;
         row += row_step, parity ^= 1u) {
        const T* xs = x + row * x_stride + start;
        T* gs = grad + row * g_stride + start;
        const SliceGeom<VEC, T> g(xs, len);
        const bool o_vec = same_alignment(gs, xs);
        const uint4* xv = reinterpret_cast<const uint4*>(xs + g.head);

        float v[NVF][VEC];
        uint4 r[NVR];
#pragma unroll
        for (int j = 0; j < NV; ++j) {
            const int vi = j * NT + tid;
            if constexpr (PACKED) {
                r[j] = vi < g.nvec ? ld_once(xv + vi)
                                   : make_uint4(Fmt::NEG_INF_WORD, Fmt::NEG_INF_WORD, Fmt::NEG_INF_WORD,
                                                Fmt::NEG_INF_WORD);
            } else if (vi < g.nvec) {
                Fmt::unpack(ld_once(xv + vi), v[j]);
            } else {
#pragma unroll
                for (int kk = 0; kk < VEC; ++kk) v[j][kk] = SOFTMAX_NEG_INF;
            }
        }
        float hv = tid < g.head ? Fmt::load1(xs + tid) : SOFTMAX_NEG_INF;
        float tv = tid < g.tail ? Fmt::load1(xs + g.tail0 + tid) : SOFTMAX_NEG_INF;

        const long long t = __ldg(target + row);
        const CeRow rw = ce_row(t, ignore_index, n_cols, weight, params, eps);
        // The thread holding the target's column, if this slice has it.
        const int l = rw.ok && t >= start && t < start + len ? static_cast<int>(t - start) : -1;
        const int own = l < 0 ? -1 : (l < g.head ? l : (l >= g.tail0 ? l - g.tail0 : ((l - g.head) / VEC) % NT));
        const bool owner = own == tid;
        const float xt = owner ? Fmt::load1(xs + l) : 0.0f;

        // Pass 1: max (and min, for smoothing), NaN-propagating.
        float m = fmax_nan(hv, tv);
        float mn = -SOFTMAX_NEG_INF;
        if (smooth) {
            if (tid < g.head) mn = fmin_nan(mn, hv);
            if (tid < g.tail) mn = fmin_nan(mn, tv);
        }
#pragma unroll
        for (int j = 0; j < NV; ++j) {
            float f[VEC];
            if constexpr (PACKED) {
                Fmt::unpack(r[j], f);
            } else {
#pragma unroll
                for (int kk = 0; kk < VEC; ++kk) f[kk] = v[j][kk];
            }
#pragma unroll
            for (int kk = 0; kk < VEC; ++kk) m = fmax_nan(m, f[kk]);
            if (smooth && j * NT + tid < g.nvec) {
#pragma unroll
                for (int kk = 0; kk < VEC; ++kk) mn = fmin_nan(mn, f[kk]);
            }
        }
        block_max_min_nan<NW>(m, mn, red_m);
        if constexpr (C > 1) {
            const unsigned w[2] = {__float_as_uint(m), __float_as_uint(mn)};
            meet_a(meet, w, rank, parity);
#pragma unroll
            for (int c = 0; c < C; ++c) {
                m = fmax_nan(m, __uint_as_float(meet.w32[2 * c]));
                mn = fmin_nan(mn, __uint_as_float(meet.w32[2 * c + 1]));
            }
        }

        // Pass 2: the smoothing sum (from the logits, before they become exponentials), then
        // the exp sum.
        long long q = 0;
        const FreeSum fq = smoothing_sum(params, m, mn, n_cols);
        if (smooth && fq.finite()) {
            if (tid < g.head) q += fq.fixed(class_weight(weight, start + tid) * (hv - m));
            if (tid < g.tail) q += fq.fixed(class_weight(weight, start + g.tail0 + tid) * (tv - m));
#pragma unroll
            for (int j = 0; j < NV; ++j) {
                const int vi = j * NT + tid;
                if (vi < g.nvec) {
                    float f[VEC];
                    if constexpr (PACKED) {
                        Fmt::unpack(xor_words(r[j], zero_c), f);
                    } else {
#pragma unroll
                        for (int kk = 0; kk < VEC; ++kk) f[kk] = v[j][kk];
                    }
                    const int c0 = start + g.head + vi * VEC;
#pragma unroll
                    for (int kk = 0; kk < VEC; ++kk) q += fq.fixed(class_weight(weight, c0 + kk) * (f[kk] - m));
                }
            }
        } else if (smooth) {
            // Infinite terms (-inf logits, or an overflowing range): counted from memory,
            // element by element, rare enough not to need a second unrolled copy. No store to
            // this row has happened yet, so this reads the logits even when writing over them.
            for (int i = tid; i < len; i += NT)
                q += FreeSum::count(class_weight(weight, start + i) * (Fmt::load1(xs + i) - m));
        }
        hv = fast_exp(hv - m);
        tv = fast_exp(tv - m);
        long long s = to_fixed_rn(hv, fscale) + to_fixed_rn(tv, fscale);
#pragma unroll
        for (int j = 0; j < NV; ++j) {
            if constexpr (PACKED) {
                float f[VEC];
                Fmt::unpack(xor_words(r[j], zero_a), f);
#pragma unroll
                for (int kk = 0; kk < VEC; ++kk) s += to_fixed_rn(fast_exp(f[kk] - m), fscale);
            } else {
#pragma unroll
                for (int kk = 0; kk < VEC; ++kk) {
                    v[j][kk] = fast_exp(v[j][kk] - m);
                    s += to_fixed_rn(v[j][kk], fscale);
                }
            }
        }
        block_sum_fixed2<NW>(s, q, red_s);
        if constexpr (C > 1) {
            const long long w[2] = {s, q};
            meet_b(meet, w, rank, parity);
            s = q = 0;
#pragma unroll
            for (int c = 0; c < C; ++c) {
                s += meet.w64[2 * c];
                q += meet.w64[2 * c + 1];
            }
        }
        const CeSums z = ce_sums(m, s, smooth ? fq.finish(q) : 0.0f, fscale);
        // The row's own outputs first, so that only the target's gradient stays live in pass 3.
        const float gt = owner ? ce_target(t, xt, rw, z, weight, params, eps, n_cols, fscale, loss + row) : 0.0f;
        if (rank == 0 && tid == 0) ce_row_outputs(rw, z, loss + row, lse + row);

        // Pass 3: the gradient, p_j * ga - gc * w_j.
        T* gb = gs + g.head;
#pragma unroll
        for (int j = 0; j < NV; ++j) {
            const int vi = j * NT + tid;
            if (vi < g.nvec) {
                float o[VEC];
                if constexpr (PACKED) {
                    Fmt::unpack(xor_words(r[j], zero_b), o);
#pragma unroll
                    for (int kk = 0; kk < VEC; ++kk) o[kk] = fast_exp(o[kk] - m) * z.pscale;
                } else {
#pragma unroll
                    for (int kk = 0; kk < VEC; ++kk) o[kk] = v[j][kk] * z.pscale;
                }
                const int c0 = start + g.head + vi * VEC;
#pragma unroll
                for (int kk = 0; kk < VEC; ++kk) o[kk] = fmaf(o[kk], rw.ga, -(rw.gc * class_weight(wg, c0 + kk)));
                if (o_vec) {
                    st_once(reinterpret_cast<uint4*>(gb) + vi, Fmt::pack(o));
                } else {
#pragma unroll
                    for (int kk = 0; kk < VEC; ++kk) Fmt::store1(gb + vi * VEC + kk, o[kk]);
                }
            }
        }
        if (tid < g.head)
            Fmt::store1(gs + tid, fmaf(hv * z.pscale, rw.ga, -(rw.gc * class_weight(wg, start + tid))));
        if (tid < g.tail)
            Fmt::store1(gs + g.tail0 + tid,
                        fmaf(tv * z.pscale, rw.ga, -(rw.gc * class_weight(wg, start + g.tail0 + tid))));
        if (owner) Fmt::store1(gs + l, gt);  // after this thread's bulk store of the same element
    }
}

// ---- rows too long to hold: three passes, by a block or a cluster -----------------------------
// Each CTA walks its slice U vectors a thread at a time: max and min; the exp sum with the
// smoothing sum; the gradient. The first two read through __ldg so the data stays in L2.
template <class Fmt, int NT, int EL, int C>
__device__ __forceinline__ void ce_loop_body(CE_PARAMS(typename Fmt::T)) {
    typedef typename Fmt::T T;
    constexpr int VEC = Fmt::VEC;
    constexpr int NW = NT / 32;
    constexpr int U = EL / VEC;
    static_assert(EL % VEC == 0, "elements per step must be whole vectors");
    static_assert(C >= 1 && C <= 8, "portable cluster size");
    __shared__ float2 red_m[NW];
    __shared__ longlong2 red_s[NW];
    __shared__ Meet<C, 2, 2> meet;
    const int tid = threadIdx.x;
    const unsigned rank = (C > 1) ? cluster_rank() : 0u;
    const int chunk = (C > 1) ? ((n_cols + C - 1) / C + 7) / 8 * 8 : n_cols;
    const int start = min(static_cast<int>(rank) * chunk, n_cols);
    const int len = min(n_cols - start, chunk);
    const float fscale = fixed_point_scale(n_cols);
    const bool smooth = eps > 0.0f;
    const float* wg = smooth ? weight : nullptr;  // per-column weights in the gradient, if any

    if (C > 1) meet_init(meet);
    unsigned parity = 0;
    for (long long row = blockIdx.x / C; row < n_rows; row += gridDim.x / C, parity ^= 1u) {
        const T* xs = x + row * x_stride + start;
        T* gs = grad + row * g_stride + start;
        const SliceGeom<VEC, T> g(xs, len);
        const bool o_vec = same_alignment(gs, xs);
        const uint4* xv = reinterpret_cast<const uint4*>(xs + g.head);
        const float hx = tid < g.head ? Fmt::load1_cached(xs + tid) : SOFTMAX_NEG_INF;
        const float tx = tid < g.tail ? Fmt::load1_cached(xs + g.tail0 + tid) : SOFTMAX_NEG_INF;

        const long long t = __ldg(target + row);
        const CeRow rw = ce_row(t, ignore_index, n_cols, weight, params, eps);
        const int l = rw.ok && t >= start && t < start + len ? static_cast<int>(t - start) : -1;
        const int own = l < 0 ? -1 : (l < g.head ? l : (l >= g.tail0 ? l - g.tail0 : ((l - g.head) / VEC) % NT));
        const bool owner = own == tid;
        const float xt = owner ? Fmt::load1(xs + l) : 0.0f;

        // Runs f(ra, vi0) on every U-vector step of the slice: ra the raw vectors (-inf words
        // past the slice; widened by f one vector at a time), vector u having index vi0 + u * NT.
        auto walk = [&](auto f, bool cached) {
            const unsigned ninf = Fmt::NEG_INF_WORD;
            for (int base = 0; base < g.nvec; base += U * NT) {
                uint4 ra[U];
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int vi = base + u * NT + tid;
                    ra[u] = vi < g.nvec ? (cached ? __ldg(xv + vi) : ld_once(xv + vi)) : make_uint4(ninf, ninf, ninf, ninf);
                }
                f(ra, base + tid);
            }
        };

        float m = fmax_nan(hx, tx);
        float mn = -SOFTMAX_NEG_INF;
        if (smooth) {
            if (tid < g.head) mn = fmin_nan(mn, hx);
            if (tid < g.tail) mn = fmin_nan(mn, tx);
        }
        walk(
            [&](const uint4 (&ra)[U], int vi0) {
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    float a[VEC];
                    Fmt::unpack(ra[u], a);
#pragma unroll
                    for (int kk = 0; kk < VEC; ++kk) m = fmax_nan(m, a[kk]);
                    if (smooth && vi0 + u * NT < g.nvec) {
#pragma unroll
                        for (int kk = 0; kk < VEC; ++kk) mn = fmin_nan(mn, a[kk]);
                    }
                }
            },
            true);
        block_max_min_nan<NW>(m, mn, red_m);
        if constexpr (C > 1) {
            const unsigned w[2] = {__float_as_uint(m), __float_as_uint(mn)};
            meet_a(meet, w, rank, parity);
#pragma unroll
            for (int c = 0; c < C; ++c) {
                m = fmax_nan(m, __uint_as_float(meet.w32[2 * c]));
                mn = fmin_nan(mn, __uint_as_float(meet.w32[2 * c + 1]));
            }
        }

        const FreeSum fq = smoothing_sum(params, m, mn, n_cols);
        const bool q_fixed = smooth && fq.finite();  // else counted below (see ce_row_body)
        long long s = to_fixed_rn(fast_exp(hx - m), fscale) + to_fixed_rn(fast_exp(tx - m), fscale);
        long long q = 0;
        if (q_fixed) {
            if (tid < g.head) q += fq.fixed(class_weight(weight, start + tid) * (hx - m));
            if (tid < g.tail) q += fq.fixed(class_weight(weight, start + g.tail0 + tid) * (tx - m));
        } else if (smooth) {
            for (int i = tid; i < len; i += NT)
                q += FreeSum::count(class_weight(weight, start + i) * (Fmt::load1_cached(xs + i) - m));
        }
        walk(
            [&](const uint4 (&ra)[U], int vi0) {
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    float a[VEC];
                    Fmt::unpack(ra[u], a);
#pragma unroll
                    for (int kk = 0; kk < VEC; ++kk) s += to_fixed_rn(fast_exp(a[kk] - m), fscale);
                    const int vi = vi0 + u * NT;
                    if (q_fixed && vi < g.nvec) {
                        const int c0 = start + g.head + vi * VEC;
#pragma unroll
                        for (int kk = 0; kk < VEC; ++kk) q += fq.fixed(class_weight(weight, c0 + kk) * (a[kk] - m));
                    }
                }
            },
            true);
        block_sum_fixed2<NW>(s, q, red_s);
        if constexpr (C > 1) {
            const long long w[2] = {s, q};
            meet_b(meet, w, rank, parity);
            s = q = 0;
#pragma unroll
            for (int c = 0; c < C; ++c) {
                s += meet.w64[2 * c];
                q += meet.w64[2 * c + 1];
            }
        }
        const CeSums z = ce_sums(m, s, smooth ? fq.finish(q) : 0.0f, fscale);
        const float gt = owner ? ce_target(t, xt, rw, z, weight, params, eps, n_cols, fscale, loss + row) : 0.0f;
        if (rank == 0 && tid == 0) ce_row_outputs(rw, z, loss + row, lse + row);

        if (tid < g.head)
            Fmt::store1(gs + tid, fmaf(fast_exp(hx - m) * z.pscale, rw.ga,
                                       -(rw.gc * class_weight(wg, start + tid))));
        if (tid < g.tail)
            Fmt::store1(gs + g.tail0 + tid, fmaf(fast_exp(tx - m) * z.pscale, rw.ga,
                                                 -(rw.gc * class_weight(wg, start + g.tail0 + tid))));
        T* gb = gs + g.head;
        walk(
            [&](const uint4 (&ra)[U], int vi0) {
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int vi = vi0 + u * NT;
                    if (vi < g.nvec) {
                        const int c0 = start + g.head + vi * VEC;
                        float o[VEC];
                        Fmt::unpack(ra[u], o);
#pragma unroll
                        for (int kk = 0; kk < VEC; ++kk)
                            o[kk] = fmaf(fast_exp(o[kk] - m) * z.pscale, rw.ga,
                                         -(rw.gc * class_weight(wg, c0 + kk)));
                        if (o_vec) {
                            st_once(reinterpret_cast<uint4*>(gb) + vi, Fmt::pack(o));
                        } else {
#pragma unroll
                            for (int kk = 0; kk < VEC; ++kk) Fmt::store1(gb + vi * VEC + kk, o[kk]);
                        }
                    }
                }
            },
            false);
        if (owner) Fmt::store1(gs + l, gt);  // after this thread's bulk store of the same element
        __syncthreads();  // the block reductions' slots are read by all before the next row
    }
}

// ---- the prologue: targets and weights, before the main kernel ----------------------------------
// One block. Finds the first row whose target is neither ignore_index nor in [0, V) (stats[0];
// n_rows if none) and the number of counted rows (stats[1]), and writes params:
//   [0] the gradient scale: 1 / W for "mean" (W = sum of the counted rows' w_t), else 1
//   [1] sum of all class weights, [2] max |class weight| (V and 1 without weights), [3] W.
// Both weighted sums are order-free (FreeSum), so they do not depend on the rows' order either.
template <int NW>
__device__ __forceinline__ long long block_min_i64(long long v, long long* red) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, off));
    const int lane = threadIdx.x & 31;
    if (lane == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    v = lane < NW ? red[lane] : 0x7fffffffffffffffll;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

#define CE_HELPER_THREADS 1024
extern "C" __global__ void __launch_bounds__(CE_HELPER_THREADS, 1)
    ce_prologue(const long long* __restrict__ target, long long n_rows, int n_cols, long long ignore_index,
                const float* __restrict__ weight, int mean, float* __restrict__ params, long long* __restrict__ stats) {
    constexpr int NT = CE_HELPER_THREADS, NW = NT / 32;
    __shared__ unsigned red_u[2][NW];
    __shared__ long long red_l[4][NW];
    const int tid = threadIdx.x;

    float w_all = static_cast<float>(n_cols), w_max = 1.0f;
    if (weight != nullptr) {
        unsigned b = 0u;
        for (int c = tid; c < n_cols; c += NT) b = max(b, abs_bits(__ldg(weight + c)));
        b = block_umax<NW>(b, red_u[0]);
        const FreeSum fs(b, n_cols);
        long long s = 0;
        for (int c = tid; c < n_cols; c += NT) s += fs.term(__ldg(weight + c));
        w_all = fs.finish(block_sum_fixed<NW>(s, red_l[0]));
        w_max = __uint_as_float(b);
    }

    long long first_bad = n_rows, counted = 0;
    unsigned b = 0u;
    for (long long i = tid; i < n_rows; i += NT) {
        const long long t = __ldg(target + i);
        if (t == ignore_index) continue;
        if (static_cast<unsigned long long>(t) >= static_cast<unsigned long long>(n_cols)) {
            first_bad = min(first_bad, i);
        } else {
            ++counted;
            if (weight != nullptr) b = max(b, abs_bits(__ldg(weight + t)));
        }
    }
    first_bad = block_min_i64<NW>(first_bad, red_l[1]);
    counted = block_sum_fixed<NW>(counted, red_l[2]);
    float W = static_cast<float>(counted);
    if (weight != nullptr) {
        b = block_umax<NW>(b, red_u[1]);
        const FreeSum fs(b, n_rows);
        long long s = 0;
        for (long long i = tid; i < n_rows; i += NT) {
            const long long t = __ldg(target + i);
            if (t != ignore_index && static_cast<unsigned long long>(t) < static_cast<unsigned long long>(n_cols))
                s += fs.term(__ldg(weight + t));
        }
        W = fs.finish(block_sum_fixed<NW>(s, red_l[3]));
    }
    if (tid == 0) {
        params[0] = mean ? 1.0f / W : 1.0f;  // W = 0 (nothing counted): inf, and the loss 0 / 0
        params[1] = w_all;
        params[2] = w_max;
        params[3] = W;
        stats[0] = first_bad;
        stats[1] = counted;
    }
}

// ---- the reduction: the per-row losses' order-free sum, divided by W for "mean" -----------------
extern "C" __global__ void __launch_bounds__(CE_HELPER_THREADS, 1)
    ce_reduce(const float* __restrict__ loss, long long n_rows, const float* __restrict__ params, int mean,
              float* __restrict__ out) {
    constexpr int NT = CE_HELPER_THREADS, NW = NT / 32;
    __shared__ unsigned red_u[NW];
    __shared__ long long red_l[NW];
    const int tid = threadIdx.x;
    unsigned b = 0u;
    for (long long i = tid; i < n_rows; i += NT) b = max(b, abs_bits(loss[i]));
    b = block_umax<NW>(b, red_u);
    const FreeSum fs(b, n_rows);
    long long s = 0;
    for (long long i = tid; i < n_rows; i += NT) s += fs.term(loss[i]);
    const float total = fs.finish(block_sum_fixed<NW>(s, red_l));
    if (tid == 0) out[0] = mean ? total / __ldg(params + 3) : total;
}

// ---- kernel entry points ------------------------------------------------------------------
#define CE_CALL x, x_stride, grad, g_stride, target, n_rows, n_cols, ignore_index, weight, params, eps, loss, lse

#define CROSS_ENTROPY_WARP(NAME, FMT, EW, WPB)                                                             \
    extern "C" __global__ void __launch_bounds__((WPB) * 32, 1024 / ((WPB) * 32)) NAME(CE_PARAMS(FMT::T)) { \
        ce_warp_body<FMT, EW, WPB>(CE_CALL);                                                                 \
    }

#define CROSS_ENTROPY_WARPVEC(NAME, FMT, E, RPB)                                                           \
    extern "C" __global__ void __launch_bounds__(32 * (RPB), 1024 / (32 * (RPB))) NAME(CE_PARAMS(FMT::T)) { \
        ce_row_body<FMT, 32, E, 1, RPB, false>(CE_CALL);                                                     \
    }

#define CROSS_ENTROPY_ROW(NAME, FMT, NT, E, PACKED)                                      \
    extern "C" __global__ void __launch_bounds__(NT, 1024 / (NT)) NAME(CE_PARAMS(FMT::T)) { \
        ce_row_body<FMT, NT, E, 1, 1, PACKED>(CE_CALL);                                    \
    }

#define CROSS_ENTROPY_LOOP(NAME, FMT, NT, EL)                                            \
    extern "C" __global__ void __launch_bounds__(NT, 1024 / (NT)) NAME(CE_PARAMS(FMT::T)) { \
        ce_loop_body<FMT, NT, EL, 1>(CE_CALL);                                             \
    }

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define CROSS_ENTROPY_CLUSTER(NAME, FMT, NT, E, C, PACKED)                                                  \
    extern "C" __global__ void __cluster_dims__(C, 1, 1) __launch_bounds__(NT, 1024 / (NT))                 \
        NAME(CE_PARAMS(FMT::T)) {                                                                           \
        ce_row_body<FMT, NT, E, C, 1, PACKED>(CE_CALL);                                                     \
    }
#define CROSS_ENTROPY_LOOP_CLUSTER(NAME, FMT, NT, EL, C)                                                    \
    extern "C" __global__ void __cluster_dims__(C, 1, 1) __launch_bounds__(NT, 1024 / (NT))                 \
        NAME(CE_PARAMS(FMT::T)) {                                                                           \
        ce_loop_body<FMT, NT, EL, C>(CE_CALL);                                                              \
    }
#else
#define CROSS_ENTROPY_CLUSTER(NAME, FMT, NT, E, C, PACKED)
#define CROSS_ENTROPY_LOOP_CLUSTER(NAME, FMT, NT, EL, C)
#endif
