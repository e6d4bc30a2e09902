// longspec::int4_mm, the int4 product of CPUs with AVX2 (and AVX-512 without AMX tiles):
// y [m, n] = x [m, k] W [n, k']^T with W = q * scale + min per group of 32 along k', q 4-bit.
// k' is k, or 2k for two 4-bit halves of each weight (`doubled`: group g takes the activations
// of group g mod k / 32). As llama.cpp does, the activations are quantized per row and group of
// 32 to int8 (x ~ d * qx, d = max |x| / 127), so that each group's dot product is an integer one
// (AVX2's maddubs): y = sum_g scale_g * d_g * (q . qx)_g + min_g * d_g * sum(qx)_g.
//
// Every output is one thread's, summed in one fixed order that depends on its row and column
// alone (two float accumulators of 8 lanes for even and odd groups, then the lanes, then the
// mins' terms), so row i of an m-row product is bitwise the same whatever m is and whatever the
// other rows hold: the row-invariance exactness rests on (linear.py). The instructions are
// AVX2's whatever the build allows, so AVX2 and AVX-512 builds give the same bits.
//
// Operands (linear.py's pack_int4_mm): codes uint8 [n, k' / 2], each 64 weights of a row as 32
// bytes, weight j in byte j's low nibble and weight 32 + j in its high one, or signed 8-bit
// codes int8 [n, k] (formats of two 4-bit halves, joined: Q8_0, Q5_0, Q5_K); scale_min
// [n, k' / 32, 2], each group's scale and min, float16 or float32. Checked against the
// float64 product in tests/test_int4_mm.py.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>

using at::Tensor;

namespace {

constexpr int64_t GROUP = 32;
constexpr int64_t ROW_BLOCK = 4;   // rows that share one pass over a column's weights

inline float to_float(float v) { return v; }
inline float to_float(at::Half v) { return _cvtsh_ss(v.x); }

// Row r's activations as int8 codes qx [k] and, per group, its step d and d * sum(qx).
struct Quantized {
  int64_t k;
  std::vector<int8_t> codes;
  std::vector<float> step, sum;
};

// A matrix's operands: BITS-bit codes and [n, groups, 2] scales and mins.
template <typename S>
struct Weights {
  const uint8_t* codes;
  const S* scale_min;
  int64_t n, groups;
};

template <typename T>
Quantized quantize(const T* x, int64_t rows, int64_t k) {
  const int64_t groups = k / GROUP;
  Quantized q{k, std::vector<int8_t>(rows * k), std::vector<float>(rows * groups),
              std::vector<float>(rows * groups)};
  at::parallel_for(0, rows * groups, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float v[GROUP], amax = 0;
      for (int64_t j = 0; j < GROUP; ++j) {
        v[j] = static_cast<float>(x[i * GROUP + j]);
        amax = std::max(amax, std::fabs(v[j]));
      }
      const float d = amax / 127, inverse = d > 0 ? 1 / d : 0;
      int total = 0;
      for (int64_t j = 0; j < GROUP; ++j) {
        const int c = static_cast<int>(std::nearbyint(v[j] * inverse));
        q.codes[i * GROUP + j] = static_cast<int8_t>(c);
        total += c;
      }
      q.step[i] = d;
      q.sum[i] = d * static_cast<float>(total);
    }
  });
  return q;
}

inline float lanes_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// One group's integer dot product as 8 float lanes: 32 codes (0..15, or signed 8-bit ones)
// times 32 int8 activations. Signed codes go in as |code| and the activations take their signs
// (|code| <= 128 and |qx| <= 127 keep maddubs' pair sums from saturating).
template <int BITS>
inline __m256 group_dot(__m256i codes, const int8_t* qx) {
  __m256i x = _mm256_loadu_si256((const __m256i*)qx);
  if constexpr (BITS == 8) {
    x = _mm256_sign_epi8(x, codes);
    codes = _mm256_abs_epi8(codes);
  }
  const __m256i pairs = _mm256_maddubs_epi16(codes, x);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

// Rows [r0, r0 + R) of column `col`.
template <int R, int BITS, typename S, typename Y>
void column(const Weights<S>& w, const Quantized& q, int64_t col, int64_t r0, Y* y) {
  const int64_t k = q.k, x_groups = k / GROUP, groups = w.groups;
  const uint8_t* codes = w.codes + col * groups * GROUP * BITS / 8;
  const S* scale_min = w.scale_min + col * groups * 2;
  const __m256i low = _mm256_set1_epi8(0x0F);
  __m256i a, b;
  __m256 even[R], odd[R];
  for (int r = 0; r < R; ++r) even[r] = odd[r] = _mm256_setzero_ps();
  const int8_t* qx[R];
  const float* step[R];
  for (int r = 0; r < R; ++r) {
    qx[r] = q.codes.data() + (r0 + r) * k;
    step[r] = q.step.data() + (r0 + r) * x_groups;
  }
  for (int64_t g = 0; g < groups; g += 2) {
    if constexpr (BITS == 4) {
      const __m256i bytes = _mm256_loadu_si256((const __m256i*)(codes + g * GROUP / 2));
      a = _mm256_and_si256(bytes, low);
      b = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low);
    } else {
      a = _mm256_loadu_si256((const __m256i*)(codes + g * GROUP));
      b = _mm256_loadu_si256((const __m256i*)(codes + (g + 1) * GROUP));
    }
    const float sa = to_float(scale_min[2 * g]), sb = to_float(scale_min[2 * g + 2]);
    const int64_t ga = g < x_groups ? g : g - x_groups;   // doubled: the second half's x
    const int64_t gb = g + 1 < x_groups ? g + 1 : g + 1 - x_groups;
    for (int r = 0; r < R; ++r) {
      even[r] = _mm256_fmadd_ps(group_dot<BITS>(a, qx[r] + ga * GROUP),
                                _mm256_set1_ps(sa * step[r][ga]), even[r]);
      odd[r] = _mm256_fmadd_ps(group_dot<BITS>(b, qx[r] + gb * GROUP),
                               _mm256_set1_ps(sb * step[r][gb]), odd[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const int64_t row = (r0 + r) * x_groups;
    float offset = 0;
    for (int64_t g = 0; g < groups; ++g)
      offset += to_float(scale_min[2 * g + 1]) * q.sum[row + (g < x_groups ? g : g - x_groups)];
    y[(r0 + r) * w.n + col] = static_cast<Y>(lanes_sum(_mm256_add_ps(even[r], odd[r])) + offset);
  }
}

template <int BITS, typename S, typename Y>
void product(const Quantized& q, int64_t rows, const Tensor& codes, const Tensor& scale_min,
             Y* y) {
  const Weights<S> w{static_cast<const uint8_t*>(codes.const_data_ptr()),
                     scale_min.const_data_ptr<S>(), codes.size(0), scale_min.size(1)};
  at::parallel_for(0, w.n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t col = begin; col < end; ++col) {
      int64_t r0 = 0;
      for (; r0 + ROW_BLOCK <= rows; r0 += ROW_BLOCK)
        column<ROW_BLOCK, BITS>(w, q, col, r0, y);
      switch (rows - r0) {
        case 3: column<3, BITS>(w, q, col, r0, y); break;
        case 2: column<2, BITS>(w, q, col, r0, y); break;
        case 1: column<1, BITS>(w, q, col, r0, y); break;
        default: break;
      }
    }
  });
}

template <typename X>
void product_to(const Tensor& x, const Tensor& codes, const Tensor& scale_min, Tensor& y) {
  const int64_t rows = x.size(0), k = x.size(1);
  const Quantized q = quantize(x.const_data_ptr<X>(), rows, k);
  X* out = y.mutable_data_ptr<X>();
  const bool half = scale_min.scalar_type() == at::kHalf;
  if (codes.scalar_type() == at::kChar)
    half ? product<8, at::Half>(q, rows, codes, scale_min, out)
         : product<8, float>(q, rows, codes, scale_min, out);
  else
    half ? product<4, at::Half>(q, rows, codes, scale_min, out)
         : product<4, float>(q, rows, codes, scale_min, out);
}

Tensor int4_mm(const Tensor& x_, const Tensor& codes, const Tensor& scale_min) {
  const Tensor x = x_.contiguous();
  TORCH_CHECK(x.dim() == 2 && codes.dim() == 2 && scale_min.dim() == 3 &&
                  scale_min.size(0) == codes.size(0) && scale_min.size(2) == 2,
              "int4_mm: x [m, k], codes [n, k' / 2] (or [n, k] 8-bit) and scale_min "
              "[n, k' / 32, 2] expected");
  const bool wide = codes.scalar_type() == at::kChar;
  TORCH_CHECK((wide || codes.scalar_type() == at::kByte) && codes.is_contiguous() &&
                  scale_min.is_contiguous() &&
                  (scale_min.scalar_type() == at::kHalf || scale_min.scalar_type() == at::kFloat),
              "int4_mm: contiguous uint8 (4-bit) or int8 codes and float16 or float32 scales "
              "and mins expected");
  const int64_t k = x.size(1), groups = scale_min.size(1);
  TORCH_CHECK(k % GROUP == 0 && groups % 2 == 0 &&
                  codes.size(1) * (wide ? 1 : 2) == groups * GROUP &&
                  (groups * GROUP == k || (!wide && groups * GROUP == 2 * k)),
              "int4_mm: k a multiple of 32 and k' (k, or 2k for 4-bit codes) of 64 expected");
  Tensor y = at::empty({x.size(0), codes.size(0)}, x.options());
  if (x.scalar_type() == at::kBFloat16) {
    product_to<at::BFloat16>(x, codes, scale_min, y);
  } else {
    TORCH_CHECK(x.scalar_type() == at::kFloat, "int4_mm: bfloat16 or float32 activations");
    product_to<float>(x, codes, scale_min, y);
  }
  return y;
}

}  // namespace

TORCH_LIBRARY(longspec, m) {
  m.def("int4_mm(Tensor x, Tensor codes, Tensor scale_min) -> Tensor");
}

// The output's shape and dtype without computing it (meta and fake tensors: tracing, checks).
Tensor int4_mm_shape(const Tensor& x, const Tensor& codes, const Tensor&) {
  return at::empty_symint({x.sym_size(0), codes.sym_size(0)}, x.options());
}

TORCH_LIBRARY_IMPL(longspec, CPU, m) { m.impl("int4_mm", &int4_mm); }
TORCH_LIBRARY_IMPL(longspec, Meta, m) { m.impl("int4_mm", &int4_mm_shape); }
#endif
