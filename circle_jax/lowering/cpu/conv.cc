// circle-jax's CPU kernels for a 3x3 convolution of few input channels (an image's first
// layer), as XLA FFI custom calls (setup.py builds them, circle_jax/lowering/cpu_kernels.py loads them; the
// readable reference is circle_jax/lowering/few_channels.py's im2col form).
//
// Layout NHWC, filter [3, 3, I, O] (ky, kx, input channel, output channel), stride 1 or 2
// in both directions, dilation 1, padding pad_top / pad_left (bottom and right follow from
// the output's size):
//
//   circle_jax_conv3x3_forward:         out[n, oy, ox, o] = sum_{ky, kx, i} x(n, oy*s+ky-pt, ox*s+kx-pl, i) * w[ky, kx, i, o]
//   circle_jax_conv3x3_weight_gradient: dw[ky, kx, i, o] = sum_{n, oy, ox} x(n, oy*s+ky-pt, ox*s+kx-pl, i) * ct[n, oy, ox, o]
//
// with x() zero outside the input; and the layer with its bias and a clamping activation
// (RELU, RELU6, RELU_N1_TO_1: the range [lo, hi], hi = +inf for RELU):
//
//   circle_jax_conv3x3_clamped_forward:  y = clamp(forward(x, w) + b, lo, hi)
//   circle_jax_conv3x3_masked_gradient:  g = ct where lo < y < hi (else 0), and
//                                        dwb = [weight_gradient(x, g) as [9 * I, O];
//                                        sum_{n, oy, ox} g], in one pass; g is written
//                                        where it is not given empty.
//
// float32; vectorized over the output channels. im2col
// would materialize nine shifted copies of the input and concatenate them (two passes over
// nine times the input) before its matrix products.

#include "common.h"

namespace {

using namespace circle_jax;

constexpr char kKernel[] = "3x3 convolution kernel";

// Calls visit(k, pixel) for each of the 9 taps of output (oy, ox) that reads inside the
// input: k = 3 * ky + kx, pixel the input's channels there.
template <class Visit>
inline void taps_of(const Shape& s, const float* sample, int64_t oy, int64_t ox, Visit visit) {
  for (int ky = 0; ky < 3; ++ky) {
    int64_t iy = oy * s.stride + ky - s.pad_top;
    if (iy < 0 || iy >= s.h) continue;
    for (int kx = 0; kx < 3; ++kx) {
      int64_t ix = ox * s.stride + kx - s.pad_left;
      if (ix < 0 || ix >= s.w) continue;
      visit(3 * ky + kx, sample + (iy * s.w + ix) * s.c);
    }
  }
}

// The forward product of samples [n0, n1); with Clamp, plus the bias b, clamped to range.
template <int L, int C, bool Clamp>
void forward_samples(const Shape& s, const float* x, const float* w, const float* b,
                     Range range, float* out, int64_t n0, int64_t n1) {
  using V = typename Lanes<L>::type;
  for (int64_t o0 = 0; o0 < s.o; o0 += L) {
    const V bias = Clamp ? load<L>(b + o0) : V{};
    V wk[9][C];  // this block of output channels' filter, kept in registers
    for (int k = 0; k < 9; ++k)
      for (int i = 0; i < C; ++i) wk[k][i] = load<L>(w + (k * C + i) * s.o + o0);
    for (int64_t n = n0; n < n1; ++n) {
      const float* sample = x + n * s.h * s.w * s.c;
      for (int64_t oy = 0; oy < s.oh; ++oy)
        for (int64_t ox = 0; ox < s.ow; ++ox) {
          V acc{};
          taps_of(s, sample, oy, ox, [&](int k, const float* pixel) {
            for (int i = 0; i < C; ++i) acc += pixel[i] * wk[k][i];
          });
          store<L>(out + ((n * s.oh + oy) * s.ow + ox) * s.o + o0,
                   Clamp ? clamp<L>(acc + bias, range) : acc);
        }
    }
  }
}

// Adds the weight gradient of samples [n0, n1) to sums [9 * C, O]: per sample and block of
// output channels, one accumulator per (tap, input channel), then added to sums. With
// Masked, the cotangent is ct masked by the clamped output y (`masked`), written to g
// unless g is null, and its sum over the samples' positions is added to the bias row
// sums[9 * C] too.
template <int L, int C, bool Masked>
void weight_gradient_samples(const Shape& s, const float* x, const float* ct, const float* y,
                             Range range, float* g, float* sums, int64_t n0, int64_t n1) {
  using V = typename Lanes<L>::type;
  for (int64_t o0 = 0; o0 < s.o; o0 += L) {
    for (int64_t n = n0; n < n1; ++n) {
      V acc[9][C] = {}, bias = {};
      const float* sample = x + n * s.h * s.w * s.c;
      for (int64_t oy = 0; oy < s.oh; ++oy)
        for (int64_t ox = 0; ox < s.ow; ++ox) {
          const int64_t at = ((n * s.oh + oy) * s.ow + ox) * s.o + o0;
          V d = load<L>(ct + at);
          if (Masked) {
            d = masked<L>(load<L>(y + at), d, range);
            if (g) store<L>(g + at, d);
            bias += d;
          }
          taps_of(s, sample, oy, ox, [&](int k, const float* pixel) {
            for (int i = 0; i < C; ++i) acc[k][i] += pixel[i] * d;
          });
        }
      for (int k = 0; k < 9; ++k)
        for (int i = 0; i < C; ++i) {
          float* at = sums + (k * C + i) * s.o + o0;
          store<L>(at, load<L>(at) + acc[k][i]);
        }
      if (Masked) store<L>(sums + 9 * C * s.o + o0, load<L>(sums + 9 * C * s.o + o0) + bias);
    }
  }
}

//: the most input channels the kernels take (the accumulators of the weight gradient)
constexpr int64_t kMaxChannels = 4;

// The sizes read from x and y (`read_shape`) of a convolution of 1 to kMaxChannels input
// channels and a filter of 9 * C * O elements.
template <class Dims>
ffi::Error read_conv_shape(const Dims& x, const Dims& y, size_t filter, int64_t stride,
                           int64_t pad_top, int64_t pad_left, Shape* s) {
  if (auto e = read_shape(kKernel, x, y, stride, pad_top, pad_left, s); e.failure()) return e;
  if (s->c > kMaxChannels)
    return ffi::Error::InvalidArgument("3x3 convolution kernel: 1 to 4 input channels");
  if (filter != static_cast<size_t>(9 * s->c * s->o))
    return ffi::Error::InvalidArgument("3x3 convolution kernel: a filter [3, 3, I, O]");
  return ffi::Error::Success();
}

// Calls run(std::integral_constant<int, C>()) with the input's channel count C (1 to 4).
template <class Run>
void by_channels(int64_t c, Run run) {
  switch (c) {
    case 1: run(std::integral_constant<int, 1>()); break;
    case 2: run(std::integral_constant<int, 2>()); break;
    case 3: run(std::integral_constant<int, 3>()); break;
    default: run(std::integral_constant<int, 4>()); break;
  }
}

ffi::Error Forward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                   ffi::ResultBuffer<ffi::F32> out, int64_t stride, int64_t pad_top,
                   int64_t pad_left) {
  Shape s;
  if (auto e = read_conv_shape(x.dimensions(), out->dimensions(), w.element_count(), stride,
                               pad_top, pad_left, &s); e.failure())
    return e;
  const float* xp = x.typed_data();
  const float* wp = w.typed_data();
  float* op = out->typed_data();
  by_lanes(s.o, [&](auto lanes) {
    by_channels(s.c, [&](auto channels) {
      constexpr int L = decltype(lanes)::value, C = decltype(channels)::value;
      for_samples(pool, s.n, [&](int64_t n0, int64_t n1) {
        forward_samples<L, C, false>(s, xp, wp, nullptr, {}, op, n0, n1);
      });
    });
  });
  return ffi::Error::Success();
}

ffi::Error WeightGradient(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                          ffi::Buffer<ffi::F32> ct, ffi::ResultBuffer<ffi::F32> dw,
                          int64_t stride, int64_t pad_top, int64_t pad_left) {
  Shape s;
  if (auto e = read_conv_shape(x.dimensions(), ct.dimensions(), dw->element_count(), stride,
                               pad_top, pad_left, &s); e.failure())
    return e;
  const float* xp = x.typed_data();
  const float* cp = ct.typed_data();
  by_lanes(s.o, [&](auto lanes) {
    by_channels(s.c, [&](auto channels) {
      constexpr int L = decltype(lanes)::value, C = decltype(channels)::value;
      sum_samples(pool, s.n, 9 * s.c * s.o, dw->typed_data(),
                  [&](float* sums, int64_t n0, int64_t n1) {
                    weight_gradient_samples<L, C, false>(s, xp, cp, nullptr, {}, nullptr,
                                                         sums, n0, n1);
                  });
    });
  });
  return ffi::Error::Success();
}

ffi::Error ClampedForward(ffi::ThreadPool pool, F32 x, F32 w, F32 b,
                          ffi::ResultBuffer<ffi::F32> out, int64_t stride, int64_t pad_top,
                          int64_t pad_left, float lo, float hi) {
  Shape s;
  if (auto e = read_conv_shape(x.dimensions(), out->dimensions(), w.element_count(), stride,
                               pad_top, pad_left, &s); e.failure())
    return e;
  if (b.element_count() != static_cast<size_t>(s.o))
    return ffi::Error::InvalidArgument("3x3 convolution kernel: a bias [O]");
  const float *xp = x.typed_data(), *wp = w.typed_data(), *bp = b.typed_data();
  float* op = out->typed_data();
  by_lanes(s.o, [&](auto lanes) {
    by_channels(s.c, [&](auto channels) {
      constexpr int L = decltype(lanes)::value, C = decltype(channels)::value;
      for_samples(pool, s.n, [&](int64_t n0, int64_t n1) {
        forward_samples<L, C, true>(s, xp, wp, bp, {lo, hi}, op, n0, n1);
      });
    });
  });
  return ffi::Error::Success();
}

ffi::Error MaskedGradient(ffi::ThreadPool pool, F32 x, F32 y, F32 ct,
                          ffi::ResultBuffer<ffi::F32> g, ffi::ResultBuffer<ffi::F32> dwb,
                          int64_t stride, int64_t pad_top, int64_t pad_left, float lo,
                          float hi) {
  Shape s;
  auto rows = [](const Shape& s) { return 9 * s.c + 1; };
  if (auto e = read_masked_shape(kKernel, x, y, ct, g, dwb, rows, stride, pad_top, pad_left,
                                 &s); e.failure())
    return e;
  if (s.c > kMaxChannels)
    return ffi::Error::InvalidArgument("3x3 convolution kernel: 1 to 4 input channels");
  const float *xp = x.typed_data(), *yp = y.typed_data(), *cp = ct.typed_data();
  float* gp = g->element_count() ? g->typed_data() : nullptr;
  by_lanes(s.o, [&](auto lanes) {
    by_channels(s.c, [&](auto channels) {
      constexpr int L = decltype(lanes)::value, C = decltype(channels)::value;
      sum_samples(pool, s.n, (9 * s.c + 1) * s.o, dwb->typed_data(),
                  [&](float* sums, int64_t n0, int64_t n1) {
                    weight_gradient_samples<L, C, true>(s, xp, cp, yp, {lo, hi}, gp, sums,
                                                        n0, n1);
                  });
    });
  });
  return ffi::Error::Success();
}

}  // namespace

extern "C" const char* circle_jax_conv_level() { return CIRCLE_JAX_LEVEL; }

XLA_FFI_DEFINE_HANDLER_SYMBOL(circle_jax_conv3x3_forward, Forward,
                              circle_jax::convolution_binding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(circle_jax_conv3x3_weight_gradient, WeightGradient,
                              circle_jax::convolution_binding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(circle_jax_conv3x3_clamped_forward, ClampedForward,
                              circle_jax::clamped_binding<1>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(circle_jax_conv3x3_masked_gradient, MaskedGradient,
                              circle_jax::clamped_binding<2>());
