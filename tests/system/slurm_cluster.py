"""A real Slurm cluster on this one machine, for a system test, torn down completely afterwards.

One slurmctld in the root network namespace listens on a bridge's address; three slurmd nodes n1, n2
and n3 each live in a network namespace of their own, joined to that bridge by a veth pair, with
their own IPv4 address and (through `unshare --uts`) their own hostname, which the jobs they start
inherit. All share the mount namespace, so a job on n2 reads what a job on n1 wrote under /tmp.
A private `munged` (its own key and socket in the cluster's folder) authenticates them, so the
machine's munge setup is neither needed nor touched. The client commands find the cluster through
`SLURM_CONF` in `SlurmCluster.env`, which jobs inherit. `.ci/run` installs Debian's slurmctld,
slurmd, slurm-client and munge where they are missing.

`slurm_cluster()` is the context manager, `slurm_unavailable()` the reason to skip (or None), and
`slurm_fixture` the pytest fixture named `slurm`, for a test module to import. Needs root, `ip`,
`unshare`, munge and Debian's Slurm 22.05 packages.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import pytest

NODE_NAMES = ("n1", "n2", "n3")
NODE_CPUS = 2
SLURMD_PORT = 6818
BINARIES = ("ip", "unshare", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol", "sinfo",
            "munged")  # fmt: skip
# inherited settings that would change what the client commands do or print
FOREIGN_ENV = ("SLURM_", "SBATCH_", "SQUEUE_", "SINFO_", "SCANCEL_", "SCONTROL_", "SRUN_", "SALLOC_")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def _quiet_ip(*args: str) -> None:
    """`ip ARGS`, for teardown: failures (the thing is already gone) are ignored."""
    with suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(["ip", *args], capture_output=True, timeout=30)


def _wait_for(ready: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.2) -> None:
    """Poll `ready` until it holds; raise TimeoutError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout_s:.0f} s")
        time.sleep(interval_s)


def slurm_unavailable() -> str | None:
    """Why a Slurm cluster cannot be started here (a reason to skip), or None when it can."""
    if os.geteuid() != 0:
        return "a local Slurm cluster needs root (namespaces, daemons running as root)"
    missing = [
        b for b in BINARIES if shutil.which(b, path=f"{os.environ.get('PATH', '')}:{SYSTEM_PATH}") is None
    ]
    if missing:
        return f"not installed: {', '.join(missing)} (apt-get install slurmctld slurmd slurm-client munge)"
    probe = f"slprobe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
        _ip("netns", "del", probe)
    except (subprocess.CalledProcessError, OSError, subprocess.TimeoutExpired) as exc:
        return f"this machine cannot make network namespaces: {exc}"
    return None


def _free_subnet() -> str:
    """The first 10.78.K (K = 0, 1, ...) that no address or route on this machine uses yet."""
    addrs = subprocess.run(
        ["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, timeout=30
    ).stdout
    routes = subprocess.run(["ip", "-4", "route", "show"], capture_output=True, text=True, timeout=30).stdout
    for k in range(256):
        prefix = f"10.78.{k}."
        if f" {prefix}" not in addrs and not any(line.startswith(prefix) for line in routes.splitlines()):
            return f"10.78.{k}"
    raise RuntimeError("no free 10.78.K.0/24 subnet for the cluster's bridge")


def _free_port() -> int:
    """A TCP port free now, below the kernel's ephemeral range so no outgoing connection takes it
    (slurmctld binds every address of the root namespace)."""
    base = 12000 + os.getpid() % 15000
    for port in range(base, base + 200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free TCP port in {base}..{base + 199} for slurmctld")


def slurm_conf(cluster: str, ctl_host: str, bridge_ip: str, port: int, nodes: dict[str, str], conf_dir: Path,
               munge_socket: Path) -> str:  # fmt: skip
    """The text of slurm.conf: every daemon and client reads this one file (through SLURM_CONF)."""
    lines = [
        f"ClusterName={cluster}",
        f"SlurmctldHost={ctl_host}({bridge_ip})",
        f"SlurmctldPort={port}",
        f"SlurmdPort={SLURMD_PORT}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # a requeued job may start again only after cred_expire (default 120 s)
        f"AuthInfo=socket={munge_socket},cred_expire=20",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={conf_dir}/state",
        f"SlurmdSpoolDir={conf_dir}/spool/%n",
        f"SlurmctldPidFile={conf_dir}/run/slurmctld.pid",
        f"SlurmdPidFile={conf_dir}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={conf_dir}/log/slurmctld.log",
        f"SlurmdLogFile={conf_dir}/log/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "MailProg=/bin/true",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/backfill",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "ReturnToService=2",
        "SlurmctldTimeout=30",
        # Slurm's own default: a dead node is seen by the run (its workers lost within a liveness
        # timeout) long before Slurm marks it down, however loaded the machine
        "SlurmdTimeout=300",
        "MessageTimeout=10",
        "KillWait=5",
        "JobRequeue=1",
        "PropagateResourceLimits=NONE",
        # the nodes are what this file says, whatever the machine has
        "SlurmdParameters=config_overrides",
    ]
    for name, ip in nodes.items():
        lines.append(f"NodeName={name} NodeAddr={ip} NodeHostname={name} CPUs={NODE_CPUS} State=UNKNOWN")
    lines.append(
        f"PartitionName=main Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4"
    )
    return "\n".join(lines) + "\n"


# The cgroup plugins are never used (proctrack/linuxproc, task/none, jobacct_gather/none), but without
# this file slurmd autodetects the cgroup version and, finding /sys/fs/cgroup empty under `ip netns
# exec` (which mounts a fresh /sys), refuses to start.
CGROUP_CONF = "CgroupPlugin=cgroup/v1\n"


def _start(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A daemon in the foreground, in a process group of its own, its output in `log`."""
    with log.open("ab") as sink:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)  # fmt: skip


def _stop(proc: subprocess.Popen[bytes], grace_s: float = 10) -> None:
    """SIGTERM to `proc`'s process group, SIGKILL after `grace_s`; returns once it is reaped."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            break
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            continue
    if proc.poll() is None:
        proc.wait(30)


def _netns_pids(ns: str) -> list[int]:
    try:
        out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [int(p) for p in out.split() if p.isdigit()]


def process_alive(pid: int) -> bool:
    """Whether `pid` is a process that has not exited (a zombie has: only its parent's reaping is left)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _kill_netns(ns: str, timeout_s: float = 30) -> None:
    """SIGKILL every process in network namespace `ns` (slurmstepd and the jobs) until none is left,
    then give init a moment to reap them (a killed process leaves the namespace before it is reaped)."""
    deadline = time.monotonic() + timeout_s
    seen: set[int] = set()
    while pids := _netns_pids(ns):
        seen.update(pids)
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {pids} in namespace {ns} outlived SIGKILL")
        time.sleep(0.1)
    reap_deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in seen) and time.monotonic() < reap_deadline:
        time.sleep(0.1)
    if left := [pid for pid in seen if process_alive(pid)]:
        raise RuntimeError(f"processes {left} of namespace {ns} outlived SIGKILL")


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class SlurmCluster:
    """A running cluster: what a test needs to submit jobs to it and watch them."""

    env: dict[str, str]  # for sbatch, squeue, scancel, scontrol, sinfo; jobs inherit it
    nodes: dict[str, str]  # node name -> IPv4 address
    bridge_ip: str  # slurmctld's address, reachable from the root namespace and every node
    conf_dir: Path  # slurm.conf, cgroup.conf, state, spool, logs, pid files, munge key and socket
    namespaces: dict[str, str] = field(default_factory=dict)  # node name -> network namespace
    bridge: str = ""
    daemons: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)  # "slurmctld", "n1", ...

    def run(self, *args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A Slurm client command (`run("scontrol", "show", "job", "3")`) against this cluster."""
        proc = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def sbatch(self, *args: str) -> str:
        """Submit with `sbatch --parsable ARGS`; the job id."""
        return self.run("sbatch", "--parsable", *args).stdout.strip().split(";")[0]

    def squeue_jobs(self) -> list[dict[str, str]]:
        """The jobs squeue lists (pending, running, completing...): id, name, state, node."""
        out = self.run("squeue", "--noheader", "-o", "%i|%T|%N|%j").stdout
        jobs = []
        for line in out.splitlines():
            if line.strip():
                job_id, state, node, name = line.split("|", 3)
                jobs.append({"id": job_id.strip(), "name": name, "state": state, "node": node})
        return jobs

    def job_state(self, job_id: str) -> str:
        """The state `scontrol show job` gives (finished jobs stay there for MinJobAge, 300 s)."""
        out = self.run("scontrol", "show", "job", "-o", job_id).stdout
        fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
        return fields.get("JobState", "")

    def wait_jobs_gone(self, timeout: float = 120, job_ids: list[str] | None = None) -> None:
        """Poll squeue until it lists none of `job_ids` (all jobs when None); TimeoutError if not."""

        def gone() -> bool:
            ids = {j["id"] for j in self.squeue_jobs()}
            return not ids if job_ids is None else not ids & set(job_ids)

        _wait_for(gone, timeout, f"end of jobs {job_ids or 'all'} (still {self.squeue_jobs()})", 0.5)

    def node_states(self) -> dict[str, str]:
        """Each node's state as sinfo gives it ("idle", "mixed", "alloc", "down*", ...)."""
        out = self.run("sinfo", "--noheader", "-N", "-o", "%N %T").stdout
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def logs(self) -> str:
        """The tails of the daemons' logs, for a failure message."""
        parts = []
        for log in sorted((self.conf_dir / "log").glob("*")):
            parts.append(f"--- {log.name}\n{_tail(log)}")
        return "\n".join(parts)

    def check_daemons(self) -> None:
        """Raise, with the logs, if a daemon has exited."""
        dead = {name: p.returncode for name, p in self.daemons.items() if p.poll() is not None}
        if dead:
            raise RuntimeError(f"Slurm daemons exited: {dead}\n{self.logs()}")


def _client_env(conf: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN_ENV)}
    env["SLURM_CONF"] = str(conf)
    env["PATH"] = f"{env.get('PATH', '')}:{SYSTEM_PATH}".lstrip(":")
    return env


def _network(c: SlurmCluster) -> None:
    """The bridge (with slurmctld's address) and one namespace per node, each on a veth pair."""
    tag = c.bridge.removeprefix("slbr")
    _ip("link", "add", c.bridge, "type", "bridge")
    _ip("link", "set", c.bridge, "up")
    _ip("addr", "add", f"{c.bridge_ip}/24", "dev", c.bridge)
    for name, ns in c.namespaces.items():
        veth = f"slv{tag}{name}"
        _ip("netns", "add", ns)
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", veth, "master", c.bridge, "up")
        _ip("-n", ns, "addr", "add", f"{c.nodes[name]}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")


def _start_munged(c: SlurmCluster, munge_dir: Path) -> None:
    """A private munged: its own key and socket; the folders on the socket's path are 0755, as it requires."""
    key = munge_dir / "munge.key"
    if shutil.which("mungekey", path=c.env["PATH"]):
        subprocess.run(["mungekey", "--create", "--keyfile", str(key)], check=True, capture_output=True,
                       timeout=30)  # fmt: skip
    else:
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
    socket_path = munge_dir / "munge.socket"
    c.daemons["munged"] = _start(
        ["munged", "--foreground", f"--socket={socket_path}", f"--key-file={key}",
         f"--pid-file={munge_dir}/munged.pid", f"--seed-file={munge_dir}/munged.seed",
         f"--log-file={c.conf_dir}/log/munged.log"],
        c.conf_dir / "log" / "munged.out", c.env,
    )  # fmt: skip

    def up() -> bool:
        c.check_daemons()
        return socket_path.exists()

    _wait_for(up, 30, "munge socket")


def reap_abandoned() -> None:
    """Take down the clusters of test processes that died without their teardown (killed): every
    process of `/tmp/slurm<pid>-*` (munged, slurmctld, slurmd), their namespaces, bridge and folder,
    where process `<pid>` is gone."""
    for folder in Path(tempfile.gettempdir()).glob("slurm*-*"):
        owner = folder.name.removeprefix("slurm").split("-", 1)[0]
        if not owner.isdigit() or process_alive(int(owner)):
            continue
        for proc in Path("/proc").glob("[0-9]*"):
            with suppress(OSError, ValueError):
                if str(folder) in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    os.kill(int(proc.name), signal.SIGKILL)
        for name in NODE_NAMES:
            with suppress(RuntimeError):
                _kill_netns(f"sl{owner}{name}")
            _quiet_ip("netns", "del", f"sl{owner}{name}")
        _quiet_ip("link", "del", f"slbr{owner}")
        shutil.rmtree(folder, ignore_errors=True)


def _start_daemons(c: SlurmCluster, ctl_host: str) -> None:
    conf = str(c.conf_dir / "slurm.conf")
    log = c.conf_dir / "log"
    # the controller's hostname must be SlurmctldHost's name: set it in a UTS namespace of its own
    named = 'hostname "$1" && shift && exec "$@"'
    c.daemons["slurmctld"] = _start(
        ["unshare", "--uts", "sh", "-c", named, "sh", ctl_host, "slurmctld", "-D", "-f", conf],
        log / "slurmctld.out", c.env,
    )  # fmt: skip
    for name, ns in c.namespaces.items():
        c.daemons[name] = _start(
            ["ip", "netns", "exec", ns, "unshare", "--uts", "sh", "-c", named, "sh", name,
             "slurmd", "-D", "-N", name, "-f", conf],
            log / f"slurmd-{name}.out", c.env,
        )  # fmt: skip


def _teardown(c: SlurmCluster, strict: bool) -> None:
    """Cancel the jobs, stop every daemon and every process in the nodes' namespaces, delete the
    namespaces, the bridge and the folder. Safe after a setup that stopped halfway. With `strict`,
    raise if a process in the namespaces survived SIGKILL (never while another error propagates)."""
    ctld = c.daemons.get("slurmctld")
    if ctld is not None and ctld.poll() is None:
        try:
            listed = c.squeue_jobs()
            if listed:
                c.run("scancel", *(j["id"] for j in listed), timeout=30, check=False)
                # a job on a node a test killed ends only when Slurm marks the node down (SlurmdTimeout):
                # not waited for, its processes are killed with the namespaces below
                dead = {n for n in c.namespaces if n in c.daemons and c.daemons[n].poll() is not None}
                ending = [j["id"] for j in listed if j["node"] not in dead]
                if ending:
                    c.wait_jobs_gone(30, ending)
        except (RuntimeError, TimeoutError, subprocess.TimeoutExpired, OSError):
            pass  # the namespaces' processes are killed below whatever slurmctld managed
    errors = []
    for name in c.namespaces:
        if name in c.daemons:
            _stop(c.daemons[name])
    for ns in c.namespaces.values():
        try:
            _kill_netns(ns)
        except RuntimeError as exc:
            errors.append(str(exc))
    for name in ("slurmctld", "munged"):
        if name in c.daemons:
            _stop(c.daemons[name])
    for ns in c.namespaces.values():
        _quiet_ip("netns", "del", ns)
    if c.bridge:
        _quiet_ip("link", "del", c.bridge)
    shutil.rmtree(c.conf_dir, ignore_errors=True)
    if errors and strict:
        raise RuntimeError("; ".join(errors))


@contextmanager
def slurm_cluster(start_timeout: float = 180, tag: str | None = None) -> Iterator[SlurmCluster]:
    """Start slurmctld and slurmd n1..n3 (see the module's docstring), yield once sinfo shows every
    node idle, and tear it all down on exit. Names are tagged with this process's pid."""
    tag = tag or str(os.getpid())
    reap_abandoned()  # a cluster left by a killed test would hold its subnet and its cores
    conf_dir = Path(tempfile.mkdtemp(prefix=f"slurm{tag}-"))
    c = SlurmCluster(env=_client_env(conf_dir / "slurm.conf"), nodes={}, bridge_ip="", conf_dir=conf_dir)
    try:
        conf_dir.chmod(0o755)  # munged requires every folder on its socket's path to be searchable by all
        for sub in ("state", "run", "log", "munge", *(f"spool/{n}" for n in NODE_NAMES)):
            (conf_dir / sub).mkdir(mode=0o755, parents=True)
        c.bridge = f"slbr{tag}"
        c.namespaces = {name: f"sl{tag}{name}" for name in NODE_NAMES}
        for ns in c.namespaces.values():  # left by a killed process that had our pid
            _quiet_ip("netns", "del", ns)
        _quiet_ip("link", "del", c.bridge)
        subnet = _free_subnet()
        c.bridge_ip = f"{subnet}.254"
        c.nodes = {name: f"{subnet}.{i}" for i, name in enumerate(NODE_NAMES, start=1)}
        ctl_host = f"slctl{tag}"
        text = slurm_conf(f"cad{tag}", ctl_host, c.bridge_ip, _free_port(), c.nodes, conf_dir,
                          conf_dir / "munge" / "munge.socket")  # fmt: skip
        (conf_dir / "slurm.conf").write_text(text)
        (conf_dir / "cgroup.conf").write_text(CGROUP_CONF)
        _network(c)
        _start_munged(c, conf_dir / "munge")
        _start_daemons(c, ctl_host)

        def all_idle() -> bool:
            c.check_daemons()
            try:
                states = c.node_states()
            except (RuntimeError, subprocess.TimeoutExpired):
                return False  # slurmctld is not answering yet
            return all(states.get(name) == "idle" for name in NODE_NAMES)

        try:
            _wait_for(all_idle, start_timeout, "idle nodes n1, n2, n3", 0.5)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{c.logs()}") from None
        yield c
    except BaseException:
        _teardown(c, strict=False)
        raise
    _teardown(c, strict=True)


@pytest.fixture(name="slurm")
def slurm_fixture() -> Iterator[SlurmCluster]:
    """A started Slurm cluster (skipped, with the reason, where one cannot run); torn down after."""
    reason = slurm_unavailable()
    if reason is not None:
        print(f"skipped: {reason}")
        pytest.skip(reason)
    with slurm_cluster() as cluster:
        yield cluster
