"""`loom doctor`: a node proves it can run Loom's jobs before it takes work, and keeps proving it.

Each check reads one thing through the interfaces the node agent itself uses (its GPU
backend, its MPS control, a `Host` for the rest; `services.nodeagent.probes`), and says
pass, warn, fail or skip, with what it measured and, when it did not pass, the fix. The
checks, what each measures and each fix are documented in docs/doctor.md; `CHECKS` is their
order. `skip`: the check could not be made because another one failed (the GPUs' checks
without NVML) or it does not apply (NCCL without CUDA).

`loom doctor` runs them all once and exits with the worst status: 0 pass, 1 warn, 2 fail.
The node agent runs them all at start-up, the cheap ones (`ON_HEARTBEAT`: NVML reads, a
statvfs) on every heartbeat and the rest again every `REFRESH_S`, and sends the problems
with each heartbeat (`services.nodeagent.health_monitor`). What a check reports is a
`services.nodeagent.check_result.Check`; the per-GPU checks are in
`services.nodeagent.gpu_checks`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from services.nodeagent.check_result import TITLES, Check, Status
from services.nodeagent.gpu import DriverInfo, GpuBackend, GpuHealth, GpuInfo, MpsControl
from services.nodeagent.gpu_checks import check_gpu
from services.nodeagent.probes import Host, NatsReport, TorchReport, check_storage

SEVERITY: dict[Status, int] = {"pass": 0, "skip": 0, "warn": 1, "fail": 2}
EXIT_PASS, EXIT_WARN, EXIT_FAIL = 0, 1, 2

CHECKS = tuple(TITLES)
PER_GPU = ("ecc", "memory", "xid", "temperature", "throttle")
# Cheap enough for every heartbeat: NVML reads and a statvfs.
ON_HEARTBEAT = ("driver", "gpus", *PER_GPU, "checkpoint")
REFRESH_S = 600.0  # the node agent re-runs the other checks this often


@dataclass(frozen=True)
class DoctorConfig:
    checkpoint_root: Path = Path("/var/lib/loom/checkpoints")
    expect_gpus: int | None = None  # the node's GPUs in the cluster spec (None: at least 1)
    min_free_bytes: int = 1 << 30  # below: fail (a checkpoint may not fit)
    low_free_bytes: int = 10 << 30  # below: warn
    skew_warn_s: float = 0.5
    skew_fail_s: float = 5.0  # a heartbeat interval
    trainers: bool = True  # the node runs torch trainers: torch, gloo and NCCL matter


def worst(checks: Iterable[Check]) -> Status:
    return max((c.status for c in checks), key=lambda s: SEVERITY[s], default="pass")


def exit_status(checks: Iterable[Check]) -> int:
    """0 when every check passed (or was skipped), 1 with a warning, 2 with a failure."""
    return SEVERITY[worst(checks)]


def _gib(n: int) -> str:
    return f"{n / (1 << 30):,.1f} GiB"


def _version(text: str | None) -> tuple[int, ...]:
    parts: list[int] = []
    for p in (text or "").split("."):
        digits = "".join(c for c in p if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


class Doctor:
    """The checks of one node. `backend` is None where no backend could start
    (`backend_error` says why). `mps` is the node's MPS control: with `keep_mps` (the node
    agent) a daemon it starts keeps running; else (`loom doctor`) it is stopped again."""

    def __init__(self, backend: GpuBackend | None, host: Host, mps: MpsControl | None,
                 config: DoctorConfig, *, backend_error: str | None = None,
                 keep_mps: bool = False) -> None:
        self.backend = backend
        self.host = host
        self.mps = mps
        self.config = config
        self.backend_error = backend_error
        self.keep_mps = keep_mps
        self.driver_info: DriverInfo | None = None
        self.visible: int | None = None  # GPUs NVML shows (None: not known)

    # -- all of them ---------------------------------------------------------------------------
    async def run(self) -> list[Check]:
        """Every check, in `CHECKS` order (torch's probe and MPS in a worker thread)."""
        checks = self.gpu_checks()
        checks.append(self.dcgm_check())
        checks += await asyncio.to_thread(self.torch_checks)
        checks.append(await asyncio.to_thread(self.mps_check))
        checks.append(self.checkpoint_check(write=True))
        checks += await self.nats_checks()
        return checks

    def quick(self) -> list[Check]:
        """The heartbeat's checks (`ON_HEARTBEAT`)."""
        return [*self.gpu_checks(discover=False), self.checkpoint_check(write=False)]

    async def slow(self, previous: Sequence[Check] = ()) -> list[Check]:
        """The checks not made on every heartbeat, again. Torch's probe takes a GPU for a
        moment (a CUDA context, an NCCL all-reduce on GPU 0), which running jobs must not
        lose: it runs again only where it did not pass (to notice the fix)."""
        torch = [c for c in previous if c.name in _TORCH]
        if not torch or any(c.status in ("warn", "fail") for c in torch):
            torch = await asyncio.to_thread(self.torch_checks)
        checks = [self.dcgm_check(), *torch, await asyncio.to_thread(self.mps_check)]
        return checks + await self.nats_checks()

    # -- GPUs ----------------------------------------------------------------------------------
    def gpu_checks(self, discover: bool = True) -> list[Check]:
        """The driver, the GPUs it shows, and each GPU's health (grouped by check); without
        `discover` the GPUs are listed by UUID only (one NVML read less per GPU)."""
        driver = self._driver()
        if driver.status != "pass" or self.backend is None:
            why = "not measured: NVML is not reachable"
            return [driver, Check("gpus", "skip", why),
                    *(Check(name, "skip", why) for name in PER_GPU)]
        try:
            health = self.backend.health()
        except Exception as exc:
            error = f"NVML failed reading the GPUs: {type(exc).__name__}: {exc}"
            fail = Check("driver", "fail", error, _DRIVER_FIX)
            return [fail, Check("gpus", "skip", "not measured"),
                    *(Check(name, "skip", "not measured") for name in PER_GPU)]
        found: Sequence[GpuInfo] | None = None
        if discover:
            with contextlib.suppress(Exception):  # a lost GPU fails it: its health says which
                found = self.backend.discover()
        self.visible = len(health)
        checks = [driver, *self._visible(found, health)]
        for name in PER_GPU:
            for h in health:
                if h.lost is None:
                    checks.append(check_gpu(name, h))
        return checks

    def _driver(self) -> Check:
        if self.backend is None:
            return Check("driver", "fail", self.backend_error or "no GPU backend", _DRIVER_FIX)
        try:
            d = self.driver_info = self.backend.driver()
        except Exception as exc:
            return Check("driver", "fail", f"{exc}", _DRIVER_FIX)
        return Check("driver", "pass", f"driver {d.driver_version}, CUDA {d.cuda_version}, "
                                       f"NVML {d.nvml_version} ({self.backend.name} backend)")

    def _visible(self, found: Sequence[GpuInfo] | None, health: Sequence[GpuHealth]
                 ) -> list[Check]:
        expect = self.config.expect_gpus
        listed = ("; ".join(f"{g.index}: {g.name} {g.uuid} {_gib(g.memory_bytes)}"
                            for g in found) if found is not None else
                  "; ".join(f"{h.index}: {h.uuid}" for h in health))
        n = len(health)
        checks: list[Check] = []
        if not n or (expect is not None and n < expect):
            want = f" of the {expect} the cluster spec gives this node" if expect else ""
            checks.append(Check(
                "gpus", "fail", f"{n} GPUs visible{want}" + (f": {listed}" if n else ""),
                "check `nvidia-smi -L` lists every GPU; a GPU missing there needs a reboot or "
                "its slot reseated; check CUDA_VISIBLE_DEVICES is unset for the agent; or "
                "correct the node's GPU count in the cluster spec"))
        else:
            more = f" (the cluster spec gives it {expect})" if expect and n > expect else ""
            checks.append(Check("gpus", "pass", f"{n} GPUs{more}: {listed}"))
        for h in health:
            if h.lost is not None:
                checks.append(Check(
                    "gpus", "fail", f"GPU {h.index} stopped answering: {h.lost}",
                    f"reset it (nvidia-smi -r -i {h.index}) or reboot the node, then restart "
                    "the node agent; if it recurs, reseat or replace the GPU", gpu=h.index))
        return checks

    # -- DCGM ----------------------------------------------------------------------------------
    def dcgm_check(self) -> Check:
        report = self.host.dcgm(self.backend)
        if report.present:
            return Check("dcgm", "pass", f"present: {report.detail}")
        return Check(
            "dcgm", "warn",
            f"absent ({report.detail}): the agent reads GPU utilisation (DCGM_FI_DEV_GPU_UTIL) "
            "and memory used (DCGM_FI_DEV_FB_USED) from NVML instead, instantaneous rather "
            "than DCGM's 1 s samples, and XIDs only as NVML events since it started (not "
            "DCGM_FI_DEV_XID_ERRORS)",
            "install NVIDIA's datacenter-gpu-manager and start nv-hostengine (systemctl "
            "enable --now nvidia-dcgm); the bindings are found in "
            "/usr/local/dcgm/bindings/python3 or DCGMPATH")

    # -- torch, gloo, NCCL ---------------------------------------------------------------------
    def torch_checks(self) -> list[Check]:
        if not self.config.trainers:
            why = "not measured: this node runs simulated trainers"
            return [Check(n, "skip", why) for n in ("torch", "gloo", "nccl")]
        t = self.host.torch()
        if not t.installed:
            fix = ("install PyTorch for the trainers: ./scripts/setup torch, or pip install "
                   "'loom-scheduler[torch]' (a CUDA build on GPU nodes)")
            return [Check("torch", "fail", f"torch not usable: {t.error}", fix),
                    Check("gloo", "skip", "not measured: no torch"),
                    Check("nccl", "skip", "not measured: no torch")]
        return [self._torch(t), *self._collectives(t)]

    def _torch(self, t: TorchReport) -> Check:
        driver = self.driver_info
        gpus = self.visible
        seen = f"torch {t.version}, built for CUDA {t.cuda or 'none (CPU build)'}, " \
               f"CUDA {'available' if t.cuda_available else 'not available'}, " \
               f"{t.devices} GPUs visible"
        wheel = (f"pip install torch --index-url https://download.pytorch.org/whl/cu"
                 f"{''.join(driver.cuda_version.split('.')[:2])}" if driver else
                 "install a CUDA build of torch")
        if driver is None:
            return Check("torch", "skip", f"{seen}; driver unknown (NVML not reachable)")
        if not t.cuda_available:
            return Check("torch", "fail", f"{seen}; the driver runs CUDA {driver.cuda_version}",
                         f"install a CUDA build of torch the driver runs: {wheel}")
        built, runs = _version(t.cuda), _version(driver.cuda_version)
        if built[:1] > runs[:1]:
            return Check("torch", "fail", f"{seen}; the driver runs CUDA only up to "
                                          f"{driver.cuda_version}",
                         f"upgrade the NVIDIA driver, or install torch for CUDA "
                         f"{driver.cuda_version} or older: {wheel}")
        if built[:2] > runs[:2]:
            return Check("torch", "warn", f"{seen}; the driver runs CUDA up to "
                                          f"{driver.cuda_version} (minor version compatibility:"
                                          " kernels needing the newer driver fail)",
                         f"upgrade the NVIDIA driver, or {wheel}")
        if gpus is not None and t.devices < gpus:
            return Check("torch", "warn", f"{seen}, fewer than the {gpus} NVML shows",
                         "unset CUDA_VISIBLE_DEVICES in the agent's environment")
        return Check("torch", "pass", f"{seen}; the driver runs CUDA up to "
                                      f"{driver.cuda_version}")

    def _collectives(self, t: TorchReport) -> list[Check]:
        gloo = (Check("gloo", "pass", "a one-process group all-reduced a tensor")
                if t.gloo is None else
                Check("gloo", "fail", f"gloo failed: {t.gloo}",
                      "gloo needs a resolvable hostname and a loopback interface; set "
                      "GLOO_SOCKET_IFNAME to the interface other nodes reach this one on"))
        if not t.cuda_available:
            nccl = Check("nccl", "skip", f"not measured: {t.nccl or 'no CUDA'}")
        elif t.nccl is None:
            nccl = Check("nccl", "pass", f"NCCL {t.nccl_version}: a one-process group "
                                         "all-reduced a tensor on GPU 0")
        else:
            nccl = Check("nccl", "fail", f"NCCL failed: {t.nccl}",
                         "run with NCCL_DEBUG=INFO to see why; set NCCL_SOCKET_IFNAME to the "
                         "interface between nodes; a torch build without NCCL needs a CUDA "
                         "wheel")
        return [gloo, nccl]

    # -- MPS -----------------------------------------------------------------------------------
    def mps_check(self) -> Check:
        mps = self.mps
        if mps is None:
            return Check("mps", "skip", "not measured: no MPS control configured")
        for d in (mps.pipe_dir, mps.log_dir):
            found = check_storage(d, write=True)
            if found.error is not None:
                return Check("mps", "fail", f"{d} not writable: {found.error}", _MPS_DIR_FIX)
        where = f"pipe {mps.pipe_dir}, log {mps.log_dir}"
        if mps.started:
            return Check("mps", "pass", f"running (this agent's); {where}")
        if daemon_answers(mps.pipe_dir):
            return Check("mps", "pass", f"running (it answers on its control socket); {where}")
        try:
            mps.start()
        except Exception as exc:
            mps.started = False
            return Check("mps", "fail", f"the control daemon did not start: {exc}", _MPS_FIX)
        if mps.adopted:  # it was running already (started meanwhile, or a previous agent's)
            if not self.keep_mps:
                mps.started = mps.adopted = False  # not ours to stop
            return Check("mps", "pass", f"running (another process's); {where}")
        if not self.keep_mps:
            with contextlib.suppress(Exception):
                mps.stop()
        done = "started" if self.keep_mps else "started and stopped"
        return Check("mps", "pass", f"the control daemon {done}; {where}")

    # -- the checkpoint directory --------------------------------------------------------------
    def checkpoint_check(self, write: bool) -> Check:
        cfg = self.config
        root = cfg.checkpoint_root
        found = self.host.storage(root, write)
        if found.error is not None:
            return Check("checkpoint", "fail", f"{root} not writable: {found.error}",
                         f"create {root} writable by the agent's user (mkdir -p, chown); on "
                         "several nodes it must be one shared directory (NFS), mounted "
                         "read-write")
        free, total = found.free_bytes or 0, found.total_bytes or 0
        seen = f"{root}: {_gib(free)} free of {_gib(total)}"
        fix = (f"free space under {root} (finished jobs' checkpoints can go: rm -r "
               f"{root}/<job>), or point --checkpoint-root at a larger volume")
        if free < cfg.min_free_bytes:
            return Check("checkpoint", "fail", f"{seen}, under {_gib(cfg.min_free_bytes)}", fix)
        if free < cfg.low_free_bytes:
            return Check("checkpoint", "warn", f"{seen}, under {_gib(cfg.low_free_bytes)}",
                         fix)
        return Check("checkpoint", "pass", seen)

    # -- NATS and the clock --------------------------------------------------------------------
    async def nats_checks(self) -> list[Check]:
        report = await self.host.nats()
        if report is None:
            why = "not measured: no NATS server configured"
            return [Check("nats", "skip", why), Check("clock", "skip", why)]
        if report.error is not None:
            return [Check("nats", "fail", report.error, _NATS_FIX),
                    Check("clock", "skip", "not measured: NATS not reachable")]
        rtt = f"{(report.rtt_s or 0) * 1000:.1f} ms"
        nats = Check("nats", "pass", f"{report.url} (nats-server {report.server}), "
                                     f"round trip {rtt}")
        return [nats, self._clock(report)]

    def _clock(self, report: NatsReport) -> Check:
        cfg = self.config
        if report.skew_s is None:
            return Check("clock", "skip", f"not measured: {report.skew_error}")
        skew = report.skew_s
        bound = (report.rtt_s or 0) / 2
        seen = f"{skew:+.3f} s against the server (± {bound:.3f} s)"
        fix = ("synchronise the clock: enable NTP (timedatectl set-ntp true, or chronyd) on "
               "this node and the NATS server's; cluster time and heartbeat deadlines assume "
               "clocks agree")
        if abs(skew) - bound >= cfg.skew_fail_s:
            return Check("clock", "fail", f"{seen}, over {cfg.skew_fail_s:g} s", fix)
        if abs(skew) - bound >= cfg.skew_warn_s:
            return Check("clock", "warn", f"{seen}, over {cfg.skew_warn_s:g} s", fix)
        return Check("clock", "pass", seen)


def daemon_answers(pipe_dir: Path) -> bool:
    """Whether an MPS control daemon listens on `pipe_dir/control` (a daemon that quit
    leaves the socket behind, so its existence says nothing)."""
    path = pipe_dir / "control"
    if not path.is_socket():
        return False
    # A seqpacket socket (nvidia-cuda-mps-control 13); a stream one, should that change.
    for kind in (socket.SOCK_SEQPACKET, socket.SOCK_STREAM):
        with socket.socket(socket.AF_UNIX, kind) as s:
            s.settimeout(1.0)
            try:
                s.connect(str(path))
            except OSError:
                continue
            return True
    return False


_TORCH = ("torch", "gloo", "nccl")

_DRIVER_FIX = ("install or reload the NVIDIA driver (nvidia-smi must work), and nvidia-ml-py "
               "for the agent (pip install 'loom-scheduler[gpu]'); after a driver upgrade, "
               "reboot (driver/library version mismatch)")
_MPS_DIR_FIX = ("create the directory writable by the agent's user (systemd: "
                "StateDirectory=loom), or point --checkpoint-root elsewhere (MPS uses "
                "<its parent>/mps)")
_MPS_FIX = ("nvidia-cuda-mps-control comes with the driver: put it on PATH; run the agent as "
            "a user that may start it (the GPUs' owner, or root); with compute mode "
            "EXCLUSIVE_PROCESS only MPS clients share a GPU (nvidia-smi -c)")
_NATS_FIX = ("start the server or point --nats-url (LOOM_NATS_URL) at it; check the node's "
             "user and password (LOOM_NATS_USER, LOOM_NATS_PASSWORD) or TLS files against "
             "deploy/nats/accounts.conf; see docs/security.md")
