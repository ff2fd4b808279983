// autofusion: the command-line interface of graph-autofusion.
#include <google/protobuf/stubs/common.h>

#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "ir/error.h"

int main(int argc, char** argv) {
  CLI::App app{"graph-autofusion: automatic, safe operator fusion for ONNX models"};
  app.require_subcommand(1);
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
