// Helpers of circle-jax's CPU kernels (circle_jax/lowering/cpu/*.cc): float vectors of L
// lanes (GCC vector extensions), and the samples of a batch cut into chunks that XLA's
// intra-op thread pool and the calling thread share.

#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "xla/ffi/api/ffi.h"

// The instruction-set level this object is compiled for (setup.py defines it); each source
// file exports it as circle_jax_<file>_level, so a library linked from another level's
// objects is caught at load (circle_jax/lowering/cpu_kernels.py).
#ifndef CIRCLE_JAX_LEVEL
#define CIRCLE_JAX_LEVEL "unnamed"
#endif

namespace circle_jax {

namespace ffi = xla::ffi;

template <int L>
struct Lanes {
  typedef float type __attribute__((vector_size(L * 4), aligned(4)));
};

template <int L>
inline typename Lanes<L>::type load(const float* p) {
  typename Lanes<L>::type v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

template <int L>
inline void store(float* p, typename Lanes<L>::type v) {
  std::memcpy(p, &v, sizeof(v));
}

// Runs f(chunk) for chunks [0, count) on the calling thread and up to threads - 1 pool
// tasks, which take chunk numbers from a shared counter. The caller waits only for chunks
// already taken, so a pool task that starts late (or never) cannot block it.
template <class F>
void in_chunks(ffi::ThreadPool& pool, int64_t count, F f) {
  int64_t threads = std::min<int64_t>(std::max<int64_t>(pool.num_threads(), 1), count);
  if (threads <= 1) {
    for (int64_t i = 0; i < count; ++i) f(i);
    return;
  }
  struct Progress {
    std::atomic<int64_t> next{0}, done{0};
    std::mutex mutex;
    std::condition_variable finished;
  };
  auto progress = std::make_shared<Progress>();
  auto body = std::make_shared<F>(std::move(f));
  auto work = [progress, body, count]() {
    for (int64_t i; (i = progress->next.fetch_add(1)) < count;) {
      (*body)(i);
      if (progress->done.fetch_add(1) + 1 == count) {
        std::lock_guard<std::mutex> lock(progress->mutex);
        progress->finished.notify_all();
      }
    }
  };
  for (int64_t t = 1; t < threads; ++t) {
    auto task = work;
    pool.Schedule(std::move(task));
  }
  work();
  std::unique_lock<std::mutex> lock(progress->mutex);
  progress->finished.wait(lock, [&] { return progress->done.load() == count; });
}

// Calls run(std::integral_constant<int, L>()) with the widest lane count dividing C.
template <class Run>
void by_lanes(int64_t c, Run run) {
  if (c % 16 == 0) run(std::integral_constant<int, 16>());
  else if (c % 8 == 0) run(std::integral_constant<int, 8>());
  else if (c % 4 == 0) run(std::integral_constant<int, 4>());
  else run(std::integral_constant<int, 1>());
}

//: the most chunks a batch is cut into: the chunks, not the threads, fix the order in which
//: a reduction over the samples adds up, so its bits do not depend on the thread count
constexpr int64_t kChunks = 8;

// Runs part(n0, n1) for samples [n0, n1) of each chunk of a batch of n.
template <class Part>
void for_samples(ffi::ThreadPool& pool, int64_t n, Part part) {
  int64_t chunks = std::min(n, kChunks);
  in_chunks(pool, chunks, [&](int64_t i) { part(n * i / chunks, n * (i + 1) / chunks); });
}

// A sum over a batch of n: part(sums, n0, n1) adds samples [n0, n1)'s terms to sums[size]
// (one zeroed array per chunk), and the chunks' sums are added up in chunk order into out.
template <class Part>
void sum_samples(ffi::ThreadPool& pool, int64_t n, int64_t size, float* out, Part part) {
  int64_t chunks = std::max<int64_t>(std::min(n, kChunks), 1);
  std::vector<float> partial(chunks * size, 0.0f);
  in_chunks(pool, chunks, [&](int64_t i) {
    part(partial.data() + i * size, n * i / chunks, n * (i + 1) / chunks);
  });
  std::memcpy(out, partial.data(), size * sizeof(float));
  for (int64_t i = 1; i < chunks; ++i)
    for (int64_t j = 0; j < size; ++j) out[j] += partial[i * size + j];
}

// A convolution's sizes: the input [n, h, w, c], the output [n, oh, ow, o], the stride and
// the top/left padding (bottom and right follow from the output's size).
struct Shape {
  int64_t n, h, w, c;
  int64_t oh, ow, o;
  int64_t stride, pad_top, pad_left;
};

// The Shape of input dims x and output (or output cotangent) dims y, into *s; an error
// naming the kernel unless both are 4-d of one batch, not empty, with stride 1 or 2.
template <class Dims>
ffi::Error read_shape(const std::string& kernel, const Dims& x, const Dims& y, int64_t stride,
                      int64_t pad_top, int64_t pad_left, Shape* s) {
  if (x.size() != 4 || y.size() != 4 || x[0] != y[0])
    return ffi::Error::InvalidArgument(
        kernel + ": x [N, H, W, C] and an output [N, OH, OW, O] expected");
  *s = Shape{x[0], x[1], x[2], x[3], y[1], y[2], y[3], stride, pad_top, pad_left};
  if (stride != 1 && stride != 2)
    return ffi::Error::InvalidArgument(kernel + ": stride 1 or 2 expected");
  if (s->n < 0 || s->h <= 0 || s->w <= 0 || s->c <= 0 || s->oh <= 0 || s->ow <= 0 ||
      s->o <= 0)
    return ffi::Error::InvalidArgument(kernel + ": empty shape");
  return ffi::Error::Success();
}

// Every kernel's binding: XLA's intra-op thread pool, two float32 operands, one float32
// result, and the convolution's stride and top/left padding as attributes.
inline auto convolution_binding() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::ThreadPool>()
      .Arg<ffi::Buffer<ffi::F32>>()
      .Arg<ffi::Buffer<ffi::F32>>()
      .Ret<ffi::Buffer<ffi::F32>>()
      .Attr<int64_t>("stride")
      .Attr<int64_t>("pad_top")
      .Attr<int64_t>("pad_left");
}

// A clamping activation's range [lo, hi] (hi = +inf: no upper bound).
struct Range {
  float lo, hi;
};

// v clamped to r (NaN stays NaN, as XLA's clamp).
template <int L>
inline typename Lanes<L>::type clamp(typename Lanes<L>::type v, Range r) {
  using V = typename Lanes<L>::type;
  const V lo = V{} + r.lo, hi = V{} + r.hi;
  v = v < lo ? lo : v;
  return v > hi ? hi : v;
}

// ct where the clamped output y is strictly inside r (where y > lo for hi = +inf), else 0:
// the clamp's gradient rule (TF's, and jax.nn.relu's for RELU).
template <int L>
inline typename Lanes<L>::type masked(typename Lanes<L>::type y, typename Lanes<L>::type ct,
                                      Range r) {
  using V = typename Lanes<L>::type;
  const V lo = V{} + r.lo, hi = V{} + r.hi;
  const auto in = r.hi < __builtin_inff() ? (y > lo) & (y < hi) : (y > lo);
  return in ? ct : V{};
}

using F32 = ffi::Buffer<ffi::F32>;

// The Shape of a masked gradient (`read_shape` of x and its output's cotangent ct) into *s;
// an error naming the kernel unless y is shaped as ct, g as ct or empty, and dwb holds
// rows(*s) rows (the weight gradient's, then the bias') of O values.
template <class Rows>
ffi::Error read_masked_shape(const std::string& kernel, const F32& x, const F32& y,
                             const F32& ct, ffi::Result<F32>& g,
                             ffi::Result<F32>& dwb, Rows rows, int64_t stride,
                             int64_t pad_top, int64_t pad_left, Shape* s) {
  if (auto e = read_shape(kernel, x.dimensions(), ct.dimensions(), stride, pad_top, pad_left,
                          s); e.failure())
    return e;
  if (y.element_count() != ct.element_count() ||
      (g->element_count() != ct.element_count() && g->element_count() != 0) ||
      dwb->element_count() != static_cast<size_t>(rows(*s) * s->o))
    return ffi::Error::InvalidArgument(kernel + ": y and g (or an empty g) shaped as ct, " +
                                       std::to_string(rows(*s)) + " rows of gradients");
  return ffi::Error::Success();
}

// A clamped layer's binding (the rest of `convolution_binding`'s, then the clamp's range):
// XLA's intra-op thread pool, three float32 operands and Results float32 results.
template <int Results>
auto clamped_binding() {
  auto operands = ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<F32>().Arg<F32>().Arg<F32>();
  auto results = [&] {
    if constexpr (Results == 1) return std::move(operands).Ret<F32>();
    else return std::move(operands).Ret<F32>().Ret<F32>();
  }();
  return std::move(results)
      .template Attr<int64_t>("stride")
      .template Attr<int64_t>("pad_top")
      .template Attr<int64_t>("pad_left")
      .template Attr<float>("lo")
      .template Attr<float>("hi");
}

}  // namespace circle_jax
