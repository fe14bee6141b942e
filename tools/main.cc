// thermocline: one binary, subcommands in the style of ollama / llama.cpp tools.
#include <cstdio>
#include <cstring>
#include <string>

#include "tools/commands.h"

namespace {

struct Command {
  const char* name;
  int (*run)(int argc, char** argv);
  const char* help;
};

constexpr Command kCommands[] = {
    {"serve", thermocline::cli::RunServe, "run the daemon: OpenAI-compatible HTTP API"},
    {"generate", thermocline::cli::RunGenerate, "generate text from a prompt (no daemon)"},
    {"inspect", thermocline::cli::RunInspect, "print a GGUF file's metadata and tensors"},
    {"perplexity", thermocline::cli::RunPerplexity, "perplexity of a model on a text file"},
    {"bench", thermocline::cli::RunBench, "prefill/decode speed and memory bandwidth"},
    {"quantize", thermocline::cli::RunQuantize,
     "convert a GGUF model to another type (llama-quantize's mixes: q4_k_m, q8_0, ...)"},
    {"synth", thermocline::cli::RunSynth, "write a random-weight llama GGUF of any shape"},
    {"profile", thermocline::cli::RunProfile,
     "profile neuron activity, train predictors (sidecar)"},
    {"solve", thermocline::cli::RunSolve, "place hot neurons on the GPU (ILP) into the sidecar"},
    {"models", thermocline::cli::RunModels, "register, list, show, rm models of a running daemon"},
    {"run", thermocline::cli::RunChat, "chat with a model of a running daemon (streaming)"},
};

void Usage() {
  std::fprintf(stderr, "usage: thermocline <command> [options]\n\ncommands:\n");
  for (const Command& c : kCommands) std::fprintf(stderr, "  %-12s %s\n", c.name, c.help);
  std::fprintf(stderr, "\n'thermocline <command> --help' shows a command's options.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    Usage();
    return argc < 2 ? 2 : 0;
  }
  for (const Command& c : kCommands) {
    if (std::strcmp(argv[1], c.name) == 0) return c.run(argc - 2, argv + 2);
  }
  std::fprintf(stderr, "thermocline: unknown command '%s'\n\n", argv[1]);
  Usage();
  return 2;
}
