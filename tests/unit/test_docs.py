"""The documents the code cites exist in the repository, and the taxonomy page names
every diagnosis id."""

from __future__ import annotations

import re
from pathlib import Path

from fleet.diagnosis.models import TAXONOMY

ROOT = Path(__file__).resolve().parents[2]
CITED = re.compile(
    r"(?<![\w./:-])((?:docs|templates|playbooks|scripts|benchmarks)/[\w./-]+\.(?:md|tsv|yaml|py|sh))"
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


# Any ``*.md`` file or ``shared/`` path named in these must be in the repository (relative to
# the naming file's directory or to the root). Another project's file is named
# ``owner/repo:path`` (``vllm-project/vllm:docs/usage/troubleshooting.md``), a web page by
# its URL: neither is a reference to check.
MD_REF = re.compile(r"(?<![\w./:-])((?:\.\./)*[\w-][\w./-]*\.md)(?![\w/-])")
SHARED_REF = re.compile(r"(?<![\w.-])((?:\.\./)*shared/[^\s`'\")\]]*)")


def _reference_sources() -> list[Path]:
    here = Path(__file__).resolve()
    found = [
        *ROOT.joinpath("fleet").rglob("*.py"),
        *ROOT.joinpath("fleet").rglob("*.yaml"),
        *ROOT.joinpath("docs").rglob("*.md"),
        *ROOT.joinpath("tests").rglob("*.py"),
        *ROOT.joinpath("tests").rglob("*.md"),
        ROOT / "CONTRIBUTING.md",
        ROOT / "README.md",
    ]
    return [p for p in found if p.resolve() != here]  # this file names what it looks for


def _in_a_url(text: str, start: int) -> bool:
    word = max(text.rfind(c, 0, start) for c in " \t\n(<`'\"") + 1
    return "://" in text[word:start]


def dangling_references(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    out = []
    for rx in (MD_REF, SHARED_REF):
        for m in rx.finditer(text):
            ref = m.group(1).rstrip(".")
            if _in_a_url(text, m.start(1)):
                continue
            if (path.parent / ref).exists() or (ROOT / ref).exists():
                continue
            line = text.count("\n", 0, m.start(1)) + 1
            out.append(f"{path.relative_to(ROOT)}:{line}: {ref}")
    return out


def test_every_md_file_and_shared_path_named_is_in_the_repository() -> None:
    """Research notes, design documents and crash logs the code, docs and tests name are
    in the repository (docs/research/, tests/corpus/dev/), not beside it."""
    missing = [ref for path in _reference_sources() for ref in dangling_references(path)]
    assert not missing, "\n".join(missing)


def test_a_dangling_reference_is_found(tmp_path: Path) -> None:
    note = ROOT / "docs" / "research" / "vllm-serve.md"
    assert not dangling_references(note)
    fake = ROOT / "docs" / "research" / "_dangling_check.md"  # beside the real notes
    try:
        fake.write_text(
            "see `vllm-eagle3.md` and vllm-serve.md, `research/anchors_fleet.md` §4 and\n"
            "`shared/crashlogs-dev/23-x.log`; not vllm-project/vllm:docs/usage/x.md nor\n"
            "https://example.invalid/a/README.md\n",
            encoding="utf-8",
        )
        assert [r.split(": ", 1)[1] for r in dangling_references(fake)] == [
            "research/anchors_fleet.md",
            "shared/crashlogs-dev/23-x.log",
        ]
    finally:
        fake.unlink()


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
