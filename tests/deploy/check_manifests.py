#!/usr/bin/env python3
"""Parses the Kubernetes manifests (deploy/k8s), the compose files and the Dockerfiles and checks
that they fit together and fit the daemon's config: probes on the right paths and ports, the
state directory on a volume per replica, models on a shared read-only volume, GPU and memory
requests, Prometheus annotations, session affinity, and every port the config names exposed.

Usage: check_manifests.py REPO_ROOT   (exit 1 listing every problem)
"""
import glob
import os
import re
import sys
import tomllib

import yaml

problems = []


def check(ok, what):
    if not ok:
        problems.append(what)
    return ok


def load_docs(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def main():
    root = sys.argv[1]
    k8s = os.path.join(root, "deploy", "k8s")
    docs = []
    for path in sorted(glob.glob(os.path.join(k8s, "*.yaml"))):
        if os.path.basename(path) != "kustomization.yaml":
            docs += [(path, d) for d in load_docs(path)]
    by_kind = {}
    for path, d in docs:
        check("apiVersion" in d and "kind" in d and "name" in d.get("metadata", {}),
              f"{path}: a document without apiVersion, kind or metadata.name")
        by_kind.setdefault(d["kind"], []).append(d)

    # Every file is in the kustomization, every listed file exists.
    kust = load_docs(os.path.join(k8s, "kustomization.yaml"))[0]
    listed = set(kust.get("resources", []))
    present = {os.path.basename(p) for p in glob.glob(os.path.join(k8s, "*.yaml"))}
    present.discard("kustomization.yaml")
    check(listed == present, f"kustomization resources {sorted(listed)} != files {sorted(present)}")

    cm = by_kind["ConfigMap"][0]
    config = tomllib.loads(cm["data"]["thermocline.toml"])
    server, registry = config.get("server", {}), config.get("registry", {})
    http_port, grpc_port = server.get("port", 8080), server.get("grpc_port", 50051)
    state_dir = registry.get("state_dir")
    check(server.get("host") == "0.0.0.0", "the config must bind 0.0.0.0 in a pod")
    check(state_dir, "the config must set registry.state_dir")

    (sts,) = by_kind["StatefulSet"]
    spec = sts["spec"]
    pod = spec["template"]["spec"]
    (c,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    check(ports.get("http") == http_port, f"container port http {ports.get('http')} != {http_port}")
    check(ports.get("grpc") == grpc_port, f"container port grpc {ports.get('grpc')} != {grpc_port}")

    def port_of(ref):
        return ports.get(ref, ref)

    for probe in ("startupProbe", "readinessProbe"):
        p = c.get(probe, {})
        check(p.get("httpGet", {}).get("path") == "/health", f"{probe} must GET /health")
        check(port_of(p.get("httpGet", {}).get("port")) == http_port, f"{probe} port != {http_port}")
    live = c.get("livenessProbe", {})
    check(port_of(live.get("grpc", {}).get("port")) == grpc_port,
          f"livenessProbe must be the gRPC health check on {grpc_port}")
    check(c.get("startupProbe", {}).get("failureThreshold", 0) *
          c.get("startupProbe", {}).get("periodSeconds", 10) >= 300,
          "the startup probe must allow a large model minutes to load")

    res = c.get("resources", {})
    check("memory" in res.get("requests", {}), "no memory request")
    check("memory" in res.get("limits", {}), "no memory limit")
    check(res.get("requests", {}).get("nvidia.com/gpu") == res.get("limits", {}).get("nvidia.com/gpu")
          and res.get("limits", {}).get("nvidia.com/gpu"), "nvidia.com/gpu must be requested = limited")

    ann = spec["template"]["metadata"].get("annotations", {})
    check(ann.get("prometheus.io/scrape") == "true", "no prometheus.io/scrape annotation")
    check(ann.get("prometheus.io/port") == str(http_port), "prometheus.io/port != the HTTP port")
    check(ann.get("prometheus.io/path") == "/metrics", "prometheus.io/path != /metrics")

    mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    claims = {t["metadata"]["name"]: t for t in spec.get("volumeClaimTemplates", [])}
    state = [m for m in mounts.values() if m["mountPath"] == state_dir]
    check(len(state) == 1 and state[0]["name"] in claims and not state[0].get("readOnly"),
          f"the state dir {state_dir} must be a writable volumeClaimTemplate (one per replica)")
    if state and state[0]["name"] in claims:
        check(claims[state[0]["name"]]["spec"]["accessModes"] == ["ReadWriteOnce"],
              "the state volume must be ReadWriteOnce")
    models = mounts.get("models")
    if check(models is not None, "no models mount"):
        check(models.get("readOnly") is True, "the models mount must be read-only")
        check(models["mountPath"] in registry.get("allowed_paths", []),
              "the models mount must be in registry.allowed_paths")
        claim = volumes["models"].get("persistentVolumeClaim", {})
        check(claim.get("readOnly") is True, "the models claim must be mounted readOnly")
        pvcs = {p["metadata"]["name"]: p for p in by_kind.get("PersistentVolumeClaim", [])}
        check(pvcs.get(claim.get("claimName"), {}).get("spec", {}).get("accessModes")
              == ["ReadOnlyMany"], "the models PVC must be ReadOnlyMany (shared by the replicas)")
    cfg = mounts.get("config")
    check(cfg is not None and volumes[cfg["name"]].get("configMap", {}).get("name")
          == cm["metadata"]["name"], "the config must be mounted from the ConfigMap")
    check(cfg is not None and f"{cfg['mountPath']}/thermocline.toml" in c.get("args", []),
          "the daemon must be started with the mounted config")
    sec = pod.get("securityContext", {})
    check(sec.get("runAsNonRoot") is True and sec.get("runAsUser", 0) != 0, "pods must not run as root")
    check(pod.get("terminationGracePeriodSeconds", 30) > 10,
          "the grace period must exceed server.shutdown_timeout_s (10 s)")

    services = {s["metadata"]["name"]: s for s in by_kind["Service"]}
    check(spec["serviceName"] in services and
          services[spec["serviceName"]]["spec"].get("clusterIP") == "None",
          "serviceName must be a headless Service")
    client = [s for s in services.values() if s["spec"].get("clusterIP") != "None"]
    if check(len(client) == 1, "one client Service"):
        s = client[0]["spec"]
        check(s.get("sessionAffinity") == "ClientIP", "the Service needs ClientIP session affinity")
        check(s.get("selector") == spec["selector"]["matchLabels"], "Service selector != pods")
        for p in s["ports"]:
            check(port_of(p["targetPort"]) in (http_port, grpc_port),
                  f"Service port {p['name']} targets no container port")
        (ing,) = by_kind["Ingress"]
        backend = ing["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
        check(backend["name"] == client[0]["metadata"]["name"], "the Ingress backend is no Service")
        check("affinity" in " ".join(ing["metadata"].get("annotations", {})),
              "the Ingress needs session affinity")

    # The CPU overlay removes exactly the GPU resources of the base.
    cpu = load_docs(os.path.join(k8s, "cpu", "kustomization.yaml"))[0]
    for patch in cpu.get("patches", []):
        for op in yaml.safe_load(patch["patch"]):
            keys = op["path"].strip("/").split("/")
            node = sts
            for k in keys:
                k = k.replace("~1", "/").replace("~0", "~")
                node = node[int(k)] if isinstance(node, list) else node.get(k) if node else None
            check(node is not None, f"cpu overlay: {op['path']} is not in the StatefulSet")

    # Compose: models read-only, the state dir on a volume, the ports published.
    compose = load_docs(os.path.join(root, "docker", "compose.yaml"))[0]
    (svc,) = compose["services"].values()
    image_cfg = tomllib.load(open(os.path.join(root, "docker", "thermocline.toml"), "rb"))
    vols = svc.get("volumes", [])
    check(any(v.endswith(":/models:ro") for v in vols), "compose: models must be mounted :ro")
    check(any(v.split(":")[1] == image_cfg["registry"]["state_dir"] for v in vols),
          "compose: the state dir must be a volume")
    published = {p.split(":")[-1] for p in svc.get("ports", [])}
    check({str(image_cfg["server"]["port"]), str(image_cfg["server"]["grpc_port"])} <= published,
          "compose: the HTTP and gRPC ports must be published")
    check("/models" in image_cfg["registry"]["allowed_paths"], "image config: /models not allowed")

    # Dockerfiles: the ports of the image config exposed, the state dir a volume.
    for path in glob.glob(os.path.join(root, "docker", "Dockerfile.*")):
        text = open(path, encoding="utf-8").read()
        final = text[text.rindex("\nFROM "):]
        exposed = set(re.findall(r"^EXPOSE (.*)$", final, re.M)[0].split())
        check({str(image_cfg["server"]["port"]), str(image_cfg["server"]["grpc_port"])} <= exposed,
              f"{path}: EXPOSE must list the config's ports")
        check(image_cfg["registry"]["state_dir"] in final.split("VOLUME", 1)[-1].split("\n")[0],
              f"{path}: the state dir must be a VOLUME")
    hc = open(os.path.join(root, "docker", "healthcheck.sh"), encoding="utf-8").read()
    check(f":-{image_cfg['server']['port']}}}" in hc and "/health" in hc,
          "healthcheck.sh must GET /health on the config's port")

    for p in problems:
        print(p)
    if problems:
        return 1
    print(f"check_manifests: {len(docs)} manifests, compose and Dockerfiles consistent")
    return 0


if __name__ == "__main__":
    sys.exit(main())
