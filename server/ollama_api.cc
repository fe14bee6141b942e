// Ollama responses (server/ollama_api.h): timestamps, the generation objects and the NDJSON
// stream sink, and the model descriptions of /api/tags, /api/show and /api/ps.
#include "server/ollama_api.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/gguf/gguf.h"
#include "engine/model/quant_mix.h"
#include "server/errors.h"
#include "server/json_text.h"

namespace thermocline::server {
namespace {

using nlohmann::ordered_json;

int64_t Nanos(double seconds) { return static_cast<int64_t>(seconds * 1e9 + 0.5); }

// Ollama's human parameter counts: "8.0B", "137M", "292K".
std::string HumanCount(int64_t n) {
  if (n >= 1000000000) return absl::StrFormat("%.1fB", n / 1e9);
  if (n >= 1000000) return absl::StrFormat("%.0fM", n / 1e6);
  if (n >= 1000) return absl::StrFormat("%.0fK", n / 1e3);
  return absl::StrCat(n);
}

// What /api/tags and /api/show say about a GGUF file.
struct FileFacts {
  std::string family;
  int64_t parameters = 0;
  std::string quantization;  // "Q4_K_M", "F32", ...
  std::chrono::system_clock::time_point modified;
  int64_t size = 0;
  std::string digest;
};

// A stable 64-hex-digit identifier of the file (path, size, modification time); not a hash of
// its bytes, which would mean reading gigabytes per listing.
std::string Digest(const std::string& path, int64_t size, int64_t mtime) {
  const std::string key = absl::StrCat(path, "\n", size, "\n", mtime);
  std::string out;
  for (uint64_t seed : {0xcbf29ce484222325ull, 0x84222325cbf29ce4ull, 0x9e3779b97f4a7c15ull,
                        0x2545f4914f6cdd1dull}) {
    uint64_t h = seed;
    for (unsigned char c : key) h = (h ^ c) * 0x100000001b3ull;
    absl::StrAppendFormat(&out, "%016x", h);
  }
  return out;
}

FileFacts Facts(const GgufFile& f, const std::string& path) {
  FileFacts facts;
  facts.family = f.GetString("general.architecture", "").value_or("");
  int64_t weights_of_type[64] = {};
  for (const GgufTensorInfo& t : f.tensors()) {
    facts.parameters += t.n_elements;
    const int type = static_cast<int>(t.type);
    if (t.dims.size() >= 2 && type >= 0 && type < 64) weights_of_type[type] += t.n_elements;
  }
  const int64_t file_type = f.GetInt("general.file_type", -1).value_or(-1);
  const QuantMix* mix =
      file_type >= 0 ? FindQuantMixByFileType(static_cast<uint32_t>(file_type)) : nullptr;
  if (mix != nullptr) {
    facts.quantization = absl::AsciiStrToUpper(mix->name);
  } else {
    int best = 0;  // the type most weights have
    for (int t = 1; t < 64; ++t) best = weights_of_type[t] > weights_of_type[best] ? t : best;
    facts.quantization = absl::AsciiStrToUpper(TypeName(static_cast<GgmlType>(best)));
  }
  std::error_code ec;
  facts.size = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  if (ec) facts.size = static_cast<int64_t>(f.file_size());
  const auto mtime = std::filesystem::last_write_time(path, ec);
  facts.modified = ec ? std::chrono::system_clock::now()
                      : std::chrono::time_point_cast<std::chrono::system_clock::duration>(
                            std::chrono::file_clock::to_sys(mtime));
  facts.digest = Digest(
      path, facts.size,
      std::chrono::duration_cast<std::chrono::seconds>(facts.modified.time_since_epoch()).count());
  return facts;
}

// The model's GGUF: the loaded model's, else the file's header (mapped, not read).
struct OpenedFile {
  std::shared_ptr<const LoadedModel> loaded;
  std::unique_ptr<GgufFile> own;
  const GgufFile* file = nullptr;
};
absl::StatusOr<OpenedFile> Open(const ServedModel& m) {
  OpenedFile o;
  o.loaded = m.loaded();
  if (o.loaded != nullptr) {
    o.file = &o.loaded->model->gguf();
    return o;
  }
  auto f = GgufFile::Open(m.config.path);
  if (!f.ok()) return f.status();
  o.own = *std::move(f);
  o.file = o.own.get();
  return o;
}

ordered_json Details(const FileFacts& f) {
  return {{"parent_model", ""},
          {"format", "gguf"},
          {"family", f.family},
          {"families", ordered_json::array({f.family})},
          {"parameter_size", HumanCount(f.parameters)},
          {"quantization_level", f.quantization}};
}

ordered_json Entry(const ServedModel& m, const FileFacts& f) {
  const std::string name = OllamaTaggedName(m.config.name);
  return {{"name", name},   {"model", name},      {"modified_at", OllamaTimestamp(f.modified)},
          {"size", f.size}, {"digest", f.digest}, {"details", Details(f)}};
}

ordered_json MetadataValue(const GgufValue& v, bool verbose) {
  if (v.type() == GgufValueType::kArray) {
    if (!verbose) return nullptr;
    if (const auto* s = v.AsStringArray()) return *s;
    if (const auto* i = v.AsIntArray()) return *i;
    if (const auto* u = v.AsUintArray()) return *u;
    if (const auto* d = v.AsDoubleArray()) return *d;
    return nullptr;
  }
  if (const std::string* s = v.AsString()) return *s;
  if (v.type() == GgufValueType::kBool) return v.AsBool().value_or(false);
  if (v.type() == GgufValueType::kFloat32 || v.type() == GgufValueType::kFloat64) {
    return v.AsDouble().value_or(0);
  }
  if (auto u = v.AsUint()) return *u;
  if (auto i = v.AsInt()) return *i;
  return nullptr;
}

}  // namespace

namespace {

// Appends t as RFC 3339 UTC with nanoseconds, without allocating (a stream writes one per piece).
void AppendTimestamp(std::chrono::system_clock::time_point t, std::string* out) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch());
  const std::time_t secs = static_cast<std::time_t>(ns.count() / 1000000000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[48];
  const int n = std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%09lldZ",
                              tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                              tm.tm_sec, static_cast<long long>(ns.count() % 1000000000));
  out->append(buf, static_cast<size_t>(std::max(n, 0)));
}

}  // namespace

std::string OllamaTimestamp(std::chrono::system_clock::time_point t) {
  std::string out;
  AppendTimestamp(t, &out);
  return out;
}

const char* OllamaDoneReason(StopReason reason) {
  switch (reason) {
    case StopReason::kLength:
    case StopReason::kContextFull:
    case StopReason::kCancelled:  // the deadline: cut short, as OpenAI's "length"
      return "length";
    default:
      return "stop";
  }
}

void AppendOllamaFinal(const OllamaTimings& timings, StopReason reason,
                       const GenerationStats& stats, std::string* out) {
  const double total = std::chrono::duration<double>(Clock::now() - timings.start).count();
  out->append("\"done_reason\":");
  AppendJsonString(out, OllamaDoneReason(reason));
  out->append(",\"total_duration\":");
  AppendInt(out, Nanos(total));
  out->append(",\"load_duration\":");
  AppendInt(out, Nanos(timings.load_seconds));
  out->append(",\"prompt_eval_count\":");
  AppendInt(out, stats.prompt_tokens);
  out->append(",\"prompt_eval_duration\":");
  AppendInt(out, Nanos(stats.prompt_seconds));
  out->append(",\"eval_count\":");
  AppendInt(out, stats.completion_tokens);
  out->append(",\"eval_duration\":");
  AppendInt(out, Nanos(stats.decode_seconds));
}

void AppendOllamaChunk(const std::string& model, bool chat, std::string_view text, bool open,
                       std::string* out) {
  out->append("{\"model\":");
  AppendJsonString(out, model);
  out->append(",\"created_at\":\"");
  AppendTimestamp(std::chrono::system_clock::now(), out);
  out->push_back('"');
  if (chat) {
    out->append(",\"message\":{\"role\":\"assistant\",\"content\":");
    AppendJsonString(out, text);
    out->push_back('}');
  } else {
    out->append(",\"response\":");
    AppendJsonString(out, text);
  }
  out->append(open ? ",\"done\":true," : ",\"done\":false}\n");
}

std::string OllamaErrorJson(std::string_view message) {
  std::string out = "{\"error\":";
  AppendJsonString(&out, message);
  out.push_back('}');
  return out;
}

bool OllamaStreamSink::OnDelta(std::string_view text, absl::Span<const TokenLogprobs>) {
  if (text.empty()) return true;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return buffer_.size() < kMaxBuffered || abandoned_; });
  if (abandoned_) return false;
  const bool consumer_waiting = buffer_.empty();  // it waits only on an empty buffer
  AppendOllamaChunk(model_, chat_, text, /*open=*/false, &buffer_);
  if (consumer_waiting) cv_.notify_all();
  return true;
}

void OllamaStreamSink::OnFinish(StopReason reason, CancelReason cancel,
                                const GenerationStats& stats, const absl::Status& error) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_ = stats;
  finished_ = true;
  if (!abandoned_) {
    if (reason == StopReason::kError) {
      buffer_ += OllamaErrorJson(ToApiError(error).message) + "\n";
    } else if (reason == StopReason::kCancelled && cancel != CancelReason::kDeadline) {
      buffer_ += OllamaErrorJson("the server shut down before the end") + "\n";
    } else {
      AppendOllamaChunk(model_, chat_, "", /*open=*/true, &buffer_);
      AppendOllamaFinal(timings_, reason, stats, &buffer_);
      buffer_.append("}\n");
    }
  }
  cv_.notify_all();
}

bool OllamaStreamSink::Take(std::string* out) {
  out->clear();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !buffer_.empty() || finished_; });
  if (buffer_.empty()) return false;
  out->swap(buffer_);
  cv_.notify_all();
  return true;
}

void OllamaStreamSink::Abandon() {
  std::lock_guard<std::mutex> lock(mu_);
  abandoned_ = true;
  buffer_.clear();
  cv_.notify_all();
}

ordered_json OllamaModelEntry(const ServedModel& m) {
  auto opened = Open(m);
  if (!opened.ok()) {
    const std::string name = OllamaTaggedName(m.config.name);
    return {{"name", name}, {"model", name}, {"size", 0}, {"digest", ""}, {"details", nullptr}};
  }
  return Entry(m, Facts(*opened->file, m.config.path));
}

absl::StatusOr<ordered_json> OllamaShow(const ServedModel& m, bool verbose) {
  auto opened = Open(m);
  if (!opened.ok()) return opened.status();
  const GgufFile& f = *opened->file;
  const FileFacts facts = Facts(f, m.config.path);
  ordered_json info = ordered_json::object();
  for (const GgufKeyValue& kv : f.metadata()) {
    if (kv.key == "tokenizer.chat_template") continue;  // it is "template"
    info[kv.key] = MetadataValue(kv.value, verbose);
  }
  info["general.parameter_count"] = facts.parameters;
  const std::string chat_template = f.GetString("tokenizer.chat_template", "").value_or("");
  std::string parameters;
  std::string modelfile = absl::StrCat("# Modelfile of the model '", m.config.name,
                                       "' served by thermocline\nFROM ", m.config.path, "\n");
  if (!chat_template.empty())
    absl::StrAppend(&modelfile, "TEMPLATE \"\"\"", chat_template, "\"\"\"\n");
  if (opened->loaded != nullptr) {
    for (const std::string& s : opened->loaded->chat_template->implied_stops()) {
      absl::StrAppend(&parameters, "stop                           \"", s, "\"\n");
    }
    absl::StrAppend(&parameters, "num_ctx                        ", opened->loaded->n_ctx, "\n");
  }
  std::string p = parameters;
  for (size_t pos = 0; (pos = p.find('\n', pos)) != std::string::npos; ++pos) {
    if (pos + 1 < p.size()) p.insert(pos + 1, "PARAMETER ");
  }
  if (!p.empty()) modelfile += "PARAMETER " + p;
  return ordered_json{{"modelfile", modelfile},
                      {"parameters", parameters},
                      {"template", chat_template},
                      {"details", Details(facts)},
                      {"model_info", info},
                      {"capabilities", ordered_json::array({"completion", "embedding"})},
                      {"modified_at", OllamaTimestamp(facts.modified)}};
}

ordered_json OllamaRunningEntry(const ServedModel& m, const LoadedModel& l,
                                const ModelRegistry& registry) {
  ordered_json e = Entry(m, Facts(l.model->gguf(), m.config.path));
  const auto expires = registry.ExpiresAt(m);
  const auto now = std::chrono::system_clock::now();
  // Never unloaded by keep_alive: Ollama answers a date centuries out (here: 100 years).
  const auto at = expires ? now + std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                      *expires - std::chrono::steady_clock::now())
                          : now + std::chrono::hours(24 * 365 * 100);
  e["expires_at"] = OllamaTimestamp(at);
  const std::shared_ptr<const Engine> engine = l.engine();
  e["size_vram"] = engine != nullptr ? engine->placement().gpu_bytes : 0;
  e["context_length"] = l.n_ctx;
  return e;
}

}  // namespace thermocline::server
