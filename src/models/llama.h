// A Llama-architecture decoder with seeded random weights, built in our IR in the layout that
// Hugging Face Optimum exports (one model for prefill and decode, with a KV cache):
//   inputs   input_ids int64 [batch_size, sequence_length]
//            attention_mask int64 [batch_size, past_sequence_length + sequence_length]
//            position_ids int64 [batch_size, sequence_length]
//            past_key_values.{i}.key / .value float [batch_size, kv_heads, past_sequence_length, head_dim]
//   outputs  logits float [batch_size, sequence_length, vocab]
//            present.{i}.key / .value float [batch_size, kv_heads, past_sequence_length + sequence_length, head_dim]
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace gaf {

struct LlamaConfig {
  std::string preset = "custom";
  int64_t vocab_size = 256;
  int64_t hidden_size = 64;
  int64_t intermediate_size = 172;
  int64_t num_layers = 2;
  int64_t num_heads = 4;
  int64_t num_kv_heads = 2;
  int64_t max_position_embeddings = 256;
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.f;
  float init_std = 0.02f;  // stddev of the projection and embedding weights
  uint32_t seed = 0;
  // The opset the model is written for: 17 writes attention, RMS norm and rotary embedding as
  // torch.onnx.export does at opset 17 (MatMul, Softmax, Pow, ReduceMean, Slice, ...); 23 writes
  // them as the operators Attention, RMSNormalization and RotaryEmbedding; 28 also the MLP's gate
  // as SwiGLU. The weights are drawn in the same order, so one seed gives the same model.
  int64_t opset = 17;

  int64_t head_dim() const { return hidden_size / num_heads; }
};

// Presets: "tiny" (~130K parameters), "small" (~15M), "bench" (~200M, ~800 MB in fp32).
// Throws gaf::Error for an unknown name.
LlamaConfig LlamaPreset(const std::string& name);
std::vector<std::string> LlamaPresetNames();

// Number of parameters (initializer elements, rotary tables included) the model will have.
int64_t LlamaParameterCount(const LlamaConfig& config);

// Builds the model (config.opset; ir_version 8, or 11 from opset 23). Throws gaf::Error for an
// inconsistent config.
Model BuildLlamaModel(const LlamaConfig& config);

}  // namespace gaf
