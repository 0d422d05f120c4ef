# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Slurm's TaskProlog and gres.conf: the prolog run by sh with the environment Slurm 22.05 gives a task.

A daemon here is a stand-in process that does what the prolog looks at: a socket file ``<pipe>/control``, a POSIX
lock on ``<pipe>/control_lock`` (shown in /proc/locks), a pid file, and ``nvidia-cuda-mps`` as its comm. What Slurm
really sets (SLURM_STEP_GPUS in a step, SLURM_JOB_GPUS in a batch script, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for MPS
jobs only) was observed on a real Slurm: tests/engines/test_slurm.py.
"""
from __future__ import annotations

import os
import socket
import shutil
import signal
import subprocess
import sys
import time

import pytest

from ansible_collections.gpufleet.mps.plugins.module_utils._errors import MpsError
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.slurm import (
    NO_DAEMON_PIPE_DIR, render_gres_conf, render_task_prolog)

MIB = 81559
# A control daemon as the prolog sees one; argv: pipe dir, "lock" or "nolock", "pidfile" or "nopidfile".
STAND_IN = r'''
import fcntl, os, socket, sys, time
pipe, lock, pidfile = sys.argv[1:4]
with open('/proc/self/comm', 'w') as handle:
    handle.write('nvidia-cuda-mps-control')  # the kernel keeps 15 characters, as for the real daemon
sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
sock.bind(os.path.join(pipe, 'control'))
fd = os.open(os.path.join(pipe, 'control_lock'), os.O_RDWR | os.O_CREAT, 0o666)
if lock == 'lock':
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
if pidfile == 'pidfile':
    with open(os.path.join(pipe, 'nvidia-cuda-mps-control.pid'), 'w') as handle:
        handle.write(str(os.getpid()))
print('ready', flush=True)
time.sleep(600)
'''


class Host:
    """A root with resources ``train`` (GPU 0) and ``infer`` (GPUs 3 and 1, in that order), daemons started on demand."""

    def __init__(self, base):
        self.root = str(base / 'mps root')  # a space: every value must survive sh and Slurm's export line
        self.resources = [self.resource('train', [0]), self.resource('infer', [3, 1])]
        self.procs = []

    def resource(self, name, indices):
        for sub in ('pipe', 'log'):
            os.makedirs(os.path.join(self.root, name, sub))
        return {'name': name, 'pipe_dir': self.pipe(name), 'log_dir': os.path.join(self.root, name, 'log'),
                'devices': [{'index': index, 'uuid': 'GPU-%d' % index, 'memory_total_mib': MIB // (1 + index)} for index in indices]}

    def pipe(self, name):
        return os.path.join(self.root, name, 'pipe')

    def start(self, name, lock=True, pidfile=True):
        """A stand-in daemon on the resource's pipe directory; its process."""
        proc = subprocess.Popen([sys.executable, '-c', STAND_IN, self.pipe(name), 'lock' if lock else 'nolock',  # pylint: disable=consider-using-with
                                 'pidfile' if pidfile else 'nopidfile'], stdout=subprocess.PIPE, text=True)
        self.procs.append(proc)
        assert proc.stdout.readline() == 'ready\n'
        return proc

    def prolog(self, memory_share=False, resources=None):
        path = os.path.join(self.root, 'task_prolog.sh')
        with open(path, 'w', encoding='utf-8') as handle:
            handle.write(render_task_prolog(self.root, self.resources if resources is None else resources, memory_share=memory_share))
        return path

    def stop(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.fixture
def host(tmp_path):
    made = Host(tmp_path)
    try:
        yield made
    finally:
        made.stop()


def run(path, **env):
    """The prolog as slurmstepd runs it: sh, the task's environment; (exit status, stdout lines)."""
    base = {'PATH': os.environ.get('PATH', '/usr/bin:/bin'), 'HOME': '/nonexistent'}
    proc = subprocess.run(['sh', path], env=dict(base, **env), capture_output=True, text=True, timeout=30, check=False)
    return proc.returncode, proc.stdout.splitlines()


def exports(host, name, ordinals):
    return ['export CUDA_MPS_PIPE_DIRECTORY=%s' % host.pipe(name), 'export CUDA_MPS_LOG_DIRECTORY=%s' % os.path.join(host.root, name, 'log'),
            'export CUDA_VISIBLE_DEVICES=%s' % ordinals]


def refused(message):
    return [1, ['print gpufleet.mps: %s' % message, 'export CUDA_MPS_PIPE_DIRECTORY=%s' % NO_DAEMON_PIPE_DIR]]


def test_an_mps_step_on_each_gpu_is_pointed_at_its_daemon_with_the_gpus_ordinal_there(host):
    host.start('train')
    host.start('infer')
    path = host.prolog()
    # Slurm's own CUDA_VISIBLE_DEVICES (the NVML index, or 0 under ConstrainDevices) is replaced, its percentage kept
    assert run(path, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='25', SLURM_STEP_GPUS='0', CUDA_VISIBLE_DEVICES='0') == (0, exports(host, 'train', '0'))
    assert run(path, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='25', SLURM_STEP_GPUS='3', CUDA_VISIBLE_DEVICES='3') == (0, exports(host, 'infer', '0'))
    assert run(path, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='50', SLURM_STEP_GPUS='1', CUDA_VISIBLE_DEVICES='0') == (0, exports(host, 'infer', '1'))
    # one job on both GPUs of one daemon: their ordinals, in Slurm's order
    assert run(path, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='50', SLURM_STEP_GPUS='1,3') == (0, exports(host, 'infer', '1,0'))


def test_a_batch_script_finds_its_gpu_in_slurm_job_gpus_and_a_step_prefers_slurm_step_gpus(host):
    host.start('train')
    host.start('infer')
    path = host.prolog()
    assert run(path, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='25', SLURM_JOB_GPUS='3', CUDA_VISIBLE_DEVICES='3') == (0, exports(host, 'infer', '0'))
    assert run(path, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='25', SLURM_STEP_GPUS='0', SLURM_JOB_GPUS='3') == (0, exports(host, 'train', '0'))


def test_jobs_that_are_not_mps_jobs_are_left_alone(host):
    path = host.prolog()  # no daemon runs: a non-MPS job must not even look
    assert run(path, SLURM_STEP_GPUS='0', CUDA_VISIBLE_DEVICES='0') == (0, [])
    assert run(path) == (0, [])
    assert run(path, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='', SLURM_STEP_GPUS='0') == (0, [])
    # a percentage exported by the user into a job without GPUs: no GPU, nothing to point at
    assert run(path, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='25') == (0, [])


def test_a_gpu_that_no_daemon_serves_fails_the_job_naming_the_gpu_and_the_root(host):
    host.start('train')
    path = host.prolog()
    assert list(run(path, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='25', SLURM_STEP_GPUS='2')) == refused(
        'no MPS daemon under %s serves GPU 2, which Slurm gave this job' % host.root)
    # no resource at all: every MPS job fails the same way
    assert list(run(host.prolog(resources=[]), CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='25', SLURM_JOB_GPUS='0')) == refused(
        'no MPS daemon under %s serves GPU 0, which Slurm gave this job' % host.root)


def test_gpus_of_two_daemons_or_an_unreadable_gpu_list_fail_the_job(host):
    host.start('train')
    host.start('infer')
    path = host.prolog()
    assert list(run(path, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='25', SLURM_STEP_GPUS='0,1')) == refused(
        'GPUs 0,1 of this job are served by different MPS daemons under %s (train, infer): an MPS client reaches one' % host.root)
    for bad in ('0-1', 'x', '0,,1', '*'):
        assert list(run(path, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='25', SLURM_STEP_GPUS=bad)) == refused(
            "Slurm gave this job the GPUs '%s': not a list of GPU indices" % bad), bad


def test_a_daemon_that_is_not_running_fails_the_job_though_its_files_stay(host):
    path = host.prolog()
    not_running = 'the MPS daemon of GPU 0 (resource train, %s) under %s is not running' % (host.pipe('train'), host.root)
    # never started: no socket
    assert list(run(path, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='25', SLURM_STEP_GPUS='0')) == refused(not_running)
    # killed (and reaped): socket, lock file and pid file stay, the lock is gone
    daemon = host.start('train')
    assert run(path, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='25', SLURM_STEP_GPUS='0')[0] == 0
    daemon.kill()
    daemon.wait()
    assert os.path.exists(os.path.join(host.pipe('train'), 'control'))
    assert os.path.exists(os.path.join(host.pipe('train'), 'nvidia-cuda-mps-control.pid'))
    assert list(run(path, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='25', SLURM_STEP_GPUS='0')) == refused(not_running)


def test_a_killed_daemon_not_yet_reaped_is_not_running(host):
    # without a lock the pid file decides; a zombie keeps its /proc entry and comm until its parent reaps it
    daemon = host.start('train', lock=False)
    path = host.prolog()
    assert run(path, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='25', SLURM_STEP_GPUS='0')[0] == 0
    daemon.send_signal(signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open('/proc/%d/stat' % daemon.pid, encoding='ascii') as handle:
            if handle.read().rsplit(')', 1)[1].split()[0] == 'Z':
                break
        time.sleep(0.02)
    assert list(run(path, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='25', SLURM_STEP_GPUS='0')) == refused(
        'the MPS daemon of GPU 0 (resource train, %s) under %s is not running' % (host.pipe('train'), host.root))


def test_the_lock_alone_or_the_pid_file_alone_says_the_daemon_runs(host):
    path = host.prolog()
    # the lock without a pid file (what /proc/locks shows to any user)
    host.start('train', lock=True, pidfile=False)
    assert run(path, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='25', SLURM_STEP_GPUS='0') == (0, exports(host, 'train', '0'))
    # a pid file naming a live control daemon, its lock not shown (an OFD lock, a driver that hides it)
    host.start('infer', lock=False, pidfile=True)
    assert run(path, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='25', SLURM_STEP_GPUS='3') == (0, exports(host, 'infer', '0'))


def test_a_pid_file_naming_another_process_is_not_a_daemon(host):
    host.start('train', lock=False, pidfile=False)
    with open(os.path.join(host.pipe('train'), 'nvidia-cuda-mps-control.pid'), 'w', encoding='ascii') as handle:
        handle.write(str(os.getpid()))  # alive, but pytest is no control daemon
    assert list(run(host.prolog(), CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='25', SLURM_STEP_GPUS='0')) == refused(
        'the MPS daemon of GPU 0 (resource train, %s) under %s is not running' % (host.pipe('train'), host.root))


def test_memory_share_pins_the_jobs_percentage_of_each_gpus_memory(host):
    host.start('train')
    host.start('infer')
    path = host.prolog(memory_share=True)
    train = MIB  # GPU 0
    gpu3, gpu1 = MIB // 4, MIB // 2
    assert run(path, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='25', SLURM_STEP_GPUS='0') == (
        0, exports(host, 'train', '0') + ['export CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=%dM' % (train * 25 // 100)])
    assert run(path, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='50', SLURM_STEP_GPUS='1,3') == (
        0, exports(host, 'infer', '1,0') + ['export CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=1=%dM,0=%dM' % (gpu1 // 2, gpu3 // 2)])
    # a fraction is rounded down, more than 100 is the whole GPU
    assert run(path, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='12.5', SLURM_STEP_GPUS='0')[1][-1] == (
        'export CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=%dM' % (train * 12 // 100))
    assert run(path, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='150', SLURM_STEP_GPUS='0')[1][-1] == 'export CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=%dM' % train
    for bad in ('0', 'abc', '.5'):
        assert list(run(path, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=bad, SLURM_STEP_GPUS='0')) == refused(
            'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%s is not a percentage of at least 1: no GPU memory share to pin' % bad), bad
    # without memory_share the memory limit is left to the daemon
    assert all('PINNED' not in line for line in run(host.prolog(), CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='25', SLURM_STEP_GPUS='0')[1])


def test_the_prolog_is_posix_sh_and_says_who_manages_it(host):
    text = render_task_prolog(host.root, host.resources, memory_share=True)
    assert text.startswith('#!/bin/sh\n# Managed by the gpufleet.mps Ansible collection')
    path = host.prolog(memory_share=True)
    for shell in ('sh', 'dash', 'bash'):
        if shutil.which(shell):
            assert subprocess.run([shell, '-n', path], check=False).returncode == 0, shell
    if shutil.which('shellcheck'):
        proc = subprocess.run(['shellcheck', '--shell=sh', path], capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stdout


@pytest.mark.parametrize('root, resources, memory_share, message', [
    ('relative/root', [], False, "root 'relative/root' is not an absolute path"),
    ("/run/it's", [], False, "root \"/run/it's\" holds \"'\""),
    ('/run/a\nb', [], False, "holds '\\n'"),
    ('', [], False, 'root must be a non-empty string'),
    ('/run/mps', {'name': 'train'}, False, 'resources must be a list'),
    ('/run/mps', ['train'], False, 'resources[0] must be a mapping'),
    ('/run/mps', [{'name': 'a/b/c', 'pipe_dir': '/p', 'log_dir': '/l', 'devices': [{'index': 0, 'uuid': 'GPU-0'}]}], False, 'more than one "/"'),
    ('/run/mps', [{'name': 'train', 'log_dir': '/l', 'devices': [{'index': 0, 'uuid': 'GPU-0'}]}], False, 'resource train: pipe_dir must be'),
    ('/run/mps', [{'name': 'train', 'pipe_dir': 'pipe', 'log_dir': '/l', 'devices': [{'index': 0, 'uuid': 'GPU-0'}]}], False,
     "resource train: pipe_dir 'pipe' is not an absolute path"),
    ('/run/mps', [{'name': 'train', 'pipe_dir': '/p$(id)`x`', 'log_dir': '/l', 'devices': [{'index': 0, 'uuid': 'GPU-0'}]}], False, "holds '`'"),
    ('/run/mps', [{'name': 'train', 'pipe_dir': '/p', 'log_dir': '/l\\x', 'devices': [{'index': 0, 'uuid': 'GPU-0'}]}], False, "holds '\\\\'"),
    ('/run/mps', [{'name': 'train', 'pipe_dir': '/p', 'log_dir': '/l', 'devices': []}], False, 'resource train: devices must be a non-empty list'),
    ('/run/mps', [{'name': 'train', 'pipe_dir': '/p', 'log_dir': '/l', 'devices': [{'index': True, 'uuid': 'GPU-0'}]}], False,
     'resource train: devices[0].index must be a GPU index'),
    ('/run/mps', [{'name': 'train', 'pipe_dir': '/p', 'log_dir': '/l', 'devices': [{'index': -1, 'uuid': 'GPU-0'}]}], False, 'must be a GPU index'),
    ('/run/mps', [{'name': 'train', 'pipe_dir': '/p', 'log_dir': '/l', 'devices': [{'index': 0, 'uuid': "GPU-'"}]}], False, 'devices[0].uuid'),
    ('/run/mps', [{'name': 'train', 'pipe_dir': '/p', 'log_dir': '/l', 'devices': [{'index': 0, 'uuid': 'GPU-0'}]}], True,
     'resource train: devices[0].memory_total_mib must be a positive integer'),
    ('/run/mps', [{'name': 'train', 'pipe_dir': '/p', 'log_dir': '/l', 'devices': [{'index': 0, 'uuid': 'GPU-0', 'memory_total_mib': '80G'}]}],
     False, 'memory_total_mib must be a positive integer'),
    ('/run/mps', [{'name': 'a', 'pipe_dir': '/p', 'log_dir': '/l', 'devices': [{'index': 0, 'uuid': 'GPU-0'}]},
                  {'name': 'b', 'pipe_dir': '/q', 'log_dir': '/m', 'devices': [{'index': 0, 'uuid': 'GPU-0'}]}], False,
     'GPU 0 is served by resource a and by resource b: one MPS daemon per GPU'),
    ('/run/mps', [{'name': 'a', 'pipe_dir': '/p', 'log_dir': '/l', 'devices': [{'index': 0, 'uuid': 'GPU-0'}, {'index': 0, 'uuid': 'GPU-0'}]}],
     False, 'resource a lists GPU 0 twice'),
    ('/run/mps', [{'name': 'a', 'pipe_dir': '/p', 'log_dir': '/l', 'devices': [{'index': 1, 'uuid': 'MIG-x', 'mig': '1:0'}]}], False,
     'resource a: devices[0] is the MIG device 1:0: Slurm describes MIG devices itself'),
    ('/run/mps', [], 'yes', 'memory_share must be true or false'),
])
def test_bad_input_is_refused_naming_what_is_wrong(root, resources, memory_share, message):
    with pytest.raises(MpsError) as caught:
        render_task_prolog(root, resources, memory_share=memory_share)
    assert message in caught.value.msg


DOC_RESOURCES = [
    {'name': 'train', 'devices': [{'index': 0, 'uuid': 'GPU-0', 'memory_total_mib': MIB}]},
    {'name': 'example.com/infer', 'devices': [{'index': 3, 'uuid': 'GPU-3', 'memory_total_mib': MIB},
                                              {'index': 1, 'uuid': 'GPU-1', 'memory_total_mib': MIB}]},
]


def test_gres_conf_lists_every_served_gpu_by_index_with_its_mps_shares():
    assert render_gres_conf(DOC_RESOURCES) == '''\
# Managed by the gpufleet.mps Ansible collection (Slurm gres.conf). Local changes are overwritten.
# slurm.conf: GresTypes=gpu,mps, SelectType=select/cons_tres and for this node Gres=gpu:3,mps:300
# Each GPU below has 100 MPS shares: --gres=mps:S gets S * 100 / 100 % of one GPU's threads.
# example.com/infer: one MPS daemon for GPUs 3, 1; the TaskProlog sets a job's CUDA_VISIBLE_DEVICES to its GPU's ordinal in that daemon (3 -> 0, 1 -> 1).
AutoDetect=off
Name=gpu File=/dev/nvidia0
Name=mps Count=100 File=/dev/nvidia0
Name=gpu File=/dev/nvidia1
Name=mps Count=100 File=/dev/nvidia1
Name=gpu File=/dev/nvidia3
Name=mps Count=100 File=/dev/nvidia3
'''


def test_gres_conf_takes_a_device_directory_and_a_count():
    text = render_gres_conf(DOC_RESOURCES[:1], device_dir='/srv/slurm/dev/', count=200)
    assert 'Gres=gpu:1,mps:200\n' in text
    assert text.endswith('AutoDetect=off\nName=gpu File=/srv/slurm/dev/nvidia0\nName=mps Count=200 File=/srv/slurm/dev/nvidia0\n')
    assert render_gres_conf(DOC_RESOURCES[:1], device_dir='/').endswith('Name=mps Count=100 File=/nvidia0\n')
    # the directories of the TaskProlog do not matter here
    assert 'File=/dev/nvidia0' in render_gres_conf([dict(DOC_RESOURCES[0], pipe_dir='relative')])


def test_gres_conf_without_gpus_offers_nothing():
    assert render_gres_conf([]) == ('# Managed by the gpufleet.mps Ansible collection (Slurm gres.conf). Local changes are overwritten.\n'
                                    '# No GPU is served by an MPS daemon of this collection: this node offers no gpu or mps resource.\n'
                                    'AutoDetect=off\n')


@pytest.mark.parametrize('kwargs, message', [
    ({'device_dir': 'dev'}, "device_dir 'dev' is not an absolute path"),
    ({'device_dir': '/my dev'}, "device_dir '/my dev' holds ' '"),
    ({'device_dir': '/dev#1'}, "holds '#'"),
    ({'device_dir': '/dev\n'}, "holds '\\n'"),
    ({'count': 0}, 'count must be a positive integer'),
    ({'count': True}, 'count must be a positive integer'),
    ({'count': '100'}, 'count must be a positive integer'),
])
def test_gres_conf_refuses_what_slurm_would_misread(kwargs, message):
    with pytest.raises(MpsError) as caught:
        render_gres_conf(DOC_RESOURCES, **kwargs)
    assert message in caught.value.msg


def test_gres_conf_refuses_a_gpu_of_two_resources_and_mig_devices():
    with pytest.raises(MpsError, match='GPU 0 is served by resource train and by resource other'):
        render_gres_conf(DOC_RESOURCES + [{'name': 'other', 'devices': [{'index': 0, 'uuid': 'GPU-0'}]}])
    with pytest.raises(MpsError, match='MIG device'):
        render_gres_conf([{'name': 'mig', 'devices': [{'index': 1, 'uuid': 'MIG-1', 'mig': '1:0'}]}])


def test_an_mps_v3_resource_points_the_job_at_its_server_never_at_the_pipe_directory(host):
    """The v3 TaskProlog (issue 43): the job gets <pipe>/<server> - the pipe directory's main socket would route it to an
    automatic uid_<uid> server outside the resource's limits - and fails while the server's socket is missing."""
    server_dir = os.path.join(host.pipe('infer'), 'infer')
    resources = [host.resources[0], dict(host.resources[1], client_pipe_dir=server_dir)]
    host.start('train')
    host.start('infer')
    path = host.prolog(resources=resources)
    assert run(path, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='25', SLURM_STEP_GPUS='0') == (0, exports(host, 'train', '0'))
    assert list(run(path, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='25', SLURM_STEP_GPUS='1')) == refused(
        'the MPS v3 server of GPU 1 (resource infer, %s) under %s is not there' % (server_dir, host.root))
    os.makedirs(server_dir)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.bind(os.path.join(server_dir, 'control'))
        code, lines = run(path, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='25', SLURM_STEP_GPUS='1')
        assert code == 0 and lines[0] == 'export CUDA_MPS_PIPE_DIRECTORY=%s' % server_dir and lines[2:] == [
            'export CUDA_VISIBLE_DEVICES=1'], lines
    finally:
        sock.close()
    with open(path, encoding='utf-8') as handle:
        assert '#   infer: GPUs 3, 1 (%s)' % server_dir in handle.read()
