// The operator longspec::attention (loop_attention below: attention whose every row is what its
// token gets alone), and the decoder layers of a bfloat16 CPU model with int4 weights
// (transformer.py's Block with that operator and linear.py's products) as the same calls in the
// same order, made from C++: bitwise the Python layers' output without their per-call overhead
// (tests/test_native.py). The RMS norms and RoPE are plain loops doing each element's float
// operations as ATen's kernels round them, the norm's one reduction (its sum) left to ATen.
// compiled.py builds this file (without contracting a * b + c into one rounding) and native.py
// says when it is used; a change to Block.forward is made here too.

#include <torch/extension.h>

#include <ATen/Parallel.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif


#include <cmath>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

using at::Tensor;
using namespace at::indexing;

namespace {

constexpr int64_t CHUNK = 256;    // cache/base.py's CHUNK
constexpr int64_t MAX_ROWS = 32;  // linear.py's MAX_ROWS

// Int4Linear.forward (with scale_zero; `size` its group) or DenseLinear.forward (without;
// `size` its min_rows) for bfloat16 activations. Int4Linear's operands say its kernel:
// longspec::int4_mm's scales are float16 or float32, ATen's bfloat16.
Tensor linear(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& scale_zero,
              int64_t size, bool doubled, const std::optional<Tensor>& bias) {
  if (scale_zero) {
    if (scale_zero->scalar_type() != at::kBFloat16) {   // longspec::int4_mm's operands
      static const auto int4_mm = c10::Dispatcher::singleton()
          .findSchemaOrThrow("longspec::int4_mm", "")
          .typed<Tensor(const Tensor&, const Tensor&, const Tensor&)>();
      Tensor y = int4_mm.call(x, weight, *scale_zero);
      return bias ? y + *bias : y;
    }
    Tensor xin = doubled ? at::cat({x, x}, -1) : x;
    Tensor y = at::_weight_int4pack_mm_for_cpu(xin.contiguous(), weight, size, *scale_zero);
    return bias ? y + *bias : y;
  }
  int64_t rows = x.size(0);
  if (rows > MAX_ROWS) {
    std::vector<Tensor> parts;
    for (const Tensor& part : x.split(MAX_ROWS))
      parts.push_back(linear(part, weight, scale_zero, size, doubled, bias));
    return at::cat(parts);
  }
  if (rows >= size) return at::linear(x, weight, bias);
  Tensor padded = at::cat({x, x.new_zeros({size - rows, x.size(1)})});
  return at::linear(padded, weight, bias).index({Slice(None, rows)});
}

// torch.rms_norm of bfloat16 rows [..., d] (to float32, x * x, mean = sum / d, + eps, rsqrt,
// * rstd, * weight, to bfloat16) with one framework call, the sum; every other step is one
// correctly rounded float operation per element, as ATen's kernels make it.
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  int64_t d = x.size(-1);
  Tensor rows = x.contiguous().view({-1, d});
  int64_t n = rows.size(0);
  const at::BFloat16* px = rows.const_data_ptr<at::BFloat16>();
  const at::BFloat16* pw = weight.const_data_ptr<at::BFloat16>();
  Tensor squares = at::empty({n, d}, rows.options().dtype(at::kFloat));
  float* ps = squares.data_ptr<float>();
  for (int64_t i = 0; i < n * d; ++i) {
    float v = static_cast<float>(px[i]);
    ps[i] = v * v;
  }
  Tensor sums = squares.sum(-1);
  const float* psum = sums.const_data_ptr<float>();
  Tensor out = at::empty_like(rows);
  at::BFloat16* po = out.data_ptr<at::BFloat16>();
  float epsf = static_cast<float>(eps), df = static_cast<float>(d);
  for (int64_t r = 0; r < n; ++r) {
    float rstd = 1.0f / std::sqrt(psum[r] / df + epsf);
    for (int64_t j = 0; j < d; ++j) {
      float v = static_cast<float>(px[r * d + j]) * rstd;
      po[r * d + j] = static_cast<at::BFloat16>(v * static_cast<float>(pw[j]));
    }
  }
  return out.view(x.sizes());
}

// rope.py's apply_rope, addcmul(x * cos, x.roll(d / 2, -1), sin), on bfloat16 x [q, h, d]
// (rows may be strided) and cos, sin [q, 1, d]: each product and sum as ATen rounds it.
Tensor apply_rope(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  int64_t q = x.size(0), h = x.size(1), d = x.size(2), half = d / 2;
  TORCH_CHECK(x.stride(2) == 1 && cos.is_contiguous() && sin.is_contiguous(),
              "apply_rope: unexpected layout");
  Tensor out = at::empty({q, h, d}, x.options());
  const at::BFloat16* px = x.const_data_ptr<at::BFloat16>();
  const at::BFloat16* pc = cos.const_data_ptr<at::BFloat16>();
  const at::BFloat16* pn = sin.const_data_ptr<at::BFloat16>();
  at::BFloat16* po = out.data_ptr<at::BFloat16>();
  for (int64_t t = 0; t < q; ++t) {
    for (int64_t i = 0; i < h; ++i) {
      const at::BFloat16* row = px + t * x.stride(0) + i * x.stride(1);
      at::BFloat16* dst = po + (t * h + i) * d;
      for (int64_t j = 0; j < d; ++j) {
        float c = static_cast<float>(pc[t * d + j]), s = static_cast<float>(pn[t * d + j]);
        at::BFloat16 rotated = static_cast<at::BFloat16>(static_cast<float>(row[j]) * c);
        float partner = static_cast<float>(row[(j + half) % d]);
        dst[j] = static_cast<at::BFloat16>(static_cast<float>(rotated) + partner * s);
      }
    }
  }
  return out;
}

// The sum of the partials [kv, chunks, rows, d] (float32) over the chunks by attention.py's
// pairwise tree (pairwise_sum: the same float additions in the same pairs, zero partials
// included), then to bfloat16 in the layout [q_len, heads * d] (rows are group x q_len).
Tensor combine(const Tensor& partials, int64_t q_len) {
  int64_t kv_heads = partials.size(0), chunks = partials.size(1), rows = partials.size(2);
  int64_t d = partials.size(3), group = rows / q_len;
  int64_t size = 1;
  while (size < chunks) size <<= 1;
  Tensor src = partials.contiguous();
  const float* pp = src.const_data_ptr<float>();
  Tensor out = at::empty({q_len, kv_heads * group * d}, partials.options().dtype(at::kBFloat16));
  at::BFloat16* po = out.data_ptr<at::BFloat16>();
  // a (head, row) at a time, all d columns of each step together
  at::parallel_for(0, kv_heads * rows, 1, [&](int64_t first, int64_t last) {
    std::vector<float> sums(size * d);
    for (int64_t unit = first; unit < last; ++unit) {
      int64_t h = unit / rows, r = unit % rows, g = r / q_len, t = r % q_len;
      for (int64_t c = 0; c < size; ++c)
        for (int64_t j = 0; j < d; ++j)
          sums[c * d + j] = c < chunks ? pp[((h * chunks + c) * rows + r) * d + j] : 0.0f;
      for (int64_t width = size; width > 1; width /= 2)
        for (int64_t c = 0; c < width / 2; ++c)
          for (int64_t j = 0; j < d; ++j)
            sums[c * d + j] = sums[2 * c * d + j] + sums[(2 * c + 1) * d + j];
      at::BFloat16* dst = po + t * kv_heads * group * d + (h * group + g) * d;
      for (int64_t j = 0; j < d; ++j) dst[j] = static_cast<at::BFloat16>(sums[j]);
    }
  });
  return out;
}


// Attention of a decoding block (a chain or a draft tree) as loops, each query row alone: a
// row's scores, probabilities and output depend on its own query and keys only, never on the
// block around it, so a tree node gets bitwise what its token gets run alone after its
// ancestors. Row (t, head) reads its logical keys in order: slots [0, start), its block slots
// in `order` (ancestors first, by depth; the mask added), then slots [start + q_len, n).
// Scores: q.k in float32, each of 16 lanes summing every 16th product in turn by fused
// multiply-adds (one rounding each), the lanes then pairwise, times scale. The softmax is ATen's
// over rows padded with -inf to whole chunks; the output sums p * v in float32 by fused
// multiply-adds over each CHUNK of logical columns in order, skipping p == 0, and the chunks'
// partials pairwise (combine). Every fused multiply-add is written out (Lanes' fma), never left
// to the compiler, so the loops give the same bits on every instruction set they are built for.
// A build for AVX-512 with bfloat16 dot products (__AVX512BF16__) is another arithmetic, 1.4-1.5x
// faster from 2K positions: queries stay bfloat16 and each lane sums pairs of products by that
// instruction; the probabilities are rounded to bfloat16 and summed with the values two keys at
// a time (sum_products, accumulate_keys below).
// Heads, key tiles and chunks run in parallel. Loops, not two small bfloat16 products through
// oneDNN, which cost ~25 us each a layer whatever their size.
constexpr int64_t LANES = 16;
typedef float eight_t __attribute__((vector_size(8 * sizeof(float))));

// 16 float lanes and the loops' operations on them, each lane's value the same on every
// instruction set: one AVX-512 register, two AVX2 ones, or plain floats (std::fma: one
// instruction on CPUs with fused multiply-adds, a slow library call on x86 CPUs older than AVX2).
#if defined(__AVX512F__) && defined(__AVX512DQ__)
struct Lanes {
  __m512 v;
};
inline Lanes zero() { return {_mm512_setzero_ps()}; }
inline Lanes broadcast(float x) { return {_mm512_set1_ps(x)}; }
inline Lanes load_lanes(const float* p) { return {_mm512_loadu_ps(p)}; }
inline Lanes load_lanes(const at::BFloat16* p) {
  __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(wide, 16))};
}
inline void store_lanes(float* p, Lanes a) { _mm512_storeu_ps(p, a.v); }
inline Lanes fma(Lanes a, Lanes b, Lanes c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
// lanes l and l + 8 added
inline eight_t fold(Lanes a) {
  return (eight_t)_mm256_add_ps(_mm512_castps512_ps256(a.v), _mm512_extractf32x8_ps(a.v, 1));
}
#elif defined(__AVX2__) && defined(__FMA__)
struct Lanes {
  __m256 lo, hi;
};
inline Lanes zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline Lanes broadcast(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline Lanes load_lanes(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline __m256 widen(const at::BFloat16* p) {
  __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
inline Lanes load_lanes(const at::BFloat16* p) { return {widen(p), widen(p + 8)}; }
inline void store_lanes(float* p, Lanes a) {
  _mm256_storeu_ps(p, a.lo);
  _mm256_storeu_ps(p + 8, a.hi);
}
inline Lanes fma(Lanes a, Lanes b, Lanes c) {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
inline eight_t fold(Lanes a) { return (eight_t)_mm256_add_ps(a.lo, a.hi); }
#else
struct Lanes {
  float v[LANES];
};
inline Lanes broadcast(float x) {
  Lanes out;
  std::fill(out.v, out.v + LANES, x);
  return out;
}
inline Lanes zero() { return broadcast(0.0f); }
template <typename T>
inline Lanes load_lanes(const T* p) {
  Lanes out;
  for (int64_t l = 0; l < LANES; ++l) out.v[l] = static_cast<float>(p[l]);
  return out;
}
inline void store_lanes(float* p, Lanes a) { std::copy(a.v, a.v + LANES, p); }
inline Lanes fma(Lanes a, Lanes b, Lanes c) {
  for (int64_t l = 0; l < LANES; ++l) c.v[l] = std::fma(a.v[l], b.v[l], c.v[l]);
  return c;
}
inline eight_t fold(Lanes a) {
  eight_t out;
  for (int64_t l = 0; l < 8; ++l) out[l] = a.v[l] + a.v[l + 8];
  return out;
}
#endif

#if defined(__AVX512BF16__)
// Queries stay bfloat16: lane l of the scores' sums takes q[i] k[i] for the pairs i = 2l + 32m,
// 2l + 32m + 1 (m = 0, 1, ...) by one bfloat16 dot-product instruction per 32 (AVX-512 BF16: each
// exact product added with one rounding, subnormals flushed; the masked tail past d adds zeros):
// half the instructions of widening keys to float and a fused multiply-add per element.
// sum_products: acc[key * R + r] of R query rows and K keys (`stride` apart), d in order.
using Query = at::BFloat16;

template <int R, int K = 1>
[[gnu::always_inline]] inline void sum_products(const Query* q, int64_t d, const at::BFloat16* k,
                                                int64_t stride, Lanes* acc) {
  for (int64_t i = 0; i < d; i += 2 * LANES) {
    const __mmask32 in = d - i >= 2 * LANES ? ~0u : (1u << (d - i)) - 1;
    __m512bh rows[R];
    for (int r = 0; r < R; ++r) rows[r] = (__m512bh)_mm512_maskz_loadu_epi16(in, q + r * d + i);
    for (int key = 0; key < K; ++key) {
      const __m512bh keys = (__m512bh)_mm512_maskz_loadu_epi16(in, k + key * stride + i);
      for (int r = 0; r < R; ++r)
        acc[key * R + r].v = _mm512_dpbf16_ps(acc[key * R + r].v, rows[r], keys);
    }
  }
}
#else
// Queries as floats: lane l sums q[i] k[i] for i = l, l + 16, ... in turn by fused multiply-adds.
using Query = float;

template <int R, int K = 1>
[[gnu::always_inline]] inline void sum_products(const Query* q, int64_t d, const at::BFloat16* k,
                                                int64_t stride, Lanes* acc) {
  for (int64_t i = 0; i < d; i += LANES) {
    Lanes rows[R];
    for (int r = 0; r < R; ++r) rows[r] = load_lanes(q + r * d + i);
    for (int key = 0; key < K; ++key) {
      const Lanes keys = load_lanes(k + key * stride + i);
      for (int r = 0; r < R; ++r) acc[key * R + r] = fma(rows[r], keys, acc[key * R + r]);
    }
  }
}
#endif

// The dot products q_r . k (q rows of d, a multiple of LANES; k bfloat16) of R = 1 or 4 rows
// into out[r]: each lane's sum as sum_products makes it, then lanes l and l + 8 are added, then
// l and l + 4, l and l + 2, l and l + 1. Four rows at once give the same sums, their lanes packed
// into fewer vectors.
template <int R>
[[gnu::always_inline]] inline void dots(const Query* q, int64_t d, const at::BFloat16* k,
                                        float* out) {
  Lanes acc[R];
  for (int r = 0; r < R; ++r) acc[r] = zero();
  sum_products<R>(q, d, k, 0, acc);
  if constexpr (R == 1) {
    eight_t a = fold(acc[0]);
    a += __builtin_shufflevector(a, a, 4, 5, 6, 7, 0, 0, 0, 0);
    a += __builtin_shufflevector(a, a, 2, 3, 0, 0, 0, 0, 0, 0);
    a += __builtin_shufflevector(a, a, 1, 0, 0, 0, 0, 0, 0, 0);
    out[0] = a[0];
  } else {
    static_assert(R == 4, "dots: 1 or 4 rows");
    eight_t x[4];
    for (int r = 0; r < 4; ++r) x[r] = fold(acc[r]);
    // [rows 0, 1 | 4 lanes each], [rows 2, 3 | 4 lanes each]
    eight_t x01 = __builtin_shufflevector(x[0], x[1], 0, 1, 2, 3, 8, 9, 10, 11) +
                  __builtin_shufflevector(x[0], x[1], 4, 5, 6, 7, 12, 13, 14, 15);
    eight_t x23 = __builtin_shufflevector(x[2], x[3], 0, 1, 2, 3, 8, 9, 10, 11) +
                  __builtin_shufflevector(x[2], x[3], 4, 5, 6, 7, 12, 13, 14, 15);
    // [rows 0..3 | 2 lanes each], then 1
    eight_t z = __builtin_shufflevector(x01, x23, 0, 1, 4, 5, 8, 9, 12, 13) +
                __builtin_shufflevector(x01, x23, 2, 3, 6, 7, 10, 11, 14, 15);
    eight_t w = __builtin_shufflevector(z, z, 0, 2, 4, 6, 0, 0, 0, 0) +
                __builtin_shufflevector(z, z, 1, 3, 5, 7, 0, 0, 0, 0);
    for (int r = 0; r < 4; ++r) out[r] = w[r];
  }
}

inline float dot(const Query* q, const at::BFloat16* k, int64_t d) {
  float out;
  dots<1>(q, d, k, &out);
  return out;
}

// A float32 buffer of this shape, reused across calls while it stays under SCRATCH_FLOATS
// (a decoding step's scores: fresh allocations of this size cost page faults every call), or,
// for slot 0 (the scores, then the probabilities in place), under SCORE_FLOATS: a prefill
// chunk's scores (prefill.py's PREFILL_SCORE_BYTES and 3 rows), whose fresh pages cost 7-11%
// of a 2K-4K prefill's time; a thread that ran a long prompt keeps them.
// Every element that decides a result is written before it is read.
constexpr int64_t SCRATCH_FLOATS = 1 << 20;
constexpr int64_t SCORE_FLOATS = (256 << 20) / sizeof(float) + (1 << 20);

Tensor scratch(int slot, at::IntArrayRef shape, at::ScalarType type = at::kFloat) {
  thread_local std::vector<float> buffers[3];
  int64_t size = c10::multiply_integers(shape) * c10::elementSize(type) / sizeof(float);
  if (size > (slot == 0 ? SCORE_FLOATS : SCRATCH_FLOATS)) return at::empty(shape, type);
  std::vector<float>& buffer = buffers[slot];
  if (static_cast<int64_t>(buffer.size()) < size) buffer.resize(size);
  return at::from_blob(buffer.data(), shape, type);
}

// A head's keys or values: slot j at data + j * stride.
struct Slots {
  const at::BFloat16* data;
  int64_t stride;
};

// `count` (at most 4) rows of floats, `stride` apart.
template <typename T>
struct Rows {
  T* data;
  int64_t stride, count;
};

// The scores of keys [j0, j1) for out.count (at most R) query rows from q (rows d apart, 4 of
// them readable) into out, times scale; D: d known when compiled (0: not). R, 3 or 4, is the
// rows the AVX2 loops compute (the others compute 4 and keep out.count).
#if defined(__AVX512F__) && defined(__AVX512DQ__)
// The sums of 16 accumulators, those of 4 keys for 4 rows (key i's row r in acc[4i + r]), by
// dots' pairwise steps done for all of them at once: lanes l and l + 8 (for two at a time), then
// l and l + 4, l and l + 2, l and l + 1 (for four), into row r's 4 keys in lane group r.
inline __m512 fold_sixteen(const Lanes* acc) {
  __m512 s[8], u[4], r[2];
  for (int m = 0; m < 8; ++m)     // [2m: l + l+8 | 2m+1: l + l+8]
    s[m] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2 * m].v, acc[2 * m + 1].v, 0x44),
                         _mm512_shuffle_f32x4(acc[2 * m].v, acc[2 * m + 1].v, 0xEE));
  for (int m = 0; m < 4; ++m)     // lane group g: acc 4m + g, l + l+4
    u[m] = _mm512_add_ps(_mm512_shuffle_f32x4(s[2 * m], s[2 * m + 1], 0x88),
                         _mm512_shuffle_f32x4(s[2 * m], s[2 * m + 1], 0xDD));
  for (int m = 0; m < 2; ++m)     // group g: acc 8m + g's l + l+2, then acc 8m + 4 + g's
    r[m] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * m], u[2 * m + 1], 0x44),
                         _mm512_shuffle_ps(u[2 * m], u[2 * m + 1], 0xEE));
  // group g: the sums of acc g, 4 + g, 8 + g, 12 + g
  return _mm512_add_ps(_mm512_shuffle_ps(r[0], r[1], 0x88), _mm512_shuffle_ps(r[0], r[1], 0xDD));
}
#elif defined(__AVX2__) && defined(__FMA__)
// The sums of 8 accumulators, each as its lanes 0-7 (lo) and 8-15 (hi), by dots' pairwise steps
// done for all of them at once: lo + hi, then lanes l and l + 4 (two at a time), l and l + 2,
// l and l + 1 (four at a time), into [acc 0, 2, 4, 6 | acc 1, 3, 5, 7].
inline __m256 fold_eight(const __m256* lo, const __m256* hi) {
  __m256 x[8], u[4], r[2];
  for (int m = 0; m < 8; ++m) x[m] = _mm256_add_ps(lo[m], hi[m]);
  for (int m = 0; m < 4; ++m)     // [acc 2m | acc 2m + 1], 4 lanes each
    u[m] = _mm256_add_ps(_mm256_permute2f128_ps(x[2 * m], x[2 * m + 1], 0x20),
                         _mm256_permute2f128_ps(x[2 * m], x[2 * m + 1], 0x31));
  for (int m = 0; m < 2; ++m)     // [acc 4m, 4m + 2 | acc 4m + 1, 4m + 3], 2 lanes each
    r[m] = _mm256_add_ps(_mm256_shuffle_ps(u[2 * m], u[2 * m + 1], 0x44),
                         _mm256_shuffle_ps(u[2 * m], u[2 * m + 1], 0xEE));
  return _mm256_add_ps(_mm256_shuffle_ps(r[0], r[1], 0x88), _mm256_shuffle_ps(r[0], r[1], 0xDD));
}
#endif

template <int64_t D, int R = 4>
void score_keys(const Query* __restrict__ q, int64_t d, Slots keys, int64_t j0, int64_t j1,
                Rows<float> out, float scale) {
  const at::BFloat16* __restrict__ k = keys.data;
  float* __restrict__ o = out.data;
#if defined(__AVX512F__) && defined(__AVX512DQ__)
  for (; j0 + 4 <= j1; j0 += 4) {   // 4 keys at a time: the same sums, folded together
    Lanes acc[16];
    for (int i = 0; i < 16; ++i) acc[i] = zero();
    sum_products<4, 4>(q, D ? D : d, k + j0 * keys.stride, keys.stride, acc);
    alignas(64) float sums[16];
    _mm512_store_ps(sums, _mm512_mul_ps(fold_sixteen(acc), _mm512_set1_ps(scale)));
    for (int64_t r = 0; r < out.count; ++r)
      std::copy(sums + 4 * r, sums + 4 * r + 4, o + r * out.stride + j0);
  }
#elif defined(__AVX2__) && defined(__FMA__)
  const int64_t dd = D ? D : d;
  for (; j0 + 2 <= j1; j0 += 2) {   // 2 keys at a time, lanes 0-7 then 8-15: the same sums
    const at::BFloat16* a = k + j0 * keys.stride;
    const at::BFloat16* b = a + keys.stride;
    __m256 halves[2][8];
    for (int h = 0; h < 2; ++h) {
      __m256 acc[8];
      for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
      for (int64_t i = 8 * h; i < dd; i += LANES) {
        const __m256 ka = widen(a + i), kb = widen(b + i);
        for (int r = 0; r < R; ++r) {   // row r's sums in acc 4 (r % 2) + r / 2 (key a), + 2 (b)
          const __m256 row = _mm256_loadu_ps(q + r * dd + i);
          const int at = 4 * (r % 2) + r / 2;
          acc[at] = _mm256_fmadd_ps(row, ka, acc[at]);
          acc[at + 2] = _mm256_fmadd_ps(row, kb, acc[at + 2]);
        }
      }
      std::copy(acc, acc + 8, halves[h]);
    }
    // [rows 0, 1 | rows 2, 3], keys a, b of each
    const __m256 sums = _mm256_mul_ps(fold_eight(halves[0], halves[1]), _mm256_set1_ps(scale));
    const __m128 two[2] = {_mm256_castps256_ps128(sums), _mm256_extractf128_ps(sums, 1)};
    for (int64_t r = 0; r < out.count; ++r) {
      float* dst = o + r * out.stride + j0;
      r % 2 ? _mm_storeh_pi(reinterpret_cast<__m64*>(dst), two[r / 2])
            : _mm_storel_pi(reinterpret_cast<__m64*>(dst), two[r / 2]);
    }
  }
#endif
  for (int64_t j = j0; j < j1; ++j) {
    float four[4];
    dots<4>(q, D ? D : d, k + j * keys.stride, four);
    for (int64_t i = 0; i < out.count; ++i) o[i * out.stride + j] = four[i] * scale;
  }
}

#if !defined(__AVX512BF16__)
// Probabilities as the softmax gives them, summed with the values one key at a time.
using Probability = float;
constexpr int64_t PAIR = 1;   // keys accumulate_keys takes at a time

// acc_r += w_r * v (bfloat16) for R rows of acc (d apart), skipping w_r == 0
template <int R>
[[gnu::always_inline]] inline void add_scaled(float* acc, const float* w, const at::BFloat16* v,
                                              int64_t d) {
  for (int64_t i = 0; i < d; i += LANES) {
    Lanes value = load_lanes(v + i);
    for (int r = 0; r < R; ++r) {
      if (w[r] == 0.0f) continue;
      float* row = acc + r * d + i;
      store_lanes(row, fma(broadcast(w[r]), value, load_lanes(row)));
    }
  }
}

// Columns of acc kept in registers over the keys: 4 rows of 64 take 16 of AVX-512's 32 vector
// registers; with AVX2's 16, 4 rows of 16 (64 would spill: an 8-node tree's attention at 2K
// positions 1.4x slower). Each element's sum is the same either way.
#if defined(__AVX512F__)
constexpr int64_t COLUMNS = 64;
#else
constexpr int64_t COLUMNS = 16;
#endif

// acc (R rows of d) += p * v over keys [j0, j1), in order, for R rows of probabilities `p`
// (`stride` apart, all readable: rows past a head's last are summed and dropped), skipping
// p == 0; D as for score_keys. With D known, COLUMNS columns at a time stay in registers over
// all the keys, each value read once for the R rows (each element's sum still runs over the keys
// in order: the same operations as add_scaled's).
// The first block of columns fetches each value row AHEAD_KEYS keys ahead, whole, for the
// blocks after it: the keys' first reads from memory stalled the loops (one row at 32K, 0.94x
// the time; 8 rows at 8K, 0.93x).
constexpr int64_t AHEAD_KEYS = 32;

template <int64_t D, int R>
void accumulate_keys(float* __restrict__ acc, const float* __restrict__ p, int64_t stride,
                     Slots slots, int64_t j0, int64_t j1, int64_t d) {
  const at::BFloat16* __restrict__ values = slots.data;
  const int64_t vs = slots.stride;
  if constexpr (D % COLUMNS == 0 && D > 0) {
    constexpr int64_t V = COLUMNS / LANES;
    constexpr unsigned ALL = (1u << R) - 1;
    uint8_t nonzero[CHUNK];   // key j0 + i: bit r where p_r != 0 (the keys are a chunk's at most)
    for (int64_t j = j0; j < j1; ++j) {
      unsigned bits = 0;
      for (int r = 0; r < R; ++r) bits |= unsigned(p[r * stride + j] != 0.0f) << r;
      nonzero[j - j0] = static_cast<uint8_t>(bits);
    }
    for (int64_t c = 0; c < D; c += COLUMNS) {
      Lanes a[R][V];
      for (int r = 0; r < R; ++r)
        for (int64_t i = 0; i < V; ++i) a[r][i] = load_lanes(acc + r * D + c + i * LANES);
      for (int64_t j = j0; j < j1; ++j) {
        const unsigned bits = nonzero[j - j0];
        const at::BFloat16* v = values + j * vs + c;
        if (c == 0 && j + AHEAD_KEYS < j1)
          for (int64_t b = 0; b < D; b += 32) __builtin_prefetch(v + AHEAD_KEYS * vs + b);
        if (bits == ALL) {
          Lanes b[R];
          for (int r = 0; r < R; ++r) b[r] = broadcast(p[r * stride + j]);
          for (int64_t i = 0; i < V; ++i) {
            Lanes value = load_lanes(v + i * LANES);
            for (int r = 0; r < R; ++r) a[r][i] = fma(b[r], value, a[r][i]);
          }
        } else if (bits != 0) {
          for (int64_t i = 0; i < V; ++i) {
            Lanes value = load_lanes(v + i * LANES);
            for (int r = 0; r < R; ++r)
              if (bits >> r & 1) a[r][i] = fma(broadcast(p[r * stride + j]), value, a[r][i]);
          }
        }
      }
      for (int r = 0; r < R; ++r)
        for (int64_t i = 0; i < V; ++i) store_lanes(acc + r * D + c + i * LANES, a[r][i]);
    }
  } else {
    for (int64_t j = j0; j < j1; ++j) {
      float w[R];
      for (int r = 0; r < R; ++r) w[r] = p[r * stride + j];
      add_scaled<R>(acc, w, values + j * vs, D ? D : d);
    }
  }
}

// acc (one row of d) += p * v over logical columns [j0, j1), column j's value at values +
// slot(j) * vs: add_scaled's operations, one column at a time
template <typename Slot>
void accumulate_row(float* acc, const Probability* p, const at::BFloat16* values, int64_t vs,
                    Slot slot, int64_t j0, int64_t j1, int64_t d) {
  for (int64_t j = j0; j < j1; ++j) add_scaled<1>(acc, p + j, values + slot(j) * vs, d);
}
#else
// Probabilities rounded to bfloat16 and summed with the values two keys at a time: keys j and
// j + 1 (j even, counted from a chunk's first) by one bfloat16 dot-product instruction per 16
// columns, column c's lane taking p[j] v[j][c] and p[j + 1] v[j + 1][c] (each exact product added
// with one rounding). A key past the range's end is a zero, so a row whose keys end at j gets
// what a tree row gets whose key j + 1 is masked (p 0, its value finite).
using Probability = at::BFloat16;
constexpr int64_t PAIR = 2;

struct Interleave {
  alignas(64) int16_t index[2][32];   // columns [16h, 16h + 16) of rows a, b: a[c], b[c], ...
};
constexpr Interleave interleave() {
  Interleave t{};
  for (int h = 0; h < 2; ++h)
    for (int e = 0; e < 32; ++e) t.index[h][e] = static_cast<int16_t>(16 * h + e / 2 + e % 2 * 32);
  return t;
}
constexpr Interleave INTERLEAVE = interleave();

// Columns [0, 32) of the value rows a and b (b null: zeros), only [0, 16) where HALF, as the
// instruction's pairs, 16 columns a vector.
template <bool HALF = false>
[[gnu::always_inline]] inline void pair_columns(const at::BFloat16* a, const at::BFloat16* b,
                                                __m512i* out) {
  constexpr __mmask32 in = HALF ? 0xFFFFu : ~0u;
  const __m512i va = _mm512_maskz_loadu_epi16(in, a);
  const __m512i vb = b ? _mm512_maskz_loadu_epi16(in, b) : _mm512_setzero_si512();
  for (int h = 0; h < (HALF ? 1 : 2); ++h)
    out[h] = _mm512_permutex2var_epi16(va, _mm512_load_si512(INTERLEAVE.index[h]), vb);
}

// p[j] and p[j + 1] as one word (p[j + 1] a zero unless `both`)
inline uint32_t pair_of(const Probability* p, bool both) {
  uint32_t w;
  std::memcpy(&w, p, sizeof w);
  return both ? w : w & 0xFFFFu;
}

inline __m512bh weights(uint32_t w) { return (__m512bh)_mm512_set1_epi32(static_cast<int>(w)); }

// acc (one row of d) += p * v over logical columns [j0, j1) (j0 even), column j's value at
// values + slot(j) * vs, skipping pairs of zeros
template <typename Slot>
void accumulate_row(float* acc, const Probability* p, const at::BFloat16* values, int64_t vs,
                    Slot slot, int64_t j0, int64_t j1, int64_t d) {
  for (int64_t j = j0; j < j1; j += 2) {
    const bool both = j + 1 < j1;
    const uint32_t w = pair_of(p + j, both);
    if (w == 0) continue;
    const at::BFloat16* a = values + slot(j) * vs;
    const at::BFloat16* b = both ? values + slot(j + 1) * vs : nullptr;
    for (int64_t c = 0; c < d; c += 32) {
      __m512i operand[2];
      const bool half = d - c < 32;
      half ? pair_columns<true>(a + c, b ? b + c : nullptr, operand)
           : pair_columns(a + c, b ? b + c : nullptr, operand);
      for (int i = 0; i < (half ? 1 : 2); ++i)
        _mm512_storeu_ps(acc + c + 16 * i, _mm512_dpbf16_ps(_mm512_loadu_ps(acc + c + 16 * i),
                                                            (__m512bh)operand[i], weights(w)));
    }
  }
}

// acc (R rows of d) += p * v over keys [j0, j1) (j0 even), for R rows of probabilities `p`
// (`stride` apart, all readable: rows past a head's last are summed and dropped): each row's
// operations are accumulate_row's; D as for score_keys. With D a multiple of 64, 64 columns at a
// time stay in registers over all the keys, and a pair of keys is interleaved once for R rows.
template <int64_t D, int R>
void accumulate_keys(float* __restrict__ acc, const Probability* __restrict__ p, int64_t stride,
                     Slots slots, int64_t j0, int64_t j1, int64_t d) {
  if constexpr (D > 0 && D % 64 == 0) {
    for (int64_t c = 0; c < D; c += 64) {
      __m512 a[R][4];
      for (int r = 0; r < R; ++r)
        for (int i = 0; i < 4; ++i) a[r][i] = _mm512_loadu_ps(acc + r * D + c + 16 * i);
      for (int64_t j = j0; j < j1; j += 2) {
        const bool both = j + 1 < j1;
        uint32_t w[R], any = 0;
        for (int r = 0; r < R; ++r) any |= w[r] = pair_of(p + r * stride + j, both);
        if (any == 0) continue;
        const at::BFloat16* v = slots.data + j * slots.stride + c;
        __m512i operand[4];
        pair_columns(v, both ? v + slots.stride : nullptr, operand);
        pair_columns(v + 32, both ? v + slots.stride + 32 : nullptr, operand + 2);
        for (int r = 0; r < R; ++r)
          for (int i = 0; i < 4; ++i)
            a[r][i] = _mm512_dpbf16_ps(a[r][i], (__m512bh)operand[i], weights(w[r]));
      }
      for (int r = 0; r < R; ++r)
        for (int i = 0; i < 4; ++i) _mm512_storeu_ps(acc + r * D + c + 16 * i, a[r][i]);
    }
  } else {
    for (int r = 0; r < R; ++r)
      accumulate_row(acc + r * d, p + r * stride, slots.data, slots.stride,
                     [](int64_t j) { return j; }, j0, j1, d);
  }
}
#endif

using ScoreKeys = decltype(&score_keys<0>);

// Query rows scored together: under AVX2, 3 where a head's rows are a multiple of 3 and not of 4
// (a token's 3 or 6 query heads a key head in SmolLM2 and Qwen2.5-1.5B: blocks of 4 would score
// a quarter of their rows for nothing), else 4.
#if defined(__AVX2__) && !defined(__AVX512F__)
constexpr bool SCORE_THREES = true;
#else
constexpr bool SCORE_THREES = false;
#endif
int64_t score_block(int64_t rows) { return SCORE_THREES && rows % 3 == 0 && rows % 4 ? 3 : 4; }

template <int R>
ScoreKeys score_for(int64_t d) {
  return d == 64 ? score_keys<64, R> : d == 128 ? score_keys<128, R> : score_keys<0, R>;
}
using AccumulateKeys = decltype(&accumulate_keys<0, 4>);

template <int R>
AccumulateKeys accumulate_for(int64_t d) {
  return d == 64 ? accumulate_keys<64, R> : d == 128 ? accumulate_keys<128, R>
                                                     : accumulate_keys<0, R>;
}

// The rows of a head summed with the values at once: all of them where they are 3 or 6 (a
// token's query heads a key head in SmolLM2 and Qwen2.5-1.5B; 4 would add zero rows), with
// AVX-512's bfloat16 dot products 6 for any multiple of 6 too, else 4 (measured: more rows than 4
// are slower in the float loops' registers).
#if defined(__AVX512BF16__)
constexpr bool SIXES = true;
#else
constexpr bool SIXES = false;
#endif
int64_t row_block(int64_t rows) {
  return rows == 3 || rows == 6 ? rows : SIXES && rows % 6 == 0 ? 6 : 4;
}

// keys to a tile: a tile's keys are read from memory once for all the rows of a head
constexpr int64_t TILE = 64;

// longspec::attention: q [q_len, heads, d] over keys and values [kv_heads, n, d] (views of the
// cache, the block at slots start .. start + q_len), all bfloat16, d a multiple of 16; `mask`
// the block's additive [q_len, q_len] mask, `order` attention.py's block_order of it (None for
// a chain) -> [q_len, heads * d].
Tensor loop_attention(const Tensor& q, const Tensor& key_buf, const Tensor& value_buf,
                      int64_t start, const std::optional<Tensor>& mask,
                      const std::optional<Tensor>& order, double scale) {
  TORCH_CHECK(q.dim() == 3 && key_buf.dim() == 3 && key_buf.sizes() == value_buf.sizes() &&
                  q.scalar_type() == at::kBFloat16 && key_buf.scalar_type() == at::kBFloat16 &&
                  value_buf.scalar_type() == at::kBFloat16 && q.size(2) == key_buf.size(2) &&
                  q.size(2) % LANES == 0 && q.size(1) % key_buf.size(0) == 0 &&
                  start >= 0 && start + q.size(0) <= key_buf.size(1),
              "attention: bfloat16 q [q_len, heads, d], keys and values [kv_heads, n, d] with "
              "d a multiple of 16, heads a multiple of kv_heads and the block inside n");
  int64_t q_len = q.size(0), heads = q.size(1), d = q.size(2), n = key_buf.size(1);
  TORCH_CHECK(!mask || (mask->scalar_type() == at::kBFloat16 &&
                        mask->sizes() == c10::IntArrayRef({q_len, q_len})),
              "attention: a bfloat16 [q_len, q_len] mask");
  TORCH_CHECK(!order || (mask && order->scalar_type() == at::kLong &&
                         order->sizes() == c10::IntArrayRef({q_len, q_len})),
              "attention: an int64 [q_len, q_len] order, with its mask");
  int64_t kv_heads = key_buf.size(0), rows = heads / kv_heads * q_len;   // rows of a head
  int64_t padded = (n + CHUNK - 1) / CHUNK * CHUNK, end = start + q_len;
  int64_t tiles = (n + TILE - 1) / TILE;
  TORCH_CHECK(q.stride(2) == 1 && key_buf.stride(2) == 1 && value_buf.stride(2) == 1,
              "attention: unexpected layout");
  const at::BFloat16* pk = key_buf.const_data_ptr<at::BFloat16>();
  const at::BFloat16* pv = value_buf.const_data_ptr<at::BFloat16>();
  int64_t ks = key_buf.stride(1), vs = value_buf.stride(1);
  Tensor m = mask ? mask->contiguous() : Tensor();
  const at::BFloat16* pm = mask ? m.const_data_ptr<at::BFloat16>() : nullptr;
  Tensor ord = order ? order->contiguous() : Tensor();
  const int64_t* pord = order ? ord.const_data_ptr<int64_t>() : nullptr;
  auto block_slot = [&](int64_t t, int64_t c) { return pord ? pord[t * q_len + c] : c; };
  // row (query head hq, token t) is row hq * q_len + t: head h's rows are [h * rows, +rows)
  // (and 3 zero rows after the last, so that rows go four at a time), as sum_products takes them
  const auto query_type = std::is_same_v<Query, float> ? at::kFloat : at::kBFloat16;
  Tensor qf = at::cat({q.to(query_type).transpose(0, 1).reshape({heads * q_len, d}),
                       at::zeros({3, d}, q.options().dtype(query_type))});
  const Query* pq = qf.const_data_ptr<Query>();
  // (3 rows more, that the last head's rows go four at a time; their sums are dropped)
  Tensor s = scratch(0, {heads * q_len + 3, padded});
  float* ps = s.data_ptr<float>();
  float scalef = static_cast<float>(scale);
  const int64_t scored = score_block(rows);
  ScoreKeys score = scored == 3 ? score_for<3>(d) : score_for<4>(d);
  const int64_t block = row_block(rows);
  AccumulateKeys accumulate = block == 3   ? accumulate_for<3>(d)
                              : block == 6 ? accumulate_for<6>(d)
                                           : accumulate_for<4>(d);
  // scores of the slots outside the block, a (head, tile) at a time
  at::parallel_for(0, kv_heads * tiles, 1, [&](int64_t first, int64_t last) {
    for (int64_t unit = first; unit < last; ++unit) {
      int64_t h = unit / tiles, from = unit % tiles * TILE, to = std::min(from + TILE, n);
      const at::BFloat16* keys = pk + h * key_buf.stride(0);
      for (int64_t r = h * rows; r < (h + 1) * rows; r += scored) {
        int64_t count = std::min(scored, (h + 1) * rows - r);
        auto run = [&](int64_t j0, int64_t j1) {
          if (j0 < j1) score(pq + r * d, d, {keys, ks}, j0, j1, {ps + r * padded, padded, count},
                             scalef);
        };
        if (pord) {
          run(from, std::min(to, start));
          run(std::max(from, end), to);
        } else {
          run(from, to);
        }
      }
    }
  });
  // the block's scores in each row's order (a chain's are in place already), the mask added
  at::parallel_for(0, heads * q_len, 1, [&](int64_t first, int64_t last) {
    for (int64_t row = first; row < last; ++row) {
      int64_t t = row % q_len;
      const at::BFloat16* keys = pk + row / rows * key_buf.stride(0);
      float* out = ps + row * padded;
      if (pm && !pord) {   // a chain's: in place, the same operations (vectorized)
        const at::BFloat16* add = pm + t * q_len;
        float* o = out + start;
        for (int64_t c = 0; c < q_len; ++c) {
          const float a = static_cast<float>(add[c]);
          o[c] = a == -INFINITY ? -INFINITY : o[c] + a;
        }
      }
      for (int64_t c = 0; pm && pord && c < q_len; ++c) {
        int64_t from = block_slot(t, c);
        float add = static_cast<float>(pm[t * q_len + from]);
        if (add == -INFINITY) {
          out[start + c] = -INFINITY;
        } else {
          out[start + c] = dot(pq + row * d, keys + (start + from) * ks, d) * scalef + add;
        }
      }
      std::fill(out + n, out + padded, -INFINITY);
    }
  });
  Tensor probabilities = s.narrow(0, 0, heads * q_len);   // in place: the same bits
  at::_softmax_out(probabilities, probabilities, -1, false);
  Tensor taken = s;     // as accumulate_keys takes them
  if constexpr (!std::is_same_v<Probability, float>)
    taken = scratch(1, s.sizes(), at::kBFloat16).copy_(s);
  const Probability* pp = taken.const_data_ptr<Probability>();
  // each chunk's partial outputs, a (head, chunk, row block) at a time; then their pairwise sum
  int64_t chunks = padded / CHUNK, blocks = (rows + block - 1) / block;
  Tensor partials = scratch(2, {kv_heads, chunks, rows, d});
  float* pout = partials.data_ptr<float>();
  at::parallel_for(0, kv_heads * chunks * blocks, 1, [&](int64_t first, int64_t last) {
    std::vector<float> acc(block * d);
    for (int64_t unit = first; unit < last; ++unit) {
      int64_t h = unit / (chunks * blocks), chunk = unit / blocks % chunks;
      int64_t r0 = h * rows + unit % blocks * block, r1 = std::min(r0 + block, (h + 1) * rows);
      const at::BFloat16* values = pv + h * value_buf.stride(0);
      std::fill(acc.begin(), acc.end(), 0.0f);
      int64_t c0 = chunk * CHUNK, c1 = std::min((chunk + 1) * CHUNK, n);
      auto run = [&](int64_t j0, int64_t j1) {
        if (j0 < j1)
          accumulate(acc.data(), pp + r0 * padded, padded, {values, vs}, j0, j1, d);
      };
      if (!pord) {
        run(c0, c1);
      } else {   // keys whose slots depend on the row (the block's, and PAIRs that take one), a row
        int64_t before = std::min(c1, start) / PAIR * PAIR;   // at a time; around them, 4 rows
        int64_t past = (std::max(c0, end) + PAIR - 1) / PAIR * PAIR;
        int64_t after = std::max(before, std::min(c1, past));
        run(c0, before);
        for (int64_t row = r0; row < r1; ++row) {
          auto slot = [&](int64_t j) {
            return j < start || j >= end ? j : start + block_slot(row % q_len, j - start);
          };
          accumulate_row(acc.data() + (row - r0) * d, pp + row * padded, values, vs, slot,
                         std::max(c0, before), after, d);
        }
        run(after, c1);
      }
      for (int64_t row = r0; row < r1; ++row)
        std::copy(acc.begin() + (row - r0) * d, acc.begin() + (row - r0 + 1) * d,
                  pout + ((h * chunks + chunk) * rows + row - h * rows) * d);
    }
  });
  return combine(partials, q_len);
}

}  // namespace

// One part of a layer's product: Int4Linear's operands (with scale_zero; `size` its group) or
// DenseLinear's (without; `size` its min_rows), and its bias.
struct Part {
  Tensor weight;
  std::optional<Tensor> scale_zero;
  int64_t size;
  bool doubled;
  std::optional<Tensor> bias;
};

// A product over its parts (linear.py's RowParts where there are several): the outputs side
// by side.
Tensor product(const std::vector<Part>& parts, const Tensor& x) {
  std::vector<Tensor> outs;
  for (const Part& p : parts)
    outs.push_back(linear(x, p.weight, p.scale_zero, p.size, p.doubled, p.bias));
  return outs.size() == 1 ? outs[0] : at::cat(outs, -1);
}

// One generation's part of a forward (transformer.py's Segment): its rows of x go to its cache's
// slots [start, start + rows) of `keys` and `values` (one per layer) and attend to slots [0, n),
// with its block mask and block order (cache/base.py's AttentionPlan).
struct Segment {
  std::vector<Tensor> keys, values;
  int64_t start, n, rows;
  std::optional<Tensor> mask, order;
};

// The decoder layers of one model (transformer.py's Blocks), given once at load: per layer l,
// products[4 l .. 4 l + 3] are its q|k|v, output, gate|up and down; norms[2 l], norms[2 l + 1]
// its attention and MLP norms; qk_norms (empty or 2 per layer) Qwen3's query and key norms.
struct Layers {
  std::vector<Tensor> norms, qk_norms;
  std::vector<std::vector<Part>> products;
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  double eps = 0, scale = 0;

  // Every layer over x [q, hidden] with RoPE's cos and sin, its rows the segments' in turn
  // (several generations' blocks in one forward: every product over all rows, attention over
  // each segment's own cache). Returns the output [q, hidden] and, when asked for, each layer's
  // rotated query of the last row [heads, head_dim].
  std::tuple<Tensor, std::vector<Tensor>> forward(
      Tensor x, const Tensor& cos, const Tensor& sin, const std::vector<Segment>& segments,
      bool want_queries) const {
    int64_t q_len = x.size(0);
    std::vector<Tensor> queries;
    int64_t nq = heads * head_dim, nkv = kv_heads * head_dim;
    for (size_t l = 0; l < norms.size() / 2; ++l) {
      Tensor h = rms_norm(x, norms[2 * l], eps);
      Tensor qkv = product(products[4 * l], h);
      Tensor qk = qkv.index({Slice(), Slice(None, nq + nkv)})
                      .view({q_len, heads + kv_heads, head_dim});
      Tensor v = qkv.index({Slice(), Slice(nq + nkv, None)}).view({q_len, kv_heads, head_dim});
      if (!qk_norms.empty()) {
        qk = at::cat({rms_norm(qk.index({Slice(), Slice(None, heads)}), qk_norms[2 * l], eps),
                      rms_norm(qk.index({Slice(), Slice(heads, None)}), qk_norms[2 * l + 1], eps)},
                     1);
      }
      qk = apply_rope(qk, cos, sin);
      Tensor q = qk.index({Slice(), Slice(None, heads)});
      Tensor k = qk.index({Slice(), Slice(heads, None)});
      if (want_queries) queries.push_back(q[q_len - 1]);
      std::vector<Tensor> outs;
      int64_t row = 0;
      for (const Segment& s : segments) {
        Tensor rows_k = k.narrow(0, row, s.rows), rows_v = v.narrow(0, row, s.rows);
        s.keys[l].index({Slice(), Slice(s.start, s.start + s.rows)}).copy_(rows_k.transpose(0, 1));
        s.values[l].index({Slice(), Slice(s.start, s.start + s.rows)})
            .copy_(rows_v.transpose(0, 1));
        outs.push_back(loop_attention(q.narrow(0, row, s.rows), s.keys[l].narrow(1, 0, s.n),
                                      s.values[l].narrow(1, 0, s.n), s.start, s.mask, s.order,
                                      scale));
        row += s.rows;
      }
      Tensor out = outs.size() == 1 ? outs[0] : at::cat(outs, 0);
      x = x + product(products[4 * l + 1], out);
      h = rms_norm(x, norms[2 * l + 1], eps);
      Tensor gate_up = product(products[4 * l + 2], h);
      int64_t half = gate_up.size(1) / 2;
      Tensor gate = gate_up.index({Slice(), Slice(None, half)});
      Tensor up = gate_up.index({Slice(), Slice(half, None)});
      x = x + product(products[4 * l + 3], at::silu(gate) * up);
    }
    return {x, queries};
  }
};

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<Part>(m, "Part")
      .def(py::init<Tensor, std::optional<Tensor>, int64_t, bool, std::optional<Tensor>>(),
           py::arg("weight"), py::arg("scale_zero"), py::arg("size"), py::arg("doubled"),
           py::arg("bias"));
  py::class_<Segment>(m, "Segment")
      .def(py::init<std::vector<Tensor>, std::vector<Tensor>, int64_t, int64_t, int64_t,
                    std::optional<Tensor>, std::optional<Tensor>>(),
           py::arg("keys"), py::arg("values"), py::arg("start"), py::arg("n"), py::arg("rows"),
           py::arg("mask"), py::arg("order"));
  py::class_<Layers>(m, "Layers", "every decoder layer of a bfloat16 CPU model")
      .def(py::init<>())
      .def_readwrite("norms", &Layers::norms)
      .def_readwrite("qk_norms", &Layers::qk_norms)
      .def_readwrite("products", &Layers::products)
      .def_readwrite("heads", &Layers::heads)
      .def_readwrite("kv_heads", &Layers::kv_heads)
      .def_readwrite("head_dim", &Layers::head_dim)
      .def_readwrite("eps", &Layers::eps)
      .def_readwrite("scale", &Layers::scale)
      .def("forward", &Layers::forward, "every layer over a block");
}

TORCH_LIBRARY_FRAGMENT(longspec, m) {
  m.def("attention(Tensor q, Tensor keys, Tensor values, int start, Tensor? mask, Tensor? order, "
        "float scale) -> Tensor");
}

// The output's shape and dtype without computing it (meta and fake tensors: tracing, checks).
Tensor attention_shape(const Tensor& q, const Tensor&, const Tensor&, int64_t,
                       const std::optional<Tensor>&, const std::optional<Tensor>&, double) {
  return at::empty_symint({q.sym_size(0), q.sym_size(1) * q.sym_size(2)}, q.options());
}

TORCH_LIBRARY_IMPL(longspec, CPU, m) { m.impl("attention", &loop_attention); }
TORCH_LIBRARY_IMPL(longspec, Meta, m) { m.impl("attention", &attention_shape); }
