#include "convert.h"

#include <cstdint>
#include <cstring>
#include <memory>

#include "ir/error.h"

namespace gaf::py {

namespace {

// numpy's kind/itemsize -> DataType; kUndefined when the runtime has no such type.
DataType DataTypeOfNumpy(const pyb::dtype& dt) {
  const char kind = dt.kind();
  const size_t size = dt.itemsize();
  switch (kind) {
    case 'f': return size == 4 ? DataType::kFloat : size == 8 ? DataType::kDouble : size == 2 ? DataType::kFloat16
                                                                                              : DataType::kUndefined;
    case 'i': return size == 8 ? DataType::kInt64 : size == 4 ? DataType::kInt32 : size == 2 ? DataType::kInt16
                   : size == 1 ? DataType::kInt8 : DataType::kUndefined;
    case 'u': return size == 8 ? DataType::kUint64 : size == 4 ? DataType::kUint32 : size == 2 ? DataType::kUint16
                   : size == 1 ? DataType::kUint8 : DataType::kUndefined;
    case 'b': return DataType::kBool;
    default: return DataType::kUndefined;
  }
}

pyb::dtype NumpyDtype(DataType dt) {
  switch (dt) {
    case DataType::kFloat: return pyb::dtype("float32");
    case DataType::kDouble: return pyb::dtype("float64");
    case DataType::kFloat16: return pyb::dtype("float16");
    case DataType::kInt64: return pyb::dtype("int64");
    case DataType::kInt32: return pyb::dtype("int32");
    case DataType::kInt16: return pyb::dtype("int16");
    case DataType::kInt8: return pyb::dtype("int8");
    case DataType::kUint64: return pyb::dtype("uint64");
    case DataType::kUint32: return pyb::dtype("uint32");
    case DataType::kUint16: return pyb::dtype("uint16");
    case DataType::kUint8: return pyb::dtype("uint8");
    case DataType::kBool: return pyb::dtype("bool");
    default: throw Error(fmt::format("a {} tensor has no numpy type", DataTypeName(dt)));
  }
}

}  // namespace

Tensor ToTensor(const pyb::handle& value, const std::string& what) {
  pyb::module_ np = pyb::module_::import("numpy");
  pyb::array arr = pyb::reinterpret_steal<pyb::array>(
      pyb::detail::npy_api::get().PyArray_FromAny_(value.ptr(), nullptr, 0, 0, 0, nullptr));
  if (!arr) {
    PyErr_Clear();
    throw Error(fmt::format("{}: expected an array (numpy array or torch tensor), got {}", what,
                            std::string(pyb::str(value.get_type().attr("__name__")))));
  }
  if (arr.dtype().attr("byteorder").cast<std::string>() == ">")  // big-endian data: native order first
    arr = arr.attr("astype")(arr.dtype().attr("newbyteorder")("="));
  const DataType dt = DataTypeOfNumpy(arr.dtype());
  GAF_CHECK(dt != DataType::kUndefined, "{}: numpy dtype {} is not a tensor type the runtime has", what,
            std::string(pyb::str(arr.dtype())));
  Shape shape(arr.shape(), arr.shape() + arr.ndim());
  TensorBytes(dt, shape, what);  // checked against the size limits before anything is copied
  const bool contiguous = (arr.flags() & pyb::array::c_style) != 0;
  // Kernels need element alignment only (no aligned vector loads on tensor data), which numpy's
  // ALIGNED flag says; they never write into inputs, so read-only arrays are fine too.
  const bool aligned = (arr.flags() & pyb::detail::npy_api::NPY_ARRAY_ALIGNED_) != 0;
  if (contiguous && aligned) {
    // The array stays alive as long as the tensor (and any tensor sharing its buffer) does; its
    // reference is dropped with the interpreter lock held.
    auto* keep = new pyb::object(pyb::reinterpret_borrow<pyb::object>(arr));
    std::shared_ptr<void> owner(keep, [](void* p) {
      pyb::gil_scoped_acquire gil;
      delete static_cast<pyb::object*>(p);
    });
    return Tensor::Wrap(dt, std::move(shape), const_cast<void*>(arr.data()), std::move(owner));
  }
  pyb::array c = np.attr("ascontiguousarray")(arr);
  Tensor t = Tensor::Uninitialized(dt, std::move(shape));
  if (t.nbytes() > 0) std::memcpy(t.raw(), c.data(), t.nbytes());
  return t;
}

pyb::object ToNumpy(const Tensor& t) {
  if (t.dtype() == DataType::kString) {
    pyb::list items;
    const std::string* s = t.data<std::string>();
    for (int64_t i = 0; i < t.numel(); ++i) items.append(pyb::str(s[i]));
    pyb::module_ np = pyb::module_::import("numpy");
    return np.attr("array")(items, "object").attr("reshape")(pyb::cast(t.shape()));
  }
  Tensor src = t.dtype() == DataType::kBFloat16 ? t.CastTo(DataType::kFloat) : t;
  // The capsule owns a tensor sharing the buffer: no copy.
  auto* holder = new Tensor(src);
  pyb::capsule owner(holder, [](void* p) { delete static_cast<Tensor*>(p); });
  std::vector<pyb::ssize_t> shape(src.shape().begin(), src.shape().end());
  return pyb::array(NumpyDtype(src.dtype()), shape, {}, holder->raw(), owner);
}

Feeds ToFeeds(const pyb::dict& feeds) {
  Feeds out;
  for (auto [k, v] : feeds) {
    const std::string name = pyb::str(k);
    out[name] = ToTensor(v, "input '" + name + "'");
  }
  return out;
}

std::vector<Feeds> ToSamples(const pyb::list& samples) {
  std::vector<Feeds> out;
  for (size_t i = 0; i < samples.size(); ++i) {
    GAF_CHECK(pyb::isinstance<pyb::dict>(samples[i]), "sample {}: expected a dict of input name -> array", i);
    out.push_back(ToFeeds(samples[i].cast<pyb::dict>()));
  }
  return out;
}

pyb::dict FeedsToDict(const Feeds& feeds) {
  pyb::dict d;
  for (const auto& [k, v] : feeds) d[pyb::str(k)] = ToNumpy(v);
  return d;
}

}  // namespace gaf::py
