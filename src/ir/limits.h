// Limits that keep untrusted input (model files, rule files, input files) from exhausting the
// machine: every size, loop and expansion a file can drive is checked against one of these, and
// going past one is a gaf::Error naming the limit and the flag that raises it. The CLI sets them
// from its global options (--max-memory, --max-loop-iterations, ...); the defaults are chosen so
// that real models never meet them.
#pragma once

#include <cstdint>
#include <string>

namespace gaf {

struct Limits {
  // Bytes one tensor (from a file, an input, or an operator's output) may take; default: half of
  // the machine's physical memory (--max-memory).
  int64_t max_tensor_bytes = 0;
  // Iterations of one Loop (or Scan) node (--max-loop-iterations).
  int64_t max_loop_iterations = int64_t{1} << 24;
  // Nodes a graph may grow to when model-local functions are inlined (--max-nodes).
  int64_t max_nodes = int64_t{1} << 22;
  // Nesting of subgraphs (If/Loop/Scan bodies) and of function calls.
  int max_nesting_depth = 64;
  // Steps one rule may take to match against one graph (pattern backtracking).
  int64_t max_match_steps = int64_t{1} << 22;
};

// The process-wide limits (set once by the CLI before any work; tests may change them).
Limits& GlobalLimits();

// Physical memory of this machine in bytes (0 when unknown).
int64_t PhysicalMemoryBytes();

// "12 GiB", "512 MiB", "100 B": for messages.
std::string FormatBytes(int64_t bytes);

// Parses "4G", "512M", "1.5GiB", "1000000" into bytes; throws gaf::Error on anything else.
int64_t ParseByteSize(const std::string& text);

}  // namespace gaf
