// circle-jax's CPU kernels for the 3x3 depthwise convolution, as XLA FFI custom calls
// (setup.py builds them, circle_jax/lowering/cpu_kernels.py loads and registers them; the readable
// reference they are tested against is circle_jax/lowering/depthwise.py).
//
// Layout NHWC, one weight per (tap, channel), stride 1 or 2 in both directions, dilation
// 1, padding pad_top / pad_left (bottom and right follow from the output's size):
//
//   circle_jax_depthwise_forward:         out[n, oy, ox, c] = sum_k x(n, oy*s+ky-pt, ox*s+kx-pl, c) * w[k, c]
//   circle_jax_depthwise_weight_gradient: dw[k, c] = sum_{n, oy, ox} x(n, oy*s+ky-pt, ox*s+kx-pl, c) * ct[n, oy, ox, c]
//
// with k = 3 * ky + kx and x() zero outside the input; and the layer with its bias and a
// clamping activation (RELU, RELU6, RELU_N1_TO_1: the range [lo, hi], hi = +inf for RELU):
//
//   circle_jax_depthwise_clamped_forward:  y = clamp(forward(x, w) + b, lo, hi)
//   circle_jax_depthwise_masked_gradient:  g = ct where lo < y < hi (else 0; y < +inf is not
//                                          asked of RELU), and dwb = [weight_gradient(x, g);
//                                          sum_{n, oy, ox} g] ([10, C]), in one pass; g is
//                                          not written where it is given empty.
//
// float32 only; vectorized over the channels (the contiguous axis) with GCC vector
// extensions, built per instruction-set level without fused multiply-adds (setup.py).
//
// Threads: the samples are cut into chunks that XLA's intra-op thread pool and the calling
// thread take from a shared counter. The weight gradient sums each chunk's partial sums in
// chunk order, and the chunks depend on the batch alone (not on the thread count), so a
// result is the same bits however many threads ran it.

#include <vector>

#include "common.h"

namespace {

using namespace circle_jax;

constexpr char kKernel[] = "depthwise kernel";

// The three input rows tap row ky = 0, 1, 2 reads for output row oy (zeros outside).
inline void rows_for(const Shape& s, const float* sample, int64_t oy, const float* zeros,
                     const float* r[3]) {
  for (int ky = 0; ky < 3; ++ky) {
    int64_t iy = oy * s.stride + ky - s.pad_top;
    r[ky] = (iy >= 0 && iy < s.h) ? sample + iy * s.w * s.c : zeros;
  }
}

// Column ix of the three rows (zeros outside the input).
template <int L>
inline void column(const Shape& s, const float* const r[3], int64_t ix,
                   typename Lanes<L>::type v[3]) {
  if (ix >= 0 && ix < s.w) {
    for (int ky = 0; ky < 3; ++ky) v[ky] = load<L>(r[ky] + ix * s.c);
  } else {
    for (int ky = 0; ky < 3; ++ky) v[ky] = typename Lanes<L>::type{};
  }
}

// Walks output row oy of one channel block, calling visit(ox, window) with the 3x3 input
// window (window[kx][ky]) each output position reads; consecutive windows share columns.
template <int L, int S, class Visit>
inline void walk_row(const Shape& s, const float* const r[3], Visit visit) {
  using V = typename Lanes<L>::type;
  V win[3][3];
  column<L>(s, r, -s.pad_left, win[0]);
  if (S == 1) column<L>(s, r, 1 - s.pad_left, win[1]);
  for (int64_t ox = 0; ox < s.ow; ++ox) {
    int64_t left = ox * S - s.pad_left;
    if (S != 1) column<L>(s, r, left + 1, win[1]);
    column<L>(s, r, left + 2, win[2]);
    visit(ox, win);
    for (int ky = 0; ky < 3; ++ky) {
      if (S == 1) {
        win[0][ky] = win[1][ky];
        win[1][ky] = win[2][ky];
      } else {
        win[0][ky] = win[2][ky];
      }
    }
  }
}

// The forward product of samples [n0, n1); with Clamp, plus the bias b, clamped to r.
template <int L, int S, bool Clamp>
void forward_samples(const Shape& s, const float* x, const float* w, const float* b,
                     Range range, float* out, int64_t n0, int64_t n1, const float* zeros) {
  using V = typename Lanes<L>::type;
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t c0 = 0; c0 < s.c; c0 += L) {
      const V bias = Clamp ? load<L>(b + c0) : V{};
      V wk[3][3];
      for (int ky = 0; ky < 3; ++ky)
        for (int kx = 0; kx < 3; ++kx) wk[kx][ky] = load<L>(w + (3 * ky + kx) * s.c + c0);
      const float* sample = x + n * s.h * s.w * s.c + c0;
      float* result = out + n * s.oh * s.ow * s.c + c0;
      for (int64_t oy = 0; oy < s.oh; ++oy) {
        const float* r[3];
        rows_for(s, sample, oy, zeros, r);
        float* row = result + oy * s.ow * s.c;
        walk_row<L, S>(s, r, [&](int64_t ox, const V (&win)[3][3]) {
          V top = win[0][0] * wk[0][0] + win[1][0] * wk[1][0] + win[2][0] * wk[2][0];
          V mid = win[0][1] * wk[0][1] + win[1][1] * wk[1][1] + win[2][1] * wk[2][1];
          V low = win[0][2] * wk[0][2] + win[1][2] * wk[1][2] + win[2][2] * wk[2][2];
          V v = top + mid + low;
          store<L>(row + ox * s.c, Clamp ? clamp<L>(v + bias, range) : v);
        });
      }
    }
  }
}

// acc[kx][ky] += win[kx][ky] * g: one output position's terms of the nine taps' sums.
template <int L>
inline void accumulate(typename Lanes<L>::type (&acc)[3][3],
                       const typename Lanes<L>::type (&win)[3][3], typename Lanes<L>::type g) {
  for (int kx = 0; kx < 3; ++kx)
    for (int ky = 0; ky < 3; ++ky) acc[kx][ky] += win[kx][ky] * g;
}

// Adds the nine taps' sums acc of channel block c0 to sums [9, C] (tap k = 3 * ky + kx).
template <int L>
inline void add_taps(float* sums, int64_t c, int64_t c0,
                     const typename Lanes<L>::type (&acc)[3][3]) {
  for (int ky = 0; ky < 3; ++ky)
    for (int kx = 0; kx < 3; ++kx) {
      float* at = sums + (3 * ky + kx) * c + c0;
      store<L>(at, load<L>(at) + acc[kx][ky]);
    }
}

// Adds the weight gradient of samples [n0, n1) to sums [9, C]: per sample, per channel
// block, nine accumulators (one per tap) over its output positions, then added to sums.
template <int L, int S>
void weight_gradient_samples(const Shape& s, const float* x, const float* ct, float* sums,
                             int64_t n0, int64_t n1, const float* zeros) {
  using V = typename Lanes<L>::type;
  for (int64_t c0 = 0; c0 < s.c; c0 += L) {
    for (int64_t n = n0; n < n1; ++n) {
      V acc[3][3] = {};
      const float* sample = x + n * s.h * s.w * s.c + c0;
      const float* grad = ct + n * s.oh * s.ow * s.c + c0;
      for (int64_t oy = 0; oy < s.oh; ++oy) {
        const float* r[3];
        rows_for(s, sample, oy, zeros, r);
        const float* row = grad + oy * s.ow * s.c;
        walk_row<L, S>(s, r, [&](int64_t ox, const V (&win)[3][3]) {
          V g = load<L>(row + ox * s.c);
          accumulate<L>(acc, win, g);
        });
      }
      add_taps<L>(sums, s.c, c0, acc);
    }
  }
}

// Adds the masked weight and bias gradient of samples [n0, n1) to sums [10, C] (taps, then
// the bias) and writes their masked cotangent g (see the header) in the same pass.
template <int L, int S>
void masked_gradient_samples(const Shape& s, const float* x, const float* y, const float* ct,
                             Range range, float* g, float* sums, int64_t n0, int64_t n1,
                             const float* zeros) {
  using V = typename Lanes<L>::type;
  for (int64_t c0 = 0; c0 < s.c; c0 += L) {
    for (int64_t n = n0; n < n1; ++n) {
      V acc[3][3] = {}, bias = {};
      const float* sample = x + n * s.h * s.w * s.c + c0;
      const int64_t at = n * s.oh * s.ow * s.c + c0;
      for (int64_t oy = 0; oy < s.oh; ++oy) {
        const float* r[3];
        rows_for(s, sample, oy, zeros, r);
        const int64_t row = at + oy * s.ow * s.c;
        walk_row<L, S>(s, r, [&](int64_t ox, const V (&win)[3][3]) {
          const int64_t i = row + ox * s.c;
          V d = masked<L>(load<L>(y + i), load<L>(ct + i), range);
          if (g) store<L>(g + i, d);
          bias += d;
          accumulate<L>(acc, win, d);
        });
      }
      add_taps<L>(sums, s.c, c0, acc);
      store<L>(sums + 9 * s.c + c0, load<L>(sums + 9 * s.c + c0) + bias);
    }
  }
}

ffi::Error Forward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                   ffi::ResultBuffer<ffi::F32> out, int64_t stride, int64_t pad_top,
                   int64_t pad_left) {
  Shape s;
  if (auto e = read_shape(kKernel, x.dimensions(), out->dimensions(), stride, pad_top,
                          pad_left, &s); e.failure())
    return e;
  if (s.o != s.c || w.element_count() != static_cast<size_t>(9 * s.c))
    return ffi::Error::InvalidArgument("depthwise kernel: w [9, C] and C output channels");
  std::vector<float> zeros(s.w * s.c + 16, 0.0f);
  const float* z = zeros.data();
  const float* xp = x.typed_data();
  const float* wp = w.typed_data();
  float* op = out->typed_data();
  by_lanes(s.c, [&](auto lanes) {
    constexpr int L = decltype(lanes)::value;
    for_samples(pool, s.n, [&](int64_t n0, int64_t n1) {
      if (s.stride == 1) forward_samples<L, 1, false>(s, xp, wp, nullptr, {}, op, n0, n1, z);
      else forward_samples<L, 2, false>(s, xp, wp, nullptr, {}, op, n0, n1, z);
    });
  });
  return ffi::Error::Success();
}

ffi::Error WeightGradient(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                          ffi::Buffer<ffi::F32> ct, ffi::ResultBuffer<ffi::F32> dw,
                          int64_t stride, int64_t pad_top, int64_t pad_left) {
  Shape s;
  if (auto e = read_shape(kKernel, x.dimensions(), ct.dimensions(), stride, pad_top, pad_left,
                          &s); e.failure())
    return e;
  if (s.o != s.c || dw->element_count() != static_cast<size_t>(9 * s.c))
    return ffi::Error::InvalidArgument("depthwise kernel: dw [9, C] and C output channels");
  std::vector<float> zeros(s.w * s.c + 16, 0.0f);
  const float* xp = x.typed_data();
  const float* cp = ct.typed_data();
  by_lanes(s.c, [&](auto lanes) {
    constexpr int L = decltype(lanes)::value;
    sum_samples(pool, s.n, 9 * s.c, dw->typed_data(), [&](float* sums, int64_t n0, int64_t n1) {
      if (s.stride == 1) weight_gradient_samples<L, 1>(s, xp, cp, sums, n0, n1, zeros.data());
      else weight_gradient_samples<L, 2>(s, xp, cp, sums, n0, n1, zeros.data());
    });
  });
  return ffi::Error::Success();
}

ffi::Error ClampedForward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                          ffi::Buffer<ffi::F32> w, ffi::Buffer<ffi::F32> b,
                          ffi::ResultBuffer<ffi::F32> out, int64_t stride, int64_t pad_top,
                          int64_t pad_left, float lo, float hi) {
  Shape s;
  if (auto e = read_shape(kKernel, x.dimensions(), out->dimensions(), stride, pad_top,
                          pad_left, &s); e.failure())
    return e;
  if (s.o != s.c || w.element_count() != static_cast<size_t>(9 * s.c) ||
      b.element_count() != static_cast<size_t>(s.c))
    return ffi::Error::InvalidArgument(
        "depthwise kernel: w [9, C], b [C] and C output channels");
  std::vector<float> zeros(s.w * s.c + 16, 0.0f);
  const float* z = zeros.data();
  const float *xp = x.typed_data(), *wp = w.typed_data(), *bp = b.typed_data();
  float* op = out->typed_data();
  const Range r{lo, hi};
  by_lanes(s.c, [&](auto lanes) {
    constexpr int L = decltype(lanes)::value;
    for_samples(pool, s.n, [&](int64_t n0, int64_t n1) {
      if (s.stride == 1) forward_samples<L, 1, true>(s, xp, wp, bp, r, op, n0, n1, z);
      else forward_samples<L, 2, true>(s, xp, wp, bp, r, op, n0, n1, z);
    });
  });
  return ffi::Error::Success();
}

ffi::Error MaskedGradient(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                          ffi::Buffer<ffi::F32> y, ffi::Buffer<ffi::F32> ct,
                          ffi::ResultBuffer<ffi::F32> g, ffi::ResultBuffer<ffi::F32> dwb,
                          int64_t stride, int64_t pad_top, int64_t pad_left, float lo,
                          float hi) {
  Shape s;
  auto rows = [](const Shape&) { return int64_t{10}; };
  if (auto e = read_masked_shape(kKernel, x, y, ct, g, dwb, rows, stride, pad_top, pad_left,
                                 &s); e.failure())
    return e;
  if (s.o != s.c) return ffi::Error::InvalidArgument("depthwise kernel: C output channels");
  std::vector<float> zeros(s.w * s.c + 16, 0.0f);
  const float *xp = x.typed_data(), *yp = y.typed_data(), *cp = ct.typed_data();
  float* gp = g->element_count() ? g->typed_data() : nullptr;
  const Range r{lo, hi};
  by_lanes(s.c, [&](auto lanes) {
    constexpr int L = decltype(lanes)::value;
    sum_samples(pool, s.n, 10 * s.c, dwb->typed_data(),
                [&](float* sums, int64_t n0, int64_t n1) {
      if (s.stride == 1)
        masked_gradient_samples<L, 1>(s, xp, yp, cp, r, gp, sums, n0, n1, zeros.data());
      else
        masked_gradient_samples<L, 2>(s, xp, yp, cp, r, gp, sums, n0, n1, zeros.data());
    });
  });
  return ffi::Error::Success();
}

}  // namespace

extern "C" const char* circle_jax_depthwise_level() { return CIRCLE_JAX_LEVEL; }

XLA_FFI_DEFINE_HANDLER_SYMBOL(circle_jax_depthwise_forward, Forward,
                              circle_jax::convolution_binding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(circle_jax_depthwise_weight_gradient, WeightGradient,
                              circle_jax::convolution_binding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(circle_jax_depthwise_clamped_forward, ClampedForward,
                              circle_jax::clamped_binding<1>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(circle_jax_depthwise_masked_gradient, MaskedGradient,
                              circle_jax::clamped_binding<2>());
