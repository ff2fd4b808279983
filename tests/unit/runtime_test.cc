#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <string>

#include "runtime/session.h"
#include "test_util.h"

namespace gaf {
namespace {
using testing::FloatValue;
using testing::IntAttr;
using testing::MakeModel;
using testing::MakeNode;

// Opset 18 moved ReduceMean's axes to an input; opset 18 Split takes num_outputs. Models newer
// than the ONNX library we link (1.12 knows opset 17) must still run.
TEST(Runtime, Opset18ReduceMeanAxesInputAndSplitNumOutputs) {
  Graph g;
  g.inputs.push_back(FloatValue("x", {2, 6}));
  g.initializers.emplace_back("axes", Tensor::FromInt64s({-1}));
  g.nodes.push_back(MakeNode("ReduceMean", {"x", "axes"}, {"m"}, "mean", {IntAttr("keepdims", 1)}));
  g.nodes.push_back(MakeNode("Split", {"x"}, {"a", "b", "c"}, "split", {IntAttr("axis", 1), IntAttr("num_outputs", 3)}));
  g.outputs.push_back(FloatValue("m", {2, 1}));
  g.outputs.push_back(FloatValue("c", {2, 2}));
  Session s(MakeModel(g, 18));
  auto out = s.Run({{"x", Tensor::FromVector<float>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {2, 6})}});
  EXPECT_FLOAT_EQ(out[0].data<float>()[0], 2.5f);
  EXPECT_FLOAT_EQ(out[0].data<float>()[1], 8.5f);
  ASSERT_EQ(out[1].shape(), (Shape{2, 2}));
  EXPECT_FLOAT_EQ(out[1].data<float>()[0], 4.f);
  EXPECT_FLOAT_EQ(out[1].data<float>()[3], 11.f);
}

// ReduceMax of a row of -inf only is -inf, ReduceMin of +inf only +inf, whatever the compiler
// starts OpenMP's reduction copies at (clang: the lowest finite value, which made a fully masked
// attention row look unmasked in ONNX's Attention function body). Rows of 1 to 40 elements (the
// vector loop and its remainder), one with a finite value among them.
TEST(Runtime, ReduceMaxAndMinOfInfiniteRowsAreInfinite) {
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t n : {1, 15, 16, 17, 40}) {
    for (const char* op : {"ReduceMax", "ReduceMin"}) {
      const bool max = std::string(op) == "ReduceMax";
      Graph g;
      g.inputs.push_back(FloatValue("x", {2, n}));
      g.initializers.emplace_back("axes", Tensor::FromInt64s({-1}));
      g.nodes.push_back(MakeNode(op, {"x", "axes"}, {"m"}, "reduce", {IntAttr("keepdims", 0)}));
      g.outputs.push_back(FloatValue("m", {2}));
      Session s(MakeModel(g, 18));
      std::vector<float> x(static_cast<size_t>(2 * n), max ? -inf : inf);
      x[static_cast<size_t>(n + n / 2)] = 3.f;  // the second row has one finite value
      const Tensor m = s.Run({{"x", Tensor::FromVector<float>(x, {2, n})}})[0];
      EXPECT_EQ(m.data<float>()[0], max ? -inf : inf) << op << " " << n;
      EXPECT_EQ(m.data<float>()[1], 3.f) << op << " " << n;
    }
  }
}

// Slice with step 2 on the last axis (a detector's Focus block: x[..., 0::2, 1::2]) takes a
// vector path 16 elements at a time; rows of every length around it, both phases, and the last
// row of the tensor (whose vectors must not read past its end).
TEST(Runtime, SliceStepTwoOnTheLastAxis) {
  for (int64_t w : {2, 3, 31, 32, 33, 34, 35, 63, 64, 65, 416}) {
    for (int64_t start : {0, 1}) {
      Graph g;
      g.inputs.push_back(FloatValue("x", {2, 3, w}));
      g.initializers.emplace_back("starts", Tensor::FromInt64s({start, start}));
      g.initializers.emplace_back("ends", Tensor::FromInt64s({3, w}));
      g.initializers.emplace_back("axes", Tensor::FromInt64s({1, 2}));
      g.initializers.emplace_back("steps", Tensor::FromInt64s({2, 2}));
      g.nodes.push_back(MakeNode("Slice", {"x", "starts", "ends", "axes", "steps"}, {"y"}));
      const int64_t rows = start == 0 ? 2 : 1, cols = (w - start + 1) / 2;
      g.outputs.push_back(FloatValue("y", {2, rows, cols}));
      Session s(MakeModel(g, 13));
      std::vector<float> v(static_cast<size_t>(2 * 3 * w));
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
      const Tensor y = s.Run({{"x", Tensor::FromVector<float>(v, {2, 3, w})}})[0];
      ASSERT_EQ(y.shape(), (Shape{2, rows, cols})) << "w " << w << " start " << start;
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c)
            ASSERT_EQ(y.data<float>()[(b * rows + r) * cols + c], v[static_cast<size_t>((b * 3 + start + 2 * r) * w + start + 2 * c)])
                << "w " << w << " start " << start << " at " << b << "," << r << "," << c;
    }
  }
}

TEST(Runtime, TransposeOfEveryBlockAndRemainder) {
  // Shapes around the 8x8 register blocks and the 128x32 tiles (remainders on both axes), a
  // batched case and the detector head's [1, 85, 3549] -> [1, 3549, 85]; int32 as well (the
  // blocks move bits, whatever the 4-byte type), and int64 (the tiles element by element).
  // Permutations that keep the axes longer than 1 in order (a decode step's [1, 1, h, d] to
  // [1, h, 1, d]) move nothing: the output is the input's buffer (checked), the others are copies.
  const std::vector<std::pair<Shape, std::vector<int64_t>>> cases = {
      {{8, 8}, {1, 0}},           {{7, 9}, {1, 0}},          {{33, 17}, {1, 0}},
      {{1, 85, 3549}, {0, 2, 1}}, {{3, 40, 41}, {0, 2, 1}},  {{2, 5, 19, 23}, {0, 3, 1, 2}},
      {{2, 3, 16, 24}, {3, 2, 0, 1}}, {{1, 1, 4, 8}, {0, 2, 1, 3}}, {{2, 1, 3}, {1, 0, 2}},
      {{2, 1, 3}, {2, 1, 0}},     {{1, 5, 1, 7}, {3, 2, 1, 0}}, {{1, 1}, {1, 0}}};
  for (const auto& [shape, perm] : cases) {
    for (DataType dt : {DataType::kFloat, DataType::kInt32, DataType::kInt64}) {
      Graph g;
      ValueInfo xv{"x", dt, true, {}};
      for (int64_t d : shape) xv.dims.push_back(Dim::Known(d));
      g.inputs.push_back(xv);
      g.nodes.push_back(MakeNode("Transpose", {"x"}, {"y"}, "t", {testing::IntsAttr("perm", perm)}));
      g.outputs.push_back(ValueInfo{"y", dt, false, {}});
      Session s(MakeModel(g, 13));
      const int64_t n = NumElements(shape);
      Tensor x = Tensor::Uninitialized(dt, shape);
      for (int64_t i = 0; i < n; ++i) {
        if (dt == DataType::kFloat) x.data<float>()[i] = static_cast<float>(i);
        else if (dt == DataType::kInt32) x.data<int32_t>()[i] = static_cast<int32_t>(i);
        else x.data<int64_t>()[i] = i;
      }
      const Tensor y = s.Run({{"x", x}})[0];
      Shape out_shape;
      for (int64_t a : perm) out_shape.push_back(shape[a]);
      ASSERT_EQ(y.shape(), out_shape) << ShapeToString(shape);
      std::vector<int64_t> moved;  // the axes longer than 1, in the output's order
      for (int64_t a : perm)
        if (shape[a] > 1) moved.push_back(a);
      EXPECT_EQ(y.raw() == x.raw(), std::is_sorted(moved.begin(), moved.end()))
          << ShapeToString(shape) << ": a view exactly when no element moves";
      std::vector<int64_t> in_strides(shape.size(), 1);
      for (size_t d = shape.size() - 1; d-- > 0;) in_strides[d] = in_strides[d + 1] * shape[d + 1];
      std::vector<int64_t> idx(shape.size(), 0);
      for (int64_t o = 0; o < n; ++o) {  // idx: the output's index, last axis fastest
        int64_t src = 0;
        for (size_t d = 0; d < perm.size(); ++d) src += idx[d] * in_strides[perm[d]];
        const int64_t got = dt == DataType::kFloat   ? static_cast<int64_t>(y.data<float>()[o])
                            : dt == DataType::kInt32 ? y.data<int32_t>()[o]
                                                     : y.data<int64_t>()[o];
        ASSERT_EQ(got, src) << ShapeToString(shape) << " at output element " << o;
        for (size_t d = idx.size(); d-- > 0;) {
          if (++idx[d] < out_shape[d]) break;
          idx[d] = 0;
        }
      }
    }
  }
}

TEST(Runtime, Float16ComputedInFloat32) {
  Graph g;
  ValueInfo x{"x", DataType::kFloat16, true, {Dim::Known(3)}};
  ValueInfo y{"y", DataType::kFloat16, true, {Dim::Known(3)}};
  g.inputs.push_back(x);
  g.outputs.push_back(y);
  g.nodes.push_back(MakeNode("Sigmoid", {"x"}, {"y"}));
  Session s(MakeModel(g));
  Tensor in(DataType::kFloat16, {3});
  for (int i = 0; i < 3; ++i) static_cast<uint16_t*>(in.raw())[i] = FloatToHalf(static_cast<float>(i));
  auto out = s.Run({{"x", in}});
  ASSERT_EQ(out[0].dtype(), DataType::kFloat16);
  EXPECT_NEAR(HalfToFloat(static_cast<const uint16_t*>(out[0].raw())[1]), 0.7310586f, 1e-3);
}

TEST(Runtime, ObserverSeesEveryProducedValue) {
  Graph g;
  g.inputs.push_back(FloatValue("x", {4}));
  g.nodes.push_back(MakeNode("Relu", {"x"}, {"r"}));
  g.nodes.push_back(MakeNode("Neg", {"r"}, {"y"}));
  g.outputs.push_back(FloatValue("y", {4}));
  std::vector<std::string> seen;
  SessionOptions so;
  so.observer = [&](const std::string& name, const Tensor& t) { seen.push_back(name + ShapeToString(t.shape())); };
  Session s(MakeModel(g), so);
  s.Run({{"x", Tensor::FromVector<float>({-1, 2, -3, 4}, {4})}});
  EXPECT_EQ(seen, (std::vector<std::string>{"r[4]", "y[4]"}));
}

TEST(Runtime, KernelErrorsNameTheNode) {
  Graph g;
  g.inputs.push_back(FloatValue("a", {2, 3}));
  g.inputs.push_back(FloatValue("b", {4, 5}));
  g.nodes.push_back(MakeNode("MatMul", {"a", "b"}, {"y"}, "proj"));
  g.outputs.push_back(FloatValue("y", {-1, -1}));
  Session s(MakeModel(g));
  try {
    s.Run({{"a", Tensor(DataType::kFloat, {2, 3})}, {"b", Tensor(DataType::kFloat, {4, 5})}});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("proj"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace gaf
