// autofusion: the command-line interface of graph-autofusion.
#include <google/protobuf/stubs/common.h>

#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "ir/error.h"
#include "ir/limits.h"

int main(int argc, char** argv) {
  CLI::App app{"graph-autofusion: automatic, safe operator fusion for ONNX models"};
  app.require_subcommand(1);
  // Limits on what an untrusted model, rule or input file may make us do (ir/limits.h); global
  // options, accepted before or after the subcommand.
  app.fallthrough();
  gaf::Limits& limits = gaf::GlobalLimits();
  app.add_option_function<std::string>(
      "--max-memory",
      [&](const std::string& s) {
        try {
          limits.max_tensor_bytes = gaf::ParseByteSize(s);
        } catch (const gaf::Error& e) {
          throw gaf::Error(std::string("--max-memory: ") + e.what());
        }
      },
      "largest tensor a model, input or operator may allocate (e.g. 4G; default half the RAM: " +
                     gaf::FormatBytes(limits.max_tensor_bytes) + ")");
  app.add_option("--max-loop-iterations", limits.max_loop_iterations, "iterations one Loop/Scan node may run")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-nodes", limits.max_nodes, "nodes a graph may grow to when functions are inlined")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  gaf::cli::AddInfoCommand(app);
  gaf::cli::AddRunCommand(app);
  gaf::cli::AddDumpCommand(app);
  gaf::cli::AddCheckCommand(app);
  gaf::cli::AddExampleCommand(app);
  gaf::cli::AddGenerateCommand(app);
  gaf::cli::AddCalibrateCommand(app);
  gaf::cli::AddFusionCommands(app);
  gaf::cli::AddKernelCommands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const gaf::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
