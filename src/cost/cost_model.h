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

#include "cost/workload.h"
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

  // --- additions (docs/cost_model.md) ---
  // Compute rate for other element types, keyed by ONNX type name ("float16", "bfloat16",
  // "tf32", "int8"); float32 and anything missing use peak_gflops.
  std::map<std::string, double> peak_gflops_by_dtype;
  std::string local_memory_note;  // what the budget is ("L2 per core", "shared memory per SM")
  int threads = 0;                // CPU threads the figures were measured with (0 = n/a)
  // Raw figures behind the profile (calibration measurements), kept for reports.
  std::map<std::string, double> measurements;

  double PeakGflopsFor(DataType dt) const;
  // Parses profile JSON text; `origin` (a file name) is named in errors.
  static HardwareProfile Parse(const std::string& json_text, const std::string& origin);
  std::string ToJson() const;
  // A built-in name ("host-cpu", "ascend910", "h200") or a path to a profile file.
  static HardwareProfile Resolve(const std::string& name_or_path);
  static std::vector<std::string> BuiltinNames();
  // Directory holding the profile files: $GAF_PROFILES_DIR, else the source tree's profiles/.
  static std::string ProfilesDir();
  // Conservative host defaults used when profiles/host-cpu.json is missing; source says so.
  static HardwareProfile HostDefaults();
};

// Concrete type and shape of every value of a graph, for one binding of its symbolic dims.
struct ValueShape {
  DataType dtype = DataType::kUndefined;
  Shape shape;
  bool known = false;
};
using ShapeMap = std::map<std::string, ValueShape>;

// Records the concrete shapes of all values by running the model once on random inputs whose
// symbolic dims are bound consistently with the graph (cost/workload.cc: `dims` first, then
// defaults and the relations the graph shows, e.g. total = past + sequence). Throws gaf::Error
// naming the node and the dims when no binding found lets the model run.
ShapeMap RecordShapes(const Model& model, const std::map<std::string, int64_t>& dims = {});
// The same on given inputs (missing ones filled with the binding the given ones imply): one run;
// gaf::Error when it fails.
ShapeMap RecordShapes(const Model& model, const Feeds& feeds);

// The random inputs RecordShapes uses (CompleteFeeds of cost/workload.h with nothing given).
std::map<std::string, Tensor> RandomFeeds(const Model& model, const std::map<std::string, int64_t>& dims = {},
                                          uint32_t seed = 0);

struct OpCost {
  double flops = 0;
  double bytes_read = 0;
  double bytes_written = 0;
};
// FLOPs and bytes of one node from its input/output shapes (op-specific formulas for
// contractions, reductions, normalizations; elementwise = one op per output element).
OpCost EstimateNodeCost(const Node& node, const ShapeMap& shapes);

// Roofline time of one kernel in microseconds: max(flops / peak(dt), bytes / bandwidth) + overhead.
double KernelTimeUs(const OpCost& cost, const HardwareProfile& hw, DataType dt = DataType::kFloat);
// Time of one node run as its own kernel (no overhead for aliasing ops such as Reshape, which
// move no data and launch nothing).
double NodeTimeUs(const Node& node, const ShapeMap& shapes, const HardwareProfile& hw);
// Ops whose output is a view of the input (Reshape, Squeeze, Unsqueeze, Flatten, Identity).
bool IsAliasingOp(const Node& node);

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
// Same, reusing a GraphIndex of `g` (analysis of many candidates of one graph).
GroupCost EstimateGroupCost(const Graph& g, const std::vector<int>& nodes, const ShapeMap& shapes,
                            const HardwareProfile& hw, const GraphIndex& index);

}  // namespace gaf
