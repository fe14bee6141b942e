// Tool calls in a chat model's output: which format a model writes (from its chat template),
// the grammar options that make constrained decoding write that format, the tool prompt for
// templates that do not render `tools` themselves, and an incremental parser that splits the
// output into message content and calls, so that a stream can send a call's name as soon as it
// is written and its arguments as they come (the OpenAI stream's delta.tool_calls).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "nlohmann/json.hpp"
#include "server/chat_template.h"
#include "server/json_schema_grammar.h"
#include "server/request.h"

namespace thermocline::server {

// The format a chat template's text implies: "[TOOL_CALLS]" Mistral, "<tool_call>" Hermes,
// Llama 3's header tokens with "parameters" or "<|python_tag|>" Llama 3; Hermes otherwise.
ToolCallFormat DetectToolCallFormat(std::string_view template_text);
const char* ToolCallFormatName(ToolCallFormat format);

// Prefix, suffix and arguments key of one call in `format`, for ToolCallGbnf.
ToolCallGrammarOptions ToolCallGrammarFor(ToolCallFormat format);

// A new call id: "call_" and 24 letters or digits; Mistral's templates want 9 of them alone.
std::string NewToolCallId(ToolCallFormat format);

// For a template that does not render `tools`: the tools and how to call them (Hermes format)
// added to the system message (else to the first user message), and earlier assistant turns'
// tool_calls written into their content as that format, so the model sees its own calls, and
// tool results wrapped in <tool_response> tags. `tools` null: only the history is rewritten.
std::vector<ChatMessage> WithToolPrompt(const std::vector<ChatMessage>& messages,
                                        const nlohmann::ordered_json& tools);

// What the parser finds, as it finds it. Views are valid during the call only.
class ToolCallEvents {
 public:
  virtual ~ToolCallEvents() = default;
  virtual void Content(std::string_view text) = 0;
  // Call `index` (0, 1, ...) has begun: its id and function name.
  virtual void CallStart(int index, std::string_view id, std::string_view name) = 0;
  // The next piece of call `index`'s arguments (JSON text); the pieces concatenate to it.
  virtual void Arguments(int index, std::string_view piece) = 0;
};

// Splits generated text into content and tool calls. Text that may begin a call's marker is
// held back until it is known; a call's arguments are passed on as they arrive once its name
// is known. Text that turns out not to be a well-formed call is content. Whitespace between
// content and a call is dropped. Reuses its buffers: no allocation per token once warm.
class ToolCallParser {
 public:
  // parallel false: after the first call the rest of the output is dropped.
  ToolCallParser(ToolCallFormat format, bool parallel);

  void Push(std::string_view text, ToolCallEvents& out);
  // The end of the output: held-back text is content; an unfinished call is kept if its name
  // was written (its arguments as far as they came, "{}" when none).
  void Finish(ToolCallEvents& out);
  // Calls started so far.
  int calls() const { return calls_; }

 private:
  enum class Mode {
    kContent,     // message text; markers looked for
    kBeforeList,  // Mistral: after [TOOL_CALLS], before '['
    kInCall,      // before and inside a call's object
    kAfterCall,   // after a call's '}': its closing marker (Hermes), ',' or ']' (Mistral)
    kDone,        // parallel false and one call done: the rest is dropped
  };
  void Step(char c, ToolCallEvents& out);
  void StepCall(char c, ToolCallEvents& out);
  void ValueEnded(ToolCallEvents& out);
  void CallEnded(ToolCallEvents& out);
  // The text since the marker is not a call: it is content after all.
  void Abandon(ToolCallEvents& out);
  void StartCall(ToolCallEvents& out);
  void FlushContent(ToolCallEvents& out, bool all);
  void FlushArguments(ToolCallEvents& out);
  bool AtMessageStart() const { return !content_seen_; }

  ToolCallFormat format_;
  bool parallel_;
  Mode mode_ = Mode::kContent;
  int calls_ = 0;
  bool content_seen_ = false;  // non-whitespace content was emitted or held

  std::string content_;  // content not yet emitted (may end in a marker's beginning)
  std::string raw_;      // the call's text since its marker, for Abandon
  std::string closing_;  // Hermes: the closing marker matched so far

  // The call object's scanner: depth outside strings, strings and escapes, the key at depth 1
  // and the value that follows it.
  int depth_ = 0;
  bool in_string_ = false;
  bool escape_ = false;
  bool expect_key_ = false;
  bool in_key_ = false;
  bool in_value_ = false;
  std::string key_;
  std::string value_;     // the current depth-1 value's raw text
  std::string name_;      // the function name, once its value has ended
  bool started_ = false;  // CallStart sent for this call
  bool args_seen_ = false;
  bool args_is_string_ = false;
  std::string args_pending_;  // argument text not yet sent (before CallStart, or whitespace)
  std::string id_;
};

// The whole output at once: its content and its calls.
struct ParsedToolCall {
  std::string id;
  std::string name;
  std::string arguments;
};
struct ParsedOutput {
  std::string content;
  std::vector<ParsedToolCall> calls;
};
ParsedOutput ParseToolCalls(std::string_view text, ToolCallFormat format, bool parallel);

}  // namespace thermocline::server
