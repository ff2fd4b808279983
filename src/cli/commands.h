// Subcommands of the `autofusion` CLI. Each Add*Command registers its options on the app and
// sets a callback that runs it; errors propagate as gaf::Error and are printed by main().
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ir/tensor.h"
#include "runtime/session.h"

namespace gaf::cli {

void AddInfoCommand(CLI::App& app);
void AddRunCommand(CLI::App& app);
void AddDumpCommand(CLI::App& app);
void AddCheckCommand(CLI::App& app);
void AddExampleCommand(CLI::App& app);   // example.cc
void AddGenerateCommand(CLI::App& app);  // generate.cc
void AddCalibrateCommand(CLI::App& app);  // calibrate.cc
void AddFusionCommands(CLI::App& app);   // fusion_cmds.cc: analyze, estimate, fuse, explain
void AddKernelCommands(CLI::App& app);   // kernel_cmds.cc: compile, verify, bench

// Read bandwidth of this machine in GB/s (1e9 bytes/s): the median of `repeats` sums of the float
// tensor `a` (far larger than the caches; a tensor's large buffers are on huge pages, as a model's
// weights are) after a warm-up, on the current OpenMP thread count (calibrate.cc; bench's
// bandwidth floor of a decode step).
double ReadBandwidthGbs(const Tensor& a, int repeats);

// Prints the `count` slowest plan nodes of the session's profile (SessionOptions::profile), each
// with ms a call, ms in all, its op type and calls, under a heading naming `what` was profiled
// (info_run.cc; `run --profile-nodes`, `generate --profile-nodes`).
void PrintSlowestNodes(const Session& session, int count, const std::string& what);

// NAME=VALUE bindings of symbolic dims (--dim); gaf::Error naming a malformed one.
std::map<std::string, int64_t> ParseDimBindings(const std::vector<std::string>& dims);

}  // namespace gaf::cli
