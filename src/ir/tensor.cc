#include "ir/tensor.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sys/mman.h>
#include <unordered_map>
#include <algorithm>

#include <fmt/ranges.h>

#include "ir/limits.h"
#include "ir/memory_plan.h"

namespace gaf {

size_t DataTypeSize(DataType dt) {
  switch (dt) {
    case DataType::kFloat: case DataType::kInt32: case DataType::kUint32: return 4;
    case DataType::kDouble: case DataType::kInt64: case DataType::kUint64: case DataType::kComplex64: return 8;
    case DataType::kComplex128: return 16;
    case DataType::kUint8: case DataType::kInt8: case DataType::kBool: return 1;
    case DataType::kUint16: case DataType::kInt16: case DataType::kFloat16: case DataType::kBFloat16: return 2;
    default: return 0;
  }
}

std::string DataTypeName(DataType dt) {
  switch (dt) {
    case DataType::kFloat: return "float";
    case DataType::kUint8: return "uint8";
    case DataType::kInt8: return "int8";
    case DataType::kUint16: return "uint16";
    case DataType::kInt16: return "int16";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kString: return "string";
    case DataType::kBool: return "bool";
    case DataType::kFloat16: return "float16";
    case DataType::kDouble: return "double";
    case DataType::kUint32: return "uint32";
    case DataType::kUint64: return "uint64";
    case DataType::kComplex64: return "complex64";
    case DataType::kComplex128: return "complex128";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kUndefined: return "undefined";
  }
  return fmt::format("type#{}", static_cast<int>(dt));
}

bool IsFloatingPoint(DataType dt) {
  return dt == DataType::kFloat || dt == DataType::kDouble || IsHalf(dt);
}
bool IsHalf(DataType dt) { return dt == DataType::kFloat16 || dt == DataType::kBFloat16; }

std::string ShapeToString(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ",")); }

namespace {

// Product of the non-zero dimensions (so that every partial product, e.g. a stride, of an
// accepted shape fits too), or -1 when it overflows int64; -2 for a negative dimension.
int64_t NonZeroProduct(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -2;
    if (d > 0 && __builtin_mul_overflow(n, d, &n)) return -1;
  }
  return n;
}

bool HasZero(const Shape& shape) { return std::find(shape.begin(), shape.end(), 0) != shape.end(); }

}  // namespace

int64_t NumElements(const Shape& shape) {
  const int64_t n = NonZeroProduct(shape);
  GAF_CHECK(n != -2, "negative dimension in shape {}", ShapeToString(shape));
  GAF_CHECK(n != -1, "shape {} has more elements than fit in 64 bits", ShapeToString(shape));
  return HasZero(shape) ? 0 : n;
}

int64_t CheckedMul(int64_t a, int64_t b, const char* what) {
  int64_t r;
  GAF_CHECK(!__builtin_mul_overflow(a, b, &r), "{} {} * {} overflows 64 bits", what, a, b);
  return r;
}

int64_t CheckedAdd(int64_t a, int64_t b, const char* what) {
  int64_t r;
  GAF_CHECK(!__builtin_add_overflow(a, b, &r), "{} {} + {} overflows 64 bits", what, a, b);
  return r;
}

int64_t TensorBytes(DataType dt, const Shape& shape, const std::string& what) {
  const std::string name = what.empty() ? fmt::format("a {} tensor", DataTypeName(dt)) : what;
  int64_t n = NonZeroProduct(shape), bytes = 0;
  GAF_CHECK(n != -2, "{} has a negative dimension in shape {}", name, ShapeToString(shape));
  GAF_CHECK(n != -1, "{} of shape {} has more elements than fit in 64 bits", name, ShapeToString(shape));
  if (HasZero(shape)) n = 0;
  const int64_t es = dt == DataType::kString ? sizeof(std::string) : static_cast<int64_t>(DataTypeSize(dt));
  GAF_CHECK(!__builtin_mul_overflow(n, es, &bytes), "{} of shape {} needs more bytes than fit in 64 bits", name,
            ShapeToString(shape));
  const int64_t limit = GlobalLimits().max_tensor_bytes;
  GAF_CHECK(limit <= 0 || bytes <= limit, "{} of shape {} needs {}, more than the memory limit {} (--max-memory)",
            name, ShapeToString(shape), FormatBytes(bytes), FormatBytes(limit));
  return bytes;
}

namespace {

// Large buffers are recycled instead of returned to the OS: on the virtual machines we run on a
// fresh page costs a fault (tens of microseconds), which made a 64 MiB output cost more to allocate
// than to compute. Sizes are rounded up to classes 1/8 of a power of two apart (at most 12.5%
// waste) so that slowly growing tensors (a KV cache) reuse buffers too. Small buffers come from
// malloc, which already keeps them in its heap.
class BufferPool {
 public:
  static constexpr size_t kPoolMin = size_t{64} << 10;
  static constexpr size_t kMaxCached = size_t{2} << 30;
  static constexpr size_t kHugeMin = size_t{2} << 20;

  static size_t SizeClass(size_t bytes) {
    bytes = std::max<size_t>(bytes, 64);
    if (bytes < kPoolMin) return (bytes + 63) / 64 * 64;
    size_t top = size_t{1} << (63 - __builtin_clzll(bytes));  // largest power of two <= bytes
    size_t step = top / 8;
    return (bytes + step - 1) / step * step;
  }

  void* Get(size_t cls) {
    if (cls >= kPoolMin && reuse_.load(std::memory_order_relaxed)) {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(cls);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_ -= cls;
        return p;
      }
    }
    if (cls >= kHugeMin) {
      // Transparent huge pages: one fault per 2 MiB instead of per 4 KiB (4-6x faster first touch).
      void* p = std::aligned_alloc(kHugeMin, (cls + kHugeMin - 1) / kHugeMin * kHugeMin);
      if (p != nullptr) ::madvise(p, cls, MADV_HUGEPAGE);
      return p;
    }
    return std::aligned_alloc(64, cls);
  }

  void Put(void* p, size_t cls) {
    if (cls >= kPoolMin && reuse_.load(std::memory_order_relaxed)) {
      std::lock_guard<std::mutex> lock(mu_);
      if (cached_ + cls <= kMaxCached) {
        free_[cls].push_back(p);
        cached_ += cls;
        return;
      }
    }
    std::free(p);
  }

  void SetReuse(bool on) {
    reuse_.store(on);
    if (on) return;
    std::lock_guard<std::mutex> lock(mu_);  // off: the cached buffers go back too
    for (auto& [cls, list] : free_)
      for (void* p : list) std::free(p);
    free_.clear();
    cached_ = 0;
  }

 private:
  std::atomic<bool> reuse_{true};
  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_ = 0;
};

BufferPool& Pool() {
  static BufferPool* pool = new BufferPool();  // never destroyed: tensors may outlive statics
  return *pool;
}

// A buffer of `bytes` (rounded to its size class) from the pool, returned to it when freed.
std::shared_ptr<void> PoolBuffer(size_t bytes) {
  const size_t alloc = BufferPool::SizeClass(bytes);
  void* p = Pool().Get(alloc);
  if (p == nullptr) throw Error(fmt::format("out of memory allocating {} bytes", alloc));
  return std::shared_ptr<void>(p, [alloc](void* q) { Pool().Put(q, alloc); });
}

// A tensor's buffer: from the memory plan active on this thread (ir/memory_plan.h), else the pool.
std::shared_ptr<void> NewBuffer(size_t bytes, void** data) {
  if (MemoryPlan* plan = MemoryPlan::Active())
    return plan->Allocate((std::max<size_t>(bytes, 1) + 63) / 64 * 64, &PoolBuffer, data);
  std::shared_ptr<void> b = PoolBuffer(bytes);
  *data = b.get();
  return b;
}

}  // namespace

void SetBufferReuse(bool on) { Pool().SetReuse(on); }

Tensor Tensor::Uninitialized(DataType dt, Shape shape) {
  GAF_CHECK(dt != DataType::kString, "uninitialized string tensors are not supported");
  Tensor t;
  t.dtype_ = dt;
  t.shape_ = std::move(shape);
  const size_t bytes = static_cast<size_t>(TensorBytes(dt, t.shape_));
  t.numel_ = NumElements(t.shape_);
  t.storage_ = NewBuffer(bytes, &t.data_);
  return t;
}

Tensor::Tensor(DataType dt, Shape shape) : dtype_(dt), shape_(std::move(shape)) {
  // Refuse what the memory limit does not allow: a corrupt shape must become an error, not an
  // overflowed (too small) buffer or an OOM kill.
  const size_t bytes = static_cast<size_t>(TensorBytes(dt, shape_));
  numel_ = NumElements(shape_);
  if (dt == DataType::kString) {
    auto* v = new std::vector<std::string>(static_cast<size_t>(numel_));
    storage_ = std::shared_ptr<void>(v, [](void* p) { delete static_cast<std::vector<std::string>*>(p); });
    data_ = v->data();
    return;
  }
  storage_ = NewBuffer(bytes, &data_);
  std::memset(data_, 0, bytes);
}

Tensor Tensor::Wrap(DataType dt, Shape shape, void* data, std::shared_ptr<void> keep_alive) {
  Tensor t;
  t.dtype_ = dt;
  t.shape_ = std::move(shape);
  t.numel_ = NumElements(t.shape_);
  t.storage_ = std::move(keep_alive);
  t.data_ = data;
  return t;
}

void Tensor::CheckType(DataType want) const {
  if (want != dtype_) {
    // uint16_t storage access is allowed for 16-bit floats, uint8 for bool.
    size_t ws = DataTypeSize(want);
    if (ws != 0 && ws == DataTypeSize(dtype_) && !(want == DataType::kFloat || dtype_ == DataType::kFloat) &&
        (IsHalf(dtype_) || dtype_ == DataType::kBool || IsHalf(want) || want == DataType::kBool))
      return;
    throw Error(fmt::format("tensor of type {} accessed as {}", DataTypeName(dtype_), DataTypeName(want)));
  }
}

void Tensor::CheckDense() const {
  if (padded())
    throw Error(fmt::format("a key/value cache {} with room for {} rows per head was read as a contiguous tensor "
                            "(an operator that does not read padded caches was handed one)",
                            ShapeToString(shape_), room_->capacity));
}

namespace {

// A cache's room, rounded up so that its storage fills whole huge pages when it takes at least
// kPoolMin bytes (the pool allocates from kHugeMin bytes in transparent huge pages, and rounds to
// them anyway). A decode step appends one row to every head: in 4 KiB pages of a fresh room that
// was a page fault every 16 rows of each head's rows (tens of microseconds each on the virtual
// machines we run on), and the heads' rows lay on dozens of small pages. `autofusion generate` on a
// GPT-2 layout at the bench dims (16 cache heads, head size 64): the attention took 62-74 us a call
// against 38-44 with the room in huge pages (alternating processes; docs/benchmarks.md).
// At most one huge page more per cache tensor; smaller caches keep their room as asked.
int64_t HugePageCapacity(DataType dt, const Shape& shape, int64_t capacity) {
  constexpr int64_t kHuge = BufferPool::kHugeMin, kMinBytes = BufferPool::kPoolMin;
  int64_t row = 0, bytes = 0;  // bytes of one row of every head; of the storage as asked
  if (__builtin_mul_overflow(shape[0], shape[1], &row) || __builtin_mul_overflow(row, shape[3], &row) ||
      __builtin_mul_overflow(row, static_cast<int64_t>(DataTypeSize(dt)), &row) || row <= 0 ||
      __builtin_mul_overflow(row, capacity, &bytes) || bytes < kMinBytes || bytes > (int64_t{1} << 40))
    return capacity;
  const int64_t pages = (bytes + kHuge - 1) / kHuge;
  return std::max(capacity, pages * kHuge / row);
}

}  // namespace

Tensor Tensor::WithCacheRoom(DataType dt, Shape shape, int64_t capacity) {
  GAF_CHECK(shape.size() == 4 && capacity >= shape[2] && shape[2] >= 0 && dt != DataType::kString,
            "a cache with room needs rank 4 and capacity ({}) >= rows (shape {})", capacity, ShapeToString(shape));
  capacity = HugePageCapacity(dt, shape, capacity);
  Shape storage = shape;
  storage[2] = capacity;
  Tensor t = Uninitialized(dt, storage);
  t.shape_ = std::move(shape);
  t.numel_ = NumElements(t.shape_);
  t.room_ = std::make_shared<CacheRoom>();
  t.room_->capacity = capacity;
  t.room_->used.store(t.shape_[2]);
  return t;
}

Tensor Tensor::AppendInPlace(int64_t rows) const {
  if (room_ == nullptr || rows < 0 || rows > room_->capacity - shape_[2]) return Tensor();
  int64_t expected = shape_[2];
  if (!room_->used.compare_exchange_strong(expected, shape_[2] + rows)) return Tensor();
  Tensor t = *this;
  t.shape_[2] += rows;
  t.numel_ = NumElements(t.shape_);
  return t;
}

Tensor Tensor::Dense() const {
  if (!padded()) return *this;
  Tensor t = Uninitialized(dtype_, shape_);
  const size_t es = DataTypeSize(dtype_), head = static_cast<size_t>(shape_[2] * shape_[3]) * es;
  const size_t stride = static_cast<size_t>(head_stride()) * es;
  const auto* src = static_cast<const char*>(data_);
  auto* dst = static_cast<char*>(t.data_);
  for (int64_t h = 0; h < shape_[0] * shape_[1]; ++h) std::memcpy(dst + h * head, src + h * stride, head);
  return t;
}

Tensor Tensor::Reshaped(Shape shape) const {
  CheckDense();
  GAF_CHECK(NumElements(shape) == numel_, "cannot reshape {} to {}", ShapeToString(shape_), ShapeToString(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  t.room_.reset();  // another shape of the same elements: a plain tensor (no rows to append to)
  return t;
}

Tensor Tensor::Clone() const {
  if (!defined()) return Tensor();
  if (padded()) return Dense();
  Tensor t(dtype_, shape_);
  if (dtype_ == DataType::kString) {
    for (int64_t i = 0; i < numel_; ++i) t.data<std::string>()[i] = data<std::string>()[i];
  } else if (nbytes() > 0) {
    std::memcpy(t.data_, data_, nbytes());
  }
  return t;
}

namespace {
template <class T>
double ElemAsDouble(const void* p, int64_t i) {
  return static_cast<double>(static_cast<const T*>(p)[i]);
}
double ElementAsDouble(DataType dt, const void* p, int64_t i) {
  switch (dt) {
    case DataType::kFloat: return ElemAsDouble<float>(p, i);
    case DataType::kDouble: return ElemAsDouble<double>(p, i);
    case DataType::kInt64: return ElemAsDouble<int64_t>(p, i);
    case DataType::kInt32: return ElemAsDouble<int32_t>(p, i);
    case DataType::kInt16: return ElemAsDouble<int16_t>(p, i);
    case DataType::kInt8: return ElemAsDouble<int8_t>(p, i);
    case DataType::kUint8: return ElemAsDouble<uint8_t>(p, i);
    case DataType::kUint16: return ElemAsDouble<uint16_t>(p, i);
    case DataType::kUint32: return ElemAsDouble<uint32_t>(p, i);
    case DataType::kUint64: return ElemAsDouble<uint64_t>(p, i);
    case DataType::kBool: return static_cast<const uint8_t*>(p)[i] ? 1.0 : 0.0;
    case DataType::kFloat16: return HalfToFloat(static_cast<const uint16_t*>(p)[i]);
    case DataType::kBFloat16: return BFloat16ToFloat(static_cast<const uint16_t*>(p)[i]);
    default: throw UnsupportedError(fmt::format("cannot read {} elements as numbers", DataTypeName(dt)));
  }
}
int64_t ElementAsInt64(DataType dt, const void* p, int64_t i) {
  switch (dt) {
    case DataType::kInt64: return static_cast<const int64_t*>(p)[i];
    case DataType::kInt32: return static_cast<const int32_t*>(p)[i];
    case DataType::kUint64: return static_cast<int64_t>(static_cast<const uint64_t*>(p)[i]);
    default: return static_cast<int64_t>(ElementAsDouble(dt, p, i));
  }
}
template <class T>
void StoreFromDouble(void* p, int64_t i, double v) {
  static_cast<T*>(p)[i] = static_cast<T>(v);
}
}  // namespace

std::vector<int64_t> Tensor::ToInt64s() const {
  CheckDense();
  std::vector<int64_t> out(static_cast<size_t>(numel_));
  for (int64_t i = 0; i < numel_; ++i) out[i] = ElementAsInt64(dtype_, data_, i);
  return out;
}

std::vector<double> Tensor::ToDoubles() const {
  CheckDense();
  std::vector<double> out(static_cast<size_t>(numel_));
  for (int64_t i = 0; i < numel_; ++i) out[i] = ElementAsDouble(dtype_, data_, i);
  return out;
}

double Tensor::DoubleAt(int64_t i) const {
  CheckDense();
  return ElementAsDouble(dtype_, data_, i);
}

double Tensor::ScalarAsDouble() const {
  CheckDense();
  GAF_CHECK(numel_ == 1, "expected a single value, got shape {}", ShapeToString(shape_));
  return ElementAsDouble(dtype_, data_, 0);
}
int64_t Tensor::ScalarAsInt64() const {
  CheckDense();
  GAF_CHECK(numel_ == 1, "expected a single value, got shape {}", ShapeToString(shape_));
  return ElementAsInt64(dtype_, data_, 0);
}

Tensor Tensor::CastTo(DataType dt) const {
  CheckDense();
  if (dt == dtype_) return *this;
  Tensor out(dt, shape_);
  if (dtype_ == DataType::kFloat && dt == DataType::kFloat16) {
    const float* s = data<float>();
    uint16_t* d = static_cast<uint16_t*>(out.raw());
    for (int64_t i = 0; i < numel_; ++i) d[i] = FloatToHalf(s[i]);
    return out;
  }
  if (dtype_ == DataType::kFloat16 && dt == DataType::kFloat) {
    const uint16_t* s = static_cast<const uint16_t*>(data_);
    float* d = out.data<float>();
    for (int64_t i = 0; i < numel_; ++i) d[i] = HalfToFloat(s[i]);
    return out;
  }
  for (int64_t i = 0; i < numel_; ++i) {
    double v = ElementAsDouble(dtype_, data_, i);
    void* p = out.raw();
    switch (dt) {
      case DataType::kFloat: StoreFromDouble<float>(p, i, v); break;
      case DataType::kDouble: StoreFromDouble<double>(p, i, v); break;
      case DataType::kInt64:
        static_cast<int64_t*>(p)[i] = ElementAsInt64(dtype_, data_, i);
        break;
      case DataType::kInt32: StoreFromDouble<int32_t>(p, i, v); break;
      case DataType::kInt16: StoreFromDouble<int16_t>(p, i, v); break;
      case DataType::kInt8: StoreFromDouble<int8_t>(p, i, v); break;
      case DataType::kUint8: StoreFromDouble<uint8_t>(p, i, v); break;
      case DataType::kUint16: StoreFromDouble<uint16_t>(p, i, v); break;
      case DataType::kUint32: StoreFromDouble<uint32_t>(p, i, v); break;
      case DataType::kUint64: StoreFromDouble<uint64_t>(p, i, v); break;
      case DataType::kBool: static_cast<uint8_t*>(p)[i] = v != 0.0; break;
      case DataType::kFloat16: static_cast<uint16_t*>(p)[i] = FloatToHalf(static_cast<float>(v)); break;
      case DataType::kBFloat16: static_cast<uint16_t*>(p)[i] = FloatToBFloat16(static_cast<float>(v)); break;
      default: throw UnsupportedError(fmt::format("cannot convert {} to {}", DataTypeName(dtype_), DataTypeName(dt)));
    }
  }
  return out;
}

}  // namespace gaf
