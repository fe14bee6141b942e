#!/usr/bin/env python3
"""The deployment checks must catch what they claim to: each case copies docker/ and deploy/,
breaks one thing, and expects check_manifests.py or dockerfile_lint.py to fail naming it.

Usage: selftest.py REPO_ROOT
"""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = [
    # (file, text, replacement, checker, expected message part)
    ("deploy/k8s/statefulset.yaml", "readinessProbe:\n            httpGet:\n              path: /health",
     "readinessProbe:\n            httpGet:\n              path: /healthz", "manifests",
     "readinessProbe must GET /health"),
    ("deploy/k8s/statefulset.yaml", "port: 50051", "port: 50052", "manifests", "livenessProbe"),
    ("deploy/k8s/statefulset.yaml", "              nvidia.com/gpu: 1\n            limits:",
     "            limits:", "manifests", "nvidia.com/gpu"),
    ("deploy/k8s/statefulset.yaml", "prometheus.io/port: \"8080\"", "prometheus.io/port: \"9090\"",
     "manifests", "prometheus.io/port"),
    ("deploy/k8s/statefulset.yaml", "            - name: models\n              mountPath: /models\n              readOnly: true",
     "            - name: models\n              mountPath: /models", "manifests",
     "models mount must be read-only"),
    ("deploy/k8s/statefulset.yaml", "mountPath: /var/lib/thermocline", "mountPath: /var/lib/other",
     "manifests", "state dir"),
    ("deploy/k8s/service.yaml", "sessionAffinity: ClientIP", "sessionAffinity: None", "manifests",
     "session affinity"),
    ("deploy/k8s/models-pvc.yaml", 'accessModes: ["ReadOnlyMany"]', 'accessModes: ["ReadWriteOnce"]',
     "manifests", "ReadOnlyMany"),
    ("deploy/k8s/configmap.yaml", "port = 8080", "port = 8081", "manifests", "container port http"),
    ("docker/compose.yaml", "/models:ro", "/models", "manifests", "mounted :ro"),
    ("docker/Dockerfile.cpu", "USER 10001:10001\n", "", "dockerfile", "must set a USER"),
    ("docker/Dockerfile.cpu", "USER 10001:10001", "USER root", "dockerfile", "not run as root"),
    ("docker/Dockerfile.cpu", "FROM debian:12-slim", "FROM debian", "dockerfile", "pinned"),
    ("docker/Dockerfile.cpu", " \\\n && rm -rf /var/lib/apt/lists/* \\\n && groupadd",
     " \\\n && groupadd", "dockerfile", "apt lists"),
    ("docker/Dockerfile.cpu", "--no-install-recommends \\\n      coinor-libcbc3",
     "\\\n      coinor-libcbc3", "dockerfile", "--no-install-recommends"),
    ("docker/Dockerfile.cpu", "HEALTHCHECK", "# HEALTHCHECK", "dockerfile", "no HEALTHCHECK"),
    ("docker/Dockerfile.cpu", "COPY docker/healthcheck.sh", "COPY docker/missing.sh", "dockerfile",
     "does not exist"),
    ("docker/Dockerfile.cpu", 'CMD ["serve", "--config", "/etc/thermocline/thermocline.toml"]',
     "CMD serve --config /etc/thermocline/thermocline.toml", "dockerfile", "exec form"),
]


def main():
    root = sys.argv[1]
    failures = 0
    for path, old, new, checker, expected in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            for d in ("deploy", "docker"):
                shutil.copytree(os.path.join(root, d), os.path.join(tmp, d))
            target = os.path.join(tmp, path)
            text = open(target, encoding="utf-8").read()
            if old not in text:
                print(f"selftest: {path}: the text to break is gone: {old!r}")
                failures += 1
                continue
            open(target, "w", encoding="utf-8").write(text.replace(old, new, 1))
            if checker == "manifests":
                cmd = [sys.executable, os.path.join(HERE, "check_manifests.py"), tmp]
            else:
                cmd = [sys.executable, os.path.join(HERE, "dockerfile_lint.py"), tmp, target]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode == 0 or expected not in r.stdout:
                print(f"selftest: breaking {path} ({expected}) was not caught:\n{r.stdout}{r.stderr}")
                failures += 1
    if failures:
        return 1
    print(f"selftest: all {len(CASES)} broken copies caught")
    return 0


if __name__ == "__main__":
    sys.exit(main())
