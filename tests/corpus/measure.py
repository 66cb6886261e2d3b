"""Measure the diagnosis engine on labelled real logs: top-1, false cleans, false alarms.

A corpus directory holds ``*.log`` files and a ``labels.json`` mapping each file name to
``{"id": <taxonomy id or "clean">, "source": <thread URL>, ...}``. For each log:

- a crash (label is a taxonomy id) is right when the first diagnosis has that id; it is a
  **false clean** when no diagnosis is a problem (``fleet logs --diagnose`` would exit 0);
- a healthy log (label ``clean``) is right when no diagnosis is a problem; otherwise it is
  a **false alarm**.

``python -m tests.corpus.measure [DIR...]`` prints the numbers (and, with ``-v``, every
miss); ``tests/unit/test_diag_measure.py`` holds them to their floors.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from fleet.diagnosis import diagnose_text, diagnoses_exit_code

CORPUS = Path(__file__).resolve().parent
CLEAN = "clean"


@dataclass
class Score:
    name: str
    total: int = 0
    right: int = 0
    false_clean: list[str] = field(default_factory=list)
    false_alarm: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)  # every miss, "file: expected X, got [...]"

    @property
    def top1(self) -> float:
        return self.right / self.total if self.total else 0.0

    def add(self, other: Score) -> None:
        self.total += other.total
        self.right += other.right
        self.false_clean += other.false_clean
        self.false_alarm += other.false_alarm
        self.wrong += other.wrong

    def line(self) -> str:
        return (
            f"{self.name:14s} {self.right:4d}/{self.total:<4d} top-1 {self.top1:6.1%}  "
            f"false clean {len(self.false_clean)}  false alarm {len(self.false_alarm)}"
        )


def labels(root: Path) -> dict[str, dict[str, str]]:
    data: dict[str, dict[str, str]] = json.loads((root / "labels.json").read_text())
    return data


def judge(path: Path, label: str) -> tuple[bool, str | None, list[str]]:
    """(right, kind of miss or None, ids diagnosed) for one log."""
    diags = diagnose_text(path.read_bytes())
    ids = [d.id for d in diags]
    problem = diagnoses_exit_code(diags) != 0
    if label == CLEAN:
        return (not problem, "false alarm" if problem else None, ids)
    if not problem:
        return (False, "false clean", ids)
    return (bool(ids) and ids[0] == label, None, ids)


def score(root: Path, name: str, only: set[str] | None = None) -> Score:
    out = Score(name)
    for fname, entry in sorted(labels(root).items()):
        if only is not None and entry.get("set", "held-out") not in only:
            continue
        ok, miss, ids = judge(root / fname, entry["id"])
        out.total += 1
        if ok:
            out.right += 1
            continue
        out.wrong.append(f"{fname}: expected {entry['id']}, got {ids}")
        if miss == "false clean":
            out.false_clean.append(fname)
        elif miss == "false alarm":
            out.false_alarm.append(fname)
    return out


def main(argv: list[str]) -> int:
    verbose = "-v" in argv
    dirs = [Path(a) for a in argv if a != "-v"] or [CORPUS / "real", CORPUS / "wild"]
    total = Score("total")
    for d in dirs:
        s = score(d, d.name)
        total.add(s)
        print(s.line())
        if verbose:
            print("\n".join("    " + w for w in s.wrong))
    print(total.line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
