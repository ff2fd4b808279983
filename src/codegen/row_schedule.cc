// Stages 3 and 4 of the row-kernel generator: what each primitive is (a value along the row or one
// per row, in which loop of the row it is computed) and what the emitter keeps where.
#include <fmt/format.h>

#include <algorithm>

#include "codegen/row_program.h"

namespace gaf {
namespace rowgen {

// Classifies each input against the domain (RowInputClass, the kernel's signature) and derives
// every primitive's kind and level: inputs read along the row (FULL, ROWVEC, GENERAL) are row
// values, the others row scalars; a reduction turns a row value into a row scalar of the next
// level (the loop after the one that accumulates it). Slice/Concat and reductions need row values.
bool ClassifyRowPrims(const RowDomainPlan& plan, const std::vector<int>& input_prim, GeneratedRowKernel* g,
                      Lowering* lw) {
  const size_t nin = input_prim.size();
  std::vector<std::vector<int64_t>> offsets(nin);  // the tables are built per call (PlanLaunch)
  g->signature.inputs.assign(nin, RowInputClass::kScalar);
  for (size_t i = 0; i < nin; ++i) {
    if (input_prim[i] < 0) continue;
    RowInputClass& c = g->signature.inputs[i];
    c = ClassifyRowInput(plan.shapes[i], plan.full, &offsets[i]);
    if (g->gather_index.size() > i && g->gather_index[i] >= 0) {
      // A gathered table: each row found through the offsets of its index (made per call).
      const Shape& s = plan.shapes[i];
      const int64_t d = s.empty() ? 1 : s.back();
      if (d != plan.cols && d != 1) {
        g->reason = fmt::format("gathered input {} has rows of width {}, the group's rows are {} wide", i, d, plan.cols);
        return false;
      }
      c = d == plan.cols ? RowInputClass::kGeneral : RowInputClass::kGeneralPerRow;
      continue;
    }
    // With one row, an input whose leading dims are all 1 is both its own row and a row shared by
    // all rows: a constant (a weight) is read as shared, so the one-row variant (decode) is the
    // same code as the many-row one (prefill).
    if (plan.rows == 1 && plan.constant.size() > i && plan.constant[i]) {
      if (c == RowInputClass::kFull) c = RowInputClass::kRowVec;
      if (c == RowInputClass::kPerRow) c = RowInputClass::kScalar;
    }
  }
  std::vector<Prim>& P = lw->prims;
  for (Prim& p : P) {
    switch (p.kind) {
      case PrimKind::kInput: {
        RowInputClass c = g->signature.inputs[p.input];
        p.vkind = (c == RowInputClass::kFull || c == RowInputClass::kRowVec || c == RowInputClass::kGeneral)
                      ? VKind::kRow : VKind::kScal;
        p.level = 0;
        break;
      }
      case PrimKind::kConst: p.vkind = VKind::kScal; p.level = 0; break;
      case PrimKind::kUnary: p.vkind = P[p.a].vkind; p.level = P[p.a].level; break;
      case PrimKind::kBinary:
        p.vkind = (P[p.a].vkind == VKind::kRow || P[p.b].vkind == VKind::kRow || (p.c >= 0 && P[p.c].vkind == VKind::kRow))
                      ? VKind::kRow : VKind::kScal;
        p.level = std::max({P[p.a].level, P[p.b].level, p.c >= 0 ? P[p.c].level : 0});
        break;
      case PrimKind::kSlice:
      case PrimKind::kConcat:
        if (P[p.a].vkind != VKind::kRow || (p.b >= 0 && P[p.b].vkind != VKind::kRow)) {
          g->reason = "Slice/Concat of a value that is constant along the row";
          return false;
        }
        p.vkind = VKind::kRow;
        p.level = std::max(P[p.a].level, p.b >= 0 ? P[p.b].level : 0);
        break;
      case PrimKind::kReduce:
        if (P[p.a].vkind != VKind::kRow) {
          g->reason = "a reduction over a dimension of size 1";
          return false;
        }
        p.vkind = VKind::kScal;
        p.level = P[p.a].level + 1;
        break;
    }
  }
  return true;
}

namespace {

// Outputs must have the domain's shape (row values) or the domain's shape with last dim 1 (row
// scalars), and be computed (not an input or a constant passed through).
bool CheckOutputs(const Function& f, const RowDomainPlan& plan, const Lowering& lw, GeneratedRowKernel* g,
                  RowSchedule* s) {
  const std::vector<Prim>& P = lw.prims;
  for (size_t oi = 0; oi < f.outputs.size(); ++oi) {
    const std::string& o = f.outputs[oi];
    auto it = lw.id.find(o);
    if (it == lw.id.end()) {
      g->reason = fmt::format("output '{}' is not computed by supported operators", o);
      return false;
    }
    const Prim& p = P[it->second];
    if (p.vt != VType::kF32) {
      g->reason = fmt::format("output '{}' is {}; generated kernels write float32, float16 or bfloat16", o,
                              CTypeOf(p.vt));
      return false;
    }
    Shape per_row = plan.full;
    per_row.back() = 1;
    bool is_row = p.vkind == VKind::kRow;
    g->signature.output_squeezed.push_back(lw.squeezed.count(it->second) > 0);
    // A row value whose shape is the domain's with leading ones in front (an Unsqueeze of a lower-
    // rank mask inside the body) is written through a view that adds them.
    Shape shape = p.shape;
    if (is_row && shape.size() > plan.full.size()) {
      const size_t extra = shape.size() - plan.full.size();
      const bool ones = std::all_of(shape.begin(), shape.begin() + static_cast<std::ptrdiff_t>(extra),
                                    [](int64_t d) { return d == 1; });
      if (ones && Shape(shape.begin() + static_cast<std::ptrdiff_t>(extra), shape.end()) == plan.full &&
          oi < g->output_views.size()) {
        RowViewStep st;
        st.kind = RowViewStep::Kind::kUnsqueeze;
        for (size_t k = 0; k < extra; ++k) st.axes.push_back(static_cast<int64_t>(k));
        g->output_views[oi].insert(g->output_views[oi].begin(), st);
        shape = plan.full;
      }
    }
    if ((is_row && shape != plan.full) || (!is_row && p.shape != per_row) || p.kind == PrimKind::kInput ||
        p.kind == PrimKind::kConst) {
      g->reason = fmt::format("output '{}' has shape {}, not the group's row domain {}", o, ShapeToString(p.shape),
                              ShapeToString(plan.full));
      return false;
    }
    s->out_prim.push_back(it->second);
    g->signature.output_per_row.push_back(!is_row);
  }
  for (size_t k = 0; k < s->out_prim.size(); ++k) s->out_index.emplace(s->out_prim[k], static_cast<int>(k));
  return true;
}

// Narrow values (a Slice's part of the row) may only feed other narrow values, Slice or Concat;
// an input must not be narrow.
bool CheckNarrow(const RowDomainPlan& plan, const Lowering& lw, GeneratedRowKernel* g, RowSchedule* s) {
  const std::vector<Prim>& P = lw.prims;
  s->narrow.assign(P.size(), false);
  for (size_t v = 0; v < P.size(); ++v)
    s->narrow[v] = P[v].vkind == VKind::kRow && !P[v].shape.empty() && P[v].shape.back() != plan.cols;
  for (size_t v = 0; v < P.size(); ++v) {
    const Prim& p = P[v];
    if (p.kind == PrimKind::kInput && s->narrow[v]) {
      g->reason = fmt::format("input {} has rows of width {}, the group's rows are {} wide", p.input, p.shape.back(),
                              plan.cols);
      return false;
    }
    bool consumer_ok = p.kind == PrimKind::kSlice || p.kind == PrimKind::kConcat || s->narrow[v];
    for (int operand : {p.a, p.b, p.c})
      if (operand >= 0 && s->narrow[operand] && !consumer_ok) {
        g->reason = "part of a row (a Slice) is used other than through Concat back to the full row";
        return false;
      }
  }
  return true;
}

// Which primitives the outputs need (live), how many loops a row takes, and which row values are
// read by a later loop than their own (buffered: written to a row buffer; inputs are re-read).
void Liveness(const Lowering& lw, RowSchedule* s) {
  const std::vector<Prim>& P = lw.prims;
  s->live.assign(P.size(), false);
  std::vector<int> stack(s->out_prim.begin(), s->out_prim.end());
  while (!stack.empty()) {
    int v = stack.back();
    stack.pop_back();
    if (s->live[v]) continue;
    s->live[v] = true;
    if (P[v].a >= 0) stack.push_back(P[v].a);
    if (P[v].b >= 0) stack.push_back(P[v].b);
    if (P[v].c >= 0) stack.push_back(P[v].c);
  }
  s->buffered.assign(P.size(), false);
  s->max_level = 0;
  for (size_t v = 0; v < P.size(); ++v) {
    if (!s->live[v]) continue;
    s->max_level = std::max(s->max_level, P[v].level);
    int loop_level = P[v].kind == PrimKind::kReduce ? P[P[v].a].level : P[v].level;
    for (int operand : {P[v].a, P[v].b, P[v].c})
      if (operand >= 0 && P[operand].vkind == VKind::kRow && P[operand].kind != PrimKind::kInput &&
          P[operand].level < loop_level)
        s->buffered[operand] = true;
  }
}

}  // namespace

bool ScheduleRow(const Function& f, const RowDomainPlan& plan, const Lowering& lw, GeneratedRowKernel* g,
                 RowSchedule* sched) {
  if (!CheckOutputs(f, plan, lw, g, sched) || !CheckNarrow(plan, lw, g, sched)) return false;
  Liveness(lw, sched);
  return true;
}

}  // namespace rowgen
}  // namespace gaf
