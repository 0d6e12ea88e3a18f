// Hugging Face's rotary embedding (rotary, _rotary_bwd; docs/ops.md#rotary) in one pass: q and k read
// once and written once, cos and sin read once a position (then from L1 for every head).
//
// A block takes one position (b, t) at a time and its threads the (head, vector) pairs of q's and
// k's heads there: a vector is E elements of the first half of the head dimension and the E
// elements D/2 further on that rotate with them, so every element is loaded and stored once, in
// 16-byte accesses where every operand is aligned (E = 16 bytes of the narrowest operand), else
// one element at a time.
#include "kernels/common.cuh"

namespace cuops::kernels {
namespace detail {
namespace {

constexpr int kMaxThreads = 256;

// forward  o[:h] = x[:h] c[:h] - x[h:] s[:h],  o[h:] = x[h:] c[h:] + x[:h] s[h:]
// backward o[:h] = x[:h] c[:h] + x[h:] s[h:],  o[h:] = x[h:] c[h:] - x[:h] s[:h]
// (h = D/2; the backward is the forward's transpose: g cos - rotate_half(g sin)).
template <typename T, typename C, typename O, int E, bool kBwd>
__global__ void __launch_bounds__(kMaxThreads) rotary_kernel(RotaryArgs a) {
  using A = acc_t<T>;
  const int64_t half = a.d / 2, vecs = half / E, heads = a.heads_q + a.heads_k;
  const int64_t work = heads * vecs, positions = a.batch * a.seq;
  const C* cos_base = static_cast<const C*>(a.cos);
  const C* sin_base = static_cast<const C*>(a.sin);
  for (int64_t pos = blockIdx.x; pos < positions; pos += gridDim.x) {
    const int64_t b = pos / a.seq, t = pos % a.seq;
    const C* cp = cos_base + b * a.trig_sb + t * a.d;
    const C* sp = sin_base + b * a.trig_sb + t * a.d;
    for (int64_t i = threadIdx.x; i < work; i += blockDim.x) {
      const int64_t h = i / vecs, j = (i % vecs) * E;
      const bool is_q = h < a.heads_q;
      // Fields picked one by one: a dynamically chosen parameter struct is copied to local memory.
      const int64_t hh = is_q ? h : h - a.heads_q;
      const T* x = static_cast<const T*>(is_q ? a.q.p : a.k.p) + b * (is_q ? a.q.sb : a.k.sb) +
                   hh * (is_q ? a.q.sh : a.k.sh) + t * (is_q ? a.q.st : a.k.st) + j;
      O* o = static_cast<O*>(is_q ? a.oq.p : a.ok.p) + b * (is_q ? a.oq.sb : a.ok.sb) +
             hh * (is_q ? a.oq.sh : a.ok.sh) + t * (is_q ? a.oq.st : a.ok.st) + j;
      A xl[E], xh[E], cl[E], ch[E], sl[E], sh[E], ol[E], oh[E];
      load_elems<T, E>(x, xl);
      load_elems<T, E>(x + half, xh);
      load_elems<C, E>(cp + j, cl);
      load_elems<C, E>(cp + half + j, ch);
      load_elems<C, E>(sp + j, sl);
      load_elems<C, E>(sp + half + j, sh);
#pragma unroll
      for (int e = 0; e < E; ++e) {
        if constexpr (kBwd) {
          ol[e] = xl[e] * cl[e] + xh[e] * sh[e];
          oh[e] = xh[e] * ch[e] - xl[e] * sl[e];
        } else {
          ol[e] = xl[e] * cl[e] - xh[e] * sl[e];
          oh[e] = xh[e] * ch[e] + xl[e] * sh[e];
        }
      }
      store_elems<O, E>(o, ol);
      store_elems<O, E>(o + half, oh);
    }
  }
}

template <typename T, typename C, typename O, int E, bool kBwd>
cudaError_t launch_typed(const RotaryArgs& a, cudaStream_t stream) {
  const int64_t work = (a.heads_q + a.heads_k) * (a.d / 2 / E);
  const int threads = static_cast<int>(std::min<int64_t>(kMaxThreads, (work + 31) / 32 * 32));
  const int64_t grid = std::min<int64_t>(a.batch * a.seq, int64_t{1} << 30);
  rotary_kernel<T, C, O, E, kBwd><<<static_cast<unsigned>(grid), threads, 0, stream>>>(a);
  return cudaGetLastError();
}

int size_of(DType t) { return t == DType::Float64 ? 8 : t == DType::Float32 ? 4 : 2; }

// The instance for the dtypes: E = 16 bytes of the narrowest operand where vec, else 1 (every dtype
// pair the same arithmetic, so a result in dtype is the default result's cast bit for bit).
template <bool kBwd> cudaError_t dispatch(const RotaryArgs& a, bool vec, cudaStream_t stream) {
  auto same = [&](auto t) -> cudaError_t {
    using T = decltype(t);
    if (vec) return launch_typed<T, T, T, 16 / sizeof(T), kBwd>(a, stream);
    return launch_typed<T, T, T, 1, kBwd>(a, stream);
  };
  if (a.x == a.trig && a.trig == a.out) return dispatch_dtype(a.x, same);
  if (!rotary_supports(a.x, a.trig, a.out)) return cudaErrorInvalidValue;
  auto half_mix = [&](auto h) -> cudaError_t {
    using H = decltype(h);
    auto go = [&](auto x, auto o) -> cudaError_t {
      using X = decltype(x);
      using O = decltype(o);
      return vec ? launch_typed<X, float, O, 8, kBwd>(a, stream)
                 : launch_typed<X, float, O, 1, kBwd>(a, stream);
    };
    if (a.x != DType::Float32 && a.out != DType::Float32)
      return go(H{}, H{});                               // either way with dtype = x's
    if (a.x != DType::Float32) return go(H{}, float{});  // autocast's forward
    return go(float{}, H{});                             // its backward
  };
  return (a.x == DType::Float32 ? a.out : a.x) == DType::BFloat16 ? half_mix(__nv_bfloat16{})
                                                                  : half_mix(__half{});
}

}  // namespace
}  // namespace detail

bool rotary_supports(DType x, DType trig, DType out) {
  if (x == trig && trig == out) return true;
  const auto half = [](DType t) { return t == DType::BFloat16 || t == DType::Float16; };
  if (trig != DType::Float32) return false;
  if (half(x) && half(out)) return x == out;
  return (half(x) && out == DType::Float32) || (x == DType::Float32 && half(out));
}

int rotary_vector_elems(DType x, DType trig, DType out) {
  return 16 / std::min({detail::size_of(x), detail::size_of(trig), detail::size_of(out)});
}

cudaError_t launch_rotary(const RotaryArgs& a, bool vec, cudaStream_t stream) {
  if (a.batch == 0 || a.seq == 0 || a.d == 0 || a.heads_q + a.heads_k == 0) return cudaSuccess;
  return a.backward ? detail::dispatch<true>(a, vec, stream)
                    : detail::dispatch<false>(a, vec, stream);
}

}  // namespace cuops::kernels
