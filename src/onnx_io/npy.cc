#include "onnx_io/npy.h"
#include "ir/output_file.h"

#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "onnx_io/onnx_io.h"

namespace gaf {

namespace {

struct NpyType {
  const char* descr;
  DataType dt;
};
constexpr NpyType kTypes[] = {
    {"<f4", DataType::kFloat},  {"<f8", DataType::kDouble}, {"<f2", DataType::kFloat16},
    {"<i8", DataType::kInt64},  {"<i4", DataType::kInt32},  {"<i2", DataType::kInt16},
    {"|i1", DataType::kInt8},   {"|u1", DataType::kUint8},  {"<u2", DataType::kUint16},
    {"<u4", DataType::kUint32}, {"<u8", DataType::kUint64}, {"|b1", DataType::kBool},
};

// One dimension of the header's shape tuple: a non-negative integer.
int64_t ParseNpyDim(std::string item, const std::string& path) {
  item.erase(0, item.find_first_not_of(" \t"));
  item.erase(item.find_last_not_of(" \t") + 1);
  int64_t v = -1;
  const char* end = item.data() + item.size();
  auto [p, ec] = std::from_chars(item.data(), end, v);
  GAF_CHECK(ec == std::errc() && p == end && v >= 0, "{}: .npy shape has an invalid dimension '{}'", path, item);
  return v;
}

Shape ParseNpyShape(const std::string& dims, const std::string& path) {
  Shape shape;
  std::stringstream ss(dims);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.find_first_not_of(" \t") == std::string::npos) continue;
    shape.push_back(ParseNpyDim(item, path));
  }
  return shape;
}

DataType ParseNpyType(const std::string& header, const std::string& path) {
  std::smatch m;
  GAF_CHECK(std::regex_search(header, m, std::regex("'descr':\\s*'([^']*)'")), "{}: .npy header has no descr", path);
  std::string descr = m[1];
  if (descr == "<b1" || descr == "b1") descr = "|b1";
  if (descr == "<i1") descr = "|i1";
  if (descr == "<u1") descr = "|u1";
  for (const NpyType& t : kTypes)
    if (descr == t.descr) return t.dt;
  throw Error(fmt::format("{}: unsupported .npy dtype '{}' (little-endian numeric or bool only)", path, descr));
}

// Reads the magic, version and header; returns the header text.
std::string ReadNpyHeader(std::ifstream& in, const std::string& path) {
  char magic[8];
  in.read(magic, 8);
  GAF_CHECK(in.gcount() == 8 && std::memcmp(magic, "\x93NUMPY", 6) == 0, "{}: not a .npy file", path);
  uint32_t header_len = 0;
  if (magic[6] == 1) {
    unsigned char b[2];
    in.read(reinterpret_cast<char*>(b), 2);
    header_len = b[0] | (b[1] << 8);
  } else {
    unsigned char b[4];
    in.read(reinterpret_cast<char*>(b), 4);
    header_len = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
  }
  GAF_CHECK(in.good() && header_len < (1u << 20), "{}: corrupt .npy header", path);
  std::string header(header_len, '\0');
  in.read(header.data(), header_len);
  GAF_CHECK(in.gcount() == header_len, "{}: truncated .npy header", path);
  return header;
}

}  // namespace

Tensor LoadNpy(const std::string& path) {
  std::error_code ec;
  GAF_CHECK(std::filesystem::is_regular_file(path, ec), "{}: cannot open (not a regular file)", path);
  const int64_t file_size = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  GAF_CHECK(!ec, "{}: cannot open: {}", path, ec.message());
  std::ifstream in(path, std::ios::binary);
  GAF_CHECK(in.good(), "{}: cannot open", path);
  const std::string header = ReadNpyHeader(in, path);
  const DataType dt = ParseNpyType(header, path);
  std::smatch m;
  GAF_CHECK(std::regex_search(header, m, std::regex("'fortran_order':\\s*(True|False)")) && m[1] == "False",
            "{}: Fortran-order arrays are not supported", path);
  GAF_CHECK(std::regex_search(header, m, std::regex("'shape':\\s*\\(([^)]*)\\)")), "{}: .npy header has no shape",
            path);
  const Shape shape = ParseNpyShape(m[1], path);
  // The declared size against the memory limit and against the bytes the file has, before allocating.
  const int64_t bytes = TensorBytes(dt, shape, fmt::format("{}: array", path));
  const int64_t have = file_size - static_cast<int64_t>(in.tellg());
  GAF_CHECK(have >= bytes, "{}: truncated data ({} of {} bytes)", path, have, bytes);
  Tensor t = Tensor::Uninitialized(dt, shape);
  in.read(static_cast<char*>(t.raw()), static_cast<std::streamsize>(bytes));
  GAF_CHECK(in.gcount() == bytes, "{}: truncated data ({} of {} bytes)", path, in.gcount(), bytes);
  return t;
}

void SaveNpy(const Tensor& t, const std::string& path) {
  const char* descr = nullptr;
  for (const NpyType& n : kTypes)
    if (n.dt == t.dtype()) descr = n.descr;
  if (t.dtype() == DataType::kBFloat16) {  // numpy has no bfloat16: write float32
    SaveNpy(t.CastTo(DataType::kFloat), path);
    return;
  }
  GAF_CHECK(descr != nullptr, "{}: cannot write a {} tensor as .npy", path, DataTypeName(t.dtype()));
  std::string shape;
  for (int64_t d : t.shape()) shape += std::to_string(d) + ",";
  if (t.rank() > 1) shape.pop_back();
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", descr, shape);
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  CheckOutputPath(path, {}, true);
  TempFile out(path);
  out.Write("\x93NUMPY\x01\x00", 8);
  const uint16_t hl = static_cast<uint16_t>(header.size());
  const char b[2] = {static_cast<char>(hl & 0xff), static_cast<char>(hl >> 8)};
  out.Write(b, 2);
  out.Write(header.data(), header.size());
  out.Write(t.raw(), t.nbytes());
  out.Commit();
}

Tensor LoadTensorFile(const std::string& path) {
  GAF_CHECK(std::filesystem::exists(path), "{}: no such file", path);
  std::string ext = std::filesystem::path(path).extension().string();
  if (ext == ".npy") return LoadNpy(path);
  if (ext == ".pb") return LoadTensorPb(path);
  throw Error(fmt::format("{}: unknown tensor file type (use .npy or .pb)", path));
}

}  // namespace gaf
