// Internal to engine/gguf: the C++ type behind each numeric GGUF value type, written once for
// the reader and the writer.
#pragma once

#include <cstdint>

#include "engine/gguf/gguf.h"

namespace thermocline::gguf_internal {

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with the C++ type T a numeric GGUF value is encoded as (uint8 ..
// int64, float32, float64) and returns true; returns false without calling f for bool, string,
// array and unknown types, which every caller treats specially.
template <typename F>
bool VisitNumericType(GgufValueType type, F&& f) {
  switch (type) {
    case GgufValueType::kUint8:
      f(TypeTag<uint8_t>{});
      return true;
    case GgufValueType::kInt8:
      f(TypeTag<int8_t>{});
      return true;
    case GgufValueType::kUint16:
      f(TypeTag<uint16_t>{});
      return true;
    case GgufValueType::kInt16:
      f(TypeTag<int16_t>{});
      return true;
    case GgufValueType::kUint32:
      f(TypeTag<uint32_t>{});
      return true;
    case GgufValueType::kInt32:
      f(TypeTag<int32_t>{});
      return true;
    case GgufValueType::kUint64:
      f(TypeTag<uint64_t>{});
      return true;
    case GgufValueType::kInt64:
      f(TypeTag<int64_t>{});
      return true;
    case GgufValueType::kFloat32:
      f(TypeTag<float>{});
      return true;
    case GgufValueType::kFloat64:
      f(TypeTag<double>{});
      return true;
    default:
      return false;
  }
}

}  // namespace thermocline::gguf_internal
