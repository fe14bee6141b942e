// Corpus and self-generated profiling runs.
#include "offline/profile/profile_run.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "engine/model/model_support.h"
#include "engine/model/session.h"
#include "engine/runtime/engine.h"
#include "engine/runtime/generate.h"
#include "offline/util/hash.h"

namespace thermocline::offline {
namespace {

// Only a regular file, opened non-blocking: a FIFO put in the corpus's place would block the
// job for ever.
absl::StatusOr<std::string> ReadFile(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("cannot open corpus '", path, "'"));
  }
  const absl::Status not_regular = absl::InvalidArgumentError(
      absl::StrCat("the corpus '", path, "' is not a regular file; give a text file"));
  if (!S_ISREG(st.st_mode)) return not_regular;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open corpus '", path, "'"));
  std::string text;
  absl::Status status;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) status = not_regular;
  char buf[1 << 16];
  while (status.ok()) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) status = absl::DataLossError(absl::StrCat("cannot read corpus '", path, "'"));
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  if (!status.ok()) return status;
  return text;
}

// Next story (text up to a blank line) from `text` at `pos`; empty at the end.
std::string_view NextStory(std::string_view text, size_t& pos) {
  while (pos < text.size() && (text[pos] == '\n' || text[pos] == '\r')) ++pos;
  const size_t start = pos;
  size_t end = text.find("\n\n", pos);
  if (end == std::string_view::npos) end = text.size();
  pos = end;
  std::string_view story = text.substr(start, end - start);
  while (!story.empty() && (story.back() == '\n' || story.back() == '\r' || story.back() == ' ')) {
    story.remove_suffix(1);
  }
  return story;
}

// Forwards each observer call to the profiler and then to a second observer.
class TeeObserver final : public FfnObserver {
 public:
  TeeObserver(FfnObserver* first, FfnObserver* second) : first_(first), second_(second) {}
  void OnFfn(int layer, const float* x, int64_t n_embd, const float* act, int64_t n_ff,
             int64_t n_tokens) override {
    first_->OnFfn(layer, x, n_embd, act, n_ff, n_tokens);
    if (second_ != nullptr) second_->OnFfn(layer, x, n_embd, act, n_ff, n_tokens);
  }
  void OnRouting(int layer, const int32_t* selected, int64_t k, int64_t n_tokens) override {
    first_->OnRouting(layer, selected, k, n_tokens);
    if (second_ != nullptr) second_->OnRouting(layer, selected, k, n_tokens);
  }
  void OnGate(int layer, const float* gate, const float* up, int64_t n_ff,
              int64_t n_tokens) override {
    first_->OnGate(layer, gate, up, n_ff, n_tokens);
    if (second_ != nullptr) second_->OnGate(layer, gate, up, n_ff, n_tokens);
  }
  void OnAttentionInput(int layer, const float* xn, int64_t n_embd, int64_t n_tokens) override {
    first_->OnAttentionInput(layer, xn, n_embd, n_tokens);
    if (second_ != nullptr) second_->OnAttentionInput(layer, xn, n_embd, n_tokens);
  }
  void OnFfnInput(int layer, const float* xn, int64_t n_embd, int64_t n_tokens) override {
    first_->OnFfnInput(layer, xn, n_embd, n_tokens);
    if (second_ != nullptr) second_->OnFfnInput(layer, xn, n_embd, n_tokens);
  }

 private:
  FfnObserver* first_;
  FfnObserver* second_;
};

bool Report(ProgressReporter* progress, const ActivationProfiler& p, int64_t target) {
  if (progress == nullptr) return true;
  return progress->Update(static_cast<double>(p.tokens()) / std::max<int64_t>(1, target),
                          absl::StrCat(p.tokens(), "/", target, " tokens"));
}

}  // namespace

absl::StatusOr<ProfileSource> RunProfile(const LlamaModel& model, ThreadPool& pool,
                                         ActivationProfiler& profiler,
                                         const ProfileRunOptions& options,
                                         ProgressReporter* progress) {
  if (options.tokens <= 0) return absl::InvalidArgumentError("--tokens must be positive");
  // A mixture of experts is profiled for its routing (ActivationProfiler::OnRouting).
  if (!model.hparams().is_moe()) {
    if (absl::Status s = RequireGatedFfn(model, "the activation profiler"); !s.ok()) return s;
  }
  int64_t chunk = std::min<int64_t>(options.chunk, model.hparams().n_ctx_train);
  if (chunk < 2) return absl::InvalidArgumentError("profiling chunk must be at least 2 tokens");
  // Dense, all on the CPU: the profile is the reference the predictors learn.
  EngineOptions eo;
  eo.n_ctx = chunk;
  eo.max_batch = std::min<int64_t>(chunk, 4096);
  auto engine = Engine::Create(model, std::nullopt, eo, pool);
  if (!engine.ok()) return engine.status();
  auto engine_session = (*engine)->NewSession(&pool);
  if (!engine_session.ok()) return engine_session.status();
  TeeObserver tee(&profiler, options.also_observe);
  (*engine_session)->set_ffn_observer(&tee);
  Session* session = &(*engine_session)->session();
  const Tokenizer& tok = model.tokenizer();
  ProfileSource source;

  if (!options.corpus_path.empty()) {
    auto text = ReadFile(options.corpus_path);
    if (!text.ok()) return text.status();
    Fnv1a64 h;
    h.Update(*text);
    source.kind = "corpus";
    source.corpus_hash = h.Hex();
    size_t pos = 0;
    std::vector<int32_t> stream;
    bool exhausted = false;
    while (profiler.tokens() < options.tokens && !exhausted) {
      while (static_cast<int64_t>(stream.size()) < chunk && !exhausted) {
        std::string_view story = NextStory(*text, pos);
        if (story.empty()) {
          exhausted = true;
          break;
        }
        std::vector<int32_t> ids = tok.Encode(story, tok.add_bos());
        stream.insert(stream.end(), ids.begin(), ids.end());
      }
      const int64_t need =
          options.tokens - profiler.tokens() +
          std::max<int64_t>(0, profiler.options().calibration_tokens - profiler.observed_tokens());
      const int64_t n = std::min<int64_t>({chunk, static_cast<int64_t>(stream.size()), need});
      if (n <= 0) break;
      session->Reset();
      if (absl::Status s = session->Eval({stream.data(), static_cast<size_t>(n)}); !s.ok()) {
        return s;
      }
      stream.erase(stream.begin(), stream.begin() + n);
      if (!Report(progress, profiler, options.tokens)) {
        return absl::CancelledError("profiling cancelled");
      }
    }
    source.corpus_bytes_read = pos;
  } else {
    Fnv1a64 h;
    const std::string settings =
        absl::StrCat("self-generate seed=", options.seed, " temperature=", options.temperature);
    h.Update(settings);
    source.kind = "self-generate";
    source.corpus_hash = h.Hex();
    const int32_t bos = tok.bos_id() >= 0 ? tok.bos_id() : 0;
    bool cancelled = false;
    for (uint64_t round = 0; profiler.tokens() < options.tokens && !cancelled; ++round) {
      GenerateOptions go;
      go.max_tokens = static_cast<int32_t>(chunk - 1);
      go.sampling.temperature = options.temperature;
      go.sampling.top_k = 0;
      go.sampling.top_p = 1.0f;
      go.sampling.min_p = 0.0f;
      go.sampling.seed = options.seed + round;
      go.stop_at_end_of_generation = true;
      session->Reset();
      const int64_t before = profiler.observed_tokens();
      auto r = Generate(*session, {&bos, 1}, go, [&](const GeneratedToken&) {
        if (!Report(progress, profiler, options.tokens)) cancelled = true;
        return !cancelled && profiler.tokens() < options.tokens ? TokenAction::kContinue
                                                                : TokenAction::kStop;
      });
      if (!r.ok()) return r.status();
      if (profiler.observed_tokens() == before) {
        return absl::InternalError("self-generation produced no tokens");
      }
    }
    if (cancelled) return absl::CancelledError("profiling cancelled");
  }
  source.tokens = profiler.tokens();
  if (source.tokens == 0) {
    return absl::InvalidArgumentError(
        "profiling saw no tokens: the corpus is empty or shorter than the calibration window");
  }
  return source;
}

}  // namespace thermocline::offline
