// Byte-level BPE as llama.cpp's llm_tokenizer_bpe_session: per pre-tokenizer piece, one symbol
// per byte (spelled with bytes_to_unicode), then the adjacent pair with the lowest merge rank
// (leftmost on ties) is merged until no pair has a rank.
#include "engine/tokenizer/bpe_tokenizer.h"

#include <array>
#include <queue>
#include <utility>

#include "engine/tokenizer/utf8.h"

namespace thermocline {
namespace {

struct ByteAlphabet {
  std::array<uint32_t, 256> codepoint;
  std::array<std::string, 256> spelled;  // UTF-8 of codepoint
  std::array<int16_t, 0x144> byte_of;    // code point -> byte, -1 if it stands for none
};

const ByteAlphabet& Alphabet() {
  static const ByteAlphabet alphabet = [] {
    ByteAlphabet a;
    a.byte_of.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      a.codepoint[b] = printable ? b : next++;
      AppendUtf8(a.codepoint[b], &a.spelled[b]);
      a.byte_of[a.codepoint[b]] = static_cast<int16_t>(b);
    }
    return a;
  }();
  return alphabet;
}

// Token text (spelled bytes) back to the bytes; characters outside the alphabet are kept.
std::string UnspellBytes(std::string_view text) {
  const ByteAlphabet& a = Alphabet();
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const Utf8Scan scan = ScanUtf8(text, pos);
    const size_t len = scan.kind == Utf8Scan::kComplete ? scan.length : 1;
    if (scan.kind == Utf8Scan::kComplete && scan.codepoint < a.byte_of.size() &&
        a.byte_of[scan.codepoint] >= 0) {
      out.push_back(static_cast<char>(a.byte_of[scan.codepoint]));
    } else {
      out.append(text.substr(pos, len));
    }
    pos += len;
  }
  return out;
}

// A run of a piece: bytes [start, start + n) of its spelled text; n == 0 once merged left.
struct Symbol {
  int32_t prev;
  int32_t next;
  uint32_t start;
  uint32_t n;
};

struct Bigram {
  int32_t rank;
  int32_t left;
  int32_t right;
  uint32_t left_n;  // sizes when queued, to spot stale entries
  uint32_t right_n;
};

// Lowest rank first; on ties the leftmost pair.
struct BigramOrder {
  bool operator()(const Bigram& l, const Bigram& r) const {
    return l.rank > r.rank || (l.rank == r.rank && l.left > r.left);
  }
};

}  // namespace

uint32_t BpeByteToCodepoint(uint8_t byte) { return Alphabet().codepoint[byte]; }

std::string BpeSpellBytes(std::string_view bytes) {
  const ByteAlphabet& a = Alphabet();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out.append(a.spelled[static_cast<uint8_t>(c)]);
  return out;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> NewBpeTokenizer(TokenizerVocab vocab) {
  absl::StatusOr<std::unique_ptr<BpeTokenizer>> tokenizer = BpeTokenizer::Create(std::move(vocab));
  if (!tokenizer.ok()) return tokenizer.status();
  return std::unique_ptr<Tokenizer>(std::move(*tokenizer));
}

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::Create(TokenizerVocab vocab) {
  const std::optional<PreTokenizerKind> pre = PreTokenizerFromName(vocab.pre);
  if (!pre) return UnsupportedPreTokenizer(vocab.pre);
  std::unique_ptr<BpeTokenizer> t(new BpeTokenizer());
  if (absl::Status s = t->InitCommon(vocab); !s.ok()) return s;
  t->pre_ = *pre;
  t->ignore_merges_ = t->pre_ == PreTokenizerKind::kLlama3;

  const int32_t n = t->vocab_size();
  t->token_to_id_.reserve(n);
  t->pieces_.resize(n);
  for (int32_t id = 0; id < n; ++id) {
    const std::string& text = t->tokens_[id];
    t->token_to_id_.insert_or_assign(text, id);  // duplicates: the last id wins, as llama.cpp
    switch (t->token_types_[id]) {
      case kTypeNormal:
      case kTypeByte:
        t->pieces_[id] = UnspellBytes(text);
        break;
      case kTypeUserDefined:
        t->pieces_[id] = text;  // verbatim, as llama.cpp
        break;
      default:  // control, unknown, unused: not text
        break;
    }
  }
  // "left right"; the split is at the first space after the first byte (llama.cpp), and spelled
  // text has no spaces, so the merge string itself is the key. The first rank of a pair wins.
  t->merge_ranks_.reserve(vocab.merges.size());
  for (size_t rank = 0; rank < vocab.merges.size(); ++rank) {
    const std::string& merge = vocab.merges[rank];
    if (merge.find(' ', 1) == std::string::npos) continue;
    t->merge_ranks_.try_emplace(merge, static_cast<int32_t>(rank));
  }
  return t;
}

int32_t BpeTokenizer::Lookup(std::string_view text) const {
  auto it = token_to_id_.find(AbslView(text));
  return it == token_to_id_.end() ? -1 : it->second;
}

int32_t BpeTokenizer::MergeRank(std::string_view left, std::string_view right,
                                std::string* key) const {
  key->assign(left);
  key->push_back(' ');
  key->append(right);
  auto it = merge_ranks_.find(AbslView(*key));
  return it == merge_ranks_.end() ? -1 : it->second;
}

std::string BpeTokenizer::TokenToPiece(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return pieces_[id];
}

std::vector<int32_t> BpeTokenizer::Encode(std::string_view text, bool add_bos) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && bos_id_ >= 0) out.push_back(bos_id_);
  for (const Fragment& fragment : SplitUserDefined(text)) {
    if (fragment.token >= 0) {
      out.push_back(fragment.token);
      continue;
    }
    for (std::string_view word : PreTokenize(fragment.text, pre_)) EncodeWord(word, &out);
  }
  return out;
}

void BpeTokenizer::EncodeWord(std::string_view word, std::vector<int32_t>* out) const {
  const ByteAlphabet& a = Alphabet();
  std::string spelled;
  std::vector<Symbol> symbols;
  spelled.reserve(word.size() * 2);
  symbols.reserve(word.size());
  for (size_t i = 0; i < word.size(); ++i) {
    const std::string& s = a.spelled[static_cast<uint8_t>(word[i])];
    const int32_t index = static_cast<int32_t>(i);
    symbols.push_back({index - 1, i + 1 == word.size() ? -1 : index + 1,
                       static_cast<uint32_t>(spelled.size()), static_cast<uint32_t>(s.size())});
    spelled.append(s);
  }
  if (symbols.empty()) return;
  if (ignore_merges_) {
    if (const int32_t id = Lookup(spelled); id >= 0) {
      out->push_back(id);
      return;
    }
  }

  const std::string_view text = spelled;
  const auto piece = [&](const Symbol& s) { return text.substr(s.start, s.n); };
  std::string key;
  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue;
  const auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const int32_t rank = MergeRank(piece(symbols[left]), piece(symbols[right]), &key);
    if (rank < 0) return;
    queue.push({rank, left, right, symbols[left].n, symbols[right].n});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Bigram bigram = queue.top();
    queue.pop();
    Symbol& left = symbols[bigram.left];
    Symbol& right = symbols[bigram.right];
    if (left.n != bigram.left_n || right.n != bigram.right_n || right.n == 0) continue;  // stale
    left.n += right.n;
    right.n = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = bigram.left;
    try_add(left.prev, bigram.left);
    try_add(bigram.left, left.next);
  }

  for (int32_t i = 0; i != -1; i = symbols[i].next) {
    const std::string_view p = piece(symbols[i]);
    if (const int32_t id = Lookup(p); id >= 0) {
      out->push_back(id);
      continue;
    }
    // Not a token: one token per byte (every byte is one in a complete byte-level vocabulary).
    for (size_t pos = 0; pos < p.size();) {
      const Utf8Scan scan = ScanUtf8(p, pos);
      const size_t len = scan.kind == Utf8Scan::kComplete ? scan.length : 1;
      const int32_t id = Lookup(p.substr(pos, len));
      if (id >= 0) {
        out->push_back(id);
      } else if (unk_id_ >= 0) {
        out->push_back(unk_id_);
      }
      pos += len;
    }
  }
}

}  // namespace thermocline
