// Which calls of model-local functions (fused operators) the session's own plan runs better than
// a kernel for the call would.
//
// The plan rewrites (runtime/plan_rewrite.h) replace patterns of the unfused graph by one native
// operator each: attention that reads a key/value cache where it is and appends to it in place,
// products of one input by several weights on their packed panels, RMSNorm, rotary embedding,
// SwiGLU's gate. A fused model that keeps such a pattern as a function call hides it from those
// rewrites: a generated kernel then runs the body on row-major weights, and for attention the
// cache's Concat and the repeat of grouped-query heads stay outside the call (two copies of the
// whole cache a decode step). So a session first inlines every call on a copy of the graph, runs
// the rewrites there, and a call all of whose operators the rewrites replaced, among them one a
// kernel cannot match (attention over a cache, products on packed weights), is inlined instead of
// kept. The trial is run again with only those calls inlined, until it finds the same ones: a
// call whose operators were replaced only together with those of a call that keeps its kernel is
// dropped. Row operators alone (RMSNorm, rotary, SiLU gate, masked softmax) leave the call's kernel:
// it is one pass as well.
#pragma once

#include <map>
#include <string>

#include "ir/graph.h"

namespace gaf {

// Calls of `model`'s main graph (keyed by their first output, or their name without outputs)
// every operator of whose body, once inlined, RewriteProducts(…, group_siblings, fold_residuals) replaces by the
// plan's operators, one of them FusedAttention, GroupedMatMul or SiblingMatMul; the value names
// the operators and what they do that a kernel cannot ("SiLUGate, SiblingMatMul (products of one
// input on weights packed at load)"). Calls the rewrites leave one operator of are not in it: there
// the call's kernel does more in one pass than the plan would.
std::map<std::string, std::string> CallsThePlanRewrites(const Model& model, bool group_siblings,
                                                        bool fold_residuals = true);

}  // namespace gaf
