// bench on a mixture of experts: decode tokens/s of the same model several ways in one run, the
// runs interleaved and their medians printed — every expert of every token computed (the
// mixture as one dense FFN), the routed experts only, dense, all on the CPU, for a ReLU-family
// mixture the routed experts computing only their firing neurons (engine/sparse/moe_ffn.h), and
// the sidecar's expert placement (its experts on the device under --gpu-memory, the rest on the
// CPU, sparse where the activation allows). How many of each way's greedy tokens equal the
// routed run's is printed beside its speed.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "bench/cpu_device.h"
#include "engine/gpu/gpu_backend.h"
#include "engine/ops/kernels.h"
#include "tools/commands.h"

namespace thermocline::cli {
namespace {

struct Way {
  std::string label;
  std::unique_ptr<EngineSession> session;
  std::vector<double> runs;
  std::vector<int32_t> tokens;
};

// Decode tokens/s of one run: a prompt of prompt_tokens, then gen_tokens greedy tokens.
absl::StatusOr<double> Decode(Session& session, int64_t prompt_tokens, int64_t gen_tokens,
                              std::vector<int32_t>* tokens) {
  const int64_t n_vocab = session.model().hparams().n_vocab;
  std::vector<int32_t> prompt(std::max<int64_t>(prompt_tokens, 1));
  for (size_t i = 0; i < prompt.size(); ++i) {
    prompt[i] = static_cast<int32_t>((i * 7919 + 1) % n_vocab);
  }
  session.Reset();
  if (absl::Status s = session.Eval(prompt); !s.ok()) return s;
  tokens->clear();
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t t = 0; t < gen_tokens; ++t) {
    const float* l = session.logits();
    const int32_t next = static_cast<int32_t>(std::max_element(l, l + n_vocab) - l);
    tokens->push_back(next);
    if (absl::Status s = session.Eval({&next, 1}); !s.ok()) return s;
  }
  return gen_tokens / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int RunBenchMoe(const Args& args, const LlamaModel& model, int64_t prompt_tokens,
                int64_t gen_tokens, int repetitions) {
  auto threads = ThreadsFromArgs(args);
  if (!threads.ok()) return Fail("bench", threads.status(), true);
  ThreadPool pool(*threads);
  const LlamaHparams& h = model.hparams();
  absl::StatusOr<std::optional<SparsePlan>> plan = SparsePlanFromArgs(args, model);
  if (!plan.ok()) return Fail("bench", plan.status());
  if (!plan->has_value()) {  // no sidecar: no placement, every expert on the CPU
    SparsePlan none;
    none.layers.resize(h.n_layer);
    *plan = std::move(none);
  }
  // An expert plan's copy (SparsePlan is move-only: its predictors own their weights, which an
  // expert plan has none of).
  auto copy = [](const SparsePlan& from) {
    SparsePlan to;
    to.source = from.source;
    to.sidecar_path = from.sidecar_path;
    to.placement = from.placement;
    to.profile = from.profile;
    to.layers.resize(from.layers.size());
    for (size_t l = 0; l < from.layers.size(); ++l) {
      to.layers[l].device_experts = from.layers[l].device_experts;
      to.layers[l].route_count = from.layers[l].route_count;
    }
    return to;
  };
  EngineOptions base;
  base.n_ctx = prompt_tokens + gen_tokens + 1;
  base.max_batch = std::clamp<int64_t>(prompt_tokens, 1, 4096);
  static const CpuStandInDevice stand_in_device;
  const bool stand_in = args.Has("--stand-in");

  const bool sparse_experts = GateDecides(h.activation);
  std::vector<Way> ways(sparse_experts ? 4 : 3);
  auto make = [&](Way& w, std::optional<SparsePlan> p, EngineOptions o) -> absl::Status {
    absl::StatusOr<std::shared_ptr<const Engine>> e = Engine::Create(model, std::move(p), o, pool);
    if (!e.ok()) return e.status();
    absl::StatusOr<std::unique_ptr<EngineSession>> s = SessionFor(**e, &pool);
    if (!s.ok()) return s.status();
    w.session = *std::move(s);
    return absl::OkStatus();
  };
  EngineOptions all = base;
  all.moe_all_experts = true;
  ways[0].label = absl::StrCat("dense, all ", h.n_expert, " experts, CPU");
  ways[1].label = absl::StrCat("routed, ", h.n_expert_used, " of ", h.n_expert, " experts, CPU");
  if (absl::Status s = make(ways[0], copy(**plan), all); !s.ok()) return Fail("bench", s);
  if (absl::Status s = make(ways[1], std::nullopt, base); !s.ok()) return Fail("bench", s);
  if (sparse_experts) {
    ways[2].label = "routed, firing neurons only, CPU";
    if (absl::Status s = make(ways[2], copy(**plan), base); !s.ok()) return Fail("bench", s);
  }
  EngineOptions placed = base;
  if (absl::Status s = GpuOptionsFromArgs(args, &placed); !s.ok()) return Fail("bench", s, true);
  if (stand_in) placed.device = &stand_in_device;
  if (absl::Status s = make(ways.back(), *std::move(plan), placed); !s.ok()) {
    return Fail("bench", s);
  }
  const EnginePlacement& p = ways.back().session->placement();
  if (p.gpu_experts == 0) {
    ways.pop_back();  // nothing placed on a device: it would be the routed CPU run again
    std::fprintf(stderr,
                 "thermocline: no placed run: %s (give --sidecar with an expert placement and "
                 "--gpu-memory)\n",
                 p.note.empty() ? "no experts on a device" : p.note.c_str());
  } else {
    ways.back().label = absl::StrCat(
        "placed, ", p.gpu_experts, " of ", p.experts, " experts on ",
        stand_in ? "the CPU stand-in device (a CPU, not a GPU: its speed says nothing of one)"
                 : p.device);
  }
  for (int r = 0; r < std::max(1, repetitions); ++r) {
    for (Way& w : ways) {
      absl::StatusOr<double> tps =
          Decode(w.session->session(), prompt_tokens, gen_tokens, &w.tokens);
      if (!tps.ok()) return Fail("bench", tps.status());
      w.runs.push_back(*tps);
    }
  }
  std::printf(
      "threads %d, %s | %lld layers, %lld experts (%lld used) | decode %lld tokens after "
      "%lld, median of %d:\n",
      pool.size(), IsaName(BestIsa()), static_cast<long long>(h.n_layer),
      static_cast<long long>(h.n_expert), static_cast<long long>(h.n_expert_used),
      static_cast<long long>(gen_tokens), static_cast<long long>(prompt_tokens),
      std::max(1, repetitions));
  for (Way& w : ways) {
    std::sort(w.runs.begin(), w.runs.end());
    // The first position where this way's greedy tokens leave the routed CPU run's: the device
    // sums in another order, and on a random model a near tie may flip.
    size_t same = 0;
    while (same < w.tokens.size() && same < ways[1].tokens.size() &&
           w.tokens[same] == ways[1].tokens[same]) {
      ++same;
    }
    std::printf("  %-44s %8.2f tokens/s  (greedy tokens equal to routed: %zu/%zu)\n",
                w.label.c_str(), w.runs[w.runs.size() / 2], same, ways[1].tokens.size());
  }
  return 0;
}

}  // namespace thermocline::cli
