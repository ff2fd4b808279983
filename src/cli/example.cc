// `autofusion example llama|cnn`: writes a built-in example model with seeded random weights.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <filesystem>
#include <memory>

#include "cli/commands.h"
#include "models/cnn.h"
#include "models/llama.h"
#include "onnx_io/onnx_io.h"
#include "ir/output_file.h"

namespace gaf::cli {
namespace fs = std::filesystem;

namespace {

constexpr size_t kExternalDataThreshold = size_t{100} << 20;  // weights over 100 MB go to model.onnx.data

std::string HumanSize(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (b >= 1024 && u < 3) {
    b /= 1024;
    ++u;
  }
  return fmt::format("{:.1f} {}", b, units[u]);
}

struct ExampleArgs {
  std::string preset = "tiny";
  std::string output_dir;
  uint32_t seed = 0;
  int64_t opset = 17;  // llama only
  bool no_check = false;
};

int64_t WeightBytes(const Model& m) {
  int64_t bytes = 0;
  for (const auto& [name, t] : m.graph.initializers) bytes += static_cast<int64_t>(t.nbytes());
  return bytes;
}

// Checks, saves (with external data when large) and reports.
void WriteExample(const Model& model, const ExampleArgs& a, const std::string& summary, int64_t params) {
  const std::string scope = CheckerScope(model);
  if (!a.no_check && scope.empty()) {
    std::string msg = CheckModel(model);
    GAF_CHECK(msg.empty(), "the built model fails the ONNX checker (a bug): {}", msg);
  }
  CheckOutputDir(a.output_dir, "-o");
  fs::create_directories(a.output_dir);
  const std::string path = (fs::path(a.output_dir) / "model.onnx").string();
  SaveOptions so;
  const int64_t weight_bytes = WeightBytes(model);
  if (static_cast<size_t>(weight_bytes) > kExternalDataThreshold) so.external_data = true;
  const std::string data = SaveModel(model, path, so);
  uintmax_t size = fs::file_size(path);
  std::string files = fmt::format("{} ({})", path, HumanSize(static_cast<double>(size)));
  if (!data.empty()) {
    uintmax_t dsize = fs::file_size(data);
    files += fmt::format(" + {} ({})", data, HumanSize(static_cast<double>(dsize)));
    size += dsize;
  }
  fmt::print("wrote {}\n", files);
  fmt::print("parameters {} ({} fp32), {} nodes, total size {}{}\n", params, HumanSize(static_cast<double>(weight_bytes)),
             model.graph.nodes.size(), HumanSize(static_cast<double>(size)),
             a.no_check ? "" : scope.empty() ? ", passes the ONNX checker" : ", not checked: " + scope);
  fmt::print("{}\n", summary);
}

void RunLlama(const ExampleArgs& a) {
  LlamaConfig c = LlamaPreset(a.preset);
  c.seed = a.seed;
  c.opset = a.opset;
  auto t0 = std::chrono::steady_clock::now();
  Model m = BuildLlamaModel(c);
  double build_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string summary = fmt::format(
      "llama '{}': {} layers, hidden {}, {} heads ({} kv, head_dim {}), intermediate {}, vocab {}, max positions {}, "
      "seed {}, opset {} (built in {:.2f} s)",
      c.preset, c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim(), c.intermediate_size,
      c.vocab_size, c.max_position_embeddings, c.seed, c.opset, build_s);
  WriteExample(m, a, summary, LlamaParameterCount(c));
}

void RunCnn(const ExampleArgs& a) {
  CnnConfig c = CnnPreset(a.preset);
  c.seed = a.seed;
  Model m = BuildCnnModel(c);
  int64_t params = 0;
  for (const auto& [name, t] : m.graph.initializers) params += t.numel();
  std::string summary =
      fmt::format("cnn '{}': input [batch,3,{},{}], stages {} x {} basic blocks, {} classes, seed {}", c.preset,
                  c.image_size, c.image_size, fmt::join(c.stage_channels, "/"), c.blocks_per_stage, c.num_classes,
                  c.seed);
  WriteExample(m, a, summary, params);
}

void AddCommonOptions(CLI::App* cmd, ExampleArgs& a, const std::string& presets) {
  cmd->add_option("--preset,-p", a.preset, "model size: " + presets)->capture_default_str();
  cmd->add_option("-o,--output", a.output_dir, "output folder (model.onnx is written there)")->required();
  cmd->add_option("--seed", a.seed, "seed of the random weights")->capture_default_str();
  cmd->add_flag("--no-check", a.no_check, "skip the ONNX checker");
}

}  // namespace

void AddExampleCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("example", "Write a built-in example model (random weights, no downloads)");
  cmd->require_subcommand(1);

  auto llama = std::make_shared<ExampleArgs>();
  auto* l = cmd->add_subcommand("llama", "Llama-style decoder with KV cache in the Hugging Face Optimum layout");
  AddCommonOptions(l, *llama, "tiny (~130K params), small (~15M), bench (~200M, external data)");
  l->add_option("--opset", llama->opset,
                "17: attention, RMS norm and rotary embedding as torch.onnx.export writes them at opset 17; 23: as "
                "the operators Attention, RMSNormalization, RotaryEmbedding; 28: also SwiGLU (the same weights)")
      ->check(CLI::IsMember({17, 23, 28}))
      ->capture_default_str();
  l->callback([llama] { RunLlama(*llama); });

  auto cnn = std::make_shared<ExampleArgs>();
  auto* c = cmd->add_subcommand("cnn", "ResNet-style image classifier with BatchNormalization");
  AddCommonOptions(c, *cnn, "tiny (32x32, 10 classes), small (64x64, 1000 classes)");
  c->callback([cnn] { RunCnn(*cnn); });
}

}  // namespace gaf::cli
