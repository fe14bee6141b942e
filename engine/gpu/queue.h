// The order in which one session's device work runs (a CUDA stream): the session's GPU layers and
// the FFN executor of its hybrid layers share one (engine/runtime/engine.h makes it), so their
// work is ordered on the device without host synchronisation. Opaque outside the backend that
// made it (engine/gpu/device.h Device::CreateQueue).
#pragma once

namespace thermocline::gpu {

class Queue {
 public:
  virtual ~Queue() = default;
};

}  // namespace thermocline::gpu
