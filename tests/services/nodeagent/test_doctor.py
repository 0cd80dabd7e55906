"""`loom doctor`'s checks on the fake backend: every check passes on a healthy fake node, and
each fails (or warns) with the fault the fake backend injects for it, naming what it
measured and the fix; the other checks and the other GPUs are untouched.

The fake node is built by `make_node()` (a fixture builder: `make_node().gpus(4).faults(
"xid=1:79").expect(4)`); its host is the fake's (`FakeHost` without a real machine behind
it, but for the checkpoint and MPS directories, which are real temporary ones).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from schemas.events import HealthProblem
from services.nodeagent.check_result import Check
from services.nodeagent.doctor import (
    CHECKS,
    EXIT_FAIL,
    EXIT_PASS,
    EXIT_WARN,
    ON_HEARTBEAT,
    PER_GPU,
    Doctor,
    DoctorConfig,
    daemon_answers,
    exit_status,
    worst,
)
from services.nodeagent.gpu import FakeBackend, FakeFaults, GpuBackendError, MpsControl
from services.nodeagent.health_monitor import to_health
from services.nodeagent.probes import FakeHost, TorchReport


@dataclass
class NodeBuilder:
    root: Path
    _gpus: int = 2
    _faults: str = ""
    _expect: int | None = None
    _trainers: bool = True
    _checkpoint: Path | None = None
    _mps: Path | None = None
    config: dict[str, object] = field(default_factory=dict)

    def gpus(self, n: int) -> NodeBuilder:
        self._gpus = n
        return self

    def faults(self, spec: str) -> NodeBuilder:
        self._faults = spec
        return self

    def expect(self, n: int) -> NodeBuilder:
        self._expect = n
        return self

    def simulated(self) -> NodeBuilder:
        self._trainers = False
        return self

    def checkpoint(self, path: Path) -> NodeBuilder:
        self._checkpoint = path
        return self

    def mps_dir(self, path: Path) -> NodeBuilder:
        self._mps = path
        return self

    def build(self) -> tuple[Doctor, FakeBackend]:
        fake = FakeBackend(self._gpus, node="n0", faults=FakeFaults.parse(self._faults))
        mps = self._mps or self.root / "mps"
        doctor = Doctor(fake, FakeHost(fake),
                        MpsControl(mps / "pipe", mps / "log", run=fake.run),
                        DoctorConfig(checkpoint_root=self._checkpoint or self.root / "ckpt",
                                     expect_gpus=self._expect, trainers=self._trainers,
                                     **self.config))  # type: ignore[arg-type]
        return doctor, fake

    def run(self) -> list[Check]:
        return asyncio.run(self.build()[0].run())


@pytest.fixture
def make_node(tmp_path: Path) -> Callable[[], NodeBuilder]:
    return lambda: NodeBuilder(tmp_path)


def find(checks: list[Check], name: str, gpu: int | None = None) -> Check:
    [hit] = [c for c in checks if c.name == name and c.gpu == gpu]
    return hit


def test_a_healthy_fake_node_passes_every_check(make_node: Callable[[], NodeBuilder]) -> None:
    checks = make_node().expect(2).run()
    assert [c.name for c in checks] == ["driver", "gpus", *(n for n in PER_GPU for _ in (0, 1)),
                                        *CHECKS[len(PER_GPU) + 2:]]
    assert {c.name for c in checks} == set(CHECKS)
    assert all(c.status == "pass" and not c.fix for c in checks), \
        [c for c in checks if c.status != "pass"]
    assert exit_status(checks) == EXIT_PASS
    assert "GPU-fake-n0-1" in find(checks, "gpus").measured  # UUIDs and memory listed
    assert "16.0 GiB" in find(checks, "gpus").measured


# (faults, check, GPU, status, measured contains, fix contains)
FAILURES = [
    ("no_nvml", "driver", None, "fail", "Driver Not Loaded", "nvidia-smi must work"),
    ("missing=1", "gpus", None, "fail", "1 GPUs visible of the 2", "nvidia-smi -L"),
    ("lost=1", "gpus", 1, "fail", "GPU 1 stopped answering", "nvidia-smi -r -i 1"),
    ("ecc_uncorrectable=1:3", "ecc", 1, "fail", "3 uncorrectable", "replace the GPU"),
    ("ecc_off=0", "ecc", 0, "warn", "ECC disabled", "nvidia-smi -i 0 -e 1"),
    ("remap_failed=1", "memory", 1, "fail", "row remap FAILED", "replace it"),
    ("remap_pending=0", "memory", 0, "warn", "waits for a reset", "nvidia-smi -r -i 0"),
    ("xid=1:79", "xid", 1, "fail", "XID 79 (GPU has fallen off the bus)", "reset it"),
    ("xid=1:48", "xid", 1, "fail", "XID 48 (double-bit ECC error)", "reset it"),
    ("xid=0:13", "xid", 0, "warn", "XID 13 (graphics engine exception)", "job's own fault"),
    ("hot=1", "temperature", 1, "fail", "92 °C", "cooling"),
    ("hot=0:88", "temperature", 0, "warn", "88 °C (slows down at 87", "cooling"),
    ("throttle=0", "throttle", 0, "warn", "hardware thermal slowdown", "cooling"),
    ("throttle=1:0x80", "throttle", 1, "warn", "hardware power brake", "power supply"),
    ("no_dcgm", "dcgm", None, "warn", "DCGM_FI_DEV_GPU_UTIL", "nv-hostengine"),
    ("no_torch", "torch", None, "fail", "No module named 'torch'", "./scripts/setup torch"),
    ("no_cuda", "torch", None, "fail", "CUDA not available", "whl/cu124"),
    ("torch_cuda=13.0", "torch", None, "fail", "only up to 12.4", "upgrade the NVIDIA driver"),
    ("torch_cuda=12.8", "torch", None, "warn", "minor version compatibility", "driver"),
    ("no_gloo", "gloo", None, "fail", "gloo cannot bind", "GLOO_SOCKET_IFNAME"),
    ("no_nccl", "nccl", None, "fail", "unhandled system error", "NCCL_DEBUG=INFO"),
    ("mps", "mps", None, "fail", "did not start", "nvidia-cuda-mps-control"),
    ("checkpoint_readonly", "checkpoint", None, "fail", "Permission denied", "writable by"),
    ("checkpoint_free=500M", "checkpoint", None, "fail", "0.5 GiB free", "free space"),
    ("checkpoint_free=5G", "checkpoint", None, "warn", "5.0 GiB free", "larger volume"),
    ("nats", "nats", None, "fail", "connection refused", "LOOM_NATS_PASSWORD"),
    ("skew=30", "clock", None, "fail", "+30.000 s", "NTP"),
    ("skew=-1.5", "clock", None, "warn", "-1.500 s", "NTP"),
]


@pytest.mark.parametrize(("faults", "check", "gpu", "status", "measured", "fix"), FAILURES,
                         ids=[f[0] for f in FAILURES])
def test_each_fault_fails_its_check_with_the_measured_value_and_the_fix(
        make_node: Callable[[], NodeBuilder], faults: str, check: str, gpu: int | None, status: str,
        measured: str, fix: str) -> None:
    checks = make_node().expect(2).faults(faults).run()
    hit = find(checks, check, gpu)
    assert hit.status == status, hit
    assert measured in hit.measured and fix in hit.fix, hit
    assert exit_status(checks) == (EXIT_FAIL if status == "fail" else EXIT_WARN)
    # Nothing else is blamed: the other checks pass, or are skipped for this one's sake.
    others = [c for c in checks if c is not hit and c.status not in ("pass", "skip")]
    assert others == [], others
    if gpu is not None:  # the node's other GPU is fine
        other = [c for c in checks if c.gpu == 1 - gpu]
        assert other and all(c.status == "pass" for c in other)


@pytest.mark.parametrize(("faults", "skipped"), [
    ("no_nvml", {"gpus", *PER_GPU, "torch"}),  # torch: against which driver?
    ("no_torch", {"gloo", "nccl"}),
    ("no_cuda", {"nccl"}),
    ("nats", {"clock"}),
])
def test_checks_that_depend_on_a_failed_one_are_skipped_with_why(
        make_node: Callable[[], NodeBuilder], faults: str, skipped: set[str]) -> None:
    checks = make_node().faults(faults).run()
    assert {c.name for c in checks if c.status == "skip"} == skipped
    assert all(c.measured for c in checks if c.status == "skip")


def test_a_lost_gpu_has_no_other_checks_and_the_rest_are_checked(
        make_node: Callable[[], NodeBuilder]) -> None:
    checks = make_node().gpus(3).faults("lost=1").run()
    assert not [c for c in checks if c.gpu == 1 and c.name != "gpus"]
    assert {c.gpu for c in checks if c.name == "ecc"} == {0, 2}


def test_a_real_directory_that_cannot_be_written_fails_checkpoint_and_mps(
        make_node: Callable[[], NodeBuilder], tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    checks = make_node().checkpoint(blocker / "ckpt").mps_dir(blocker / "mps").run()
    assert find(checks, "checkpoint").status == "fail"
    assert "NotADirectoryError" in find(checks, "checkpoint").measured
    assert find(checks, "mps").status == "fail" and "not writable" in find(checks, "mps").measured


def test_simulated_trainers_skip_torch_and_its_collectives(
        make_node: Callable[[], NodeBuilder]) -> None:
    checks = make_node().simulated().faults("no_torch").run()
    assert {c.name: c.status for c in checks if c.name in ("torch", "gloo", "nccl")} == \
        dict.fromkeys(("torch", "gloo", "nccl"), "skip")


def test_the_doctor_starts_mps_and_stops_it_again_unless_the_agent_keeps_it(
        make_node: Callable[[], NodeBuilder]) -> None:
    doctor, fake = make_node().build()
    asyncio.run(doctor.run())
    assert [c[-1] for c in fake.commands if c[0] == "env"] == ["-d", "quit"]
    doctor.keep_mps = True
    fake.commands.clear()
    assert doctor.mps_check().status == "pass"
    assert doctor.mps is not None and doctor.mps.started
    assert doctor.mps_check().measured.startswith("running (this agent's)")
    assert [c[-1] for c in fake.commands if c[0] == "env"] == ["-d"]  # once


def test_heartbeat_checks_are_the_cheap_ones_and_see_faults_appear_and_go(
        make_node: Callable[[], NodeBuilder]) -> None:
    doctor, fake = make_node().build()
    assert {c.name for c in doctor.quick()} == set(ON_HEARTBEAT)
    fake.faults = FakeFaults.parse("ecc_uncorrectable=0,checkpoint_readonly")
    failing = {(c.name, c.gpu) for c in doctor.quick() if c.status == "fail"}
    assert failing == {("ecc", 0), ("checkpoint", None)}
    fake.faults = FakeFaults()
    assert worst(doctor.quick()) == "pass"


def test_the_heartbeat_report_carries_problems_only() -> None:
    checks = [Check("driver", "pass", "ok"), Check("ecc", "fail", "GPU 1: 2 uncorrectable",
                                                    "fix", gpu=1),
              Check("dcgm", "warn", "absent"), Check("nccl", "skip", "no CUDA")]
    assert to_health(checks).problems == (
        HealthProblem(check="ecc", status="fail", detail="GPU 1: 2 uncorrectable", gpu=1),
        HealthProblem(check="dcgm", status="warn", detail="absent"))
    assert to_health([Check("driver", "pass", "ok")]).problems == ()


@pytest.mark.parametrize(("statuses", "code"), [
    ((), EXIT_PASS), (("pass", "skip"), EXIT_PASS), (("pass", "warn"), EXIT_WARN),
    (("warn", "fail", "pass"), EXIT_FAIL)])
def test_exit_status_is_the_worst_result(statuses: tuple[str, ...], code: int) -> None:
    assert exit_status(Check("driver", s, "") for s in statuses) == code  # type: ignore[arg-type]


def test_fake_faults_are_parsed_and_bad_ones_named() -> None:
    f = FakeFaults.parse("ecc_uncorrectable=1, xid=1:79,xid=0:13,no_dcgm,skew=-2.5,"
                         "checkpoint_free=2G,hot=0:90,missing=1")
    assert f.ecc_uncorrectable == ((1, 1),) and f.xids == ((1, 79), (0, 13))
    assert f.no_dcgm and f.skew_s == -2.5 and f.checkpoint_free == 2 << 30
    assert f.temperature == ((0, 90),) and f.missing == 1
    assert FakeFaults.parse("") == FakeFaults()
    with pytest.raises(ValueError, match="unknown fake fault 'ecc'; known: no_nvml"):
        FakeFaults.parse("ecc")
    with pytest.raises(ValueError, match="fake fault 'xid=1': xid=G:X"):
        FakeFaults.parse("xid=1")
    with pytest.raises(ValueError, match=r"no_dcgm=1.*takes no value"):
        FakeFaults.parse("no_dcgm=1")


def test_a_running_mps_daemon_is_found_on_its_socket_not_by_the_file_left_behind(
        make_node: Callable[[], NodeBuilder], tmp_path: Path) -> None:
    """A daemon that quit leaves its control socket (seen on an H200, MPS 13): only a
    connection tells a running daemon from a dead one."""
    pipe = tmp_path / "m" / "pipe"
    pipe.mkdir(parents=True)
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listening.bind(str(pipe / "control"))
    listening.listen()
    doctor, fake = make_node().mps_dir(tmp_path / "m").build()
    try:
        assert daemon_answers(pipe)
        check = doctor.mps_check()
        assert check.status == "pass" and check.measured.startswith("running (it answers")
        assert not [c for c in fake.commands if c[0] == "env"]  # left alone
    finally:
        listening.close()
    assert (pipe / "control").exists() and not daemon_answers(pipe)
    assert "started and stopped" in doctor.mps_check().measured


def test_a_daemon_another_process_runs_already_passes(tmp_path: Path) -> None:
    def busy(argv: Sequence[str], stdin: str = "") -> str:
        raise GpuBackendError(f"{' '.join(argv)} exited 1: An instance of this daemon is "
                              "already running")

    fake = FakeBackend(1)
    doctor = Doctor(fake, FakeHost(fake), MpsControl(tmp_path / "p", tmp_path / "l", run=busy),
                    DoctorConfig(checkpoint_root=tmp_path / "c"))
    check = doctor.mps_check()
    assert check.status == "pass" and "another process's" in check.measured
    assert doctor.mps is not None and not doctor.mps.started  # not ours to stop


def test_a_refresh_probes_torch_again_only_where_it_did_not_pass(
        make_node: Callable[[], NodeBuilder]) -> None:
    """The probe takes GPU 0 for a moment: not while it passes and jobs run there."""
    doctor, fake = make_node().build()
    calls: list[int] = []
    probe = doctor.host.torch

    def counted() -> TorchReport:
        calls.append(1)
        return probe()

    doctor.host.torch = counted  # type: ignore[method-assign]
    first = asyncio.run(doctor.run())
    again = asyncio.run(doctor.slow(first))
    assert len(calls) == 1 and find(again, "gloo").status == "pass"
    fake.faults = FakeFaults.parse("no_nccl")
    failing = [c if c.name != "nccl" else Check("nccl", "fail", "x") for c in first]
    assert find(asyncio.run(doctor.slow(failing)), "nccl").status == "fail"
    assert len(calls) == 2
