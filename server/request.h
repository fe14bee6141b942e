// The native request model: what a generation request means once its wire format is gone.
// The HTTP front end fills it from OpenAI JSON (request_parser.h); a gRPC front end would fill
// the same struct from a proto message. The scheduler and the decode loop see only this.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/runtime/embed.h"
#include "engine/sampling/grammar.h"
#include "engine/sampling/sampler.h"
#include "engine/sampling/token_trie.h"

namespace thermocline::server {

// kEmbedding: a job that pools hidden states of `inputs` instead of generating
// (server/embeddings.h); the generation fields are unused then.
enum class ApiKind { kChat, kCompletion, kEmbedding };

// How a model writes tool calls (server/tool_calls.h parses them and builds their grammar):
//   kHermes   <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>  (Hermes, Qwen, generic)
//   kLlama3   {"name": ..., "parameters": {...}}                          (Llama 3.x JSON)
//   kMistral  [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]        (Mistral v0.3)
enum class ToolCallFormat { kHermes, kLlama3, kMistral };

struct GenerationRequest {
  ApiKind kind = ApiKind::kCompletion;
  std::string model;            // registry name, resolved and known to exist
  std::vector<int32_t> prompt;  // token ids, BOS included when the model wants one
  SamplingParams sampling;
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to the raw logits before sampling
  int32_t max_tokens = 0;                             // > 0; prompt.size() + max_tokens <= context
  std::vector<std::string> stop;                      // never emitted; generation ends before them
  std::vector<int32_t> stop_tokens;  // extra end-of-turn tokens (from the chat template)
  bool ignore_eos = false;
  bool logprobs = false;
  int32_t top_logprobs = 0;  // alternatives per token, [0, 20]
  bool token_ids = false;    // the sink gets a TokenLogprobs (id) per token even without logprobs
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // Chat messages dropped (oldest first) to fit the context: context_overflow "truncate".
  int32_t truncated_messages = 0;

  // kEmbedding: each input's token ids (BOS included when the model wants one), each within the
  // context, embedded in order; the sink gets one OnEmbedding per input.
  std::vector<std::vector<int32_t>> inputs;
  EmbedOptions embed;

  // Constrained output (grammar, response_format, a tool_choice that forces a call): the
  // grammar the output must match and the model's vocabulary trie its matcher walks; both
  // null when unconstrained, both shared and immutable.
  std::shared_ptr<const Grammar> grammar;
  std::shared_ptr<const TokenTrie> vocab_trie;
  // Chat with tools (tool_choice not "none"): the output's tool calls are parsed out of it in
  // this format and returned as tool_calls; with parallel_tool_calls false only the first.
  bool parse_tool_calls = false;
  ToolCallFormat tool_format = ToolCallFormat::kHermes;
  bool parallel_tool_calls = true;
};

}  // namespace thermocline::server
