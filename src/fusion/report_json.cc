#include "fusion/report_json.h"

namespace gaf {

using json = nlohmann::json;

bool HasEstimate(const FusionCandidate& c) {
  return c.verdict != Verdict::kMaybe && c.verdict != Verdict::kSkipIllegal && c.cost.time_before_us > 0;
}

json CandidateJson(const FusionCandidate& c, const HardwareProfile& hw) {
  json j{{"id", c.id},
         {"rule", c.rule},
         {"rule_source", c.rule_source},
         {"fused_op", c.fused_op},
         {"operators", c.op_types},
         {"nodes", c.node_names},
         {"inputs", c.inputs},
         {"outputs", c.outputs},
         {"verdict", VerdictName(c.verdict)},
         {"reason", c.reason}};
  if (HasEstimate(c)) {
    const GroupCost& k = c.cost;
    const double saving = k.time_before_us > 0 ? (k.time_before_us - k.time_after_us) / k.time_before_us : 0;
    j["estimate"] = {{"flops", k.flops},
                     {"bytes_before", k.bytes_before},
                     {"bytes_after", k.bytes_after},
                     {"round_trips_before", k.round_trips_before},
                     {"round_trips_after", k.round_trips_after},
                     {"time_before_us", k.time_before_us},
                     {"time_after_us", k.time_after_us},
                     {"predicted_saving", saving},
                     {"gflops_before", k.gflops_before},
                     {"gflops_after", k.gflops_after},
                     {"footprint_bytes", k.footprint_bytes},
                     {"local_memory_bytes", hw.local_memory_bytes},
                     {"fits_local_memory", k.fits_local_memory},
                     {"tiling", k.tiling},
                     {"formula", k.formula}};
  } else {
    j["estimate"] = nullptr;
  }
  return j;
}

json EstimateJson(const FusionEstimate& e) {
  const double t_red = e.time_before_us > 0 ? 1 - e.time_after_us / e.time_before_us : 0;
  const double b_red = e.bytes_before > 0 ? 1 - e.bytes_after / e.bytes_before : 0;
  return json{{"profile", e.profile},
              {"candidates", e.candidates},
              {"fused", e.fused},
              {"skipped_by_reason", e.skipped_by_reason},
              {"time_before_us", e.time_before_us},
              {"time_after_us", e.time_after_us},
              {"performance_improvement", t_red},
              {"predicted_speedup", e.predicted_speedup},
              {"bytes_before", e.bytes_before},
              {"bytes_after", e.bytes_after},
              {"memory_traffic_reduction", b_red},
              {"nodes_before", e.nodes_before},
              {"nodes_after", e.nodes_after},
              {"note", e.note}};
}

}  // namespace gaf
