// The built-in chat formats: one small C++ renderer per family, for GGUF files without a
// tokenizer.chat_template and for a config that names a family.
#include "server/chat_template_families.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace thermocline::server {
namespace {

bool Has(std::string_view t, std::string_view what) { return t.find(what) != t.npos; }

std::string Strip(std::string_view s) {
  return std::string(absl::StripAsciiWhitespace(absl::string_view(s.data(), s.size())));
}

// Families without a system role fold the system text into the first user message.
Messages FoldSystem(const Messages& in) {
  Messages out;
  std::string system;
  for (const ChatMessage& m : in) {
    if (m.role == "system") {
      absl::StrAppend(&system, system.empty() ? "" : "\n\n", m.content);
      continue;
    }
    ChatMessage copy = m;
    if (copy.role == "tool") copy.role = "user";
    if (!system.empty() && copy.role == "user") {
      copy.content = absl::StrCat(system, "\n\n", copy.content);
      system.clear();
    }
    out.push_back(std::move(copy));
  }
  if (!system.empty()) {
    ChatMessage first;
    first.role = "user";
    first.content = std::move(system);
    out.insert(out.begin(), std::move(first));
  }
  return out;
}

std::string RenderChatMl(const Messages& msgs, const ChatSpecialTexts&) {
  std::string out;
  for (const ChatMessage& m : msgs) {
    absl::StrAppend(&out, "<|im_start|>", m.role, "\n", m.content, "<|im_end|>\n");
  }
  out += "<|im_start|>assistant\n";
  return out;
}

std::string RenderLlama3(const Messages& msgs, const ChatSpecialTexts& s) {
  std::string out = s.bos;
  for (const ChatMessage& m : msgs) {
    absl::StrAppend(&out, "<|start_header_id|>", m.role == "tool" ? "ipython" : m.role,
                    "<|end_header_id|>\n\n", Strip(m.content), "<|eot_id|>");
  }
  out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

// Meta's Llama-2 chat: <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {answer} </s>
std::string RenderLlama2(const Messages& msgs, const ChatSpecialTexts& s) {
  std::string out, system;
  for (const ChatMessage& m : msgs) {
    if (m.role == "system") {
      system = Strip(m.content);
    } else if (m.role == "assistant") {
      absl::StrAppend(&out, " ", Strip(m.content), " ", s.eos);
    } else {
      std::string content = Strip(m.content);
      if (!system.empty()) {
        content = absl::StrCat("<<SYS>>\n", system, "\n<</SYS>>\n\n", content);
        system.clear();
      }
      absl::StrAppend(&out, s.bos, "[INST] ", content, " [/INST]");
    }
  }
  return out;
}

// Mistral Instruct: <s>[INST] {user} [/INST]{answer}</s>[INST] ...
std::string RenderMistral(const Messages& msgs, const ChatSpecialTexts& s) {
  std::string out = s.bos;
  for (const ChatMessage& m : FoldSystem(msgs)) {
    if (m.role == "assistant") {
      absl::StrAppend(&out, Strip(m.content), s.eos);
    } else {
      absl::StrAppend(&out, "[INST] ", Strip(m.content), " [/INST]");
    }
  }
  return out;
}

std::string RenderZephyr(const Messages& msgs, const ChatSpecialTexts& s) {
  std::string out;
  for (const ChatMessage& m : msgs) {
    absl::StrAppend(&out, "<|", m.role == "tool" ? "user" : m.role, "|>\n", m.content, s.eos, "\n");
  }
  out += "<|assistant|>\n";
  return out;
}

std::string RenderGemma(const Messages& msgs, const ChatSpecialTexts& s) {
  std::string out = s.bos;
  for (const ChatMessage& m : FoldSystem(msgs)) {
    absl::StrAppend(&out, "<start_of_turn>", m.role == "assistant" ? "model" : "user", "\n",
                    Strip(m.content), "<end_of_turn>\n");
  }
  out += "<start_of_turn>model\n";
  return out;
}

std::string RenderPhi3(const Messages& msgs, const ChatSpecialTexts&) {
  std::string out;
  for (const ChatMessage& m : msgs) {
    absl::StrAppend(&out, "<|", m.role == "tool" ? "user" : m.role, "|>\n", m.content, "<|end|>\n");
  }
  out += "<|assistant|>\n";
  return out;
}

// No template in the model: plain text a base model continues naturally.
//   {system}\n\n  User: {content}\n  Assistant: {content}\n ... Assistant:
std::string RenderFallback(const Messages& msgs, const ChatSpecialTexts&) {
  std::string out;
  for (const ChatMessage& m : msgs) {
    if (m.role == "system") {
      absl::StrAppend(&out, m.content, "\n\n");
    } else {
      absl::StrAppend(&out, m.role == "assistant" ? "Assistant: " : "User: ", m.content, "\n");
    }
  }
  out += "Assistant:";
  return out;
}

}  // namespace

// Detection order matters: the first family whose markers appear wins.
const std::vector<ChatTemplate::Family>& ChatFamilies() {
  static const std::vector<ChatTemplate::Family> kFamilies = {
      {"chatml",
       [](std::string_view t) { return Has(t, "<|im_start|>"); },
       RenderChatMl,
       "<|im_end|>",
       {}},
      {"llama-3",
       [](std::string_view t) { return Has(t, "<|start_header_id|>"); },
       RenderLlama3,
       "<|eot_id|>",
       {}},
      {"gemma",
       [](std::string_view t) { return Has(t, "<start_of_turn>"); },
       RenderGemma,
       "<end_of_turn>",
       {}},
      {"phi-3",
       [](std::string_view t) { return Has(t, "<|end|>") && Has(t, "<|assistant|>"); },
       RenderPhi3,
       "<|end|>",
       {}},
      {"zephyr", [](std::string_view t) { return Has(t, "<|user|>"); }, RenderZephyr, "", {}},
      {"llama-2",
       [](std::string_view t) { return Has(t, "[INST]") && Has(t, "<<SYS>>"); },
       RenderLlama2,
       "",
       {}},
      {"mistral", [](std::string_view t) { return Has(t, "[INST]"); }, RenderMistral, "", {}},
      {"fallback", nullptr, RenderFallback, "", {"\nUser:"}},
  };
  return kFamilies;
}

}  // namespace thermocline::server
