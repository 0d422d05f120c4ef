# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""mps_info says whose each client is (issue 44), read from the client's real /proc: three clients of one daemon, one
moved into a cgroup laid out as docker's cgroupfs driver lays one out, one into a Slurm job's as slurmstepd's (v1), one
left where it is with SLURM_JOB_ID in its environment - a claim, not a job."""
from __future__ import annotations

import os
import subprocess

import pytest

PIDS = '/sys/fs/cgroup/pids'
CONTAINER = 'c0ffee' + '0' * 52 + 'facade'


def _cgroup_v1_pids():
    return os.geteuid() == 0 and os.path.isfile(os.path.join(PIDS, 'cgroup.procs')) and os.access(PIDS, os.W_OK)


@pytest.fixture
def cgroups():
    if not _cgroup_v1_pids():
        pytest.skip('needs root and a writable cgroup v1 pids hierarchy')
    top = os.path.join(PIDS, 'gpufleet-test-%d' % os.getpid())
    made = []

    def place(relative, pid):
        path = os.path.join(top, relative)
        os.makedirs(path, exist_ok=True)
        made.append(path)
        with open(os.path.join(path, 'cgroup.procs'), 'w', encoding='utf-8') as handle:
            handle.write(str(pid))
    yield place
    for path in sorted(made, key=len, reverse=True):  # each process back to the root, then the directories, deepest first
        try:
            with open(os.path.join(path, 'cgroup.procs'), encoding='utf-8') as handle:
                pids = handle.read().split()
        except OSError:
            pids = []
        for pid in pids:
            with open(os.path.join(PIDS, 'cgroup.procs'), 'w', encoding='utf-8') as back:
                back.write(pid)
    for path in sorted((root for root, _dirs, _files in os.walk(top)), key=len, reverse=True):
        os.rmdir(path)


def _client(host, **env):
    proc = subprocess.Popen([os.path.join(host.bin, 'mps-sim-client')],  # pylint: disable=consider-using-with
                            env=dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=host.pipe('train'), **env),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    host.clients.append(proc)
    assert '"ok": true' in proc.stdout.readline()
    return proc


def test_mps_info_attributes_each_client_to_its_container_or_job(host, cgroups):
    host.ok([{'name': 'train', 'devices': [0]}])
    boxed, job, claims = _client(host), _client(host, SLURM_JOB_ID='77'), _client(host, SLURM_JOB_ID='99')
    cgroups('docker/' + CONTAINER, boxed.pid)
    cgroups('slurm/uid_0/job_77/step_0/task_0', job.pid)
    info = host.module('mps_info', gather=['daemons', 'servers'])
    (daemon,) = info['daemons']
    owners = {owner['pid']: owner for server in daemon['servers'] for owner in server['client_owners']}
    assert set(owners) == {boxed.pid, job.pid, claims.pid}, daemon['servers']
    assert (owners[boxed.pid]['owner'], owners[boxed.pid]['engine'], owners[boxed.pid]['container']) == ('container', 'docker', CONTAINER)
    assert (owners[job.pid]['owner'], owners[job.pid]['job'], owners[job.pid]['claimed_job']) == ('slurm_job', '77', '77')
    # the third only says it belongs to job 99: reported as its claim, never as its job
    assert owners[claims.pid]['job'] is None and owners[claims.pid]['claimed_job'] == '99'
    assert owners[claims.pid]['owner'] in ('host', 'unknown')
    assert all(owner['uid'] == os.geteuid() for owner in owners.values())
    counts = daemon['clients_by_owner']
    assert counts['container'] == 1 and counts['slurm_job'] == 1 and sum(counts.values()) == 3
    without = host.module('mps_info', gather=['daemons'])
    assert 'clients_by_owner' not in without['daemons'][0]  # asked only with the servers
