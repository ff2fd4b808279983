#include "models/cnn.h"

#include <fmt/ranges.h>

#include <cmath>
#include <random>

#include "ir/error.h"
#include "models/builder.h"

namespace gaf {

using models::FloatAttr;
using models::GraphBuilder;
using models::IntAttr;
using models::IntsAttr;
using models::MakeValueInfo;

CnnConfig CnnPreset(const std::string& name) {
  CnnConfig c;
  c.preset = name;
  if (name == "tiny") {
    c.image_size = 32;
    c.num_classes = 10;
    c.stage_channels = {16, 32, 64};
    c.blocks_per_stage = 2;
  } else if (name == "small") {
    c.image_size = 64;
    c.num_classes = 1000;
    c.stage_channels = {32, 64, 128, 256};
    c.blocks_per_stage = 1;
  } else {
    throw Error(fmt::format("unknown cnn preset '{}' (expected tiny or small)", name));
  }
  return c;
}

std::vector<std::string> CnnPresetNames() { return {"tiny", "small"}; }

namespace {

class CnnBuilder {
 public:
  explicit CnnBuilder(const CnnConfig& c) : c_(c), b_(&model_.graph), rng_(c.seed) {}

  Model Build() {
    Graph& g = model_.graph;
    g.name = "main_graph";
    model_.ir_version = 8;
    model_.opset_imports = {OpsetImport{"", 17}};
    model_.producer_name = "graph-autofusion";
    model_.producer_version = "0.1";
    model_.doc_string = "ResNet-style classifier with seeded random weights (graph-autofusion example)";
    const Dim batch = Dim::Symbolic("batch_size");
    g.inputs.push_back(MakeValueInfo("input", DataType::kFloat,
                                     {batch, Dim::Known(3), Dim::Known(c_.image_size), Dim::Known(c_.image_size)}));
    g.outputs.push_back(MakeValueInfo("output", DataType::kFloat, {batch, Dim::Known(c_.num_classes)}));

    int64_t ch = c_.stage_channels[0];
    std::string x = ConvBn("", "", "conv1", "bn1", "input", 3, ch, 3, 1);
    x = b_.Op("/relu", "Relu", {x});
    x = b_.Op("/maxpool", "MaxPool", {x},
              {IntsAttr("kernel_shape", {3, 3}), IntsAttr("strides", {2, 2}), IntsAttr("pads", {1, 1, 1, 1})});
    for (size_t st = 0; st < c_.stage_channels.size(); ++st) {
      const std::string layer = fmt::format("layer{}", st + 1);
      for (int64_t bi = 0; bi < c_.blocks_per_stage; ++bi) {
        const int64_t out_ch = c_.stage_channels[st];
        const int64_t stride = (st > 0 && bi == 0) ? 2 : 1;
        x = BasicBlock(fmt::format("/{}/{}.{}", layer, layer, bi), fmt::format("{}.{}.", layer, bi), x, ch, out_ch,
                       stride);
        ch = out_ch;
      }
    }
    x = b_.Op("/avgpool", "GlobalAveragePool", {x});
    x = b_.Op("", "Flatten", {x}, {IntAttr("axis", 1)});
    const float bound = 1.f / std::sqrt(static_cast<float>(ch));
    std::string w = b_.Init("fc.weight", models::RandomUniform(rng_, {c_.num_classes, ch}, -bound, bound));
    std::string bias = b_.Init("fc.bias", models::RandomUniform(rng_, {c_.num_classes}, -bound, bound));
    b_.Op("/fc", "Gemm", {x, w, bias}, {FloatAttr("alpha", 1.f), FloatAttr("beta", 1.f), IntAttr("transB", 1)},
          {"output"});

    auto& md = model_.metadata_props;
    md.emplace_back("generator", "graph-autofusion example cnn");
    md.emplace_back("preset", c_.preset);
    md.emplace_back("model_type", "resnet");
    md.emplace_back("image_size", std::to_string(c_.image_size));
    md.emplace_back("num_classes", std::to_string(c_.num_classes));
    md.emplace_back("stage_channels", fmt::format("{}", fmt::join(c_.stage_channels, ",")));
    md.emplace_back("blocks_per_stage", std::to_string(c_.blocks_per_stage));
    md.emplace_back("seed", std::to_string(c_.seed));
    md.emplace_back("parameters", std::to_string(b_.num_parameters()));
    return std::move(model_);
  }

 private:
  // Conv (no bias, He init) + BatchNormalization with non-trivial statistics.
  // `wp` prefixes the parameter names ("layer1.0."), `scope` the node names ("/layer1/layer1.0").
  std::string ConvBn(const std::string& scope, const std::string& wp, const std::string& conv, const std::string& bn,
                     const std::string& x, int64_t in_ch, int64_t out_ch, int64_t k, int64_t stride) {
    const float std = std::sqrt(2.f / static_cast<float>(in_ch * k * k));
    std::string w = b_.Init(wp + conv + ".weight", models::RandomNormal(rng_, {out_ch, in_ch, k, k}, 0.f, std));
    const int64_t p = k / 2;
    std::string y = b_.Op(scope + "/" + conv, "Conv", {x, w},
                          {IntsAttr("dilations", {1, 1}), IntAttr("group", 1), IntsAttr("kernel_shape", {k, k}),
                           IntsAttr("pads", {p, p, p, p}), IntsAttr("strides", {stride, stride})});
    std::string scale = b_.Init(wp + bn + ".weight", models::RandomUniform(rng_, {out_ch}, 0.5f, 1.5f));
    std::string bias = b_.Init(wp + bn + ".bias", models::RandomNormal(rng_, {out_ch}, 0.f, 0.1f));
    std::string mean = b_.Init(wp + bn + ".running_mean", models::RandomNormal(rng_, {out_ch}, 0.f, 0.1f));
    std::string var = b_.Init(wp + bn + ".running_var", models::RandomUniform(rng_, {out_ch}, 0.5f, 1.5f));
    return b_.Op(scope + "/" + bn, "BatchNormalization", {y, scale, bias, mean, var},
                 {FloatAttr("epsilon", 1e-5f), FloatAttr("momentum", 0.9f)});
  }

  std::string BasicBlock(const std::string& s, const std::string& prefix, const std::string& x, int64_t in_ch,
                         int64_t out_ch, int64_t stride) {
    std::string y = ConvBn(s, prefix, "conv1", "bn1", x, in_ch, out_ch, 3, stride);
    y = b_.Op(s + "/relu", "Relu", {y});
    y = ConvBn(s, prefix, "conv2", "bn2", y, out_ch, out_ch, 3, 1);
    std::string shortcut = x;
    if (stride != 1 || in_ch != out_ch)
      shortcut = ConvBn(s + "/downsample", prefix, "downsample.0", "downsample.1", x, in_ch, out_ch, 1, stride);
    std::string sum = b_.Op(s, "Add", {y, shortcut});
    return b_.Op(s + "/relu_1", "Relu", {sum});
  }

  const CnnConfig& c_;
  Model model_;
  GraphBuilder b_;
  std::mt19937 rng_;
};

}  // namespace

Model BuildCnnModel(const CnnConfig& config) {
  GAF_CHECK(config.image_size >= 8 && config.num_classes > 0 && !config.stage_channels.empty() &&
                config.blocks_per_stage > 0,
            "cnn config: image_size >= 8, num_classes > 0, at least one stage and one block per stage");
  for (int64_t ch : config.stage_channels) GAF_CHECK(ch > 0, "cnn config: stage channels must be positive");
  return CnnBuilder(config).Build();
}

}  // namespace gaf
