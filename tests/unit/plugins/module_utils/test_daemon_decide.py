# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The daemon's restart decision as tables: (wanted, observed) -> reasons -> keep, restart, recover or start. No
process, no file."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.mps.plugins.module_utils._daemon.decide import (
    DaemonSeen,
    WantedDaemon,
    compute_mode_changes,
    daemon_differences,
    decide_run,
    releasable,
)
from ansible_collections.gpufleet.mps.plugins.module_utils._gpus import Gpu, MigDevice
from ansible_collections.gpufleet.mps.plugins.module_utils._resource.record import StartRecord
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.liveness import Liveness

U0, U1 = 'GPU-0', 'GPU-1'
SHM = '/run/mps/shm'
RUNNING = Liveness(True, 41, 41)
STOPPED = Liveness(False, None, None)
STALE = Liveness(False, None, 41, leftovers=['nvidia-cuda-mps-control.pid', 'control'])
ENV = {'CUDA_VISIBLE_DEVICES': U0, 'CUDA_MPS_PIPE_DIRECTORY': '/run/mps/train/pipe'}


def _wanted(devices=(U0,), multiuser=False, supervisor='none', shm=False, env=None):
    record = {'devices': list(devices), 'multiuser': multiuser, 'supervisor': supervisor, 'shm': shm}
    return WantedDaemon(record, dict(env if env is not None else (ENV if supervisor == 'systemd' else {})), SHM)


def _record(devices=(U0,), multiuser=False, supervisor='none', shm=False, pid=41):
    return StartRecord(devices=list(devices), multiuser=multiuser, supervisor=supervisor, shm=shm, pid=pid)


TABLE = [
    ('stopped: nothing differs, it starts', _wanted(), DaemonSeen(STOPPED), [], 'start'),
    ('a dead daemon with leftovers is recovered', _wanted(), DaemonSeen(STALE), [], 'recover'),
    ('as recorded: kept', _wanted(), DaemonSeen(RUNNING, _record(), dev_shm='/dev/shm'), [], 'keep'),
    ('another GPU list (order counts: the ordinals change)', _wanted((U1, U0)), DaemonSeen(RUNNING, _record((U0, U1))),
     ['devices: '], 'restart'),
    ('multiuser changed', _wanted(multiuser=True), DaemonSeen(RUNNING, _record()), ['multiuser: False -> True'], 'restart'),
    ('handed to systemd', _wanted(supervisor='systemd'), DaemonSeen(RUNNING, _record(), ENV), ['supervisor: none -> systemd'],
     'restart'),
    ('shm wanted now', _wanted(shm=True), DaemonSeen(RUNNING, _record(), dev_shm='/dev/shm'), ['shm: False -> True'], 'restart'),
    ('shm as recorded but mounted anew since the start', _wanted(shm=True), DaemonSeen(RUNNING, _record(shm=True), dev_shm=None),
     ['does not see the current'], 'restart'),
    ('shm as recorded and seen', _wanted(shm=True), DaemonSeen(RUNNING, _record(shm=True), dev_shm=SHM), [], 'keep'),
    ('another process than recorded runs', _wanted(), DaemonSeen(RUNNING, _record(pid=40)),
     ['pid: the record names pid 40 but pid 41 runs'], 'restart'),
    ('no record', _wanted(), DaemonSeen(RUNNING), ['no .started record'], 'restart'),
    ('no record under systemd, unit active with the wanted environment: kept (the record was in /run)',
     _wanted(supervisor='systemd'), DaemonSeen(RUNNING, None, ENV, unit_active=True), [], 'keep'),
    ('no record under systemd, environment file with other GPUs', _wanted(supervisor='systemd'),
     DaemonSeen(RUNNING, None, dict(ENV, CUDA_VISIBLE_DEVICES=U1), unit_active=True), ['no .started record'], 'restart'),
    ('systemd: an environment value that starts the daemon differs', _wanted(supervisor='systemd'),
     DaemonSeen(RUNNING, _record(supervisor='systemd'), dict(ENV, CUDA_VISIBLE_DEVICES=U1)),
     ['environment file env differs in CUDA_VISIBLE_DEVICES'], 'restart'),
    ('systemd: a value used only from the next start differs: kept', _wanted(supervisor='systemd', env=dict(ENV, MPS_COMPUTE_MODE='x')),
     DaemonSeen(RUNNING, _record(supervisor='systemd', pid=7), ENV), [], 'keep'),
]


@pytest.mark.parametrize('wanted, seen, reasons, action', [row[1:] for row in TABLE], ids=[row[0] for row in TABLE])
def test_daemon_decision_table(wanted, seen, reasons, action):
    found = daemon_differences(wanted, seen, '.started', 'env')
    assert len(found) == len(reasons) and all(text in item for text, item in zip(reasons, found)), found
    assert decide_run('started', seen.liveness, found)[0] == action


def test_state_restarted_restarts_an_unchanged_daemon_and_says_why():
    assert decide_run('restarted', RUNNING, []) == ('restart', 'state=restarted')
    assert decide_run('restarted', RUNNING, [], 'a pinned limit to drop') == ('restart', 'a pinned limit to drop')
    assert decide_run('restarted', STOPPED, []) == ('start', 'not running')


# --- compute modes, decided once per GPU -------------------------------------------------------------------------
def _gpu(index, mode='default', mig=False):
    return Gpu(index, 'GPU-%d' % index, 'NVIDIA H100', 81559, (9, 0), mode, mig, mig, True)


MIG = MigDevice(1, 'MIG-1', 'NVIDIA H100 MIG 1g.10gb', 9856, (9, 0), 'default', None, None, None, parent_uuid='GPU-1')


@pytest.mark.parametrize('devices, mode, changed', [
    ([_gpu(0), _gpu(1, 'exclusive_process')], 'exclusive_process', [0]),
    ([_gpu(0), _gpu(1)], 'unchanged', []),
    ([_gpu(0, 'exclusive_process')], 'default', [0]),
    ([_gpu(0, mig=True), MIG], 'exclusive_process', []),  # NVML has no compute mode for either
], ids=['only what differs', 'unchanged', 'back to default', 'MIG'])
def test_compute_mode_changes_table(devices, mode, changed):
    assert [gpu.index for gpu in compute_mode_changes(devices, mode)] == changed


class _Foreign:
    @staticmethod
    def describe():
        return 'pid 7 (pipe directory /tmp/nvidia-mps, uid 0)'


def test_releasable_gives_back_only_what_nobody_else_serves():
    gpus = [_gpu(0, 'exclusive_process'), _gpu(1, 'exclusive_process'), _gpu(2, 'exclusive_process'),
            _gpu(3, 'exclusive_process'), _gpu(4, 'exclusive_process')]
    dropped = {'GPU-0', 'GPU-1', 'GPU-2', 'GPU-3'}
    given, warnings = releasable(gpus, dropped, still_used={'GPU-1'}, keep={'GPU-2'}, claims={'GPU-3': _Foreign()})
    assert [gpu.index for gpu in given] == [0]  # 1: another resource, 2: moving in this plan, 3: a foreign daemon, 4: kept
    assert len(warnings) == 1 and 'GPU 3 (GPU-3) keeps compute mode EXCLUSIVE_PROCESS' in warnings[0] and 'pid 7' in warnings[0]


@pytest.mark.parametrize('recorded, now, restarts', [
    ('580.159.04', '590.44.01', True),
    ('580.159.04', '580.159.04', False),
    (None, '590.44.01', False),     # a record of an older version: unknown, no restart for it
    ('580.159.04', '', False),      # NVML's version unknown
])
def test_a_daemon_started_under_another_driver_restarts(recorded, now, restarts):
    wanted = WantedDaemon({'devices': ['GPU-a'], 'multiuser': False, 'supervisor': 'none', 'shm': False}, driver_version=now)
    record = StartRecord(devices=['GPU-a'], supervisor='none', pid=41, driver_version=recorded)
    found = daemon_differences(wanted, DaemonSeen(RUNNING, record))
    assert bool(found) == restarts, found
    if restarts:
        assert found == ["driver: the daemon was started under driver 580.159.04 and NVML now reports 590.44.01 (its servers "
                         "would run the old driver's user-space libraries against the new kernel module)"]
