// ONNX import and export through the ONNX library's protobuf classes, checker and shape inference.
// Errors name the file and what is wrong (gaf::Error). No ONNX type leaks into this interface.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "ir/graph.h"

namespace gaf {

// Reads a .onnx file (any size up to 2 GiB of protobuf; weights in external-data files are
// read from the model's folder). Throws gaf::Error naming the file for a missing, truncated or
// corrupt file, or for a structurally invalid graph.
Model LoadModel(const std::string& path);
// Same from bytes already in memory; `base_dir` resolves external data, `what` names the source.
Model ModelFromBytes(const std::string& bytes, const std::string& base_dir, const std::string& what);

struct SaveOptions {
  // Write initializers of at least `external_threshold` bytes to `external_file` (relative to the
  // model's folder; default "<model file name>.<content hash>.data"). Needed for models over 2 GiB.
  bool external_data = false;
  size_t external_threshold = 1024;
  std::string external_file;
};
// Writes atomically: a temporary file in the same folder, then rename. With external data the
// weights go first to "<model file>.<content hash>.data" (unless external_file names the file),
// then the model; earlier data files of the same model are removed. Returns the data file's path
// ("" without external data). Refuses a destination that is not a regular file.
std::string SaveModel(const Model& model, const std::string& path, const SaveOptions& options = {});
std::string ModelToBytes(const Model& model);
// Writes a file through a temporary name and a rename: readers never see a half-written file.
void WriteFileAtomic(const std::string& path, const std::string& bytes);

// A serialized TensorProto (the .pb files of the ONNX test data).
Tensor LoadTensorPb(const std::string& path);
// ... and the TensorProto's name (may be "").
Tensor LoadTensorPb(const std::string& path, std::string* name);
// The inputs of a test_data_set_N folder of ONNX's test layout (input_0.pb, input_1.pb, ...; in
// K order): each named by its TensorProto's name when that is one of `input_names`, else by its
// position in `input_names`. gaf::Error naming the file for a missing folder, no input files,
// more files than inputs, an input given twice, or a file the checked loader refuses.
std::vector<std::pair<std::string, Tensor>> LoadTestDataSet(const std::string& dir,
                                                            const std::vector<std::string>& input_names);
void SaveTensorPb(const Tensor& t, const std::string& name, const std::string& path);

// Runs the ONNX checker (full check); returns "" when it passes, else its message.
std::string CheckModel(const Model& model);
// "" when this build's ONNX library knows the model's IR version and opsets, else why its checker
// cannot judge the model (Debian 12's ONNX 1.13 knows IR 8 and opset 18: Attention is opset 23).
std::string CheckerScope(const Model& model);
// Runs ONNX shape inference and stores the inferred types/shapes in graph.value_info (replacing
// it) and graph outputs. Returns "" or the inference error message (the model is unchanged then).
std::string InferShapes(Model& model);

}  // namespace gaf
