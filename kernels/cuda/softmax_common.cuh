// Helpers shared by the softmax kernels.
//
// Deliberately free of CUDA headers (no <cuda_bf16.h>, <cooperative_groups.h>, no INFINITY):
// the source is compiled at run time, and keeping it header-free lets the same text build under
// nvcc and NVRTC. The Python loader pastes this file in place of its #include line, so the
// compile cache key covers it.


#define SOFTMAX_NEG_INF __int_as_float(0xff800000)
#define SOFTMAX_NAN __int_as_float(0x7fffffff)

typedef unsigned long long softmax_uptr;

// Cache hints, switchable for measurements (-DSOFTMAX_LOAD_CS=1 / -DSOFTMAX_STORE_CS=1). Plain
// loads through the read-only path (__ldg) and plain stores are the defaults: on the H200 the
// evict-first variants (__ldcs, __stcs) measured 2-6% slower at B = 32768, V = 600 ... 128256.
#ifndef SOFTMAX_LOAD_CS
#define SOFTMAX_LOAD_CS 0
#endif
#ifndef SOFTMAX_STORE_CS
#define SOFTMAX_STORE_CS 0
#endif
template <typename P>
__device__ __forceinline__ P ld_once(const P* p) {
#if SOFTMAX_LOAD_CS
    return __ldcs(p);
#else
    return __ldg(p);
#endif
}
template <typename P>
__device__ __forceinline__ void st_once(P* p, P v) {
#if SOFTMAX_STORE_CS
    __stcs(p, v);
#else
    *p = v;
#endif
}

// ---- exp(x - max) and the normalisation: every kernel calls these two -----------------------
// fp32 outputs (Fmt::ACCURATE) get at most a few ulps of error whatever |x - max| is; 16-bit
// outputs keep the fast forms, whose error (below 2e-5 relative) the one rounding to storage
// (2^-9 relative for bf16, 2^-12 for fp16) swamps. The analysis behind the numbers is written
// out next to the tolerance table, tests/helpers.py.
#define SOFTMAX_LOG2E 1.4426950408889634f         // log2(e) rounded to float: L
#define SOFTMAX_LOG2E_REST 1.3349758171622139e-8f  // (log2(e) - L) * ln(2)
#define SOFTMAX_LN2 0.6931471805599453f

__device__ __forceinline__ float ex2_approx(float t) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(t));
    return r;
}

// exp(a) as one multiply and one MUFU op: 2 ulps from ex2 plus the rounding of a * L (half an
// ulp of a * L, i.e. |a| * 2^-24 relative) and L's own error (|a| * 1.3e-8): ~1.1 ulps per unit
// of |a| in all. The 16-bit outputs' exp.
__device__ __forceinline__ float fast_exp(float a) { return ex2_approx(a * SOFTMAX_LOG2E); }

// exp(x - r) to ex2's 2 ulps plus half an ulp, however far x lies below r, the row's reference
// point (exp_reference: its max rounded up onto a grid, below). Three errors of the fast form
// are carried along exactly and put back through exp(s + c) = 2^t * (1 + c):
//   s = x - r rounded:   err = x - ((x - r) + r), exact (below; F.softmax keeps this error:
//                        half an ulp of s, i.e. |x - max| * 2^-24 relative);
//   t = s * L rounded:   s * L - t, exact by an fma;
//   L != log2(e):        s * (log2(e) - L).
// |c| < 1e-5 where the result is not 0, so the first order is all it needs. An infinite s
// (x = -inf, or x - r overflowing) makes c NaN and p 0: fminf takes c to 1, the result to 0. A
// NaN s (an all -inf row) stays NaN through p.
//
// Why three operations give err exactly (2Sum takes six): r is a multiple of 2^-17, and every s
// that can give a nonzero output has |s| < 88 (past that ex2.approx.ftz of s * L is 0), so r is
// a multiple of ulp(s) and z = s + r is one too. z is then exact: where x and r are both
// negative, or x lies within a factor of two of r, s is exact already and z = x; otherwise
// |z| <= 2^(e_s + 1), e_s the binade of s. So x - z is the rounding error of s, which a float
// holds exactly. (With the raw max for r this fails where the max has bits below ulp(s): a max
// of 3.1415927 with x = -50, say.) reports/probes/cuda_exp_model.py checks it on 6.6 million
// pairs against exact rationals and models the whole fp32 path in NumPy.
__device__ __forceinline__ float exp_accurate(float x, float r) {
    const float s = x - r;
    const float err = x - (s + r);
    const float t = s * SOFTMAX_LOG2E;
    const float t_err = fmaf(s, -SOFTMAX_LOG2E, t);  // t - s * L, exactly
    float c = fmaf(s, SOFTMAX_LOG2E_REST, err);
    c = fminf(fmaf(t_err, -SOFTMAX_LN2, c), 1.0f);
    const float p = ex2_approx(t);
    return fmaf(p, c, p);
}

// The reference point exp(x - r) is taken from, for a row whose max is m: m itself for the
// fast forms; for the accurate form, m rounded up onto the multiples of 2^-17 (exact: m * 2^17
// is below 2^23 in magnitude there; |m| >= 64 is such a multiple already, and +-inf and NaN pass
// unchanged). r - m < 2^-17, so the largest term is exp(m - r) > 1 - 8e-6, at most 1, and
// every output is the same quotient: exp(x - r) / sum exp(x_j - r) = exp(x - m) / sum exp(x_j - m).
// r depends only on m, which is exact in any order, so the bits stay order-free.
template <class Fmt>
__device__ __forceinline__ float exp_reference(float m) {
    if constexpr (Fmt::ACCURATE) {
        return fabsf(m) < 64.0f ? ceilf(m * 131072.0f) * (1.0f / 131072.0f) : m;
    } else {
        return m;
    }
}

// exp(x - r) for an output of format Fmt; r = exp_reference<Fmt>(row max).
template <class Fmt>
__device__ __forceinline__ float softmax_exp(float x, float r) {
    if constexpr (Fmt::ACCURATE) {
        return exp_accurate(x, r);
    } else {
        return fast_exp(x - r);
    }
}

// A row's normaliser: its sum of exponentials rounded to float (hi), inv = 1 / hi rounded once,
// and inv_lo = inv * (1 - inv * hi), what inv leaves of 1 / hi to first order (the residual
// 1 - inv * hi is exact by an fma). (Carrying the sum's rounding error as well would save half an
// ulp, common to the whole row, at a register per thread that the largest Triton row class does
// not have.)
struct RowScale {
    float inv, inv_lo;
};
__device__ __forceinline__ RowScale row_scale_of(float hi, float inv) {
    return {inv, inv * fmaf(-inv, hi, 1.0f)};
}

// From a fixed-point sum (scale = 2^K, see below): scaled exactly.
__device__ __forceinline__ RowScale row_scale(long long s, float fscale) {
    const float hi = static_cast<float>(s);
    const float unit = __int_as_float((127 + 127) * (1 << 23) - __float_as_int(fscale));  // 1 / fscale, exactly
    return row_scale_of(hi * unit, fscale / hi);
}
__device__ __forceinline__ RowScale row_scale(double s) {
    const float hi = static_cast<float>(s);
    return row_scale_of(hi, 1.0f / hi);
}
__device__ __forceinline__ RowScale row_scale(float s) { return row_scale_of(s, 1.0f / s); }

// e / hi for an output of format Fmt. fp32: e * (inv + inv_lo) rounded once, i.e. the quotient
// rounded once up to 2^-47 relative (the term e * inv_lo flushes to 0 for quotients below
// 2^-102: there the product with inv, within an ulp); 16-bit: the product with inv (two
// roundings, far below the storage rounding).
template <class Fmt>
__device__ __forceinline__ float softmax_normalise(float e, const RowScale& r) {
    if constexpr (Fmt::ACCURATE) {
        return fmaf(e, r.inv, e * r.inv_lo);
    } else {
        return e * r.inv;
    }
}

// NaN-propagating max (PTX max.NaN, sm_80+): fmaxf drops a NaN operand, and a row holding a NaN
// must come out NaN throughout, as F.softmax's does.
__device__ __forceinline__ float fmax_nan(float a, float b) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = fmax_nan(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

// Block-wide reductions; every thread gets the result. `red` holds one float per warp and is
// owned by this reduction alone, so two reductions in a row need no barrier between them.
template <int NW>
__device__ __forceinline__ float block_max(float v, float* red) {
    v = warp_max(v);
    if (NW == 1) return v;
    const int lane = threadIdx.x & 31;
    if (lane == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    v = lane < NW ? red[lane] : SOFTMAX_NEG_INF;
    return warp_max(v);
}

template <int NW>
__device__ __forceinline__ float block_sum(float v, float* red) {
    v = warp_sum(v);
    if (NW == 1) return v;
    const int lane = threadIdx.x & 31;
    if (lane == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    v = lane < NW ? red[lane] : 0.0f;
    return warp_sum(v);
}

// A row whose max m is NaN or +inf is NaN throughout, as F.softmax's: its terms exp(x - m) hold a
// NaN, which the fixed-point sum cannot carry (a NaN converts to INT64_MIN). Its sum, this
// thread's part of it, is taken as 0 instead, whose scale is NaN (row_scale: hi = 0, inv = +inf,
// inv_lo = inv * (1 - inv * 0) = NaN), so every output is. Applied where m is at hand anyway
// (a value kept alive past the meetings spills at sm_80's register bound).
__device__ __forceinline__ long long nan_row_sum(long long s, float m) { return m < -SOFTMAX_NEG_INF ? s : 0; }

// ---- order-free sums: exponentials in 64-bit fixed point ---------------------------------------
// A row's sum of exp(x - max) is accumulated as integers: term = trunc(e * 2^K) with
// K = 62 - ceil(log2 V), so V terms of at most 2^K (exp(x - r) <= 1, exp_reference) stay
// below 2^62. Integer addition is associative, so the sum, and with it every output bit, is the
// same however the row was split over lanes, warps, CTAs or a cluster, and whatever the row's
// alignment. Truncation costs less than V / 2^K relative to a sum of about 2^K or more: 4e-9
// at V = 128256. The max needs no such care: it is exact in any order.
__device__ __forceinline__ float fixed_point_scale(int n_cols) {
    const int bits = n_cols > 1 ? 32 - __clz(n_cols - 1) : 0;  // ceil(log2 n_cols)
    return __int_as_float((127 + 62 - bits) << 23);             // 2^(62 - bits), exactly
}
__device__ __forceinline__ long long to_fixed(float e, float scale) {
    return __float2ll_rz(e * scale);  // e <= 1: scaling by a power of two is exact
}

__device__ __forceinline__ long long warp_sum_fixed(long long v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

// As block_sum, for fixed-point terms; `red` holds one word per warp.
template <int NW>
__device__ __forceinline__ long long block_sum_fixed(long long v, long long* red) {
    v = warp_sum_fixed(v);
    if (NW == 1) return v;
    const int lane = threadIdx.x & 31;
    if (lane == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    v = lane < NW ? red[lane] : 0ll;
    return warp_sum_fixed(v);
}

// ---- element formats: storage type, 16-byte vector width, conversion to/from fp32 ----------
// 16-bit formats travel as raw bits (unsigned short) so no half/bfloat16 header is needed.

struct FmtF32 {
    typedef float T;
    static constexpr int VEC = 4;
    static constexpr bool ACCURATE = true;  // softmax_exp / softmax_normalise to a few ulps
    static constexpr unsigned NEG_INF_WORD = 0xff800000u;  // a 32-bit word of -inf elements
    static __device__ __forceinline__ float load1(const T* p) { return ld_once(p); }
    static __device__ __forceinline__ float load1_cached(const T* p) { return __ldg(p); }
    static __device__ __forceinline__ void store1(T* p, float v) { st_once(p, v); }
    static __device__ __forceinline__ void unpack(const uint4& r, float* f) {
        f[0] = __uint_as_float(r.x);
        f[1] = __uint_as_float(r.y);
        f[2] = __uint_as_float(r.z);
        f[3] = __uint_as_float(r.w);
    }
    static __device__ __forceinline__ uint4 pack(const float* f) {
        return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]),
                          __float_as_uint(f[3]));
    }
};

// The 16-bit formats differ only in their conversions (to_f, from_f, unpack2, pack2); loads,
// stores and the 16-byte vector (un)packing are built from those here, once for both.
template <class Fmt>
struct Fmt16 {
    typedef unsigned short T;
    static constexpr int VEC = 8;
    static constexpr bool ACCURATE = false;  // the storage rounding swamps the fast forms' error
    static __device__ __forceinline__ float load1(const T* p) { return Fmt::to_f(ld_once(p)); }
    static __device__ __forceinline__ float load1_cached(const T* p) { return Fmt::to_f(__ldg(p)); }
    static __device__ __forceinline__ void store1(T* p, float v) { st_once(p, Fmt::from_f(v)); }
    static __device__ __forceinline__ void unpack(const uint4& r, float* f) {
        Fmt::unpack2(r.x, f + 0);
        Fmt::unpack2(r.y, f + 2);
        Fmt::unpack2(r.z, f + 4);
        Fmt::unpack2(r.w, f + 6);
    }
    static __device__ __forceinline__ uint4 pack(const float* f) {
        return make_uint4(Fmt::pack2(f[0], f[1]), Fmt::pack2(f[2], f[3]), Fmt::pack2(f[4], f[5]),
                          Fmt::pack2(f[6], f[7]));
    }
};

struct FmtBF16 : Fmt16<FmtBF16> {
    static constexpr unsigned NEG_INF_WORD = 0xff80ff80u;
    static __device__ __forceinline__ float to_f(unsigned short h) {
        return __uint_as_float(static_cast<unsigned>(h) << 16);
    }
    static __device__ __forceinline__ unsigned short from_f(float f) {
        unsigned short h;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
        return h;
    }
    // A 32-bit word holds element 2k in its low half and 2k+1 in its high half (little endian).
    static __device__ __forceinline__ void unpack2(unsigned w, float* f) {
        f[0] = __uint_as_float(w << 16);
        f[1] = __uint_as_float(w & 0xffff0000u);
    }
    // cvt.rn.bf16x2.f32 d, a, b puts a in the high half of d and b in the low half.
    static __device__ __forceinline__ unsigned pack2(float lo, float hi) {
        unsigned d;
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
        return d;
    }
};

struct FmtF16 : Fmt16<FmtF16> {
    static constexpr unsigned NEG_INF_WORD = 0xfc00fc00u;
    static __device__ __forceinline__ float to_f(unsigned short h) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
        return f;
    }
    static __device__ __forceinline__ unsigned short from_f(float f) {
        unsigned short h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
        return h;
    }
    static __device__ __forceinline__ void unpack2(unsigned w, float* f) {
        f[0] = to_f(static_cast<unsigned short>(w & 0xffffu));
        f[1] = to_f(static_cast<unsigned short>(w >> 16));
    }
    // cvt.rn.f16x2.f32 d, a, b puts a in the high half of d and b in the low half.
    static __device__ __forceinline__ unsigned pack2(float lo, float hi) {
        unsigned d;
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
        return d;
    }
};

// ---- row slice geometry --------------------------------------------------------------------
// A slice [p, p + len) is split into a scalar head up to the first 16-byte boundary, a body of
// 16-byte vectors and a scalar tail (< VEC elements each). Rows of odd length start at every
// possible alignment, so the peel is computed per slice from the address itself.
template <int VEC, typename T>
struct SliceGeom {
    int head;   // scalar elements before the first aligned vector
    int nvec;   // 16-byte vectors in the body
    int tail0;  // index of the first tail element
    int tail;   // scalar elements after the body
    __device__ __forceinline__ SliceGeom(const T* p, int len) {
        const int mis = static_cast<int>((reinterpret_cast<softmax_uptr>(p) & 15u) / sizeof(T));
        head = min((VEC - mis) % VEC, len);
        nvec = (len - head) / VEC;
        tail0 = head + nvec * VEC;
        tail = len - tail0;
    }
};
