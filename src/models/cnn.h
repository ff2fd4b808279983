// A small ResNet-style image classifier with seeded random weights, written the way the PyTorch
// exporter writes torchvision ResNets when BatchNormalization is kept (not folded into Conv):
//   input float [batch_size, 3, S, S] -> stem Conv3x3 + BatchNormalization + Relu -> MaxPool 2x2
//   -> stages of basic blocks (Conv-BN-Relu-Conv-BN, residual Add, Relu; the first block of a
//      strided stage projects the shortcut with Conv1x1 + BN)
//   -> GlobalAveragePool -> Flatten -> Gemm -> output float [batch_size, num_classes]
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace gaf {

struct CnnConfig {
  std::string preset = "custom";
  int64_t image_size = 32;
  int64_t num_classes = 10;
  std::vector<int64_t> stage_channels = {16, 32, 64};  // stage k > 0 halves the resolution
  int64_t blocks_per_stage = 2;
  uint32_t seed = 0;
};

// Presets: "tiny" (32x32, 10 classes, ~0.2M parameters), "small" (64x64, 1000 classes, ~1.3M).
CnnConfig CnnPreset(const std::string& name);
std::vector<std::string> CnnPresetNames();

// Builds the model (opset 17, ir_version 8). Throws gaf::Error for an inconsistent config.
Model BuildCnnModel(const CnnConfig& config);

}  // namespace gaf
