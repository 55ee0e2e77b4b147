// Fused attention on CUDA: FlashAttention-2's scheme with tensor-core tile products.
//
// Forward: one block per (batch·head, tile of 128 queries; 64 in f32), warps of 16 query rows;
// the key/value tiles stream through shared memory, the scores stay in registers (online
// softmax in the base-2 domain), the row log-sum-exp is saved for the backward pass.
// Backward: one block per (batch·head, tile of 128 keys; 64 in f32), warps of 16 key rows,
// looping over the query tiles: dK and dV accumulate in registers, dQ in an f32 buffer
// through atomic adds (its order of summation is not fixed: last-bit differences between
// runs, as in PyTorch's flash backward).
//
// bf16/f16 use mma.m16n8k16 with f32 accumulation; f32 uses mma.m16n8k8 on tf32 operands
// split in two (big + small, three products: "3xTF32"), which keeps f32 accuracy.
// Masks (additive f32, the causal rule with an offset, key padding), the extra never-masked
// key columns (bias_k / zero attention), the crate's counter-based dropout and fully masked
// rows (zero output, lse = +inf) follow the CPU kernel (src/attention/fused/kernel).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

typedef unsigned long long u64;
typedef long long i64;

#define NEG_INF __int_as_float(0xff800000)
#define POS_INF __int_as_float(0x7f800000)
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

// Row (b, h, i) of a tensor starts at off + b*sb + h*sh + i*si (elements); its head_dim
// elements are contiguous.
struct RowMap {
  i64 off, sb, sh, si;
  __device__ __forceinline__ i64 at(int b, int h, int i) const {
    return off + (i64)b * sb + (i64)h * sh + (i64)i * si;
  }
};

// One struct for every kernel (the Rust side is `Params` in cuda/mod.rs: same order).
struct Params {
  u64 q, k, v;       // inputs
  u64 o;             // forward: the output; backward: the forward's output
  u64 dout;          // backward: the output's gradient
  u64 dq_acc;        // backward: f32 (N·H, L, d), zeroed
  u64 dq, dk, dv;    // backward: the gradients
  u64 lse;           // f32 (N·H, L), natural log
  u64 dsum;          // backward: f32 (N·H, L), Σ dO·O
  u64 attn, kpm;     // additive f32 masks, or 0
  RowMap mq, mk, mv, mo, mdo, mdq, mdk, mdv;
  i64 attn_bh_stride;  // L·s_masked for an (N·H, L, s_masked) mask, 0 for (L, s_masked)
  i64 causal_offset;   // key j < s_masked is masked for query i when j > i + causal_offset
  u64 drop_key, drop_threshold, drop_offset;
  int n, h, l, s, d, s_masked;
  int causal, dropout, vec;
  float scale, scale_log2, drop_scale;
};

// ---------------------------------------------------------------------------------------
// Element types: shared memory holds 16-bit types as raw bits, f32 as floats.

template <typename T> struct Ty;
template <> struct Ty<__nv_bfloat16> {
  typedef unsigned short S;
  static __device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 from_f(float x) { return __float2bfloat16_rn(x); }
  static __device__ __forceinline__ S bits(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }
  static __device__ __forceinline__ void store2(S* p, float a, float b) {
    *reinterpret_cast<uint32_t*>(p) = (uint32_t)bits(a) | ((uint32_t)bits(b) << 16);
  }
};
template <> struct Ty<__half> {
  typedef unsigned short S;
  static __device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half from_f(float x) { return __float2half_rn(x); }
  static __device__ __forceinline__ S bits(float x) { return __half_as_ushort(__float2half_rn(x)); }
  static __device__ __forceinline__ void store2(S* p, float a, float b) {
    *reinterpret_cast<uint32_t*>(p) = (uint32_t)bits(a) | ((uint32_t)bits(b) << 16);
  }
};
template <> struct Ty<float> {
  typedef float S;
  static __device__ __forceinline__ float to_f(float x) { return x; }
  static __device__ __forceinline__ float from_f(float x) { return x; }
  static __device__ __forceinline__ S bits(float x) { return x; }
  static __device__ __forceinline__ void store2(S* p, float a, float b) {
    *reinterpret_cast<float2*>(p) = make_float2(a, b);
  }
};

// ---------------------------------------------------------------------------------------
// Warp tile products. Fragment layouts are the PTX ISA's for mma.m16n8k16 (16-bit) and
// mma.m16n8k8 (tf32); g = lane / 4, t = lane % 4. Accumulator c[0..1]: row g, columns
// 2t, 2t+1; c[2..3]: row g + 8.
//
// Loaders read an operand tile from shared memory at (r0/n0, k0):
//   load_a:   A[m][k] = s[m·ld + k]      load_a_t:  A[m][k] = s[k·ld + m]
//   load_b2:  B[k][n] = s[n·ld + k]      load_b2_t: B[k][n] = s[k·ld + n]
// (load_b2 and load_b2_t give the fragments of columns n0.. and n0 + 8...)

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}
// Four 8×8 matrices of 16-bit elements: lanes 8i..8i+7 give the row addresses of matrix i;
// register i gets lane l's fragment of matrix i: row l/4, columns 2(l%4) and 2(l%4)+1, or with
// .trans, rows 2(l%4), 2(l%4)+1 of column l/4.
__device__ __forceinline__ void ldsm_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3,
                                        const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(smem_addr(p))
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3,
                                          const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(smem_addr(p))
               : "memory");
}

// 16-bit operands through ldmatrix (rows 16 bytes aligned: the row strides are multiples of
// 8 elements). Lane l addresses row l % 8 of matrix l / 8.
template <typename T> struct Mma16 {
  static constexpr int K = 16;
  struct A { uint32_t r[4]; };
  struct B { uint32_t r[2]; };
  typedef unsigned short S;
  // Matrices (rows, cols): (r0, k0), (r0+8, k0), (r0, k0+8), (r0+8, k0+8).
  static __device__ __forceinline__ void load_a(const S* s, int ld, int r0, int k0, A& a) {
    const int lane = threadIdx.x & 31, mi = lane >> 3, r = lane & 7;
    ldsm_x4(a.r[0], a.r[1], a.r[2], a.r[3], s + (r0 + r + (mi & 1) * 8) * ld + k0 + (mi >> 1) * 8);
  }
  // Stored (k, m): matrices (k0, m0), (k0, m0+8), (k0+8, m0), (k0+8, m0+8), transposed.
  static __device__ __forceinline__ void load_a_t(const S* s, int ld, int r0, int k0, A& a) {
    const int lane = threadIdx.x & 31, mi = lane >> 3, r = lane & 7;
    ldsm_x4_t(a.r[0], a.r[1], a.r[2], a.r[3], s + (k0 + r + (mi >> 1) * 8) * ld + r0 + (mi & 1) * 8);
  }
  // Two fragments, columns n0.. and n0+8..; stored (n, k): matrices (n0, k0), (n0, k0+8),
  // (n0+8, k0), (n0+8, k0+8).
  static __device__ __forceinline__ void load_b2(const S* s, int ld, int n0, int k0, B& b0, B& b1) {
    const int lane = threadIdx.x & 31, mi = lane >> 3, r = lane & 7;
    ldsm_x4(b0.r[0], b0.r[1], b1.r[0], b1.r[1], s + (n0 + r + (mi >> 1) * 8) * ld + k0 + (mi & 1) * 8);
  }
  // Stored (k, n): matrices (k0, n0), (k0+8, n0), (k0, n0+8), (k0+8, n0+8), transposed.
  static __device__ __forceinline__ void load_b2_t(const S* s, int ld, int n0, int k0, B& b0, B& b1) {
    const int lane = threadIdx.x & 31, mi = lane >> 3, r = lane & 7;
    ldsm_x4_t(b0.r[0], b0.r[1], b1.r[0], b1.r[1], s + (k0 + r + (mi & 1) * 8) * ld + n0 + (mi >> 1) * 8);
  }
  static __device__ __forceinline__ void mma(float* c, const A& a, const B& b);
};

template <>
__device__ __forceinline__ void Mma16<__nv_bfloat16>::mma(float* c, const A& a, const B& b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
}
template <>
__device__ __forceinline__ void Mma16<__half>::mma(float* c, const A& a, const B& b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
}

__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

// f32 as two tf32 halves: x ≈ big + small, each product as big·big + big·small + small·big.
struct MmaF32 {
  static constexpr int K = 8;
  struct A { uint32_t big[4], small[4]; };
  struct B { uint32_t big[2], small[2]; };
  typedef float S;
  static __device__ __forceinline__ void split(float x, uint32_t& big, uint32_t& small) {
    big = to_tf32(x);
    small = to_tf32(x - __uint_as_float(big));
  }
  static __device__ __forceinline__ void set_a(A& a, float x0, float x1, float x2, float x3) {
    split(x0, a.big[0], a.small[0]);
    split(x1, a.big[1], a.small[1]);
    split(x2, a.big[2], a.small[2]);
    split(x3, a.big[3], a.small[3]);
  }
  static __device__ __forceinline__ void load_a(const S* s, int ld, int r0, int k0, A& a) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    set_a(a, s[(r0 + g) * ld + k0 + t], s[(r0 + g + 8) * ld + k0 + t],
          s[(r0 + g) * ld + k0 + t + 4], s[(r0 + g + 8) * ld + k0 + t + 4]);
  }
  static __device__ __forceinline__ void load_a_t(const S* s, int ld, int r0, int k0, A& a) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    set_a(a, s[(k0 + t) * ld + r0 + g], s[(k0 + t) * ld + r0 + g + 8],
          s[(k0 + t + 4) * ld + r0 + g], s[(k0 + t + 4) * ld + r0 + g + 8]);
  }
  static __device__ __forceinline__ void load_b(const S* s, int ld, int n0, int k0, B& b) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    split(s[(n0 + g) * ld + k0 + t], b.big[0], b.small[0]);
    split(s[(n0 + g) * ld + k0 + t + 4], b.big[1], b.small[1]);
  }
  static __device__ __forceinline__ void load_b_t(const S* s, int ld, int n0, int k0, B& b) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    split(s[(k0 + t) * ld + n0 + g], b.big[0], b.small[0]);
    split(s[(k0 + t + 4) * ld + n0 + g], b.big[1], b.small[1]);
  }
  static __device__ __forceinline__ void load_b2(const S* s, int ld, int n0, int k0, B& b0, B& b1) {
    load_b(s, ld, n0, k0, b0);
    load_b(s, ld, n0 + 8, k0, b1);
  }
  static __device__ __forceinline__ void load_b2_t(const S* s, int ld, int n0, int k0, B& b0, B& b1) {
    load_b_t(s, ld, n0, k0, b0);
    load_b_t(s, ld, n0 + 8, k0, b1);
  }
  static __device__ __forceinline__ void mma1(float* c, const uint32_t* a, const uint32_t* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
  static __device__ __forceinline__ void mma(float* c, const A& a, const B& b) {
    mma1(c, a.small, b.big);
    mma1(c, a.big, b.small);
    mma1(c, a.big, b.big);
  }
};

template <typename T> struct MmaOf { typedef Mma16<T> M; };
template <> struct MmaOf<float> { typedef MmaF32 M; };

// Shared-memory row padding (elements): rows 16 bytes longer, so that the fragment loads of
// the eight row groups of a warp fall in different banks.
template <typename T> struct Pad { static constexpr int V = 8; };
template <> struct Pad<float> { static constexpr int V = 4; };

// ---------------------------------------------------------------------------------------
// Helpers.

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ u64 splitmix64(u64 x) {
  u64 z = x + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The factor of weight (b, h, i, j) under dropout: DropoutMask::keep of the CPU side.
__device__ __forceinline__ float drop_factor(const Params& p, int bh, int i, int j) {
  u64 idx = ((u64)bh * (u64)p.l + (u64)i) * (u64)p.s + (u64)j;
  u64 z = p.drop_key + (idx + p.drop_offset) * 0x9e3779b97f4a7c15ULL;
  return (splitmix64(z) >> 11) >= p.drop_threshold ? p.drop_scale : 0.f;
}

// The score of query i and key j in the base-2 domain: x (already scale·log2e·q·k) with the
// masks added, or -inf where the key is masked or out of range.
__device__ __forceinline__ float masked_score(const Params& p, int b, int h, int i, int j, float x) {
  if (j >= p.s || i >= p.l) return NEG_INF;
  if (j < p.s_masked) {
    if (p.causal && (i64)j > (i64)i + p.causal_offset) return NEG_INF;
    if (p.attn) {
      const float* m = reinterpret_cast<const float*>(p.attn);
      x += LOG2E * m[(i64)(b * p.h + h) * p.attn_bh_stride + (i64)i * p.s_masked + j];
    }
    if (p.kpm) {
      const float* m = reinterpret_cast<const float*>(p.kpm);
      x += LOG2E * m[(i64)b * p.s_masked + j];
    }
  }
  return x;
}

// Whether keys [j0, j0 + cols) are all in range and no mask or causal rule reaches them for
// queries from i0 on: their scores need the scale only.
__device__ __forceinline__ bool unmasked_tile(const Params& p, int i0, int j0, int cols) {
  return !p.attn && !p.kpm && j0 + cols <= p.s &&
         (!p.causal || (i64)(j0 + cols - 1) <= (i64)i0 + p.causal_offset);
}

// Rows [r0, r0 + rows) of head (b, h) of `src` into `dst` (rows × DP, row stride LD): rows at
// or past `valid` and columns at or past d are zero. With `vec`, 16-byte loads (the host
// checked the alignment of every row and that d is a multiple of the vector).
template <typename T, int DP, int LD>
__device__ __forceinline__ void load_rows(typename Ty<T>::S* dst, const T* src, const RowMap& m,
                                          int b, int h, int r0, int rows, int valid, int d,
                                          bool vec) {
  typedef typename Ty<T>::S S;
  if (vec) {
    constexpr int VW = 16 / sizeof(T);
    constexpr int CH = DP / VW;
    for (int idx = threadIdx.x; idx < rows * CH; idx += blockDim.x) {
      const int r = idx / CH, c = (idx % CH) * VW;
      uint4 val = make_uint4(0, 0, 0, 0);
      if (r < valid && c < d) val = *reinterpret_cast<const uint4*>(src + m.at(b, h, r0 + r) + c);
      *reinterpret_cast<uint4*>(dst + r * LD + c) = val;
    }
  } else {
    for (int idx = threadIdx.x; idx < rows * DP; idx += blockDim.x) {
      const int r = idx / DP, c = idx % DP;
      S val = Ty<T>::bits(0.f);
      if (r < valid && c < d) {
        const T x = src[m.at(b, h, r0 + r) + c];
        val = *reinterpret_cast<const S*>(&x);
      }
      dst[r * LD + c] = val;
    }
  }
}

// ---------------------------------------------------------------------------------------
// Forward.

// Warps (16 query rows each) and key columns per forward tile; f32 tiles are twice the bytes.
template <typename T> struct FwdTile { static constexpr int NW = 8, BC = 64; };
template <> struct FwdTile<float> { static constexpr int NW = 4, BC = 32; };

template <typename T, int DP>
__device__ __forceinline__ void fwd_impl(const Params& p) {
  typedef typename MmaOf<T>::M M;
  typedef typename Ty<T>::S S;
  constexpr int BR = 16 * FwdTile<T>::NW, BC = FwdTile<T>::BC;
  constexpr int LD = DP + Pad<T>::V, LDP = BC + Pad<T>::V;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  S* Qs = reinterpret_cast<S*>(smem_raw);
  S* Ks = Qs + BR * LD;
  S* Vs = Ks + BC * LD;
  S* Ps = Vs + BC * LD;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int tiles = (p.l + BR - 1) / BR;
  const int bh = blockIdx.x / tiles, i0 = (blockIdx.x % tiles) * BR;
  const int b = bh / p.h, h = bh % p.h;
  const T* q = reinterpret_cast<const T*>(p.q);
  const T* k = reinterpret_cast<const T*>(p.k);
  const T* v = reinterpret_cast<const T*>(p.v);

  load_rows<T, DP, LD>(Qs, q, p.mq, b, h, i0, BR, min(BR, p.l - i0), p.d, p.vec);

  float o[DP / 8][4];
#pragma unroll
  for (int nt = 0; nt < DP / 8; nt++) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;
  float mrow[2] = {NEG_INF, NEG_INF}, lrow[2] = {0.f, 0.f};
  const int rw = warp * 16;
  const int row_a = i0 + rw + g;
  const int i_last = min(i0 + BR, p.l) - 1;

  for (int j0 = 0; j0 < p.s; j0 += BC) {
    // A tile of masked keys that the causal rule hides from every query of the block.
    if (p.causal && (i64)j0 > (i64)i_last + p.causal_offset && j0 + BC <= p.s_masked) continue;
    __syncthreads();
    load_rows<T, DP, LD>(Ks, k, p.mk, b, h, j0, BC, min(BC, p.s - j0), p.d, p.vec);
    load_rows<T, DP, LD>(Vs, v, p.mv, b, h, j0, BC, min(BC, p.s - j0), p.d, p.vec);
    __syncthreads();

    float sc[BC / 8][4];
#pragma unroll
    for (int nt = 0; nt < BC / 8; nt++) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < DP; kk += M::K) {
      typename M::A a;
      M::load_a(Qs, LD, rw, kk, a);
#pragma unroll
      for (int nt = 0; nt < BC / 8; nt += 2) {
        typename M::B b0, b1;
        M::load_b2(Ks, LD, nt * 8, kk, b0, b1);
        M::mma(sc[nt], a, b0);
        M::mma(sc[nt + 1], a, b1);
      }
    }
    const bool clean = unmasked_tile(p, i0, j0, BC);
#pragma unroll
    for (int nt = 0; nt < BC / 8; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int i = row_a + (e >= 2 ? 8 : 0), j = j0 + nt * 8 + 2 * t + (e & 1);
        const float x = sc[nt][e] * p.scale_log2;
        sc[nt][e] = clean ? x : masked_score(p, b, h, i, j, x);
      }
    // Online softmax, row g (elements 0, 1) and row g + 8 (elements 2, 3); a row's values are
    // spread over the four lanes of a quad.
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
      float mx = NEG_INF;
#pragma unroll
      for (int nt = 0; nt < BC / 8; nt++) mx = fmaxf(mx, fmaxf(sc[nt][2 * rr], sc[nt][2 * rr + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
      const float m_new = fmaxf(mrow[rr], mx);
      // Every key so far masked: exponents against 0 give exact zeros, not NaN.
      const float m_use = m_new == NEG_INF ? 0.f : m_new;
      const float alpha = ex2(mrow[rr] - m_use);
      mrow[rr] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < BC / 8; nt++) {
        sc[nt][2 * rr] = ex2(sc[nt][2 * rr] - m_use);
        sc[nt][2 * rr + 1] = ex2(sc[nt][2 * rr + 1] - m_use);
        sum += sc[nt][2 * rr] + sc[nt][2 * rr + 1];
      }
      sum += __shfl_xor_sync(0xffffffff, sum, 1);
      sum += __shfl_xor_sync(0xffffffff, sum, 2);
      lrow[rr] = lrow[rr] * alpha + sum;
#pragma unroll
      for (int nt = 0; nt < DP / 8; nt++) {
        o[nt][2 * rr] *= alpha;
        o[nt][2 * rr + 1] *= alpha;
      }
    }
    // The probabilities (dropped after the row sums, as on the CPU) into this warp's rows.
#pragma unroll
    for (int nt = 0; nt < BC / 8; nt++) {
      if (p.dropout) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int i = row_a + (e >= 2 ? 8 : 0), j = j0 + nt * 8 + 2 * t + (e & 1);
          sc[nt][e] = (i < p.l && j < p.s) ? sc[nt][e] * drop_factor(p, bh, i, j) : 0.f;
        }
      }
      const int c = nt * 8 + 2 * t;
      Ty<T>::store2(Ps + (rw + g) * LDP + c, sc[nt][0], sc[nt][1]);
      Ty<T>::store2(Ps + (rw + g + 8) * LDP + c, sc[nt][2], sc[nt][3]);
    }
    __syncwarp();
#pragma unroll
    for (int kk = 0; kk < BC; kk += M::K) {
      typename M::A a;
      M::load_a(Ps, LDP, rw, kk, a);
#pragma unroll
      for (int nt = 0; nt < DP / 8; nt += 2) {
        typename M::B b0, b1;
        M::load_b2_t(Vs, LD, nt * 8, kk, b0, b1);
        M::mma(o[nt], a, b0);
        M::mma(o[nt + 1], a, b1);
      }
    }
    __syncwarp();
  }

  T* out = reinterpret_cast<T*>(p.o);
  float* lse = reinterpret_cast<float*>(p.lse);
#pragma unroll
  for (int rr = 0; rr < 2; rr++) {
    const int i = row_a + 8 * rr;
    if (i >= p.l) continue;
    const float inv = lrow[rr] > 0.f ? 1.f / lrow[rr] : 0.f;
    T* orow = out + p.mo.at(b, h, i);
#pragma unroll
    for (int nt = 0; nt < DP / 8; nt++)
#pragma unroll
      for (int c = 0; c < 2; c++) {
        const int col = nt * 8 + 2 * t + c;
        if (col < p.d) orow[col] = Ty<T>::from_f(o[nt][2 * rr + c] * inv);
      }
    if (t == 0)
      lse[(i64)bh * p.l + i] = lrow[rr] > 0.f ? (mrow[rr] + __log2f(lrow[rr])) * LN2 : POS_INF;
  }
}

// ---------------------------------------------------------------------------------------
// Backward.

// D_i = Σ_c dO_ic·O_ic per row (b, h, i): one warp per row.
template <typename T>
__device__ __forceinline__ void bwd_pre_impl(const Params& p) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
  if (warp >= p.n * p.h * p.l) return;
  const int bh = warp / p.l, i = warp % p.l, b = bh / p.h, h = bh % p.h;
  const T* o = reinterpret_cast<const T*>(p.o) + p.mo.at(b, h, i);
  const T* d = reinterpret_cast<const T*>(p.dout) + p.mdo.at(b, h, i);
  float acc = 0.f;
  for (int c = lane; c < p.d; c += 32) acc += Ty<T>::to_f(o[c]) * Ty<T>::to_f(d[c]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, off);
  if (lane == 0) reinterpret_cast<float*>(p.dsum)[warp] = acc;
}

// dq (in its layout, the input dtype) from the f32 accumulator.
template <typename T>
__device__ __forceinline__ void bwd_dq_impl(const Params& p) {
  const i64 total = (i64)p.n * p.h * p.l * p.d;
  const float* acc = reinterpret_cast<const float*>(p.dq_acc);
  T* dq = reinterpret_cast<T*>(p.dq);
  for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += (i64)gridDim.x * blockDim.x) {
    const int c = idx % p.d;
    const i64 row = idx / p.d;
    const int i = row % p.l, bh = row / p.l;
    dq[p.mdq.at(bh / p.h, bh % p.h, i) + c] = Ty<T>::from_f(acc[idx]);
  }
}

// Warps (16 key rows each) and query rows per backward tile.
template <typename T, int DP> struct BwdTile {
  static constexpr int NW = 8, BR = DP >= 128 ? 32 : 64;
};
template <int DP> struct BwdTile<float, DP> {
  static constexpr int NW = 4, BR = DP >= 128 ? 32 : 64;
};

template <typename T, int DP>
__device__ __forceinline__ void bwd_impl(const Params& p) {
  typedef typename MmaOf<T>::M M;
  typedef typename Ty<T>::S S;
  constexpr int NW = BwdTile<T, DP>::NW, BC = 16 * NW, BR = BwdTile<T, DP>::BR;
  constexpr int LD = DP + Pad<T>::V, LDT = BR + Pad<T>::V;
  // The dQ tile (BR × DP) split among the warps: RB blocks of 16 rows × CB blocks of columns.
  constexpr int RB = BR / 16, CB = NW / RB, DC = DP / CB;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  S* Ks = reinterpret_cast<S*>(smem_raw);
  S* Vs = Ks + BC * LD;
  S* Qs = Vs + BC * LD;
  S* dOs = Qs + BR * LD;
  S* Pt = dOs + BR * LD;  // P̃ᵀ (keys × queries)
  S* dSt = Pt + BC * LDT;  // dSᵀ
  float* lse_s = reinterpret_cast<float*>(dSt + BC * LDT);
  float* dsum_s = lse_s + BR;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int tiles = (p.s + BC - 1) / BC;
  const int bh = blockIdx.x / tiles, j0 = (blockIdx.x % tiles) * BC;
  const int b = bh / p.h, h = bh % p.h;
  const T* q = reinterpret_cast<const T*>(p.q);
  const T* k = reinterpret_cast<const T*>(p.k);
  const T* v = reinterpret_cast<const T*>(p.v);
  const T* dout = reinterpret_cast<const T*>(p.dout);
  const float* lse = reinterpret_cast<const float*>(p.lse);
  const float* dsum = reinterpret_cast<const float*>(p.dsum);
  float* dq_acc = reinterpret_cast<float*>(p.dq_acc);

  load_rows<T, DP, LD>(Ks, k, p.mk, b, h, j0, BC, min(BC, p.s - j0), p.d, p.vec);
  load_rows<T, DP, LD>(Vs, v, p.mv, b, h, j0, BC, min(BC, p.s - j0), p.d, p.vec);

  float dk[DP / 8][4], dv[DP / 8][4];
#pragma unroll
  for (int nt = 0; nt < DP / 8; nt++)
#pragma unroll
    for (int e = 0; e < 4; e++) dk[nt][e] = dv[nt][e] = 0.f;
  const int kw = warp * 16;
  const int key_a = j0 + kw + g;

  // Queries before j0 - causal_offset see no key of a tile inside the masked range.
  int i_begin = 0;
  if (p.causal && j0 + BC <= p.s_masked) {
    const i64 first = (i64)j0 - p.causal_offset;
    if (first > 0) i_begin = (int)(min(first, (i64)p.l) / BR) * BR;
  }
  for (int i0 = i_begin; i0 < p.l; i0 += BR) {
    __syncthreads();
    load_rows<T, DP, LD>(Qs, q, p.mq, b, h, i0, BR, min(BR, p.l - i0), p.d, p.vec);
    load_rows<T, DP, LD>(dOs, dout, p.mdo, b, h, i0, BR, min(BR, p.l - i0), p.d, p.vec);
    for (int r = threadIdx.x; r < BR; r += blockDim.x) {
      const int i = i0 + r;
      lse_s[r] = i < p.l ? lse[(i64)bh * p.l + i] * LOG2E : POS_INF;
      dsum_s[r] = i < p.l ? dsum[(i64)bh * p.l + i] : 0.f;
    }
    __syncthreads();

    // Sᵀ = K_w·Qᵀ and dP̃ᵀ = V_w·dOᵀ for this warp's 16 keys.
    float st[BR / 8][4], dpt[BR / 8][4];
#pragma unroll
    for (int nt = 0; nt < BR / 8; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) st[nt][e] = dpt[nt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < DP; kk += M::K) {
      typename M::A a, a2;
      M::load_a(Ks, LD, kw, kk, a);
      M::load_a(Vs, LD, kw, kk, a2);
#pragma unroll
      for (int nt = 0; nt < BR / 8; nt += 2) {
        typename M::B b0, b1;
        M::load_b2(Qs, LD, nt * 8, kk, b0, b1);
        M::mma(st[nt], a, b0);
        M::mma(st[nt + 1], a, b1);
        M::load_b2(dOs, LD, nt * 8, kk, b0, b1);
        M::mma(dpt[nt], a2, b0);
        M::mma(dpt[nt + 1], a2, b1);
      }
    }
    // P = exp(s - lse); P̃ = P·z; dS = P ∘ (dP̃·z − D). Rows past L have lse = +inf: P = 0.
    const bool clean = unmasked_tile(p, i0, j0, BC);
#pragma unroll
    for (int nt = 0; nt < BR / 8; nt++)
#pragma unroll
      for (int half = 0; half < 2; half++) {
        const int key = key_a + 8 * half, c = nt * 8 + 2 * t;
        float pd[2], ds[2];
#pragma unroll
        for (int q2 = 0; q2 < 2; q2++) {
          const int e = 2 * half + q2, il = c + q2, i = i0 + il;
          float x = st[nt][e] * p.scale_log2;
          if (!clean) x = masked_score(p, b, h, i, key, x);
          const float pr = ex2(x - lse_s[il]);
          float z = 1.f;
          if (p.dropout) z = (i < p.l && key < p.s) ? drop_factor(p, bh, i, key) : 0.f;
          pd[q2] = pr * z;
          ds[q2] = pr * (dpt[nt][e] * z - dsum_s[il]);
        }
        Ty<T>::store2(Pt + (kw + g + 8 * half) * LDT + c, pd[0], pd[1]);
        Ty<T>::store2(dSt + (kw + g + 8 * half) * LDT + c, ds[0], ds[1]);
      }
    __syncwarp();
    // dV_w += P̃ᵀ·dO and dK_w += dSᵀ·Q (scaled at the end).
#pragma unroll
    for (int kk = 0; kk < BR; kk += M::K) {
      typename M::A a, a2;
      M::load_a(Pt, LDT, kw, kk, a);
      M::load_a(dSt, LDT, kw, kk, a2);
#pragma unroll
      for (int nt = 0; nt < DP / 8; nt += 2) {
        typename M::B b0, b1;
        M::load_b2_t(dOs, LD, nt * 8, kk, b0, b1);
        M::mma(dv[nt], a, b0);
        M::mma(dv[nt + 1], a, b1);
        M::load_b2_t(Qs, LD, nt * 8, kk, b0, b1);
        M::mma(dk[nt], a2, b0);
        M::mma(dk[nt + 1], a2, b1);
      }
    }
    __syncthreads();
    // dQ += scale·dS·K over this block's keys, added into the f32 accumulator.
    {
      const int qr = (warp % RB) * 16, dc0 = (warp / RB) * DC;
      float dqa[DC / 8][4];
#pragma unroll
      for (int nt = 0; nt < DC / 8; nt++) dqa[nt][0] = dqa[nt][1] = dqa[nt][2] = dqa[nt][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < BC; kk += M::K) {
        typename M::A a;
        M::load_a_t(dSt, LDT, qr, kk, a);
#pragma unroll
        for (int nt = 0; nt < DC / 8; nt += 2) {
          typename M::B b0, b1;
          M::load_b2_t(Ks, LD, dc0 + nt * 8, kk, b0, b1);
          M::mma(dqa[nt], a, b0);
          M::mma(dqa[nt + 1], a, b1);
        }
      }
#pragma unroll
      for (int nt = 0; nt < DC / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int i = i0 + qr + g + (e >= 2 ? 8 : 0), col = dc0 + nt * 8 + 2 * t + (e & 1);
          if (i < p.l && col < p.d) atomicAdd(dq_acc + ((i64)bh * p.l + i) * p.d + col, dqa[nt][e] * p.scale);
        }
    }
  }

  T* dk_out = reinterpret_cast<T*>(p.dk);
  T* dv_out = reinterpret_cast<T*>(p.dv);
#pragma unroll
  for (int rr = 0; rr < 2; rr++) {
    const int key = key_a + 8 * rr;
    if (key >= p.s) continue;
    T* dkr = dk_out + p.mdk.at(b, h, key);
    T* dvr = dv_out + p.mdv.at(b, h, key);
#pragma unroll
    for (int nt = 0; nt < DP / 8; nt++)
#pragma unroll
      for (int c = 0; c < 2; c++) {
        const int col = nt * 8 + 2 * t + c;
        if (col < p.d) {
          dkr[col] = Ty<T>::from_f(dk[nt][2 * rr + c] * p.scale);
          dvr[col] = Ty<T>::from_f(dv[nt][2 * rr + c]);
        }
      }
  }
}

// ---------------------------------------------------------------------------------------
// Entry points: fa_fwd_<dtype>_<DP>, fa_bwd_<dtype>_<DP>, fa_bwd_pre_<dtype>, fa_bwd_dq_<dtype>.

#define FA_KERNELS(NAME, T)                                                                \
  extern "C" __global__ void __launch_bounds__(32 * FwdTile<T>::NW)                         \
      fa_fwd_##NAME##_32(const Params p) { fwd_impl<T, 32>(p); }                            \
  extern "C" __global__ void __launch_bounds__(32 * FwdTile<T>::NW)                         \
      fa_fwd_##NAME##_64(const Params p) { fwd_impl<T, 64>(p); }                            \
  extern "C" __global__ void __launch_bounds__(32 * FwdTile<T>::NW)                         \
      fa_fwd_##NAME##_128(const Params p) { fwd_impl<T, 128>(p); }                          \
  extern "C" __global__ void __launch_bounds__(32 * BwdTile<T, 32>::NW)                     \
      fa_bwd_##NAME##_32(const Params p) { bwd_impl<T, 32>(p); }                            \
  extern "C" __global__ void __launch_bounds__(32 * BwdTile<T, 64>::NW)                     \
      fa_bwd_##NAME##_64(const Params p) { bwd_impl<T, 64>(p); }                            \
  extern "C" __global__ void __launch_bounds__(32 * BwdTile<T, 128>::NW)                    \
      fa_bwd_##NAME##_128(const Params p) { bwd_impl<T, 128>(p); }                          \
  extern "C" __global__ void fa_bwd_pre_##NAME(const Params p) { bwd_pre_impl<T>(p); }      \
  extern "C" __global__ void fa_bwd_dq_##NAME(const Params p) { bwd_dq_impl<T>(p); }

FA_KERNELS(bf16, __nv_bfloat16)
FA_KERNELS(f16, __half)
FA_KERNELS(f32, float)
