// Stop strings over a stream of text: text that could still be the start of a stop string is
// held back until it is known not to be, so a stop string is never emitted, also when it spans
// tokens or would arrive split across stream chunks.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace thermocline::server {

class StopMatcher {
 public:
  StopMatcher() = default;
  // `stops` must outlive the matcher; empty strings are ignored.
  void Reset(const std::vector<std::string>* stops);

  // Adds generated text and returns what may be emitted now (a view valid until the next
  // call). Sets *stopped when a stop string completed: the returned text ends right before it
  // and nothing after it is ever returned.
  std::string_view Push(std::string_view text, bool* stopped);
  // At the end of generation (no stop): the held-back rest.
  std::string_view Flush();
  // Bytes returned so far by Push and Flush.
  size_t emitted() const { return emitted_; }

 private:
  const std::vector<std::string>* stops_ = nullptr;
  bool active_ = false;  // any non-empty stop string
  std::string held_;     // generated, not yet emitted
  std::string out_;      // what the last call returned
  size_t emitted_ = 0;
};

}  // namespace thermocline::server
