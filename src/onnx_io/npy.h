// NumPy .npy files (format versions 1-3, little-endian, C order) for tensors.
#pragma once

#include <string>

#include "ir/tensor.h"

namespace gaf {

// Throws gaf::Error naming the file for anything it cannot read (Fortran order, big-endian,
// object arrays, truncation).
Tensor LoadNpy(const std::string& path);
// Writes atomically (temporary file, then rename).
void SaveNpy(const Tensor& t, const std::string& path);

// Loads a tensor from .npy or a serialized TensorProto (.pb), chosen by extension.
Tensor LoadTensorFile(const std::string& path);

}  // namespace gaf
