// The vocabulary as a byte trie, for grammar masks: every token that stands for text (its
// TokenToPiece bytes: SentencePiece '▁' as a space, <0xNN> byte tokens as their byte, GPT-2
// byte-level BPE decoded to bytes) hangs at the node its bytes lead to; end-of-generation
// tokens are listed apart; control and other empty tokens are in neither. The nodes are in
// depth-first order, so a walk can skip a whole subtree at once. Built once per tokenizer and
// immutable: share one between all matchers of a model, on any threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/types/span.h"
#include "engine/tokenizer/tokenizer.h"

namespace thermocline {

class TokenTrie {
 public:
  struct Node {
    uint8_t byte;          // the edge from the parent
    uint16_t depth;        // 0 for the root: the length of the bytes leading here
    int32_t subtree_end;   // index of the first node after this node's subtree
    int32_t tokens_begin;  // tokens ending here: token_ids()[tokens_begin, next node's)
  };

  static std::shared_ptr<const TokenTrie> FromTokenizer(const Tokenizer& tokenizer);
  // pieces[id] is token id's bytes ("" for a token that never stands for text); end_ids are
  // the end-of-generation tokens. For tests and benchmarks.
  static std::shared_ptr<const TokenTrie> FromPieces(std::vector<std::string> pieces,
                                                     std::vector<int32_t> end_ids);

  int32_t vocab_size() const { return static_cast<int32_t>(pieces_.size()); }
  std::string_view piece(int32_t id) const { return pieces_[id]; }
  bool is_end(int32_t id) const { return is_end_[id] != 0; }
  absl::Span<const int32_t> end_ids() const { return end_ids_; }

  // nodes()[0] is the root; nodes() ends with a sentinel whose tokens_begin closes the last
  // node's list (num_nodes() excludes it).
  const Node* nodes() const { return nodes_.data(); }
  int32_t num_nodes() const { return static_cast<int32_t>(nodes_.size()) - 1; }
  const int32_t* token_ids() const { return token_ids_.data(); }
  int32_t max_depth() const { return max_depth_; }

 private:
  TokenTrie() = default;
  void Build();

  std::vector<std::string> pieces_;
  std::vector<uint8_t> is_end_;
  std::vector<int32_t> end_ids_;
  std::vector<Node> nodes_;
  std::vector<int32_t> token_ids_;
  int32_t max_depth_ = 0;
};

}  // namespace thermocline
