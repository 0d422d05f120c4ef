# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""mps_daemon, mps_limits and mps_shm go through the same pipeline as mps_host: their view read under their lock, a
decision from that view alone (decide_guard makes open, stat, listdir, subprocess and socket raise while it runs), the
one executor. Under supervisor none and systemd (tests/fakes/systemctl.py runs the collection's units)."""
from __future__ import annotations

import os

import pytest

from ansible_collections.gpufleet.mps.plugins.module_utils._daemon.manager import DaemonSetup
from ansible_collections.gpufleet.mps.plugins.module_utils._gpus import Nvml
from ansible_collections.gpufleet.mps.plugins.module_utils._limits.manager import LimitsManager
from ansible_collections.gpufleet.mps.plugins.module_utils._module import control_binary
from ansible_collections.gpufleet.mps.plugins.module_utils._shm import Mounter, ShmManager
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.process import Daemon


def _setup(base, supervisor, state):
    params = dict(root=str(base / 'root'), config_dir=str(base / 'etc'), control_binary=str(base / 'host' / 'bin' / 'nvidia-cuda-mps-control'),
                  name='train', state=state, devices=[0, 1], multiuser=False, compute_mode='exclusive_process', supervisor=supervisor,
                  start_timeout=10, stop_timeout=5, busy='refuse', busy_timeout=5, log_mode='0700', shm=False,
                  container_root='/mps', selinux_type='')
    return DaemonSetup.from_params(params, control_binary, unit_dir=str(base / 'units'))


@pytest.mark.parametrize('supervisor', ['none', 'systemd'])
def test_the_per_resource_modules_decide_from_their_view_alone(simhost, decide_guard, supervisor, request):
    if supervisor == 'systemd':
        request.getfixturevalue('fake_systemd')
    os.chmod(simhost, 0o755)
    changed = []
    for state in ('started', 'started', 'restarted', 'stopped', 'started'):
        setup = _setup(simhost, supervisor, state)
        with Nvml() as nvml:
            for check in (True, False):
                out = setup.manager(nvml, check_mode=check).ensure(state, [0, 1], multiuser=False, compute_mode='exclusive_process', enabled=True)
            changed.append(out.changed)
        if state != 'stopped':
            paths = setup.paths
            daemon = Daemon(paths, control_binary(str(simhost / 'host' / 'bin' / 'nvidia-cuda-mps-control')), 10, 0)
            with Nvml() as nvml:
                for check in (True, False):
                    limits = LimitsManager(paths, setup.config, daemon, nvml.gpus(), check_mode=check)
                    result = limits.ensure(50 if state == 'started' else 25, '10G', None, 'ignore', persist_limits=True, create=True)
                assert not result.warnings or all('orphan' not in warning for warning in result.warnings)
    assert changed == [True, False, True, True, True]
    if os.geteuid() == 0:
        fstab = simhost / 'fstab'
        fstab.write_text('')
        for state in ('mounted', 'mounted', 'absent'):
            for check in (True, False):
                ShmManager(str(simhost / 'root'), 'fstab', str(fstab), str(simhost / 'units'), check_mode=check, mounter=Mounter()).ensure(state, '64m')
    setup = _setup(simhost, supervisor, 'absent')
    with Nvml() as nvml:
        for check in (True, False):
            out = setup.manager(nvml, check_mode=check).ensure('absent', 'all', multiuser=False, compute_mode='exclusive_process', enabled=False)
    assert out.changed and not os.path.exists(setup.paths.pipe_dir)
    assert decide_guard['decisions'] >= 26  # every ensure above decided (and raised on no I/O)
