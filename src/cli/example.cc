#include "cli/commands.h"

namespace gaf::cli {
void AddExampleCommand(CLI::App& app) {}
}  // namespace gaf::cli
