// Patterns as data, and the matcher.
//
// A pattern is a small DAG of operator nodes ending in one root. Each pattern node names the op
// types it accepts and, per input slot, what must feed it:
//   - another pattern node (by id),
//   - a pattern input "$name" (any value; the same name twice must bind the same value),
//   - a constant "#2.0" (a scalar initializer or Constant node equal to 2.0 within 1e-5 relative:
//     exporters truncate constants such as sqrt(2)),
//     or a captured constant "#eps" (any scalar constant, captured under that name),
//   - "*" (anything, not captured).
// Commutative ops (Add, Mul, Max, Min, Sum, And, Or, Xor, Equal) match their two inputs in either
// order. Attribute constraints compare the node's attribute (or the ONNX default when absent)
// with the given value. Interior values (outputs of non-root pattern nodes) must have no consumer
// outside the match and must not be graph outputs; otherwise the match is rejected with a reason.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/limits.h"

namespace gaf {

struct PatternNode {
  std::string id;                   // unique within the pattern
  std::vector<std::string> ops;     // accepted op types (any of)
  std::vector<std::string> inputs;  // per input slot: node id, "$x", "#2.0", "#eps", "*"
  // Attribute constraints: name -> value text ("-1", "[-1]", "1e-5", "\"tanh\""). An axes
  // constraint also accepts the axes given as a constant input (opset 13/18 forms).
  std::map<std::string, std::string> attrs;
  bool allow_extra_inputs = false;  // true: slots beyond `inputs` may be present (optional inputs)
  // Additions (rule format: docs/rule_format.md).
  // The single listed input may sit in any input slot (pairs and chains: "op2 consumes op1").
  bool input_any_slot = false;
  // This node's outputs may also be used outside the group (they become extra outputs of the
  // fused op, like SkipLayerNormalization's sum output); otherwise the interior rule applies.
  bool output_escapes = false;
  // Other forms of the same node (same id), tried in order after this one: "Div(d, std) | Mul(d, inv)".
  // Their own alternatives, output_escapes and id are ignored.
  std::vector<PatternNode> alternatives;
};

struct Pattern {
  std::vector<PatternNode> nodes;  // the last node is the root
  const PatternNode* Find(const std::string& id) const;
};

struct PatternMatch {
  std::vector<int> nodes;                         // graph node indices, topological order
  std::map<std::string, int> node_of;             // pattern node id -> graph node index
  std::map<std::string, std::string> inputs;      // "$x" -> value name
  std::map<std::string, double> constants;        // "#eps" -> value
  std::vector<std::string> external_inputs;       // values read from outside, in first-use order
  std::vector<std::string> external_outputs;      // values used outside (the root's outputs, ...)
  std::map<std::string, std::string> attrs;       // "@axes" -> "[-1]" (captured attribute values)
};

// Work the matcher may do: every goal solved and every node form tried is one step, so a
// pattern whose choices multiply (alternatives, commutative orders) ends when the budget is
// spent instead of backtracking for hours. Share one budget over the attempts of a rule on a
// graph (TryRule does); the default is GlobalLimits().max_match_steps (ir/limits.h).
struct MatchBudget {
  int64_t max_steps = GlobalLimits().max_match_steps;
  int64_t steps_taken = 0;
  bool exhausted = false;  // a MatchAt gave up: the pattern may match where it was not tried
};

// Tries to match `pattern` rooted at graph node `root`. On failure returns nullopt and, when
// `why` is given, a sentence saying which constraint failed (or that the budget was spent:
// budget->exhausted is then true). Without a budget the attempt gets one of its own.
std::optional<PatternMatch> MatchAt(const Graph& g, const GraphIndex& index, const Pattern& pattern, int root,
                                    std::string* why = nullptr, MatchBudget* budget = nullptr);

// Input node references may name an output slot: "split:1" (default: output 0).
// Attribute constraint values may be captures "@name": any value, equal wherever the name is used.

// Scalar value of a constant value (initializer or Constant node output with one element).
std::optional<double> ConstantScalar(const Graph& g, const GraphIndex& index, const std::string& value);

// Canonicalization before matching, so exporter variants look alike: removes Identity and
// inference Dropout, no-op Cast (same type) and Reshape/Expand to the same known shape, folds
// constant subgraphs (Shape of known shapes, arithmetic on constants) into initializers, turns
// Constant nodes into initializers, rewrites Div by a constant into Mul by its reciprocal
// only where a rule needs it (rules accept both forms instead). Returns one line per change.
std::vector<std::string> Canonicalize(Model& model);

// Constant value of `value` when it is an initializer, a Constant node's output, or a Cast of one
// (nullopt otherwise). Used by the matcher and by canonicalization.
std::optional<Tensor> ConstantTensor(const Graph& g, const GraphIndex& index, const std::string& value);

// Value of a Constant node's value/value_float/value_int/value_floats/value_ints attribute.
std::optional<Tensor> ConstantNodeValue(const Node& n);

// Ops whose two inputs may be swapped (Add, Mul, Max, Min, Sum, And, Or, Xor, Equal).
bool IsCommutative(const std::string& op_type);

}  // namespace gaf
