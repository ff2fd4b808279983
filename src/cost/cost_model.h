// Hardware profiles and the cost model: bytes moved, FLOPs, estimated time of single operators
// and of fused groups, and a fused kernel's on-chip footprint against the local-memory budget.
//
// Time model (roofline plus launch overhead), per kernel:
//   t = max(flops / peak_flops, bytes / bandwidth) + kernel_overhead
// Unfused group: the sum over its operators, each reading its inputs from and writing its output
// to main memory. Fused group: one kernel reading the group's external inputs once and writing its
// external outputs once; interior values stay on chip (registers / cache / a tile buffer).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace gaf {

struct HardwareProfile {
  std::string name;            // "host-cpu", "ascend910", "h200"
  std::string description;
  double peak_gflops = 0;      // float32 compute rate
  double bandwidth_gbs = 0;    // main-memory read+write bandwidth
  double local_memory_bytes = 0;  // on-chip budget one fused kernel's working set must fit in
  double l1_bytes = 0, l2_bytes = 0, l3_bytes = 0;
  double kernel_overhead_us = 0;  // fixed cost per kernel launch / operator dispatch
  std::string source;          // "measured by autofusion calibrate on ..." or "vendor specification"

  // Loads a profile file (JSON, see docs/cost_model.md); errors name the file and field.
  static HardwareProfile Load(const std::string& path);
  // Built-in profiles by name: "host-cpu" (profiles/host-cpu.json if calibrated, else defaults
  // marked as such), "ascend910", "h200".
  static HardwareProfile Builtin(const std::string& name);
  void Save(const std::string& path) const;
};

// Concrete type and shape of every value of a graph, for one binding of its symbolic dims.
struct ValueShape {
  DataType dtype = DataType::kUndefined;
  Shape shape;
  bool known = false;
};
using ShapeMap = std::map<std::string, ValueShape>;

// Records the concrete shapes of all values by running the model once on random inputs
// (symbolic dims bound from `dims`, default 1 or as the name suggests). Exact for any model the
// runtime runs.
ShapeMap RecordShapes(const Model& model, const std::map<std::string, int64_t>& dims = {});

struct OpCost {
  double flops = 0;
  double bytes_read = 0;
  double bytes_written = 0;
};
// FLOPs and bytes of one node from its input/output shapes (op-specific formulas for
// contractions, reductions, normalizations; elementwise = one op per output element).
OpCost EstimateNodeCost(const Node& node, const ShapeMap& shapes);

struct GroupCost {
  double flops = 0;
  double bytes_before = 0;        // sum over operators of bytes read + written
  double bytes_after = 0;         // external inputs read once + external outputs written once
  int round_trips_before = 0;     // intermediate tensors written to and read back from memory
  int round_trips_after = 0;
  double time_before_us = 0;      // roofline + overhead, per formula above
  double time_after_us = 0;
  double gflops_before = 0;       // flops / time: the "estimated GFLOPS" of the original report
  double gflops_after = 0;
  double footprint_bytes = 0;     // on-chip working set of the fused kernel for `tiling`
  bool fits_local_memory = true;
  std::string tiling;             // e.g. "row of 4096 floats", "64x64 output tile"
  std::string formula;            // how the figures were computed, for reports
};
// `nodes` are indices into g.nodes forming the group.
GroupCost EstimateGroupCost(const Graph& g, const std::vector<int>& nodes, const ShapeMap& shapes,
                            const HardwareProfile& hw);

}  // namespace gaf
