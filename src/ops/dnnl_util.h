// The oneDNN CPU engine shared by the runtime's primitives (prepared convolutions and matmuls).
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include "ir/tensor.h"

namespace gaf {

inline dnnl::engine& DnnlEngine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// Memory of `md` on a tensor `storage` keeps (for weights a primitive reads on every call: the
// tensor allocator puts 2 MiB and more on transparent huge pages, where oneDNN's own allocation
// is on 4 KiB pages: fewer page walks, and the hardware prefetchers do not stop every 4 KiB).
inline dnnl::memory MemoryOnTensor(const dnnl::memory::desc& md, Tensor* storage) {
  *storage = Tensor::Uninitialized(DataType::kUint8, {static_cast<int64_t>(md.get_size())});
  return dnnl::memory(md, DnnlEngine(), storage->raw());
}

}  // namespace gaf
