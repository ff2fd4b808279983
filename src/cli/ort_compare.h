// ONNX Runtime on the same model, for `bench`: the node scripts of the source tree's bench/
// (ort_generate.js for decoders, ort_run.js otherwise; $GAF_BENCH_DIR overrides the folder) with
// onnxruntime-node, all graph optimizations, the same thread count, one fresh process per round
// so that its rounds interleave with ours. Each script times what ours times (a decode step from
// its feeds to the argmax; session.run) and prints it; process start and model load are not timed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cost/workload.h"

namespace gaf::cli {

class OrtComparison {
 public:
  explicit OrtComparison(int threads);

  // Whether node and onnxruntime-node were found; else why not (one line, with the install step).
  bool available() const { return !node_.empty(); }
  const std::string& why() const { return why_; }
  const std::string& version() const { return version_; }  // onnxruntime-node's

  // A greedy generation of `tokens` new tokens after `prompt`: the median decode step in seconds
  // and the tokens. False with *why set when the script failed.
  bool TimeDecode(const std::string& model, const std::vector<int64_t>& prompt, int tokens, double* seconds,
                  std::vector<int64_t>* out, std::string* why) const;
  // Each sample's median of `repeat` session.run calls (after one untimed run), summed, in seconds.
  bool TimeRuns(const std::string& model, const std::vector<Feeds>& samples, int repeat, double* seconds,
                std::string* why) const;

 private:
  int threads_;
  std::string node_, dir_, why_, version_;
};

}  // namespace gaf::cli
