// numpy <-> gaf::Tensor for the Python package. Inputs are wrapped without a copy when the array
// is C-contiguous, aligned for its element type and in native byte order; outputs
// become numpy arrays over the tensor's own buffer (no copy).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <map>
#include <string>
#include <vector>

#include "cost/workload.h"
#include "ir/tensor.h"

namespace gaf::py {

namespace pyb = pybind11;

// A numpy array (or anything np.asarray accepts) as a tensor; `what` names it in errors.
Tensor ToTensor(const pyb::handle& value, const std::string& what);
// The tensor as a numpy array sharing its buffer (bfloat16 is widened to float32, strings become
// an object array).
pyb::object ToNumpy(const Tensor& t);
// {name: array} -> Feeds.
Feeds ToFeeds(const pyb::dict& feeds);
// A list of {name: array} dicts -> one Feeds each.
std::vector<Feeds> ToSamples(const pyb::list& samples);
pyb::dict FeedsToDict(const Feeds& feeds);

}  // namespace gaf::py
