# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The daemon's restart decision as tables: (wanted, observed) -> reasons -> keep, restart, recover or start. No
process, no file."""
from __future__ import annotations

import pytest

from ansible_collections.gpufleet.mps.plugins.module_utils._daemon.decide import (
    DaemonSeen,
    WantedDaemon,
    daemon_differences,
    decide_run,
)
from ansible_collections.gpufleet.mps.plugins.module_utils._resource.record import StartRecord
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.liveness import DaemonState

U0, U1 = 'GPU-0', 'GPU-1'
SHM = '/run/mps/shm'
RUNNING = DaemonState(True, 41, 41)
STOPPED = DaemonState(False, None, None)
STALE = DaemonState(False, None, 41, leftovers=['nvidia-cuda-mps-control.pid', 'control'])
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
    assert decide_run('started', seen.state, found)[0] == action


def test_state_restarted_restarts_an_unchanged_daemon_and_says_why():
    assert decide_run('restarted', RUNNING, []) == ('restart', 'state=restarted')
    assert decide_run('restarted', RUNNING, [], 'a pinned limit to drop') == ('restart', 'a pinned limit to drop')
    assert decide_run('restarted', STOPPED, []) == ('start', 'not running')
