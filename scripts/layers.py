#!/usr/bin/env python3
"""The import graph of a crate's modules, from `crate::`, `super::` and
`self::` paths in code (comments and `#[cfg(test)]` blocks left out): every
circle between files, and every import that reaches up the layer order.

    scripts/layers.py SRC_DIR [LAYER ...]     # layers listed top first

A folder's `mod.rs` declaring or re-exporting its own files is structure, not
an import. Exits 1 on any circle or upward import. No crate does this for a
Rust module tree (cargo-modules draws the graph but checks no order), and the
check is a screenful, so it is written here.
"""
import os, re, sys, collections

def modules(root):
    mods = {}
    for dp, _, fs in os.walk(root):
        for f in fs:
            if not f.endswith('.rs'): continue
            rel = os.path.relpath(os.path.join(dp, f), root)
            parts = rel[:-3].split('/')
            if parts[-1] in ('mod', 'lib', 'main'): parts = parts[:-1]
            mods[tuple(parts)] = os.path.join(dp, f)
    return mods

def code(path):
    out = []
    for line in open(path):
        if line.startswith('#[cfg(test)]'): break
        s = line.split('//')[0] if '"' not in line else line
        if line.lstrip().startswith('//'): continue
        out.append(s)
    return ''.join(out)

PATH = re.compile(r'\b(crate|super|self)((?:::\w+)+)')
GROUP = re.compile(r'\b(crate|super|self)((?:::\w+)*)::\{')

def resolve(mods, here, is_dir, kind, rest):
    parts = [p for p in rest.split('::') if p]
    base = [] if kind == 'crate' else list(here) if kind == 'self' else list(here[:-1])
    while parts and parts[0] == 'super':
        parts.pop(0); base = base[:-1]
    parts = base + parts
    while parts and tuple(parts) not in mods: parts.pop()
    return tuple(parts)

def edges(root):
    mods = modules(root)
    g = collections.defaultdict(set)
    for m, path in mods.items():
        is_dir = os.path.basename(path) in ('mod.rs', 'lib.rs', 'main.rs')
        src = code(path)
        targets = []
        for kind, rest in PATH.findall(src): targets.append((kind, rest))
        for mt in GROUP.finditer(src):
            depth, i = 1, mt.end()
            while depth and i < len(src):
                depth += {'{': 1, '}': -1}.get(src[i], 0); i += 1
            for name in re.findall(r'(\w+)(?:::\w+)*', src[mt.end():i]):
                targets.append((mt.group(1), mt.group(2) + '::' + name))
        for kind, rest in targets:
            t = resolve(mods, m, is_dir, kind, rest)
            if t == m or not t: continue
            # A folder's mod.rs declaring or re-exporting its own files is structure.
            if is_dir and t[:len(m)] == m: continue
            # Inside one file's own inline modules (tests) `super` is the file.
            g[m].add(t)
    return mods, g

def sccs(nodes, g):
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)
    def visit(v):
        index[v] = low[v] = n[0]; n[0] += 1; stack.append(v); on.add(v)
        for w in g.get(v, ()):
            if w not in index: visit(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: out.append(comp)
    for v in nodes:
        if v not in index: visit(v)
    return out

def main():
    root, layers = sys.argv[1], sys.argv[2:]
    mods, g = edges(root)
    bad = 0
    for comp in sccs(sorted(mods), g):
        bad += 1
        print('circle:', ' <-> '.join('::'.join(c) or 'crate' for c in sorted(comp)))
    if layers:
        rank = {l: i for i, l in enumerate(layers)}
        for m, ts in sorted(g.items()):
            if not m: continue
            for t in sorted(ts):
                if not t or t[0] == m[0]: continue
                a, b = rank.get(m[0]), rank.get(t[0])
                if a is None or b is None:
                    print(f'unlisted: {"::".join(m)} -> {"::".join(t)}'); bad += 1
                elif b < a:
                    print(f'reaches up: {"::".join(m)} -> {"::".join(t)}'); bad += 1
    print(f'{len(mods)} modules, {sum(len(v) for v in g.values())} imports between them, {bad} problems')
    sys.exit(1 if bad else 0)

main()
