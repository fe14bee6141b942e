#!/usr/bin/env python3
"""The house's layering (DESIGN.md), checked on every #include:
  - engine/ includes only the engine (and abseil), and within it only its own floor or those
    below: util < ops < gguf < tokenizer < model < sampling < gpu < cuda < sparse < runtime;
  - offline/ never includes server/, tools/ or bench/;
  - server/ (the daemon) never includes bench/ or tools/.
Usage: check_layers.py SOURCE_DIR. Prints each violation and exits 1 if there is any."""
import os
import re
import sys

FLOORS = ['util', 'ops', 'gguf', 'tokenizer', 'model', 'sampling', 'gpu', 'cuda', 'sparse',
          'runtime']
RANK = {d: i for i, d in enumerate(FLOORS)}
FORBIDDEN = {'offline': {'server', 'tools', 'bench'}, 'server': {'bench', 'tools'}}
INCLUDE = re.compile(r'\s*#\s*include\s+"([^"]+)"')


def sources(top):
    for root, _, files in os.walk(top):
        for f in files:
            if f.endswith(('.h', '.cc', '.cu', '.inc')):
                yield os.path.join(root, f)


def main(src):
    bad = []
    for top in ('engine', 'offline', 'server'):
        for path in sources(os.path.join(src, top)):
            rel = os.path.relpath(path, src)
            parts = rel.split(os.sep)
            for n, line in enumerate(open(path, errors='replace'), 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                target = m.group(1).split('/')
                if len(target) < 2:
                    continue  # a same-folder or third-party header ("nlohmann/..." has 2 parts)
                where = f'{rel}:{n}: {line.strip()}'
                if top == 'engine':
                    if target[0] == 'absl':
                        continue
                    if target[0] != 'engine':
                        bad.append(f'{where}: the engine includes {target[0]}/')
                    elif parts[1] in RANK and target[1] in RANK and RANK[target[1]] > RANK[parts[1]]:
                        bad.append(f'{where}: engine/{parts[1]} includes engine/{target[1]}, '
                                   'a floor above it')
                elif target[0] in FORBIDDEN[top]:
                    bad.append(f'{where}: {top}/ includes {target[0]}/')
    for b in bad:
        print(b)
    print(f'{len(bad)} layering violation(s)')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1]))
