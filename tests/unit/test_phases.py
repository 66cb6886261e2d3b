"""The load phase tracker (fleet/serving/phases.py).

Checked three ways: every pattern's format string against the real wheels of its version
families; the research transcript of a real-shaped 0.17.0 start (tests/fixtures/serve,
from docs/research/vllm-serve.md §1.5); and the rehearsal vLLM's own output for several
versions, read live the way `fleet serve` follows a log (partial lines included).
"""

from __future__ import annotations

import ast
import signal
import time
from pathlib import Path

import pytest
from sim_harness import Sim, make_home, patched_tree, serve_args

from fleet.onhost.families import version_tuple
from fleet.sandbox.vllm_source import vllm_tree
from fleet.serving.phases import (
    FAMILIES,
    PATTERNS,
    PHASES,
    PhaseTracker,
    fmt_regex,
    message_of,
    patterns_for,
    segments,
    version_family,
)
from tests.versions import FAMILY_REPRESENTATIVES, TESTED, needs_patch
from tests.versions import PHASES as TESTED_PHASES

TRANSCRIPT = (
    Path(__file__).resolve().parents[1] / "fixtures" / "serve" / "vllm-0.17.0-transcript.log"
)
REPRESENTATIVES = TESTED_PHASES


def _strings(path: Path) -> list[str]:
    """Every string literal of a module (implicit concatenations joined by ast), and the
    literal parts of f-strings."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append(node.value)
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_every_pattern_is_a_real_format_string_of_its_family(family: str) -> None:
    missing = []
    for pattern in PATTERNS:
        if family not in pattern.families or pattern.source == "uvicorn":
            continue
        found = False
        for version in REPRESENTATIVES[family]:
            path = vllm_tree(version) / "vllm" / pattern.source
            if path.exists() and any(
                (s.startswith(pattern.fmt) if pattern.prefix else s == pattern.fmt)
                for s in _strings(path)
            ):
                found = True
        if not found:
            missing.append((pattern.phase, pattern.fmt, pattern.source))
    assert missing == []


def test_patterns_per_family_and_regexes() -> None:
    assert version_family("0.14.1") == "<=0.14" and version_family("0.17.0") == "0.15-0.17"
    assert version_family("0.33.0") == ">=0.18" and version_family(None) is None
    old = {p.fmt for p in patterns_for("0.13.0")}
    new = {p.fmt for p in patterns_for("0.18.0")}
    assert "Starting vLLM API server %d on %s" in old and "Starting vLLM server on %s" not in old
    assert "Starting vLLM server on %s" in new and "Starting vLLM API server %d on %s" not in new
    assert fmt_regex("Loading weights took %.2f seconds").match(
        "Loading weights took 12.50 seconds"
    )
    assert not fmt_regex("Loading weights took %.2f seconds").match(
        "Loading weights took x seconds"
    )
    assert fmt_regex("Route: %s, Methods: %s").match("Route: /health, Methods: GET")
    assert [p.phase for p in PATTERNS] == sorted((p.phase for p in PATTERNS), key=PHASES.index)


def test_segments_split_tqdm_updates_and_keep_record_line_ends() -> None:
    prefix = "(Worker pid=7) (Worker_TP0 pid=7) "
    desc = "\rCapturing CUDA graphs (decode, FULL):"
    line = (
        prefix
        + desc
        + "   0%|          | 0/7 [00:00<?, ?it/s]"
        + desc
        + " 100%|██████████| 7/7 [00:00<00:00, 19.77it/s]"
    )
    parts = segments(line)
    assert len(parts) == 2 and all(p.startswith(prefix) for p in parts)
    assert message_of(parts[1]).startswith("Capturing CUDA graphs (decode, FULL): 100%")
    # a multi-line record's "\r\n" is a line end, not an update
    header = "(APIServer pid=1) INFO 12-01 10:00:03 [utils.py:302] "
    record = header + "\r\n" + header + "art\r"
    assert [m for m in map(message_of, segments(record)) if m] == ["art"]
    coloured = (
        "\x1b[0;36m(Worker_TP3 pid=9)\x1b[0;0m INFO 01-02 03:04:05 [loader.py:1] "
        "Loading weights took 1.00 seconds"
    )
    assert message_of(coloured) == "Loading weights took 1.00 seconds"
    uvicorn = "(APIServer pid=1) INFO:     Application startup complete."
    assert message_of(uvicorn) == "Application startup complete."
    assert message_of("INFO 01-02 03:04:05 [x.py:1] plain") == "plain"


def test_the_research_transcript() -> None:
    tracker = PhaseTracker("0.17.0")
    snapshots = {}
    for raw in TRANSCRIPT.read_text(encoding="utf-8").split("\n"):
        if raw.startswith("#") or not raw:
            continue
        tracker.feed(raw)
        if "32/64 [19:14<19:13" in raw:
            snapshots["half"] = tracker.progress
    assert [e.phase for e in tracker.events] == list(PHASES[1:])
    half = snapshots["half"]
    assert (half.phase, half.shards_done, half.shards_total, half.percent) == (
        "weights",
        32,
        64,
        50.0,
    )
    assert half.eta_s == 19 * 60 + 13  # tqdm's own remaining
    assert tracker.progress.phase == "ready"
    assert (tracker.progress.shards_done, tracker.progress.shards_total) == (64, 64)


W0 = "(Worker pid=2) (Worker_TP0 pid=2) "


def test_the_phase_never_goes_back_and_late_lines_are_ignored() -> None:
    tracker = PhaseTracker("0.17.0")
    tracker.feed(W0 + "INFO 12-01 10:39:04 [gpu_model_runner.py:4279] Loading drafter model...")
    late = (
        "(Worker pid=5) (Worker_TP3 pid=5) INFO 12-01 10:39:04 [compressed_tensors_moe.py:191] "
        "Using CompressedTensorsWNA16MarlinMoEMethod"
    )
    tracker.feed(
        W0 + "INFO 12-01 10:39:04 [parallel_state.py:1393] world_size=8 rank=0 local_rank=0 "
        "distributed_init_method=tcp://127.0.0.1:1 backend=nccl"
    )
    assert tracker.feed(late) == [] and tracker.phase == "drafter"
    # the drafter's own bar does not overwrite the target's shard count
    tracker.feed(
        W0
        + "\rLoading safetensors checkpoint shards: 100% Completed | 1/1 [00:02<00:00,  2.95s/it]"
    )
    assert tracker.progress.shards_total is None and tracker.progress.detail == "drafter 1/1 shards"


def test_eta_from_elapsed_when_tqdm_has_no_remaining_yet() -> None:
    tracker = PhaseTracker()
    tracker.feed("\rLoading safetensors checkpoint shards:   6% Completed | 4/64 [02:00<?, ?it/s]")
    assert tracker.progress.eta_s == pytest.approx(120 / 4 * 60)
    events = tracker.feed(
        "\rLoading safetensors checkpoint shards: 100% Completed | 64/64 [32:00<00:00, 30.00s/it]"
    )
    assert events == [] and tracker.progress.eta_s == 0.0


# each log family's representative and the newest release tested
LIVE = sorted({*FAMILY_REPRESENTATIVES, TESTED[-1]}, key=version_tuple)


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("phase-trees")
    return {v: patched_tree(v, root) if needs_patch(v) else vllm_tree(v) for v in LIVE}


@pytest.mark.parametrize("version", LIVE)
def test_following_the_simulator_live(version: str, trees: dict[str, Path], tmp_path: Path) -> None:
    """Read the log while it grows, in whatever chunks the file holds (a follower sees
    partial lines: tqdm's updates before their line end), as fleet serve does."""
    home = make_home(tmp_path / "home", load_seconds=3.0)
    sim = Sim(home, trees[version], serve_args(home, version))
    tracker = PhaseTracker(version)
    offset = 0
    pending = ""
    seen_weights = []
    try:
        deadline = time.monotonic() + 90
        while tracker.phase != "ready" and time.monotonic() < deadline:
            data = sim.output()[offset:]
            offset += len(data)
            pending += data.decode("utf-8", errors="replace")
            *complete, pending = pending.split("\n")
            for line in complete:
                tracker.feed(line)
            if tracker.phase == "weights" and tracker.progress.shards_done:
                seen_weights.append(tracker.progress)
            if sim.proc.poll() is not None:
                break
            time.sleep(0.05)
        assert tracker.phase == "ready", sim.output()[-2000:]
    finally:
        sim.signal(signal.SIGTERM)
        sim.wait(30)
    assert [e.phase for e in tracker.events] == list(PHASES[1:])
    total = 62 if version == "0.13.0" else 64
    middle = [p for p in seen_weights if 0 < (p.shards_done or 0) < total]
    assert middle, "no progress seen while the weights loaded"
    assert all(p.shards_total == total and p.eta_s is not None and p.eta_s >= 0 for p in middle)
    assert middle[0].percent is not None and middle[0].percent < 100
