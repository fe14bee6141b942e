#!/usr/bin/env python3
"""Checks the Dockerfiles of docker/ for the rules the images depend on (hadolint is not in
Debian): multi-stage with pinned bases, apt-get used so that layers stay small and reproducible,
a non-root user, a health check, exec-form commands, and COPY sources that exist.

Usage: dockerfile_lint.py REPO_ROOT DOCKERFILE...   (exit 1 listing every problem)
"""
import json
import os
import re
import sys


def instructions(text):
    """(line number, INSTRUCTION, arguments) with continuation lines joined."""
    out, buf, start = [], "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if not buf:
            start = n
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((start, word.upper(), rest.strip()))
        buf = ""
    return out


def lint(root, path):
    problems = []
    text = open(path, encoding="utf-8").read()
    ins = instructions(text)

    def bad(n, what):
        problems.append(f"{path}:{n}: {what}")

    stages, names = [], set()
    for n, word, args in ins:
        if word == "FROM":
            parts = args.split()
            image = parts[0]
            if image.lower() not in names:
                if ":" not in image or image.endswith(":latest"):
                    bad(n, f"base image '{image}' must be pinned to a tag (not latest)")
            if len(parts) >= 3 and parts[1].upper() == "AS":
                names.add(parts[2].lower())
            stages.append([])
        elif not stages:
            if word != "ARG":
                bad(n, f"{word} before the first FROM")
            continue
        else:
            stages[-1].append((n, word, args))
    if len(stages) < 2:
        bad(1, "the image must be multi-stage (a build stage and a slim run stage)")

    for n, word, args in ins:
        if word == "RUN":
            if re.search(r"\bapt-get\s+(-\S+\s+)*install\b", args):
                if "apt-get update" not in args:
                    bad(n, "apt-get install without apt-get update in the same RUN")
                if "--no-install-recommends" not in args:
                    bad(n, "apt-get install without --no-install-recommends")
                if not re.search(r"\s-y\b|--yes|--assume-yes", args):
                    bad(n, "apt-get install without -y")
                if "rm -rf /var/lib/apt/lists" not in args:
                    bad(n, "apt lists not removed in the same RUN (rm -rf /var/lib/apt/lists/*)")
            if re.search(r"\bapt\s+install\b", args):
                bad(n, "use apt-get, not apt, in scripts")
            if re.search(r"\bsudo\b", args):
                bad(n, "no sudo in images")
            if re.search(r"\bcd\s", args):
                bad(n, "use WORKDIR instead of cd")
        elif word == "ADD":
            sources = args.split()[:-1]
            if any(not re.match(r"https?://", s) for s in sources):
                bad(n, "ADD of local files: use COPY (ADD only for URLs)")
        elif word == "COPY":
            parts = [p for p in args.split() if not p.startswith("--")]
            if "--from=" not in args:
                for src in parts[:-1]:
                    if src != "." and not os.path.exists(os.path.join(root, src)):
                        bad(n, f"COPY source '{src}' does not exist in the build context")
            else:
                stage = re.search(r"--from=(\S+)", args).group(1).lower()
                if stage not in names and not stage.isdigit():
                    bad(n, f"COPY --from={stage}: no stage of that name")
        elif word in ("CMD", "ENTRYPOINT"):
            try:
                json.loads(args)
            except ValueError:
                bad(n, f"{word} must be in exec form (a JSON array)")
        elif word == "MAINTAINER":
            bad(n, "MAINTAINER is deprecated (use a LABEL)")

    final = stages[-1] if stages else []
    users = [args for _, word, args in final if word == "USER"]
    if not users:
        bad(1, "the run stage must set a USER")
    elif users[-1].split(":")[0] in ("0", "root"):
        bad(1, "the run stage must not run as root")
    for word in ("HEALTHCHECK", "EXPOSE", "VOLUME", "ENTRYPOINT"):
        if not any(w == word for _, w, _ in final):
            bad(1, f"the run stage has no {word}")
    for n, word, args in final:
        if word == "HEALTHCHECK" and "CMD" in args:
            cmd = args[args.index("CMD") + 3:].strip()
            try:
                json.loads(cmd)
            except ValueError:
                bad(n, "HEALTHCHECK CMD must be in exec form")
    return problems


def main():
    root = sys.argv[1]
    problems = []
    for path in sys.argv[2:]:
        problems += lint(root, path)
    for p in problems:
        print(p)
    if problems:
        return 1
    print(f"dockerfile_lint: {len(sys.argv) - 2} Dockerfile(s) clean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
