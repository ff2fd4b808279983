// The user's sample inputs (-i), shared by every command that runs a model.
//
//   -i NAME=FILE.npy|FILE.pb   one input; all of them together form one sample
//   -i FILE.npy|FILE.pb        (a file) the next input in the model's order, in the same sample
//   -i DIR                     a test_data_set_N folder of ONNX's test layout (input_K.pb, matched
//                              to the model's inputs by the TensorProto's name, else by position);
//                              each folder is one sample (NAME=FILE values are added to each)
//   -i NAME=random             (run only) leave the input to be made
//
// Symbolic dims are bound from the given inputs; inputs not given are filled consistently with
// that binding (cost/workload.h CompleteFeeds). Files go through the checked loaders of onnx_io.
// Every problem is a gaf::Error of one line naming the -i value, the file or the input.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "codegen/half_weights.h"
#include "cost/workload.h"
#include "ir/graph.h"

namespace gaf::cli {

// The model of a command's model argument: an ONNX file (LoadModel), or a TorchScript file
// (torch.jit.save's zip archive), which is exported to ONNX first by PyTorch's exporter, running
// `$GAF_PYTHON (/usr/bin/python3) $GAF_TORCH_IO_SCRIPT (python/graph_autofusion/torch_io.py)
// convert` in a private temporary folder, with the NAME=FILE and FILE forms of `input_specs` as
// its example inputs (a TorchScript file needs them). Errors name `path`: no sample inputs,
// PyTorch not installed (which package to install), or the exporter's one-line reason.
Model LoadModelArg(const std::string& path, const std::vector<std::string>& input_specs);

// Whether `path` is a TorchScript archive: the zip magic and an entry `*/code/...`,
// `*/constants.pkl` or `*/data.pkl` in its central directory (read bounded; when that cannot be
// read, the magic and an extension .pt/.pth/.ts/.zip).
bool IsTorchScriptFile(const std::string& path);

// The given inputs of each sample, not completed (empty when `specs` is empty).
std::vector<Feeds> ParseInputSpecs(const Model& model, const std::vector<std::string>& specs, bool allow_random = false);

// The completed samples of `specs` (empty Workload when `specs` is empty); source
// "inputs given with -i: N sample(s)".
Workload LoadWorkload(const Model& model, const std::vector<std::string>& specs,
                      const std::map<std::string, int64_t>& dims = {}, uint32_t seed = 0, bool allow_random = false);

// Whether the model is a decoder in the past/present layout `generate` drives (models/generate.h).
bool IsDecoder(const Model& model);

// For a decoder, the workload `generate` runs: a short generation (prefill of 8 tokens and 3
// decode steps, models/generate.h DecoderTraceWorkload); empty for other models.
Workload DecoderWorkload(const Model& model);

// float16 weight storage for `generate` and `run`: asked for (--half-weights), or recorded in the
// model by `fuse --safe --half-weights` after its gate, unless --float32-weights (or reference
// kernels) keep float32; throws when both flags are given. Prints a line when the metadata
// turned it on, unless quiet.
HalfWeights ChooseHalfWeights(const Model& model, bool half_weights, bool float32_weights, bool reference_kernels,
                              bool quiet);

// The help text of -i.
inline constexpr const char* kInputHelp =
    "sample input: NAME=FILE.npy|FILE.pb or FILE.npy|FILE.pb by position (together one sample), or a test_data_set_N folder (one sample each; "
    "repeatable); symbolic dims are bound from them, inputs not given are made to match; a TorchScript model "
    "needs them to be exported to ONNX";

// The help text of -i of the commands that only read a model (info, dump, check).
inline constexpr const char* kTorchScriptInputHelp =
    "sample input NAME=FILE.npy|FILE.pb or FILE.npy|FILE.pb by position: a TorchScript model is exported to ONNX "
    "with them (an ONNX model's are checked against its inputs)";

}  // namespace gaf::cli
