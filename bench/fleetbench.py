# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fleet benchmark of gpufleet.mps: what a run costs per host, against Ansible's floor and the shell way.

A fleet of N simulated GPU hosts on this machine (local connection; each host its own 8x A100 set,
root and config dir; two resources of 4 GPUs; mps_supervisor none). In one run, alternating, with
several repetitions each, it times:

  a  the fleet role, first converge (every host reset first)
  b  the fleet role again, nothing to change
  c  the hand-written shell way (command/shell tasks: nvidia-smi -c per GPU, nvidia-cuda-mps-control -d,
     one ``echo <command> | nvidia-cuda-mps-control`` task per limit, a status check), hosts reset first
  d  as many ansible.builtin.ping tasks per host as b executes modules (Ansible's floor for b's work)
  e  one ansible.builtin.ping per host
  f  b over SSH: every host reached through an sshd of the benchmark's own on 127.0.0.1 (own config, host
     key, user key and port), with ControlPersist, as fleets are reached
  g  e over SSH
  h  the no-op as one gpufleet.mps.mps_host task with the role's arguments, no role: b - h is what the role itself
     costs (its argument-spec validation), h - e what the module costs over a ping

The headline ratios are b/e (the role's no-op against ONE ping per host, local connection) and f/g (the same
over SSH), wall and CPU time, measured in the same run.

and counts, per host, the module executions (a per-host interpreter wrapper logs each one), control
UI sessions (``NEW UI`` lines of control.log) and NVML inits (the fake NVML's call log), with the
controller's peak RSS (wait4). Then the module-level benchmark (modbench.py). Writes results.json,
RESULTS.md and two plots (matplotlib) into --out; --publish also updates bench/RESULTS.md and the plots in bench/.

Needs: ``make simhost`` (the fake NVML library) and ``make collection`` with ANSIBLE_COLLECTIONS_PATH
naming its TEST_ROOT. Exits non-zero when a run fails or a counted invariant breaks (b changes
something, a module process initialises NVML more than once, a no-op module call uses more than one
control UI process). Wall-clock targets are reported, never enforced.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import getpass
import importlib.metadata
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import typing as t


BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
FAKES = os.path.join(REPO, 'tests', 'fakes')
GPU_CONFIG = os.path.join(FAKES, 'nvml', 'configs', 'a100x8.ini')
GPU_MEM_MIB = 40960
# (name, GPU indices, replicas): the same resources for the role and for the shell baseline.
RESOURCES = (('train', (0, 1, 2, 3), 4), ('infer', (4, 5, 6, 7), 8))
VARIANTS = ('a', 'b', 'c', 'd', 'e', 'f', 'g', 'h')
TITLES = {
    'a': 'role, first converge',
    'b': 'role, no-op re-run',
    'c': 'shell baseline (first run)',
    'd': 'pings: b\'s module count',
    'e': 'one ping per host',
    'f': 'role, no-op re-run, over SSH',
    'g': 'one ping per host, over SSH',
    'h': 'mps_host task alone, no-op (no role)',
}
COLORS = {'a': 'tab:red', 'b': 'tab:blue', 'c': 'tab:green', 'd': 'tab:gray', 'e': 'black', 'f': 'tab:purple', 'g': 'tab:olive',
          'h': 'tab:cyan'}
PLAYBOOKS = {'a': 'role.yml', 'b': 'role.yml', 'c': 'shell.yml', 'd': 'ping_d.yml', 'e': 'ping_e.yml', 'f': 'role.yml', 'g': 'ping_e.yml',
             'h': 'module.yml'}
SSH_VARIANTS = ('f', 'g')
RECAP = re.compile(r'^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)\s+'
                   r'rescued=(\d+)\s+ignored=(\d+)')
MEASURED_BEGIN = '<!-- measured:begin (written by bench/fleetbench.py --publish; edit outside these markers) -->'
MEASURED_END = '<!-- measured:end -->'
PLOT_NAME = 'fleet-time-per-host.png'
CPU_PLOT_NAME = 'fleet-cpu-per-host.png'
RATIOS = (('b', 'e'), ('f', 'g'), ('a', 'e'), ('h', 'e'), ('b', 'h'), ('b', 'd'), ('a', 'c'), ('b', 'c'))


class BenchError(Exception):
    """A run failed or an invariant broke."""


# --- the simulated hosts ------------------------------------------------------------------------

def _count(path: str, needle: str) -> int:
    try:
        with open(path, encoding='utf-8', errors='replace') as handle:
            return sum(1 for line in handle if needle in line)
    except FileNotFoundError:
        return 0


def _read_lines(path: str) -> t.List[str]:
    try:
        with open(path, encoding='utf-8', errors='replace') as handle:
            return handle.read().splitlines()
    except FileNotFoundError:
        return []


def _pid_gone(pid: int) -> bool:
    try:
        with open('/proc/%d/stat' % pid, encoding='ascii', errors='replace') as handle:
            return handle.read().rsplit(')', 1)[1].split()[0] == 'Z'
    except (OSError, IndexError):
        return True


def sim_processes(base: str) -> t.List[int]:
    """Pids of the processes of the simulated hosts under ``base`` (daemons, servers, clients).

    Every one of them carries FAKE_NVML_CONFIG=<base>/<host>/host/nvml.ini (the simulator's wrapper
    sets it), and only this benchmark lays out hosts under ``base``.
    """
    marker = ('FAKE_NVML_CONFIG=' + base.rstrip('/') + '/').encode()
    pids = []
    for entry in os.listdir('/proc'):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open('/proc/%s/environ' % entry, 'rb') as handle:
                if any(var.startswith(marker) for var in handle.read().split(b'\0')):
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def kill_pids(pids: t.Iterable[int]) -> None:
    pids = list(pids)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while any(not _pid_gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)


class SshServer:
    """An sshd of the benchmark's own on 127.0.0.1 - its own config, host key, user key and port - for variants f and g.

    Started before the fleet runs, stopped (with the ControlPersist masters of its clients) at the end. Needs
    openssh-server (``make deps``); as root, sshd's compiled-in privilege separation directory (/run/sshd) must exist.
    """

    def __init__(self, base: str) -> None:
        self.dir = os.path.join(base, 'ssh')
        self.control_dir = os.path.join(self.dir, 'cp')
        self.user_key = os.path.join(self.dir, 'user_ed25519')
        self.port = 0
        self.proc: t.Optional[subprocess.Popen] = None
        self.log = os.path.join(self.dir, 'sshd.log')

    def start(self) -> None:
        sshd = shutil.which('sshd') or '/usr/sbin/sshd'
        keygen = shutil.which('ssh-keygen')
        if not os.access(sshd, os.X_OK) or not keygen:
            raise BenchError('variants f and g need sshd and ssh-keygen: `make deps` installs openssh-server')
        os.makedirs(self.control_dir, mode=0o700)
        host_key = os.path.join(self.dir, 'host_ed25519')
        for key in (host_key, self.user_key):
            subprocess.run([keygen, '-q', '-t', 'ed25519', '-N', '', '-C', 'gpufleet-mps-bench', '-f', key], check=True)
        shutil.copyfile(self.user_key + '.pub', os.path.join(self.dir, 'authorized_keys'))
        with socket.socket() as probe:
            probe.bind(('127.0.0.1', 0))
            self.port = probe.getsockname()[1]
        config = os.path.join(self.dir, 'sshd_config')
        with open(config, 'w', encoding='utf-8') as handle:
            handle.write('\n'.join([
                '# gpufleet.mps bench: an sshd for this run only', 'Port %d' % self.port, 'ListenAddress 127.0.0.1',
                'HostKey %s' % host_key, 'PidFile none', 'AuthorizedKeysFile %s' % os.path.join(self.dir, 'authorized_keys'),
                'PubkeyAuthentication yes', 'PasswordAuthentication no', 'KbdInteractiveAuthentication no', 'UsePAM no',
                'PermitRootLogin prohibit-password', 'StrictModes no', 'MaxStartups 512', 'MaxSessions 512', 'LogLevel ERROR',
                'Subsystem sftp internal-sftp', '']))
        if os.geteuid() == 0:
            os.makedirs('/run/sshd', mode=0o755, exist_ok=True)
        with open(self.log, 'w', encoding='utf-8') as log:
            self.proc = subprocess.Popen([sshd, '-D', '-e', '-f', config], stdout=log, stderr=subprocess.STDOUT,  # pylint: disable=consider-using-with
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError('sshd exited with %s: %s' % (self.proc.returncode, ' '.join(_read_lines(self.log))[-2000:]))
            try:
                with socket.create_connection(('127.0.0.1', self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise BenchError('sshd did not listen on 127.0.0.1:%d within 15 s (%s)' % (self.port, self.log))

    def stop(self) -> None:
        """The ControlPersist masters of this run's clients first, then sshd (and the sessions it still has)."""
        marker = self.control_dir.encode()
        masters = []
        for entry in os.listdir('/proc'):
            if entry.isdigit():
                try:
                    with open('/proc/%s/cmdline' % entry, 'rb') as handle:
                        if marker in handle.read():
                            masters.append(int(entry))
                except OSError:
                    continue
        kill_pids(masters)
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


class SimHost:
    """One inventory host: its own simulated 8-GPU set, root, config dir and counters."""

    def __init__(self, base: str, name: str) -> None:
        self.name = name
        self.dir = os.path.join(base, name)
        self.root = os.path.join(self.dir, 'root')
        self.etc = os.path.join(self.dir, 'etc')
        self.python = os.path.join(self.dir, 'py')
        self.modules_log = os.path.join(self.dir, 'modules.log')
        self.nvml_log = os.path.join(self.dir, 'nvml.log')
        self.ui_before = 0

    def create(self, lib: str, python: str) -> None:
        os.makedirs(self.dir, exist_ok=True)
        subprocess.run([os.path.join(FAKES, 'make-simhost.sh'), os.path.join(self.dir, 'host'), lib, python, GPU_CONFIG],
                       check=True, stdout=subprocess.DEVNULL)
        # The host's own GPU set (make-simhost.sh gives each host UUIDs of its own, as real hosts have: the
        # modules refuse a GPU another daemon on the machine serves), kept pristine for reset().
        shutil.copyfile(os.path.join(self.dir, 'host', 'nvml.ini'), os.path.join(self.dir, 'host', 'nvml.ini.pristine'))
        # Every module execution on this host runs this interpreter: one line per execution.
        with open(self.python + '.tmp', 'w', encoding='utf-8') as handle:
            handle.write('#!/bin/sh\n# gpufleet.mps bench: count module executions of %s\n'
                         'printf "%%s\\n" "${1:-pipelined}" >> %s\nexec %s "$@"\n' % (self.name, self.modules_log, python))
        os.chmod(self.python + '.tmp', 0o755)
        os.replace(self.python + '.tmp', self.python)

    def resource_dirs(self) -> t.List[str]:
        if not os.path.isdir(self.root):
            return []
        return [path for path in (os.path.join(self.root, entry) for entry in sorted(os.listdir(self.root))) if os.path.isdir(path)]

    def pid_files(self) -> t.List[str]:
        return [os.path.join(path, 'pipe', 'nvidia-cuda-mps-control.pid') for path in self.resource_dirs()]

    def live_daemons(self) -> int:
        alive = 0
        for path in self.pid_files():
            text = ''.join(_read_lines(path)).strip()
            if text.isdigit() and not _pid_gone(int(text)):
                alive += 1
        return alive

    def wrong_limits(self) -> str:
        """What differs from the wanted default thread percentage of each daemon ('' when all is right); not timed."""
        problems = []
        for name, _gpus, replicas in RESOURCES:
            env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=os.path.join(self.root, name, 'pipe'))
            proc = subprocess.run([os.path.join(self.dir, 'host', 'bin', 'nvidia-cuda-mps-control')], input='get_default_active_thread_percentage\n',
                                  capture_output=True, text=True, env=env, timeout=60, check=False)
            if proc.stdout.strip() != '%.1f' % (100 // replicas):
                problems.append('%s reports default thread percentage %r, not %d' % (name, proc.stdout.strip(), 100 // replicas))
        return '; '.join(problems)

    def reset(self) -> None:
        """Back to a host that never saw MPS: no daemon, no root, no config, pristine GPUs."""
        kill_pids(sim_processes(self.dir))
        for path in (self.root, self.etc):
            shutil.rmtree(path, ignore_errors=True)
        shutil.copyfile(os.path.join(self.dir, 'host', 'nvml.ini.pristine'), os.path.join(self.dir, 'host', 'nvml.ini'))

    def ui_total(self) -> int:
        return sum(_count(os.path.join(path, 'log', 'control.log'), 'NEW UI') for path in self.resource_dirs())

    def clear_counters(self) -> None:
        for path in (self.modules_log, self.nvml_log):
            with open(path, 'w', encoding='utf-8'):
                pass
        self.ui_before = self.ui_total()

    def counters(self) -> t.Dict[str, t.Any]:
        modules = [os.path.basename(line).replace('AnsiballZ_', '').replace('.py', '') for line in _read_lines(self.modules_log)]
        inits: t.Dict[str, int] = collections.Counter()
        nvml_pids = set()
        for line in _read_lines(self.nvml_log):
            pid, _sep, function = line.partition(' ')
            nvml_pids.add(pid)
            if function.startswith('nvmlInit'):
                inits[pid] += 1
        return {
            'modules': len(modules),
            'module_names': dict(collections.Counter(modules)),
            'ui': self.ui_total() - self.ui_before,
            'nvml_inits': sum(inits.values()),
            'nvml_processes': len(nvml_pids),
            'max_inits_per_process': max(inits.values(), default=0),
            'nvml_processes_without_init': len(nvml_pids - set(inits)),
        }


# --- playbooks ------------------------------------------------------------------------------------

PLAY_ENV = '''  environment:
    FAKE_NVML_CONFIG: "{{ sim_dir }}/host/nvml.ini"
    LD_LIBRARY_PATH: "{{ sim_dir }}/host/lib"
    FAKE_NVML_CALL_LOG: "{{ sim_dir }}/nvml.log"
'''


def inventory_text(hosts: t.Sequence[SimHost], ssh: t.Optional[SshServer] = None) -> str:
    if ssh is None:
        connection = ['    ansible_connection: local']
    else:
        connection = ['    # every host through the benchmark\'s own sshd, as fleets are reached',
                      '    ansible_connection: ssh', '    ansible_host: 127.0.0.1', '    ansible_port: %d' % ssh.port,
                      '    ansible_user: %s' % getpass.getuser(), '    ansible_ssh_private_key_file: %s' % ssh.user_key]
    lines = ['---', 'all:', '  vars:'] + connection + [
        '    # a wrapper that logs each module execution, then runs the venv Python',
        '    ansible_python_interpreter: "{{ sim_dir }}/py"', '  hosts:']
    lines += ['    %s: {sim_dir: %s}' % (host.name, host.dir) for host in hosts]
    return '\n'.join(lines) + '\n'


def role_playbook() -> str:
    resources = '\n'.join('      - {name: %s, devices: [%s], replicas: %d}' % (name, ', '.join(map(str, gpus)), replicas)
                          for name, gpus, replicas in RESOURCES)
    return '''---
- name: Converge the fleet with gpufleet.mps.fleet
  hosts: all
  gather_facts: false
%s  vars:
    mps_root: "{{ sim_dir }}/root"
    mps_config_dir: "{{ sim_dir }}/etc"
    mps_control_binary: "{{ sim_dir }}/host/bin/nvidia-cuda-mps-control"
    mps_python: "{{ sim_dir }}/py"
    mps_supervisor: none
    mps_stop_timeout: 5
    mps_logrotate_dir: "{{ sim_dir }}/logrotate.d"
    mps_local_facts_dir: "{{ sim_dir }}/facts.d"
    mps_resources:
%s
  roles:
    - role: gpufleet.mps.fleet
''' % (PLAY_ENV, resources)


def module_playbook() -> str:
    """The role's one module task alone, with the arguments the role passes for role_playbook()'s variables."""
    resources = '\n'.join('          - {name: %s, devices: [%s], replicas: %d}' % (name, ', '.join(map(str, gpus)), replicas)
                          for name, gpus, replicas in RESOURCES)
    return '''---
- name: The role's module task alone, without the role
  hosts: all
  gather_facts: false
%s  tasks:
    - name: Bring the host's MPS to the resources
      gpufleet.mps.mps_host:
        root: "{{ sim_dir }}/root"
        config_dir: "{{ sim_dir }}/etc"
        control_binary: "{{ sim_dir }}/host/bin/nvidia-cuda-mps-control"
        supervisor: none
        stop_timeout: 5
        logrotate_dir: "{{ sim_dir }}/logrotate.d"
        local_facts_dir: "{{ sim_dir }}/facts.d"
        resources:
%s
''' % (PLAY_ENV, resources)


def shell_playbook() -> str:
    """The way hand-made MPS setups look: one command/shell task per action, no state checks."""
    mps = '{{ sim_dir }}/host/bin/nvidia-cuda-mps-control'
    tasks = []
    for name, gpus, _replicas in RESOURCES:
        for gpu in gpus:
            tasks.append('''    - name: Set GPU %d to EXCLUSIVE_PROCESS
      ansible.builtin.command: "{{ sim_dir }}/host/bin/nvidia-smi -i %d -c EXCLUSIVE_PROCESS"
''' % (gpu, gpu))
    for name, gpus, replicas in RESOURCES:
        env = '''      environment:
        CUDA_MPS_PIPE_DIRECTORY: "{{ sim_dir }}/root/%s/pipe"
        CUDA_MPS_LOG_DIRECTORY: "{{ sim_dir }}/root/%s/log"
''' % (name, name)
        tasks.append('''    - name: Start the MPS control daemon of %s
      ansible.builtin.shell: mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY" && %s -d
%s        CUDA_VISIBLE_DEVICES: "%s"
''' % (name, mps, env, ','.join(map(str, gpus))))
        tasks.append('''    - name: Set the default active thread percentage of %s
      ansible.builtin.shell: echo set_default_active_thread_percentage %d | %s
%s''' % (name, 100 // replicas, mps, env))
        for ordinal in range(len(gpus)):
            tasks.append('''    - name: Set the default pinned memory limit of %s, device %d
      ansible.builtin.shell: echo set_default_device_pinned_mem_limit %d %dM | %s
%s''' % (name, ordinal, ordinal, GPU_MEM_MIB // replicas, mps, env))
    for name, gpus, replicas in RESOURCES:
        tasks.append('''    - name: Check the MPS control daemon of %s
      ansible.builtin.shell: echo get_server_list | %s
      environment:
        CUDA_MPS_PIPE_DIRECTORY: "{{ sim_dir }}/root/%s/pipe"
''' % (name, mps, name))
    return '''---
# The hand-written baseline: what most sites run today. Not idempotent (every task reports changed).
- name: MPS the hand-written way
  hosts: all
  gather_facts: false
%s  tasks:
%s''' % (PLAY_ENV, ''.join(tasks))


def ping_playbook(count: int) -> str:
    tasks = ''.join('    - name: Ping %d\n      ansible.builtin.ping:\n' % (index + 1) for index in range(count))
    return '''---
- name: Ansible's floor - %d ping task(s) per host
  hosts: all
  gather_facts: false
  tasks:
%s''' % (count, tasks)


# --- running ----------------------------------------------------------------------------------------

class Run(t.NamedTuple):
    variant: str
    hosts: int
    rep: int
    seconds: float
    cpu_s: float
    maxrss_mib: float
    counters: t.List[t.Dict[str, t.Any]]
    recap: t.Dict[str, t.List[int]]
    log: str


class Fleet:
    """N simulated hosts, their playbooks, and the runs over them."""

    def __init__(self, args: argparse.Namespace, hosts: t.Sequence[SimHost], ssh: t.Optional[SshServer] = None) -> None:
        self.args = args
        self.hosts = list(hosts)
        self.dir = os.path.join(args.out, 'n%03d' % len(hosts))
        os.makedirs(os.path.join(self.dir, 'logs'), exist_ok=True)
        self._write('inventory.yml', inventory_text(self.hosts))
        if ssh is not None:
            self._write('inventory_ssh.yml', inventory_text(self.hosts, ssh))
            self._write('ansible_ssh.cfg', ansible_cfg(args, ssh))
        self._write('role.yml', role_playbook())
        self._write('shell.yml', shell_playbook())
        self._write('module.yml', module_playbook())
        self._write('ping_e.yml', ping_playbook(1))
        self._write('ansible.cfg', ansible_cfg(args))
        self.pings = 0

    def _write(self, name: str, text: str) -> None:
        with open(os.path.join(self.dir, name), 'w', encoding='utf-8') as handle:
            handle.write(text)

    def set_pings(self, count: int) -> None:
        self.pings = count
        self._write('ping_d.yml', ping_playbook(count))

    def reset(self) -> None:
        for host in self.hosts:
            host.reset()

    def run(self, variant: str, rep: t.Union[int, str]) -> Run:
        for host in self.hosts:
            host.clear_counters()
        log = os.path.join(self.dir, 'logs', '%s-%s.log' % (rep, variant))
        env = {key: value for key, value in os.environ.items() if not key.startswith('ANSIBLE_')}
        ssh = variant in SSH_VARIANTS
        env.update(ANSIBLE_CONFIG=os.path.join(self.dir, 'ansible_ssh.cfg' if ssh else 'ansible.cfg'),
                   ANSIBLE_COLLECTIONS_PATH=self.args.collections_path)
        argv = [self.args.ansible_playbook, '-i', 'inventory_ssh.yml' if ssh else 'inventory.yml', PLAYBOOKS[variant]]
        with open(log, 'w', encoding='utf-8') as handle:
            started = time.perf_counter()
            proc = subprocess.Popen(argv, cwd=self.dir, env=env, stdout=handle, stderr=subprocess.STDOUT,  # pylint: disable=consider-using-with
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            timer = threading.Timer(self.args.timeout, lambda: os.killpg(proc.pid, signal.SIGKILL))
            timer.start()
            try:
                _pid, status, usage = os.wait4(proc.pid, 0)
            except BaseException:
                os.killpg(proc.pid, signal.SIGKILL)  # interrupted: take this run's playbook down with us
                raise
            finally:
                timer.cancel()
            seconds = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        recap = {match.group(1): [int(value) for value in match.groups()[1:]]
                 for match in map(RECAP.match, _read_lines(log)) if match}
        counters = [host.counters() for host in self.hosts]
        # CPU of the whole tree that ansible-playbook reaped: controller, workers, module processes and what they ran
        # (UI processes, nvidia-smi); not the daemons, which detach. Far steadier than wall time on a busy machine.
        cpu = usage.ru_utime + usage.ru_stime
        run = Run(variant, len(self.hosts), rep if isinstance(rep, int) else -1, seconds, cpu, usage.ru_maxrss / 1024.0, counters,
                  recap, log)
        self.check(run, proc.returncode)
        print('  N=%-3d rep %-6s %s  %7.2fs  %5.3fs/host  cpu %6.2fs  modules/host %s  UI/host %s  NVML inits/host %s' % (
            len(self.hosts), rep, variant, seconds, seconds / len(self.hosts), cpu, _per_host(run, 'modules'), _per_host(run, 'ui'),
            _per_host(run, 'nvml_inits')), flush=True)
        return run

    def check(self, run: Run, returncode: int) -> None:
        """Fail on a failed run or a broken invariant; wall-clock times are never judged."""
        where = 'N=%d %s (%s, log %s)' % (run.hosts, run.variant, TITLES[run.variant], run.log)
        if returncode != 0:
            raise BenchError('%s: ansible-playbook exited with %d' % (where, returncode))
        names = {host.name for host in self.hosts}
        if set(run.recap) != names:
            raise BenchError('%s: the recap lists %s, not the %d hosts' % (where, sorted(run.recap), len(names)))
        bad = [host for host, (_ok, _changed, unreachable, failed, *_rest) in run.recap.items() if unreachable or failed]
        if bad:
            raise BenchError('%s: failed or unreachable on %s' % (where, ', '.join(sorted(bad))))
        if run.variant in ('b', 'f', 'h'):
            changed = [host for host, values in run.recap.items() if values[1]]
            if changed:
                raise BenchError('%s: the re-run changed something on %s (the role is not idempotent)' % (where, ', '.join(sorted(changed))))
        if run.variant in ('a', 'b', 'c', 'f', 'h'):
            down = [host.name for host in self.hosts if host.live_daemons() != len(RESOURCES)]
            if down:
                raise BenchError('%s: not %d daemons running on %s' % (where, len(RESOURCES), ', '.join(down)))
            for host in self.hosts:
                wrong = host.wrong_limits()
                if wrong:
                    raise BenchError('%s: %s: %s' % (where, host.name, wrong))
        for host, counters in zip(self.hosts, run.counters):
            if counters['max_inits_per_process'] > 1:
                raise BenchError('%s: a process on %s initialised NVML %d times' % (where, host.name, counters['max_inits_per_process']))
            if counters['nvml_processes_without_init']:
                raise BenchError('%s: a process on %s called NVML without initialising it' % (where, host.name))
            if run.variant == 'd' and counters['modules'] != self.pings:
                raise BenchError('%s: %s executed %d modules, not %d' % (where, host.name, counters['modules'], self.pings))
            if run.variant in ('b', 'f', 'h') and self.pings and counters['modules'] != self.pings:
                raise BenchError('%s: %s executed %d modules, the warm-up no-op %d' % (where, host.name, counters['modules'], self.pings))


def ansible_cfg(args: argparse.Namespace, ssh: t.Optional[SshServer] = None) -> str:
    text = '''# The benchmark's whole Ansible configuration (ANSIBLE_* variables of the caller are dropped).
[defaults]
forks = %d
host_key_checking = False
retry_files_enabled = False
stdout_callback = default
nocolor = True
interpreter_python = auto_silent

[connection]
pipelining = %s
''' % (args.forks, 'True' if args.pipelining else 'False')
    if ssh is not None:
        # One master connection per host, kept between tasks and runs (ControlPersist), as an SSH fleet is run.
        text += '''
[ssh_connection]
ssh_args = -o ControlMaster=auto -o ControlPersist=120s -o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no -o IdentitiesOnly=yes -o LogLevel=ERROR
control_path_dir = %s
pipelining = %s
''' % (ssh.control_dir, 'True' if args.pipelining else 'False')
    return text


def _per_host(run: Run, key: str) -> str:
    values = sorted({counters[key] for counters in run.counters})
    return str(values[0]) if len(values) == 1 else '%s..%s' % (values[0], values[-1])


def bench_fleet(args: argparse.Namespace, hosts: t.Sequence[SimHost], ssh: t.Optional[SshServer] = None) -> t.Dict[str, t.Any]:
    fleet = Fleet(args, hosts, ssh)
    n = len(hosts)
    if args.pings:
        fleet.set_pings(args.pings)
    else:
        print('N=%d: warm-up (a, b) to count the no-op\'s module executions' % n, flush=True)
        fleet.reset()
        fleet.run('a', 'warmup')
        warm = fleet.run('b', 'warmup')
        counts = {counters['modules'] for counters in warm.counters}
        if len(counts) != 1:
            raise BenchError('N=%d: hosts executed different module counts in the no-op: %s' % (n, sorted(counts)))
        fleet.set_pings(counts.pop())
    runs: t.Dict[str, t.List[Run]] = {variant: [] for variant in VARIANTS if variant in args.variants}
    # f (the no-op over SSH) needs the role's converged hosts: it runs in a's block, after b.
    blocks = [block for block in ([v for v in ('a', 'b', 'h', 'f') if v in runs], ['c'], ['d'], ['e'], ['g'])
              if all(v in runs for v in block) and block]
    for rep in range(args.reps):
        shift = rep % len(blocks)
        for block in blocks[shift:] + blocks[:shift]:
            if block[0] in ('a', 'c'):
                fleet.reset()
            for variant in block:
                runs[variant].append(fleet.run(variant, rep))
    fleet.reset()
    return summarize(n, fleet.pings, runs, args.pipelining)


def summarize(n: int, pings: int, runs: t.Mapping[str, t.Sequence[Run]], pipelining: bool) -> t.Dict[str, t.Any]:
    result: t.Dict[str, t.Any] = {'hosts': n, 'pings_d': pings, 'variants': {}, 'pipelining': pipelining}
    for variant, items in runs.items():
        first = items[0].counters
        result['variants'][variant] = {
            'seconds': [round(run.seconds, 3) for run in items],
            'median_s': statistics.median(run.seconds for run in items),
            'per_host_s': statistics.median(run.seconds for run in items) / n,
            'cpu_s': [round(run.cpu_s, 3) for run in items],
            'median_cpu_s': statistics.median(run.cpu_s for run in items),
            'cpu_per_host_s': statistics.median(run.cpu_s for run in items) / n,
            'maxrss_mib': statistics.median(run.maxrss_mib for run in items),
            'modules_per_host': statistics.median(c['modules'] for run in items for c in run.counters),
            'ui_per_host': statistics.median(c['ui'] for run in items for c in run.counters),
            'nvml_inits_per_host': statistics.median(c['nvml_inits'] for run in items for c in run.counters),
            'max_nvml_inits_per_process': max(c['max_inits_per_process'] for run in items for c in run.counters),
            'module_names': first[0]['module_names'],
            'changed_per_host': statistics.median(values[1] for run in items for values in run.recap.values()),
        }
    med = {variant: result['variants'][variant]['median_s'] for variant in runs}
    cpu = {variant: result['variants'][variant]['median_cpu_s'] for variant in runs}
    result['ratios'] = {'%s/%s' % pair: med[pair[0]] / med[pair[1]] for pair in RATIOS if pair[0] in med and pair[1] in med}
    result['cpu_ratios'] = {'%s/%s' % pair: cpu[pair[0]] / cpu[pair[1]] for pair in RATIOS if pair[0] in cpu and pair[1] in cpu}
    return result


# --- module level ---------------------------------------------------------------------------------

def bench_modules(args: argparse.Namespace) -> t.Dict[str, t.Any]:
    host = SimHost(args.sim_base, 'mod')
    shutil.rmtree(host.dir, ignore_errors=True)
    host.create(args.lib, args.python)
    host.reset()
    host.clear_counters()
    env = {key: value for key, value in os.environ.items() if not key.startswith('ANSIBLE_')}
    env.update(FAKE_NVML_CONFIG=os.path.join(host.dir, 'host', 'nvml.ini'), LD_LIBRARY_PATH=os.path.join(host.dir, 'host', 'lib'),
               FAKE_NVML_CALL_LOG=host.nvml_log)
    print('module level: mps_limits and mps_daemon no-op on an 8-GPU daemon, %d reps' % args.module_reps, flush=True)
    try:
        proc = subprocess.run([args.python, os.path.join(BENCH, 'modbench.py'), '--sim-dir', host.dir, '--reps', str(args.module_reps),
                               '--collections-path', args.collections_path], env=env, capture_output=True, text=True,
                              timeout=args.timeout, check=False)
    finally:
        kill_pids(sim_processes(host.dir))
    if proc.returncode != 0:
        raise BenchError('module-level benchmark failed (%d): %s' % (proc.returncode, proc.stderr[-4000:]))
    report = json.loads(proc.stdout)
    for name in ('mps_limits', 'mps_daemon'):
        call = report['calls'][name]
        if call['max_ui_processes'] != 1 or call['max_nvml_inits'] != 1:
            raise BenchError('module level: a no-op %s call used %d control UI processes and %d NVML inits (want 1 and 1)' % (
                name, call['max_ui_processes'], call['max_nvml_inits']))
    shutil.rmtree(host.dir, ignore_errors=True)
    return report


# --- report ----------------------------------------------------------------------------------------

def _git(*argv: str, stdin: str = '') -> str:
    """A read-only git command in the repository; '' when git is unavailable."""
    try:
        return subprocess.run(['git'] + list(argv), cwd=REPO, input=stdin, capture_output=True, text=True, check=False, timeout=60).stdout
    except OSError:
        return ''


def tree_identity(collection: str) -> str:
    """What was measured: the repository's HEAD, and the files of the copied collection that differ from it."""
    head = _git('rev-parse', '--short', 'HEAD').strip()
    if not head:
        return 'unknown (no git)'
    parts = ('plugins', 'roles', 'meta')
    committed = {}
    for line in _git('ls-tree', '-r', 'HEAD', '--', *parts).splitlines():
        info, path = line.split('\t', 1)
        committed[path] = info.split()[2]
    measured = []
    for part in parts:
        for folder, dirs, files in os.walk(os.path.join(collection, part)):
            dirs[:] = [name for name in dirs if name != '__pycache__']
            measured += [os.path.relpath(os.path.join(folder, name), collection) for name in files]
    measured.sort()
    # hash-object without -w computes blob ids and writes nothing
    blobs = _git('hash-object', '--stdin-paths', stdin='\n'.join(os.path.join(collection, path) for path in measured)).split()
    differ = [path for path, blob in zip(measured, blobs) if committed.get(path) != blob]
    differ += sorted(set(committed) - set(measured))
    if not differ:
        return 'HEAD %s (the measured plugins/, roles/, meta/ are identical to it)' % head
    return 'HEAD %s, with %d file(s) of plugins/, roles/, meta/ differing from it: %s' % (head, len(differ), ', '.join(differ))


def environment_facts(args: argparse.Namespace) -> t.Dict[str, t.Any]:
    cpu = next((line.split(':', 1)[1].strip() for line in _read_lines('/proc/cpuinfo') if line.startswith('model name')), platform.machine())
    mem = next((line.split()[1] for line in _read_lines('/proc/meminfo') if line.startswith('MemTotal:')), '0')
    version = next((line.split(':', 1)[1].strip() for line in _read_lines(os.path.join(REPO, 'galaxy.yml')) if line.startswith('version:')), '?')

    def dist(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return 'not installed'

    return {
        'date': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC'),
        'machine': '%s, %d CPUs, %.1f GiB RAM' % (cpu, os.cpu_count() or 0, int(mem) / 1048576.0),
        'os': platform.platform(),
        'python': platform.python_version(),
        'ansible_core': dist('ansible-core'),
        'nvidia_ml_py': dist('nvidia-ml-py'),
        'collection': 'gpufleet.mps %s' % version,
        'tree': tree_identity(os.path.join(args.collections_path, 'ansible_collections', 'gpufleet', 'mps')),
        'forks': args.forks,
        'pipelining': args.pipelining,
        'reps': args.reps,
        'module_reps': args.module_reps,
        'variants': ''.join(sorted(args.variants)),
    }


def _f(value: float, digits: int = 2) -> str:
    return '%.*f' % (digits, value)


def primary(fleet: t.Sequence[t.Dict[str, t.Any]]) -> t.List[t.Dict[str, t.Any]]:
    """Per fleet size, the first measurement with Ansible's defaults (no pipelining): what plots and scaling use."""
    chosen: t.Dict[int, t.Dict[str, t.Any]] = {}
    for item in fleet:
        if not item.get('pipelining') and item['hosts'] not in chosen:
            chosen[item['hosts']] = item
    return [chosen[n] for n in sorted(chosen)]


def _judge(wall: bool, cpu: bool) -> str:
    if wall == cpu:
        return 'met' if wall else 'MISSED'
    return 'wall: %s, CPU: %s' % ('met' if wall else 'MISSED', 'met' if cpu else 'MISSED')


def targets(fleet: t.Sequence[t.Dict[str, t.Any]], modules: t.Optional[t.Dict[str, t.Any]]) -> t.List[t.Tuple[str, str, str]]:
    """(target, measured, verdict) rows; time ratios are judged on wall time and on CPU time."""
    rows = []
    for item in fleet:
        ratios, cpu = item['ratios'], item['cpu_ratios']
        where = 'N=%d, run %d' % (item['hosts'], item.get('run', 0) + 1)
        for key, limit, what in (('b/e', 1.5, 'no-op, local'), ('f/g', 1.5, 'no-op over SSH'), ('a/e', 3.0, 'first converge')):
            if key in ratios:
                rows.append(('%s <= %g, %s (%s)' % (key, limit, what, where), '%s (CPU %s)' % (_f(ratios[key]), _f(cpu[key])),
                             _judge(ratios[key] <= limit, cpu[key] <= limit)))
        for variant in ('b', 'f'):
            if variant in item['variants']:
                count = item['variants'][variant]['modules_per_host']
                rows.append(('%s: 1 module execution per host (%s)' % (variant, where), '%g' % count, 'met' if count == 1 else 'MISSED'))
        for name in ('a', 'b'):
            key = '%s/c' % name
            if key in ratios:
                rows.append(('%s < c (%s)' % (name, where), '%s = %s (CPU %s)' % (key, _f(ratios[key]), _f(cpu[key])),
                             _judge(ratios[key] < 1, cpu[key] < 1)))
    if modules:
        for name in ('mps_limits', 'mps_daemon'):
            call = modules['calls'][name]
            ok = call['max_ui_processes'] == 1 and call['max_nvml_inits'] == 1
            rows.append(('one UI process and one NVML init per no-op %s call' % name,
                         '%d UI, %d NVML init' % (call['max_ui_processes'], call['max_nvml_inits']), 'met' if ok else 'MISSED'))
    inits = [item['variants'][v]['max_nvml_inits_per_process'] for item in fleet for v in ('a', 'b') if v in item['variants']]
    if inits:
        rows.append(('at most one NVML init per module process (fleet runs a, b)', 'max %d' % max(inits), 'met' if max(inits) <= 1 else 'MISSED'))
    default_runs = primary(fleet)
    for variant in VARIANTS:
        by_n = {item['hosts']: item['variants'][variant] for item in default_runs if variant in item['variants']}
        sizes = [n for n in sorted(by_n) if n >= 4]
        if len(sizes) < 2 or sizes[0] != 4:
            continue
        top = sizes[-1]
        wall = by_n[top]['per_host_s'] / by_n[4]['per_host_s']
        cpu_growth = by_n[top]['cpu_per_host_s'] / by_n[4]['cpu_per_host_s']
        rows.append(('%s: cost per host flat from N=4 to N=%d (within 25%%)' % (variant, top),
                     'wall x%s, CPU x%s' % (_f(wall), _f(cpu_growth)), _judge(wall <= 1.25, cpu_growth <= 1.25)))
    return rows


def measured_markdown(runs: t.Sequence[t.Dict[str, t.Any]], fleet: t.Sequence[t.Dict[str, t.Any]],
                      modules: t.Optional[t.Dict[str, t.Any]], module_runs: t.Sequence[t.Dict[str, t.Any]] = ()) -> str:
    """The measured block of RESULTS.md: one or more invocations (``runs``), their fleets, the module level (each run's)."""
    facts = runs[0]
    last_modules = modules
    out = [MEASURED_BEGIN, '',
           '- machine: %s; %s' % (facts['machine'], facts['os']),
           '- versions: Python %s, ansible-core %s, nvidia-ml-py %s, %s' % (
               facts['python'], facts['ansible_core'], facts['nvidia_ml_py'], facts['collection'])]
    for index, run in enumerate(runs):
        fleet_part = 'module level only' if run.get('sizes') == [] else 'forks %d, pipelining %s, %d repetition(s) per variant' % (
            run['forks'], 'on' if run['pipelining'] else 'off', run['reps'])
        out.append('- run %d, %s (%s min; load average at start / end %s / %s): %s, module level %d repetition(s); measured: %s\n  `%s`' % (
            index + 1, run['date'], run.get('total_minutes', '?'), run.get('load_start', '?'), run.get('load_end', '?'), fleet_part,
            run['module_reps'], run.get('tree', '?'), run['command']))
    out += ['', '### Fleet: wall time (median over the repetitions) and per-host counts', '',
            '| N | run | variant | wall s | wall s/host | each run, wall s | CPU s | CPU s/host | modules/host | UI procs/host | '
            'NVML inits/host | peak RSS MiB |',
            '|---:|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|']
    for item in fleet:
        for variant in [v for v in VARIANTS if v in item['variants']]:
            data = item['variants'][variant]
            label = TITLES[variant] if variant != 'd' else 'pings: %d per host' % item['pings_d']
            out.append('| %d | %d | %s %s | %s | %s | %s | %s | %s | %g | %g | %g | %.0f |' % (
                item['hosts'], item.get('run', 0) + 1, variant, label, _f(data['median_s']), _f(data['per_host_s'], 3),
                ' '.join(_f(value, 1) for value in data['seconds']), _f(data['median_cpu_s']), _f(data['cpu_per_host_s'], 3),
                data['modules_per_host'], data['ui_per_host'], data['nvml_inits_per_host'], data['maxrss_mib']))
    keys = ['%s/%s' % pair for pair in RATIOS]
    out += ['', '### Ratios of the medians: wall time (CPU time)', '', '| N | run | %s |' % ' | '.join(keys),
            '|---:|---:|%s' % ('---:|' * len(keys))]
    for item in fleet:
        out.append('| %d | %d | %s |' % (item['hosts'], item.get('run', 0) + 1, ' | '.join(_ratio(item, key) for key in keys)))
    if fleet:
        first = fleet[0]['variants']
        out += ['', 'Module executions per host (N=%d, counted by the per-host interpreter wrapper): %s.' % (
            fleet[0]['hosts'], '; '.join('%s: %s' % (v, _names(first[v]['module_names'])) for v in ('a', 'b', 'c', 'f') if v in first))]
    for modules in module_runs or ([modules] if modules else []):
        calls = modules['calls']
        heading = '### Module level: no-op on one 8-GPU daemon with one MPS server (run %d, median of %d)' % (
            modules.get('run', 0) + 1, modules['reps'])
        out += ['', heading, '', '| call | subprocesses | control UI processes | NVML inits | time inside (ms) |', '|---|---:|---:|---:|---:|']
        for name, label in (('mps_limits', '`mps_limits` run()'), ('naive_limits', 'naive limits check, one command per process'),
                            ('mps_daemon', '`mps_daemon` run()'), ('naive_daemon', 'naive daemon check, one UI + `nvidia-smi` per GPU')):
            call = calls[name]
            out.append('| %s | %g | %g | %g | %s |' % (
                label, call['subprocesses'], call['ui_processes'], call['nvml_inits'], _f(call['seconds'] * 1000, 1)))
        proc, proc_cpu = modules['process_seconds'], modules.get('process_cpu_seconds', {})
        out += ['', 'Whole module process, median wall (CPU) ms - Python start, imports, run, and the processes it starts; what '
                'each module execution pays on top of Ansible\'s own per-task work: %s.' % ', '.join(
                    '`%s` %s (%s)' % (name, _f(proc[name] * 1000, 0), _f(proc_cpu[name] * 1000, 0) if name in proc_cpu else '?')
                    for name in ('ping', 'mps_limits', 'mps_daemon', 'mps_info', 'mps_host', 'python') if name in proc)]
        if 'mps_host_phases' in modules:
            ph = modules['mps_host_phases']
            out += ['', 'Where one `mps_host` no-op module process spends its time (bench/phases.py, median ms; the interpreter\'s '
                    'own start, `python` above, comes first): %s; total after start %s.' % (', '.join(
                        '%s %s' % (key.replace('_', ' '), _f(ph[key] * 1000, 1)) for key in (
                            'import_ansible', 'import_collection', 'nvml_init', 'plan', 'observe', 'decide', 'ui', 'results', 'rest')
                        if key in ph),
                        _f(ph['total'] * 1000, 1))]
        if 'ui_process' in modules:
            out += ['', 'One control UI process of the simulator: %s ms wall, %s ms CPU (it is Python; the real '
                    '`nvidia-cuda-mps-control` is a native program).' % (
                        _f(modules['ui_process']['wall_s'] * 1000, 0), _f(modules['ui_process']['cpu_s'] * 1000, 0))]
    out += ['', '### Targets', '', '| target | measured | |', '|---|---|---|']
    out += ['| %s | %s | %s |' % row for row in targets(fleet, last_modules)]
    out += ['', MEASURED_END]
    return '\n'.join(out) + '\n'


def _ratio(item: t.Mapping[str, t.Any], key: str) -> str:
    if key not in item['ratios']:
        return '-'
    return '%s (%s)' % (_f(item['ratios'][key]), _f(item['cpu_ratios'][key]))


def _names(names: t.Mapping[str, int]) -> str:
    return ', '.join('%s x%d' % (name, count) if count > 1 else name for name, count in sorted(names.items())) or 'none'


def write_outputs(args: argparse.Namespace, results: t.Dict[str, t.Any]) -> None:
    """results.json (unless re-rendering), RESULTS.md and the plot in --out; with --publish, into bench/ too."""
    runs, fleet, modules = results['runs'], results['fleet'], results['modules']
    if not args.from_json:
        with open(os.path.join(args.out, 'results.json'), 'w', encoding='utf-8') as handle:
            json.dump(results, handle, indent=2, sort_keys=True)
    block = measured_markdown(runs, fleet, modules, results.get('module_runs', ()))
    with open(os.path.join(args.out, 'RESULTS.md'), 'w', encoding='utf-8') as handle:
        handle.write('# gpufleet.mps benchmark results\n\n' + block)
    default_runs = primary(fleet)
    plotted = [v for v in VARIANTS if any(v in item['variants'] for item in default_runs)]
    if plotted:
        for name, key, title in ((PLOT_NAME, 'per_host_s', 'wall seconds per host'), (CPU_PLOT_NAME, 'cpu_per_host_s', 'CPU seconds per host')):
            plot(os.path.join(args.out, name), 'gpufleet.mps: %s vs fleet size' % title, title + ' (median)',
                 {variant: [(item['hosts'], item['variants'][variant][key]) for item in default_runs if variant in item['variants']]
                  for variant in plotted})
    if args.publish:
        target = os.path.join(BENCH, 'RESULTS.md')
        text = '# gpufleet.mps benchmark results\n\n'
        if os.path.exists(target):
            with open(target, encoding='utf-8') as handle:
                text = handle.read()
        if MEASURED_BEGIN in text and MEASURED_END in text:
            head, rest = text.split(MEASURED_BEGIN, 1)
            text = head + block.rstrip('\n') + rest.split(MEASURED_END, 1)[1]
        else:
            text = text.rstrip('\n') + '\n\n' + block
        with open(target, 'w', encoding='utf-8') as handle:
            handle.write(text)
        if plotted:
            for name in (PLOT_NAME, CPU_PLOT_NAME):
                shutil.copyfile(os.path.join(args.out, name), os.path.join(BENCH, name))


def plot(path: str, title: str, ylabel: str, series: t.Mapping[str, t.Sequence[t.Tuple[int, float]]]) -> None:
    """One line per variant over the fleet sizes (log x), written as a PNG with matplotlib."""
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use('Agg')
    from matplotlib import pyplot  # pylint: disable=import-outside-toplevel
    figure, axes = pyplot.subplots(figsize=(8, 5), dpi=100)
    for variant, points in series.items():
        if not points:
            continue
        xs, ys = zip(*sorted(points))
        axes.plot(xs, ys, marker='o', color=COLORS[variant], linestyle='--' if variant in SSH_VARIANTS else '-',
                  label='%s %s' % (variant, TITLES[variant]))
    sizes = sorted({n for points in series.values() for n, _value in points})
    if len(sizes) > 1:
        axes.set_xscale('log', base=2)
    axes.set_xticks(sizes)
    axes.set_xticklabels([str(n) for n in sizes])
    axes.set_ylim(bottom=0)
    axes.set_xlabel('hosts (N)')
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize='small')
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)


def merge(paths: t.Sequence[str]) -> t.Dict[str, t.Any]:
    """Several results.json into one report: runs in order, fleets by size, the last module-level result."""
    merged: t.Dict[str, t.Any] = {'runs': [], 'fleet': [], 'modules': None, 'module_runs': []}
    for path in paths:
        with open(path, encoding='utf-8') as handle:
            data = json.load(handle)
        offset = len(merged['runs'])
        merged['runs'].extend(data['runs'])
        for item in data['fleet']:
            merged['fleet'].append(dict(item, run=item.get('run', 0) + offset))
        if data['modules']:
            merged['modules'] = dict(data['modules'], run=offset)
            merged['module_runs'].append(merged['modules'])
    merged['fleet'].sort(key=lambda item: (item['hosts'], item['run']))
    return merged


# --- main ------------------------------------------------------------------------------------------

def parse_args(argv: t.Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0], epilog='Quick check (make test): --hosts 2 --reps 1 --out DIR')
    parser.add_argument('--hosts', default='16', help='fleet size(s), comma separated (default 16), e.g. 1,4,16,64')
    parser.add_argument('--reps', type=int, default=3, help='repetitions of each variant (default 3; medians are reported)')
    parser.add_argument('--out', required=True, help='output directory (playbooks, logs, results.json, RESULTS.md, plot)')
    parser.add_argument('--variants', default=''.join(VARIANTS), help='which of a,b,c,d,e,f,g,h to time (default all; f and h bring '
                        'b and b brings a along; f and g start an sshd of their own)')
    parser.add_argument('--pings', type=int, default=0, help='ping tasks per host for d; default: count the modules of a warm-up no-op '
                        '(a, b); given, the warm-up is skipped and every b run must execute exactly this many modules')
    parser.add_argument('--module-reps', type=int, default=5, help='repetitions of the module-level benchmark (0 skips it)')
    parser.add_argument('--forks', type=int, default=5, help='Ansible forks (default 5, Ansible\'s default)')
    parser.add_argument('--pipelining', action='store_true', help='enable Ansible pipelining (default off, Ansible\'s default)')
    parser.add_argument('--publish', action='store_true', help='also update bench/RESULTS.md (its measured block) and bench/%s' % PLOT_NAME)
    parser.add_argument('--from-json', nargs='+', metavar='RESULTS_JSON',
                        help='measure nothing: render RESULTS.md and the plot from these results.json files (merged)')
    parser.add_argument('--sim-base', default='/tmp/gfb', help='a fresh directory for this run\'s simulated hosts is made in it '
                        '(keep it short: unix socket paths); removed at the end')
    parser.add_argument('--lib', default=os.path.join(REPO, '.simhost', 'lib'), help='directory of the built fake libnvidia-ml.so.1')
    parser.add_argument('--timeout', type=int, default=1800, help='seconds allowed for one ansible-playbook run')
    parser.add_argument('--collections-path', default=os.environ.get('ANSIBLE_COLLECTIONS_PATH', ''),
                        help='where ansible_collections/gpufleet/mps is (default: $ANSIBLE_COLLECTIONS_PATH)')
    args = parser.parse_args(argv)
    args.out = os.path.abspath(args.out)
    if args.from_json:
        return args
    try:
        args.sizes = [int(value) for value in args.hosts.split(',')]
    except ValueError:
        parser.error('--hosts: comma-separated numbers, got %r' % args.hosts)
    args.sizes = [size for size in args.sizes if size != 0]  # --hosts 0: the module level only
    if any(size < 1 or size > 999 for size in args.sizes) or args.reps < 1 or args.module_reps < 0 or args.pings < 0:
        parser.error('--hosts must be 1..999, --reps at least 1, --module-reps and --pings at least 0')
    args.variants = {variant for variant in args.variants.replace(',', '') if variant in VARIANTS}
    if args.variants & {'f', 'h'}:
        args.variants.add('b')
    if 'b' in args.variants:
        args.variants.add('a')
    args.python = sys.executable
    args.ansible_playbook = os.path.join(os.path.dirname(sys.executable), 'ansible-playbook')
    if not os.access(args.ansible_playbook, os.X_OK):
        args.ansible_playbook = shutil.which('ansible-playbook') or parser.error('ansible-playbook not found')
    roots = [path for path in args.collections_path.split(os.pathsep) if path]
    found = [path for path in roots if os.path.isfile(os.path.join(path, 'ansible_collections', 'gpufleet', 'mps', 'roles', 'fleet', 'tasks', 'main.yml'))]
    if not found:
        parser.error('the collection is not reachable: run `make collection TEST_ROOT=/tmp/gpufleet-bench` and '
                     'export ANSIBLE_COLLECTIONS_PATH=/tmp/gpufleet-bench (or give --collections-path)')
    args.collections_path = os.path.abspath(found[0])
    if not os.path.isfile(os.path.join(args.lib, 'libnvidia-ml.so.1')):
        parser.error('%s/libnvidia-ml.so.1 is missing: run `make simhost`' % args.lib)
    args.lib = os.path.abspath(args.lib)
    args.sim_base = os.path.abspath(args.sim_base)
    # <base>/<run dir, 11>/<host>/root/train/pipe/control must stay well under 107 bytes.
    if len(os.fsencode(os.path.join(args.sim_base, 'x' * 11, 'h%03d' % max(args.sizes + [1]), 'root', 'train', 'pipe', 'control'))) > 100:
        parser.error('--sim-base %s is too long for unix socket paths' % args.sim_base)
    return args


def _terminate(signum: int, _frame: t.Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally clauses: playbook, daemons and host dirs are cleaned up


def main(argv: t.Sequence[str]) -> int:
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _terminate)
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.from_json:
        results = merge(args.from_json)
        write_outputs(args, results)
        print('wrote %s from %s' % (os.path.join(args.out, 'RESULTS.md'), ', '.join(args.from_json)))
        return 0
    os.makedirs(args.sim_base, exist_ok=True)
    # A directory of its own: concurrent runs (make test beside a long benchmark) never touch each other's hosts.
    args.sim_base = tempfile.mkdtemp(prefix='r-', dir=args.sim_base)
    python = os.path.relpath(args.python, REPO) if args.python.startswith(REPO + os.sep) else args.python
    facts = environment_facts(args)
    facts['command'] = 'ANSIBLE_COLLECTIONS_PATH=%s %s bench/fleetbench.py %s' % (args.collections_path, python, ' '.join(argv))
    facts['load_start'] = ' '.join('%.2f' % value for value in os.getloadavg())
    facts['sizes'] = args.sizes
    width = max(2, len(str(max(args.sizes + [1]) - 1)))
    hosts = [SimHost(args.sim_base, 'h%0*d' % (width, index)) for index in range(max(args.sizes + [0]))]
    fleet: t.List[t.Dict[str, t.Any]] = []
    modules = None
    started = time.monotonic()
    ssh = SshServer(args.sim_base) if args.sizes and args.variants & set(SSH_VARIANTS) else None
    try:
        print('laying out %d simulated hosts under %s' % (len(hosts), args.sim_base), flush=True)
        for host in hosts:
            host.create(args.lib, args.python)
        if ssh is not None:
            ssh.start()
            print('sshd of this run on 127.0.0.1:%d (variants %s)' % (ssh.port, ', '.join(sorted(args.variants & set(SSH_VARIANTS)))), flush=True)
        for size in args.sizes:
            fleet.append(bench_fleet(args, hosts[:size], ssh))
            print('N=%d: %s' % (size, '  '.join('%s %.2f' % item for item in sorted(fleet[-1]['ratios'].items()))), flush=True)
        if args.module_reps:
            modules = bench_modules(args)
    except BenchError as exc:
        print('FAILED: %s' % exc, file=sys.stderr)
        return 1
    finally:
        if ssh is not None:
            ssh.stop()
        kill_pids(sim_processes(args.sim_base))
        shutil.rmtree(args.sim_base, ignore_errors=True)
    facts['load_end'] = ' '.join('%.2f' % value for value in os.getloadavg())
    facts['total_minutes'] = round((time.monotonic() - started) / 60.0, 1)
    results = {'runs': [facts], 'fleet': fleet, 'modules': modules}
    write_outputs(args, results)
    print('wrote %s (%.1f min)' % (os.path.join(args.out, 'RESULTS.md'), facts['total_minutes']))
    for row in targets(fleet, modules):
        print('  %-60s %-16s %s' % row)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
