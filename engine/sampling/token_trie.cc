// Building the vocabulary trie: tokens sorted by their bytes, so that one pass over them (each
// sharing a prefix with the one before) lays the nodes out in depth-first order.
#include "engine/sampling/token_trie.h"

#include <algorithm>
#include <limits>
#include <numeric>

namespace thermocline {

std::shared_ptr<const TokenTrie> TokenTrie::FromTokenizer(const Tokenizer& tokenizer) {
  const int32_t n = tokenizer.vocab_size();
  std::vector<std::string> pieces(n);
  std::vector<int32_t> end_ids;
  for (int32_t id = 0; id < n; ++id) {
    if (tokenizer.IsEndOfGeneration(id)) {
      end_ids.push_back(id);
    } else {
      pieces[id] = tokenizer.TokenToPiece(id);
    }
  }
  return FromPieces(std::move(pieces), std::move(end_ids));
}

std::shared_ptr<const TokenTrie> TokenTrie::FromPieces(std::vector<std::string> pieces,
                                                       std::vector<int32_t> end_ids) {
  std::shared_ptr<TokenTrie> trie(new TokenTrie());
  trie->pieces_ = std::move(pieces);
  trie->is_end_.assign(trie->pieces_.size(), 0);
  for (int32_t id : end_ids) {
    if (id < 0 || id >= trie->vocab_size()) continue;
    trie->is_end_[id] = 1;
    trie->pieces_[id].clear();
  }
  for (int32_t id = 0; id < trie->vocab_size(); ++id) {
    if (trie->is_end_[id]) trie->end_ids_.push_back(id);
  }
  trie->Build();
  return trie;
}

void TokenTrie::Build() {
  constexpr size_t kMaxPiece = std::numeric_limits<uint16_t>::max();
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < vocab_size(); ++id) {
    const size_t len = pieces_[id].size();
    if (len > 0 && len <= kMaxPiece && !is_end_[id]) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return pieces_[a] != pieces_[b] ? pieces_[a] < pieces_[b] : a < b;
  });

  nodes_.clear();
  token_ids_.clear();
  nodes_.push_back({0, 0, 0, 0});
  std::vector<int32_t> path = {0};  // path[d]: the node at depth d on the current branch
  std::string_view prev;
  for (int32_t id : ids) {
    const std::string_view p = pieces_[id];
    size_t common = 0;
    while (common < p.size() && common < prev.size() && p[common] == prev[common]) ++common;
    while (path.size() > common + 1) {
      nodes_[path.back()].subtree_end = static_cast<int32_t>(nodes_.size());
      path.pop_back();
    }
    for (size_t d = common; d < p.size(); ++d) {
      path.push_back(static_cast<int32_t>(nodes_.size()));
      nodes_.push_back({static_cast<uint8_t>(p[d]), static_cast<uint16_t>(d + 1), 0,
                        static_cast<int32_t>(token_ids_.size())});
    }
    token_ids_.push_back(id);
    max_depth_ = std::max(max_depth_, static_cast<int32_t>(p.size()));
    prev = p;
  }
  while (!path.empty()) {
    nodes_[path.back()].subtree_end = static_cast<int32_t>(nodes_.size());
    path.pop_back();
  }
  // The sentinel closes the last node's token list.
  nodes_.push_back(
      {0, 0, static_cast<int32_t>(nodes_.size()) + 1, static_cast<int32_t>(token_ids_.size())});
}

}  // namespace thermocline
