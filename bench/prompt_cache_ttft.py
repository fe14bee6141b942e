#!/usr/bin/python3
"""Turn-2 time to first token with and without the prompt (prefix) cache.

Usage: bench/prompt_cache_ttft.py THERMOCLINE_BINARY MODEL.gguf [history_words] [reps] [threads]

Starts `thermocline serve` on the model twice (with the cache, then with --no-prompt-cache),
and for each of `reps` conversations sends turn 1 (a system message and a long user message:
about `history_words` tokens on a TinyStories vocabulary) and turn 2 (the whole conversation with
turn 1's reply and a short new question), streamed, greedy. Prints the median time to first
token (client side: from sending the request to the first content chunk) of each turn and the
prompt tokens computed (from usage). A benchmark, not a test: the figures depend on the machine.
"""
import http.client
import json
import statistics
import subprocess
import sys
import time

WORDS = ["the", "cat", "sat", "on", "a", "big", "red", "mat", "and", "Lily", "saw", "dog",
         "run", "to", "park", "sun"]


def story(n, seed):
    return " ".join(WORDS[(i * 7 + seed * 3 + i // 5) % 16] for i in range(n)) + "."


def start(binary, model, threads, extra):
    proc = subprocess.Popen([binary, "serve", "-m", model + "=m", "--port", "0", "--grpc-port",
                             "off", "--threads", str(threads), "--log-level", "warn"] + extra,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    marker = "listening on http://127.0.0.1:"
    for line in proc.stdout:
        if marker in line:
            port = int(line.split(marker)[1].split()[0].strip("/"))
            break
    else:
        raise RuntimeError("the daemon did not start")
    for _ in range(600):  # until the model is loaded
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/health")
        if conn.getresponse().status == 200:
            return proc, port
        time.sleep(0.05)
    raise RuntimeError("the daemon did not become healthy")


def chat(port, messages):
    """Streams one greedy chat request; returns (ttft seconds, reply text, usage)."""
    body = json.dumps({"model": "m", "messages": messages, "max_tokens": 16, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    ttft, text, usage = None, "", None
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        if event.get("usage"):
            usage = event["usage"]
        for choice in event.get("choices", []):
            piece = choice.get("delta", {}).get("content") or ""
            if piece and ttft is None:
                ttft = time.perf_counter() - t0
            text += piece
    conn.close()
    return ttft, text, usage


def run(binary, model, words, reps, threads, extra):
    proc, port = start(binary, model, threads, extra)
    try:
        t1, t2, c1, c2 = [], [], [], []
        for r in range(reps):
            messages = [{"role": "system", "content": "You tell short stories."},
                        {"role": "user", "content": story(words, r)}]
            ttft, reply, usage = chat(port, messages)
            t1.append(ttft)
            c1.append(usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"])
            messages += [{"role": "assistant", "content": reply},
                         {"role": "user", "content": "What happened next?"}]
            ttft, _, usage = chat(port, messages)
            t2.append(ttft)
            c2.append(usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"])
            prompt2 = usage["prompt_tokens"]
        return {"turn1_ttft_ms": 1e3 * statistics.median(t1),
                "turn2_ttft_ms": 1e3 * statistics.median(t2),
                "turn1_computed": statistics.median(c1),
                "turn2_computed": statistics.median(c2), "turn2_prompt_tokens": prompt2}
    finally:
        proc.terminate()
        proc.wait()


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    binary, model = sys.argv[1], sys.argv[2]
    words = int(sys.argv[3]) if len(sys.argv) > 3 else 240
    reps = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    threads = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    for name, extra in (("cache", []), ("no cache", ["--no-prompt-cache"])):
        r = run(binary, model, words, reps, threads, extra)
        print(f"{name:9s} turn 1: {r['turn1_computed']:.0f} prompt tokens computed, "
              f"TTFT {r['turn1_ttft_ms']:.2f} ms; turn 2 ({r['turn2_prompt_tokens']} prompt "
              f"tokens): {r['turn2_computed']:.0f} computed, TTFT {r['turn2_ttft_ms']:.2f} ms")


if __name__ == "__main__":
    main()
