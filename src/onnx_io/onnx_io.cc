#include "onnx_io/onnx_io.h"
#include "ir/limits.h"
#include "ir/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>
#include <unistd.h>

#include <cctype>
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <unordered_map>

namespace gaf {
namespace fs = std::filesystem;

namespace {

void ParseProto(google::protobuf::MessageLite& msg, google::protobuf::io::ZeroCopyInputStream* raw,
                const std::string& what) {
  google::protobuf::io::CodedInputStream coded(raw);
  coded.SetTotalBytesLimit(INT_MAX);
  // Each level of subgraph (Graph -> Node -> Attribute -> Graph) is three protobuf levels; the
  // runtime refuses nesting past the limit with its own message, so let the parser go a bit further.
  const int depth = GlobalLimits().max_nesting_depth;
  coded.SetRecursionLimit(3 * depth + 16);
  GAF_CHECK(msg.ParseFromCodedStream(&coded) && coded.ConsumedEntireMessage(),
            "{}: not a valid ONNX protobuf (truncated or corrupted file, or subgraphs nested more than {} levels deep?)",
            what, depth);
}

void ParseProto(google::protobuf::MessageLite& msg, const char* bytes, size_t size, const std::string& what) {
  GAF_CHECK(size <= static_cast<size_t>(INT_MAX), "{}: over 2 GiB, more than one protobuf can hold", what);
  google::protobuf::io::ArrayInputStream raw(bytes, static_cast<int>(size));
  ParseProto(msg, &raw, what);
}

// Parses a file as it is read, in blocks (no buffer of the whole file: a model's weights inside its
// protobuf were read into one, then copied by the parser, each copy faulting in fresh pages).
// Returns the file's size.
size_t ParseProtoFile(google::protobuf::MessageLite& msg, const std::string& path) {
  std::error_code ec;
  GAF_CHECK(fs::exists(path, ec), "{}: no such file", path);
  GAF_CHECK(!fs::is_directory(path, ec), "{}: is a directory, not a model file", path);
  GAF_CHECK(fs::is_regular_file(path, ec), "{}: not a regular file", path);  // a FIFO would block
  const auto size = fs::file_size(path, ec);
  GAF_CHECK(!ec && size <= static_cast<uintmax_t>(INT_MAX), "{}: over 2 GiB, more than one protobuf file can hold",
            path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  GAF_CHECK(fd >= 0, "{}: cannot open for reading: {}", path, std::strerror(errno));
  struct Close {
    int fd;
    ~Close() { ::close(fd); }
  } close_fd{fd};
  if (size == 0) return 0;
  google::protobuf::io::FileInputStream raw(fd, 1 << 20);
  try {
    ParseProto(msg, &raw, path);
  } catch (const Error&) {
    // A read that failed ends the parse too: say so rather than "not a valid protobuf".
    GAF_CHECK(raw.GetErrno() == 0, "{}: cannot be read: {}", path, std::strerror(raw.GetErrno()));
    throw;
  }
  return static_cast<size_t>(size);
}

// ---------------- import ----------------

struct ImportContext {
  std::string base_dir;
  std::string what;  // file name for messages
  // The main graph's initializers already made (LoadModel), by their protobuf.
  std::unordered_map<const onnx::TensorProto*, Tensor>* made = nullptr;
};

template <class Src, class Dst>
void CopyField(const Src& src, Dst* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<Dst>(src.Get(static_cast<int>(i)));
}

// Values in the typed field that holds `dt` (the field CopyField reads below).
int64_t TypedFieldSize(const onnx::TensorProto& tp, DataType dt, const std::string& what) {
  switch (dt) {
    case DataType::kFloat: return tp.float_data_size();
    case DataType::kDouble: return tp.double_data_size();
    case DataType::kInt64: return tp.int64_data_size();
    case DataType::kUint64: case DataType::kUint32: return tp.uint64_data_size();
    case DataType::kInt32: case DataType::kInt16: case DataType::kInt8: case DataType::kUint8:
    case DataType::kBool: case DataType::kUint16: case DataType::kFloat16: case DataType::kBFloat16:
      return tp.int32_data_size();
    default: throw UnsupportedError(fmt::format("{} type {} not supported", what, DataTypeName(dt)));
  }
}

void CopyTypedField(const onnx::TensorProto& tp, Tensor& t) {
  const int64_t n = t.numel();
  switch (t.dtype()) {
    case DataType::kFloat: CopyField(tp.float_data(), t.data<float>(), n); break;
    case DataType::kDouble: CopyField(tp.double_data(), t.data<double>(), n); break;
    case DataType::kInt64: CopyField(tp.int64_data(), t.data<int64_t>(), n); break;
    case DataType::kUint64: CopyField(tp.uint64_data(), t.data<uint64_t>(), n); break;
    case DataType::kUint32: CopyField(tp.uint64_data(), t.data<uint32_t>(), n); break;
    case DataType::kInt32: CopyField(tp.int32_data(), t.data<int32_t>(), n); break;
    case DataType::kInt16: CopyField(tp.int32_data(), t.data<int16_t>(), n); break;
    case DataType::kUint16:
    case DataType::kFloat16:
    case DataType::kBFloat16: CopyField(tp.int32_data(), static_cast<uint16_t*>(t.raw()), n); break;
    case DataType::kInt8: CopyField(tp.int32_data(), t.data<int8_t>(), n); break;
    default: CopyField(tp.int32_data(), static_cast<uint8_t*>(t.raw()), n); break;  // uint8, bool
  }
}

// ---- external data: a regular file inside the model's folder, read within its size ----

struct ExternalRef {
  std::string location;
  int64_t offset = 0, length = -1;
};

int64_t ParseExternalNumber(const std::string& value, const char* key, const std::string& what) {
  int64_t v = 0;
  const char* end = value.data() + value.size();
  auto [p, ec] = std::from_chars(value.data(), end, v);
  GAF_CHECK(ec != std::errc::result_out_of_range, "{}: external data {} '{}' is too large", what, key, value);
  GAF_CHECK(ec == std::errc() && p == end && !value.empty(), "{}: external data {} '{}' is not a number", what, key,
            value);
  GAF_CHECK(v >= 0, "{}: external data {} {} is negative", what, key, v);
  return v;
}

ExternalRef ParseExternalRef(const onnx::TensorProto& tp, const std::string& what) {
  ExternalRef ref;
  for (const auto& kv : tp.external_data()) {
    if (kv.key() == "location") ref.location = kv.value();
    else if (kv.key() == "offset") ref.offset = ParseExternalNumber(kv.value(), "offset", what);
    else if (kv.key() == "length") ref.length = ParseExternalNumber(kv.value(), "length", what);
  }
  GAF_CHECK(!ref.location.empty(), "{} is external but names no location", what);
  return ref;
}

// The real path (symlinks followed) of `location`, which must be relative, have no ".."
// component, and resolve to a regular file inside the real path of the model's folder.
fs::path ResolveExternalPath(const std::string& location, const std::string& base_dir, const std::string& what) {
  const fs::path loc(location);
  bool dotdot = false;
  for (const fs::path& part : loc) dotdot |= part == "..";
  GAF_CHECK(loc.is_relative() && !loc.has_root_name() && !dotdot,
            "{}: external location '{}' must be a relative path inside the model's folder", what, location);
  std::error_code ec;
  const fs::path root = fs::canonical(base_dir.empty() ? "." : base_dir, ec);
  GAF_CHECK(!ec, "{}: the model's folder '{}' cannot be resolved: {}", what, base_dir, ec.message());
  const fs::path real = fs::weakly_canonical(root / loc, ec);
  GAF_CHECK(!ec, "{}: external data file '{}' cannot be resolved: {}", what, location, ec.message());
  auto [r, p] = std::mismatch(root.begin(), root.end(), real.begin(), real.end());
  GAF_CHECK(r == root.end(), "{}: external location '{}' resolves to '{}', outside the model's folder '{}'", what,
            location, real.string(), root.string());
  struct stat st {};
  GAF_CHECK(::stat(real.c_str(), &st) == 0, "{}: external data file '{}' cannot be opened: {}", what, real.string(),
            std::strerror(errno));
  GAF_CHECK(S_ISREG(st.st_mode), "{}: external data file '{}' is not a regular file", what, real.string());
  return real;
}

struct FileCloser {
  int fd;
  ~FileCloser() { ::close(fd); }
};

// Reads the tensor's bytes from its external data file; every check comes before the allocation.
Tensor ReadExternal(const onnx::TensorProto& tp, DataType dt, const Shape& shape, int64_t bytes,
                    const ImportContext& ctx, const std::string& what) {
  ExternalRef ref = ParseExternalRef(tp, what);
  const fs::path path = ResolveExternalPath(ref.location, ctx.base_dir, what);
  // O_NONBLOCK: a FIFO swapped in after the check cannot block the open; fstat then refuses it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  GAF_CHECK(fd >= 0, "{}: external data file '{}' cannot be opened: {}", what, path.string(), std::strerror(errno));
  FileCloser closer{fd};
  struct stat st {};
  GAF_CHECK(::fstat(fd, &st) == 0 && S_ISREG(st.st_mode), "{}: external data file '{}' is not a regular file", what,
            path.string());
  if (ref.length < 0) ref.length = bytes;
  GAF_CHECK(ref.length == bytes, "{} external length {} != {} bytes", what, ref.length, bytes);
  const int64_t size = st.st_size;
  GAF_CHECK(ref.offset <= size && ref.length <= size - ref.offset,
            "{}: external data file '{}' ({} bytes) is too short for {} bytes at offset {}", what, path.string(),
            size, ref.length, ref.offset);
  Tensor t = Tensor::Uninitialized(dt, shape);
  for (int64_t done = 0; done < bytes;) {
    const ssize_t got = ::pread(fd, static_cast<char*>(t.raw()) + done, static_cast<size_t>(bytes - done),
                                static_cast<off_t>(ref.offset + done));
    GAF_CHECK(got > 0, "{}: external data file '{}' cannot be read: {}", what, path.string(),
              got < 0 ? std::strerror(errno) : "unexpected end of file");
    done += got;
  }
  return t;
}

Tensor StringTensorFromProto(const onnx::TensorProto& tp, const Shape& shape, int64_t n, const std::string& what) {
  GAF_CHECK(tp.string_data_size() == n, "{} has {} string values for {} elements", what, tp.string_data_size(), n);
  Tensor t(DataType::kString, shape);
  for (int64_t i = 0; i < n; ++i) t.data<std::string>()[i] = tp.string_data(static_cast<int>(i));
  return t;
}

Tensor TensorFromProto(const onnx::TensorProto& tp, const ImportContext& ctx) {
  DataType dt = static_cast<DataType>(tp.data_type());
  const std::string what = fmt::format("{}: tensor '{}'", ctx.what, tp.name());
  GAF_CHECK(DataTypeSize(dt) > 0 || dt == DataType::kString, "{} has unknown data type {}", what, tp.data_type());
  GAF_CHECK(!tp.has_segment(), "{} uses segments, which are not supported", what);
  if (dt == DataType::kComplex64 || dt == DataType::kComplex128)
    throw UnsupportedError(fmt::format("{} is complex, which is not supported", what));
  const Shape shape(tp.dims().begin(), tp.dims().end());
  // Negative dimensions, sizes past 64 bits and the memory limit, before any allocation.
  const int64_t bytes = TensorBytes(dt, shape, what);
  const int64_t n = NumElements(shape);
  if (dt == DataType::kString) return StringTensorFromProto(tp, shape, n, what);
  if (tp.data_location() == onnx::TensorProto::EXTERNAL) return ReadExternal(tp, dt, shape, bytes, ctx, what);
  if (tp.has_raw_data()) {
    GAF_CHECK(static_cast<int64_t>(tp.raw_data().size()) == bytes, "{} has {} raw bytes, expected {}", what,
              tp.raw_data().size(), bytes);
    Tensor t = Tensor::Uninitialized(dt, shape);
    if (bytes > 0) std::memcpy(t.raw(), tp.raw_data().data(), static_cast<size_t>(bytes));
    return t;
  }
  const int64_t values = TypedFieldSize(tp, dt, what);
  GAF_CHECK(values == n, "{} has {} values for {} elements", what, values, n);
  Tensor t = Tensor::Uninitialized(dt, shape);
  CopyTypedField(tp, t);
  return t;
}

std::string TypeProtoSummary(const onnx::TypeProto& tp) {
  if (tp.has_sequence_type()) return "sequence";
  if (tp.has_map_type()) return "map";
  if (tp.has_optional_type()) return "optional";
  if (tp.has_sparse_tensor_type()) return "sparse_tensor";
  return "unknown";
}

ValueInfo ValueInfoFromProto(const onnx::ValueInfoProto& vp) {
  ValueInfo v;
  v.name = vp.name();
  v.doc_string = vp.doc_string();
  const onnx::TypeProto& tp = vp.type();
  if (tp.has_tensor_type()) {
    v.dtype = static_cast<DataType>(tp.tensor_type().elem_type());
    if (tp.tensor_type().has_shape()) {
      v.has_shape = true;
      for (const auto& d : tp.tensor_type().shape().dim()) {
        if (d.has_dim_value()) v.dims.push_back(Dim::Known(d.dim_value()));
        else v.dims.push_back(Dim::Symbolic(d.has_dim_param() ? d.dim_param() : ""));
      }
    }
  } else if (vp.has_type()) {
    v.non_tensor_type = TypeProtoSummary(tp);
  }
  return v;
}

Graph GraphFromProto(const onnx::GraphProto& gp, const ImportContext& ctx);

Attribute AttributeFromProto(const onnx::AttributeProto& ap, const ImportContext& ctx) {
  Attribute a;
  a.name = ap.name();
  a.ref_attr_name = ap.ref_attr_name();
  a.doc_string = ap.doc_string();
  using T = Attribute::Type;
  T type = static_cast<T>(ap.type());
  if (ap.type() == onnx::AttributeProto::UNDEFINED) {  // old exporters: infer from the filled field
    if (ap.has_f()) type = T::kFloat;
    else if (ap.has_i()) type = T::kInt;
    else if (ap.has_s()) type = T::kString;
    else if (ap.has_t()) type = T::kTensor;
    else if (ap.has_g()) type = T::kGraph;
    else if (ap.floats_size()) type = T::kFloats;
    else if (ap.ints_size()) type = T::kInts;
    else if (ap.strings_size()) type = T::kStrings;
  }
  a.type = type;
  switch (type) {
    case T::kFloat: a.f = ap.f(); break;
    case T::kInt: a.i = ap.i(); break;
    case T::kString: a.s = ap.s(); break;
    case T::kTensor: a.t = TensorFromProto(ap.t(), ctx); break;
    case T::kGraph: a.g = std::make_shared<Graph>(GraphFromProto(ap.g(), ctx)); break;
    case T::kFloats: a.floats.assign(ap.floats().begin(), ap.floats().end()); break;
    case T::kInts: a.ints.assign(ap.ints().begin(), ap.ints().end()); break;
    case T::kStrings: a.strings.assign(ap.strings().begin(), ap.strings().end()); break;
    case T::kTensors:
      for (const auto& t : ap.tensors()) a.tensors.push_back(TensorFromProto(t, ctx));
      break;
    case T::kGraphs:
      for (const auto& g : ap.graphs()) a.graphs.push_back(std::make_shared<Graph>(GraphFromProto(g, ctx)));
      break;
    default: a.opaque_proto = ap.SerializeAsString(); break;
  }
  return a;
}

Node NodeFromProto(const onnx::NodeProto& np, const ImportContext& ctx) {
  Node n;
  n.name = np.name();
  n.op_type = np.op_type();
  n.domain = np.domain() == "ai.onnx" ? "" : np.domain();
  n.doc_string = np.doc_string();
  n.inputs.assign(np.input().begin(), np.input().end());
  n.outputs.assign(np.output().begin(), np.output().end());
  GAF_CHECK(!n.op_type.empty(), "{}: node '{}' has no op_type", ctx.what, n.name);
  for (const auto& ap : np.attribute()) n.attributes.push_back(AttributeFromProto(ap, ctx));
  return n;
}

Graph GraphFromProto(const onnx::GraphProto& gp, const ImportContext& ctx) {
  Graph g;
  g.name = gp.name();
  g.doc_string = gp.doc_string();
  for (const auto& vp : gp.input()) g.inputs.push_back(ValueInfoFromProto(vp));
  for (const auto& vp : gp.output()) g.outputs.push_back(ValueInfoFromProto(vp));
  for (const auto& vp : gp.value_info()) g.value_info.push_back(ValueInfoFromProto(vp));
  for (const auto& tp : gp.initializer()) {
    GAF_CHECK(!tp.name().empty(), "{}: graph '{}' has an initializer without a name", ctx.what, g.name);
    Tensor* made = nullptr;
    if (ctx.made != nullptr) {
      auto it = ctx.made->find(&tp);
      if (it != ctx.made->end()) made = &it->second;
    }
    g.initializers.emplace_back(tp.name(), made != nullptr ? std::move(*made) : TensorFromProto(tp, ctx));
  }
  for (const auto& sp : gp.sparse_initializer()) g.sparse_initializers.push_back(sp.SerializeAsString());
  g.nodes.reserve(gp.node_size());
  for (const auto& np : gp.node()) g.nodes.push_back(NodeFromProto(np, ctx));
  SortTopologically(g);  // some exporters write nodes out of order
  return g;
}

// ---------------- export ----------------

struct ExportContext {
  const SaveOptions* options = nullptr;
  TempFile* external = nullptr;
  std::string external_location;
  // The "location" entries written, renamed once the data file's content hash is known.
  std::vector<std::string*> locations;
  int64_t external_offset = 0;
};

void TensorToProto(const Tensor& t, const std::string& name, onnx::TensorProto* tp, ExportContext* ectx) {
  tp->set_name(name);
  tp->set_data_type(static_cast<int32_t>(t.dtype()));
  for (int64_t d : t.shape()) tp->add_dims(d);
  if (t.dtype() == DataType::kString) {
    for (int64_t i = 0; i < t.numel(); ++i) tp->add_string_data(t.data<std::string>()[i]);
    return;
  }
  if (ectx != nullptr && ectx->external != nullptr && t.nbytes() >= ectx->options->external_threshold) {
    // Align each tensor to 4 KiB so that the file can be memory-mapped.
    int64_t pad = (4096 - ectx->external_offset % 4096) % 4096;
    if (pad) {
      std::string zeros(static_cast<size_t>(pad), '\0');
      ectx->external->Write(zeros.data(), static_cast<size_t>(pad));
      ectx->external_offset += pad;
    }
    ectx->external->Write(t.raw(), t.nbytes());
    tp->set_data_location(onnx::TensorProto::EXTERNAL);
    auto add = [&](const std::string& k, const std::string& v) {
      auto* e = tp->add_external_data();
      e->set_key(k);
      e->set_value(v);
    };
    add("location", ectx->external_location);
    ectx->locations.push_back(tp->mutable_external_data(tp->external_data_size() - 1)->mutable_value());
    add("offset", std::to_string(ectx->external_offset));
    add("length", std::to_string(t.nbytes()));
    ectx->external_offset += static_cast<int64_t>(t.nbytes());
    return;
  }
  tp->set_raw_data(t.raw(), t.nbytes());
}

void ValueInfoToProto(const ValueInfo& v, onnx::ValueInfoProto* vp) {
  vp->set_name(v.name);
  if (!v.doc_string.empty()) vp->set_doc_string(v.doc_string);
  if (!v.non_tensor_type.empty() || v.dtype == DataType::kUndefined) return;
  auto* tt = vp->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(static_cast<int32_t>(v.dtype));
  if (v.has_shape) {
    auto* sh = tt->mutable_shape();
    for (const Dim& d : v.dims) {
      auto* dp = sh->add_dim();
      if (d.known()) dp->set_dim_value(d.value);
      else if (!d.param.empty()) dp->set_dim_param(d.param);
    }
  }
}

void GraphToProto(const Graph& g, onnx::GraphProto* gp, ExportContext* ectx);

void AttributeToProto(const Attribute& a, onnx::AttributeProto* ap, ExportContext* ectx) {
  if (!a.opaque_proto.empty()) {
    ap->ParseFromString(a.opaque_proto);
    return;
  }
  ap->set_name(a.name);
  if (!a.ref_attr_name.empty()) ap->set_ref_attr_name(a.ref_attr_name);
  if (!a.doc_string.empty()) ap->set_doc_string(a.doc_string);
  ap->set_type(static_cast<onnx::AttributeProto_AttributeType>(a.type));
  using T = Attribute::Type;
  switch (a.type) {
    case T::kFloat: ap->set_f(a.f); break;
    case T::kInt: ap->set_i(a.i); break;
    case T::kString: ap->set_s(a.s); break;
    case T::kTensor: TensorToProto(a.t, a.t.defined() ? "" : "", ap->mutable_t(), nullptr); break;
    case T::kGraph: GraphToProto(*a.g, ap->mutable_g(), ectx); break;
    case T::kFloats: for (float f : a.floats) ap->add_floats(f); break;
    case T::kInts: for (int64_t i : a.ints) ap->add_ints(i); break;
    case T::kStrings: for (const auto& s : a.strings) ap->add_strings(s); break;
    case T::kTensors: for (const auto& t : a.tensors) TensorToProto(t, "", ap->add_tensors(), nullptr); break;
    case T::kGraphs: for (const auto& g : a.graphs) GraphToProto(*g, ap->add_graphs(), ectx); break;
    default: break;
  }
}

void NodeToProto(const Node& n, onnx::NodeProto* np, ExportContext* ectx) {
  if (!n.name.empty()) np->set_name(n.name);
  np->set_op_type(n.op_type);
  if (!n.domain.empty()) np->set_domain(n.domain);
  if (!n.doc_string.empty()) np->set_doc_string(n.doc_string);
  for (const auto& i : n.inputs) np->add_input(i);
  for (const auto& o : n.outputs) np->add_output(o);
  for (const Attribute& a : n.attributes) AttributeToProto(a, np->add_attribute(), ectx);
}

void GraphToProto(const Graph& g, onnx::GraphProto* gp, ExportContext* ectx) {
  gp->set_name(g.name);
  if (!g.doc_string.empty()) gp->set_doc_string(g.doc_string);
  for (const Node& n : g.nodes) NodeToProto(n, gp->add_node(), ectx);
  for (const auto& [name, t] : g.initializers) TensorToProto(t, name, gp->add_initializer(), ectx);
  for (const auto& s : g.sparse_initializers) gp->add_sparse_initializer()->ParseFromString(s);
  for (const auto& v : g.inputs) ValueInfoToProto(v, gp->add_input());
  for (const auto& v : g.outputs) ValueInfoToProto(v, gp->add_output());
  for (const auto& v : g.value_info) ValueInfoToProto(v, gp->add_value_info());
}

void ModelToProto(const Model& m, onnx::ModelProto* mp, ExportContext* ectx) {
  mp->set_ir_version(m.ir_version);
  for (const OpsetImport& o : m.opset_imports) {
    auto* op = mp->add_opset_import();
    op->set_domain(o.domain);
    op->set_version(o.version);
  }
  if (!m.producer_name.empty()) mp->set_producer_name(m.producer_name);
  if (!m.producer_version.empty()) mp->set_producer_version(m.producer_version);
  if (!m.domain.empty()) mp->set_domain(m.domain);
  if (m.model_version) mp->set_model_version(m.model_version);
  if (!m.doc_string.empty()) mp->set_doc_string(m.doc_string);
  for (const auto& [k, v] : m.metadata_props) {
    auto* p = mp->add_metadata_props();
    p->set_key(k);
    p->set_value(v);
  }
  for (const Function& f : m.functions) {
    auto* fp = mp->add_functions();
    fp->set_name(f.name);
    fp->set_domain(f.domain);
    if (!f.doc_string.empty()) fp->set_doc_string(f.doc_string);
    for (const auto& i : f.inputs) fp->add_input(i);
    for (const auto& o : f.outputs) fp->add_output(o);
    for (const auto& a : f.attributes) fp->add_attribute(a);
    for (const Node& n : f.nodes) NodeToProto(n, fp->add_node(), ectx);
    for (const OpsetImport& o : f.opset_imports) {
      auto* op = fp->add_opset_import();
      op->set_domain(o.domain);
      op->set_version(o.version);
    }
  }
  GraphToProto(m.graph, mp->mutable_graph(), ectx);
}

Model ModelFromProto(const onnx::ModelProto& mp, const ImportContext& ctx) {
  Model m;
  m.ir_version = mp.ir_version();
  for (const auto& o : mp.opset_import())
    m.opset_imports.push_back(OpsetImport{o.domain() == "ai.onnx" ? "" : o.domain(), o.version()});
  m.producer_name = mp.producer_name();
  m.producer_version = mp.producer_version();
  m.domain = mp.domain();
  m.model_version = mp.model_version();
  m.doc_string = mp.doc_string();
  for (const auto& p : mp.metadata_props()) m.metadata_props.emplace_back(p.key(), p.value());
  for (const auto& fp : mp.functions()) {
    Function f;
    f.name = fp.name();
    f.domain = fp.domain();
    f.doc_string = fp.doc_string();
    f.inputs.assign(fp.input().begin(), fp.input().end());
    f.outputs.assign(fp.output().begin(), fp.output().end());
    f.attributes.assign(fp.attribute().begin(), fp.attribute().end());
    for (const auto& np : fp.node()) f.nodes.push_back(NodeFromProto(np, ctx));
    for (const auto& o : fp.opset_import()) f.opset_imports.push_back(OpsetImport{o.domain(), o.version()});
    m.functions.push_back(std::move(f));
  }
  GAF_CHECK(mp.has_graph(), "{}: the model has no graph (not an ONNX model?)", ctx.what);
  m.graph = GraphFromProto(mp.graph(), ctx);
  // IR version < 4 lists initializers as graph inputs too; that is fine for the runtime.
  return m;
}

}  // namespace

namespace {

// The model of a parsed protobuf.
Model ModelFromParsed(const onnx::ModelProto& mp, const ImportContext& ctx) {
  const std::string& what = ctx.what;
  GAF_CHECK(mp.has_graph() && mp.ir_version() > 0, "{}: not an ONNX model (no graph or ir_version)", what);
  Model m = ModelFromProto(mp, ctx);
  std::vector<std::string> problems = VerifyModel(m);
  if (!problems.empty()) {
    std::string msg = fmt::format("{}: invalid graph: {}", what, problems[0]);
    if (problems.size() > 1) msg += fmt::format(" (and {} more problems)", problems.size() - 1);
    throw Error(msg);
  }
  return m;
}

}  // namespace

Model ModelFromBytes(const std::string& bytes, const std::string& base_dir, const std::string& what) {
  GAF_CHECK(!bytes.empty(), "{}: file is empty", what);
  onnx::ModelProto mp;
  ParseProto(mp, bytes.data(), bytes.size(), what);
  return ModelFromParsed(mp, ImportContext{base_dir, what});
}

Model LoadModel(const std::string& path) {
  onnx::ModelProto mp;
  GAF_CHECK(ParseProtoFile(mp, path) > 0, "{}: file is empty", path);
  std::string dir = fs::path(path).parent_path().string();
  std::unordered_map<const onnx::TensorProto*, Tensor> made;
  ImportContext ctx{dir.empty() ? "." : dir, path, &made};
  // The main graph's initializers first, each protobuf's bytes freed once its tensor is made: the
  // weights inside a model's protobuf are then held once, not twice, at any time.
  if (mp.has_graph())
    for (onnx::TensorProto& tp : *mp.mutable_graph()->mutable_initializer()) {
      made.emplace(&tp, TensorFromProto(tp, ctx));
      if (tp.has_raw_data()) std::string().swap(*tp.mutable_raw_data());
    }
  return ModelFromParsed(mp, ctx);
}

std::string ModelToBytes(const Model& model) {
  onnx::ModelProto mp;
  ModelToProto(model, &mp, nullptr);
  std::string out;
  GAF_CHECK(mp.SerializeToString(&out), "cannot serialize the model (over 2 GiB? save with external data)");
  return out;
}

void WriteFileAtomic(const std::string& path, const std::string& bytes) {
  TempFile out(path);  // Commit() refuses a destination that is not a regular file
  out.Write(bytes.data(), bytes.size());
  out.Commit();
}

namespace {

// "m.onnx.0123456789abcdef.data": the data files SaveModel writes for the model file `model_name`.
bool IsOwnDataFile(const std::string& file, const std::string& model_name) {
  const std::string prefix = model_name + ".", suffix = ".data";
  if (file.size() != prefix.size() + 16 + suffix.size() || file.compare(0, prefix.size(), prefix) != 0 ||
      file.compare(file.size() - suffix.size(), suffix.size(), suffix) != 0)
    return false;
  for (size_t i = prefix.size(); i < prefix.size() + 16; ++i)
    if (!std::isxdigit(static_cast<unsigned char>(file[i]))) return false;
  return true;
}

// After the model is in place: earlier data files of the same model that it no longer names.
void RemoveOldDataFiles(const fs::path& model_path, const std::string& keep) {
  std::error_code ec;
  const fs::path dir = model_path.parent_path().empty() ? fs::path(".") : model_path.parent_path();
  const std::string model_name = model_path.filename().string();
  fs::directory_iterator it(dir, ec), end;
  for (int seen = 0; !ec && it != end && seen < 100000; it.increment(ec), ++seen) {
    const std::string name = it->path().filename().string();
    if (name != keep && IsOwnDataFile(name, model_name)) fs::remove(it->path(), ec);
  }
}

}  // namespace

std::string SaveModel(const Model& model, const std::string& path, const SaveOptions& options) {
  CheckOutputPath(path, {}, true);
  onnx::ModelProto mp;
  ExportContext ectx;
  ectx.options = &options;
  const fs::path model_path(path);
  // The weights go to a file named by their content hash ("<model>.<hash>.data"), written before
  // the model: a crash at any point leaves the old model with its old data file, or the new model
  // with its new one, never one with the other's (an explicit external_file keeps its name).
  std::unique_ptr<TempFile> ext;
  if (options.external_data) {
    ectx.external_location = options.external_file.empty() ? model_path.filename().string() + ".pending.data"
                                                            : options.external_file;
    ext = std::make_unique<TempFile>((model_path.parent_path() / ectx.external_location).string());
    ectx.external = ext.get();
  }
  ModelToProto(model, &mp, &ectx);
  std::string data_name;
  if (ext) {
    data_name = ectx.external_location;
    if (options.external_file.empty())
      data_name = fmt::format("{}.{:016x}.data", model_path.filename().string(), ext->hash());
    for (std::string* loc : ectx.locations) *loc = data_name;
  }
  std::string bytes;
  GAF_CHECK(mp.SerializeToString(&bytes), "{}: cannot serialize the model (over 2 GiB? use external data)", path);
  if (ext) ext->Commit((model_path.parent_path() / data_name).string());
  WriteFileAtomic(path, bytes);
  if (ext && options.external_file.empty()) RemoveOldDataFiles(model_path, data_name);
  return data_name.empty() ? "" : (model_path.parent_path() / data_name).string();
}

Tensor LoadTensorPb(const std::string& path) { return LoadTensorPb(path, nullptr); }

Tensor LoadTensorPb(const std::string& path, std::string* name) {
  onnx::TensorProto tp;
  ParseProtoFile(tp, path);
  ImportContext ctx{fs::path(path).parent_path().string(), path};
  if (name != nullptr) *name = tp.name();
  return TensorFromProto(tp, ctx);
}

std::vector<std::pair<std::string, Tensor>> LoadTestDataSet(const std::string& dir,
                                                            const std::vector<std::string>& input_names) {
  GAF_CHECK(fs::is_directory(dir), "{}: not a folder (expected a test_data_set_N folder of input_K.pb files)", dir);
  // input_K.pb in K order (input_10 after input_9).
  std::vector<std::pair<long, fs::path>> files;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const std::string f = e.path().filename().string();
    if (f.rfind("input_", 0) != 0 || e.path().extension() != ".pb") continue;
    const std::string k = f.substr(6, f.size() - 6 - 3);
    if (k.empty() || k.size() > 6 || !std::all_of(k.begin(), k.end(), ::isdigit)) continue;
    files.emplace_back(std::stol(k), e.path());
  }
  std::sort(files.begin(), files.end());
  GAF_CHECK(!files.empty(), "{}: no input_K.pb files (ONNX test layout: test_data_set_N/input_0.pb, ...)", dir);
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string path = files[i].second.string();
    std::string name;
    Tensor t = LoadTensorPb(path, &name);
    // By the TensorProto's name when it names an input, else by position.
    if (std::find(input_names.begin(), input_names.end(), name) == input_names.end()) {
      GAF_CHECK(i < input_names.size(), "{}: the model has {} inputs; this is input {}{}", path, input_names.size(),
                i, name.empty() ? "" : fmt::format(" and its name '{}' is none of them", name));
      name = input_names[i];
    }
    for (const auto& [n, prev] : out)
      GAF_CHECK(n != name, "{}: gives input '{}' a second time", path, name);
    out.emplace_back(name, std::move(t));
  }
  return out;
}

void SaveTensorPb(const Tensor& t, const std::string& name, const std::string& path) {
  onnx::TensorProto tp;
  TensorToProto(t, name, &tp, nullptr);
  WriteFileAtomic(path, tp.SerializeAsString());
}

std::string CheckerScope(const Model& model) {
  if (model.ir_version > onnx::IR_VERSION)
    return fmt::format("the model's IR version {} is newer than this ONNX library's checker knows ({})", model.ir_version,
                       static_cast<int64_t>(onnx::IR_VERSION));
  const auto& ranges = onnx::OpSchemaRegistry::DomainToVersionRange::Instance().Map();
  for (const OpsetImport& o : model.opset_imports) {
    const std::string domain = o.domain == "ai.onnx" ? "" : o.domain;
    auto it = ranges.find(domain);
    if (it != ranges.end() && o.version > it->second.second)
      return fmt::format("the model's opset {} of '{}' is newer than this ONNX library knows ({})", o.version,
                         domain.empty() ? "ai.onnx" : domain, it->second.second);
  }
  return "";
}

std::string CheckModel(const Model& model) {
  onnx::ModelProto mp;
  ModelToProto(model, &mp, nullptr);
  try {
    onnx::checker::check_model(mp);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

std::string InferShapes(Model& model) {
  onnx::ModelProto mp;
  ModelToProto(model, &mp, nullptr);
  try {
    onnx::ShapeInferenceOptions opts{/*check_type=*/false, /*error_mode=*/0, /*enable_data_propagation=*/true};
    onnx::shape_inference::InferShapes(mp, onnx::OpSchemaRegistry::Instance(), opts);
  } catch (const std::exception& e) {
    return e.what();
  }
  model.graph.value_info.clear();
  for (const auto& vp : mp.graph().value_info()) model.graph.value_info.push_back(ValueInfoFromProto(vp));
  for (int i = 0; i < mp.graph().output_size() && i < static_cast<int>(model.graph.outputs.size()); ++i) {
    ValueInfo inferred = ValueInfoFromProto(mp.graph().output(i));
    ValueInfo& out = model.graph.outputs[static_cast<size_t>(i)];
    if (out.dtype == DataType::kUndefined) out.dtype = inferred.dtype;
    if (!out.has_shape && inferred.has_shape) {
      out.has_shape = true;
      out.dims = inferred.dims;
    }
  }
  return "";
}

}  // namespace gaf
