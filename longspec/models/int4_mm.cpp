// longspec::int4_mm, the int4 product of CPUs with AVX2 or AVX-512 (AMX's included):
// y [m, n] = x [m, k] W [n, k']^T with W = q * scale + min per group of 32 along k', q 4-bit.
// k' is k, or 2k for two 4-bit halves of each weight (`doubled`: group g takes the activations
// of group g mod k / 32). Or W = q * scale per 16 along k, q signed 8-bit (Q6_K's form: its
// 6-bit codes with their scales per 16, d * sc). As llama.cpp does, the activations are
// quantized per row and group of 32 to int8 (x ~ d * qx, d = max |x| / 127), so that each
// group's dot product is an integer one:
// y = sum_g scale_g * d_g * (q . qx)_g + min_g * d_g * sum(qx)_g.
//
// The weights come in tiles of 16 outputs whose codes interleave, four k a lane: one vector
// register holds 16 outputs' codes for 4 k, so a broadcast of 4 activations and one integer
// multiply-add (AVX-512 VNNI's dpbusd; AVX2's maddubs and madd on 8 outputs at a time) advance
// 16 (8) dot products at once, and the weights of a tile are unpacked once for several rows.
// Each output is one lane of one thread, summed in one fixed order that depends on its row and
// column alone (per group: the exact integer dot product, then acc = fma(dot, scale * d, acc)
// and offset = fma(min, d * sum(qx), offset); then acc + offset), so row i of an m-row product
// is bitwise the same whatever m is and whatever the other rows hold: the row-invariance
// exactness rests on (linear.py). AVX2 and AVX-512 builds compute every lane alike: same bits.
//
// Operands (linear.py's pack_int4_mm and pack_int4_mm_16): codes uint8 [n, k' / 2] (4-bit),
// uint8 [n, 5k / 8] (5-bit: the 4-bit layout's nibbles, then per tile and group a block of 64
// bytes of the high bits, lane j's at bit j: Q5_0 and Q5_K, their two 4-bit halves joined) or
// int8 [n, k'] (signed 8-bit: Q8_0's two 4-bit halves joined; or Q6_K's), and scale_min
// [n, k' / 32, 2] (scales and mins per 32) or [n, k / 16] (8-bit codes: scales per 16, no
// mins), float16 or float32, all in the tile order below; n a multiple of 16. Or, for
// K-quants (Q4_K), scale_min uint8 [n, k / 256, 20]: per tile and superblock of 256, its 16
// outputs' float16 d and -dmin, then per group 16 six-bit scale codes and 16 min codes; a
// group's scale is d * code and its min -dmin * code, exact in float32 (the values the float32
// form holds, 4.6 bits a weight in all instead of 6). Or, for Q6_K, codes uint8 [n, 3k / 4] of
// 6 bits (q + 32: the 4-bit layout's nibbles, then per tile and group two blocks of 64 bytes of
// the high 2 bits, lane j's in block j / 4 at bits 2 (j % 4)) and scale_min int8 [n, k / 256,
// 18]: per tile and superblock its 16 outputs' float16 d, then per group the 16 scales of k
// 0..15 and the 16 of k 16..31 (d * scale exact in float32, the per-16 float form's values).
// Checked against the float64 product in tests/test_int4_mm.py.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>

using at::Tensor;

namespace {

constexpr int64_t GROUP = 32;
constexpr int64_t TILE = 16;       // outputs whose codes interleave
// Rows that share one unpacking of a tile's codes (8 rows take 0.89x the time of two blocks of 4
// with AVX-512 and with AVX2, though AVX2's 16 registers then spill some sums)
constexpr int64_t ROW_BLOCK = 8;
// Groups ahead whose codes are prefetched: with several rows a group's work outlasts its load,
// and the hardware's prefetching alone left 4-row forwards of the 1.5B ~1.2x slower.
constexpr int64_t AHEAD = 8;
// Rows up to which a product takes all of a tile's lanes in one pass over its codes (AVX2's
// tiles are two blocks of 8 lanes): each group's codes are read from memory once, in order,
// where a pass a block read every tile twice. 1 to 4 rows of the 1.5B's products took
// 0.80-0.94x the time on a Zen 3 (docs/benchmarks/kernels.md); more rows' sums spill.
constexpr int64_t SPANNED = 4;

// Row r's activations as int8 codes qx [k]; per group its step d and d * sum(qx), and the sums
// of qx over its two halves of 16.
struct Quantized {
  int64_t k, groups;
  std::vector<int8_t> codes;
  std::vector<int32_t> half_total;
  std::vector<float> step, sum;
};

// A matrix's operands, per tile t and group g: the codes of 8 lanes of 4 k (k = 4j..4j+3 for
// j = 0..7) as 8 blocks of 64 bytes (output c's 4 codes at bytes 4c..4c+3), 4-bit ones two
// blocks a byte (j in the low nibbles, j + 4 in the high ones); then the 16 scales and the 16
// mins (or, for scales per 16, the scales of k 0..15 then those of k 16..31).
template <typename S>
struct Weights {
  const uint8_t* codes;
  const S* scale_min;
  int64_t n, groups;
};

// 8 activations as floats
inline __m256 eight(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 eight(const at::BFloat16* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// The sum of 8 int32 lanes (exact)
inline int32_t lane_sum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 1)));
}

// Each group's codes: nearbyint(x / d) as the vector conversion rounds it (to nearest, ties to
// even, as nearbyint does in the default rounding mode), d = max |x| / 127.
template <typename T>
Quantized quantize(const T* x, int64_t rows, int64_t k) {
  const int64_t groups = k / GROUP;
  Quantized q{k, groups, std::vector<int8_t>(rows * k), std::vector<int32_t>(rows * groups * 2),
              std::vector<float>(rows * groups), std::vector<float>(rows * groups)};
  at::parallel_for(0, rows * groups, 64, [&](int64_t begin, int64_t end) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t i = begin; i < end; ++i) {
      __m256 v[4], top = _mm256_setzero_ps();
      for (int j = 0; j < 4; ++j) {
        v[j] = eight(x + i * GROUP + 8 * j);
        top = _mm256_max_ps(top, _mm256_andnot_ps(sign, v[j]));
      }
      __m128 h = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
      h = _mm_max_ps(h, _mm_movehl_ps(h, h));
      const float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
      const float d = amax / 127, inverse = d > 0 ? 1 / d : 0;
      __m256i c[4];
      for (int j = 0; j < 4; ++j)
        c[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], _mm256_set1_ps(inverse)));
      const __m256i bytes8 = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]),
                                                _mm256_packs_epi32(c[2], c[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q.codes.data() + i * GROUP),
                          _mm256_permutevar8x32_epi32(bytes8, order));
      const int32_t first = lane_sum(_mm256_add_epi32(c[0], c[1]));
      const int32_t second = lane_sum(_mm256_add_epi32(c[2], c[3]));
      q.half_total[2 * i] = first;
      q.half_total[2 * i + 1] = second;
      q.step[i] = d;
      q.sum[i] = d * static_cast<float>(first + second);
    }
  });
  return q;
}

inline int32_t four(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

#if defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VNNI__)
constexpr int64_t LANES = 16;
constexpr int64_t WIDE_BLOCK = ROW_BLOCK;
using Floats = __m512;
using Ints = __m512i;

inline Floats load_floats(const float* p) { return _mm512_loadu_ps(p); }
inline Floats load_floats(const at::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
}
inline Floats load_floats(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p)));
}
inline Floats load_floats(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
}
inline Ints load_ints(const uint8_t* p) { return _mm512_loadu_si512(p); }

// Byte-wise operations for unpack: a byte in every lane, and, or, 16-bit shifts.
inline Ints bytes(int8_t v) { return _mm512_set1_epi8(v); }
inline Ints both(Ints a, Ints b) { return _mm512_and_si512(a, b); }
inline Ints either(Ints a, Ints b) { return _mm512_or_si512(a, b); }
template <int N> inline Ints left(Ints a) { return _mm512_slli_epi16(a, N); }
template <int N> inline Ints right(Ints a) { return _mm512_srli_epi16(a, N); }
// 8-bit codes as dpbusd's unsigned operand: shifted by 128 (group_dot takes 128 sum(qx) off)
inline Ints wide_codes(Ints a) { return _mm512_xor_si512(a, bytes(-128)); }

// Each lane's exact dot products of its output's codes with the group's activations qx, over
// k 0..31 (PARTS 1: part[0]) or over k 0..15 and 16..31 (PARTS 2); `total` qx's sums over
// its halves.
template <int BITS, int PARTS>
inline void group_dot(const Ints* u, const int8_t* qx, const int32_t* total, Ints* part) {
  for (int h = 0; h < PARTS; ++h) {
    Ints even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();
    for (int j = 8 / PARTS * h; j < 8 / PARTS * (h + 1); j += 2) {
      even = _mm512_dpbusd_epi32(even, u[j], _mm512_set1_epi32(four(qx + 4 * j)));
      odd = _mm512_dpbusd_epi32(odd, u[j + 1], _mm512_set1_epi32(four(qx + 4 * j + 4)));
    }
    part[h] = _mm512_add_epi32(even, odd);
    const int32_t sum = PARTS == 2 ? total[h] : total[0] + total[1];
    if constexpr (BITS == 8) part[h] = _mm512_sub_epi32(part[h], _mm512_set1_epi32(128 * sum));
    if constexpr (BITS == 6) part[h] = _mm512_sub_epi32(part[h], _mm512_set1_epi32(32 * sum));
  }
}

inline Floats to_floats(Ints v) { return _mm512_cvtepi32_ps(v); }
inline Floats fma(Floats a, Floats b, Floats c) { return _mm512_fmadd_ps(a, b, c); }
inline Floats mul(Floats a, Floats b) { return _mm512_mul_ps(a, b); }
inline Floats add(Floats a, Floats b) { return _mm512_add_ps(a, b); }
inline Floats broadcast(float v) { return _mm512_set1_ps(v); }
inline Floats zeros() { return _mm512_setzero_ps(); }
inline void store(float* p, Floats v) { _mm512_storeu_ps(p, v); }
#else
constexpr int64_t LANES = 8;
// Rows that share one unpacking of a tile's codes before the blocks of ROW_BLOCK: with the mins'
// sums in a pass of their own (tile), blocks of 16 take 0.87-0.99x the time of blocks of 8 on
// 16 to 32 rows of the 1.5B's products on a Zen 4 (with AVX-512's VNNI, 1.05-1.15x on its
// 4-bit ones: there, blocks of 8).
constexpr int64_t WIDE_BLOCK = 16;
using Floats = __m256;
using Ints = __m256i;

inline Floats load_floats(const float* p) { return _mm256_loadu_ps(p); }
inline Floats load_floats(const at::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
}
inline Floats load_floats(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}
inline Floats load_floats(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}
inline Ints load_ints(const uint8_t* p) { return _mm256_loadu_si256((const __m256i*)p); }

// Byte-wise operations for unpack: a byte in every lane, and, or, 16-bit shifts.
inline Ints bytes(int8_t v) { return _mm256_set1_epi8(v); }
inline Ints both(Ints a, Ints b) { return _mm256_and_si256(a, b); }
inline Ints either(Ints a, Ints b) { return _mm256_or_si256(a, b); }
template <int N> inline Ints left(Ints a) { return _mm256_slli_epi16(a, N); }
template <int N> inline Ints right(Ints a) { return _mm256_srli_epi16(a, N); }
// 8-bit codes stay signed (group_dot gives maddubs their absolute values and signs)
inline Ints wide_codes(Ints a) { return a; }

// Each lane's exact dot products of its output's codes with the group's activations qx, over
// k 0..31 (PARTS 1: part[0]) or over k 0..15 and 16..31 (PARTS 2); `total` qx's sums over its
// halves. Signed codes go in as |code| and the activations take their signs (|code| <= 128 and
// |qx| <= 127 keep maddubs' pair sums from saturating). maddubs' 16-bit pair sums of RUN lanes
// of codes are added as 16-bit integers before one madd widens them: as many as cannot pass
// 32767 (2 * 127 * the largest code each: 8 lanes of 4-bit codes, 4 of 5-bit, 2 of 6-bit, 1
// of 8-bit), so every sum is exact and the same as summed in 32 bits, with up to 7 of 8
// madds fewer.
template <int BITS, int PARTS>
inline void group_dot(const Ints* u, const int8_t* qx, const int32_t* total, Ints* part) {
  constexpr int LARGEST = BITS == 8 ? 128 : (1 << BITS) - 1;
  constexpr int LANES_A_PART = 8 / PARTS;
  constexpr int FIT = 32767 / (2 * 127 * LARGEST);
  constexpr int RUN = FIT < LANES_A_PART ? FIT : LANES_A_PART;
  const Ints ones = _mm256_set1_epi16(1);
  for (int h = 0; h < PARTS; ++h) {
    Ints sum32 = _mm256_setzero_si256();
    for (int j0 = LANES_A_PART * h; j0 < LANES_A_PART * (h + 1); j0 += RUN) {
      Ints even = _mm256_setzero_si256(), odd = _mm256_setzero_si256();
      for (int j = j0; j < j0 + RUN; ++j) {
        Ints x = _mm256_set1_epi32(four(qx + 4 * j)), codes = u[j];
        if constexpr (BITS == 8) {
          x = _mm256_sign_epi8(x, codes);
          codes = _mm256_abs_epi8(codes);
        }
        const Ints pairs = _mm256_maddubs_epi16(codes, x);
        if constexpr (RUN == 1) {
          sum32 = _mm256_add_epi32(sum32, _mm256_madd_epi16(pairs, ones));
        } else {
          (j % 2 ? odd : even) = _mm256_add_epi16(j % 2 ? odd : even, pairs);
        }
      }
      if constexpr (RUN > 1)
        sum32 = _mm256_add_epi32(sum32, _mm256_madd_epi16(_mm256_add_epi16(even, odd), ones));
    }
    part[h] = sum32;
    const int32_t sum = PARTS == 2 ? total[h] : total[0] + total[1];
    if constexpr (BITS == 6) part[h] = _mm256_sub_epi32(part[h], _mm256_set1_epi32(32 * sum));
  }
}

inline Floats to_floats(Ints v) { return _mm256_cvtepi32_ps(v); }
inline Floats fma(Floats a, Floats b, Floats c) { return _mm256_fmadd_ps(a, b, c); }
inline Floats mul(Floats a, Floats b) { return _mm256_mul_ps(a, b); }
inline Floats add(Floats a, Floats b) { return _mm256_add_ps(a, b); }
inline Floats broadcast(float v) { return _mm256_set1_ps(v); }
inline Floats zeros() { return _mm256_setzero_ps(); }
inline void store(float* p, Floats v) { _mm256_storeu_ps(p, v); }
#endif

// A group's 8 lanes of codes (k 4j..4j+3 for lane j) as group_dot takes them: 4-bit ones as
// they are, 5-bit ones (nibbles, then the high bits' block) too, 6-bit ones (nibbles, then the
// high bits' blocks) shifted by 32, 8-bit ones as wide_codes gives them.
template <int BITS>
inline void unpack(const uint8_t* p, Ints* u) {
  if constexpr (BITS == 8) {
    for (int j = 0; j < 8; ++j) u[j] = wide_codes(load_ints(p + j * 64));
  } else {
    const Ints low = bytes(0x0F), high = bytes(0x30);
    for (int j = 0; j < 4; ++j) {
      const Ints b = load_ints(p + j * 64);
      u[j] = both(b, low);
      u[j + 4] = both(right<4>(b), low);
    }
    if constexpr (BITS == 5) {        // lane j's high bit at bit j of one block
      const Ints b = load_ints(p + 256), bit = bytes(0x10);
      u[0] = either(u[0], both(left<4>(b), bit));
      u[1] = either(u[1], both(left<3>(b), bit));
      u[2] = either(u[2], both(left<2>(b), bit));
      u[3] = either(u[3], both(left<1>(b), bit));
      u[4] = either(u[4], both(b, bit));
      u[5] = either(u[5], both(right<1>(b), bit));
      u[6] = either(u[6], both(right<2>(b), bit));
      u[7] = either(u[7], both(right<3>(b), bit));
    }
    if constexpr (BITS == 6) {
      for (int h = 0; h < 2; ++h) {   // lane 4h + m's high bits at bits 2m, 2m + 1
        const Ints b = load_ints(p + 256 + h * 64);
        u[4 * h] = either(u[4 * h], both(left<4>(b), high));
        u[4 * h + 1] = either(u[4 * h + 1], both(left<2>(b), high));
        u[4 * h + 2] = either(u[4 * h + 2], both(b, high));
        u[4 * h + 3] = either(u[4 * h + 3], both(right<2>(b), high));
      }
    }
  }
}

// Rows [r0, r0 + R) of lanes [lane0, lane0 + SPAN * LANES) of tile t; SIXTEEN: scales per 16,
// no mins.
template <int R, int BITS, bool SIXTEEN, typename S, typename Y, int SPAN = 1>
void tile(const Weights<S>& w, const Quantized& q, int64_t t, int64_t lane0, int64_t r0, Y* y) {
  const int64_t groups = w.groups, x_groups = q.groups;
  const uint8_t* codes = w.codes + t * groups * GROUP * TILE * BITS / 8 + lane0 * 4;
  // K-quants: per superblock float16 d and -dmin (Q4_K's uint8 codes) or d (Q6_K's int8 ones)
  constexpr bool KQUANT = std::is_same_v<S, uint8_t> || std::is_same_v<S, int8_t>;
  constexpr int64_t SUPER = 8, D_BYTES = (std::is_same_v<S, uint8_t> ? 2 : 1) * 2 * TILE;
  constexpr int64_t SUPER_BYTES = D_BYTES + SUPER * 2 * TILE;
  [[maybe_unused]] const S* scale_min = w.scale_min + t * groups * 2 * TILE + lane0;
  [[maybe_unused]] const uint8_t* blocks =
      reinterpret_cast<const uint8_t*>(w.scale_min) + t * groups / SUPER * SUPER_BYTES;
  // a group's scales, and its mins (or the scales of k 16..31), for lanes lane0 + lane on
  const auto scales = [&](int64_t g, int64_t lane, Floats& first, Floats& second) {
    if constexpr (KQUANT) {
      const uint8_t* block = blocks + g / SUPER * SUPER_BYTES;
      const at::Half* d = reinterpret_cast<const at::Half*>(block) + lane0 + lane;
      const S* group_codes =
          reinterpret_cast<const S*>(block + D_BYTES) + g % SUPER * 2 * TILE + lane0 + lane;
      first = mul(load_floats(group_codes), load_floats(d));
      second = mul(load_floats(group_codes + TILE), load_floats(SIXTEEN ? d : d + TILE));
    } else {
      first = load_floats(scale_min + g * 2 * TILE + lane);
      second = load_floats(scale_min + g * 2 * TILE + TILE + lane);
    }
  };
  // With AVX2's 16 registers, the mins' sums of 4 rows or more run in a pass of their own after
  // the codes' (the same operations in the same order): beside them their accumulators spill,
  // and apart 8 to 24 rows of the 1.5B's 4-bit products take 0.83-0.91x the time on a Zen 4.
  // With AVX-512's 32, beside them (apart: 1.01-1.06x the time).
  constexpr bool APART = LANES == 8 && !SIXTEEN && R >= 4;
  Floats acc[SPAN * R], offset[SPAN * R];
  for (int r = 0; r < SPAN * R; ++r) acc[r] = offset[r] = zeros();
  Ints u[8];
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* ahead = codes + (g + AHEAD) * GROUP * TILE * BITS / 8;
    for (int64_t b = 0; b < GROUP * TILE * BITS / 8; b += 64)
      _mm_prefetch(reinterpret_cast<const char*>(ahead + b), _MM_HINT_T0);
    const int64_t gx = g < x_groups ? g : g - x_groups;   // doubled: the second half's x
    for (int s = 0; s < SPAN; ++s) {
      unpack<BITS>(codes + g * GROUP * TILE * BITS / 8 + s * LANES * 4, u);
      Floats first, second;
      scales(g, s * LANES, first, second);
      for (int r = 0; r < R; ++r) {
        const int64_t i = (r0 + r) * x_groups + gx;
        Ints part[2];
        group_dot<BITS, SIXTEEN ? 2 : 1>(u, q.codes.data() + i * GROUP,
                                         q.half_total.data() + 2 * i, part);
        const Floats step = broadcast(q.step[i]);
        Floats& a = acc[s * R + r];
        a = fma(to_floats(part[0]), mul(first, step), a);
        if constexpr (SIXTEEN) a = fma(to_floats(part[1]), mul(second, step), a);
        if constexpr (!SIXTEEN && !APART)
          offset[s * R + r] = fma(second, broadcast(q.sum[i]), offset[s * R + r]);
      }
    }
  }
  if constexpr (APART) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t gx = g < x_groups ? g : g - x_groups;
      for (int s = 0; s < SPAN; ++s) {
        Floats first, second;
        scales(g, s * LANES, first, second);
        for (int r = 0; r < R; ++r)
          offset[s * R + r] = fma(second, broadcast(q.sum[(r0 + r) * x_groups + gx]),
                                  offset[s * R + r]);
      }
    }
  }
  for (int s = 0; s < SPAN; ++s)
    for (int r = 0; r < R; ++r) {
      float out[LANES];
      store(out, add(acc[s * R + r], offset[s * R + r]));
      Y* row = y + (r0 + r) * w.n + t * TILE + lane0 + s * LANES;
      for (int64_t c = 0; c < LANES; ++c) row[c] = static_cast<Y>(out[c]);
    }
}

template <int BITS, bool SIXTEEN, typename S, typename Y>
void product(const Quantized& q, int64_t rows, const Tensor& codes, const Tensor& scale_min,
             Y* y) {
  const Weights<S> w{static_cast<const uint8_t*>(codes.const_data_ptr()),
                     scale_min.const_data_ptr<S>(), codes.size(0),
                     codes.size(1) * 8 / (BITS * GROUP)};
  at::parallel_for(0, w.n / TILE, 1, [&](int64_t begin, int64_t end) {
    constexpr int SPAN = TILE / LANES;
    for (int64_t t = begin; t < end; ++t) {
      if (rows <= SPANNED) {   // every lane block of the tile in one pass
        switch (rows) {
          case 1: tile<1, BITS, SIXTEEN, S, Y, SPAN>(w, q, t, 0, 0, y); break;
          case 2: tile<2, BITS, SIXTEEN, S, Y, SPAN>(w, q, t, 0, 0, y); break;
          case 3: tile<3, BITS, SIXTEEN, S, Y, SPAN>(w, q, t, 0, 0, y); break;
          case 4: tile<4, BITS, SIXTEEN, S, Y, SPAN>(w, q, t, 0, 0, y); break;
          default: break;
        }
        continue;
      }
      for (int64_t lane0 = 0; lane0 < TILE; lane0 += LANES) {
        int64_t r0 = 0;
        if constexpr (WIDE_BLOCK > ROW_BLOCK)
          for (; r0 + WIDE_BLOCK <= rows; r0 += WIDE_BLOCK)
            tile<WIDE_BLOCK, BITS, SIXTEEN>(w, q, t, lane0, r0, y);
        for (; r0 + ROW_BLOCK <= rows; r0 += ROW_BLOCK)
          tile<ROW_BLOCK, BITS, SIXTEEN>(w, q, t, lane0, r0, y);
        // The rows past the blocks in one pass over the codes: 5 to 7 rows of SmolLM2's and
        // Qwen2.5-Coder-1.5B's large products took 0.76-0.90x the time of a block of 4 and the
        // rest with AVX-512 on a Zen 4, 0.81-0.86x with AVX2 on a Zen 3 (where AVX2 as a Zen 4
        // runs it measured 0.96-1.08x; docs/benchmarks/kernels.md, "int4_mm").
        switch (rows - r0) {
          case 7: tile<7, BITS, SIXTEEN>(w, q, t, lane0, r0, y); break;
          case 6: tile<6, BITS, SIXTEEN>(w, q, t, lane0, r0, y); break;
          case 5: tile<5, BITS, SIXTEEN>(w, q, t, lane0, r0, y); break;
          case 4: tile<4, BITS, SIXTEEN>(w, q, t, lane0, r0, y); break;
          case 3: tile<3, BITS, SIXTEEN>(w, q, t, lane0, r0, y); break;
          case 2: tile<2, BITS, SIXTEEN>(w, q, t, lane0, r0, y); break;
          case 1: tile<1, BITS, SIXTEEN>(w, q, t, lane0, r0, y); break;
          default: break;
        }
      }
    }
  });
}

// The operand formats (the header says each one's layout).
enum class Format { Pairs4, Pairs5, Pairs8, Sixteen8, K4, K6 };

template <typename X>
void product_to(const Tensor& x, Format format, const Tensor& codes, const Tensor& scale_min,
                Tensor& y) {
  const int64_t rows = x.size(0), k = x.size(1);
  const Quantized q = quantize(x.const_data_ptr<X>(), rows, k);
  X* out = y.mutable_data_ptr<X>();
  const bool half = scale_min.scalar_type() == at::kHalf;
  switch (format) {
    case Format::Pairs4:
      half ? product<4, false, at::Half>(q, rows, codes, scale_min, out)
           : product<4, false, float>(q, rows, codes, scale_min, out);
      break;
    case Format::Pairs5:
      half ? product<5, false, at::Half>(q, rows, codes, scale_min, out)
           : product<5, false, float>(q, rows, codes, scale_min, out);
      break;
    case Format::Pairs8:
      half ? product<8, false, at::Half>(q, rows, codes, scale_min, out)
           : product<8, false, float>(q, rows, codes, scale_min, out);
      break;
    case Format::Sixteen8:
      half ? product<8, true, at::Half>(q, rows, codes, scale_min, out)
           : product<8, true, float>(q, rows, codes, scale_min, out);
      break;
    case Format::K4: product<4, false, uint8_t>(q, rows, codes, scale_min, out); break;
    case Format::K6: product<6, true, int8_t>(q, rows, codes, scale_min, out); break;
  }
}

Tensor int4_mm(const Tensor& x_, const Tensor& codes, const Tensor& scale_min) {
  const Tensor x = x_.contiguous();
  TORCH_CHECK(x.dim() == 2 && codes.dim() == 2 && codes.is_contiguous() &&
                  scale_min.is_contiguous() && scale_min.dim() >= 2 &&
                  scale_min.size(0) == codes.size(0) && codes.size(0) % TILE == 0 &&
                  x.size(1) % GROUP == 0,
              "int4_mm: x [m, k], codes [n, ...] and scales [n, ...], contiguous, with k a "
              "multiple of 32 and n a multiple of 16 expected");
  const int64_t n = codes.size(0), k = x.size(1), width = codes.size(1);
  const auto c = codes.scalar_type(), s = scale_min.scalar_type();
  const bool floats = s == at::kHalf || s == at::kFloat;
  const auto shaped = [&](std::vector<int64_t> shape) {
    return scale_min.sizes() == c10::IntArrayRef(shape);
  };
  std::optional<Format> format;
  if (c == at::kByte && floats && (2 * width == k || width == k) && shaped({n, width / 16, 2}))
    format = Format::Pairs4;
  else if (c == at::kByte && floats && 8 * width == 5 * k && shaped({n, k / 32, 2}))
    format = Format::Pairs5;
  else if (c == at::kChar && floats && width == k && shaped({n, k / 32, 2}))
    format = Format::Pairs8;
  else if (c == at::kChar && floats && width == k && shaped({n, k / 16}))
    format = Format::Sixteen8;
  else if (c == at::kByte && s == at::kByte && 2 * width == k && k % 256 == 0 &&
           shaped({n, k / 256, 20}))
    format = Format::K4;
  else if (c == at::kByte && s == at::kChar && 4 * width == 3 * k && k % 256 == 0 &&
           shaped({n, k / 256, 18}))
    format = Format::K6;
  TORCH_CHECK(format, "int4_mm: codes and scales of no format it takes: uint8 [n, k' / 2] "
              "(4-bit, k' k or 2k) or [n, 5k / 8] (5-bit) with float16 or float32 scales and "
              "mins [n, k' / 32, 2]; "
              "int8 [n, k] with those [n, k / 32, 2] or scales [n, k / 16]; uint8 [n, k / 2] "
              "with uint8 [n, k / 256, 20] (Q4_K); uint8 [n, 3k / 4] with int8 [n, k / 256, "
              "18] (Q6_K)");
  Tensor y = at::empty({x.size(0), n}, x.options());
  if (x.scalar_type() == at::kBFloat16) {
    product_to<at::BFloat16>(x, *format, codes, scale_min, y);
  } else {
    TORCH_CHECK(x.scalar_type() == at::kFloat, "int4_mm: bfloat16 or float32 activations");
    product_to<float>(x, *format, codes, scale_min, y);
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
