// Tests for engine/sampling: penalties, greedy, the seeded top-k/top-p/min-p chain (checked
// against directly computed distributions), parameter validation and the logprob helpers.
#include "engine/sampling/sampler.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "allocation_count.h"
#include "test_util.h"

namespace thermocline {
namespace {

std::vector<float> RandomLogits(int n, uint64_t seed, float scale = 3.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> logits(n);
  for (float& l : logits) l = dist(rng);
  return logits;
}

int32_t ReferenceArgmax(const std::vector<float>& logits) {
  // max_element returns the first of equal maxima: ties go to the lowest id.
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// softmax(logits / T) in double, over the ids in `keep` (all when empty); 0 elsewhere.
std::vector<double> ReferenceSoftmax(const std::vector<float>& logits, double temperature,
                                     const std::vector<int32_t>& keep = {}) {
  std::vector<int32_t> ids = keep;
  if (ids.empty()) {
    ids.resize(logits.size());
    std::iota(ids.begin(), ids.end(), 0);
  }
  double max_logit = -std::numeric_limits<double>::infinity();
  for (int32_t id : ids) max_logit = std::max(max_logit, static_cast<double>(logits[id]));
  std::vector<double> p(logits.size(), 0.0);
  double sum = 0.0;
  for (int32_t id : ids) sum += p[id] = std::exp((logits[id] - max_logit) / temperature);
  for (double& x : p) x /= sum;
  return p;
}

// Ids sorted best first (higher logit, then lower id).
std::vector<int32_t> SortedIds(const std::vector<float>& logits) {
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  return ids;
}

std::vector<int64_t> Histogram(Sampler& sampler, std::vector<float> logits, int64_t draws) {
  std::vector<int64_t> counts(logits.size(), 0);
  int64_t out_of_range = 0;
  for (int64_t i = 0; i < draws; ++i) {
    const int32_t id = sampler.Sample(logits.data(), {});
    if (id < 0 || id >= static_cast<int32_t>(logits.size())) {
      ++out_of_range;
    } else {
      ++counts[id];
    }
  }
  REQUIRE(out_of_range == 0);
  return counts;
}

// Goodness of fit of `counts` to `expected` (probabilities summing to 1):
//  - a bucket with probability 0 must never be drawn;
//  - every bucket is within 5 binomial standard deviations of its expectation (a correct sampler
//    fails one bucket with probability < 6e-7);
//  - Pearson's chi-square is below the 1e-6 critical value for its degrees of freedom, from the
//    Wilson-Hilferty approximation chi2 ~= k (1 - 2/(9k) + z sqrt(2/(9k)))^3, z = 4.753 (the
//    normal 1 - 1e-6 quantile); it overestimates for k < 3, so it only errs towards passing.
// The sampler is seeded, so a result is reproducible; the bounds are what make it meaningful.
// Callers keep expected counts >= 20 for every bucket that is not 0 so the approximations hold.
void ExpectDistribution(const std::vector<int64_t>& counts, const std::vector<double>& expected) {
  REQUIRE(counts.size() == expected.size());
  const double draws = static_cast<double>(std::accumulate(counts.begin(), counts.end(), 0LL));
  double chi2 = 0.0;
  int buckets = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (expected[i] == 0.0) {
      INFO("token " << i << " has probability 0");
      CHECK(counts[i] == 0);
      continue;
    }
    const double mean = draws * expected[i];
    REQUIRE(mean >= 20.0);  // the test itself must have enough draws
    const double sigma = std::sqrt(draws * expected[i] * (1.0 - expected[i]));
    INFO("token " << i << ": drawn " << counts[i] << ", expected " << mean << " +- " << sigma);
    CHECK(std::abs(counts[i] - mean) <= 5.0 * sigma);
    chi2 += (counts[i] - mean) * (counts[i] - mean) / mean;
    ++buckets;
  }
  if (buckets < 2) return;
  const double k = buckets - 1;
  const double z = 4.753;
  const double critical = k * std::pow(1.0 - 2.0 / (9.0 * k) + z * std::sqrt(2.0 / (9.0 * k)), 3);
  INFO("chi-square " << chi2 << " with " << k << " degrees of freedom, critical " << critical);
  CHECK(chi2 < critical);
}

SamplingParams Unfiltered(float temperature, uint64_t seed) {
  SamplingParams p = SamplingParams::Greedy();
  p.temperature = temperature;
  p.seed = seed;
  return p;
}

TEST_CASE("Greedy() turns every filter and penalty off", "[sampler]") {
  const SamplingParams p = SamplingParams::Greedy();
  CHECK(p.temperature == 0.0f);
  CHECK(p.top_k == 0);
  CHECK(p.top_p == 1.0f);
  CHECK(p.min_p == 0.0f);
  CHECK(p.repeat_penalty == 1.0f);
  CHECK(p.frequency_penalty == 0.0f);
  CHECK(p.presence_penalty == 0.0f);
  CHECK(p.Validate().ok());
}

TEST_CASE("greedy sampling picks the argmax, ties to the lowest id", "[sampler]") {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    std::vector<float> logits = RandomLogits(1000, seed);
    Sampler sampler(SamplingParams::Greedy(), 1000);
    CHECK(sampler.Sample(logits.data(), {}) == ReferenceArgmax(logits));
  }
  std::vector<float> ties = {1.0f, 5.0f, -2.0f, 5.0f, 5.0f};
  Sampler greedy(SamplingParams::Greedy(), 5);
  CHECK(greedy.Sample(ties.data(), {}) == 1);

  // temperature 0 is greedy whatever the other filters say.
  SamplingParams p;
  p.temperature = 0.0f;
  Sampler zero_t(p, 5);
  CHECK(zero_t.Sample(ties.data(), {}) == 1);

  // NaN never wins; all -inf falls back to id 0.
  std::vector<float> with_nan = {1.0f, std::nanf(""), 2.0f};
  Sampler g3(SamplingParams::Greedy(), 3);
  CHECK(g3.Sample(with_nan.data(), {}) == 2);
  const float ninf = -std::numeric_limits<float>::infinity();
  std::vector<float> all_ninf = {ninf, ninf, ninf};
  CHECK(g3.Sample(all_ninf.data(), {}) == 0);
}

TEST_CASE("the same seed repeats a sequence, another seed does not", "[sampler]") {
  const std::vector<float> flat(16, 0.0f);  // uniform: two runs agree by chance with p = 16^-200
  auto draw = [&](uint64_t seed) {
    SamplingParams p;  // the default chain, on a flat distribution nothing is filtered
    p.seed = seed;
    Sampler sampler(p, 16);
    std::vector<float> logits = flat;
    std::vector<int32_t> out;
    for (int i = 0; i < 200; ++i) out.push_back(sampler.Sample(logits.data(), {}));
    return out;
  };
  CHECK(draw(42) == draw(42));
  CHECK(draw(42) != draw(43));
  CHECK(draw(SamplingParams::kRandomSeed) != draw(SamplingParams::kRandomSeed));

  // Same for a realistic chain on a large vocabulary.
  const std::vector<float> logits = RandomLogits(32000, 7);
  auto draw_large = [&](uint64_t seed) {
    SamplingParams p;
    p.temperature = 1.5f;
    p.seed = seed;
    Sampler sampler(p, 32000);
    std::vector<float> l = logits;
    std::vector<int32_t> out;
    for (int i = 0; i < 100; ++i) out.push_back(sampler.Sample(l.data(), {}));
    return out;
  };
  CHECK(draw_large(1234) == draw_large(1234));
}

TEST_CASE("top_k = 1 is greedy at any temperature", "[sampler]") {
  for (float temperature : {0.01f, 0.5f, 1.0f, 5.0f, 100.0f}) {
    for (uint64_t seed = 1; seed <= 10; ++seed) {
      std::vector<float> logits = RandomLogits(5000, seed);
      logits[4000] = logits[100] = *std::max_element(logits.begin(), logits.end()) + 1.0f;  // tie
      SamplingParams p = Unfiltered(temperature, seed);
      p.top_k = 1;
      Sampler sampler(p, 5000);
      for (int i = 0; i < 20; ++i) {
        INFO("temperature " << temperature);
        CHECK(sampler.Sample(logits.data(), {}) == 100);
      }
    }
  }
}

TEST_CASE("a tiny top_p keeps only the argmax", "[sampler]") {
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    std::vector<float> logits = RandomLogits(50000, seed, 1.0f);  // flat-ish: max prob ~1e-4
    SamplingParams p = Unfiltered(2.0f, seed);
    p.top_p = 1e-6f;
    Sampler sampler(p, 50000);
    for (int i = 0; i < 10; ++i)
      CHECK(sampler.Sample(logits.data(), {}) == ReferenceArgmax(logits));
  }
}

TEST_CASE("temperature sampling matches softmax(logits / T)", "[sampler]") {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 0.0f, 2.5f, -0.5f};
  for (float temperature : {0.7f, 1.0f, 2.0f}) {
    INFO("temperature " << temperature);
    Sampler sampler(Unfiltered(temperature, 99), static_cast<int32_t>(logits.size()));
    ExpectDistribution(Histogram(sampler, logits, 200000), ReferenceSoftmax(logits, temperature));
  }
}

TEST_CASE("top-k sampling matches the softmax of the k best", "[sampler]") {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 0.0f, 2.5f, -0.5f};
  SamplingParams p = Unfiltered(1.3f, 5);
  p.top_k = 3;
  Sampler sampler(p, static_cast<int32_t>(logits.size()));
  ExpectDistribution(Histogram(sampler, logits, 100000), ReferenceSoftmax(logits, 1.3, {4, 6, 1}));

  // k >= vocab is no filter.
  p.top_k = 100;
  Sampler all(p, static_cast<int32_t>(logits.size()));
  ExpectDistribution(Histogram(all, logits, 100000), ReferenceSoftmax(logits, 1.3));
}

TEST_CASE("top-p keeps the smallest prefix reaching top_p, after temperature", "[sampler]") {
  // probs at T = 1: 0.4 0.3 0.2 0.1; at T = 2 they flatten to ~0.324 0.281 0.229 0.162.
  const std::vector<float> logits = {std::log(0.3f), std::log(0.1f), std::log(0.4f),
                                     std::log(0.2f)};
  SamplingParams p = Unfiltered(1.0f, 11);
  p.top_p = 0.65f;  // 0.4 < 0.65 <= 0.7: tokens 2 and 0
  Sampler t1(p, 4);
  ExpectDistribution(Histogram(t1, logits, 100000), ReferenceSoftmax(logits, 1.0, {2, 0}));

  p.temperature = 2.0f;  // 0.324 + 0.281 = 0.605 < 0.65: three tokens
  Sampler t2(p, 4);
  ExpectDistribution(Histogram(t2, logits, 100000), ReferenceSoftmax(logits, 2.0, {2, 0, 3}));
}

TEST_CASE("top-p over a large vocabulary matches a full-sort reference", "[sampler]") {
  // Without top-k the sampler finds the nucleus with a histogram of the weights and sorts only
  // the bucket where the mass crosses top_p; the reference sorts everything. A quarter of the
  // vocabulary sits far below the rest (the histogram's overflow bucket), a few at -inf.
  const int vocab = 8000;
  std::vector<float> logits = RandomLogits(vocab, 2024, 2.0f);
  for (int i = 0; i < vocab; i += 4) logits[i] -= 1000.0f;
  for (int i = 1; i < vocab; i += 997) logits[i] = -std::numeric_limits<float>::infinity();
  const struct {
    float top_p;
    float temperature;
  } cases[] = {{0.3f, 1.0f}, {0.6f, 0.7f}, {0.8f, 1.5f}};
  for (const auto& [top_p, temperature] : cases) {
    const std::vector<double> probs = ReferenceSoftmax(logits, temperature);
    const std::vector<int32_t> order = SortedIds(logits);
    std::vector<int32_t> nucleus;
    double cumulative = 0.0;
    for (int32_t id : order) {
      nucleus.push_back(id);
      cumulative += probs[id];
      if (cumulative >= top_p) break;
    }
    // The cut must not sit on a rounding boundary, or float vs double could disagree by one.
    REQUIRE(cumulative - top_p > 1e-5);
    REQUIRE(cumulative - probs[nucleus.back()] < top_p - 1e-5);
    INFO("top_p " << top_p << ", T " << temperature << ", nucleus of " << nucleus.size());
    CHECK(nucleus.size() > 40);  // wide enough to span many of the sampler's buckets

    SamplingParams p = Unfiltered(temperature, 3);
    p.top_p = top_p;
    Sampler sampler(p, vocab);
    std::vector<float> l = logits;
    std::vector<char> in_nucleus(vocab, 0);
    for (int32_t id : nucleus) in_nucleus[id] = 1;
    std::vector<int64_t> counts(vocab, 0);
    const int64_t draws = 6000;
    for (int64_t i = 0; i < draws; ++i) ++counts[sampler.Sample(l.data(), {})];
    int64_t outside = 0;
    for (int i = 0; i < vocab; ++i) {
      if (!in_nucleus[i]) outside += counts[i];
    }
    CHECK(outside == 0);
    // The renormalized nucleus, restricted to buckets with enough expected draws for the
    // statistics; the rest are pooled into one bucket.
    std::vector<double> expected;
    std::vector<int64_t> observed;
    double pooled_p = 0.0, nucleus_mass = 0.0;
    int64_t pooled_n = 0;
    for (int32_t id : nucleus) nucleus_mass += probs[id];
    for (int32_t id : nucleus) {
      const double q = probs[id] / nucleus_mass;
      if (q * draws >= 20.0) {
        expected.push_back(q);
        observed.push_back(counts[id]);
      } else {
        pooled_p += q;
        pooled_n += counts[id];
      }
    }
    expected.push_back(pooled_p);
    observed.push_back(pooled_n);
    ExpectDistribution(observed, expected);
  }
}

TEST_CASE("min-p drops tokens below min_p times the top probability", "[sampler]") {
  // probs at T = 1: 0.5 0.3 0.15 0.05; min_p 0.2 keeps prob >= 0.1.
  const std::vector<float> logits = {std::log(0.15f), std::log(0.5f), std::log(0.05f),
                                     std::log(0.3f)};
  SamplingParams p = Unfiltered(1.0f, 21);
  p.min_p = 0.2f;
  Sampler sampler(p, 4);
  ExpectDistribution(Histogram(sampler, logits, 100000), ReferenceSoftmax(logits, 1.0, {1, 3, 0}));

  // At T = 0.5 the probs sharpen to 0.66 0.24 0.06 0.007 of which >= 0.132 survive.
  p.temperature = 0.5f;
  Sampler sharp(p, 4);
  ExpectDistribution(Histogram(sharp, logits, 100000), ReferenceSoftmax(logits, 0.5, {1, 3}));

  // min_p = 1 keeps only the top token.
  p.min_p = 1.0f;
  p.temperature = 3.0f;
  Sampler top_only(p, 4);
  std::vector<float> l = logits;
  for (int i = 0; i < 100; ++i) CHECK(top_only.Sample(l.data(), {}) == 1);
}

TEST_CASE("the full default chain composes top-k, top-p and min-p", "[sampler]") {
  // 0.35 0.25 0.2 0.1 0.06 0.04 at T = 1. top_k 5 renormalizes to /0.96; top_p 0.75 then keeps
  // 0.364 0.260 0.208 (0.833); min_p 0.6 of 0.364 = 0.219 drops the third.
  const std::vector<float> probs = {0.1f, 0.35f, 0.04f, 0.25f, 0.06f, 0.2f};
  std::vector<float> logits;
  for (float q : probs) logits.push_back(std::log(q));
  SamplingParams p = Unfiltered(1.0f, 77);
  p.top_k = 5;
  p.top_p = 0.75f;
  Sampler without_min_p(p, 6);
  ExpectDistribution(Histogram(without_min_p, logits, 100000),
                     ReferenceSoftmax(logits, 1.0, {1, 3, 5}));
  p.min_p = 0.6f;
  Sampler sampler(p, 6);
  ExpectDistribution(Histogram(sampler, logits, 100000), ReferenceSoftmax(logits, 1.0, {1, 3}));
}

TEST_CASE("temperature sampling skips -inf and NaN logits", "[sampler]") {
  const float ninf = -std::numeric_limits<float>::infinity();
  std::vector<float> logits = {ninf, std::nanf(""), 0.0f, ninf, 0.0f};
  Sampler sampler(Unfiltered(1.0f, 8), 5);
  ExpectDistribution(Histogram(sampler, logits, 10000), {0.0, 0.0, 0.5, 0.0, 0.5});
}

// Applies only the penalties (temperature 0) and returns the modified logits.
std::vector<float> Penalized(const SamplingParams& penalties, std::vector<float> logits,
                             const std::vector<int32_t>& history) {
  SamplingParams p = penalties;
  p.temperature = 0.0f;
  Sampler sampler(p, static_cast<int32_t>(logits.size()));
  sampler.Sample(logits.data(), history);
  return logits;
}

TEST_CASE("repeat_penalty divides positive logits and multiplies the rest, once", "[sampler]") {
  SamplingParams p = SamplingParams::Greedy();
  p.repeat_penalty = 2.0f;
  const std::vector<float> logits = {3.0f, -1.0f, 0.0f, 5.0f, 7.0f};
  // Token 0 three times: still divided once (the penalty is not per occurrence).
  const std::vector<float> out = Penalized(p, logits, {0, 1, 0, 2, 0});
  CHECK(out == std::vector<float>{1.5f, -2.0f, 0.0f, 5.0f, 7.0f});

  p.repeat_penalty = 0.5f;  // < 1 encourages repetition
  CHECK(Penalized(p, logits, {0, 1}) == std::vector<float>{6.0f, -0.5f, 0.0f, 5.0f, 7.0f});
}

TEST_CASE("frequency_penalty subtracts penalty * count, presence_penalty once", "[sampler]") {
  const std::vector<float> logits = {3.0f, -1.0f, 0.0f, 5.0f};
  const std::vector<int32_t> history = {0, 0, 0, 1, 3, 0};  // counts: 4, 1, 0, 1

  SamplingParams freq = SamplingParams::Greedy();
  freq.frequency_penalty = 0.5f;
  CHECK(Penalized(freq, logits, history) == std::vector<float>{1.0f, -1.5f, 0.0f, 4.5f});

  SamplingParams presence = SamplingParams::Greedy();
  presence.presence_penalty = 0.75f;
  CHECK(Penalized(presence, logits, history) == std::vector<float>{2.25f, -1.75f, 0.0f, 4.25f});

  SamplingParams negative = SamplingParams::Greedy();
  negative.frequency_penalty = -1.0f;
  CHECK(Penalized(negative, logits, history) == std::vector<float>{7.0f, 0.0f, 0.0f, 6.0f});

  // All three: repeat first, then the OpenAI terms. 3 / 2 - 4 * 0.25 - 0.5 = 0.
  SamplingParams all = SamplingParams::Greedy();
  all.repeat_penalty = 2.0f;
  all.frequency_penalty = 0.25f;
  all.presence_penalty = 0.5f;
  CHECK(Penalized(all, logits, history) == std::vector<float>{0.0f, -2.75f, 0.0f, 1.75f});
}

TEST_CASE("penalties see only the last penalty_last_n tokens", "[sampler]") {
  const std::vector<float> logits = {4.0f, 4.0f, 4.0f, 4.0f};
  const std::vector<int32_t> history = {0, 0, 1, 2, 2};
  SamplingParams p = SamplingParams::Greedy();
  p.frequency_penalty = 1.0f;

  p.penalty_last_n = 3;  // sees 1 2 2
  CHECK(Penalized(p, logits, history) == std::vector<float>{4.0f, 3.0f, 2.0f, 4.0f});
  p.penalty_last_n = -1;  // everything
  CHECK(Penalized(p, logits, history) == std::vector<float>{2.0f, 3.0f, 2.0f, 4.0f});
  p.penalty_last_n = 100;  // longer than the history
  CHECK(Penalized(p, logits, history) == std::vector<float>{2.0f, 3.0f, 2.0f, 4.0f});
  p.penalty_last_n = 0;  // off
  CHECK(Penalized(p, logits, history) == logits);

  // Ids outside the vocabulary are ignored, not written.
  p.penalty_last_n = -1;
  CHECK(Penalized(p, logits, {-1, 4, 1000, 3}) == std::vector<float>{4.0f, 4.0f, 4.0f, 3.0f});
}

TEST_CASE("penalties steer the choice and do not leak between calls", "[sampler]") {
  SamplingParams p = SamplingParams::Greedy();
  p.presence_penalty = 2.0f;
  Sampler sampler(p, 3);
  const std::vector<float> logits = {5.0f, 4.0f, 0.0f};
  std::vector<float> l = logits;
  CHECK(sampler.Sample(l.data(), {}) == 0);
  l = logits;
  CHECK(sampler.Sample(l.data(), {0}) == 1);  // 5 - 2 < 4
  CHECK(l == std::vector<float>{3.0f, 4.0f, 0.0f});
  l = logits;
  CHECK(sampler.Sample(l.data(), {0, 1}) == 0);  // both penalized: 3 > 2
  CHECK(l == std::vector<float>{3.0f, 2.0f, 0.0f});
  l = logits;
  CHECK(sampler.Sample(l.data(), {}) == 0);  // no counts left over from earlier calls
  CHECK(l == logits);
}

TEST_CASE("Validate names the field and its range", "[sampler]") {
  CHECK(SamplingParams().Validate().ok());
  CHECK(SamplingParams::Greedy().Validate().ok());

  SamplingParams edges;  // every boundary value is allowed
  edges.temperature = 100.0f;
  edges.top_p = 1.0f;
  edges.min_p = 1.0f;
  edges.top_k = 0;
  edges.frequency_penalty = -2.0f;
  edges.presence_penalty = 2.0f;
  edges.penalty_last_n = -1;
  CHECK(edges.Validate().ok());
  edges.temperature = 0.0f;
  edges.min_p = 0.0f;
  edges.frequency_penalty = 2.0f;
  edges.presence_penalty = -2.0f;
  edges.repeat_penalty = 1e-3f;
  CHECK(edges.Validate().ok());

  struct Case {
    const char* field;
    const char* range;
    void (*set)(SamplingParams&);
  };
  const Case cases[] = {
      {"temperature", "[0, 100]", [](SamplingParams& p) { p.temperature = -0.1f; }},
      {"temperature", "[0, 100]", [](SamplingParams& p) { p.temperature = 100.5f; }},
      {"temperature", "[0, 100]", [](SamplingParams& p) { p.temperature = std::nanf(""); }},
      {"top_k", "[0, inf)", [](SamplingParams& p) { p.top_k = -1; }},
      {"top_p", "(0, 1]", [](SamplingParams& p) { p.top_p = 0.0f; }},
      {"top_p", "(0, 1]", [](SamplingParams& p) { p.top_p = 1.01f; }},
      {"top_p", "(0, 1]", [](SamplingParams& p) { p.top_p = std::nanf(""); }},
      {"min_p", "[0, 1]", [](SamplingParams& p) { p.min_p = -0.01f; }},
      {"min_p", "[0, 1]", [](SamplingParams& p) { p.min_p = 1.5f; }},
      {"repeat_penalty", "(0, inf)", [](SamplingParams& p) { p.repeat_penalty = 0.0f; }},
      {"repeat_penalty", "(0, inf)", [](SamplingParams& p) { p.repeat_penalty = -1.0f; }},
      {"repeat_penalty", "(0, inf)",
       [](SamplingParams& p) { p.repeat_penalty = std::numeric_limits<float>::infinity(); }},
      {"frequency_penalty", "[-2, 2]", [](SamplingParams& p) { p.frequency_penalty = 2.5f; }},
      {"frequency_penalty", "[-2, 2]", [](SamplingParams& p) { p.frequency_penalty = -2.5f; }},
      {"presence_penalty", "[-2, 2]", [](SamplingParams& p) { p.presence_penalty = 3.0f; }},
      {"presence_penalty", "[-2, 2]", [](SamplingParams& p) { p.presence_penalty = -3.0f; }},
      {"penalty_last_n", "[-1, inf)", [](SamplingParams& p) { p.penalty_last_n = -2; }},
  };
  for (const Case& c : cases) {
    SamplingParams p;
    c.set(p);
    const absl::Status status = p.Validate();
    INFO(c.field << ": " << status.ToString());
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(status.message()).find(c.field) != std::string::npos);
    CHECK(std::string(status.message()).find(c.range) != std::string::npos);
  }
}

// log-softmax in long double, summed naively after max subtraction: the reference.
std::vector<long double> ReferenceLogSoftmax(const std::vector<float>& logits) {
  long double max_logit = *std::max_element(logits.begin(), logits.end());
  long double sum = 0.0L;
  for (float l : logits) sum += std::exp(static_cast<long double>(l) - max_logit);
  std::vector<long double> out;
  for (float l : logits) out.push_back(l - max_logit - std::log(sum));
  return out;
}

TEST_CASE("Logprob is a stable log-softmax", "[sampler]") {
  // Tolerance: the result is a float, so one float rounding of its magnitude (plus 1e-6 absolute
  // for results near 0) covers it; the double accumulation adds ~1e-15 relative.
  auto close = [](float got, long double want) {
    return std::abs(got - want) <=
           1e-6L + 2.0L * std::numeric_limits<float>::epsilon() * std::abs(want);
  };
  for (float scale : {1.0f, 10.0f}) {
    for (float offset : {0.0f, 1000.0f, -1000.0f}) {  // exp(1000) overflows without max subtraction
      std::vector<float> logits = RandomLogits(32000, 5, scale);
      for (float& l : logits) l += offset;
      const std::vector<long double> want = ReferenceLogSoftmax(logits);
      for (int32_t id : {0, 1, 17, 31999, ReferenceArgmax(logits)}) {
        const float got = Sampler::Logprob(logits, id);
        INFO("scale " << scale << " offset " << offset << " id " << id << ": " << got << " vs "
                      << static_cast<double>(want[id]));
        CHECK(std::isfinite(got));
        CHECK(close(got, want[id]));
      }
    }
  }
  const std::vector<float> two = {0.0f, 0.0f};
  CHECK(Sampler::Logprob(two, 0) == Approx(std::log(0.5)).epsilon(1e-7));
  const std::vector<float> one_hot = {-std::numeric_limits<float>::infinity(), 3.0f};
  CHECK(Sampler::Logprob(one_hot, 1) == 0.0f);
  CHECK(Sampler::Logprob(one_hot, 0) == -std::numeric_limits<float>::infinity());
  const std::vector<float> with_nan = {0.0f, std::nanf(""), 0.0f};  // NaN counts as -inf
  CHECK(Sampler::Logprob(with_nan, 0) == Approx(std::log(0.5)).epsilon(1e-7));
  CHECK(Sampler::Logprob(with_nan, 1) == -std::numeric_limits<float>::infinity());
  CHECK(Sampler::Logprob(two, 2) == -std::numeric_limits<float>::infinity());   // out of range
  CHECK(Sampler::Logprob(two, -1) == -std::numeric_limits<float>::infinity());  // out of range
}

TEST_CASE("TopLogprobs returns the n best by logit, sorted, with their logprobs", "[sampler]") {
  std::vector<float> logits = RandomLogits(50000, 9);
  logits[123] = logits[45678] = 20.0f;  // a tie at the top: the lower id first
  const std::vector<int32_t> order = SortedIds(logits);
  std::vector<Sampler::TokenLogprob> top;
  for (int n : {1, 5, 20}) {
    Sampler::TopLogprobs(logits, n, &top);
    REQUIRE(top.size() == static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      CHECK(top[i].id == order[i]);
      CHECK(top[i].logprob == Approx(Sampler::Logprob(logits, order[i])).epsilon(1e-6));
      if (i > 0) CHECK(top[i].logprob <= top[i - 1].logprob);
    }
  }
  CHECK(top[0].id == 123);
  CHECK(top[1].id == 45678);

  // n larger than the vocabulary returns all of it; the probabilities then sum to 1.
  const std::vector<float> small = {0.5f, -1.0f, 2.0f};
  Sampler::TopLogprobs(small, 10, &top);
  REQUIRE(top.size() == 3);
  CHECK(top[0].id == 2);
  CHECK(top[1].id == 0);
  CHECK(top[2].id == 1);
  double sum = 0.0;
  for (const auto& t : top) sum += std::exp(static_cast<double>(t.logprob));
  CHECK(sum == Approx(1.0).epsilon(1e-6));

  Sampler::TopLogprobs(small, 0, &top);
  CHECK(top.empty());
}

TEST_CASE("Sample does not allocate", "[sampler]") {
#if THERMOCLINE_COUNT_ALLOCATIONS
  const int vocab = 128000;
  std::vector<float> logits = RandomLogits(vocab, 31);
  std::vector<int32_t> history(2000);
  for (size_t i = 0; i < history.size(); ++i) history[i] = static_cast<int32_t>(i * 37 % vocab);
  SamplingParams configs[4] = {SamplingParams(), SamplingParams::Greedy(), SamplingParams(),
                               SamplingParams()};
  configs[0].repeat_penalty = 1.1f;
  configs[0].frequency_penalty = 0.2f;
  configs[2].top_k = 0;  // the lazy sort for top-p
  configs[3].top_k = 0;
  configs[3].top_p = 1.0f;
  for (const SamplingParams& p : configs) {
    Sampler sampler(p, vocab);
    const int64_t before = testing::AllocationCount();
    for (int i = 0; i < 20; ++i) sampler.Sample(logits.data(), history);
    CHECK(testing::AllocationCount() == before);
  }
#else
  THERMOCLINE_SKIP("allocation counting is off under sanitizers");
#endif
}

}  // namespace
}  // namespace thermocline
