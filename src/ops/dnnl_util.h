// The oneDNN CPU engine shared by the runtime's primitives (prepared convolutions and matmuls).
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

namespace gaf {

inline dnnl::engine& DnnlEngine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

}  // namespace gaf
