// The kit of llama.cpp-quantized files (../shared/models/kquants/): llama.cpp's perplexity of
// each stories-wide.TYPE.gguf, from its README (llama-perplexity -c 128 -b 128 on
// stories260K.ppl-sample.txt).
#pragma once

#include <map>
#include <string>

namespace thermocline::testing {

inline const std::map<std::string, double>& LlamaCppStoriesWidePerplexity() {
  static const std::map<std::string, double> kPpl = {
      {"f32", 2.2991},    {"iq4_nl", 2.5109}, {"iq4_xs", 2.5385}, {"q2_k", 14.8678},
      {"q3_k_l", 2.8245}, {"q3_k_m", 2.8318}, {"q3_k_s", 3.2775}, {"q4_0", 2.5646},
      {"q4_1", 2.5096},   {"q4_k_m", 2.3700}, {"q4_k_s", 2.4005}, {"q5_0", 2.3347},
      {"q5_1", 2.3553},   {"q5_k_m", 2.3148}, {"q5_k_s", 2.3354}, {"q6_k", 2.3118},
      {"q8_0", 2.3030},
  };
  return kPpl;
}

}  // namespace thermocline::testing
