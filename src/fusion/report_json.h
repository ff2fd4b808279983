// Machine-readable views of GraphAutoFusion's reports, shared by the CLI (`analyze --json`,
// `estimate --json`) and the Python package (dicts). Fields: docs/report_format.md.
#pragma once

#include <nlohmann/json.hpp>

#include "fusion/auto_fusion.h"

namespace gaf {

// True when the cost model gave the candidate figures (it has shapes and a verdict from them).
bool HasEstimate(const FusionCandidate& c);
// One candidate of AnalyzeFusionBenefit: rule, operators, nodes, verdict, reason, estimate.
nlohmann::json CandidateJson(const FusionCandidate& c, const HardwareProfile& hw);
// EstimateFusionBenefit: whole-model times, memory traffic, candidates by verdict.
nlohmann::json EstimateJson(const FusionEstimate& e);

}  // namespace gaf
