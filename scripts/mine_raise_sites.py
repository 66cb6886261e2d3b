#!/usr/bin/env python3
"""Mine vLLM's raise sites and error-log calls and map each to a diagnosis taxonomy id.

Not part of the test run (it reads ~36 vLLM releases). For every version in VERSIONS it
takes the real source from the cached wheels (``fleet.sandbox.vllm_source.vllm_tree``,
downloaded with pip when missing) and walks the start-up packages (engine, worker,
executor, config, model loader, spec decode, and the v1 KV-cache planner) with ``ast``:

* every ``raise X("...")`` / ``raise X(f"...")`` whose message is a literal or f-string,
* every ``assert cond, "..."`` with a literal message,
* every ``logger.error(...)`` / ``logger.exception(...)`` with a literal format string.

The message becomes a *template* (f-string fields and ``%s`` become ``{...}``) and is
matched against the shipped catalogue with :func:`fleet.diagnosis.catalogue.template_patterns`
-- the same matcher the engine uses for the ``raise`` line of a truncated traceback. The
output is one row per distinct site (file, function, kind, exception, template) with the
versions it appears in and the taxonomy id it maps to (``-`` when none)::

    python scripts/mine_raise_sites.py                   # all versions, writes docs/
    python scripts/mine_raise_sites.py --versions 0.17.0 --out /tmp/x

Outputs ``docs/raise-sites.tsv`` (the table) and ``docs/raise-sites.md`` (the coverage
summary quoted in the README). Versions that cannot be downloaded are reported and skipped.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fleet.diagnosis.catalogue import (  # noqa: E402
    CompiledCatalogue,
    load_catalogue,
    template_patterns,
)
from fleet.diagnosis.models import ROLE_TIER  # noqa: E402

VERSIONS = [
    "0.10.2",
    "0.11.0",
    "0.11.1",
    "0.11.2",
    "0.12.0",
    "0.13.0",
    "0.14.0",
    "0.14.1",
    "0.15.0",
    "0.15.1",
    "0.16.0",
    "0.17.0",
    "0.17.1",
    "0.18.0",
    "0.18.1",
    "0.19.0",
    "0.19.1",
    "0.20.0",
    "0.20.1",
    "0.20.2",
    "0.21.0",
    "0.22.0",
    "0.22.1",
    "0.23.0",
    "0.24.0",
    "0.25.0",
    "0.25.1",
    "0.26.0",
    "0.27.0",
    "0.27.1",
    "0.28.0",
    "0.29.0",
    "0.30.0",
    "0.31.0",
    "0.32.0",
    "0.33.0",
]

# Start-up packages (relative to the vllm package); a file matches if it starts with one.
PACKAGES = (
    "engine/",
    "v1/engine/",
    "worker/",
    "v1/worker/",
    "executor/",
    "v1/executor/",
    "config/",
    "config.py",
    "model_executor/model_loader/",
    "spec_decode/",
    "v1/spec_decode/",
    "v1/core/kv_cache_utils.py",
    "v1/core/kv_cache_planning.py",
)
_PRINTF = re.compile(r"%(?:\([^)]*\))?[-#0 +]*\d*(?:\.\d+)?[sdrfgixX]")


@dataclass(frozen=True)
class Site:
    path: str
    function: str
    kind: str  # raise | assert | logger.error | logger.exception
    exc: str
    template: str


def _template(node: ast.expr) -> str | None:
    """The message template of a literal, f-string, or a concatenation of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts: list[str] = []
        for v in node.values:
            if isinstance(v, ast.Constant) and isinstance(v.value, str):
                parts.append(v.value)
            else:
                parts.append("{" + ast.unparse(getattr(v, "value", v))[:40] + "}")
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _template(node.left), _template(node.right)
        if left is not None and right is not None:
            return left + right
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        left = _template(node.left)
        return _PRINTF.sub("{}", left) if left is not None else None
    return None


def _exc_name(node: ast.expr | None) -> str:
    if node is None:
        return ""
    target = node.func if isinstance(node, ast.Call) else node
    return ast.unparse(target).rsplit(".", 1)[-1][:60]


class _Visitor(ast.NodeVisitor):
    def __init__(self, path: str) -> None:
        self.path = path
        self.stack: list[str] = []
        self.sites: list[Site] = []

    def _func(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.stack.append(node.name)
        self.generic_visit(node)
        self.stack.pop()

    visit_FunctionDef = _func
    visit_AsyncFunctionDef = _func

    def _add(self, kind: str, exc: str, template: str | None) -> None:
        if template is None or len(template.strip()) < 8:
            return
        func = self.stack[-1] if self.stack else "<module>"
        self.sites.append(Site(self.path, func, kind, exc, " ".join(template.split())))

    def visit_Raise(self, node: ast.Raise) -> None:
        exc = node.exc
        if isinstance(exc, ast.Call) and exc.args:
            self._add("raise", _exc_name(exc), _template(exc.args[0]))
        self.generic_visit(node)

    def visit_Assert(self, node: ast.Assert) -> None:
        if node.msg is not None:
            self._add("assert", "AssertionError", _template(node.msg))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if (
            isinstance(f, ast.Attribute)
            and f.attr in ("error", "exception", "critical")
            and isinstance(f.value, ast.Name)
            and f.value.id in ("logger", "log", "_logger", "LOGGER")
            and node.args
        ):
            tmpl = _template(node.args[0])
            if tmpl is not None:
                tmpl = _PRINTF.sub("{}", tmpl)
            self._add(f"logger.{f.attr}", "", tmpl)
        self.generic_visit(node)


def mine_tree(tree: Path) -> list[Site]:
    pkg = tree / "vllm"
    sites: list[Site] = []
    for file in sorted(pkg.rglob("*.py")):
        rel = file.relative_to(pkg).as_posix()
        if not rel.startswith(PACKAGES):
            continue
        try:
            module = ast.parse(file.read_text(encoding="utf-8", errors="replace"))
        except SyntaxError:
            continue
        v = _Visitor(rel)
        v.visit(module)
        sites.extend(v.sites)
    return sites


def map_site(cat: CompiledCatalogue, site: Site, cache: dict[str, str]) -> str:
    text = f"{site.exc}: {site.template}" if site.exc else site.template
    if text not in cache:
        pats = template_patterns(cat, text)
        if not pats:
            cache[text] = "-"
        else:
            best = min(pats, key=lambda p: (ROLE_TIER[p.role], -p.specificity))
            cache[text] = best.rule.id
    return cache[text]


def _range(versions: list[str]) -> str:
    return versions[0] if len(versions) == 1 else f"{versions[0]}..{versions[-1]}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--versions", nargs="*", default=list(VERSIONS))
    ap.add_argument("--out", type=Path, default=ROOT / "docs")
    args = ap.parse_args(argv)
    from fleet.errors import FleetError
    from fleet.sandbox.vllm_source import vllm_tree

    cat = load_catalogue()
    seen: dict[Site, list[str]] = defaultdict(list)
    per_version: dict[str, tuple[int, int]] = {}
    missing: list[str] = []
    cache: dict[str, str] = {}
    for version in args.versions:
        try:
            tree = vllm_tree(version)
        except (FleetError, OSError) as exc:
            missing.append(f"{version}: {exc}")
            print(f"skip {version}: {exc}", file=sys.stderr)
            continue
        sites = set(mine_tree(tree))
        mapped = sum(1 for s in sites if map_site(cat, s, cache) != "-")
        per_version[version] = (mapped, len(sites))
        for s in sites:
            seen[s].append(version)
        print(f"{version}: {mapped}/{len(sites)} sites mapped", file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = sorted(seen.items(), key=lambda kv: (kv[0].path, kv[0].function, kv[0].template))
    ids: Counter[str] = Counter()
    by_kind: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    by_pkg: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    by_exc: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    with open(args.out / "raise-sites.tsv", "w", encoding="utf-8") as fh:
        fh.write("id\tkind\texception\tfile\tfunction\tversions\tmessage\n")
        for site, versions in rows:
            rid = map_site(cat, site, cache)
            ids[rid] += 1
            pkg = next(p for p in PACKAGES if site.path.startswith(p)).rstrip("/")
            exc_name = site.exc or site.kind
            for bucket in (by_kind[site.kind], by_pkg[pkg], by_exc[exc_name]):
                bucket[1] += 1
                bucket[0] += rid != "-"
            msg = site.template.replace("\t", " ")[:240]
            fh.write(
                f"{rid}\t{site.kind}\t{site.exc}\t{site.path}\t{site.function}\t"
                f"{_range(versions)}\t{msg}\n"
            )
    total = len(rows)
    mapped = total - ids["-"]
    lines = [
        "# vLLM raise sites and error logs mapped to diagnosis ids",
        "",
        "Generated by `scripts/mine_raise_sites.py` from the vLLM wheels "
        f"{args.versions[0]}..{args.versions[-1]} ({len(per_version)} releases read). "
        "A *site* is one distinct (file, function, kind, exception, message template) in the "
        "start-up packages (engine, worker, executor, config, model loader, spec decode, "
        "v1 KV-cache planner). A site is *mapped* when a catalogue pattern recognises its "
        "message template. The table is `raise-sites.tsv` beside this file.",
        "",
        f"**{mapped} of {total} raise sites on start-up paths are mapped to a taxonomy id** "
        f"({mapped / max(total, 1):.1%}).",
        "",
        "Most unmapped sites are internal invariants (`assert`s and `TypeError`s of vLLM's own "
        "bookkeeping) or checks of features with no taxonomy id (LoRA, watermarking, elastic "
        "EP, structured outputs...); a log that ends in one of them is still never clean (it "
        "is reported as `unrecognized-error` with its exception line). Whole families are "
        "mapped by what they check (the speculative config's validation, parallel-layout "
        "divisibility and device counts, features refused with pipeline parallelism, "
        "missing packages), below the specific messages.",
        "",
        "| kind | mapped | sites |",
        "| --- | ---: | ---: |",
        *(f"| {k} | {a} | {b} |" for k, (a, b) in sorted(by_kind.items())),
        "",
        "| package | mapped | sites |",
        "| --- | ---: | ---: |",
        *(f"| {k} | {a} | {b} |" for k, (a, b) in sorted(by_pkg.items())),
        "",
        "| exception | mapped | sites |",
        "| --- | ---: | ---: |",
        *(
            f"| {k} | {a} | {b} |"
            for k, (a, b) in sorted(by_exc.items(), key=lambda kv: -kv[1][1])
            if b >= 5
        ),
        f"| (other, < 5 sites each) | {sum(a for a, b in by_exc.values() if b < 5)} | "
        f"{sum(b for a, b in by_exc.values() if b < 5)} |",
        "",
        "| version | mapped | sites |",
        "| --- | ---: | ---: |",
        *(f"| {v} | {a} | {b} |" for v, (a, b) in per_version.items()),
        "",
        "| taxonomy id | sites |",
        "| --- | ---: |",
        *(f"| {k} | {n} |" for k, n in sorted(ids.items()) if k != "-"),
        "",
    ]
    if missing:
        lines += ["Versions that could not be read:", "", *(f"- {m}" for m in missing), ""]
    (args.out / "raise-sites.md").write_text("\n".join(lines), encoding="utf-8")
    print(f"{mapped} of {total} raise sites mapped; wrote {args.out}/raise-sites.*")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
