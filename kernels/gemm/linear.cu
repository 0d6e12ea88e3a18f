// The fused linear ops' elementwise passes. swiglu_bwd: the gate's backward in one pass. act_bwd: the activation's backward and the bias
// gradient in one pass over dy (cuBLASLt's DGELU_BGRAD): dz = dy * act'(pre), written in dy's
// dtype, and dbias = the column sums of dz, accumulated in the accumulation type before dz is
// rounded. The column sums are deterministic: each block sums a fixed chunk of kChunkRows rows of
// its columns into a partial row of the workspace (its row lanes added in lane order), and a second
// kernel adds the chunks' partials in chunk order. No float atomics; the same bits on every run and
// every GPU.
#include "activation.cuh"
#include "kernels/common.cuh"

namespace cuops::kernels {
using namespace detail;
namespace {

// A block: kPairs column pairs (a warp's lanes, so a warp reads 64 consecutive elements of a row)
// by kLanes row lanes, over kChunkRows rows.
constexpr int kPairs = 32, kLanes = 8, kThreads = kPairs * kLanes, kCols = 2 * kPairs;
constexpr int64_t kChunkRows = 256;

template <typename T> __global__ void __launch_bounds__(kThreads)
    act_bwd_chunks(Activation act, const T* dy, int64_t ld_dy, const T* pre, int64_t ld_pre,
                   int64_t rows, int64_t n, T* dz, acc_t<T>* partial) {
  using A = acc_t<T>;
  __shared__ A sums[kLanes][kCols];
  const int64_t col_blocks = (n + kCols - 1) / kCols;
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) / col_blocks;
  const int64_t col0 = (static_cast<int64_t>(blockIdx.x) % col_blocks) * kCols;
  const int pair = static_cast<int>(threadIdx.x) % kPairs,
            lane = static_cast<int>(threadIdx.x) / kPairs;
  const int64_t c = col0 + 2 * pair;
  const int64_t r_end = min(rows, (chunk + 1) * kChunkRows);
  A s0 = A(0), s1 = A(0);
  for (int64_t r = chunk * kChunkRows + lane; r < r_end; r += kLanes) {
    if (c < n) {
      const A d0 =
          to_acc(dy[r * ld_dy + c]) * act_derivative_for<T>(act, to_acc(pre[r * ld_pre + c]));
      dz[r * n + c] = from_acc<T>(d0);
      s0 += d0;
    }
    if (c + 1 < n) {
      const A d1 = to_acc(dy[r * ld_dy + c + 1]) *
                   act_derivative_for<T>(act, to_acc(pre[r * ld_pre + c + 1]));
      dz[r * n + c + 1] = from_acc<T>(d1);
      s1 += d1;
    }
  }
  sums[lane][2 * pair] = s0;
  sums[lane][2 * pair + 1] = s1;
  __syncthreads();
  if (lane == 0) {
    for (int j = 0; j < 2; ++j) {
      A total = sums[0][2 * pair + j];
      for (int l = 1; l < kLanes; ++l) total += sums[l][2 * pair + j];
      if (c + j < n) partial[chunk * n + c + j] = total;
    }
  }
}

// The same with 16 bytes a load (V elements: n, both leading strides and every pointer 16-byte
// aligned): a thread takes V consecutive columns (a block kPairs * V), in the same row lanes and
// chunks, so each column's sum adds the same values in the same order as above (the same
// bits); two rows in flight a thread. (One 2-byte element at a time, the pass ran at a fraction of
// the copy rate and left linear's forward + backward below torch's at 8192-16384 tokens.)
template <typename T, int V> __global__ void __launch_bounds__(kThreads)
    act_bwd_chunks_wide(Activation act, const T* dy, int64_t ld_dy, const T* pre, int64_t ld_pre,
                        int64_t rows, int64_t n, T* dz, acc_t<T>* partial) {
  using A = acc_t<T>;
  constexpr int kWide = kPairs * V;  // columns a block
  __shared__ A sums[kLanes][kWide];
  const int64_t col_blocks = (n + kWide - 1) / kWide;
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) / col_blocks;
  const int64_t col0 = (static_cast<int64_t>(blockIdx.x) % col_blocks) * kWide;
  const int vec = static_cast<int>(threadIdx.x) % kPairs,
            lane = static_cast<int>(threadIdx.x) / kPairs;
  const int64_t c = col0 + V * vec;
  const int64_t r_end = min(rows, (chunk + 1) * kChunkRows);
  A s[V] = {};
  auto row = [&](int64_t r, const T(&g)[V], const T(&z)[V]) {
    T out[V];
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const A d = to_acc(g[i]) * act_derivative_for<T>(act, to_acc(z[i]));
      out[i] = from_acc<T>(d);
      s[i] += d;
    }
    *reinterpret_cast<uint4*>(dz + r * n + c) = *reinterpret_cast<const uint4*>(out);
  };
  if (c < n) {
    int64_t r = chunk * kChunkRows + lane;
    for (; r + kLanes < r_end; r += 2 * kLanes) {
      T g0[V], z0[V], g1[V], z1[V];
      *reinterpret_cast<uint4*>(g0) = *reinterpret_cast<const uint4*>(dy + r * ld_dy + c);
      *reinterpret_cast<uint4*>(z0) = *reinterpret_cast<const uint4*>(pre + r * ld_pre + c);
      *reinterpret_cast<uint4*>(g1) =
          *reinterpret_cast<const uint4*>(dy + (r + kLanes) * ld_dy + c);
      *reinterpret_cast<uint4*>(z1) =
          *reinterpret_cast<const uint4*>(pre + (r + kLanes) * ld_pre + c);
      row(r, g0, z0);
      row(r + kLanes, g1, z1);
    }
    if (r < r_end) {
      T g0[V], z0[V];
      *reinterpret_cast<uint4*>(g0) = *reinterpret_cast<const uint4*>(dy + r * ld_dy + c);
      *reinterpret_cast<uint4*>(z0) = *reinterpret_cast<const uint4*>(pre + r * ld_pre + c);
      row(r, g0, z0);
    }
  }
#pragma unroll
  for (int i = 0; i < V; ++i) sums[lane][V * vec + i] = s[i];
  __syncthreads();
  if (lane == 0 && c < n) {
#pragma unroll
    for (int i = 0; i < V; ++i) {
      A total = sums[0][V * vec + i];
      for (int l = 1; l < kLanes; ++l) total += sums[l][V * vec + i];
      partial[chunk * n + c + i] = total;
    }
  }
}

// dbias[c] = the chunks' partials of column c added in chunk order (0 for no rows).
template <typename T> __global__ void __launch_bounds__(256)
    act_bwd_bias(const acc_t<T>* partial, int64_t chunks, int64_t n, T* dbias) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= n) return;
  acc_t<T> total = acc_t<T>(0);
  for (int64_t k = 0; k < chunks; ++k) total += partial[k * n + c];
  dbias[c] = from_acc<T>(total);
}

int64_t chunks_of(int64_t rows) { return (rows + kChunkRows - 1) / kChunkRows; }

// The gated MLP's backward, one pass: dg = dy * u * act'(g), du = dy * act(g) in the accumulation
// type (torch's formulas: activation.cuh), each rounded once; act (Act) silu or gelu_tanh. A thread
// takes V consecutive columns of a row (16 bytes where every operand's rows allow it, else one
// element); blockIdx.y walks the rows.
template <typename T, int V, Activation Act> __global__ void __launch_bounds__(256)
    swiglu_bwd(const T* dy, int64_t ld_dy, const T* g, int64_t ld_g, const T* u, int64_t ld_u,
               int64_t rows, int64_t n, T* dg, T* du) {
  using A = acc_t<T>;
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (c >= n) return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    T vdy[V], vg[V], vu[V], vdg[V], vdu[V];
    if constexpr (V > 1) {
      *reinterpret_cast<uint4*>(vdy) = *reinterpret_cast<const uint4*>(dy + r * ld_dy + c);
      *reinterpret_cast<uint4*>(vg) = *reinterpret_cast<const uint4*>(g + r * ld_g + c);
      *reinterpret_cast<uint4*>(vu) = *reinterpret_cast<const uint4*>(u + r * ld_u + c);
    } else {
      vdy[0] = dy[r * ld_dy + c], vg[0] = g[r * ld_g + c], vu[0] = u[r * ld_u + c];
    }
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const A d = to_acc(vdy[i]), z = to_acc(vg[i]);
      if constexpr (Act == Activation::Silu) {
        const A s = A(1) / (A(1) + exp(-z));
        vdg[i] = from_acc<T>(d * to_acc(vu[i]) * (s * (A(1) + z * (A(1) - s))));
        vdu[i] = from_acc<T>(d * (z * s));
      } else {
        vdg[i] = from_acc<T>(d * to_acc(vu[i]) * act_derivative(Act, z));
        vdu[i] = from_acc<T>(d * act_forward(Act, z));
      }
    }
    if constexpr (V > 1) {
      *reinterpret_cast<uint4*>(dg + r * n + c) = *reinterpret_cast<const uint4*>(vdg);
      *reinterpret_cast<uint4*>(du + r * n + c) = *reinterpret_cast<const uint4*>(vdu);
    } else {
      dg[r * n + c] = vdg[0], du[r * n + c] = vdu[0];
    }
  }
}

}  // namespace

cudaError_t launch_swiglu_bwd(DType dtype, Activation act, const void* dy, int64_t ld_dy,
                              const void* g, int64_t ld_g, const void* u, int64_t ld_u,
                              int64_t rows, int64_t n, void* dg, void* du, cudaStream_t stream) {
  if (rows < 0 || n < 0 || ld_dy < n || ld_g < n || ld_u < n ||
      (act != Activation::Silu && act != Activation::GeluTanh)) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0 || n == 0) return cudaSuccess;
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kV = 16 / static_cast<int>(sizeof(T));
    const auto fits = [&](const void* p, int64_t ld) {
      return reinterpret_cast<uintptr_t>(p) % 16 == 0 && ld % kV == 0;
    };
    const bool wide = n % kV == 0 && fits(dy, ld_dy) && fits(g, ld_g) && fits(u, ld_u) &&
                      fits(dg, n) && fits(du, n);
    const int64_t per_row = wide ? n / kV : n;
    if (!grid_fits((per_row + 255) / 256)) return cudaErrorInvalidValue;
    const dim3 grid(static_cast<unsigned>((per_row + 255) / 256),
                    static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
    const T *pdy = static_cast<const T*>(dy), *pg = static_cast<const T*>(g),
            *pu = static_cast<const T*>(u);
    const auto run = [&](auto kernel) {
      kernel<<<grid, 256, 0, stream>>>(pdy, ld_dy, pg, ld_g, pu, ld_u, rows, n, static_cast<T*>(dg),
                                       static_cast<T*>(du));
    };
    if (act == Activation::Silu) {
      wide ? run(swiglu_bwd<T, kV, Activation::Silu>) : run(swiglu_bwd<T, 1, Activation::Silu>);
    } else {
      wide ? run(swiglu_bwd<T, kV, Activation::GeluTanh>)
           : run(swiglu_bwd<T, 1, Activation::GeluTanh>);
    }
    return cudaGetLastError();
  });
}

int64_t act_bwd_workspace_bytes(DType dtype, int64_t rows, int64_t n) {
  return chunks_of(rows) * n * (dtype == DType::Float64 ? 8 : 4);
}

cudaError_t launch_act_bwd(DType dtype, Activation act, const void* dy, int64_t ld_dy,
                           const void* pre, int64_t ld_pre, int64_t rows, int64_t n, void* dz,
                           void* dbias, void* workspace, cudaStream_t stream) {
  if (rows < 0 || n < 0 || ld_dy < n || ld_pre < n) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const int64_t chunks = chunks_of(rows);
  if (chunks > 0 && workspace == nullptr) return cudaErrorInvalidValue;
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    constexpr int kV = 16 / static_cast<int>(sizeof(T));
    const auto fits = [&](const void* p, int64_t ld) {
      return reinterpret_cast<uintptr_t>(p) % 16 == 0 && ld % kV == 0;
    };
    const bool wide = n % kV == 0 && fits(dy, ld_dy) && fits(pre, ld_pre) && fits(dz, n);
    const int64_t cols = wide ? kPairs * kV : kCols, col_blocks = (n + cols - 1) / cols;
    if (!grid_fits(chunks * col_blocks)) return cudaErrorInvalidValue;
    A* partial = static_cast<A*>(workspace);
    if (chunks > 0) {
      const unsigned grid = static_cast<unsigned>(chunks * col_blocks);
      const T *pdy = static_cast<const T*>(dy), *ppre = static_cast<const T*>(pre);
      if (wide) {
        act_bwd_chunks_wide<T, kV><<<grid, kThreads, 0, stream>>>(
            act, pdy, ld_dy, ppre, ld_pre, rows, n, static_cast<T*>(dz), partial);
      } else {
        act_bwd_chunks<T><<<grid, kThreads, 0, stream>>>(act, pdy, ld_dy, ppre, ld_pre, rows, n,
                                                         static_cast<T*>(dz), partial);
      }
      const cudaError_t err = cudaGetLastError();
      if (err != cudaSuccess) return err;
    }
    act_bwd_bias<T>
        <<<blocks_for(n, 256), 256, 0, stream>>>(partial, chunks, n, static_cast<T*>(dbias));
    return cudaGetLastError();
  });
}

}  // namespace cuops::kernels
