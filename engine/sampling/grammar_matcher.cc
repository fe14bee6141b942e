// The matcher's pushdown automaton (interned stacks and stack sets, the memoized step), the
// trie walk that builds a token mask, and the bounded tables.
#include "engine/sampling/grammar_matcher.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <utility>

namespace thermocline {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

uint64_t Mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 31);
}

uint64_t NodeKey(int32_t pos, int32_t parent) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(pos)) << 32) |
         static_cast<uint32_t>(parent + 1);
}

}  // namespace

int32_t TokenMask::count() const {
  int32_t n = 0;
  for (int32_t i = 0; i < n_words_; ++i) n += std::popcount(words_[i]);
  return n;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar,
                               std::shared_ptr<const TokenTrie> vocab,
                               const GrammarMatcherLimits& limits)
    : grammar_(std::move(grammar)),
      vocab_(std::move(vocab)),
      limits_(limits),
      byte_class_(grammar_->byte_classes()),
      n_classes_(grammar_->num_byte_classes()),
      n_words_((vocab_->vocab_size() + 63) / 64) {
  depth_sets_.assign(vocab_->max_depth() + 1, kDeadSet);
  mask_words_.assign(static_cast<size_t>(kMaskSlots) * n_words_, 0);
  ended_words_.assign(n_words_, 0);
  InitTables();
  Reset();
}

void GrammarMatcher::InitTables() {
  node_pos_.assign(1, -1);  // kAcceptNode
  node_parent_.assign(1, -1);
  node_ids_.clear();
  set_data_.clear();
  set_begin_.assign(2, 0);  // kDeadSet: empty
  set_can_end_.assign(1, 0);
  set_complete_.assign(1, 0);
  set_by_hash_.clear();
  set_next_same_hash_.assign(1, -1);
  trans_.assign(n_classes_, kDeadSet);  // the dead set stays dead
  slot_set_.fill(-1);

  work_.clear();
  visited_.clear();
  for (int32_t start : grammar_->alternatives(grammar_->root_rule())) Push(start, -1);
  RunClosure();
  initial_ = InternSet();
}

void GrammarMatcher::Reset() {
  state_ = initial_;
  ended_ = false;
}

int32_t GrammarMatcher::InternNode(int32_t pos, int32_t parent) {
  auto [it, inserted] =
      node_ids_.emplace(NodeKey(pos, parent), static_cast<int32_t>(node_pos_.size()));
  if (inserted) {
    node_pos_.push_back(pos);
    node_parent_.push_back(parent);
  }
  return it->second;
}

void GrammarMatcher::Push(int32_t pos, int32_t parent) {
  if (visited_.insert(NodeKey(pos, parent)).second) work_.emplace_back(pos, parent);
}

// Expands the work items until every stack has a byte set on top (or is the empty stack),
// collecting the stacks in scratch_out_. The compiler rejected left recursion, so expansion
// ends; `visited_` keeps each (position, parent) pair to one expansion.
void GrammarMatcher::RunClosure() {
  scratch_out_.clear();
  const Grammar& g = *grammar_;
  while (!work_.empty()) {
    auto [pos, parent] = work_.back();
    work_.pop_back();
    while (true) {
      const Grammar::Element& e = g.element(pos);
      if (e.kind == Grammar::Element::kEnd) {
        if (parent < 0) {
          scratch_out_.push_back(kAcceptNode);
          break;
        }
        // Resume the parent (never at an end: such continuations are not made, below).
        const int32_t up_pos = node_pos_[parent];
        const int32_t up_parent = node_parent_[parent];
        if (!visited_.insert(NodeKey(up_pos, up_parent)).second) break;
        pos = up_pos;
        parent = up_parent;
        continue;
      }
      if (e.kind == Grammar::Element::kBytes) {
        scratch_out_.push_back(InternNode(pos, parent));
        break;
      }
      // A rule: its alternatives, each continuing after the reference. A reference last in
      // its alternative continues straight with the parent, so loops keep a constant depth.
      const int32_t cont =
          g.element(pos + 1).kind == Grammar::Element::kEnd ? parent : InternNode(pos + 1, parent);
      for (int32_t start : g.alternatives(e.value)) Push(start, cont);
      break;
    }
  }
  std::sort(scratch_out_.begin(), scratch_out_.end());
  scratch_out_.erase(std::unique(scratch_out_.begin(), scratch_out_.end()), scratch_out_.end());
}

int32_t GrammarMatcher::InternSet() {
  if (scratch_out_.empty()) return kDeadSet;
  uint64_t h = scratch_out_.size();
  for (int32_t v : scratch_out_) h = Mix(h, static_cast<uint64_t>(v));
  auto it = set_by_hash_.find(h);
  if (it != set_by_hash_.end()) {
    for (int32_t s = it->second; s >= 0; s = set_next_same_hash_[s]) {
      const auto* begin = set_data_.data() + set_begin_[s];
      const size_t size = set_begin_[s + 1] - set_begin_[s];
      if (size == scratch_out_.size() && std::equal(begin, begin + size, scratch_out_.begin())) {
        return s;
      }
    }
  }
  const int32_t id = static_cast<int32_t>(set_begin_.size()) - 1;
  set_data_.insert(set_data_.end(), scratch_out_.begin(), scratch_out_.end());
  set_begin_.push_back(static_cast<uint32_t>(set_data_.size()));
  const bool can_end = scratch_out_.front() == kAcceptNode;  // sorted: node 0 comes first
  set_can_end_.push_back(can_end ? 1 : 0);
  set_complete_.push_back(can_end && scratch_out_.size() == 1 ? 1 : 0);
  if (it != set_by_hash_.end()) {
    set_next_same_hash_.push_back(it->second);
    it->second = id;
  } else {
    set_next_same_hash_.push_back(-1);
    set_by_hash_.emplace(h, id);
  }
  trans_.resize(trans_.size() + n_classes_, kUnknown);
  return id;
}

int32_t GrammarMatcher::ComputeNext(int32_t set, int32_t byte_class) {
  const Grammar& g = *grammar_;
  const uint8_t byte = g.class_representative(byte_class);
  work_.clear();
  visited_.clear();
  for (uint32_t i = set_begin_[set]; i < set_begin_[set + 1]; ++i) {
    const int32_t node = set_data_[i];
    if (node == kAcceptNode) continue;
    const int32_t pos = node_pos_[node];
    if (g.ByteInSet(g.element(pos).value, byte)) Push(pos + 1, node_parent_[node]);
  }
  RunClosure();
  const int32_t next = InternSet();
  trans_[static_cast<size_t>(set) * n_classes_ + byte_class] = next;
  return next;
}

int32_t GrammarMatcher::Walk(int32_t set, std::string_view bytes) {
  for (char c : bytes) {
    set = Next(set, static_cast<uint8_t>(c));
    if (set == kDeadSet) return kDeadSet;
  }
  return set;
}

bool GrammarMatcher::AcceptBytes(std::string_view bytes) {
  if (ended_) return false;
  MaybeCompact();
  const int32_t next = Walk(state_, bytes);
  if (next == kDeadSet) return false;
  state_ = next;
  return true;
}

bool GrammarMatcher::CanAcceptToken(int32_t id) {
  if (ended_ || id < 0 || id >= vocab_->vocab_size()) return false;
  if (vocab_->is_end(id)) return CanEnd();
  const std::string_view piece = vocab_->piece(id);
  return !piece.empty() && Walk(state_, piece) != kDeadSet;
}

bool GrammarMatcher::AcceptToken(int32_t id) {
  if (ended_ || id < 0 || id >= vocab_->vocab_size()) return false;
  if (vocab_->is_end(id)) {
    if (!CanEnd()) return false;
    ended_ = true;
    return true;
  }
  const std::string_view piece = vocab_->piece(id);
  return !piece.empty() && AcceptBytes(piece);
}

const TokenMask& GrammarMatcher::ComputeMask() {
  mask_.n_words_ = n_words_;
  mask_.vocab_size_ = vocab_->vocab_size();
  if (ended_) {
    mask_.words_ = ended_words_.data();
    return mask_;
  }
  MaybeCompact();
  for (int k = 0; k < kMaskSlots; ++k) {
    if (slot_set_[k] == state_) {
      mask_.words_ = mask_words_.data() + static_cast<size_t>(k) * n_words_;
      return mask_;
    }
  }
  const int slot = next_slot_;
  next_slot_ = (next_slot_ + 1) % kMaskSlots;
  uint64_t* words = mask_words_.data() + static_cast<size_t>(slot) * n_words_;
  std::fill(words, words + n_words_, 0);
  WalkTrie(words);
  if (set_can_end_[state_]) {
    for (int32_t id : vocab_->end_ids()) words[id >> 6] |= uint64_t{1} << (id & 63);
  }
  slot_set_[slot] = state_;
  mask_.words_ = words;
  return mask_;
}

// Depth-first over the trie in node order: a node's state is its parent's (one depth up)
// stepped by the node's byte; a dead state skips the node's whole subtree.
void GrammarMatcher::WalkTrie(uint64_t* words) {
  const TokenTrie::Node* nodes = vocab_->nodes();
  const int32_t* ids = vocab_->token_ids();
  const int32_t n = vocab_->num_nodes();
  int32_t* sets = depth_sets_.data();
  sets[0] = state_;
  int32_t i = 1;
  while (i < n) {
    const TokenTrie::Node& node = nodes[i];
    const int32_t s = Next(sets[node.depth - 1], node.byte);
    if (s == kDeadSet) {
      i = node.subtree_end;
      continue;
    }
    sets[node.depth] = s;
    for (int32_t t = node.tokens_begin; t < nodes[i + 1].tokens_begin; ++t) {
      words[ids[t] >> 6] |= uint64_t{1} << (ids[t] & 63);
    }
    ++i;
  }
}

void GrammarMatcher::ApplyMask(float* logits) {
  const TokenMask& mask = ComputeMask();
  const int32_t vocab = vocab_->vocab_size();
  for (int32_t w = 0; w < n_words_; ++w) {
    const uint64_t bits = mask.words_[w];
    if (bits == ~uint64_t{0}) continue;
    const int32_t base = w * 64;
    const int32_t end = std::min(base + 64, vocab);
    for (int32_t id = base; id < end; ++id) {
      if (!((bits >> (id - base)) & 1)) logits[id] = kNegInf;
    }
  }
}

// Rebuilds the tables holding only the current state's stacks once they pass their bounds.
// The memoized steps and cached masks go; they are recomputed as the output goes on.
void GrammarMatcher::MaybeCompact() {
  if (trans_.size() <= limits_.max_transitions && node_pos_.size() <= limits_.max_nodes) return;
  ++compactions_;
  const std::vector<int32_t> old_pos = node_pos_;
  const std::vector<int32_t> old_parent = node_parent_;
  const std::vector<int32_t> members(set_data_.begin() + set_begin_[state_],
                                     set_data_.begin() + set_begin_[state_ + 1]);
  InitTables();
  // Re-intern each stack bottom-up; `copied` maps old node ids to new ones.
  absl::flat_hash_map<int32_t, int32_t> copied;
  copied[kAcceptNode] = kAcceptNode;
  std::vector<int32_t> chain;
  std::vector<int32_t> new_members;
  for (int32_t top : members) {
    chain.clear();
    int32_t n = top;
    while (n >= 0 && !copied.contains(n)) {
      chain.push_back(n);
      n = old_parent[n];
    }
    int32_t parent = n < 0 ? -1 : copied[n];
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      parent = InternNode(old_pos[*it], parent);
      copied[*it] = parent;
    }
    new_members.push_back(copied[top]);
  }
  std::sort(new_members.begin(), new_members.end());
  scratch_out_ = std::move(new_members);
  state_ = InternSet();
}

}  // namespace thermocline
