// The workload a model is measured on: one or more sets of input values, one run of the model
// each. Fusion decisions (shapes recorded for the cost model, the kernels generated for each call
// site, the safe-fusion gates) are made on it, so they hold for what the user runs: inputs given
// with -i (files, test_data_set_N folders), a short generation for decoders (prefill and decode
// steps), or random inputs whose symbolic dims are bound consistently.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace gaf {

using Feeds = std::map<std::string, Tensor>;

struct Workload {
  std::vector<Feeds> samples;  // one run each
  std::string source;          // how it was obtained, for reports ("inputs given with -i", ...)
  bool empty() const { return samples.empty(); }
};

// Implemented in cost/workload.cc (gaf_cost). See the comment there for how symbolic dims are
// bound and which values integer inputs get.
//
// Bindings of the model's symbolic input dims: from the given inputs (their shapes), then from
// `dims` (--dim), then consistent defaults found by running the model (relations such as
// total_sequence_length = past_sequence_length + sequence_length). Throws gaf::Error when given
// inputs disagree about a dim, or when no binding found lets the model run (naming the node and
// the dims, and how to bind them).
std::map<std::string, int64_t> BindDims(const Model& model, const Feeds& given = {},
                                        const std::map<std::string, int64_t>& dims = {}, uint32_t seed = 0);

// One sample: the given inputs, plus every other input filled with values of the consistent
// binding (floats uniform in [-1, 1], masks 1, token ids below the vocabulary, positions offset by
// the past length, scalars the model compares against constants set to such a constant). Checks
// each given input's name, dtype and rank against the model (gaf::Error naming the input).
Feeds CompleteFeeds(const Model& model, const Feeds& given = {}, const std::map<std::string, int64_t>& dims = {},
                    uint32_t seed = 0);

// One sample of random inputs (CompleteFeeds with nothing given); source says so.
Workload DefaultWorkload(const Model& model, const std::map<std::string, int64_t>& dims = {}, uint32_t seed = 0);

// The size of the smallest constant table a Gather indexes with `input` (through Cast, Reshape,
// Unsqueeze, ...): a decoder's vocabulary for input_ids. -1 when it indexes none.
int64_t GatherTableSize(const Model& model, const std::string& input);

}  // namespace gaf
