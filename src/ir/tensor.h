// Tensors: a data type, a shape and a reference-counted, 64-byte aligned buffer.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ir/error.h"
#include "ir/half.h"  // HalfToFloat, FloatToHalf, BFloat16ToFloat, FloatToBFloat16

namespace gaf {

// Values match onnx::TensorProto_DataType so conversion is a cast.
enum class DataType : int32_t {
  kUndefined = 0,
  kFloat = 1,
  kUint8 = 2,
  kInt8 = 3,
  kUint16 = 4,
  kInt16 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kString = 8,
  kBool = 9,
  kFloat16 = 10,
  kDouble = 11,
  kUint32 = 12,
  kUint64 = 13,
  kComplex64 = 14,
  kComplex128 = 15,
  kBFloat16 = 16,
};

// Bytes per element (0 for undefined/string).
size_t DataTypeSize(DataType dt);
// ONNX spelling: "float", "float16", "int64", ...
std::string DataTypeName(DataType dt);
bool IsFloatingPoint(DataType dt);  // float, double, float16, bfloat16
bool IsHalf(DataType dt);           // float16, bfloat16

// Storage types used by kernels for 16-bit floats (distinct from uint16_t).
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

using Shape = std::vector<int64_t>;
// Product of the dimensions; gaf::Error for a negative dimension or a product past int64.
int64_t NumElements(const Shape& shape);
std::string ShapeToString(const Shape& shape);  // "[2,3,4]"
// a * b and a + b, or gaf::Error naming `what` ("dimension", "offset") when they overflow int64.
int64_t CheckedMul(int64_t a, int64_t b, const char* what = "size");
int64_t CheckedAdd(int64_t a, int64_t b, const char* what = "size");
// Bytes a tensor of dt and shape takes (strings: their std::string objects), checked before any
// memory is touched: gaf::Error for a negative dimension, a size past int64, or more than
// GlobalLimits().max_tensor_bytes. `what` names the tensor in the message ("tensor 'W'");
// empty: "a float tensor".
int64_t TensorBytes(DataType dt, const Shape& shape, const std::string& what = "");

// C++ type <-> DataType.
template <class T>
constexpr DataType DataTypeOf();
template <> constexpr DataType DataTypeOf<float>() { return DataType::kFloat; }
template <> constexpr DataType DataTypeOf<double>() { return DataType::kDouble; }
template <> constexpr DataType DataTypeOf<int8_t>() { return DataType::kInt8; }
template <> constexpr DataType DataTypeOf<uint8_t>() { return DataType::kUint8; }
template <> constexpr DataType DataTypeOf<int16_t>() { return DataType::kInt16; }
template <> constexpr DataType DataTypeOf<uint16_t>() { return DataType::kUint16; }
template <> constexpr DataType DataTypeOf<int32_t>() { return DataType::kInt32; }
template <> constexpr DataType DataTypeOf<uint32_t>() { return DataType::kUint32; }
template <> constexpr DataType DataTypeOf<int64_t>() { return DataType::kInt64; }
template <> constexpr DataType DataTypeOf<uint64_t>() { return DataType::kUint64; }
template <> constexpr DataType DataTypeOf<bool>() { return DataType::kBool; }
template <> constexpr DataType DataTypeOf<Half>() { return DataType::kFloat16; }
template <> constexpr DataType DataTypeOf<BFloat16>() { return DataType::kBFloat16; }
template <> constexpr DataType DataTypeOf<std::string>() { return DataType::kString; }

// A dense tensor. Copying a Tensor shares its buffer (like a shared_ptr); use Clone() for a deep copy.
// Kernels never write into their inputs.
// Tensor buffers of 64 KiB or more are recycled by size class (a free list per class, up to 2 GiB
// cached; ir/tensor.cc) instead of returned to the system: the memory reuse of a decode loop, whose
// steps allocate the same sizes. On by default; off (bench's stage table, to show what it is worth)
// frees the cached buffers and every buffer freed afterwards.
void SetBufferReuse(bool on);

class Tensor {
 public:
  Tensor() = default;
  // Allocates zero-initialized storage for NumElements(shape) elements of dt.
  Tensor(DataType dt, Shape shape);
  // The same without the zero fill, for kernels that write every element (not for strings).
  static Tensor Uninitialized(DataType dt, Shape shape);

  // Wraps external memory without copying; `keep_alive` owns it (may be null if the caller
  // guarantees lifetime).
  static Tensor Wrap(DataType dt, Shape shape, void* data, std::shared_ptr<void> keep_alive);

  template <class T>
  static Tensor Scalar(T v) {
    Tensor t(DataTypeOf<T>(), {});
    t.data<T>()[0] = v;
    return t;
  }
  template <class T>
  static Tensor FromVector(const std::vector<T>& v, Shape shape) {
    Tensor t(DataTypeOf<T>(), std::move(shape));
    GAF_CHECK(static_cast<int64_t>(v.size()) == t.numel(), "FromVector: size mismatch");
    for (size_t i = 0; i < v.size(); ++i) t.data<T>()[i] = v[i];
    return t;
  }
  // 1-D int64 tensor.
  static Tensor FromInt64s(const std::vector<int64_t>& v) {
    return FromVector<int64_t>(v, {static_cast<int64_t>(v.size())});
  }

  bool defined() const { return dtype_ != DataType::kUndefined; }
  DataType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  int64_t dim(int64_t i) const { return shape_[static_cast<size_t>(i < 0 ? i + rank() : i)]; }
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * DataTypeSize(dtype_); }

  // The elements, contiguous in row-major order. Throws gaf::Error for a padded cache (below).
  void* raw() {
    if (room_) CheckDense();
    return data_;
  }
  const void* raw() const {
    if (room_) CheckDense();
    return data_;
  }
  template <class T>
  T* data() {
    CheckType(DataTypeOf<T>());
    if (room_) CheckDense();
    return static_cast<T*>(data_);
  }
  template <class T>
  const T* data() const {
    CheckType(DataTypeOf<T>());
    if (room_) CheckDense();
    return static_cast<const T*>(data_);
  }

  // Key/value caches with room to grow, so that a generation appends each step's rows in place
  // instead of copying the whole cache into a new present tensor (ONNX Runtime's shared past and
  // present buffers): storage for [d0, d1, capacity, d3] holding a rank-4 tensor [d0, d1, rows, d3]
  // as the first `rows` rows of each of its d0*d1 heads. Such a tensor is padded when it has more
  // than one head and rows < capacity: its elements are then not contiguous, raw() and data()
  // throw, and only kernels that say they read padded caches (KernelInfo::reads_padded_caches) get
  // it; the session gives the others a Dense() copy, and its callers too unless they asked for
  // caches with room (Session::Run's cache_room, which Generate sets).
  static Tensor WithCacheRoom(DataType dt, Shape shape, int64_t capacity);
  bool padded() const {
    return room_ != nullptr && shape_.size() == 4 && room_->capacity != shape_[2] && shape_[0] * shape_[1] > 1;
  }
  // Rows of storage per head: the capacity for a cache with room, else dim(2) (rank 4 only).
  int64_t cache_capacity() const { return room_ != nullptr && shape_.size() == 4 ? room_->capacity : shape_[2]; }
  // Elements from one head's first element to the next's: cache_capacity() * dim(3).
  int64_t head_stride() const { return cache_capacity() * shape_[3]; }
  // The storage of a rank-4 tensor, padded or not: head h starts h * head_stride() elements in.
  template <class T>
  const T* cache_data() const {
    CheckType(DataTypeOf<T>());
    return static_cast<const T*>(data_);
  }
  template <class T>
  T* cache_data() {
    CheckType(DataTypeOf<T>());
    return static_cast<T*>(data_);
  }
  // This cache with `rows` more rows per head, in the same storage, when it has that much room
  // left and no other tensor has taken the rows after its own yet (claimed atomically, so two
  // appends to one past never write the same rows); an undefined tensor otherwise. The new rows'
  // contents are the caller's to write, before anyone else reads the result.
  Tensor AppendInPlace(int64_t rows) const;
  // The same values in contiguous storage: *this when it is not padded, else a copy.
  Tensor Dense() const;

  // Same buffer, new shape (element count must match; not for a padded cache).
  Tensor Reshaped(Shape shape) const;
  // Deep copy.
  Tensor Clone() const;
  // Element values as int64 (for shape-like inputs: int32/int64/uint8/bool...).
  std::vector<int64_t> ToInt64s() const;
  // Element values as double (any numeric type, incl. float16).
  std::vector<double> ToDoubles() const;
  // Element i (flat index) as a double, without copying the tensor.
  double DoubleAt(int64_t i) const;
  // Single element as double / int64 (requires numel()==1).
  double ScalarAsDouble() const;
  int64_t ScalarAsInt64() const;
  // Convert to another data type (numeric and bool; float16/bfloat16 through float).
  Tensor CastTo(DataType dt) const;
  // Whether another tensor holds this buffer too (a session's constants or caches, an input).
  bool SharesBuffer() const { return storage_.use_count() > 1; }

 private:
  void CheckType(DataType want) const;
  void CheckDense() const;  // throws for a padded cache

  struct CacheRoom {
    int64_t capacity = 0;
    std::atomic<int64_t> used{0};  // rows per head some tensor on this storage has taken
  };

  DataType dtype_ = DataType::kUndefined;
  Shape shape_;
  int64_t numel_ = 0;
  std::shared_ptr<void> storage_;  // owns the buffer (or keeps external memory alive)
  void* data_ = nullptr;
  std::shared_ptr<CacheRoom> room_;  // caches with room only
};

}  // namespace gaf
