// Argument checks shared by every cuops op. Messages start with "cuops::<op>:", name the argument,
// and print what was expected and what came; tests match on them. Shape checks use sym_sizes() so the
// same checks run in Meta kernels under dynamic shapes.
#pragma once

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <c10/core/GradMode.h>

#include <initializer_list>
#include <sstream>
#include <string>
#include <utility>

#include "kernels/kernels.h"

namespace cuops::ops {

using NamedTensor = std::pair<const char*, const at::Tensor*>;

inline std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kHalf:
      return "float16";
    case at::kBFloat16:
      return "bfloat16";
    case at::kLong:
      return "int64";
    case at::kInt:
      return "int32";
    case at::kShort:
      return "int16";
    case at::kChar:
      return "int8";
    case at::kByte:
      return "uint8";
    case at::kBool:
      return "bool";
    case at::kComplexFloat:
      return "complex64";
    case at::kComplexDouble:
      return "complex128";
    default:
      return c10::toString(t);
  }
}

inline std::string shape_str(const at::Tensor& t) {
  std::ostringstream os;
  os << '[';
  const auto sizes = t.sym_sizes();
  for (size_t i = 0; i < sizes.size(); ++i) os << (i ? ", " : "") << sizes[i];
  os << ']';
  return os.str();
}

inline bool is_supported_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

inline kernels::DType kernel_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return kernels::DType::Float32;
    case at::kDouble:
      return kernels::DType::Float64;
    case at::kHalf:
      return kernels::DType::Float16;
    case at::kBFloat16:
      return kernels::DType::BFloat16;
    default:
      TORCH_CHECK(false, "cuops: internal error: no kernel dtype for ", dtype_name(t));
  }
}

// Every tensor: a supported floating dtype, the first tensor's dtype, and the first tensor's device.
inline void check_dtypes_and_devices(const char* op, c10::ArrayRef<NamedTensor> ts) {
  const auto& [name0, t0] = *ts.begin();
  for (const auto& [name, t] : ts) {
    TORCH_CHECK(is_supported_dtype(t->scalar_type()), "cuops::", op, ": expected ", name,
                " to have dtype float32, float64, float16 or bfloat16, got ",
                dtype_name(t->scalar_type()));
  }
  for (const auto& [name, t] : ts) {
    TORCH_CHECK(t->scalar_type() == t0->scalar_type(), "cuops::", op, ": expected ", name,
                " to have the dtype of ", name0, " (", dtype_name(t0->scalar_type()), "), got ",
                dtype_name(t->scalar_type()));
    TORCH_CHECK(t->device() == t0->device(), "cuops::", op, ": expected ", name,
                " on the device of ", name0, " (", t0->device(), "), got ", t->device());
  }
}

inline void check_same_shape(const char* op, std::initializer_list<NamedTensor> ts) {
  const auto& [name0, t0] = *ts.begin();
  for (const auto& [name, t] : ts) {
    TORCH_CHECK(t->sym_sizes().equals(t0->sym_sizes()), "cuops::", op, ": expected ", name,
                " to have the shape of ", name0, " ", shape_str(*t0), ", got ", shape_str(*t));
  }
}

inline void check_dim(const char* op, const char* name, const at::Tensor& t, int64_t dim) {
  TORCH_CHECK(t.dim() == dim, "cuops::", op, ": expected ", name, " to be ", dim, "-D, got ",
              t.dim(), "-D tensor of shape ", shape_str(t));
}

// In-place ops write `out`; reject it when it would change values autograd has recorded.
inline void check_no_grad(const char* op, const char* alternative,
                          std::initializer_list<NamedTensor> ts) {
  if (!c10::GradMode::is_enabled()) return;
  for (const auto& [name, t] : ts) {
    TORCH_CHECK(!t->requires_grad(), "cuops::", op, ": ", name, " requires grad, but ", op,
                " writes its output in place and is not differentiable; use cuops::", alternative,
                " (differentiable) or run under torch.no_grad()");
  }
}

// The element range [lo, hi] (in bytes from the storage start) a strided tensor can touch.
inline std::pair<int64_t, int64_t> byte_span(const at::Tensor& t) {
  int64_t lo = t.storage_offset(), hi = t.storage_offset();
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t extent = (t.size(d) - 1) * t.stride(d);
    (extent < 0 ? lo : hi) += extent;
  }
  const int64_t es = static_cast<int64_t>(t.element_size());
  return {lo * es, hi * es + es - 1};
}

enum class Overlap { None, Same, Partial };

// Conservative: two views of one storage whose byte ranges meet and that are not the very same
// view count as Partial, even if their elements interleave without touching.
inline Overlap overlap(const at::Tensor& x, const at::Tensor& y) {
  if (x.numel() == 0 || y.numel() == 0) return Overlap::None;
  if (!x.has_storage() || !y.has_storage() || !x.storage().is_alias_of(y.storage()))
    return Overlap::None;
  if (x.data_ptr() == y.data_ptr() && x.sizes().equals(y.sizes()) &&
      x.strides().equals(y.strides()))
    return Overlap::Same;
  const auto [xl, xh] = byte_span(x);
  const auto [yl, yh] = byte_span(y);
  return (xh < yl || yh < xl) ? Overlap::None : Overlap::Partial;
}

// An output must not alias itself (expanded or otherwise self-overlapping views).
inline void check_output_not_self_overlapping(const char* op, const char* name,
                                              const at::Tensor& out) {
  TORCH_CHECK(at::has_internal_overlap(out) != at::MemOverlap::Yes, "cuops::", op, ": expected ",
              name, " to have no overlapping elements (e.g. not an expanded view), got strides ",
              out.strides(), " for shape ", out.sizes());
  // has_internal_overlap gives up on non-dense layouts; prove non-overlap with sorted strides instead.
  if (!out.is_non_overlapping_and_dense() && out.numel() > 1) {
    std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of dims with size > 1
    for (int64_t d = 0; d < out.dim(); ++d)
      if (out.size(d) > 1) dims.emplace_back(out.stride(d), out.size(d));
    std::sort(dims.begin(), dims.end());
    int64_t reach = 0;  // largest offset reachable by the dims visited so far
    for (const auto& [stride, size] : dims) {
      TORCH_CHECK(stride > reach, "cuops::", op, ": expected ", name,
                  " to have no overlapping elements, got strides ", out.strides(), " for shape ",
                  out.sizes());
      reach += stride * (size - 1);
    }
  }
}

// out vs input: identical view allowed only where the op supports in-place; anything else that
// touches the same memory is an error.
inline void check_output_overlap(const char* op, const char* out_name, const at::Tensor& out,
                                 const char* in_name, const at::Tensor& in, bool allow_same) {
  const Overlap o = overlap(out, in);
  TORCH_CHECK(o == Overlap::None || (o == Overlap::Same && allow_same), "cuops::", op,
              ": expected ", out_name, allow_same ? " to be exactly " : " not to overlap ", in_name,
              allow_same ? " or not to overlap it" : "", ", got ", out_name, " (shape ",
              out.sizes(), ", strides ", out.strides(), ", offset ", out.storage_offset(), ") ",
              o == Overlap::Same ? "equal to " : "partially overlapping ", in_name, " (shape ",
              in.sizes(), ", strides ", in.strides(), ", offset ", in.storage_offset(), ")");
}

}  // namespace cuops::ops
