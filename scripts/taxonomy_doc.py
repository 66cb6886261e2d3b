"""Write docs/taxonomy.md from the code: the ids of fleet.diagnosis.models.TAXONOMY in
their groups (the comments of that tuple), each with its catalogue entry's severity and
title. ``python scripts/taxonomy_doc.py`` rewrites the page; tests/unit/test_docs.py
fails when the page and the code disagree."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HEADER = """# Diagnosis taxonomy

The stable ids that `fleet logs --diagnose`, `fleet serve` and preflight report (the `id`
of every diagnosis in `--json`). Each id has one entry in `fleet/diagnosis/catalogue.yaml`
(its signatures in vLLM's own messages, with the vLLM file and versions they come from,
its summary, root cause, remedy and the fleet command that fixes it where fleet can);
`fleet/diagnosis/models.py` `TAXONOMY` is the list in code. This page is written by
`scripts/taxonomy_doc.py`; an id is never renamed or reused, a new cause gets a new id.

Ranking: a specific cause first, then symptoms that usually follow a cause, then an
exception no rule names (`unrecognized-error`, its exception line as the evidence), then
the generic wrappers ("Engine core initialization failed", `EngineDeadError`, "Worker proc
died"), which are the answer only when no cause precedes them. The first entry of the
list is the primary root cause; an empty list means nothing was found.

Confidence: `high` when the message itself matched; `medium` for a `raise` literal or a
specific frame of a traceback cut before its message; `low` for a generic wrapper, an
unrecognised error, or a broad frame (any frame of Ray, of torch's compiler, of the API
server waiting for the engine).
"""


def groups() -> list[tuple[str, list[str]]]:
    text = (ROOT / "fleet" / "diagnosis" / "models.py").read_text(encoding="utf-8")
    body = text.split("TAXONOMY: tuple[str, ...] = (", 1)[1].split("\n)", 1)[0]
    out: list[tuple[str, list[str]]] = []
    for line in body.splitlines():
        line = line.strip()
        if line.startswith("#"):
            title = re.sub(r"\s*\(.*\)$", "", line.lstrip("# ").strip())
            out.append((title[:1].upper() + title[1:], []))
        elif line.startswith('"'):
            out[-1][1].append(line.strip('",'))
    return out


def page() -> str:
    from fleet.diagnosis.catalogue import load_catalogue

    cat = load_catalogue()
    lines = [HEADER]
    for title, ids in groups():
        lines += [f"## {title}", "", "| id | severity | what it means |", "|---|---|---|"]
        lines += [f"| `{i}` | {cat.rules[i].severity} | {cat.rules[i].title} |" for i in ids]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    (ROOT / "docs" / "taxonomy.md").write_text(page(), encoding="utf-8")
