// The workload a model is measured on: one or more sets of input values, one run of the model
// each. Fusion decisions (shapes recorded for the cost model, the kernels generated for each call
// site, the safe-fusion gates) are made on it, so they hold for what the user runs: inputs given
// with -i (files, test_data_set_N folders), a short generation for decoders (prefill and decode
// steps), or random inputs whose symbolic dims are bound consistently.
#pragma once

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

}  // namespace gaf
