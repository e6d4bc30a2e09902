// The decoder layers of a bfloat16 CPU model with int4 weights (transformer.py's Block with
// attention.py's grouped_attention and linear.py's products), as the same ATen calls in the
// same order, made from C++: bitwise the Python path's output without its per-call overhead.
// The RMS norms, RoPE, attention's score scaling and masking and the sum of its partials are
// plain loops doing each element's float operations as ATen's kernels round them, the norm's
// one reduction (its sum) left to ATen. Attention runs as loops instead (loop_attention,
// below) wherever the head size allows (native.py says when). On CPUs with AMX the int4
// products are this file's int4_amx, in both paths (Int4Linear calls it too). compiled.py
// builds this file (without contracting a * b + c into one rounding) and native.py says when
// it is used; change both paths together.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
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

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
// The int4 product on AMX (Intel's matrix tiles), for CPUs that have them: y [m, n] = x [m, k]
// times W [n, k]^T, W = q * scale + min per group of 32 along k. Each group's dot product runs
// on the tiles, sum_k q x (every product exact in float32, the codes being small integers), and
// is then scaled on the vector unit: acc = fma(dot, scale, acc), then acc = fma(sum_k x, min,
// acc), the groups in order. Row r's output depends on row r alone, and one pass over the
// weights serves up to 16 rows: 16 rows cost ~1.3x one row, where ATen's int4 kernel costs
// ~16x (linear.py; BENCHMARKS.md).
//
// Layout (linear.py's pack_amx): packed [n / 16, groups, 256] uint8 holds a tile of 16 outputs
// by one group: byte 32 c + i has in its low nibble element i of the tile's row c (the pair of
// k = 2c, 2c + 1 for the 16 outputs, AMX's pair-interleaved layout: output i / 2, k + i % 2)
// and in its high nibble element i of row c + 8; or, for 8-bit codes (Q8_0, Q5_K), int8
// [n / 16, groups, 512], byte 32 c + i element i of row c. scale_min [n / 16, groups, 2, 16],
// float16 or float32.
// Formats of two halves (doubled) have 2 k / 32 groups, the second half over x again.

// bfloat16 of the codes q = 0..15
const __m512i CODE_VALUES = _mm512_set_epi16(
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0x4170, 0x4160, 0x4150, 0x4140, 0x4130, 0x4120, 0x4110, 0x4100,
    0x40E0, 0x40C0, 0x40A0, 0x4080, 0x4040, 0x4000, 0x3F80, 0x0000);

// 16 scales or mins as float
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const at::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

struct TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

constexpr int64_t TILE_ROWS = 16;   // rows (of x) and outputs a tile holds
constexpr int UNIT = 3;             // output tiles per pass: three B and three C tiles

// tile 0: m rows of x's group (32 bfloat16); 1-3: the weights of three output tiles;
// 4-6: their m x 16 float sums (tile_scores uses 0, 1 and 4 with m = 16)
void configure_tiles(int64_t m) {
  TileConfig cfg;
  for (int t = 0; t < 7; ++t) {
    cfg.rows[t] = t >= 1 && t <= 3 ? TILE_ROWS : m;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

// one group of one output tile's codes to the bfloat16 B tile (16 rows of 32)
inline void unpack_group(const uint8_t* codes, uint16_t* b) {
  const __m512i low = _mm512_set1_epi16(0x0F);
  for (int c = 0; c < 8; ++c) {
    __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(codes + c * 32)));
    __m512i low_codes = _mm512_and_si512(w, low), high_codes = _mm512_srli_epi16(w, 4);
    _mm512_store_si512(b + c * 32, _mm512_permutexvar_epi16(low_codes, CODE_VALUES));
    _mm512_store_si512(b + (c + 8) * 32, _mm512_permutexvar_epi16(high_codes, CODE_VALUES));
  }
}

// the same from 8-bit codes (signed, already in the B tile's order: 16 rows of 32 bytes)
inline void unpack_group8(const int8_t* codes, uint16_t* b) {
  for (int c = 0; c < 16; ++c) {
    const __m128i* row = reinterpret_cast<const __m128i*>(codes + c * 32);
    __m512 first = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(row)));
    __m512 second = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(row + 1)));
    _mm512_store_si512(b + c * 32, (__m512i)_mm512_cvtne2ps_pbh(second, first));
  }
}

// GCC's tile loads and stores are asm without a memory operand: the compiler sees neither the
// buffers they read nor those they write, so it may drop or move plain stores and loads across
// them. A fence between the two keeps the order as written.
inline void fence() { asm volatile("" ::: "memory"); }

// the tile macros take their tile numbers as literals
#define GROUP_DOT(B, C, buf) _tile_zero(C); _tile_loadd(B, buf, 64); _tile_dpbf16ps(C, 0, B);

// NT consecutive output tiles from `tile` on, for m <= 16 rows, from codes of BITS (4 or 8)
template <int NT, int BITS, typename S, typename Y>
void amx_tiles(const uint16_t* x, int64_t m, int64_t k, const uint8_t* packed, const S* sz,
               int64_t groups, const float* xsum, int64_t tile, int64_t n, Y* y) {
  constexpr int64_t GROUP_BYTES = 16 * 32 * BITS / 8;
  int64_t kg = k / 32;
  alignas(64) uint16_t b[NT][16 * 32];
  alignas(64) float c[NT][TILE_ROWS * 16];
  __m512 acc[NT][TILE_ROWS];
  for (int j = 0; j < NT; ++j)
    for (int64_t r = 0; r < m; ++r) acc[j][r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    _tile_loadd(0, x + (g % kg) * 32, k * 2);
    for (int j = 0; j < NT; ++j) {
      const uint8_t* codes = packed + ((tile + j) * groups + g) * GROUP_BYTES;
      if constexpr (BITS == 4)
        unpack_group(codes, b[j]);
      else
        unpack_group8(reinterpret_cast<const int8_t*>(codes), b[j]);
    }
    fence();
    GROUP_DOT(1, 4, b[0]);
    _tile_stored(4, c[0], 64);
    if constexpr (NT == UNIT) {
      GROUP_DOT(2, 5, b[1]);
      GROUP_DOT(3, 6, b[2]);
      _tile_stored(5, c[1], 64);
      _tile_stored(6, c[2], 64);
    }
    fence();
    __m512 scale[NT], low[NT];
    for (int j = 0; j < NT; ++j) {
      scale[j] = load16(sz + ((tile + j) * groups + g) * 32);
      low[j] = load16(sz + ((tile + j) * groups + g) * 32 + 16);
    }
    for (int64_t r = 0; r < m; ++r) {
      __m512 sum = _mm512_set1_ps(xsum[r * kg + g % kg]);
      for (int j = 0; j < NT; ++j) {
        acc[j][r] = _mm512_fmadd_ps(_mm512_load_ps(c[j] + r * 16), scale[j], acc[j][r]);
        acc[j][r] = _mm512_fmadd_ps(sum, low[j], acc[j][r]);
      }
    }
  }
  for (int j = 0; j < NT; ++j)
    for (int64_t r = 0; r < m; ++r) {
      if constexpr (std::is_same_v<Y, float>)
        _mm512_storeu_ps(y + r * n + (tile + j) * 16, acc[j][r]);
      else
        _mm256_storeu_si256((__m256i*)(y + r * n + (tile + j) * 16),
                            (__m256i)_mm512_cvtneps_pbh(acc[j][r]));
    }
}

// Every output tile for rows of x, 16 rows at a time; xsum [rows, k / 32] each row's group sums
template <int BITS, typename S, typename Y>
void amx_product(const uint16_t* x, int64_t rows, int64_t k, const uint8_t* packed, const S* sz,
                 int64_t tiles, int64_t groups, const float* xsum, Y* y) {
  int64_t n = tiles * 16, kg = k / 32, units = (tiles + UNIT - 1) / UNIT;
  for (int64_t r0 = 0; r0 < rows; r0 += TILE_ROWS) {
    int64_t m = std::min(TILE_ROWS, rows - r0);
    const uint16_t* xr = x + r0 * k;
    const float* sr = xsum + r0 * kg;
    at::parallel_for(0, units, 1, [&](int64_t u0, int64_t u1) {
      configure_tiles(m);
      for (int64_t u = u0; u < u1; ++u) {
        if ((u + 1) * UNIT <= tiles) {
          amx_tiles<UNIT, BITS>(xr, m, k, packed, sz, groups, sr, u * UNIT, n, y + r0 * n);
        } else {
          for (int64_t t = u * UNIT; t < tiles; ++t)
            amx_tiles<1, BITS>(xr, m, k, packed, sz, groups, sr, t, n, y + r0 * n);
        }
      }
      _tile_release();
    });
  }
}

// y [rows, n] from bfloat16 x [rows, k]: float32 when `float_out`, else bfloat16
template <typename S>
void amx_product_to(const uint16_t* x, int64_t rows, int64_t k, const Tensor& packed,
                    const S* sz, int64_t groups, const float* xsum, Tensor& y) {
  int64_t tiles = packed.size(0);
  const uint8_t* codes = static_cast<const uint8_t*>(packed.const_data_ptr());
  uint16_t* y16 = reinterpret_cast<uint16_t*>(y.data_ptr());
  float* y32 = reinterpret_cast<float*>(y.data_ptr());
  bool wide = packed.scalar_type() == at::kChar, to_float = y.scalar_type() == at::kFloat;
  if (wide && to_float) amx_product<8>(x, rows, k, codes, sz, tiles, groups, xsum, y32);
  if (wide && !to_float) amx_product<8>(x, rows, k, codes, sz, tiles, groups, xsum, y16);
  if (!wide && to_float) amx_product<4>(x, rows, k, codes, sz, tiles, groups, xsum, y32);
  if (!wide && !to_float) amx_product<4>(x, rows, k, codes, sz, tiles, groups, xsum, y16);
}

Tensor int4_amx(const Tensor& x_, const Tensor& packed, const Tensor& scale_min, bool doubled,
                bool float_out) {
  Tensor x = x_.contiguous();
  int64_t rows = x.size(0), k = x.size(1), kg = k / 32;
  int64_t tiles = packed.size(0), groups = packed.size(1);
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && k % 32 == 0 &&
                  groups == (doubled ? 2 : 1) * kg,
              "int4_amx: bfloat16 activations of the weights' width expected");
  Tensor y = at::empty({rows, tiles * 16},
                       x.options().dtype(float_out ? at::kFloat : at::kBFloat16));
  const uint16_t* px = reinterpret_cast<const uint16_t*>(x.const_data_ptr<at::BFloat16>());
  // each row's sum over each group (its two halves of 16 added lane-wise, then the lanes)
  std::vector<float> xsum(rows * kg);
  for (int64_t i = 0; i < rows * kg; ++i) {
    __m512i both = _mm512_loadu_si512(px + i * 32);
    __m512 low = _mm512_cvtpbh_ps((__m256bh)_mm512_castsi512_si256(both));
    __m512 high = _mm512_cvtpbh_ps((__m256bh)_mm512_extracti64x4_epi64(both, 1));
    xsum[i] = _mm512_reduce_add_ps(_mm512_add_ps(low, high));
  }
  if (scale_min.scalar_type() == at::kHalf)
    amx_product_to(px, rows, k, packed, scale_min.const_data_ptr<at::Half>(), groups,
                   xsum.data(), y);
  else
    amx_product_to(px, rows, k, packed, scale_min.const_data_ptr<float>(), groups, xsum.data(),
                   y);
  return y;
}

// Attention's scores on the tiles (loop_attention's, for head sizes a multiple of 32):
// out[r][j] = (q_r . k_j) * scale for keys j in [j0, j1) and the `rows` query rows of one head,
// whose transposes `qt` (query_tiles) holds. Each score is C = 0, then C += the tiles' dot
// product of each 32-wide part of q and k in turn: it depends on its query and key alone.
void tile_scores(const uint16_t* qt, int64_t rows, int64_t d, const uint16_t* keys, int64_t ks,
                 int64_t j0, int64_t j1, float scale, float* out, int64_t stride) {
  int64_t parts = d / 32, groups = (rows + TILE_ROWS - 1) / TILE_ROWS;
  std::vector<uint16_t> tail;
  alignas(64) float c[TILE_ROWS * 16];
  fence();    // qt, written by query_tiles
  for (int64_t k0 = j0; k0 < j1; k0 += TILE_ROWS) {
    int64_t count = std::min(TILE_ROWS, j1 - k0);
    const uint16_t* a = keys + k0 * ks;
    int64_t a_stride = ks;
    if (count < TILE_ROWS) {   // the last keys, copied so that no slot past them is read
      tail.assign(TILE_ROWS * d, 0);
      for (int64_t i = 0; i < count; ++i)
        std::copy(a + i * ks, a + i * ks + d, tail.data() + i * d);
      a = tail.data();
      a_stride = d;
      fence();
    }
    for (int64_t g = 0; g < groups; ++g) {
      _tile_zero(4);
      for (int64_t part = 0; part < parts; ++part) {
        _tile_loadd(0, a + part * 32, a_stride * 2);
        _tile_loadd(1, qt + (g * parts + part) * 512, 64);
        _tile_dpbf16ps(4, 0, 1);
      }
      _tile_stored(4, c, 64);
      fence();
      for (int64_t r = g * TILE_ROWS; r < std::min(rows, (g + 1) * TILE_ROWS); ++r)
        for (int64_t i = 0; i < count; ++i)
          out[r * stride + k0 + i] = c[i * 16 + r % TILE_ROWS] * scale;
    }
  }
}

// The query rows of each head (q bfloat16 [heads * q_len, d], a head's `rows` consecutive) as
// tile_scores' operands: per head, 16 rows at a time and 32 columns at a time, the pairs of
// columns (2i, 2i + 1) of each row side by side (AMX's pair-interleaved layout), zero rows past
// the head's last.
std::vector<uint16_t> query_tiles(const uint16_t* q, int64_t kv_heads, int64_t rows, int64_t d) {
  int64_t parts = d / 32, groups = (rows + TILE_ROWS - 1) / TILE_ROWS;
  std::vector<uint16_t> qt(kv_heads * groups * parts * 512, 0);
  for (int64_t h = 0; h < kv_heads; ++h)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t col = 0; col < d; ++col) {
        int64_t g = r / TILE_ROWS, part = col / 32, i = col % 32;
        qt[((h * groups + g) * parts + part) * 512 + i / 2 * 32 + r % TILE_ROWS * 2 + i % 2] =
            q[(h * rows + r) * d + col];
      }
  return qt;
}

// The word indices that interleave two vectors' words 0-15 (offset 0) or 16-31 (offset 16):
// a[o], b[o], a[o + 1], b[o + 1], ... (AMX's pairs of rows of its second operand)
inline __m512i pair_index(int offset) {
  alignas(64) uint16_t index[32];
  for (int w = 0; w < 32; ++w) index[w] = (w % 2 ? 32 : 0) + offset + w / 2;
  return _mm512_load_si512(index);
}

// The values of 32 keys (slots[i], or zeros where it is -1), columns [dim0, dim0 + 64), as four
// B tiles of 16 columns: row i holds keys 2i and 2i + 1 side by side, column by column.
inline void value_tiles(const uint16_t* values, int64_t vs, const int64_t* slots, int64_t dim0,
                        __m512i low, __m512i high, uint16_t* b) {
  auto load = [&](int64_t slot, int half) {
    return slot < 0 ? _mm512_setzero_si512()
                    : _mm512_loadu_si512(values + slot * vs + dim0 + 32 * half);
  };
  for (int i = 0; i < 16; ++i)
    for (int half = 0; half < 2; ++half) {
      __m512i first = load(slots[2 * i], half), second = load(slots[2 * i + 1], half);
      _mm512_store_si512(b + 2 * half * 512 + i * 32, _mm512_permutex2var_epi16(first, low, second));
      _mm512_store_si512(b + (2 * half + 1) * 512 + i * 32,
                         _mm512_permutex2var_epi16(first, high, second));
    }
}

// tile 0: m rows of probabilities (32 keys); 1: 16 rows of values; 4-7: m x 16 float sums
void configure_value_tiles(int64_t m) {
  TileConfig cfg;
  for (int t : {0, 4, 5, 6, 7}) cfg.rows[t] = m;
  cfg.rows[1] = TILE_ROWS;
  for (int t : {0, 1, 4, 5, 6, 7}) cfg.colsb[t] = 64;
  _tile_loadconfig(&cfg);
}

#define VALUE_STEP(b)                                                                   \
  for (int part = 0; part < 4; ++part) {                                                \
    _tile_loadd(1, (b) + part * 512, 64);                                               \
    if (part == 0) _tile_dpbf16ps(4, 0, 1);                                             \
    if (part == 1) _tile_dpbf16ps(5, 0, 1);                                             \
    if (part == 2) _tile_dpbf16ps(6, 0, 1);                                             \
    if (part == 3) _tile_dpbf16ps(7, 0, 1);                                             \
  }

// Attention's p . v on the tiles (loop_attention's, for head sizes a multiple of 64): out
// [m, d] (rows d apart) = the sum over logical keys [c0, c1) of m rows' probabilities (bfloat16
// p, rows `padded` apart, from row r0) times the values, 32 keys a step from c0 on, the steps
// in order. slot(r, j): the value slot of row r's logical key j (-1: past the keys; r = -1:
// the rows share it), per_row(j): whether the rows' keys differ in the step from j (a tree's
// block), which then runs a row at a time with the other rows' probabilities zero. A row's sum
// depends on its own probabilities and keys alone.
template <typename Slot, typename PerRow>
void tile_values(const uint16_t* p, int64_t padded, int64_t r0, int64_t m, const uint16_t* values,
                 int64_t vs, int64_t d, int64_t c0, int64_t c1, Slot slot, PerRow per_row,
                 float* out) {
  __m512i low = pair_index(0), high = pair_index(16);
  alignas(64) uint16_t b[4 * 512];
  alignas(64) uint16_t alone[TILE_ROWS * 32] = {};
  int64_t slots[32];
  for (int64_t dim0 = 0; dim0 < d; dim0 += 64) {
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
    for (int64_t j = c0; j < c1; j += 32) {
      if (!per_row(j)) {
        for (int i = 0; i < 32; ++i) slots[i] = slot(-1, j + i);
        value_tiles(values, vs, slots, dim0, low, high, b);
        fence();
        _tile_loadd(0, p + r0 * padded + j, padded * 2);
        VALUE_STEP(b);
        continue;
      }
      for (int64_t r = 0; r < m; ++r) {
        for (int i = 0; i < 32; ++i) slots[i] = slot(r0 + r, j + i);
        value_tiles(values, vs, slots, dim0, low, high, b);
        std::copy(p + (r0 + r) * padded + j, p + (r0 + r) * padded + j + 32, alone + r * 32);
        fence();
        _tile_loadd(0, alone, 64);
        VALUE_STEP(b);
        fence();
        std::fill(alone + r * 32, alone + r * 32 + 32, 0);
      }
    }
    _tile_stored(4, out + dim0, d * 4);
    _tile_stored(5, out + dim0 + 16, d * 4);
    _tile_stored(6, out + dim0 + 32, d * 4);
    _tile_stored(7, out + dim0 + 48, d * 4);
  }
  fence();
}

// Asks Linux for the tiles' register state (once a process; false where it refuses).
bool amx_ready() {
  constexpr int ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
  return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}
#endif

// Int4Linear.forward (with scale_zero; `size` its group) or DenseLinear.forward (without;
// `size` its min_rows) for bfloat16 activations. Int4Linear's operands say its kernel:
// int4_amx's weights are 3-D, longspec::int4_mm's scales float16 or float32, ATen's bfloat16.
Tensor linear(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& scale_zero,
              int64_t size, bool doubled, const std::optional<Tensor>& bias) {
  if (scale_zero) {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
    if (weight.dim() == 3) {    // packed for int4_amx ([tiles, groups, 256]; ATen's is 2-D)
      Tensor y = int4_amx(x, weight, *scale_zero, doubled, false);
      return bias ? y + *bias : y;
    }
#endif
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

// The float32 scores of grouped_attention: the bfloat16 products s [kv, bucket, padded] to
// float times scale, -inf from slot n on, and the block's mask added, each row's block
// columns first put in its `order` when given (the Python path's gather); every element one
// correctly rounded float operation, as ATen's kernels make it.
Tensor scores(const Tensor& s, double scale, int64_t n, int64_t start, int64_t rows,
              int64_t q_len, const std::optional<Tensor>& mask,
              const std::optional<Tensor>& order) {
  int64_t kv_heads = s.size(0), bucket = s.size(1), padded = s.size(2);
  Tensor out = at::empty({kv_heads, bucket, padded}, s.options().dtype(at::kFloat));
  const at::BFloat16* ps = s.const_data_ptr<at::BFloat16>();
  float* po = out.data_ptr<float>();
  float scalef = static_cast<float>(scale);
  for (int64_t i = 0; i < kv_heads * bucket; ++i) {
    for (int64_t j = 0; j < padded; ++j) {
      po[i * padded + j] = j < n ? static_cast<float>(ps[i * padded + j]) * scalef : -INFINITY;
    }
  }
  if (!mask) return out;
  Tensor m = mask->contiguous();
  const at::BFloat16* pm = m.const_data_ptr<at::BFloat16>();
  Tensor ord = order ? order->contiguous() : Tensor();
  const int64_t* pord = order ? ord.const_data_ptr<int64_t>() : nullptr;
  std::vector<float> block(q_len);
  for (int64_t h = 0; h < kv_heads; ++h) {
    for (int64_t r = 0; r < rows; ++r) {
      int64_t t = r % q_len;
      float* row = po + (h * bucket + r) * padded + start;
      std::copy(row, row + q_len, block.begin());
      for (int64_t c = 0; c < q_len; ++c) {
        int64_t from = pord ? pord[t * q_len + c] : c;
        row[c] = block[from] + static_cast<float>(pm[t * q_len + from]);
      }
    }
  }
  return out;
}

// attention.py's pairwise_sum of the partials [kv, chunks, rows, d] (float32) over the chunks,
// then to bfloat16 in grouped_attention's output layout [q_len, heads * d] (rows are
// group x q_len): the same float additions in the same pairs, zero partials included.
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

// attention.py's _tree_tail for bfloat16 values.
Tensor tree_tail(const Tensor& p, const Tensor& values, int64_t rows, int64_t group,
                 int64_t q_len, int64_t shared, int64_t padded, int64_t start,
                 const Tensor& order) {
  int64_t kv_heads = values.size(0), d = values.size(2);
  int64_t tail_len = padded - shared * CHUNK, chunks = tail_len / CHUNK;
  Tensor index = at::arange(shared * CHUNK, padded, p.options().dtype(at::kLong))
                     .repeat({q_len, 1});
  int64_t at_slot = start - shared * CHUNK;
  index.index_put_({Slice(), Slice(at_slot, at_slot + q_len)}, order + start);
  Tensor pt = p.index({Slice(), Slice(None, rows), Slice(shared * CHUNK, None)})
                  .view({kv_heads, group, q_len, tail_len}).transpose(1, 2);
  pt = pt.reshape({kv_heads, q_len, group, chunks, CHUNK}).transpose(2, 3);
  pt = pt.reshape({kv_heads * q_len * chunks, group, CHUNK});
  Tensor tail_values = values.index_select(1, index.flatten());
  Tensor tail = at::bmm(pt, tail_values.view({kv_heads * q_len * chunks, CHUNK, d}));
  tail = tail.view({kv_heads, q_len, chunks, group, d});
  return tail.permute({0, 2, 3, 1, 4}).reshape({kv_heads, chunks, rows, d}).to(at::kFloat);
}

// attention.py's grouped_attention for bfloat16 keys and values.
Tensor grouped_attention(const Tensor& q, const Tensor& key_buf, const Tensor& value_buf,
                         int64_t start, int64_t n, const std::optional<Tensor>& mask,
                         const std::optional<Tensor>& order, int64_t bucket, double scale) {
  int64_t q_len = q.size(0), heads = q.size(1), d = q.size(2);
  int64_t kv_heads = key_buf.size(0), group = heads / kv_heads, rows = group * q_len;
  int64_t padded = (n + CHUNK - 1) / CHUNK * CHUNK;
  int64_t shared = order ? start / CHUNK : padded / CHUNK;   // chunks every row reads
  Tensor qg = q.view({q_len, kv_heads, group, d}).permute({1, 2, 0, 3})
                  .reshape({kv_heads, rows, d});
  if (bucket > rows) qg = at::cat({qg, qg.new_zeros({kv_heads, bucket - rows, d})}, 1);
  Tensor keys = key_buf.as_strided({kv_heads, padded, d}, key_buf.strides());
  Tensor values = value_buf.as_strided({kv_heads, padded, d}, value_buf.strides());
  Tensor s = scores(at::bmm(qg, keys.transpose(1, 2)), scale, n, start, rows, q_len, mask,
                    order);
  Tensor p = at::softmax(s, -1).to(values.scalar_type());
  std::vector<Tensor> parts;
  if (shared) {
    Tensor chunks = p.index({"...", Slice(None, shared * CHUNK)})
                        .view({kv_heads, bucket, shared, CHUNK}).transpose(1, 2);
    Tensor vals = values.index({Slice(), Slice(None, shared * CHUNK)})
                      .reshape({kv_heads * shared, CHUNK, d});
    Tensor out = at::bmm(chunks.reshape({kv_heads * shared, bucket, CHUNK}), vals);
    parts.push_back(out.view({kv_heads, shared, bucket, d})
                        .index({Slice(), Slice(), Slice(None, rows)}).to(at::kFloat));
  }
  if (order) {
    parts.push_back(tree_tail(p, values, rows, group, q_len, shared, padded, start, *order));
  }
  return combine(parts.size() == 1 ? parts[0] : at::cat(parts, 1), q_len);
}


// Attention of a decoding block (a chain or a draft tree) as loops, each query row alone: a
// row's scores, probabilities and output depend on its own query and keys only, never on the
// block around it, so a tree node gets bitwise what its token gets run alone after its
// ancestors. Row (t, head) reads its logical keys in order: slots [0, start), its block slots
// in `order` (ancestors first, by depth; the mask added), then slots [start + q_len, n).
// Scores: q.k in float32, each of 16 lanes summing every 16th product in turn, the lanes then
// pairwise, times scale; on CPUs with AMX, for head sizes a multiple of 32, the tiles' dot
// products instead (tile_scores: every slot's score in slot order, a tree's block then put in
// each row's order; a process uses one or the other throughout). The softmax is ATen's over
// rows padded with -inf to whole chunks (as grouped_attention's); the output sums p * v in
// float32 over each CHUNK of logical columns in order, skipping p == 0 (on AMX, for head sizes
// a multiple of 64, the tiles' sums of bfloat16 p times v, 32 logical columns a step, the steps
// in order: tile_values), and the chunks' partials pairwise (combine, as grouped_attention).
// Heads, key tiles and chunks run in parallel. Two small bfloat16 products through oneDNN
// cost ~25 us each a layer whatever their size.
constexpr int64_t LANES = 16;
typedef float lanes_t __attribute__((vector_size(LANES * sizeof(float))));
typedef uint16_t half_lanes_t __attribute__((vector_size(LANES * sizeof(uint16_t))));
typedef uint32_t bits_t __attribute__((vector_size(LANES * sizeof(uint32_t))));

inline lanes_t load_lanes(const at::BFloat16* src) {
  half_lanes_t h;
  std::memcpy(&h, src, sizeof(h));
  bits_t bits = __builtin_convertvector(h, bits_t) << 16;
  lanes_t out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

inline lanes_t load_lanes(const float* src) {
  lanes_t out;
  std::memcpy(&out, src, sizeof(out));
  return out;
}

// The dot products q_r . k (q float rows of d, a multiple of LANES; k bfloat16) of R = 1 or
// 4 rows into out[r]: lane l sums q[i] k[i] for i = l, l + 16, ... in turn, then lanes l and
// l + 8 are added, then l and l + 4, l and l + 2, l and l + 1. Four rows at once give the same
// sums, their lanes packed into fewer vectors.
template <int R>
[[gnu::always_inline]] inline void dots(const float* q, int64_t d, const at::BFloat16* k,
                                        float* out) {
  lanes_t acc[R] = {};
  for (int64_t i = 0; i < d; i += LANES) {
    lanes_t key = load_lanes(k + i);
    for (int r = 0; r < R; ++r) acc[r] += load_lanes(q + r * d + i) * key;
  }
  if constexpr (R == 1) {
    lanes_t a = acc[0];
    a += __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15, 0, 0, 0, 0, 0, 0, 0, 0);
    a += __builtin_shufflevector(a, a, 4, 5, 6, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    a += __builtin_shufflevector(a, a, 2, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    a += __builtin_shufflevector(a, a, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    out[0] = a[0];
  } else {
    static_assert(R == 4, "dots: 1 or 4 rows");
    // [rows 0, 1 | 8 lanes each], [rows 2, 3 | 8 lanes each]
    lanes_t x01 = __builtin_shufflevector(acc[0], acc[1], 0, 1, 2, 3, 4, 5, 6, 7,
                                          16, 17, 18, 19, 20, 21, 22, 23) +
                  __builtin_shufflevector(acc[0], acc[1], 8, 9, 10, 11, 12, 13, 14, 15,
                                          24, 25, 26, 27, 28, 29, 30, 31);
    lanes_t x23 = __builtin_shufflevector(acc[2], acc[3], 0, 1, 2, 3, 4, 5, 6, 7,
                                          16, 17, 18, 19, 20, 21, 22, 23) +
                  __builtin_shufflevector(acc[2], acc[3], 8, 9, 10, 11, 12, 13, 14, 15,
                                          24, 25, 26, 27, 28, 29, 30, 31);
    // [rows 0..3 | 4 lanes each]
    lanes_t y = __builtin_shufflevector(x01, x23, 0, 1, 2, 3, 8, 9, 10, 11,
                                        16, 17, 18, 19, 24, 25, 26, 27) +
                __builtin_shufflevector(x01, x23, 4, 5, 6, 7, 12, 13, 14, 15,
                                        20, 21, 22, 23, 28, 29, 30, 31);
    // [rows 0..3 | 2 lanes each], then 1
    lanes_t z = __builtin_shufflevector(y, y, 0, 1, 4, 5, 8, 9, 12, 13, 0, 0, 0, 0, 0, 0, 0, 0) +
                __builtin_shufflevector(y, y, 2, 3, 6, 7, 10, 11, 14, 15, 0, 0, 0, 0, 0, 0, 0, 0);
    lanes_t w = __builtin_shufflevector(z, z, 0, 2, 4, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0) +
                __builtin_shufflevector(z, z, 1, 3, 5, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    for (int r = 0; r < 4; ++r) out[r] = w[r];
  }
}

inline float dot(const float* q, const at::BFloat16* k, int64_t d) {
  float out;
  dots<1>(q, d, k, &out);
  return out;
}

// acc_r += w_r * v (bfloat16) for R rows of acc (d apart), skipping w_r == 0
template <int R>
[[gnu::always_inline]] inline void add_scaled(float* acc, const float* w, const at::BFloat16* v,
                                              int64_t d) {
  for (int64_t i = 0; i < d; i += LANES) {
    lanes_t value = load_lanes(v + i);
    for (int r = 0; r < R; ++r) {
      if (w[r] == 0.0f) continue;
      lanes_t sum = load_lanes(acc + r * d + i) + w[r] * value;
      std::memcpy(acc + r * d + i, &sum, sizeof(sum));
    }
  }
}

// A float32 buffer of this shape, reused across calls while it stays under SCRATCH_FLOATS
// (a decoding step's scores: fresh allocations of this size cost page faults every call).
// Every element is written before it is read.
constexpr int64_t SCRATCH_FLOATS = 1 << 20;

Tensor scratch(int slot, at::IntArrayRef shape) {
  thread_local std::vector<float> buffers[3];
  int64_t size = c10::multiply_integers(shape);
  if (size > SCRATCH_FLOATS) return at::empty(shape, at::kFloat);
  std::vector<float>& buffer = buffers[slot];
  if (static_cast<int64_t>(buffer.size()) < size) buffer.resize(size);
  return at::from_blob(buffer.data(), shape, at::kFloat);
}

// The scores of keys [j0, j1) for `count` (at most 4) query rows from q (rows d apart, 4 of
// them readable) into out (rows `stride` apart), times scale; D: d known when compiled (0: not).
template <int64_t D>
void score_keys(const float* __restrict__ q, int64_t d, const at::BFloat16* __restrict__ keys,
                int64_t ks, int64_t j0, int64_t j1, float* __restrict__ out, int64_t stride,
                int64_t count, float scale) {
  for (int64_t j = j0; j < j1; ++j) {
    float four[4];
    dots<4>(q, D ? D : d, keys + j * ks, four);
    for (int64_t i = 0; i < count; ++i) out[i * stride + j] = four[i] * scale;
  }
}

// acc (4 rows of d) += p * v over keys [j0, j1), in order, for `count` rows of probabilities
// (rows `stride` apart), skipping p == 0; D as for score_keys. With D known, 64 columns at a
// time stay in registers over all the keys (each element's sum still runs over the keys in
// order: the same operations as add_scaled's).
template <int64_t D>
void accumulate_keys(float* __restrict__ acc, const float* __restrict__ p, int64_t stride,
                     int64_t count, const at::BFloat16* __restrict__ values, int64_t vs,
                     int64_t j0, int64_t j1, int64_t d) {
  if constexpr (D % 64 == 0 && D > 0) {
    constexpr int64_t V = 64 / LANES;
    for (int64_t c = 0; c < D; c += 64) {
      lanes_t a[4][V];
      for (int r = 0; r < 4; ++r)
        for (int64_t i = 0; i < V; ++i) a[r][i] = load_lanes(acc + r * D + c + i * LANES);
      for (int64_t j = j0; j < j1; ++j) {
        float w[4] = {};
        for (int64_t i = 0; i < count; ++i) w[i] = p[i * stride + j];
        const at::BFloat16* v = values + j * vs + c;
        for (int64_t i = 0; i < V; ++i) {
          lanes_t value = load_lanes(v + i * LANES);
          for (int r = 0; r < 4; ++r)
            if (w[r] != 0.0f) a[r][i] = a[r][i] + w[r] * value;
        }
      }
      for (int r = 0; r < 4; ++r)
        for (int64_t i = 0; i < V; ++i)
          std::memcpy(acc + r * D + c + i * LANES, &a[r][i], sizeof(lanes_t));
    }
  } else {
    for (int64_t j = j0; j < j1; ++j) {
      float w[4] = {};
      for (int64_t i = 0; i < count; ++i) w[i] = p[i * stride + j];
      add_scaled<4>(acc, w, values + j * vs, D ? D : d);
    }
  }
}

using ScoreKeys = decltype(&score_keys<0>);
using AccumulateKeys = decltype(&accumulate_keys<0>);

// keys to a tile: a tile's keys are read from memory once for all the rows of a head
constexpr int64_t TILE = 64;

Tensor loop_attention(const Tensor& q, const Tensor& key_buf, const Tensor& value_buf,
                      int64_t start, int64_t n, const std::optional<Tensor>& mask,
                      const std::optional<Tensor>& order, double scale, bool tiles_on) {
  int64_t q_len = q.size(0), heads = q.size(1), d = q.size(2);
  int64_t kv_heads = key_buf.size(0), rows = heads / kv_heads * q_len;   // rows of a head
  int64_t padded = (n + CHUNK - 1) / CHUNK * CHUNK, end = start + q_len;
  int64_t tiles = (n + TILE - 1) / TILE;
  TORCH_CHECK(d % LANES == 0 && q.stride(2) == 1 && key_buf.stride(2) == 1 &&
              value_buf.stride(2) == 1, "loop_attention: unexpected layout");
  const at::BFloat16* pk = key_buf.const_data_ptr<at::BFloat16>();
  const at::BFloat16* pv = value_buf.const_data_ptr<at::BFloat16>();
  int64_t ks = key_buf.stride(1), vs = value_buf.stride(1);
  Tensor m = mask ? mask->contiguous() : Tensor();
  const at::BFloat16* pm = mask ? m.const_data_ptr<at::BFloat16>() : nullptr;
  Tensor ord = order ? order->contiguous() : Tensor();
  const int64_t* pord = order ? ord.const_data_ptr<int64_t>() : nullptr;
  auto block_slot = [&](int64_t t, int64_t c) { return pord ? pord[t * q_len + c] : c; };
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  bool on_tiles = tiles_on && d % 32 == 0;
#else
  TORCH_CHECK(!tiles_on, "loop_attention: built without AMX");
  bool on_tiles = false;
#endif
  // row (query head hq, token t) is row hq * q_len + t: head h's rows are [h * rows, +rows)
  // (and 3 zero rows after the last, so that rows go four at a time); the vector scores' only
  Tensor qf = on_tiles ? Tensor()
                       : at::cat({q.to(at::kFloat).transpose(0, 1).reshape({heads * q_len, d}),
                                  at::zeros({3, d}, q.options().dtype(at::kFloat))});
  const float* pq = on_tiles ? nullptr : qf.const_data_ptr<float>();
  Tensor s = scratch(0, {heads * q_len, padded});
  float* ps = s.data_ptr<float>();
  float scalef = static_cast<float>(scale);
  ScoreKeys score = d == 64 ? score_keys<64> : d == 128 ? score_keys<128> : score_keys<0>;
  AccumulateKeys accumulate = d == 64    ? accumulate_keys<64>
                              : d == 128 ? accumulate_keys<128>
                                         : accumulate_keys<0>;
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  // on the tiles, the scores of every slot, the block's in slot order, a (head, tile) at a time
  if (on_tiles) {
    Tensor qb = q.transpose(0, 1).reshape({heads * q_len, d}).contiguous();
    std::vector<uint16_t> qt = query_tiles(
        reinterpret_cast<const uint16_t*>(qb.const_data_ptr<at::BFloat16>()), kv_heads, rows, d);
    int64_t per_head = qt.size() / kv_heads;
    at::parallel_for(0, kv_heads * tiles, 1, [&](int64_t first, int64_t last) {
      configure_tiles(TILE_ROWS);
      for (int64_t unit = first; unit < last; ++unit) {
        int64_t h = unit / tiles, from = unit % tiles * TILE, to = std::min(from + TILE, n);
        tile_scores(qt.data() + h * per_head, rows, d,
                    reinterpret_cast<const uint16_t*>(pk + h * key_buf.stride(0)), ks, from, to,
                    scalef, ps + h * rows * padded, padded);
      }
      _tile_release();
    });
  }
#endif
  // scores of the slots outside the block, a (head, tile) at a time
  if (!on_tiles) at::parallel_for(0, kv_heads * tiles, 1, [&](int64_t first, int64_t last) {
    for (int64_t unit = first; unit < last; ++unit) {
      int64_t h = unit / tiles, from = unit % tiles * TILE, to = std::min(from + TILE, n);
      const at::BFloat16* keys = pk + h * key_buf.stride(0);
      for (int64_t r = h * rows; r < (h + 1) * rows; r += 4) {
        int64_t count = std::min<int64_t>(4, (h + 1) * rows - r);
        auto run = [&](int64_t j0, int64_t j1) {
          if (j0 < j1) score(pq + r * d, d, keys, ks, j0, j1, ps + r * padded, padded, count,
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
      // on the tiles, the block's scores in slot order, to be put in the row's order
      std::vector<float> in_slots(on_tiles && pord ? q_len : 0);
      std::copy(out + start, out + start + in_slots.size(), in_slots.begin());
      for (int64_t c = 0; pm && c < q_len; ++c) {
        int64_t from = block_slot(t, c);
        float add = static_cast<float>(pm[t * q_len + from]);
        if (add == -INFINITY) {
          out[start + c] = -INFINITY;
        } else {
          float v = !pord     ? out[start + c]
                    : on_tiles ? in_slots[from]
                               : dot(pq + row * d, keys + (start + from) * ks, d) * scalef;
          out[start + c] = v + add;
        }
      }
      std::fill(out + n, out + padded, -INFINITY);
    }
  });
  Tensor p = scratch(1, {heads * q_len, padded});
  at::_softmax_out(p, s, -1, false);
  const float* pp = p.const_data_ptr<float>();
  // each chunk's partial outputs, a (head, chunk, four rows) at a time; then their pairwise sum
  int64_t chunks = padded / CHUNK, blocks = (rows + 3) / 4;
  Tensor partials = scratch(2, {kv_heads, chunks, rows, d});
  float* pout = partials.data_ptr<float>();
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  // on the tiles, a (head, chunk, 16 rows) at a time
  if (on_tiles && d % 64 == 0) {
    Tensor pb = p.to(at::kBFloat16);
    const uint16_t* ppb = reinterpret_cast<const uint16_t*>(pb.const_data_ptr<at::BFloat16>());
    int64_t groups = (rows + TILE_ROWS - 1) / TILE_ROWS;
    // row's logical key j: its slot, a tree's block in the row's order
    auto slot = [&](int64_t row, int64_t j) -> int64_t {
      if (j >= n) return -1;
      if (row < 0 || !pord || j < start || j >= end) return j;
      return start + block_slot(row % q_len, j - start);
    };
    auto per_row = [&](int64_t j) { return pord && j + 32 > start && j < end; };
    at::parallel_for(0, kv_heads * chunks * groups, 1, [&](int64_t first, int64_t last) {
      int64_t configured = 0;
      for (int64_t unit = first; unit < last; ++unit) {
        int64_t h = unit / (chunks * groups), chunk = unit / groups % chunks;
        int64_t r0 = h * rows + unit % groups * TILE_ROWS;
        int64_t m = std::min(TILE_ROWS, (h + 1) * rows - r0);
        if (m != configured) configure_value_tiles(configured = m);
        tile_values(ppb, padded, r0, m,
                    reinterpret_cast<const uint16_t*>(pv + h * value_buf.stride(0)), vs, d,
                    chunk * CHUNK, std::min((chunk + 1) * CHUNK, n), slot, per_row,
                    pout + ((h * chunks + chunk) * rows + r0 - h * rows) * d);
      }
      _tile_release();
    });
    return combine(partials, q_len);
  }
#endif
  at::parallel_for(0, kv_heads * chunks * blocks, 1, [&](int64_t first, int64_t last) {
    std::vector<float> acc(4 * d);
    for (int64_t unit = first; unit < last; ++unit) {
      int64_t h = unit / (chunks * blocks), chunk = unit / blocks % chunks;
      int64_t r0 = h * rows + unit % blocks * 4, r1 = std::min(r0 + 4, (h + 1) * rows);
      const at::BFloat16* values = pv + h * value_buf.stride(0);
      std::fill(acc.begin(), acc.end(), 0.0f);
      int64_t c0 = chunk * CHUNK, c1 = std::min((chunk + 1) * CHUNK, n);
      auto run = [&](int64_t j0, int64_t j1) {
        if (j0 < j1)
          accumulate(acc.data(), pp + r0 * padded, padded, r1 - r0, values, vs, j0, j1, d);
      };
      if (!pord) {
        run(c0, c1);
      } else {
        run(c0, std::min(c1, start));
        for (int64_t j = std::max(c0, start); j < std::min(c1, end); ++j)
          for (int64_t row = r0; row < r1; ++row)
            add_scaled<1>(acc.data() + (row - r0) * d, pp + row * padded + j,
                          values + (start + block_slot(row % q_len, j - start)) * vs, d);
        run(std::max(c0, end), c1);
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

// The decoder layers of one model (transformer.py's Blocks), given once at load: per layer l,
// products[4 l .. 4 l + 3] are its q|k|v, output, gate|up and down; norms[2 l], norms[2 l + 1]
// its attention and MLP norms; qk_norms (empty or 2 per layer) Qwen3's query and key norms.
// `min_bucket` is the fewest rows grouped_attention's products take; `loops` says whether attention runs as
// loop_attention (on the AMX tiles where `tiles`).
struct Layers {
  std::vector<Tensor> norms, qk_norms;
  std::vector<std::vector<Part>> products;
  int64_t heads = 0, kv_heads = 0, head_dim = 0, min_bucket = 0;
  double eps = 0, scale = 0;
  bool loops = false, tiles = false;

  // Every layer over x [q, hidden] with RoPE's cos and sin; the block goes to the layers'
  // cache slots [start, start + q) of `keys` and `values` and attends to slots [0, n), with
  // `plan`'s block mask and block order ((start, n, mask, order): cache/base.py's
  // AttentionPlan). Returns the output [q, hidden] and, when asked for, each layer's rotated
  // query of the last token [heads, head_dim].
  std::tuple<Tensor, std::vector<Tensor>> forward(
      Tensor x, const Tensor& cos, const Tensor& sin, const std::vector<Tensor>& keys,
      const std::vector<Tensor>& values,
      const std::tuple<int64_t, int64_t, std::optional<Tensor>, std::optional<Tensor>>& plan,
      bool want_queries) const {
    const auto& [start, n, mask, order] = plan;
    int64_t q_len = x.size(0);
    int64_t bucket = std::max(heads / kv_heads * q_len, min_bucket);
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
      keys[l].index({Slice(), Slice(start, start + q_len)}).copy_(k.transpose(0, 1));
      values[l].index({Slice(), Slice(start, start + q_len)}).copy_(v.transpose(0, 1));
      Tensor out = loops ? loop_attention(q, keys[l], values[l], start, n, mask, order, scale,
                                          tiles)
                         : grouped_attention(q, keys[l], values[l], start, n, mask, order,
                                             bucket, scale);
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
  py::class_<Layers>(m, "Layers", "every decoder layer of a bfloat16 CPU model")
      .def(py::init<>())
      .def_readwrite("norms", &Layers::norms)
      .def_readwrite("qk_norms", &Layers::qk_norms)
      .def_readwrite("products", &Layers::products)
      .def_readwrite("heads", &Layers::heads)
      .def_readwrite("kv_heads", &Layers::kv_heads)
      .def_readwrite("head_dim", &Layers::head_dim)
      .def_readwrite("min_bucket", &Layers::min_bucket)
      .def_readwrite("eps", &Layers::eps)
      .def_readwrite("scale", &Layers::scale)
      .def_readwrite("loops", &Layers::loops)
      .def_readwrite("tiles", &Layers::tiles)
      .def("forward", &Layers::forward, "every layer over a block");
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  m.def("int4_amx", &int4_amx, "the int4 product on AMX tiles");
  m.def("amx_ready", &amx_ready, "whether Linux lets this process use the AMX tiles");
#endif
}
