"""What fleet serve writes on a host, pyinfra-style data tests: profile + facts in, the
exact files out (recorded in tests/fixtures/serve/). ``FLEET_RECORD=1`` rewrites them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fleet.inventory import HostSpec
from fleet.serving import units
from fleet.serving.profile import for_host

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "serve"
HOST = HostSpec(
    name="b200-01",
    address="10.0.0.11",
    python="/root/ml-env/bin/python",
    vars={"models_dir": "/models", "secrets_env": "/etc/fleet/kimi.env"},
)
LAYOUT = units.Layout(home="/root", profile="kimi-eagle3")


def _check(name: str, text: str) -> None:
    path = FIXTURES / name
    if os.environ.get("FLEET_RECORD"):
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs from the recorded file"


def test_supervisord_program_matches_the_recorded_file() -> None:
    _check("kimi-eagle3.program.conf", units.program_conf(for_host("kimi-eagle3", HOST), LAYOUT))


def test_supervisord_instance_matches_the_recorded_file() -> None:
    _check("supervisord.conf", units.supervisord_conf(LAYOUT))


def test_systemd_unit_matches_the_recorded_file() -> None:
    profile = for_host("kimi-eagle3", HOST)
    _check("fleet-kimi-eagle3.service", units.systemd_unit(profile, LAYOUT, user_unit=False))


def test_launch_script_matches_the_recorded_file() -> None:
    profile = for_host("kimi-eagle3", HOST)
    _check("kimi-eagle3.launch.sh", units.launch_script(profile, LAYOUT, python=HOST.python))


def test_launch_script_under_supervisord_matches_the_recorded_file() -> None:
    profile = for_host("kimi-eagle3", HOST)
    script = units.launch_script(profile, LAYOUT, python=HOST.python, die_with_parent=True)
    _check("kimi-eagle3.supervisord.launch.sh", script)


def _fake_vllm(tmp_path: Path, body: str) -> tuple[units.Layout, Path]:
    layout = units.Layout(home=str(tmp_path), profile="p")
    Path(layout.run_dir).mkdir(parents=True)
    fake = tmp_path / "vllm"
    fake.write_text("#!/bin/sh\n" + body)
    fake.chmod(0o755)
    return layout, fake


def test_vllm_started_under_supervisord_dies_with_its_supervisor(tmp_path: Path) -> None:
    """The guard (PR_SET_PDEATHSIG across exec): when the process that started launch.sh
    (supervisord) is SIGKILLed, vLLM gets SIGTERM; no server is left unsupervised."""
    import signal
    import sys
    import time

    layout, fake = _fake_vllm(tmp_path, 'echo "$$" > "$0.pid"; exec sleep 300\n')
    profile = for_host("kimi-eagle3", HOST).model_copy(update={"vllm": str(fake)})
    script = Path(layout.run_dir) / "launch.sh"
    script.write_text(
        units.launch_script(profile, layout, python=sys.executable, die_with_parent=True)
    )
    # a stand-in supervisor: starts launch.sh as its child and waits
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys; subprocess.call(['sh', sys.argv[1]])",
         str(script)]
    )  # fmt: skip
    pid_file = Path(str(fake) + ".pid")
    deadline = time.monotonic() + 20
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline, "vllm never started"
        time.sleep(0.05)
    child = int(pid_file.read_text())
    os.kill(child, 0)  # running
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{child}/stat") as fh:  # reaped by init as a zombie at worst
            if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
        raise AssertionError("vllm outlived its supervisor")


def test_without_the_guard_vllm_outlives_its_parent(tmp_path: Path) -> None:
    """The control: the systemd backend's script has no guard (systemd kills the unit's
    whole cgroup itself), and there a killed parent leaves the child running."""
    import signal
    import sys
    import time

    layout, fake = _fake_vllm(tmp_path, 'echo "$$" > "$0.pid"; exec sleep 300\n')
    profile = for_host("kimi-eagle3", HOST).model_copy(update={"vllm": str(fake)})
    script = Path(layout.run_dir) / "launch.sh"
    script.write_text(units.launch_script(profile, layout, python=sys.executable))
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys; subprocess.call(['sh', sys.argv[1]])",
         str(script)]
    )  # fmt: skip
    pid_file = Path(str(fake) + ".pid")
    deadline = time.monotonic() + 20
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline, "vllm never started"
        time.sleep(0.05)
    child = int(pid_file.read_text())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    time.sleep(1.0)
    try:
        os.kill(child, 0)  # still there
    finally:
        os.kill(child, signal.SIGKILL)


def test_on_failure_restart_counts_exit_0_as_a_failure() -> None:
    """vLLM exits 0 when its engine dies after start-up (vllm#48966)."""
    profile = for_host("kimi-eagle3", HOST).model_copy(update={"restart": "on-failure"})
    unit = units.systemd_unit(profile, LAYOUT, user_unit=False)
    assert "Restart=on-failure" in unit and "RestartForceExitStatus=0" in unit
    program = units.program_conf(profile, LAYOUT)
    assert "autorestart=unexpected" in program and "exitcodes=255" in program
    assert "startretries=0" in program and f"startsecs={int(profile.load_timeout_s)}" in program


def test_the_launch_script_runs_vllm_with_the_profile_and_no_secret(tmp_path: Path) -> None:
    """Run the rendered script with a stand-in vllm that prints its argv and environment."""
    profile = for_host("kimi-eagle3", HOST)
    layout = units.Layout(home=str(tmp_path), profile="p")
    run_dir = Path(layout.run_dir)
    run_dir.mkdir(parents=True)
    fake = tmp_path / "vllm"
    fake.write_text(
        '#!/bin/sh\nprintf "%s\\n" "$@"; echo "KEY=$VLLM_API_KEY"; echo "LV=$VLLM_LOGGING_LEVEL"\n'
    )
    fake.chmod(0o755)
    profile = profile.model_copy(update={"vllm": str(fake)})
    script = units.launch_script(profile, layout, python="/x/bin/python")
    (run_dir / "launch.sh").write_text(script)
    (run_dir / "secrets.env").write_text(units.secrets_file({"VLLM_API_KEY": "s3cr'et $x"}))
    out = subprocess.run(
        ["sh", str(run_dir / "launch.sh")],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
        check=True,
    ).stdout.splitlines()
    assert out[:-2] == ["serve", *profile.vllm_args()]
    assert out[-2:] == ["KEY=s3cr'et $x", "LV=INFO"]
    assert "s3cr" not in script  # the secret lives in secrets.env only


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    layout = units.Layout(home=str(tmp_path), profile="kimi-eagle3")
    Path(layout.run_dir).mkdir(parents=True)
    (Path(layout.run_dir) / "launch.sh").write_text("#!/bin/sh\n")
    unit = tmp_path / layout.unit_name
    unit.write_text(units.systemd_unit(for_host("kimi-eagle3", HOST), layout, user_unit=False))
    proc = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    problems = [line for line in proc.stderr.splitlines() if unit.name in line]
    assert proc.returncode == 0 and not problems, proc.stderr


@pytest.mark.parametrize("home", ["relative/home", "/home/a b", "/home/x%y", '/home/q"', "/h;rm"])
def test_homes_that_cannot_be_written_into_a_unit_are_refused(home: str) -> None:
    from fleet.errors import UsageError

    with pytest.raises(UsageError):
        units.Layout(home=home, profile="p")


def test_a_percent_in_a_served_name_is_literal_in_the_unit() -> None:
    """``%n`` in a unit's Description= would be systemd's unit-name specifier."""
    profile = for_host("kimi-eagle3", HOST).model_copy(update={"served_model_name": "k%n-100%"})
    unit = units.systemd_unit(profile, LAYOUT, user_unit=False)
    (line,) = [x for x in unit.splitlines() if x.startswith("Description=")]
    assert line == "Description=fleet serve kimi-eagle3 (vLLM, k%%n-100%%)"


def test_a_stalled_or_timed_out_load_is_one_diagnosis_for_a_host_or_a_group() -> None:
    """serve.load_ended: the one home of both, for one host and for a group's head."""
    from fleet.serving.serve import load_ended

    found, message = load_ended("stalled", "h1", "weights", stall_s=300, budget_s=3600)
    assert found.id == "load-stalled" and message == "stalled in weights: no output for 300s"
    assert found.evidence[0].text.endswith("no new output for 300s in phase weights")
    found, message = load_ended("timeout", "h1", "kv-cache", stall_s=300, budget_s=3600)
    assert found.id == "load-timeout" and message == "not ready within 3600s (phase kv-cache)"
