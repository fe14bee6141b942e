// Grammar-constrained decoding: the parse state of one output under a Grammar, and the mask of
// the vocabulary tokens that may come next.
//
// The state is a set of parse stacks (a pushdown automaton over bytes). Stacks are shared,
// persistent lists interned by content, and so are stack sets, so a state is one integer and
// the step "state, byte class -> state" is memoized in a table. The mask walks the vocabulary
// trie (TokenTrie) depth-first with one state per depth, skipping every subtree whose prefix
// the grammar rejects; masks of recent states are cached, so a state that recurs (inside a
// string, a run of digits, whitespace) costs a lookup. End-of-generation tokens are allowed
// exactly when the grammar can end.
//
// Typical use in a decode loop (one matcher per request; not thread-safe):
//   GrammarMatcher m(grammar, trie);       // both shared, immutable
//   loop: if (m.IsComplete()) stop;        // nothing but the end can follow
//         m.ApplyMask(logits);             // disallowed logits -> -inf
//         id = sampler.Sample(logits, ...);
//         m.AcceptToken(id);               // true for every id the mask allowed
//         if (m.ended()) stop;             // an end token was accepted
// After a warm-up the loop allocates nothing unless the output reaches states not seen before;
// the tables it keeps are bounded and rebuilt from the current state when they outgrow that.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/types/span.h"
#include "engine/sampling/grammar.h"
#include "engine/sampling/token_trie.h"

namespace thermocline {

// Which tokens are allowed: bit id of words (word id / 64, bit id % 64) set. A view into the
// matcher; valid until its next call other than const ones.
class TokenMask {
 public:
  bool allowed(int32_t id) const { return (words_[id >> 6] >> (id & 63)) & 1; }
  absl::Span<const uint64_t> words() const { return {words_, static_cast<size_t>(n_words_)}; }
  int32_t vocab_size() const { return vocab_size_; }
  int32_t count() const;  // allowed tokens

 private:
  friend class GrammarMatcher;
  const uint64_t* words_ = nullptr;
  int32_t n_words_ = 0;
  int32_t vocab_size_ = 0;
};

// Bounds of the matcher's memo tables; past them the tables are rebuilt from the current state.
struct GrammarMatcherLimits {
  size_t max_transitions = size_t{4} << 20;  // memoized steps (int32 each): 16 MiB
  size_t max_nodes = size_t{1} << 20;        // stack nodes
};

class GrammarMatcher {
 public:
  GrammarMatcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> vocab,
                 const GrammarMatcherLimits& limits = {});
  // Copies share the grammar and trie and carry the state and tables (tests branch with this).
  GrammarMatcher(const GrammarMatcher&) = default;
  GrammarMatcher& operator=(const GrammarMatcher&) = default;

  // The tokens that may come next. An empty mask happens only when the grammar needs text that
  // no token spells (a vocabulary without byte tokens) or after ended(); callers should then
  // stop (IsComplete() tells the usual case apart).
  const TokenMask& ComputeMask();
  // ComputeMask(), then logits[id] = -inf for every disallowed id (vocab_size() floats).
  void ApplyMask(float* logits);

  // Advances past token `id` and returns true if the grammar allows it here; otherwise returns
  // false and leaves the state as it was. An end-of-generation token is allowed when CanEnd(),
  // and ends the output (ended()).
  bool AcceptToken(int32_t id);
  // The same for raw bytes (all or nothing); does not end the output.
  bool AcceptBytes(std::string_view bytes);
  // Whether AcceptToken(id) would succeed, without changing the state. Cheap (one memoized step
  // per byte): a greedy decode loop can try the argmax before it pays for a mask.
  bool CanAcceptToken(int32_t id);

  // The text so far is a complete sentence of the grammar (an end token may come now).
  bool CanEnd() const { return ended_ || set_can_end_[state_] != 0; }
  // Nothing but the end may come: the output is complete and cannot continue.
  bool IsComplete() const { return ended_ || set_complete_[state_] != 0; }
  // An end-of-generation token was accepted.
  bool ended() const { return ended_; }
  // Back to the empty output (the memoized tables are kept).
  void Reset();

  int32_t vocab_size() const { return vocab_->vocab_size(); }
  // Interned stack sets so far, and how often the tables were rebuilt (for tests and
  // benchmarks: how much state the tables hold).
  int32_t num_states() const { return static_cast<int32_t>(set_begin_.size()) - 1; }
  int32_t num_compactions() const { return compactions_; }

 private:
  static constexpr int32_t kAcceptNode = 0;  // the empty stack: the grammar may end
  static constexpr int32_t kDeadSet = 0;     // the empty set: nothing matches
  static constexpr int32_t kUnknown = -1;    // a transition not computed yet
  static constexpr int kMaskSlots = 16;      // masks of recent states kept

  void InitTables();
  int32_t InternNode(int32_t pos, int32_t parent);
  int32_t InternSet();  // of the sorted, unique scratch_out_
  void Push(int32_t pos, int32_t parent);
  void RunClosure();
  int32_t ComputeNext(int32_t set, int32_t byte_class);
  int32_t Next(int32_t set, uint8_t byte) {
    const int32_t t = trans_[static_cast<size_t>(set) * n_classes_ + byte_class_[byte]];
    return t != kUnknown ? t : ComputeNext(set, byte_class_[byte]);
  }
  int32_t Walk(int32_t set, std::string_view bytes);  // kDeadSet if rejected
  void MaybeCompact();
  void WalkTrie(uint64_t* words);

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const TokenTrie> vocab_;
  GrammarMatcherLimits limits_;
  std::array<uint8_t, 256> byte_class_;
  int32_t n_classes_;

  // Stack nodes: (position of the next element, parent node or -1 for the bottom).
  std::vector<int32_t> node_pos_;
  std::vector<int32_t> node_parent_;
  absl::flat_hash_map<uint64_t, int32_t> node_ids_;
  // Stack sets: sorted node ids, set i at set_data_[set_begin_[i], set_begin_[i + 1]).
  std::vector<int32_t> set_data_;
  std::vector<uint32_t> set_begin_;
  std::vector<uint8_t> set_can_end_;
  std::vector<uint8_t> set_complete_;
  absl::flat_hash_map<uint64_t, int32_t> set_by_hash_;  // first set of each content hash
  std::vector<int32_t> set_next_same_hash_;
  std::vector<int32_t> trans_;  // [set * n_classes_ + class] -> set, or kUnknown

  int32_t initial_ = kDeadSet;
  int32_t state_ = kDeadSet;
  bool ended_ = false;
  int32_t compactions_ = 0;

  // Scratch of the closure computation.
  std::vector<std::pair<int32_t, int32_t>> work_;
  std::vector<int32_t> scratch_out_;
  absl::flat_hash_set<uint64_t> visited_;
  std::vector<int32_t> depth_sets_;

  // Masks of recent states: slot k covers mask_words_[k * n_words_, (k + 1) * n_words_).
  int32_t n_words_;
  std::vector<uint64_t> mask_words_;
  std::array<int32_t, kMaskSlots> slot_set_;
  int next_slot_ = 0;
  std::vector<uint64_t> ended_words_;  // all zero: the mask after ended()
  TokenMask mask_;
};

}  // namespace thermocline
