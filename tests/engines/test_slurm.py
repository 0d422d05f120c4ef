# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Slurm's MPS jobs reach this collection's daemons: a real one-node Slurm cluster over a simulated 4-GPU host.

The fleet role provisions four one-GPU resources ``gpu0``..``gpu3`` on a simulated host of this test's own; the
TaskProlog and ``gres.conf`` are rendered from the facts file it writes (``render_task_prolog``,
``render_gres_conf``); a cluster of this test's own (``slurm_cluster.py``) runs the jobs. Each job runs ``job.sh``:
one line of what it saw (Slurm's GPU, the environment the TaskProlog gave it), then the CUDA client stand-in with
``--device "$CUDA_VISIBLE_DEVICES"`` - an ordinal its daemon does not have fails the client, as it would fail
cuInit - whose JSON line says which GPU (UUID), server and thread percentage it got.

Proven: an MPS job reaches the daemon of the GPU Slurm gave it, with Slurm's percentage, in a step (srun:
SLURM_STEP_GPUS) and in a batch script (SLURM_JOB_GPUS), on GPU 0 and on GPU 1 (where Slurm's CUDA_VISIBLE_DEVICES
is 1, or 0 under ConstrainDevices=yes, and the daemon's ordinal is 0), as root and as an unprivileged user; two MPS
jobs share one GPU at once, each with its own percentage, attached to one server; other jobs are left alone; a job
whose GPU's daemon is gone (SIGKILL: its sockets and pid file stay) or that no daemon serves fails before it starts,
with the prolog's line as its output. Then the role tears down, the cluster stops, and no process of the test is
left. Run by ``make engines`` (TEST_ROOT, ANSIBLE_COLLECTIONS_PATH); the transcript it prints is what the docs quote.
"""
from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, Iterator, List, Optional, Tuple

import pytest
import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
sys.path.insert(0, os.path.join(REPO, 'tests', 'fakes'))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from private_host import PYTHON, collections_path, private_host  # noqa: E402  pylint: disable=wrong-import-position
from quoted import check_quoted  # noqa: E402  pylint: disable=wrong-import-position
from slurm_cluster import SlurmCluster, cgroup_v1_devices, device_dir, pid_alive  # noqa: E402  pylint: disable=wrong-import-position

CLIENT = os.path.join(REPO, 'tests', 'fakes', 'mps', 'mps_client.py')
GPUS = 4
NOBODY = 65534
RECAP = re.compile(r'^gpu01\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)', re.M)
SAW = re.compile(r'^job: (.*)$', re.M)  # job.sh's first line
NOT_RUNNING = 'gpufleet.mps: the MPS daemon of GPU {gpu} (resource gpu{gpu}, {pipe}) under {root} is not running'
NOT_SERVED = 'gpufleet.mps: no MPS daemon under {root} serves GPU {gpu}, which Slurm gave this job'
# What the docs quote: each srun line and its output, in the order they ran.
TRANSCRIPT: List[str] = []
JOB_SH = '''#!/bin/sh
# An MPS job: what Slurm and the TaskProlog gave it, then a CUDA client on its device.
echo "job: SLURM_STEP_GPUS=${SLURM_STEP_GPUS-} SLURM_JOB_GPUS=${SLURM_JOB_GPUS-} CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-}\
 CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE-} CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY-}"
exec "${JOB_PYTHON:-%s}" %s --device "$CUDA_VISIBLE_DEVICES" "$@"
'''


def role(host: Dict[str, str], name: str, role_vars: dict) -> List[int]:
    """The fleet role with role_vars on the simulated host: ok, changed, unreachable, failed."""
    play = [{'name': 'gpufleet.mps on the Slurm node', 'hosts': 'gpu_nodes', 'gather_facts': False, 'environment': '{{ sim_env }}',
             'roles': [{'role': 'gpufleet.mps.fleet', 'vars': role_vars}]}]
    path = os.path.join(host['work'], name)
    with open(path, 'w', encoding='utf-8') as handle:
        yaml.safe_dump(play, handle, sort_keys=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith(('CUDA_MPS_', 'FAKE_', 'NVML_', 'SLURM_'))}
    env.update(ANSIBLE_NOCOLOR='1', ANSIBLE_FORCE_COLOR='0', LD_LIBRARY_PATH='', ANSIBLE_COLLECTIONS_PATH=host['collections'])
    proc = subprocess.run([os.path.join(REPO, '.venv', 'bin', 'ansible-playbook'), '-i', os.path.join(host['work'], 'inventory.yml'), path],
                          cwd=host['work'], env=env, capture_output=True, text=True, timeout=600, check=False)
    found = RECAP.search(proc.stdout)
    assert proc.returncode == 0 and found, proc.stdout[-6000:] + proc.stderr[-2000:]
    return [int(value) for value in found.groups()]


def resources_from_facts(host: Dict[str, str]) -> List[dict]:
    """render_task_prolog's resources from the facts file the role wrote (what a later play reads as ansible_local)."""
    with open(os.path.join(host['base'], 'etc', 'ansible', 'facts.d', 'gpufleet_mps.fact'), encoding='utf-8') as handle:
        facts = json.load(handle)
    assert facts['root'] == host['root'] and facts['ready'] is True, facts
    return [{'name': item['name'], 'pipe_dir': item['env']['CUDA_MPS_PIPE_DIRECTORY'], 'log_dir': item['env']['CUDA_MPS_LOG_DIRECTORY'],
             'devices': item['devices']} for item in facts['resources']]


def write_prolog(path: str, root: str, resources: List[dict]) -> None:
    """The TaskProlog, replaced atomically: slurmstepd runs the file afresh for every task."""
    from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.slurm import render_task_prolog  # pylint: disable=import-outside-toplevel
    with open(path + '.tmp', 'w', encoding='utf-8') as handle:
        handle.write(render_task_prolog(root, resources))
    os.chmod(path + '.tmp', 0o755)
    os.replace(path + '.tmp', path)


def slurm_cluster(host: Dict[str, str], name: str, prolog: str, cgroup: bool = False) -> SlurmCluster:
    """A cluster in <work>/<name> with gres.conf rendered from the facts, and the TaskProlog at ``prolog``."""
    from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.slurm import render_gres_conf  # pylint: disable=import-outside-toplevel
    work = os.path.join(host['work'], name)
    gres_conf = render_gres_conf(json.loads(host['resources']), device_dir=device_dir(work))
    return SlurmCluster(work, gres_conf, 'gpu:%d,mps:%d' % (GPUS, GPUS * 100), GPUS, task_prolog=prolog, cgroup=cgroup)


@pytest.fixture(scope='module')
def host() -> Iterator[Dict[str, str]]:
    """The simulated host with its four daemons and what the facts say about them; torn down after."""
    began = time.monotonic()
    work, base, sim = private_host('engines-slurm', 'engines', 'h100x4.ini')
    coll = collections_path(work)
    sys.path.insert(0, coll)
    info = {'work': work, 'base': base, 'sim': sim, 'collections': coll, 'root': base + '/run/nvidia/mps',
            'prolog': os.path.join(work, 'task_prolog.sh'), 'job': os.path.join(work, 'job.sh'),
            'gres_conf': os.path.join(work, 'gres.conf')}
    inventory = {'all': {'children': {'gpu_nodes': {'hosts': {'gpu01': {
        'ansible_connection': 'local', 'ansible_python_interpreter': PYTHON, 'ansible_become': False,
        'mps_root': info['root'], 'mps_config_dir': base + '/etc/gpufleet-mps',
        'mps_control_binary': sim + '/bin/nvidia-cuda-mps-control', 'mps_python': PYTHON, 'mps_supervisor': 'none',
        'mps_stop_timeout': 5, 'mps_logrotate_dir': base + '/etc/logrotate.d', 'mps_local_facts_dir': base + '/etc/ansible/facts.d',
        'sim_env': {'FAKE_NVML_CONFIG': sim + '/nvml.ini', 'LD_LIBRARY_PATH': sim + '/lib'},
    }}}}}}
    with open(os.path.join(work, 'inventory.yml'), 'w', encoding='utf-8') as handle:
        yaml.safe_dump(inventory, handle)
    # The client stand-in runs as the job's user, nobody included: a copy where every user can read it, wherever the
    # checkout is (under a 0700 home directory the checkout's own copy cannot be opened by another user).
    client = os.path.join(work, 'mps_client.py')
    shutil.copyfile(CLIENT, client)
    os.chmod(client, 0o644)
    with open(info['job'], 'w', encoding='utf-8') as handle:
        handle.write(JOB_SH % (PYTHON, client))
    os.chmod(info['job'], 0o755)
    left = ''
    try:
        # The role writes the TaskProlog and gres.conf itself (mps_slurm_hook), for the main cluster's device directory.
        hook = {'mps_resources': [{'name': 'gpu%d' % n, 'devices': [n]} for n in range(GPUS)], 'mps_slurm_hook': True,
                'mps_slurm_task_prolog': info['prolog'], 'mps_slurm_gres_conf': info['gres_conf'],
                'mps_slurm_device_dir': device_dir(os.path.join(work, 'slurm'))}
        role(info, 'provision.yml', hook)
        assert role(info, 'provision.yml', hook)[1] == 0, 'a second run of the role changes nothing'
        resources = resources_from_facts(info)
        assert [item['name'] for item in resources] == ['gpu%d' % n for n in range(GPUS)]
        info['resources'] = json.dumps(resources)
        # What the role wrote is what the renderers give for the facts a later play reads: one source, two readers.
        from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.slurm import (  # pylint: disable=import-outside-toplevel
            render_gres_conf, render_task_prolog)
        with open(info['prolog'], encoding='utf-8') as handle:
            assert handle.read() == render_task_prolog(info['root'], resources)
        assert os.stat(info['prolog']).st_mode & 0o777 == 0o755
        with open(info['gres_conf'], encoding='utf-8') as handle:
            assert handle.read() == render_gres_conf(resources, device_dir=device_dir(os.path.join(work, 'slurm')))
        info['provisioned_s'] = '%.1f' % (time.monotonic() - began)
        yield info
    finally:
        try:
            role(info, 'teardown.yml', {'mps_state': 'absent', 'mps_busy': 'terminate', 'mps_remove_logs': True,
                                        'mps_slurm_task_prolog': info['prolog'], 'mps_slurm_gres_conf': info['gres_conf']})
            gone = [path for path in (info['prolog'], info['gres_conf']) if os.path.exists(path)]
            assert gone == [], 'the teardown left the Slurm files it wrote: %s' % gone
        finally:
            leftovers = [PYTHON, os.path.join(REPO, 'hacking', 'leftovers.py')]
            left = subprocess.run(leftovers + [work], check=False, capture_output=True, text=True).stdout
            subprocess.run(leftovers + ['--kill', work], check=False, capture_output=True)
    assert left == '', 'the teardown left processes of the simulated host running:\n' + left


@pytest.fixture(scope='module')
def cluster(host: Dict[str, str]) -> Iterator[SlurmCluster]:
    slurm = slurm_cluster(host, 'slurm', host['prolog'])
    with slurm:
        yield slurm
    assert slurm.strays() == [], 'Slurm processes of this test still run after stop()'


def srun(cluster: SlurmCluster, *args: str, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """srun in the cluster, recorded for the transcript."""
    proc = cluster.run(['srun'] + list(args), env=dict(cluster.env, **(env or {})))
    TRANSCRIPT.append('$ srun %s\n%s%s(exit %d)' % (shlex.join(args), proc.stdout, proc.stderr, proc.returncode))
    return proc


def client_reply(text: str) -> dict:
    """The client's JSON line."""
    lines = [line for line in text.splitlines() if line.startswith('{')]
    assert len(lines) == 1, text
    return json.loads(lines[0])


def saw(text: str) -> Dict[str, str]:
    """job.sh's first line as a mapping."""
    found = SAW.search(text)
    assert found, text
    return dict(word.split('=', 1) for word in found.group(1).split())


def uuid_of(host: Dict[str, str], gpu: int) -> str:
    return [item for item in json.loads(host['resources']) if item['name'] == 'gpu%d' % gpu][0]['devices'][0]['uuid']


def pipe_of(host: Dict[str, str], gpu: int) -> str:
    return os.path.join(host['root'], 'gpu%d' % gpu, 'pipe')


def control(host: Dict[str, str], gpu: int, command: str) -> str:
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=pipe_of(host, gpu))
    proc = subprocess.run([host['sim'] + '/bin/nvidia-cuda-mps-control'], input=command + '\n', capture_output=True, text=True,
                          env=env, timeout=60, check=False)
    return proc.stdout.strip()


@contextlib.contextmanager
def whole_gpu_job(cluster: SlurmCluster) -> Iterator[None]:
    """A --gres=gpu:1 job holding GPU 0 (the first free GPU) while the block runs."""
    name = 'whole-gpu'
    argv = ['srun', '--job-name=%s' % name, '--gres=gpu:1', 'sleep', '120']
    proc = subprocess.Popen(argv, env=cluster.env, cwd=cluster.work,  # pylint: disable=consider-using-with
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        cluster.wait_for('the whole-GPU job running', lambda: cluster.run(
            ['squeue', '--noheader', '--states=RUNNING', '--name=%s' % name, '--format=%b']).stdout.split() == ['gres:gpu:1'])
        yield
    finally:
        cluster.run(['scancel', '--name=%s' % name])
        proc.wait(timeout=30)


class HeldJob:
    """``srun ... job.sh`` kept running (its client holds the connection until stdin closes), its lines read as they come."""

    def __init__(self, cluster: SlurmCluster, *args: str) -> None:
        self.args = args
        self.proc = subprocess.Popen(['srun'] + list(args), env=cluster.env, cwd=cluster.work, text=True,  # pylint: disable=consider-using-with
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.lines: 'queue.Queue[Optional[str]]' = queue.Queue()
        self.seen: List[str] = []
        self.status: Optional[int] = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def until_reply(self, timeout: float = 30) -> Tuple[Dict[str, str], dict]:
        """What the job saw and its client's reply, once the client is attached."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            self.seen.append(line)
            if line.startswith('{'):
                text = ''.join(self.seen)
                return saw(text), client_reply(text)
        raise AssertionError('srun %s: no client reply within %s s: %s' % (shlex.join(self.args), timeout, ''.join(self.seen)))

    def end(self) -> int:
        """Close the client's stdin (it disconnects and exits 0); srun's exit status."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.status = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        return self.status

    def transcript(self) -> str:
        return '$ srun %s &\n%s(exit %s)' % (shlex.join(self.args), ''.join(self.seen), self.status)


def test_an_mps_job_reaches_the_daemon_of_its_gpu_with_slurms_percentage(host: Dict[str, str], cluster: SlurmCluster) -> None:
    proc = srun(cluster, '--gres=mps:25', host['job'], '--once')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    env, reply = saw(proc.stdout), client_reply(proc.stdout)
    assert env['SLURM_STEP_GPUS'] == '0' and env['CUDA_MPS_PIPE_DIRECTORY'] == pipe_of(host, 0), env
    assert env['CUDA_VISIBLE_DEVICES'] == '0' and env['CUDA_MPS_ACTIVE_THREAD_PERCENTAGE'] == '25', env
    assert [device['uuid'] for device in reply['devices']] == [uuid_of(host, 0)], reply
    assert reply['active_thread_percentage'] == 25.0, reply


def test_a_batch_script_finds_its_gpu_in_slurm_job_gpus(host: Dict[str, str], cluster: SlurmCluster) -> None:
    out = os.path.join(cluster.work, 'batch-mps50.out')
    submitted = cluster.run(['sbatch', '--parsable', '--gres=mps:50', '--output', out, host['job'], '--once'])
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip()
    cluster.wait_for('batch job %s finished' % job, lambda: job not in cluster.jobs())
    with open(out, encoding='utf-8') as handle:
        text = handle.read()
    env, reply = saw(text), client_reply(text)
    # a batch script has its GPU in SLURM_JOB_GPUS only
    assert env['SLURM_STEP_GPUS'] == '' and env['SLURM_JOB_GPUS'] == '0' and env['CUDA_MPS_PIPE_DIRECTORY'] == pipe_of(host, 0), env
    assert [device['uuid'] for device in reply['devices']] == [uuid_of(host, 0)] and reply['active_thread_percentage'] == 50.0, reply


def test_a_job_on_gpu_1_reaches_gpu1s_daemon_as_its_ordinal_0(host: Dict[str, str], cluster: SlurmCluster) -> None:
    # a whole-GPU job takes GPU 0: Slurm gives the MPS job GPU 1 with CUDA_VISIBLE_DEVICES=1, the GPU's NVML index
    with whole_gpu_job(cluster):
        proc = srun(cluster, '--gres=mps:25', host['job'], '--once')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    env, reply = saw(proc.stdout), client_reply(proc.stdout)
    assert env['SLURM_STEP_GPUS'] == '1' and env['CUDA_MPS_PIPE_DIRECTORY'] == pipe_of(host, 1), env
    # gpu1's daemon sees one GPU, ordinal 0: Slurm's 1 would be an invalid device ordinal to it
    assert env['CUDA_VISIBLE_DEVICES'] == '0', env
    assert [device['uuid'] for device in reply['devices']] == [uuid_of(host, 1)] and reply['active_thread_percentage'] == 25.0, reply


@pytest.mark.skipif(not cgroup_v1_devices(), reason='ConstrainDevices=yes needs the cgroup v1 devices controller here')
def test_under_constrain_devices_the_job_still_reaches_its_gpus_daemon(host: Dict[str, str]) -> None:
    # With ConstrainDevices=yes Slurm sets CUDA_VISIBLE_DEVICES=0 on GPU 1 too (relative to the job's devices): a
    # prolog that went by it would send this job to gpu0's daemon. SLURM_STEP_GPUS is 1 either way.
    with slurm_cluster(host, 'slurm-cgroup', host['prolog'], cgroup=True) as constrained:
        with whole_gpu_job(constrained):
            proc = srun(constrained, '--gres=mps:25', host['job'], '--once')
        assert proc.returncode == 0, proc.stdout + proc.stderr
        env, reply = saw(proc.stdout), client_reply(proc.stdout)
        assert env['SLURM_STEP_GPUS'] == '1' and env['CUDA_MPS_PIPE_DIRECTORY'] == pipe_of(host, 1), env
        assert [device['uuid'] for device in reply['devices']] == [uuid_of(host, 1)], reply
    assert constrained.strays() == []


def test_an_unprivileged_users_job_gets_a_server_of_its_own(host: Dict[str, str], cluster: SlurmCluster) -> None:
    # The TaskProlog runs as the job's user: its checks (the lock in /proc/locks, the pid file) need no privilege.
    system_python = shutil.which('python3', path='/usr/bin:/bin')
    if not system_python:
        pytest.skip('no /usr/bin/python3 that an unprivileged user may run for the client')
    proc = srun(cluster, '--uid=%d' % NOBODY, '--chdir=/', '--gres=mps:25', host['job'], '--once', env={'JOB_PYTHON': system_python})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    env, reply = saw(proc.stdout), client_reply(proc.stdout)
    assert env['CUDA_MPS_PIPE_DIRECTORY'] == pipe_of(host, 0), env
    assert (reply['client_uid'], reply['uid'], reply['active_thread_percentage']) == (NOBODY, NOBODY, 25.0), reply


def test_two_mps_jobs_share_one_gpu_at_once_each_with_its_own_percentage(host: Dict[str, str], cluster: SlurmCluster) -> None:
    first = HeldJob(cluster, '--gres=mps:25', host['job'])
    second: Optional[HeldJob] = None
    try:
        env1, reply1 = first.until_reply()
        second = HeldJob(cluster, '--gres=mps:50', host['job'])
        env2, reply2 = second.until_reply()
        running = cluster.run(['squeue', '--noheader', '--states=RUNNING', '--format=%b']).stdout.split()
        clients = control(host, 0, 'get_client_list %d' % reply1['server_pid']).split()
    finally:
        codes = [job.end() for job in (first, second) if job is not None]
        TRANSCRIPT.extend(job.transcript() for job in (first, second) if job is not None)
    assert env1['SLURM_STEP_GPUS'] == env2['SLURM_STEP_GPUS'] == '0', (env1, env2)
    assert [device['uuid'] for device in reply1['devices'] + reply2['devices']] == [uuid_of(host, 0)] * 2, (reply1, reply2)
    # one server (one user), both clients attached to it at the same time, each with its job's share
    assert reply1['server_pid'] == reply2['server_pid'], (reply1, reply2)
    assert (reply1['active_thread_percentage'], reply2['active_thread_percentage']) == (25.0, 50.0)
    assert sorted(clients) == sorted([str(reply1['client_pid']), str(reply2['client_pid'])]), clients
    assert sorted(running) == ['gres:mps:25', 'gres:mps:50'], running
    assert codes == [0, 0]


def test_jobs_without_mps_are_left_alone(cluster: SlurmCluster) -> None:
    for args in (['--gres=gpu:1'], []):
        proc = srun(cluster, *(args + ['sh', '-c', 'echo "pipe=${CUDA_MPS_PIPE_DIRECTORY-unset} devices=${CUDA_VISIBLE_DEVICES-unset}"']))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout == 'pipe=unset devices=%s\n' % ('0' if args else 'unset'), proc.stdout


def test_a_job_whose_daemon_is_gone_or_missing_fails_with_the_prologs_line(host: Dict[str, str], cluster: SlurmCluster) -> None:
    # gpu0's daemon dies as in a crash: its sockets, lock file and pid file stay behind
    with open(os.path.join(pipe_of(host, 0), 'nvidia-cuda-mps-control.pid'), encoding='ascii') as handle:
        pid = int(handle.read().strip())
    os.kill(pid, signal.SIGKILL)
    cluster.wait_for('the daemon of gpu0 gone', lambda: not pid_alive(pid))
    assert os.path.exists(os.path.join(pipe_of(host, 0), 'control'))
    proc = srun(cluster, '--gres=mps:25', host['job'], '--once')
    assert proc.returncode == 1 and 'TaskProlog failed status=1' in proc.stderr, proc.stdout + proc.stderr
    # the task never started (no line of job.sh): the prolog's line is the job's whole output
    assert proc.stdout == NOT_RUNNING.format(gpu=0, pipe=pipe_of(host, 0), root=host['root']) + '\n', proc.stdout
    # a prolog rendered without gpu0 (as after its resource was pruned): no daemon serves GPU 0
    write_prolog(host['prolog'], host['root'], [item for item in json.loads(host['resources']) if item['name'] != 'gpu0'])
    proc = srun(cluster, '--gres=mps:25', host['job'], '--once')
    assert proc.returncode == 1 and proc.stdout == NOT_SERVED.format(gpu=0, root=host['root']) + '\n', proc.stdout + proc.stderr


def test_the_transcript_for_the_docs(host: Dict[str, str], cluster: SlurmCluster, capsys: pytest.CaptureFixture) -> None:
    """Prints what the docs quote, and keeps it in <work>/transcript.txt (last: pytest keeps the file's order)."""
    assert len(TRANSCRIPT) >= 8, TRANSCRIPT
    text = '\n\n'.join(TRANSCRIPT) + '\n'
    with open(os.path.join(host['work'], 'transcript.txt'), 'w', encoding='utf-8') as handle:
        handle.write(text)
    # the schedulers guide quotes it
    check_quoted('docs/docsite/rst/guide_schedulers.rst', 'slurm', text, [os.path.join(host['work'], 'host'), host['work'] + '/'])
    with capsys.disabled():
        print('\n--- %s, one node, up in %.2f s; the role provisioned 4 daemons in %s s\n%s' % (
            cluster.run(['sinfo', '--version']).stdout.strip(), cluster.startup_s or 0, host['provisioned_s'], text))
