// SentencePiece BPE encoding as llama.cpp's llm_tokenizer_spm_session: the text is split into
// UTF-8 characters, then the adjacent pair whose concatenation is the highest-scoring token
// (leftmost on ties) is merged until no pair is a token; leftovers fall back to byte tokens.
#include "engine/tokenizer/spm_tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "engine/tokenizer/utf8.h"

namespace thermocline {
namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581 '▁'

std::string EscapeSpaces(std::string_view text) {
  std::string out;
  out.reserve(text.size() + text.size() / 4);
  for (char c : text) {
    if (c == ' ') {
      out.append(kSpaceMark);
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string UnescapeSpaces(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    if (text.substr(pos, kSpaceMark.size()) == kSpaceMark) {
      out.push_back(' ');
      pos += kSpaceMark.size();
    } else {
      out.push_back(text[pos++]);
    }
  }
  return out;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// "<0xNN>" -> NN, or -1.
int ParseByteToken(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  const int hi = HexDigit(text[3]);
  const int lo = HexDigit(text[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// Calls f(start, length, code) for each character of `text`: a well-formed UTF-8 sequence
// (code = its code point) or a single ill-formed byte (code = 0x110000 + byte). Unlike
// llama.cpp, which trusts the lead byte, an ill-formed byte never swallows the next character.
template <typename F>
void ForEachChar(std::string_view text, F&& f) {
  for (size_t pos = 0; pos < text.size();) {
    const Utf8Scan scan = ScanUtf8(text, pos);
    if (scan.kind == Utf8Scan::kComplete) {
      f(pos, scan.length, scan.codepoint);
      pos += scan.length;
    } else {
      f(pos, 1, 0x110000 + static_cast<uint8_t>(text[pos]));
      pos += 1;
    }
  }
}

uint64_t PairKey(uint32_t first, uint32_t second) {
  return (static_cast<uint64_t>(first) << 32) | second;
}

// A run of the input: bytes [start, start + n) of the escaped text, linked to its neighbours.
// n == 0 once merged into the symbol on its left.
struct Symbol {
  int32_t prev;
  int32_t next;
  uint32_t start;
  uint32_t n;
};

struct Bigram {
  float score;
  int32_t left;
  int32_t right;
  uint32_t size;  // bytes of the merged text, to spot stale entries
};

// Highest score first; on ties the leftmost pair.
struct BigramOrder {
  bool operator()(const Bigram& l, const Bigram& r) const {
    return l.score < r.score || (l.score == r.score && l.left > r.left);
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> NewSpmTokenizer(TokenizerVocab vocab) {
  absl::StatusOr<std::unique_ptr<SpmTokenizer>> tokenizer = SpmTokenizer::Create(std::move(vocab));
  if (!tokenizer.ok()) return tokenizer.status();
  return std::unique_ptr<Tokenizer>(std::move(*tokenizer));
}

absl::StatusOr<std::unique_ptr<SpmTokenizer>> SpmTokenizer::Create(TokenizerVocab vocab) {
  std::unique_ptr<SpmTokenizer> t(new SpmTokenizer());
  if (absl::Status s = t->InitCommon(vocab); !s.ok()) return s;
  t->scores_ = std::move(vocab.scores);

  const int32_t n = t->vocab_size();
  t->token_to_id_.reserve(n);
  t->pieces_.resize(n);
  for (int32_t id = 0; id < n; ++id) {
    const std::string& text = t->tokens_[id];
    t->token_to_id_.insert_or_assign(text, id);  // duplicates: the last id wins, as llama.cpp
    switch (t->token_types_[id]) {
      case kTypeNormal:
        t->pieces_[id] = UnescapeSpaces(text);
        break;
      case kTypeUserDefined:
        t->pieces_[id] = text;  // verbatim, as llama.cpp
        break;
      case kTypeByte: {
        const int byte = ParseByteToken(text);
        t->pieces_[id] = byte >= 0 ? std::string(1, static_cast<char>(byte)) : UnescapeSpaces(text);
        break;
      }
      default:  // control, unknown, unused: not text
        break;
    }
  }
  for (const std::string& text : t->tokens_) {
    uint32_t prev = 0;
    bool first = true;
    ForEachChar(text, [&](size_t, size_t, uint32_t code) {
      if (!first) t->inner_pairs_.insert(PairKey(prev, code));
      prev = code;
      first = false;
    });
  }
  // Byte fallback as llama.cpp's byte_to_token: "<0xNN>", else the one-byte token itself.
  for (int b = 0; b < 256; ++b) {
    char name[7];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    int32_t id = t->Lookup(name);
    if (id < 0) id = t->Lookup(std::string(1, static_cast<char>(b)));
    t->byte_ids_[b] = id;
  }
  return t;
}

int32_t SpmTokenizer::Lookup(std::string_view text) const {
  auto it = token_to_id_.find(AbslView(text));
  return it == token_to_id_.end() ? -1 : it->second;
}

std::string SpmTokenizer::TokenToPiece(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return pieces_[id];
}

std::vector<int32_t> SpmTokenizer::Encode(std::string_view text, bool add_bos) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && bos_id_ >= 0) out.push_back(bos_id_);
  // As llama.cpp: a space goes before the text and after every user-defined token.
  bool prev_was_token = true;
  for (const Fragment& fragment : SplitUserDefined(text)) {
    if (fragment.token >= 0) {
      out.push_back(fragment.token);
      prev_was_token = true;
      continue;
    }
    std::string raw;
    if (add_space_prefix_ && prev_was_token) raw.push_back(' ');
    raw.append(fragment.text);
    EncodeEscaped(EscapeSpaces(raw), &out);
    prev_was_token = false;
  }
  return out;
}

void SpmTokenizer::EncodeEscaped(std::string_view text, std::vector<int32_t>* out) const {
  // One symbol per character. Links are cut between two characters that no token holds side
  // by side: no merge can cross there, so each chunk merges on its own, with the same result
  // as one queue over the whole text but far smaller queues.
  std::vector<Symbol> symbols;
  std::vector<int32_t> chunk_starts;
  symbols.reserve(text.size());
  uint32_t prev_code = 0;
  ForEachChar(text, [&](size_t start, size_t len, uint32_t code) {
    const int32_t index = static_cast<int32_t>(symbols.size());
    const bool joined = index > 0 && inner_pairs_.contains(PairKey(prev_code, code));
    if (joined) {
      symbols.back().next = index;
    } else {
      chunk_starts.push_back(index);
    }
    symbols.push_back(
        {joined ? index - 1 : -1, -1, static_cast<uint32_t>(start), static_cast<uint32_t>(len)});
    prev_code = code;
  });

  std::vector<Bigram> queue;  // a heap: BigramOrder's greatest on top
  const auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[left];
    const uint32_t size = l.n + symbols[right].n;
    const int32_t id = Lookup(text.substr(l.start, size));
    if (id < 0) return;
    queue.push_back({scores_[id], left, right, size});
    std::push_heap(queue.begin(), queue.end(), BigramOrder());
  };
  for (size_t c = 0; c < chunk_starts.size(); ++c) {
    const int32_t begin = chunk_starts[c];
    const int32_t end =
        c + 1 < chunk_starts.size() ? chunk_starts[c + 1] : static_cast<int32_t>(symbols.size());
    queue.clear();
    for (int32_t i = begin + 1; i < end; ++i) try_add(i - 1, i);
    while (!queue.empty()) {
      std::pop_heap(queue.begin(), queue.end(), BigramOrder());
      const Bigram bigram = queue.back();
      queue.pop_back();
      Symbol& left = symbols[bigram.left];
      Symbol& right = symbols[bigram.right];
      if (left.n == 0 || right.n == 0 || left.n + right.n != bigram.size) continue;  // stale
      left.n += right.n;
      right.n = 0;
      left.next = right.next;
      if (right.next >= 0) symbols[right.next].prev = bigram.left;
      try_add(left.prev, bigram.left);
      try_add(bigram.left, left.next);
    }
  }

  for (int32_t start : chunk_starts) {
    for (int32_t i = start; i != -1; i = symbols[i].next) {
      const std::string_view piece = text.substr(symbols[i].start, symbols[i].n);
      const int32_t id = Lookup(piece);
      if (id >= 0) {
        out->push_back(id);
      } else {
        EmitFallback(piece, out);
      }
    }
  }
}

void SpmTokenizer::EmitFallback(std::string_view symbol, std::vector<int32_t>* out) const {
  for (char c : symbol) {
    if (byte_ids_[static_cast<uint8_t>(c)] < 0) {
      // No byte fallback (llama.cpp would throw here): the whole character is unknown.
      if (unk_id_ >= 0) out->push_back(unk_id_);
      return;
    }
  }
  for (char c : symbol) out->push_back(byte_ids_[static_cast<uint8_t>(c)]);
}

}  // namespace thermocline
