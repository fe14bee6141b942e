"""The gRPC API from Python (grpcio) against a real `thermocline serve`: streamed Generate and
Chat give the HTTP API's greedy text, cancellation and deadlines free the slot, health is
SERVING, and unknown models / missing keys get NOT_FOUND / UNAUTHENTICATED.

Usage: test_grpc.py THERMOCLINE_BINARY (run.sh generates the stubs and sets PYTHONPATH).
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

import grpc

import health_pb2
import health_pb2_grpc
from thermocline.v1 import inference_pb2
from thermocline.v1 import inference_pb2_grpc

BINARY = sys.argv[1] if len(sys.argv) > 1 else "build/tools/thermocline"
HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.environ.get("THERMOCLINE_TEST_MODELS") or os.path.join(HERE, "..", "..", "..",
                                                                   "shared", "models")
MODEL_PATH = os.path.join(MODELS, "stories260K.gguf")
KEY = "py-key"
AUTH = (("authorization", "Bearer " + KEY),)


class Daemon:
    """`thermocline serve` on free HTTP and gRPC ports: one slot, slowed to 20 ms a token."""

    def __init__(self):
        self.dir = tempfile.TemporaryDirectory()
        config = os.path.join(self.dir.name, "config.toml")
        with open(config, "w") as f:
            f.write(f'[server]\napi_keys = ["{KEY}"]\n'
                    '[scheduler]\nslots = 1\nqueue = 4\n'
                    '[debug]\ndecode_delay_ms = 20\n'
                    f'[registry]\nstate_dir = "{self.dir.name}/state"\n'
                    f'[[models]]\npath = "{MODEL_PATH}"\nname = "stories"\n')
        self.log = open(os.path.join(self.dir.name, "log"), "w+")
        self.proc = subprocess.Popen(
            [BINARY, "serve", "--config", config, "--port", "0", "--grpc-port", "0",
             "--threads", "1"], stdout=subprocess.PIPE, stderr=self.log, text=True)
        lines = [self.proc.stdout.readline(), self.proc.stdout.readline()]
        http = re.search(r"listening on http://127\.0\.0\.1:(\d+)", lines[0])
        rpc = re.search(r"grpc listening on 127\.0\.0\.1:(\d+)", lines[1])
        if not http or not rpc:
            self.stop()
            raise RuntimeError(f"unexpected daemon output: {lines}")
        self.http_port, self.grpc_port = int(http.group(1)), int(rpc.group(1))
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        self.stub = inference_pb2_grpc.InferenceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        deadline = time.time() + 30
        while time.time() < deadline:
            status = self.health.Check(health_pb2.HealthCheckRequest(), timeout=5).status
            if status == health_pb2.HealthCheckResponse.SERVING:
                return
            time.sleep(0.05)
        raise RuntimeError("the daemon did not become SERVING")

    def http(self, path, body=None):
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.http_port}{path}",
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": "Bearer " + KEY, "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            data = r.read().decode()
        return data if path == "/metrics" else json.loads(data)

    def metric(self, series):
        for line in self.http("/metrics").splitlines():
            if line.startswith(series + " "):
                return float(line.split()[-1])
        return -1

    def stop(self):
        if getattr(self, "channel", None) is not None:
            self.channel.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
        self.dir.cleanup()


def greedy(max_tokens):
    return inference_pb2.GenerationOptions(max_tokens=max_tokens, temperature=0)


def collect(stream):
    messages = list(stream)
    return messages, "".join(m.text for m in messages)


class GrpcTest(unittest.TestCase):
    daemon = None

    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def check_final(self, messages):
        self.assertGreaterEqual(len(messages), 2)  # streamed, not one block
        for m in messages[:-1]:
            self.assertEqual(m.stop_reason, inference_pb2.GenerateResponse.STOP_REASON_UNSPECIFIED)
        last = messages[-1]
        ids = sum(len(m.token_ids) for m in messages)
        if last.stop_reason == inference_pb2.GenerateResponse.STOP_SEQUENCE:
            # A stop string may swallow the text of the last tokens: counted, not sent.
            self.assertLessEqual(ids, last.usage.completion_tokens)
        else:
            self.assertEqual(last.usage.completion_tokens, ids)
        self.assertGreater(last.timings.total_seconds, 0)
        return last

    def test_generate_streams_the_http_greedy_text(self):
        d = self.daemon
        req = inference_pb2.GenerateRequest(model="stories", text="Once upon a time",
                                            options=greedy(16))
        messages, text = collect(d.stub.Generate(req, metadata=AUTH, timeout=60))
        last = self.check_final(messages)
        self.assertEqual(last.stop_reason, inference_pb2.GenerateResponse.MAX_TOKENS)
        http = d.http("/v1/completions", {"model": "stories", "prompt": "Once upon a time",
                                          "max_tokens": 16, "temperature": 0})
        self.assertEqual(text, http["choices"][0]["text"])
        self.assertEqual(last.usage.prompt_tokens, http["usage"]["prompt_tokens"])

    def test_chat_streams_the_http_greedy_reply(self):
        d = self.daemon
        req = inference_pb2.ChatRequest(
            model="stories", options=greedy(16),
            messages=[inference_pb2.ChatMessage(role="user", content="Tell me a story")])
        messages, text = collect(d.stub.Chat(req, metadata=AUTH, timeout=60))
        self.check_final(messages)
        http = d.http("/v1/chat/completions", {
            "model": "stories", "max_tokens": 16, "temperature": 0,
            "messages": [{"role": "user", "content": "Tell me a story"}]})
        self.assertEqual(text, http["choices"][0]["message"]["content"])
        self.assertTrue(text)

    def test_cancel_mid_stream_frees_the_slot(self):
        d = self.daemon
        before = d.metric('thermocline_cancellations_total{reason="client_disconnected"}')
        call = d.stub.Generate(
            inference_pb2.GenerateRequest(model="stories", text="Once upon a time",
                                          options=greedy(400)), metadata=AUTH)
        for _, _ in zip(range(3), call):
            pass
        call.cancel()  # 400 tokens would take 8 s
        with self.assertRaises(grpc.RpcError) as err:
            list(call)
        self.assertEqual(err.exception.code(), grpc.StatusCode.CANCELLED)
        start = time.time()
        messages, _ = collect(d.stub.Generate(
            inference_pb2.GenerateRequest(model="stories", text="The cat", options=greedy(4)),
            metadata=AUTH, timeout=30))
        self.assertLess(time.time() - start, 2.0)
        self.check_final(messages)
        after = d.metric('thermocline_cancellations_total{reason="client_disconnected"}')
        self.assertEqual(after, before + 1)

    def test_deadline_exceeded_frees_the_slot(self):
        d = self.daemon
        start = time.time()
        got = []
        with self.assertRaises(grpc.RpcError) as err:
            for m in d.stub.Generate(
                    inference_pb2.GenerateRequest(model="stories", text="Once upon a time",
                                                  options=greedy(400)),
                    metadata=AUTH, timeout=0.5):
                got.append(m)
        self.assertEqual(err.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        self.assertTrue(got)
        self.assertLess(time.time() - start, 2.0)
        start = time.time()
        messages, _ = collect(d.stub.Generate(
            inference_pb2.GenerateRequest(model="stories", text="The cat", options=greedy(4)),
            metadata=AUTH, timeout=30))
        self.assertLess(time.time() - start, 2.0)
        self.check_final(messages)

    def test_health_serving(self):
        d = self.daemon
        res = d.health.Check(health_pb2.HealthCheckRequest(), timeout=5)
        self.assertEqual(res.status, health_pb2.HealthCheckResponse.SERVING)
        res = d.health.Check(health_pb2.HealthCheckRequest(service="thermocline.v1.Inference"),
                             timeout=5)
        self.assertEqual(res.status, health_pb2.HealthCheckResponse.SERVING)

    def test_unknown_model_is_not_found(self):
        with self.assertRaises(grpc.RpcError) as err:
            list(self.daemon.stub.Generate(
                inference_pb2.GenerateRequest(model="no-such-model", text="Hi",
                                              options=greedy(2)), metadata=AUTH, timeout=10))
        self.assertEqual(err.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.assertIn("no-such-model", err.exception.details())

    def test_missing_or_wrong_key_is_unauthenticated(self):
        req = inference_pb2.GenerateRequest(model="stories", text="Hi", options=greedy(2))
        for metadata in ((), (("authorization", "Bearer wrong"),)):
            with self.assertRaises(grpc.RpcError) as err:
                list(self.daemon.stub.Generate(req, metadata=metadata, timeout=10))
            self.assertEqual(err.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
        with self.assertRaises(grpc.RpcError) as err:
            self.daemon.stub.ListModels(inference_pb2.ListModelsRequest(), timeout=10)
        self.assertEqual(err.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
        models = self.daemon.stub.ListModels(inference_pb2.ListModelsRequest(), metadata=AUTH,
                                             timeout=10)
        self.assertEqual([m.name for m in models.models], ["stories"])


if __name__ == "__main__":
    if not os.path.exists(MODEL_PATH):
        print(f"SKIPPED: no test model at {MODEL_PATH}")
        sys.exit(77)
    unittest.main(argv=[sys.argv[0], "-v"])
