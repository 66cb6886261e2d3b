"""The documents the code cites exist in the repository, and the taxonomy page names
every diagnosis id."""

from __future__ import annotations

import re
from pathlib import Path

from fleet.diagnosis.models import TAXONOMY

ROOT = Path(__file__).resolve().parents[2]
CITED = re.compile(
    r"\b((?:docs|templates|playbooks|scripts|benchmarks)/[\w./-]+\.(?:md|tsv|yaml|py|sh))"
)
PLACEHOLDERS = re.compile(r"[A-Z]{3,}")  # playbooks/PROFILE.yaml names a pattern, not a file


def test_every_document_the_code_cites_is_in_the_repository() -> None:
    missing = []
    sources = [
        *ROOT.joinpath("fleet").rglob("*.py"),
        *ROOT.joinpath("tests").glob("*/*.py"),
        *ROOT.joinpath("docs").glob("*.md"),
        ROOT / "CONTRIBUTING.md",
        ROOT / "README.md",
    ]
    for path in sources:
        for cited in CITED.findall(path.read_text(encoding="utf-8")):
            if PLACEHOLDERS.search(cited.rsplit("/", 1)[-1]):
                continue
            if not (ROOT / cited.rstrip(".")).exists():
                missing.append(f"{path.relative_to(ROOT)}: {cited}")
    assert not missing, missing
    # and nothing points outside the repository to the design notes it was built from
    for path in ROOT.joinpath("fleet").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "DESIGN.md" not in text and "shared/research" not in text, path


def test_the_taxonomy_page_names_every_id() -> None:
    page = (ROOT / "docs" / "taxonomy.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `([a-z0-9-]+)` \|", page, flags=re.M))
    assert listed == set(TAXONOMY), sorted(listed ^ set(TAXONOMY))


def test_the_taxonomy_page_is_the_one_the_code_writes() -> None:
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    import taxonomy_doc

    written = (ROOT / "docs" / "taxonomy.md").read_text(encoding="utf-8")
    assert written == taxonomy_doc.page(), "run: python scripts/taxonomy_doc.py"
