// A model file is untrusted input (issue 11): no string from the model reaches generated code,
// and the kernel cache loads only libraries it can trust (owner, mode, checksum), rebuilding
// damaged ones and never hanging on a held lock.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>

#include "codegen/compiler.h"
#include "codegen/fused_kernels.h"
#include "codegen/fused_session.h"
#include "codegen/row_kernel.h"
#include "cost/cost_model.h"
#include "fusion/auto_fusion.h"
#include "test_util.h"

namespace gaf {
namespace {
namespace fs = std::filesystem;
using testing::MakeNode;

// ---- helpers ----

// A fresh cache root (mode 0700), removed at the end of the test.
struct TempRoot {
  fs::path path;
  TempRoot() {
    std::string tmpl = (fs::temp_directory_path() / "gaf_codegen_security_XXXXXX").string();
    path = ::mkdtemp(tmpl.data());
  }
  ~TempRoot() {
    std::error_code ec;
    fs::permissions(path, fs::perms::owner_all, ec);
    fs::remove_all(path, ec);
  }
};

// Sets an environment variable for the scope of a test, then restores it.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> old;
  ScopedEnv(std::string n, const char* value) : name(std::move(n)) {
    if (const char* v = std::getenv(name.c_str())) old = v;
    if (value != nullptr) ::setenv(name.c_str(), value, 1);
    else ::unsetenv(name.c_str());
  }
  ~ScopedEnv() {
    if (old) ::setenv(name.c_str(), old->c_str(), 1);
    else ::unsetenv(name.c_str());
  }
};

// Every byte sequence that could end a comment, a line or a string, or start a directive; non-ASCII
// bytes; and code that would run at dlopen if it were compiled.
const std::string kHostile =
    "\n#include </etc/passwd>\n*/ /* // \" ' \\ \\\n\r\t\xc3\xa9\xff\xfe \?\?/ "
    "\n__attribute__((constructor)) static void gaf_pwned() { __builtin_trap(); }\n//";

std::string Hostile(const std::string& s) { return s.empty() ? s : s + kHostile; }

Tensor Filled(Shape s, float base) {
  Tensor t(DataType::kFloat, std::move(s));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = base + 0.01f * static_cast<float>(i % 37);
  return t;
}

Attribute StringAttr(const std::string& name, const std::string& value) {
  Attribute a;
  a.name = name;
  a.type = Attribute::Type::kString;
  a.s = value;
  a.doc_string = value;
  return a;
}

// RMSNorm, then a SwiGLU-style block, then Softmax: fuses into row and staged kernels.
Model SmallDecoderBlock() {
  Graph g;
  g.inputs.push_back(testing::FloatValue("x", {2, 8, 16}));
  g.initializers.emplace_back("w", Filled({16}, 0.5f));
  g.initializers.emplace_back("eps", Filled({1}, 1e-5f));
  g.initializers.emplace_back("W1", Filled({16, 32}, -0.2f));
  g.initializers.emplace_back("W2", Filled({16, 32}, 0.1f));
  g.nodes.push_back(MakeNode("Mul", {"x", "x"}, {"sq"}, "sq"));
  g.nodes.push_back(MakeNode("ReduceMean", {"sq"}, {"ms"}, "mean", {testing::IntsAttr("axes", {-1})}));
  g.nodes.push_back(MakeNode("Add", {"ms", "eps"}, {"e"}, "add_eps"));
  g.nodes.push_back(MakeNode("Sqrt", {"e"}, {"r"}, "sqrt"));
  g.nodes.push_back(MakeNode("Div", {"x", "r"}, {"n"}, "div"));
  g.nodes.push_back(MakeNode("Mul", {"n", "w"}, {"y"}, "scale"));
  g.nodes.push_back(MakeNode("MatMul", {"y", "W1"}, {"gate"}, "gate_proj"));
  g.nodes.push_back(MakeNode("MatMul", {"y", "W2"}, {"up"}, "up_proj"));
  g.nodes.push_back(MakeNode("Sigmoid", {"gate"}, {"sig"}, "sigmoid"));
  g.nodes.push_back(MakeNode("Mul", {"gate", "sig"}, {"silu"}, "silu"));
  g.nodes.push_back(MakeNode("Mul", {"silu", "up"}, {"h"}, "glu"));
  g.nodes.push_back(MakeNode("Softmax", {"h"}, {"z"}, "softmax", {testing::IntAttr("axis", -1)}));
  g.outputs.push_back(testing::FloatValue("z", {2, 8, 32}));
  return testing::MakeModel(g);
}

// Gives every name of a fused model (values, nodes, functions, their domain, attribute names,
// doc strings) through `rename`; an extra string attribute on every node carries `attr` as its
// name and value (the plain model gets a plain one, so the two differ in names only).
void RenameAll(Model& m, const std::function<std::string(const std::string&)>& rename, const std::string& attr) {
  auto node = [&](Node& n) {
    n.name = rename(n.name);
    n.doc_string = rename("doc");
    for (std::string& v : n.inputs) v = rename(v);
    for (std::string& v : n.outputs) v = rename(v);
    if (n.domain == kFusedDomain) {
      n.domain = rename(n.domain);
      n.op_type = rename(n.op_type);
    } else {
      n.attributes.push_back(StringAttr(attr, attr));
    }
  };
  auto values = [&](std::vector<ValueInfo>& vs) {
    for (ValueInfo& v : vs) {
      v.name = rename(v.name);
      v.doc_string = rename("doc");
    }
  };
  for (Node& n : m.graph.nodes) node(n);
  values(m.graph.inputs);
  values(m.graph.outputs);
  values(m.graph.value_info);
  for (auto& [name, t] : m.graph.initializers) name = rename(name);
  m.graph.name = rename("graph");
  m.graph.doc_string = m.doc_string = rename("doc");
  for (OpsetImport& o : m.opset_imports)
    if (o.domain == kFusedDomain) o.domain = rename(o.domain);
  for (Function& f : m.functions) {
    f.name = rename(f.name);
    f.domain = rename(f.domain);
    f.doc_string = rename("doc");
    f.attributes.push_back(attr);
    for (std::string& v : f.inputs) v = rename(v);
    for (std::string& v : f.outputs) v = rename(v);
    for (Node& n : f.nodes) node(n);
  }
}

struct Built {
  std::shared_ptr<FusedKernelSet> set;
  std::string folder;  // the library's folder below the cache root
  std::vector<std::string> sources;
};

Built BuildKernels(const Model& m, const std::map<std::string, ValueType>& shapes, const std::string& domain,
                   const fs::path& root) {
  KernelCompiler compiler(root.string());
  Built b;
  b.set = FusedKernelSet::Build(m, shapes, compiler, domain);
  if (b.set->library() != nullptr) b.folder = fs::path(b.set->library()->directory()).lexically_relative(root).string();
  for (const auto& e : b.set->entries())
    for (const auto& st : e.kernel.stages)
      if (!st.library) b.sources.push_back(st.row.symbol + "\n" + st.row.source);
  return b;
}

// ---- no model string reaches the compiler ----

TEST(CodegenSecurity, HostileNamesDoNotChangeTheGeneratedSources) {
  FusionOptions o;
  o.benefit_threshold = 0;
  GraphAutoFusion fusion(SmallDecoderBlock(), o);
  const Model fused = fusion.Fuse();
  ASSERT_GE(fused.functions.size(), 2u) << DumpModel(fused);
  std::map<std::string, ValueType> shapes;
  for (const auto& [name, vs] : RecordShapes(fused))
    if (vs.known) shapes[name] = ValueType{vs.dtype, vs.shape};

  Model plain = fused, hostile = fused;
  RenameAll(plain, [](const std::string& s) { return s; }, "plain_attribute");
  RenameAll(hostile, Hostile, "attr" + kHostile);
  std::map<std::string, ValueType> hostile_shapes;
  for (const auto& [name, t] : shapes) hostile_shapes[Hostile(name)] = t;

  TempRoot root;
  Built a = BuildKernels(plain, shapes, kFusedDomain, root.path);
  Built b = BuildKernels(hostile, hostile_shapes, Hostile(kFusedDomain), root.path);
  ASSERT_GE(a.sources.size(), 2u) << DescribeFusedKernels(*a.set);
  bool staged = false;  // a kernel with a library stage (the SwiGLU block's MatMuls)
  for (const auto& e : a.set->entries())
    for (const auto& st : e.kernel.stages) staged |= st.library;
  EXPECT_TRUE(staged) << DescribeFusedKernels(*a.set);
  ASSERT_EQ(a.set->entries().size(), b.set->entries().size());
  for (size_t i = 0; i < a.set->entries().size(); ++i)
    EXPECT_EQ(a.set->entries()[i].kernel.ok, b.set->entries()[i].kernel.ok) << b.set->entries()[i].kernel.reason;
  EXPECT_EQ(a.sources, b.sources);  // byte for byte, symbols included
  EXPECT_EQ(a.folder, b.folder);    // same cache key: the second build compiled nothing
  ASSERT_NE(b.set->library(), nullptr);
  EXPECT_TRUE(b.set->library()->from_cache());
  EXPECT_TRUE(b.set->library()->errors().empty());
  for (const auto& e : b.set->entries()) EXPECT_TRUE(e.bound) << e.status;

  // Nothing of the names in the sources as written to the build folder either.
  int files = 0;
  for (const auto& f : fs::directory_iterator(b.set->library()->directory())) {
    if (f.path().extension() != ".cc" && f.path().filename() != "build.ninja") continue;
    std::ifstream in(f.path(), std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    ++files;
    for (const char* token : {"constructor", "gaf_pwned", "/etc/passwd", "\xc3\xa9", "\r", "plain_attribute",
                              "ai.graph_autofusion", "gate_proj"})
      EXPECT_EQ(text.find(token), std::string::npos) << f.path() << " contains " << token;
  }
  EXPECT_GT(files, 1);
}

// Kernels are found by the call's node name: calls with a shared or empty name get no kernel (they
// run their bodies) instead of each other's kernel and constants.
TEST(CodegenSecurity, CallsWithoutAUniqueNameGetNoKernel) {
  FusionOptions o;
  o.benefit_threshold = 0;
  GraphAutoFusion fusion(SmallDecoderBlock(), o);
  Model fused = fusion.Fuse();
  std::map<std::string, ValueType> shapes;
  for (const auto& [name, vs] : RecordShapes(fused))
    if (vs.known) shapes[name] = ValueType{vs.dtype, vs.shape};
  std::vector<Node*> calls;
  for (Node& n : fused.graph.nodes)
    if (n.domain == kFusedDomain) calls.push_back(&n);
  ASSERT_GE(calls.size(), 2u);
  calls[0]->name = "same";
  calls[1]->name = "same";
  if (calls.size() > 2) calls[2]->name = "";
  TempRoot root;
  Built b = BuildKernels(fused, shapes, kFusedDomain, root.path);
  ASSERT_EQ(b.set->entries().size(), calls.size());
  for (size_t i = 0; i < std::min<size_t>(3, b.set->entries().size()); ++i) {
    const auto& e = b.set->entries()[i];
    EXPECT_FALSE(e.bound) << i << ": " << e.status;
    EXPECT_NE(e.status.find("unique name"), std::string::npos) << e.status;
  }
  EXPECT_EQ(b.set->EntryForNode("same"), nullptr);
}

TEST(CodegenSecurity, RowKernelSourceIgnoresFunctionAndValueNames) {
  auto make = [](const std::function<std::string(const std::string&)>& rename) {
    Function f;
    f.name = rename("FusedSiLU");
    f.domain = rename("ai.graph_autofusion");
    f.doc_string = rename("doc");
    f.inputs = {rename("x")};
    f.outputs = {rename("y")};
    f.nodes.push_back(MakeNode("Sigmoid", {rename("x")}, {rename("s")}, rename("sig")));
    f.nodes.push_back(MakeNode("Mul", {rename("x"), rename("s")}, {rename("y")}, rename("mul")));
    return f;
  };
  const Function plain = make([](const std::string& s) { return s; }), hostile = make(Hostile);
  auto generate = [](const Function& f) {
    RowKernelRequest req;
    req.function = &f;
    req.input_types = {DataType::kFloat};
    req.input_shapes = {{4, 8}};
    req.constants = {nullptr};
    return GenerateRowKernel(req, "gaf_test_silu");
  };
  GeneratedRowKernel a = generate(plain), b = generate(hostile);
  ASSERT_TRUE(a.ok) << a.reason;
  ASSERT_TRUE(b.ok) << b.reason;
  EXPECT_EQ(a.source, b.source);
  EXPECT_EQ(b.source.find("constructor"), std::string::npos);
  EXPECT_EQ(b.source.find("FusedSiLU"), std::string::npos);
  // A symbol that is not a C identifier is refused, by the generator and by the compiler.
  EXPECT_FALSE(GenerateRowKernel(RowKernelRequest{}, "bad\nsymbol").ok);
  TempRoot root;
  KernelCompiler compiler(root.path.string());
  EXPECT_THROW(compiler.Compile(std::vector<KernelSource>{KernelSource{"gaf_x\n__attribute__((constructor))", "int x;"}}),
               Error);
  EXPECT_THROW(compiler.Compile(std::vector<KernelSource>{KernelSource{"../escape", "int x;"}}), Error);
}

// ---- a cache you can trust ----

// A small row kernel (y = x * sigmoid(x) over [4, 8]) and the checks that it runs correctly.
struct SiluKernel {
  Function f;
  GeneratedRowKernel gen;
  SiluKernel() {
    f.name = "FusedSiLU";
    f.inputs = {"x"};
    f.outputs = {"y"};
    f.nodes.push_back(MakeNode("Sigmoid", {"x"}, {"s"}));
    f.nodes.push_back(MakeNode("Mul", {"x", "s"}, {"y"}));
    RowKernelRequest req;
    req.function = &f;
    req.input_types = {DataType::kFloat};
    req.input_shapes = {{4, 8}};
    req.constants = {nullptr};
    gen = GenerateRowKernel(req, "gaf_test_cache_silu");
  }
  std::vector<KernelSource> Sources() const { return {{gen.symbol, gen.source}}; }
  // Compiles (or loads) and checks one call against x * sigmoid(x).
  std::shared_ptr<KernelLibrary> CompileAndRun(KernelCompiler& compiler) const {
    auto lib = compiler.Compile(Sources());
    auto fn = reinterpret_cast<RowKernelFn>(lib->Find(gen.symbol));
    EXPECT_NE(fn, nullptr);
    if (fn == nullptr) return lib;
    Tensor x = Filled({4, 8}, -0.3f);
    std::vector<Tensor> y = RunRowKernel(fn, gen, {&x});
    for (int64_t i = 0; i < x.numel(); ++i) {
      const float v = x.data<float>()[i];
      EXPECT_NEAR(y[0].data<float>()[i], v / (1.f + std::exp(-v)), 1e-5f);
    }
    return lib;
  }
};

fs::path LibraryPath(const KernelLibrary& lib) { return fs::path(lib.directory()) / "libgaf_kernels.so"; }

// Replaces `p` by a new file (the old inode stays intact for a process that has it mapped).
void Replace(const fs::path& p, const std::string& bytes) {
  const fs::path tmp = p.string() + ".test";
  std::ofstream(tmp, std::ios::binary) << bytes;
  fs::rename(tmp, p);
}

std::string Read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The first library built in a fresh root: its folder, and its bytes.
struct CachedLibrary {
  TempRoot root;
  SiluKernel kernel;
  fs::path dir, so;
  std::string bytes;
  CachedLibrary() {
    KernelCompiler compiler(root.path.string());
    auto lib = kernel.CompileAndRun(compiler);
    EXPECT_FALSE(lib->from_cache());
    dir = lib->directory();
    so = LibraryPath(*lib);
    bytes = Read(so);
  }
  std::string ErrorOfCompile() const {
    KernelCompiler compiler(root.path.string());
    try {
      compiler.Compile(kernel.Sources());
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
};

TEST(CodegenSecurity, CacheHitNeedsNoRebuild) {
  CachedLibrary c;
  KernelCompiler compiler(c.root.path.string());
  EXPECT_TRUE(c.kernel.CompileAndRun(compiler)->from_cache());
  struct stat st;
  for (const fs::path& p : {c.root.path / KernelCompiler::TargetName(), c.dir}) {
    ASSERT_EQ(::lstat(p.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 077, 0u) << p << " is not private to the user";
  }
}

TEST(CodegenSecurity, TruncatedLibraryIsRebuilt) {
  CachedLibrary c;
  ASSERT_GT(c.bytes.size(), 1000u);
  Replace(c.so, c.bytes.substr(0, c.bytes.size() / 3));
  KernelCompiler compiler(c.root.path.string());
  EXPECT_FALSE(c.kernel.CompileAndRun(compiler)->from_cache());
  EXPECT_EQ(fs::file_size(c.so), c.bytes.size());
  EXPECT_TRUE(c.kernel.CompileAndRun(compiler)->from_cache());
}

TEST(CodegenSecurity, LibraryNotMatchingItsChecksumIsRebuilt) {
  CachedLibrary c;
  std::string flipped = c.bytes;
  flipped[flipped.size() / 2] ^= 0x5a;
  Replace(c.so, flipped);
  KernelCompiler compiler(c.root.path.string());
  EXPECT_FALSE(c.kernel.CompileAndRun(compiler)->from_cache());
  EXPECT_EQ(Read(c.so).size(), c.bytes.size());
  // A damaged checksum file: rebuilt as well.
  Replace(c.dir / "libgaf_kernels.sum", "fnv1a64 0000000000000000 1\n");
  EXPECT_FALSE(c.kernel.CompileAndRun(compiler)->from_cache());
  EXPECT_TRUE(c.kernel.CompileAndRun(compiler)->from_cache());
}

TEST(CodegenSecurity, WritableCacheFoldersAreRefused) {
  CachedLibrary c;
  for (const fs::path& p : {c.root.path, c.root.path / KernelCompiler::TargetName(), c.dir}) {
    ASSERT_EQ(::chmod(p.c_str(), 0777), 0);
    const std::string err = c.ErrorOfCompile();
    EXPECT_NE(err.find(p.string()), std::string::npos) << err;
    EXPECT_NE(err.find("writable by group or others"), std::string::npos) << err;
    ASSERT_EQ(::chmod(p.c_str(), 0700), 0);
  }
  for (const fs::path& p : {c.so, c.dir / "libgaf_kernels.sum"}) {
    ASSERT_EQ(::chmod(p.c_str(), 0666), 0);
    const std::string err = c.ErrorOfCompile();
    EXPECT_NE(err.find(p.string()), std::string::npos) << err;
    ASSERT_EQ(::chmod(p.c_str(), 0755), 0);
  }
  EXPECT_EQ(c.ErrorOfCompile(), "");
}

TEST(CodegenSecurity, CacheOwnedByAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to chown to another uid";
  CachedLibrary c;
  for (const fs::path& p : {c.root.path, c.dir, c.so}) {
    ASSERT_EQ(::lchown(p.c_str(), 12345, static_cast<gid_t>(-1)), 0);
    const std::string err = c.ErrorOfCompile();
    EXPECT_NE(err.find(p.string()), std::string::npos) << err;
    EXPECT_NE(err.find("owned by uid 12345"), std::string::npos) << err;
    ASSERT_EQ(::lchown(p.c_str(), ::geteuid(), static_cast<gid_t>(-1)), 0);
  }
  EXPECT_EQ(c.ErrorOfCompile(), "");
}

TEST(CodegenSecurity, SymbolicLinkInTheCacheIsRefused) {
  CachedLibrary c;
  const fs::path real = c.root.path / "elsewhere.so";
  fs::rename(c.so, real);
  fs::create_symlink(real, c.so);
  const std::string err = c.ErrorOfCompile();
  EXPECT_NE(err.find("symbolic link"), std::string::npos) << err;
}

// Holds a folder's build lock as another process would.
struct HeldLock {
  int fd;
  explicit HeldLock(const fs::path& dir) : fd(::open((dir / ".lock").c_str(), O_CREAT | O_RDWR, 0600)) {
    EXPECT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  }
  ~HeldLock() { ::close(fd); }
};

TEST(CodegenSecurity, HeldLockGivesAnErrorInsteadOfHanging) {
  CachedLibrary c;
  Replace(c.so, c.bytes.substr(0, 100));  // needs a rebuild, which needs the lock
  HeldLock held(c.dir);
  ScopedEnv timeout("GAF_KERNEL_LOCK_TIMEOUT", "0.3");
  const auto t0 = std::chrono::steady_clock::now();
  const std::string err = c.ErrorOfCompile();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  EXPECT_NE(err.find((c.dir / ".lock").string()), std::string::npos) << err;
  EXPECT_NE(err.find("held by another process"), std::string::npos) << err;
}

TEST(CodegenSecurity, CacheHitLoadsWhileTheLockIsHeld) {
  CachedLibrary c;
  HeldLock held(c.dir);
  ScopedEnv timeout("GAF_KERNEL_LOCK_TIMEOUT", "0.3");
  KernelCompiler compiler(c.root.path.string());
  EXPECT_TRUE(c.kernel.CompileAndRun(compiler)->from_cache());
}

TEST(CodegenSecurity, BadLockTimeoutIsAnError) {
  CachedLibrary c;
  Replace(c.so, "");
  ScopedEnv timeout("GAF_KERNEL_LOCK_TIMEOUT", "soon");
  EXPECT_NE(c.ErrorOfCompile().find("GAF_KERNEL_LOCK_TIMEOUT"), std::string::npos);
}

TEST(CodegenSecurity, DefaultCacheIsNeverASharedFolder) {
  ScopedEnv cache("GAF_KERNEL_CACHE", nullptr), home("HOME", nullptr);
  const std::string root = KernelCompiler().cache_root();
  EXPECT_NE(root.rfind("/tmp", 0), 0u) << root;
  EXPECT_NE(root.find("/.cache/graph-autofusion/kernels"), std::string::npos) << root;
  ScopedEnv explicit_cache("GAF_KERNEL_CACHE", "/some/where");
  EXPECT_EQ(KernelCompiler().cache_root(), "/some/where");
}

}  // namespace
}  // namespace gaf
