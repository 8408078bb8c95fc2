#!/usr/bin/env python3
"""Lists functions in src/ longer than --max-lines or nested deeper than --max-depth.

Nesting is counted in braces below the function body's own (a `match` arm's block, an `if`
inside a loop…), ignoring braces in strings, chars and comments; struct literals count too,
which errs on the strict side. Usage: scripts/function-shape.py [--max-lines 80]
[--max-depth 5] [paths…]; exits 1 when any function is over a limit.
"""
import argparse
import pathlib
import re
import sys

FN = re.compile(r'^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?fn\s+(\w+)')


def strip(line, state):
    """The line without strings, chars and comments; `state` carries block comments."""
    out = []
    i = 0
    while i < len(line):
        if state['block']:
            end = line.find('*/', i)
            if end < 0:
                return ''.join(out)
            state['block'] = False
            i = end + 2
            continue
        c = line[i]
        if line.startswith('//', i):
            break
        if line.startswith('/*', i):
            state['block'] = True
            i += 2
            continue
        if c == '"':
            j = i + 1
            while j < len(line) and line[j] != '"':
                j += 2 if line[j] == '\\' else 1
            i = j + 1
            continue
        if c == "'" and re.match(r"'(\\.|[^\\'])'", line[i:]):
            i += len(re.match(r"'(\\.|[^\\'])'", line[i:]).group(0))
            continue
        out.append(c)
        i += 1
    return ''.join(out)


def functions(path):
    lines = path.read_text().split('\n')
    state = {'block': False}
    depth = 0
    stack = []  # (name, start line, depth of its body)
    found = []
    in_test = None
    pending = None
    for n, raw in enumerate(lines, 1):
        if raw.strip().startswith('#[cfg(test)]'):
            in_test = depth
        line = strip(raw, state)
        m = FN.match(raw)
        if m:
            pending = (m.group(5), n)
        if pending and ';' in line and '{' not in line:
            pending = None  # a declaration without a body (trait method)
        if pending and '{' in line:
            stack.append([pending[0], pending[1], depth + 1, 0])
            pending = None
        for c in line:
            if c == '{':
                depth += 1
                for f in stack:
                    f[3] = max(f[3], depth - f[2])
            elif c == '}':
                depth -= 1
                if stack and depth == stack[-1][2] - 1:
                    name, start, _, nest = stack.pop()
                    if in_test is None:
                        found.append((name, start, n - start + 1, nest))
                if in_test is not None and depth <= in_test:
                    in_test = None
    return found


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--max-lines', type=int, default=80)
    ap.add_argument('--max-depth', type=int, default=5)
    ap.add_argument('paths', nargs='*', default=['src'])
    args = ap.parse_args()
    bad = 0
    for root in args.paths:
        root = pathlib.Path(root)
        for path in [root] if root.is_file() else sorted(root.rglob('*.rs')):
            if path.name == 'table.rs':
                continue
            for name, start, length, nest in functions(path):
                if length > args.max_lines or nest > args.max_depth:
                    bad += 1
                    print(f'{path}:{start}: fn {name}: {length} lines, nested {nest}')
    sys.exit(1 if bad else 0)


main()
