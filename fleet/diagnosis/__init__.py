"""Diagnosis: a rule catalogue (YAML, shipped in the package) and a ranking engine.

Pure entry points (lines in, ranked diagnoses out)::

    from fleet.diagnosis import diagnose, diagnose_text, Engine
    diagnoses = diagnose(lines)            # list[Diagnosis], primary root cause first
    diagnoses[0].id, diagnoses[0].summary, diagnoses[0].fix, diagnoses[0].evidence

``Engine`` is incremental (``feed(lineno, raw)`` then ``results()``) for live logs;
``fleet.diagnosis.scan.diagnose_file`` handles local files of any size and
``fleet.diagnosis.host_logs`` filters remote logs on the host with ``grep``.
"""

from fleet.diagnosis.catalogue import CompiledCatalogue, load_catalogue
from fleet.diagnosis.engine import (
    Engine,
    diagnose,
    diagnose_numbered,
    diagnose_text,
    diagnoses_exit_code,
)
from fleet.diagnosis.factory import with_values
from fleet.diagnosis.models import TAXONOMY, Diagnosis, Evidence

__all__ = [
    "TAXONOMY",
    "CompiledCatalogue",
    "Diagnosis",
    "Engine",
    "Evidence",
    "diagnose",
    "diagnose_numbered",
    "diagnose_text",
    "diagnoses_exit_code",
    "load_catalogue",
    "with_values",
]
