# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A real one-node Slurm cluster of a test's own: munged, slurmctld and slurmd, every file under one work directory.

Nothing under /etc, /run or /var is read or written: the munge key and socket, ``slurm.conf``, ``gres.conf``,
``cgroup.conf``, the GPUs' device nodes, state, spool, pid and log files all live under ``<work>``, and the two
ports are free ones picked at start, so clusters of two checkouts can run side by side. The daemons run in the
foreground (``munged -F``, ``slurmctld -D``, ``slurmd -D``): the pids this harness holds are the daemons' own, and it
stops exactly those, TERM then KILL, on failure too (a context manager). Slurm's step daemons (``slurmstepd``) are
started by slurmd, not by this harness: :meth:`SlurmCluster.stop` cancels every job and waits for them to go before
it stops slurmd, and ends by pid a step daemon of this cluster (its environment names this cluster's slurm.conf)
still left after that.

Needs root (munged runs as the ``munge`` user that the munge package creates; ``mknod``; slurmd) and Debian's
``munge slurmctld slurmd slurm-client`` (``hacking/install-deps.sh``); their packaged services are not used.

Process tracking is ``proctrack/linuxproc`` with ``task/none``: nothing outside ``<work>`` changes. ``cgroup=True``
uses ``proctrack/cgroup``, ``task/cgroup`` and ``ConstrainDevices=yes`` as production nodes do; slurmd then makes
``/sys/fs/cgroup/<controller>/slurm_<node>`` (cgroup v1, named after the node as this Slurm build does), which
:meth:`SlurmCluster.stop` removes once empty. Two such clusters with one node name must not run at the same time.

Usage::

    resources = ...
    with SlurmCluster(work, gres_conf=render_gres_conf(resources, device_dir(work)), gres='gpu:4,mps:400', gpus=4,
                      task_prolog=path) as cluster:
        cluster.run(['srun', '--gres=mps:25', 'true'])
"""
from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import time
from typing import Callable, Dict, List, Optional, Sequence

DAEMONS = ('munged', 'slurmctld', 'slurmd')
STEP_DAEMON = 'slurmstepd'
COMMANDS = ('srun', 'sbatch', 'sinfo', 'scontrol', 'squeue', 'scancel')
NVIDIA_MAJOR = 195  # the character device major of /dev/nvidiaN
NODE = 'gpunode'
PARTITION = 'gpu'
CGROUP_ROOT = '/sys/fs/cgroup'
SBIN_PATH = ':/usr/sbin:/sbin'  # where Debian installs the daemons, off a plain user's PATH


class SlurmClusterError(RuntimeError):
    """The cluster could not be started or stopped; the message carries the logs to read."""


def device_dir(work: str) -> str:
    """Where the cluster of ``work`` makes its GPUs' device nodes (for the ``File=`` lines of its gres.conf)."""
    return os.path.join(os.path.abspath(work), 'dev')


def cgroup_v1_devices() -> bool:
    """Whether this machine has the cgroup v1 devices controller that ``cgroup=True`` needs (Slurm 22.05's cgroup/v2
    would need systemd's dbus)."""
    return os.path.isdir(os.path.join(CGROUP_ROOT, 'devices'))


def pid_alive(pid: int) -> bool:
    """Whether pid runs (a zombie, killed but not yet reaped, does not)."""
    try:
        with open('/proc/%d/stat' % pid, encoding='ascii', errors='replace') as handle:
            return handle.read().rsplit(')', 1)[1].split()[0] not in ('Z', 'X')
    except (OSError, IndexError):
        return False


def stop_pids(pids: Sequence[int], timeout: float = 10.0) -> List[int]:
    """TERM each pid, wait up to ``timeout`` seconds, KILL the ones left; the pids that had to be killed."""
    live = [pid for pid in pids if pid_alive(pid)]
    for pid in live:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(pid_alive(pid) for pid in live):
        time.sleep(0.05)
    killed = [pid for pid in live if pid_alive(pid)]
    for pid in killed:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return killed


def _free_ports(count: int) -> List[int]:
    """Ports free on this machine now (held open together, so that they differ)."""
    probes = []
    try:
        while len(probes) < count:
            probe = socket.socket()
            probe.bind(('', 0))
            probes.append(probe)
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def _tail(path: str, limit: int = 3000) -> str:
    try:
        with open(path, encoding='utf-8', errors='replace') as handle:
            return handle.read()[-limit:]
    except OSError as exc:
        return '(%s unreadable: %s)' % (path, exc.strerror)


def _read(path: str) -> bytes:
    try:
        with open(path, 'rb') as handle:
            return handle.read()
    except OSError:
        return b''


def _which(name: str) -> Optional[str]:
    return shutil.which(name, path=os.environ.get('PATH', '') + SBIN_PATH)


class SlurmCluster:  # pylint: disable=too-many-instance-attributes
    """One node (``gpunode``, partition ``gpu``) with ``gpus`` GPUs that ``gres_conf`` describes.

    ``gres_conf`` is written as ``<work>/etc/gres.conf``; its ``File=`` lines name the device nodes this harness makes
    in :func:`device_dir` (``nvidia0`` ... ``nvidia<gpus-1>``, major 195 as a real driver's: Slurm refuses a ``File=``
    that is not a character or block device). ``gres`` is the node's ``Gres=`` in ``slurm.conf``, ``task_prolog`` its
    ``TaskProlog=`` (None: none), ``extra_conf`` more lines for it (``DebugFlags=Gres``). ``cpus`` is what the node
    declares: ``SlurmdParameters=config_overrides`` lets a 2-core machine run that many one-CPU jobs at once.
    """

    def __init__(self, work: str, gres_conf: str, gres: str, gpus: int, task_prolog: Optional[str] = None,  # pylint: disable=too-many-arguments
                 cpus: int = 8, cgroup: bool = False, extra_conf: Sequence[str] = (), start_timeout: float = 30.0) -> None:
        self.work = os.path.abspath(work)
        self.gres_conf = gres_conf
        self.gres = gres
        self.gpus = gpus
        self.task_prolog = task_prolog
        self.cpus = cpus
        self.cgroup = cgroup
        self.extra_conf = list(extra_conf)
        self.start_timeout = start_timeout
        self.etc = os.path.join(self.work, 'etc')
        self.dev = device_dir(self.work)
        self.log_dir = os.path.join(self.work, 'log')
        self.run_dir = os.path.join(self.work, 'run')
        self.munge_dir = os.path.join(self.work, 'munge')  # key, seed, pid file and log: 0700 munge, as munged demands
        self.munge_socket_dir = os.path.join(self.work, 'munge-socket')  # 0755 munge: every user's srun reaches munged
        self.munge_socket = os.path.join(self.munge_socket_dir, 'munge.socket.2')
        self.slurm_conf = os.path.join(self.etc, 'slurm.conf')
        self.state_dir = os.path.join(self.work, 'state')
        self.spool_dir = os.path.join(self.work, 'spool')
        self.logs = {name: os.path.join(self.munge_dir if name == 'munged' else self.log_dir, name + '.log') for name in DAEMONS}
        self.procs: Dict[str, subprocess.Popen] = {}
        self.cgroups_made: List[str] = []
        self.startup_s: Optional[float] = None
        self.ports: List[int] = []

    # ------------------------------------------------------------------ use

    @property
    def env(self) -> Dict[str, str]:
        """The environment for Slurm's commands (srun, sbatch, squeue...) against this cluster."""
        env = {key: value for key, value in os.environ.items() if not key.startswith(('SLURM_', 'SBATCH_', 'SRUN_', 'SALLOC_'))}
        env['SLURM_CONF'] = self.slurm_conf
        return env

    def run(self, argv: Sequence[str], timeout: float = 60.0, **kwargs) -> subprocess.CompletedProcess:
        """A Slurm command against this cluster, its output as text, run in the work directory (where sbatch's
        ``slurm-<job>.out`` goes unless ``cwd`` says otherwise) with :attr:`env` unless ``env`` says otherwise."""
        kwargs.setdefault('cwd', self.work)
        kwargs.setdefault('env', self.env)
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False, **kwargs)

    def node(self) -> Dict[str, str]:
        """``scontrol show node`` of the node as key=value pairs (empty when slurmctld does not answer)."""
        proc = self.run(['scontrol', '--oneliner', 'show', 'node', NODE], timeout=15)
        if proc.returncode != 0:
            return {}
        return dict(word.split('=', 1) for word in proc.stdout.split() if '=' in word)

    def jobs(self) -> List[str]:
        """The ids of this cluster's jobs that are not finished."""
        proc = self.run(['squeue', '--noheader', '--format=%i'], timeout=15)
        return proc.stdout.split() if proc.returncode == 0 else []

    def wait_for(self, what: str, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
        """Poll ``predicate`` until it is true; fail naming ``what`` with the daemons' logs (at once if one exited)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            self._check_daemons()
            time.sleep(0.1)
        raise SlurmClusterError('%s: not within %.0f s\n%s' % (what, timeout, self.log_tails()))

    def log_tails(self) -> str:
        return '\n'.join('--- %s\n%s' % (path, _tail(path)) for path in self.logs.values())

    # ------------------------------------------------------------------ start

    def __enter__(self) -> 'SlurmCluster':
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        """Write the configuration, start munged, slurmctld and slurmd, wait until the node is idle."""
        missing = [name for name in DAEMONS + COMMANDS if not _which(name)]
        if missing:
            raise SlurmClusterError('not installed: %s (`make deps` - hacking/install-deps.sh - installs munge, slurmctld, slurmd '
                                    'and slurm-client)' % ', '.join(missing))
        if os.geteuid() != 0:
            raise SlurmClusterError('a Slurm cluster of its own needs root (munged as user munge, mknod, slurmd)')
        if self.cgroup and not cgroup_v1_devices():
            raise SlurmClusterError('cgroup=True needs the cgroup v1 devices controller (%s/devices)' % CGROUP_ROOT)
        began = time.monotonic()
        self._write_files()
        self._start_munged()
        self._spawn('slurmctld', ['-D', '-i'])
        self.wait_for('slurmctld answering on port %d' % self.ports[0],
                      lambda: 'is UP' in self.run(['scontrol', 'ping'], timeout=15).stdout, self.start_timeout)
        self._spawn('slurmd', ['-D', '-N', NODE])
        self.wait_for('node %s idle' % NODE, lambda: self.node().get('State', '').split('+')[0] == 'IDLE', self.start_timeout)
        self.startup_s = time.monotonic() - began

    def _write_files(self) -> None:
        try:
            munge = pwd.getpwnam('munge')
        except KeyError as exc:
            raise SlurmClusterError('no user munge: the munge package creates it (hacking/install-deps.sh)') from exc
        for path in (self.etc, self.dev, self.log_dir, self.run_dir, self.state_dir, self.spool_dir):
            os.makedirs(path, mode=0o755, exist_ok=True)
        # munged refuses a key readable by others, and a key, log, seed or pid file in a directory others may write
        for path, mode in ((self.munge_dir, 0o700), (self.munge_socket_dir, 0o755)):
            os.makedirs(path, mode=mode, exist_ok=True)
            os.chmod(path, mode)
            os.chown(path, munge.pw_uid, munge.pw_gid)
        key = os.path.join(self.munge_dir, 'munge.key')
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, os.urandom(1024))
        finally:
            os.close(fd)
        os.chown(key, munge.pw_uid, munge.pw_gid)
        for index in range(self.gpus):
            node = os.path.join(self.dev, 'nvidia%d' % index)
            if os.path.lexists(node):
                os.unlink(node)
            os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, index))
        self.ports = _free_ports(2)
        self._write(self.slurm_conf, self._slurm_conf())
        self._write(os.path.join(self.etc, 'gres.conf'), self.gres_conf)
        # slurmd reads it whatever the plugins (22.05 loads its cgroup plugin at start)
        self._write(os.path.join(self.etc, 'cgroup.conf'), '\n'.join([
            '# Written by tests/engines/slurm_cluster.py.', 'CgroupPlugin=autodetect', 'ConstrainCores=no', 'ConstrainRAMSpace=no',
            'ConstrainDevices=%s' % ('yes' if self.cgroup else 'no'), '']))
        if self.cgroup:
            self.cgroups_made = [path for path in self._cgroup_dirs() if not os.path.exists(path)]

    @staticmethod
    def _cgroup_dirs() -> List[str]:
        return [os.path.join(CGROUP_ROOT, controller, 'slurm_' + NODE) for controller in sorted(os.listdir(CGROUP_ROOT))
                if os.path.isdir(os.path.join(CGROUP_ROOT, controller)) and not os.path.islink(os.path.join(CGROUP_ROOT, controller))]

    @staticmethod
    def _write(path: str, text: str) -> None:
        with open(path, 'w', encoding='utf-8') as handle:
            handle.write(text)

    def _slurm_conf(self) -> str:
        host = socket.gethostname().split('.')[0]
        lines = [
            '# Written by tests/engines/slurm_cluster.py: a one-node cluster of a gpufleet.mps test, all under %s.' % self.work,
            'ClusterName=gpufleet',
            'SlurmctldHost=%s(127.0.0.1)' % host,  # slurmctld checks that this is its own host name
            'SlurmctldPort=%d' % self.ports[0],
            'SlurmdPort=%d' % self.ports[1],
            'SlurmUser=root',
            'SlurmdUser=root',
            'AuthType=auth/munge',
            'CredType=cred/munge',
            'AuthInfo=socket=%s' % self.munge_socket,  # used by auth/munge and cred/munge
            'StateSaveLocation=%s' % self.state_dir,
            'SlurmdSpoolDir=%s' % self.spool_dir,
            'SlurmctldPidFile=%s' % os.path.join(self.run_dir, 'slurmctld.pid'),
            'SlurmdPidFile=%s' % os.path.join(self.run_dir, 'slurmd.pid'),
            'SlurmctldLogFile=%s' % self.logs['slurmctld'],
            'SlurmdLogFile=%s' % self.logs['slurmd'],
            'SlurmctldDebug=info',
            'SlurmdDebug=info',
            'ProctrackType=%s' % ('proctrack/cgroup' if self.cgroup else 'proctrack/linuxproc'),
            'TaskPlugin=%s' % ('task/cgroup' if self.cgroup else 'task/none'),
            'SelectType=select/cons_tres',  # gres/mps needs it
            'SelectTypeParameters=CR_Core',
            'GresTypes=gpu,mps',
            'SlurmdParameters=config_overrides',
            'ReturnToService=2',
            'SchedulerType=sched/backfill',
            'JobAcctGatherType=jobacct_gather/none',
            'AccountingStorageType=accounting_storage/none',
            'JobCompType=jobcomp/none',
            'MpiDefault=none',
            'InactiveLimit=0',
            'KillWait=2',
            'MessageTimeout=10',
            'SlurmdTimeout=60',
        ] + self.extra_conf
        if self.task_prolog:
            lines.append('TaskProlog=%s' % self.task_prolog)
        lines += [
            'NodeName=%s NodeAddr=127.0.0.1 NodeHostname=%s CPUs=%d RealMemory=1024 Gres=%s State=UNKNOWN' % (NODE, host, self.cpus, self.gres),
            'PartitionName=%s Nodes=%s Default=YES MaxTime=INFINITE State=UP' % (PARTITION, NODE),
        ]
        return '\n'.join(lines) + '\n'

    def _start_munged(self) -> None:
        munge = pwd.getpwnam('munge')
        args = ['--foreground', '--socket=%s' % self.munge_socket, '--key-file=%s' % os.path.join(self.munge_dir, 'munge.key'),
                '--pid-file=%s' % os.path.join(self.munge_dir, 'munged.pid'), '--seed-file=%s' % os.path.join(self.munge_dir, 'munged.seed'),
                '--log-file=%s' % self.logs['munged']]
        # extra_groups=[]: user= alone would leave munged root's supplementary groups
        self._spawn('munged', args, user=munge.pw_uid, group=munge.pw_gid, extra_groups=[], cwd=self.munge_dir)
        self.wait_for('munged listening on %s' % self.munge_socket, lambda: os.path.exists(self.munge_socket), self.start_timeout)

    def _spawn(self, name: str, args: List[str], **kwargs) -> None:
        kwargs.setdefault('cwd', self.work)
        with open(os.path.join(self.log_dir, name + '.out'), 'ab') as out:
            # a session of its own: a terminal's ^C reaches the test, which stops the daemons itself
            self.procs[name] = subprocess.Popen([_which(name) or name] + args, env=self.env, stdin=subprocess.DEVNULL,  # pylint: disable=consider-using-with
                                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **kwargs)

    def _check_daemons(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                out = os.path.join(self.log_dir, name + '.out')
                raise SlurmClusterError('%s exited with status %s\n--- %s\n%s\n--- %s\n%s' % (
                    name, proc.returncode, self.logs[name], _tail(self.logs[name]), out, _tail(out)))

    # ------------------------------------------------------------------ stop

    def _processes(self, names: Sequence[str]) -> List[int]:
        """Pids of the running processes named ``names`` that belong to this cluster: the work directory in their
        command line (munged) or this cluster's slurm.conf in their environment (Slurm's daemons and step daemons)."""
        conf = b'\0SLURM_CONF=' + self.slurm_conf.encode() + b'\0'
        work = self.work.encode() + b'/'
        found = []
        for entry in os.listdir('/proc'):
            if not entry.isdigit() or _read('/proc/%s/comm' % entry).strip().decode(errors='replace') not in names:
                continue
            if pid_alive(int(entry)) and (work in _read('/proc/%s/cmdline' % entry)
                                          or conf in b'\0' + _read('/proc/%s/environ' % entry) + b'\0'):
                found.append(int(entry))
        return found

    def step_daemons(self) -> List[int]:
        """Pids of this cluster's slurmstepd processes."""
        return self._processes((STEP_DAEMON,))

    def strays(self) -> List[str]:
        """``pid comm`` of every munged, slurmctld, slurmd or slurmstepd of this cluster still running, found in /proc."""
        return ['%d %s' % (pid, _read('/proc/%d/comm' % pid).strip().decode(errors='replace'))
                for pid in self._processes(DAEMONS + (STEP_DAEMON,))]

    def stop(self) -> None:
        """Cancel every job, then stop slurmd, slurmctld and munged by pid (TERM, then KILL); idempotent.

        Raises :class:`SlurmClusterError` when something had to be killed or a cgroup could not be removed, after
        everything was tried.
        """
        problems = []
        if 'slurmctld' in self.procs and self.procs['slurmctld'].poll() is None:
            jobs = self.jobs()
            if jobs:
                self.run(['scancel', '--full'] + jobs, timeout=15)
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline and self.jobs():
                    time.sleep(0.1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self.step_daemons():
            time.sleep(0.1)
        left = self.step_daemons()
        if left:
            problems.append('slurmstepd %s outlived the jobs' % left)
            stop_pids(left, timeout=5)
        for name in ('slurmd', 'slurmctld', 'munged'):
            proc = self.procs.pop(name, None)
            if proc is None:
                continue
            if stop_pids([proc.pid]):
                problems.append('%s (pid %d) did not stop on TERM within 10 s: killed' % (name, proc.pid))
            proc.wait()
        for path in self.cgroups_made:
            for parent, _dirs, _files in os.walk(path, topdown=False):  # the job and step cgroups first
                try:
                    os.rmdir(parent)
                except OSError as exc:
                    problems.append('cgroup %s not removed: %s' % (parent, exc.strerror))
        self.cgroups_made = []
        if problems:
            raise SlurmClusterError('; '.join(problems))
