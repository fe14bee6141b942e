// Tool-call formats, the fallback tool prompt, and the incremental output parser: content text
// with markers looked for, then a character-level scanner of each call's JSON object that
// picks out "name" and the arguments value ("arguments", or "parameters" for Llama 3).
#include "server/tool_calls.h"

#include <random>

#include "absl/strings/str_cat.h"

namespace thermocline::server {
namespace {

constexpr char kHermesOpen[] = "<tool_call>";
constexpr char kHermesClose[] = "</tool_call>";
constexpr char kMistralOpen[] = "[TOOL_CALLS]";
constexpr char kPythonTag[] = "<|python_tag|>";

bool Contains(std::string_view s, std::string_view what) { return s.find(what) != s.npos; }

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

size_t TrailingSpace(std::string_view s) {
  size_t n = 0;
  while (n < s.size() && IsSpace(s[s.size() - 1 - n])) ++n;
  return n;
}

// The markers that open a call anywhere in the text (consumed).
std::vector<std::string_view> OpenMarkers(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return {kHermesOpen};
    case ToolCallFormat::kLlama3:
      return {kPythonTag};
    case ToolCallFormat::kMistral:
      return {kMistralOpen};
  }
  return {};
}

// The character that opens a call when it is the first of the message (kept: it is the call's
// first character): Llama 3's bare JSON object, Mistral's list when the [TOOL_CALLS] control
// token left no text.
char StartChar(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kLlama3:
      return '{';
    case ToolCallFormat::kMistral:
      return '[';
    default:
      return 0;
  }
}

bool IsArgumentsKey(std::string_view key) { return key == "arguments" || key == "parameters"; }

// A JSON string literal's value; nullopt when `raw` is not one.
std::optional<std::string> JsonStringValue(std::string_view raw) {
  if (raw.empty() || raw.front() != '"') return std::nullopt;
  auto v = nlohmann::json::parse(raw, nullptr, false);
  if (v.is_discarded() || !v.is_string()) return std::nullopt;
  return v.get<std::string>();
}

}  // namespace

ToolCallFormat DetectToolCallFormat(std::string_view t) {
  if (Contains(t, kMistralOpen)) return ToolCallFormat::kMistral;
  if (Contains(t, kHermesOpen)) return ToolCallFormat::kHermes;
  if (Contains(t, kPythonTag) ||
      (Contains(t, "<|start_header_id|>") && Contains(t, "parameters"))) {
    return ToolCallFormat::kLlama3;
  }
  return ToolCallFormat::kHermes;
}

const char* ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlama3:
      return "llama3";
    case ToolCallFormat::kMistral:
      return "mistral";
  }
  return "?";
}

ToolCallGrammarOptions ToolCallGrammarFor(ToolCallFormat format) {
  ToolCallGrammarOptions o;
  switch (format) {
    case ToolCallFormat::kHermes:
      o.prefix = absl::StrCat(kHermesOpen, "\n");
      o.suffix = absl::StrCat("\n", kHermesClose);
      break;
    case ToolCallFormat::kLlama3:
      o.arguments_key = "parameters";
      break;
    case ToolCallFormat::kMistral:
      o.prefix = absl::StrCat(kMistralOpen, " [");
      o.suffix = "]";
      break;
  }
  return o;
}

std::string NewToolCallId(ToolCallFormat format) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  const bool mistral = format == ToolCallFormat::kMistral;
  std::string id = mistral ? "" : "call_";
  for (int i = 0; i < (mistral ? 9 : 24); ++i) {
    id.push_back(kAlphabet[rng() % (sizeof(kAlphabet) - 1)]);
  }
  return id;
}

std::vector<ChatMessage> WithToolPrompt(const std::vector<ChatMessage>& messages,
                                        const nlohmann::ordered_json& tools) {
  // Short: small models have small contexts. Each function as its JSON object.
  std::string prompt = "Functions you can call:\n";
  if (tools.is_array()) {
    for (const auto& tool : tools) {
      absl::StrAppend(&prompt, (tool.contains("function") ? tool["function"] : tool).dump(), "\n");
    }
  }
  absl::StrAppend(&prompt, "To call one, write ", kHermesOpen,
                  "{\"name\": <name>, \"arguments\": <arguments object>}", kHermesClose);
  std::vector<ChatMessage> out;
  out.reserve(messages.size() + 1);
  if (tools.is_null()) prompt.clear();
  // Into the system message, or the first user message when there is none: a role the
  // conversation did not have may be one the template refuses (Gemma's have no system role).
  const bool has_system = !messages.empty() && messages.front().role == "system";
  bool placed = prompt.empty();
  for (size_t i = 0; i < messages.size(); ++i) {
    ChatMessage m = messages[i];
    if (!placed && has_system && i == 0) {
      m.content = absl::StrCat(m.content, m.content.empty() ? "" : "\n\n", prompt);
      m.content_parts.clear();
      placed = true;
    } else if (!placed && !has_system && m.role == "user") {
      m.content = absl::StrCat(prompt, "\n\n", m.content);
      m.content_parts.clear();
      placed = true;
    }
    for (const ChatToolCall& call : m.tool_calls) {
      const auto args = nlohmann::ordered_json::parse(call.arguments, nullptr, false);
      absl::StrAppend(&m.content, m.content.empty() ? "" : "\n", kHermesOpen,
                      "\n{\"name\": ", nlohmann::json(call.name).dump(),
                      ", \"arguments\": ", args.is_discarded() ? "{}" : args.dump(), "}\n",
                      kHermesClose);
    }
    if (!m.tool_calls.empty()) {
      m.tool_calls.clear();
      m.content_is_null = false;
      m.content_parts.clear();
    }
    if (m.role == "tool") {
      m.content = absl::StrCat("<tool_response>\n", m.content, "\n</tool_response>");
      m.content_parts.clear();
    }
    out.push_back(std::move(m));
  }
  if (!placed) {
    ChatMessage system;
    system.role = "system";
    system.content = std::move(prompt);
    out.insert(out.begin(), std::move(system));
  }
  return out;
}

ToolCallParser::ToolCallParser(ToolCallFormat format, bool parallel)
    : format_(format), parallel_(parallel) {}

void ToolCallParser::Push(std::string_view text, ToolCallEvents& out) {
  for (char c : text) Step(c, out);
  if (mode_ == Mode::kContent) FlushContent(out, /*all=*/false);
  FlushArguments(out);
}

void ToolCallParser::Step(char c, ToolCallEvents& out) {
  switch (mode_) {
    case Mode::kDone:
      return;
    case Mode::kContent: {
      const char start = StartChar(format_);
      if (start != 0 && c == start && AtMessageStart()) {
        raw_ = std::move(content_);  // whitespace before the call: content if it is none
        content_.clear();
        mode_ = format_ == ToolCallFormat::kMistral ? Mode::kBeforeList : Mode::kInCall;
        Step(c, out);
        return;
      }
      content_.push_back(c);
      if (!IsSpace(c)) content_seen_ = true;
      for (std::string_view marker : OpenMarkers(format_)) {
        if (!std::string_view(content_).ends_with(marker)) continue;
        content_.resize(content_.size() - marker.size());
        // Whitespace before the marker goes with the call (dropped, or content if it is none).
        const size_t gap = TrailingSpace(content_);
        raw_.assign(content_, content_.size() - gap, gap);
        raw_.append(marker);
        content_.resize(content_.size() - gap);
        if (!content_.empty()) out.Content(content_);
        content_.clear();
        mode_ = format_ == ToolCallFormat::kMistral ? Mode::kBeforeList : Mode::kInCall;
        return;
      }
      return;
    }
    case Mode::kBeforeList:
      raw_.push_back(c);
      if (IsSpace(c)) return;
      if (c == '[') {
        mode_ = Mode::kInCall;
        return;
      }
      Abandon(out);
      return;
    case Mode::kInCall:
      raw_.push_back(c);
      StepCall(c, out);
      return;
    case Mode::kAfterCall:
      if (format_ == ToolCallFormat::kMistral) {
        if (IsSpace(c)) return;
        if (c == ',') {
          raw_.clear();
          mode_ = Mode::kInCall;
          return;
        }
        mode_ = Mode::kContent;
        if (c != ']') Step(c, out);
        return;
      }
      if (closing_.empty() && IsSpace(c)) return;
      closing_.push_back(c);
      if (std::string_view(kHermesClose).starts_with(closing_)) {
        if (closing_.size() == std::string_view(kHermesClose).size()) {
          closing_.clear();
          mode_ = parallel_ ? Mode::kContent : Mode::kDone;
        }
        return;
      }
      // No closing marker: what came is content.
      mode_ = Mode::kContent;
      {
        const std::string text = std::move(closing_);
        closing_.clear();
        for (char t : text) Step(t, out);
      }
      return;
  }
}

void ToolCallParser::StepCall(char c, ToolCallEvents& out) {
  if (in_string_) {
    if (in_key_) {
      if (escape_) {
        escape_ = false;
      } else if (c == '\\') {
        escape_ = true;
      } else if (c == '"') {
        in_string_ = false;
        in_key_ = false;
        expect_key_ = false;
        return;
      }
      key_.push_back(c);
      return;
    }
    value_.push_back(c);
    if (IsArgumentsKey(key_)) args_pending_.push_back(c);
    if (escape_) {
      escape_ = false;
    } else if (c == '\\') {
      escape_ = true;
    } else if (c == '"') {
      in_string_ = false;
    }
    return;
  }
  if (depth_ == 0) {  // before the object
    if (IsSpace(c)) return;
    if (c != '{') return Abandon(out);
    depth_ = 1;
    expect_key_ = true;
    return;
  }
  if (depth_ == 1 && !in_value_) {
    if (IsSpace(c)) return;
    if (expect_key_ && c == '"') {
      in_string_ = true;
      in_key_ = true;
      key_.clear();
      return;
    }
    if (!expect_key_ && c == ':' && !key_.empty()) {
      in_value_ = true;
      value_.clear();
      return;
    }
    if (c == ',' && !expect_key_) {
      expect_key_ = true;
      key_.clear();
      return;
    }
    if (c == '}') {
      depth_ = 0;
      return CallEnded(out);
    }
    return Abandon(out);
  }
  // Inside the value of key_.
  if (depth_ == 1 && value_.empty() && IsSpace(c)) return;
  if (depth_ == 1 && (c == ',' || c == '}')) {
    ValueEnded(out);
    if (c == ',') {
      expect_key_ = true;
      key_.clear();
      return;
    }
    depth_ = 0;
    return CallEnded(out);
  }
  if (c == '"') in_string_ = true;
  if (c == '{' || c == '[') ++depth_;
  if (c == '}' || c == ']') {
    if (--depth_ < 1) return Abandon(out);
  }
  if (IsArgumentsKey(key_) && value_.empty() && c == '"') args_is_string_ = true;
  value_.push_back(c);
  if (IsArgumentsKey(key_)) args_pending_.push_back(c);
}

void ToolCallParser::ValueEnded(ToolCallEvents& out) {
  in_value_ = false;
  if (key_ == "name" && name_.empty()) {
    if (auto name = JsonStringValue(value_); name && !name->empty()) {
      name_ = *name;
      StartCall(out);
    }
  } else if (IsArgumentsKey(key_) && !args_seen_) {
    args_seen_ = true;
    args_pending_.resize(args_pending_.size() - TrailingSpace(args_pending_));
    if (args_is_string_) {
      // Arguments written as a JSON string holding the JSON text.
      args_pending_ = JsonStringValue(args_pending_).value_or("{}");
      args_is_string_ = false;
    }
    FlushArguments(out);
  }
  value_.clear();
}

void ToolCallParser::StartCall(ToolCallEvents& out) {
  started_ = true;
  id_ = NewToolCallId(format_);
  out.CallStart(calls_, id_, name_);
  ++calls_;
  FlushArguments(out);
}

void ToolCallParser::FlushArguments(ToolCallEvents& out) {
  if (!started_ || args_is_string_ || args_pending_.empty()) return;
  // Whitespace is held while the value goes on: it may be the value's end.
  const size_t keep = args_seen_ ? 0 : TrailingSpace(args_pending_);
  if (keep == args_pending_.size()) return;
  out.Arguments(calls_ - 1, std::string_view(args_pending_).substr(0, args_pending_.size() - keep));
  args_pending_.erase(0, args_pending_.size() - keep);
}

void ToolCallParser::CallEnded(ToolCallEvents& out) {
  if (!started_) return Abandon(out);
  if (!args_seen_) {
    args_seen_ = true;
    args_pending_ = "{}";
  }
  FlushArguments(out);
  // The scanner is ready for the next call.
  started_ = args_seen_ = args_is_string_ = false;
  in_string_ = escape_ = in_key_ = in_value_ = expect_key_ = false;
  depth_ = 0;
  key_.clear();
  value_.clear();
  name_.clear();
  args_pending_.clear();
  raw_.clear();
  content_seen_ = true;  // a start character is no longer at the message's start
  if (!parallel_) {
    mode_ = Mode::kDone;
  } else {
    mode_ = format_ == ToolCallFormat::kLlama3 ? Mode::kContent : Mode::kAfterCall;
  }
}

void ToolCallParser::Abandon(ToolCallEvents& out) {
  if (started_) {
    // The call's name and some arguments went out already: it ends here.
    CallEnded(out);
    if (mode_ != Mode::kDone) mode_ = Mode::kContent;
    return;
  }
  std::string text = std::move(raw_);
  raw_.clear();
  in_string_ = escape_ = in_key_ = in_value_ = expect_key_ = false;
  depth_ = 0;
  key_.clear();
  value_.clear();
  name_.clear();
  args_pending_.clear();
  args_seen_ = args_is_string_ = false;
  mode_ = Mode::kContent;
  content_seen_ = true;
  content_ += text;
}

void ToolCallParser::FlushContent(ToolCallEvents& out, bool all) {
  if (content_.empty()) return;
  size_t keep = 0;
  if (all) {
    if (calls_ > 0) content_.resize(content_.size() - TrailingSpace(content_));
  } else {
    // The longest end of the text that begins a marker, and whitespace before it.
    for (std::string_view marker : OpenMarkers(format_)) {
      for (size_t k = std::min(marker.size() - 1, content_.size()); k > keep; --k) {
        if (std::string_view(content_).ends_with(marker.substr(0, k))) {
          keep = k;
          break;
        }
      }
    }
    keep += TrailingSpace(std::string_view(content_).substr(0, content_.size() - keep));
  }
  if (keep < content_.size()) {
    out.Content(std::string_view(content_).substr(0, content_.size() - keep));
    content_.erase(0, content_.size() - keep);
  }
}

void ToolCallParser::Finish(ToolCallEvents& out) {
  switch (mode_) {
    case Mode::kContent:
      FlushContent(out, /*all=*/true);
      break;
    case Mode::kBeforeList:
      Abandon(out);
      FlushContent(out, /*all=*/true);
      break;
    case Mode::kInCall:
      if (started_) {
        if (in_value_ && IsArgumentsKey(key_)) {
          args_seen_ = true;
          if (args_is_string_) args_pending_.clear();
        }
        CallEnded(out);
      } else {
        Abandon(out);
        FlushContent(out, /*all=*/true);
      }
      break;
    case Mode::kAfterCall:
    case Mode::kDone:
      break;
  }
  content_.clear();
}

namespace {

class Collector : public ToolCallEvents {
 public:
  explicit Collector(ParsedOutput* out) : out_(out) {}
  void Content(std::string_view text) override { out_->content.append(text); }
  void CallStart(int, std::string_view id, std::string_view name) override {
    out_->calls.push_back({std::string(id), std::string(name), ""});
  }
  void Arguments(int index, std::string_view piece) override {
    out_->calls[index].arguments.append(piece);
  }

 private:
  ParsedOutput* out_;
};

}  // namespace

ParsedOutput ParseToolCalls(std::string_view text, ToolCallFormat format, bool parallel) {
  ParsedOutput out;
  Collector collector(&out);
  ToolCallParser parser(format, parallel);
  parser.Push(text, collector);
  parser.Finish(collector);
  return out;
}

}  // namespace thermocline::server
