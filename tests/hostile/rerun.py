#!/usr/bin/env python3
"""Reruns the hostile-client measurements of issue 23 against a daemon on the stories test model
and prints one line per figure: a gzip bomb, an endless chunked body, a body without a key,
slow clients against /health, a 64-client load, dropped non-streamed requests, large and
parallel /tokenize calls, the daemon's memory and descriptors before and after, and model files
attacked while served (a FIFO in a model's place, a file truncated mid-request). Not a
test (the figures depend on the machine); the regression tests are tests/integration/hostile_*.

Usage: rerun.py THERMOCLINE_BINARY MODELS_DIR
"""
import gzip
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def proc_field(pid, name):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(name + ":"):
            return int(line.split()[1])
    return -1


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


class Daemon:
    def __init__(self, binary, models, toml=""):
        self.dir = tempfile.mkdtemp(prefix="thermocline-rerun-")
        cfg = os.path.join(self.dir, "d.toml")
        with open(cfg, "w") as f:
            f.write(f'[[models]]\npath = "{models}/stories260K.gguf"\nname = "stories"\n\n'
                    f'[registry]\nstate_dir = "{self.dir}/state"\n\n{toml}\n')
        self.p = subprocess.Popen([binary, "serve", "--config", cfg, "--port", "0", "--grpc-port",
                                   "off", "--threads", "1"], stdout=subprocess.PIPE,
                                  stderr=open(os.path.join(self.dir, "log"), "w"), text=True)
        line = self.p.stdout.readline()
        self.port = int(re.search(r":(\d+)$", line.strip()).group(1))
        for _ in range(300):
            try:
                if request(self.port, "GET", "/health")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.02)

    def stop(self):
        self.p.terminate()
        self.p.wait(20)


def request(port, method, path, body=b"", headers=None, timeout=30):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    h = {"Host": "127.0.0.1", "Connection": "close"}
    if body or method == "POST":
        h["Content-Type"] = "application/json"
        h["Content-Length"] = str(len(body))
    h.update(headers or {})
    s.sendall(f"{method} {path} HTTP/1.1\r\n".encode() +
              "".join(f"{k}: {v}\r\n" for k, v in h.items()).encode() + b"\r\n" + body)
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    s.close()
    while data.startswith(b"HTTP/1.1 1"):  # interim responses
        data = data[data.index(b"\r\n\r\n") + 4:]
    status = int(data[9:12]) if data.startswith(b"HTTP/1.1 ") else 0
    return status, data[data.find(b"\r\n\r\n") + 4:]


def metric(port, name):
    _, body = request(port, "GET", "/metrics")
    m = re.search(rf"^{name} (\S+)$", body.decode(), re.M)
    return float(m.group(1)) if m else -1


def report(name, value):
    print(f"{name:58s} {value}")
    sys.stdout.flush()


def bodies(d):
    # A gzip body of 1 MiB that inflates to 1 GiB, sent with no key needed.
    raw = b'{"content":"' + b"a" * ((1 << 30) - 16) + b'"}'
    bomb = gzip.compress(raw, 9)
    del raw
    rss0 = proc_field(d.p.pid, "VmHWM")
    t = time.time()
    status, _ = request(d.port, "POST", "/tokenize", bomb, {"Content-Encoding": "gzip"})
    report(f"gzip bomb ({len(bomb) >> 10} KiB -> 1 GiB): status, s", f"{status}, {time.time() - t:.2f}")
    report("  daemon peak RSS before -> after (MiB)",
           f"{rss0 >> 10} -> {proc_field(d.p.pid, 'VmHWM') >> 10}")
    # An endless chunked body: answered before its end.
    s = socket.create_connection(("127.0.0.1", d.port), timeout=10)
    s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Transfer-Encoding: chunked\r\n\r\n")
    sent, t = 0, time.time()
    s.settimeout(0.001)
    answer = b""
    try:
        while sent < (64 << 20) and not answer:
            s.sendall(b"10000\r\n" + b"a" * 65536 + b"\r\n")
            sent += 65536
            try:
                answer = s.recv(200)
            except socket.timeout:
                pass
    except (BrokenPipeError, ConnectionResetError):
        pass
    s.settimeout(5)
    try:
        answer = answer or s.recv(200)
    except OSError:
        pass
    report("endless chunked body: status, MiB sent before it", f"{answer[9:12].decode()}, {sent >> 20}")


def key_first(binary, models):
    d = Daemon(binary, models, '[server]\napi_keys = ["k"]\n')
    s = socket.create_connection(("127.0.0.1", d.port), timeout=10)
    t = time.time()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: 4000000\r\n\r\n")
    answer = s.recv(100)
    report("body without a key (head only): status, s", f"{answer[9:12].decode()}, {time.time() - t:.3f}")
    d.stop()


def slow_clients(d, n):
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", d.port))
        s.sendall(b"G")
        socks.append(s)
    stop = threading.Event()

    def dribble():
        while not stop.is_set():
            for s in socks:
                try:
                    s.send(b"E")
                except OSError:
                    pass
            stop.wait(1.0)

    th = threading.Thread(target=dribble)
    th.start()
    lat = []
    for _ in range(20):
        t = time.time()
        status, _ = request(d.port, "GET", "/health", timeout=15)
        lat.append((time.time() - t, status))
        time.sleep(0.25)
    stop.set()
    th.join()
    for s in socks:
        s.close()
    ok = sum(1 for _, st in lat if st == 200)
    report(f"{n} slow clients (1 byte/s): /health 200s, median / max s",
           f"{ok}/20, {statistics.median(x for x, _ in lat):.3f} / {max(x for x, _ in lat):.3f}")


def load(d, clients=64, each=5):
    statuses, connects = {}, []
    lock = threading.Lock()
    body = json.dumps({"model": "stories", "prompt": "Once", "max_tokens": 8}).encode()

    def client():
        for _ in range(each):
            t = time.time()
            s = socket.create_connection(("127.0.0.1", d.port), timeout=60)
            c = time.time() - t
            s.close()
            status, _ = request(d.port, "POST", "/v1/completions", body, timeout=60)
            with lock:
                connects.append(c)
                statuses[status] = statuses.get(status, 0) + 1

    rss0, fd0 = proc_field(d.p.pid, "VmRSS"), fds(d.p.pid)
    ths = [threading.Thread(target=client) for _ in range(clients)]
    t = time.time()
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    connects.sort()
    report(f"{clients}-client load ({clients * each} requests): statuses, s",
           f"{dict(sorted(statuses.items()))}, {time.time() - t:.1f}")
    report("  connect time p99 / max (s)",
           f"{connects[int(len(connects) * 0.99) - 1]:.3f} / {connects[-1]:.3f}")
    time.sleep(1)
    report("  RSS MiB, fds: before -> after",
           f"{rss0 >> 10} -> {proc_field(d.p.pid, 'VmRSS') >> 10}, {fd0} -> {fds(d.p.pid)}")


def dropped(binary, models):
    d = Daemon(binary, models, "[scheduler]\nslots = 1\nqueue = 32\n[debug]\ndecode_delay_ms = 5\n")
    body = json.dumps({"model": "stories", "prompt": "Once", "max_tokens": 500,
                       "ignore_eos": True}).encode()
    before = metric(d.port, "thermocline_generated_tokens_total")
    socks = []
    for _ in range(18):
        s = socket.create_connection(("127.0.0.1", d.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        socks.append(s)
    time.sleep(0.5)
    at_drop = metric(d.port, "thermocline_generated_tokens_total")
    for s in socks:
        s.close()
    time.sleep(3)
    after = metric(d.port, "thermocline_generated_tokens_total")
    report("18 dropped non-streamed requests (500 tokens each): tokens before / after the drop",
           f"{at_drop - before:.0f} / {after - at_drop:.0f}")
    d.stop()


def tokenize(d):
    rss0 = proc_field(d.p.pid, "VmHWM")
    text = ("Once upon a time there was a little girl named Lily. " * 80000)
    status, _ = request(d.port, "POST", "/tokenize", json.dumps({"content": text[:(4 << 20) - 64]}).encode())
    report("/tokenize of 4 MiB: status", status)
    one = json.dumps({"content": text[:(1 << 20) - 64], "with_pieces": True}).encode()
    status, _ = request(d.port, "POST", "/tokenize", one)
    report("/tokenize of 1 MiB with pieces: status, peak RSS growth MiB",
           f"{status}, {(proc_field(d.p.pid, 'VmHWM') - rss0) >> 10}")
    results = []
    ths = [threading.Thread(target=lambda: results.append(request(d.port, "POST", "/tokenize",
                                                                  one)[0])) for _ in range(24)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    report("24 parallel 1 MiB /tokenize: statuses, peak RSS MiB",
           f"{sorted(set(results))}, {proc_field(d.p.pid, 'VmHWM') >> 10}")


def model_files(binary, models):
    work = tempfile.mkdtemp(prefix="thermocline-rerun-files-")
    copy = os.path.join(work, "copy.gguf")
    with open(f"{models}/stories260K.gguf", "rb") as src, open(copy, "wb") as dst:
        dst.write(src.read())
    d = Daemon(binary, models, f'[[models]]\npath = "{copy}"\nname = "copy"\n'
               "[debug]\ndecode_delay_ms = 20\n")
    body = json.dumps({"model": "copy", "prompt": "Once", "max_tokens": 8}).encode()
    request(d.port, "POST", "/v1/completions", body)
    os.remove(copy)
    os.mkfifo(copy)
    t = time.time()
    status, _ = request(d.port, "POST", "/v1/completions", body, timeout=30)
    report("model file replaced by a FIFO: status, s", f"{status}, {time.time() - t:.3f}")
    t = time.time()
    status, _ = request(d.port, "GET", "/admin/models", timeout=30)
    report("  then GET /admin/models: status, s", f"{status}, {time.time() - t:.3f}")
    d.stop()
    os.remove(copy)
    with open(f"{models}/stories260K.gguf", "rb") as src, open(copy, "wb") as dst:
        dst.write(src.read())
    d = Daemon(binary, models, f'[[models]]\npath = "{copy}"\nname = "copy"\n'
               "[debug]\ndecode_delay_ms = 20\n")
    s = socket.create_connection(("127.0.0.1", d.port), timeout=30)
    stream = json.dumps({"model": "copy", "prompt": "Once", "max_tokens": 300, "ignore_eos": True,
                         "stream": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              + f"Content-Length: {len(stream)}\r\nConnection: close\r\n\r\n".encode() + stream)
    s.recv(4096)
    os.truncate(copy, 4096)
    data = b""
    while True:
        try:
            chunk = s.recv(65536)
        except OSError:
            break
        if not chunk:
            break
        data += chunk
    alive = d.p.poll() is None
    other = request(d.port, "POST", "/v1/completions",
                    json.dumps({"model": "stories", "prompt": "Once", "max_tokens": 4}).encode())[0] \
        if alive else 0
    report("model file truncated mid-stream: daemon alive, error event, other model",
           f"{alive}, {b'model_failed' in data}, {other}")
    d.stop()


def main():
    binary, models = sys.argv[1], sys.argv[2]
    d = Daemon(binary, models)
    bodies(d)
    d.stop()
    key_first(binary, models)
    d = Daemon(binary, models)
    slow_clients(d, 26)
    slow_clients(d, 200)
    load(d)
    tokenize(d)
    d.stop()
    dropped(binary, models)
    model_files(binary, models)


if __name__ == "__main__":
    main()
