# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""SELinux labels of the pipe directory, with ansible-core's libselinux binding replaced by a fake.

No host here runs SELinux: these tests stand in for it. What they cannot show - that an enforcing policy
then lets a container's client connect - is left to a host with SELinux.
"""
from __future__ import annotations

import os
import types

import pytest

from ansible_collections.gpufleet.mps.plugins.module_utils._execute import execute
from ansible_collections.gpufleet.mps.plugins.module_utils._observe.reader import read_labels
from ansible_collections.gpufleet.mps.plugins.module_utils._observe.view import HostView
from ansible_collections.gpufleet.mps.plugins.module_utils import _selinux
from ansible_collections.gpufleet.mps.plugins.module_utils._daemon.manager import DaemonOutcome, DaemonSetup, DaemonManager
from ansible_collections.gpufleet.mps.plugins.module_utils._errors import InvalidParameterError
from ansible_collections.gpufleet.mps.plugins.module_utils._outcome import Outcome
from ansible_collections.gpufleet.mps.plugins.module_utils._resource.layout import config_paths, resource_paths
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.unit import render_unit


class FakeSelinux:
    """libselinux as ansible.module_utils.compat.selinux exposes it: contexts kept per path."""

    def __init__(self, enabled=True):
        self.enabled = enabled
        self.contexts = {}
        self.set_calls = []

    def is_selinux_enabled(self):
        return 1 if self.enabled else 0

    def lgetfilecon_raw(self, path):
        if not os.path.lexists(path):
            raise OSError(2, 'No such file or directory')
        return [0, self.contexts.get(path, 'system_u:object_r:var_run_t:s0')]

    def lsetfilecon(self, path, context):
        self.set_calls.append((path, context))
        self.contexts[path] = context
        return 0


@pytest.fixture
def fake(monkeypatch):
    sel = FakeSelinux()
    monkeypatch.setattr(_selinux, '_sel', sel)
    return sel


@pytest.mark.parametrize('context, wanted', [
    ('system_u:object_r:var_run_t:s0', 'system_u:object_r:container_file_t:s0'),
    ('system_u:object_r:tmp_t:s0-s0:c0.c1023', 'system_u:object_r:container_file_t:s0-s0:c0.c1023'),  # MLS level kept
    ('unconfined_u:object_r:user_tmp_t', 'unconfined_u:object_r:container_file_t'),
])
def test_only_the_type_of_a_context_changes(context, wanted):
    assert _selinux.with_type(context, 'container_file_t') == wanted


def test_a_host_without_selinux_is_never_touched(monkeypatch, tmp_path):
    sel = FakeSelinux(enabled=False)
    monkeypatch.setattr(_selinux, '_sel', sel)
    out = Outcome()
    assert _selinux.plan_type(str(tmp_path), 'container_file_t', out, _labels(str(tmp_path))) is None
    monkeypatch.setattr(_selinux, '_sel', None)  # no libselinux at all
    assert _selinux.plan_type(str(tmp_path), 'container_file_t', out, _labels(str(tmp_path))) is None
    assert out.actions == [] and sel.set_calls == []


def test_a_wrong_type_is_planned_applied_and_then_left_alone(fake, tmp_path):
    path = str(tmp_path)
    out = Outcome()
    assert _selinux.plan_type(path, 'container_file_t', out, _labels(path)) == 'var_run_t'
    assert out.actions == ['set SELinux type container_file_t on %s (was var_run_t)' % path] and fake.set_calls == []
    execute(out)
    assert fake.contexts[path] == 'system_u:object_r:container_file_t:s0'
    again = Outcome()
    assert _selinux.plan_type(path, 'container_file_t', again, _labels(path)) == 'container_file_t' and again.actions == []


def test_an_empty_type_leaves_labels_alone(fake, tmp_path):
    out = Outcome()
    assert _selinux.plan_type(str(tmp_path), '', out, _labels(str(tmp_path))) is None and out.actions == []


def _labels(*paths):
    """A view that read SELinux's state and the labels of ``paths``."""
    view = HostView()
    read_labels(view, paths)
    return view.seal()


def _manager(tmp_path, check_mode):
    paths = resource_paths(str(tmp_path / 'root'), 'train')
    config = config_paths(str(tmp_path / 'etc'), 'train')
    daemon = types.SimpleNamespace(binary='/usr/bin/nvidia-cuda-mps-control', log_mode=0o700, start_timeout=30, stop_timeout=30)
    return DaemonManager(paths, config, daemon, nvml=None, supervisor='none', check_mode=check_mode, selinux_type='container_file_t')


def test_a_pipe_directory_created_by_the_start_is_labelled_after_it_exists(fake, tmp_path, see):
    manager = _manager(tmp_path, check_mode=False)
    see(manager)
    out = DaemonOutcome()
    manager.actions.prepare_dirs(out)
    assert out.actions == ['set SELinux type container_file_t on %s' % manager.paths.pipe_dir]
    assert out.selinux == {'before': None, 'after': 'container_file_t'}
    execute(out)
    assert fake.set_calls == [(manager.paths.pipe_dir, 'system_u:object_r:container_file_t:s0')]


def test_a_drifted_label_is_repaired_once_and_check_mode_only_says_so(fake, tmp_path, see):
    manager = _manager(tmp_path, check_mode=True)
    os.makedirs(manager.paths.pipe_dir)
    see(manager)
    out = DaemonOutcome()
    manager.actions.label(out)
    manager.actions.prepare_dirs(out)  # planned once, not twice
    assert out.actions == ['set SELinux type container_file_t on %s (was var_run_t)' % manager.paths.pipe_dir]
    assert out.selinux == {'before': 'var_run_t', 'after': 'container_file_t'} and fake.set_calls == []


def test_the_option_is_checked_before_anything_happens(tmp_path):
    params = dict(start_timeout=30, stop_timeout=30, busy_timeout=600, busy='refuse', devices='all', log_mode='0700',
                  state='started', root=str(tmp_path / 'root'), name='train', container_root='/mps', shm=False,
                  config_dir=str(tmp_path / 'etc'), control_binary=None, supervisor='none', selinux_type='bad type; rm')
    with pytest.raises(InvalidParameterError, match='selinux_type'):
        DaemonSetup.from_params(params, lambda path: '/bin/true')
    assert not os.path.exists(str(tmp_path / 'root'))


def test_the_unit_labels_the_directory_it_creates_where_selinux_is_enabled():
    unit = render_unit('/etc/gpufleet-mps', 30, 30)
    pre = [line for line in unit.splitlines() if line.startswith('ExecStartPre=')]
    assert pre[0].startswith('ExecStartPre=/bin/mkdir')
    assert 'selinuxenabled; then exec chcon -t "$$MPS_SELINUX_TYPE" "$$CUDA_MPS_PIPE_DIRECTORY"' in pre[1]


class _Mounter:
    def __init__(self):
        self.calls = []

    def mount(self, path, kib):
        self.calls.append(('mount', path))
        os.makedirs(path, exist_ok=True)

    def remount(self, path, kib):
        self.calls.append(('remount', path))

    def umount(self, path):
        self.calls.append(('umount', path))


def _shm_manager(tmp_path, check_mode=False, selinux_type='container_file_t'):
    from ansible_collections.gpufleet.mps.plugins.module_utils import _shm
    return _shm.ShmManager(str(tmp_path / 'root'), 'none', str(tmp_path / 'fstab'), str(tmp_path), check_mode=check_mode, mounter=_Mounter(),
                           pages=(4096, 1024 * 1024), selinux_type=selinux_type)


def test_the_shared_tmpfs_is_labelled_after_its_mount_then_left_alone(fake, tmp_path, monkeypatch):
    from ansible_collections.gpufleet.mps.plugins.module_utils import _shm
    mounted = []
    monkeypatch.setattr(_shm, 'current_state', lambda path, pages=None, **kwargs: _shm.ShmState(True, 65536, list(_shm.FLAGS), '1777')
                        if mounted else _shm.ShmState(False))
    shm = str(tmp_path / 'root' / 'shm')
    os.makedirs(shm)
    fake.contexts[shm] = 'system_u:object_r:container_file_t:s0'  # the mount point's own label says nothing of the tmpfs
    checked = _shm_manager(tmp_path, check_mode=True).ensure('mounted', '64m')
    assert 'set SELinux type container_file_t on %s' % shm in checked.actions and fake.set_calls == []
    manager = _shm_manager(tmp_path)
    manager.mounter.mount = lambda path, kib: (mounted.append(path), fake.contexts.update({path: 'system_u:object_r:tmpfs_t:s0'}))
    out = manager.ensure('mounted', '64m')
    assert out.actions.index('set SELinux type container_file_t on %s' % shm) > 0  # after the mount
    assert fake.set_calls == [(shm, 'system_u:object_r:container_file_t:s0')]
    assert not _shm_manager(tmp_path).ensure('mounted', '64m').changed
    fake.contexts[shm] = 'system_u:object_r:tmpfs_t:s0'  # remounted unlabelled (a reboot)
    relabelled = _shm_manager(tmp_path).ensure('mounted', '64m')
    assert relabelled.actions == ['set SELinux type container_file_t on %s (was tmpfs_t)' % shm]


def test_the_shared_tmpfs_is_never_labelled_without_selinux_or_without_a_type(fake, tmp_path, monkeypatch):
    from ansible_collections.gpufleet.mps.plugins.module_utils import _shm
    monkeypatch.setattr(_shm, 'current_state', lambda path, pages=None, **kwargs: _shm.ShmState(True, 65536, list(_shm.FLAGS), '1777'))
    os.makedirs(str(tmp_path / 'root' / 'shm'))
    assert not _shm_manager(tmp_path, selinux_type='').ensure('mounted', '64m').changed
    fake.enabled = False
    assert not _shm_manager(tmp_path).ensure('mounted', '64m').changed
    assert fake.set_calls == []


def test_the_daemons_shm_dropin_labels_the_tmpfs_at_every_start():
    from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.unit import render_shm_dropin
    text = render_shm_dropin('/run/nvidia/mps/shm')
    assert ('ExecStartPre=/bin/sh -c \'if [ -n "$$MPS_SELINUX_TYPE" ] && command -v selinuxenabled > /dev/null && selinuxenabled; '
            'then exec chcon -t "$$MPS_SELINUX_TYPE" /run/nvidia/mps/shm; fi\'') in text
