"""deploy/systemd: every unit passes `systemd-analyze verify` without a word on stderr.

`systemd-analyze verify` works without systemd as PID 1, but it fails when an Exec*= binary
is missing on this machine and only warns (exit 0) on unknown keys or bad values. So each unit
is verified in a fake root (a copy of the system's unit directory, Loom's units under
/etc/systemd/system, executable stubs at every Exec*= path) and any stderr output fails the
test. The ExecStart lines, with their variables expanded from the example loom.env, must also
parse with Loom's own CLI.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from loom.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
UNITS_DIR = REPO / "deploy" / "systemd"
CONTROL_PLANE = ["loom-scheduler.service", "loom-placer.service", "loom-metrics.service"]
UNITS = [*CONTROL_PLANE, "loom-nats.service", "loom-control-plane.target",
         "loom-nodeagent@.service", "loom-nodeagent@n0.service"]
EXEC_KEYS = ("ExecStart", "ExecStartPre", "ExecStartPost", "ExecReload", "ExecStop",
             "ExecStopPost", "ExecCondition")
SYSTEM_UNITS = next((p for p in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system"))
                     if p.is_dir()), None)


def analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        pytest.skip("systemd-analyze is not installed (Debian/Ubuntu package: systemd)")
    return found


def unit_file(name: str) -> Path:
    """The file behind a unit name (an instance comes from its template)."""
    template = re.sub(r"@[^.]+\.", "@.", name)
    return UNITS_DIR / template


def settings(path: Path) -> list[tuple[str, str, str]]:
    """(section, key, value) of a unit file, continuation lines joined."""
    out: list[tuple[str, str, str]] = []
    section = ""
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.append((section, key.strip(), value.strip()))
    return out


def values(path: Path, key: str) -> list[str]:
    return [v for _, k, v in settings(path) if k == key]


def executables(path: Path) -> list[str]:
    """The programs a unit runs (Exec*= prefixes such as -, +, @ and ! removed)."""
    out = []
    for key in EXEC_KEYS:
        for value in values(path, key):
            out.append(shlex.split(value.lstrip("-+@!:"))[0])
    return out


def environment(path: Path) -> dict[str, str]:
    """Environment= defaults, then the example /etc/loom/loom.env over them (as systemd)."""
    env: dict[str, str] = {}
    for value in values(path, "Environment"):
        for item in shlex.split(value):
            key, _, val = item.partition("=")
            env[key] = val
    for line in (UNITS_DIR / "loom.env").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, val = line.partition("=")
            env[key.strip()] = val.strip()
    return env


def expand(command: str, env: dict[str, str], instance: str) -> list[str]:
    """systemd's expansion: ${VAR} is one word, $VAR splits at whitespace, %i the instance."""
    words: list[str] = []
    for word in shlex.split(command.replace("%i", instance)):
        whole = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if whole:
            words += env[whole.group(1)].split()
            continue
        words.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env[m.group(1)], word))
    return words


@pytest.fixture(scope="module")
def fake_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    analyze()
    root = tmp_path_factory.mktemp("root")
    if SYSTEM_UNITS is not None:  # the units Loom's refer to (network-online.target...)
        shutil.copytree(SYSTEM_UNITS, root / "usr/lib/systemd/system", symlinks=True)
    system = root / "etc/systemd/system"
    system.mkdir(parents=True)
    for unit in UNITS_DIR.glob("loom*.[st]*"):
        if unit.suffix in (".service", ".target"):
            shutil.copy(unit, system / unit.name)
    (root / "etc/loom").mkdir()
    shutil.copy(UNITS_DIR / "loom.env", root / "etc/loom/loom.env")
    for unit in system.iterdir():
        for program in executables(unit):
            assert program.startswith("/"), f"{unit.name}: {program} is not an absolute path"
            stub = root / program.lstrip("/")
            stub.parent.mkdir(parents=True, exist_ok=True)
            stub.write_text("#!/bin/sh\nexit 0\n")
            stub.chmod(0o755)
    yield root


def verify(root: Path, unit: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [analyze(), "verify", f"--root={root}", "--man=no", f"/etc/systemd/system/{unit}"],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "SYSTEMD_LOG_COLOR": "0", "SYSTEMD_PAGER": ""})


def test_every_shipped_unit_is_tested() -> None:
    shipped = {p.name for p in UNITS_DIR.iterdir() if p.suffix in (".service", ".target")}
    assert shipped == {unit_file(u).name for u in UNITS}


@pytest.mark.parametrize("unit", UNITS)
def test_unit_verifies_cleanly(fake_root: Path, unit: str) -> None:
    done = verify(fake_root, unit)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr


def test_the_check_bites(fake_root: Path) -> None:
    """A misspelt key only warns (exit 0): the stderr check is what catches it."""
    system = fake_root / "etc/systemd/system"
    good = (system / "loom-placer.service").read_text()
    (system / "loom-typo.service").write_text(good.replace("Restart=", "Restrat=", 1))
    (system / "loom-missing.service").write_text(
        good.replace("/opt/loom/bin/loom", "/opt/loom/bin/no-such-binary", 1))
    try:
        typo = verify(fake_root, "loom-typo.service")
        assert "Unknown key 'Restrat'" in typo.stderr, typo.stderr
        missing = verify(fake_root, "loom-missing.service")
        assert missing.returncode != 0 and "no-such-binary" in missing.stderr
    finally:
        (system / "loom-typo.service").unlink()
        (system / "loom-missing.service").unlink()


@pytest.mark.parametrize(("unit", "threshold"), [
    *[(u, 25) for u in [*CONTROL_PLANE, "loom-nats.service"]],
    ("loom-nodeagent@n0.service", 50),  # GPUs, trainers: fewer walls, by design
])
def test_exposure_stays_low(fake_root: Path, unit: str, threshold: int) -> None:
    """`systemd-analyze security` (0 = locked down, 10 = exposed), times ten, at most this."""
    done = subprocess.run(
        [analyze(), "security", "--offline=true", f"--root={fake_root}",
         f"--threshold={threshold}", "--no-pager", f"/etc/systemd/system/{unit}"],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "SYSTEMD_LOG_COLOR": "0", "SYSTEMD_COLORS": "0"})
    level = re.search(r"Overall exposure level for \S+: ([\d.]+)", done.stdout)
    assert level, done.stdout + done.stderr
    assert done.returncode == 0, f"{unit}: exposure {level.group(1)} > {threshold / 10}"


def test_node_agent_keeps_gpus_reachable_and_trainers_time_to_checkpoint() -> None:
    unit = UNITS_DIR / "loom-nodeagent@.service"
    keys = {k: v for _, k, v in settings(unit)}
    # Each of these closes /dev/nvidia* (ProtectClock implies a DeviceAllow= list) or breaks
    # CUDA's JIT.
    for forbidden in ("PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectClock",
                      "MemoryDenyWriteExecute"):
        assert keys.get(forbidden, "no") in ("no", "false", "auto"), forbidden
    after = " ".join(values(unit, "After")).split()
    assert {"network-online.target", "nvidia-persistenced.service"} <= set(after)
    assert "network-online.target" in values(unit, "Wants")
    assert keys["Restart"] == "on-failure" and keys["KillSignal"] == "SIGTERM"
    assert keys["KillMode"] == "control-group"  # trainers get SIGTERM even if the agent died
    assert "/etc/loom/loom.env" in values(unit, "EnvironmentFile")
    grace = float(environment(unit)["LOOM_GRACE_S"])
    assert float(keys["TimeoutStopSec"]) >= grace + 30, "systemd would kill mid-checkpoint"


@pytest.mark.parametrize("unit", [*CONTROL_PLANE, "loom-nodeagent@n0.service"])
def test_exec_start_parses_with_the_loom_cli(unit: str) -> None:
    path = unit_file(unit)
    [command] = values(path, "ExecStart")
    instance = unit.partition("@")[2].rpartition(".")[0]
    argv = expand(command, environment(path), instance)
    assert argv[0] == "/opt/loom/bin/loom", argv  # the venv the Dockerfile also uses
    try:
        parsed = build_parser().parse_args(argv[1:])
    except SystemExit:
        pytest.fail(f"{unit}: `{shlex.join(argv)}` does not parse (see stderr)")
    service = unit.removeprefix("loom-").partition("@")[0].removesuffix(".service")
    assert (parsed.command, parsed.service) == ("serve", service)
    assert parsed.cluster == "/etc/loom/cluster.json"
    if service == "nodeagent":
        assert parsed.node == instance
    for key in ("User", "Group"):
        assert values(path, key) == ["loom"], f"{unit}: runs as {key} {values(path, key)}"


def test_control_plane_target_pulls_in_the_control_plane() -> None:
    target = UNITS_DIR / "loom-control-plane.target"
    assert set(" ".join(values(target, "Wants")).split()) == set(CONTROL_PLANE)
    for unit in [*CONTROL_PLANE, "loom-nats.service"]:
        path = UNITS_DIR / unit
        assert values(path, "PartOf") == ["loom-control-plane.target"], unit
        assert values(path, "WantedBy") == ["loom-control-plane.target"], unit
