#include "cli/commands.h"

namespace gaf::cli {
void AddGenerateCommand(CLI::App& app) {}
}  // namespace gaf::cli
