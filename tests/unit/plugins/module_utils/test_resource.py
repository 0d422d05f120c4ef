# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""DaemonManager's decisions that need no daemon: what forces a restart of a systemd-supervised one."""
from __future__ import annotations

import os
import types

import pytest

from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.liveness import Liveness
from ansible_collections.gpufleet.mps.plugins.module_utils._errors import InvalidParameterError
from ansible_collections.gpufleet.mps.plugins.module_utils._daemon import manager as _manager
from ansible_collections.gpufleet.mps.plugins.module_utils._daemon.differences import differences
from ansible_collections.gpufleet.mps.plugins.module_utils._daemon.manager import DaemonSetup, Outcome, DaemonManager, Wanted
from ansible_collections.gpufleet.mps.plugins.module_utils._resource.layout import config_paths, resource_paths
from ansible_collections.gpufleet.mps.plugins.module_utils._resource.record import StartRecord
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.unit import RESTART_ENV, parse_env, render_env
from ansible_collections.gpufleet.mps.plugins.module_utils._io import read_text, rmdir_if_empty
from ansible_collections.gpufleet.mps.plugins.module_utils._observe import paths as _paths


def _make(tmp_path, **options):
    paths = resource_paths(str(tmp_path / 'root'), 'train')
    config = config_paths(str(tmp_path / 'etc'), 'train')
    daemon = types.SimpleNamespace(binary='/usr/bin/nvidia-cuda-mps-control', log_mode=0o700, start_timeout=30, stop_timeout=30)
    return DaemonManager(paths, config, daemon, nvml=None, supervisor='systemd', check_mode=True,
                         unit_dir=str(tmp_path / 'units'), **options)


@pytest.fixture
def manager(tmp_path):
    (tmp_path / 'etc').mkdir()
    return _make(tmp_path)


def _differences(manager, wanted, current, record):
    return differences(manager.run, manager.unit_files, wanted, current, record)


def _gpu(uuid):
    return types.SimpleNamespace(uuid=uuid, summary=lambda: {'uuid': uuid})


def _wanted(**overrides):
    values = dict(devices=[_gpu('GPU-a'), _gpu('GPU-b')], multiuser=False,
                  supervisor='systemd', compute_mode='exclusive_process', enabled=True)
    values.update(overrides)
    return Wanted(**values)


# A pid that cannot exist (above any pid_max): its /proc/<pid>/root/dev/shm cannot be read.
RUNNING = Liveness(running=True, pid=99999999, pid_file_pid=99999999)


def _data(wanted):
    return dict(wanted.record(), pid=99999999)


def _record(wanted):
    return StartRecord.from_data(_data(wanted))


def _write_env(manager, wanted, **changes):
    values = manager.unit_files.env_values(wanted)
    values.update(changes)
    values = {key: value for key, value in values.items() if value is not None}
    with open(manager.run.config.env_file, 'w', encoding='utf-8') as handle:
        handle.write(render_env('train', values))


@pytest.mark.parametrize('changes', [
    {'MPS_LOG_MODE': None},            # an environment file written before log_mode existed
    {'MPS_LOG_MODE': '0755'},
    {'MPS_STOP_TIMEOUT': '5'},
    {'MPS_COMPUTE_MODE': 'DEFAULT'},
    {'MPS_NVIDIA_SMI': '/usr/local/bin/nvidia-smi'},
    {'MPS_LIMITS_FILE': '/elsewhere/train.limits'},
])
def test_values_the_running_daemon_does_not_use_are_rewritten_without_a_restart(manager, changes, see):
    wanted = _wanted()
    _write_env(manager, wanted, **changes)
    see(manager, RUNNING)
    assert _differences(manager, wanted, RUNNING, _record(wanted)) == []
    assert read_text(manager.run.config.env_file) != manager.unit_files.render(wanted)[manager.run.config.env_file]  # rewritten in place


@pytest.mark.parametrize('key', RESTART_ENV)
def test_values_the_daemon_was_started_with_force_a_restart(manager, key, see):
    wanted = _wanted()
    _write_env(manager, wanted, **{key: 'something-else'})
    see(manager, RUNNING)
    differences = _differences(manager, wanted, RUNNING, _record(wanted))
    assert differences == ['environment file %s differs in %s' % (manager.run.config.env_file, key)]


def test_the_restart_keys_are_exactly_what_the_unit_starts_the_daemon_with(manager):
    env = parse_env(render_env('train', manager.unit_files.env_values(_wanted(multiuser=True, foreground=True))))
    assert set(RESTART_ENV) <= set(env)
    assert env['MPS_DAEMON_ARGS'] == '-multiuser-server' and env['CUDA_VISIBLE_DEVICES'] == 'GPU-a,GPU-b'


def test_a_record_without_shm_means_shm_false_and_a_change_of_shm_restarts(manager, see):
    wanted = _wanted()
    _write_env(manager, wanted)
    old_record = StartRecord.from_data({key: value for key, value in _data(wanted).items() if key != 'shm'})
    see(manager, RUNNING)
    assert _differences(manager, wanted, RUNNING, old_record) == []
    see(manager, RUNNING)
    assert _differences(manager, _wanted(shm=True), RUNNING, old_record) == ['shm: False -> True']


def test_shm_adds_a_dropin_and_dropping_shm_removes_it(manager):
    files = manager.unit_files.render(_wanted(shm=True))
    assert 'BindPaths=%s/shm:/dev/shm' % manager.paths.root in files[manager.unit_files.dropin_path]
    assert manager.unit_files.render(_wanted())[manager.unit_files.dropin_path] is None
    assert manager.unit_files.dropin_path.endswith('gpufleet-mps@train.service.d/gpufleet-shm.conf')


class ActiveUnit:
    """systemctl for a unit that is active."""

    def is_active(self, unit):
        return True


@pytest.mark.parametrize('changes', [{'MPS_LOG_MODE': None}, {'MPS_STOP_TIMEOUT': '5'}, {'MPS_COMPUTE_MODE': 'DEFAULT'}])
def test_after_a_reboot_without_record_only_restart_values_count(manager, changes, see, tmp_path):
    # /run lost the .started record; systemd started the daemon from an environment file written by an
    # older version or with other timeouts: no restart, the files are rewritten in place.
    manager = _make(tmp_path, systemctl=ActiveUnit())
    wanted = _wanted()
    _write_env(manager, wanted, **changes)
    see(manager, RUNNING)
    assert _differences(manager, wanted, RUNNING, None) == []


def test_after_a_reboot_without_record_a_restart_value_still_restarts(manager, see, tmp_path):
    manager = _make(tmp_path, systemctl=ActiveUnit())
    wanted = _wanted()
    _write_env(manager, wanted, CUDA_VISIBLE_DEVICES='GPU-a')
    see(manager, RUNNING)
    assert _differences(manager, wanted, RUNNING, None) == ['no .started record for the running daemon']


def test_a_daemon_whose_dev_shm_cannot_be_seen_is_restarted_only_when_shm_is_wanted(manager, see):
    wanted = _wanted(shm=True)
    _write_env(manager, wanted)
    see(manager, RUNNING)
    assert _differences(manager, wanted, RUNNING, _record(wanted)) == [
        'the daemon does not see the current %s/shm as its /dev/shm (mounted anew since it started?)' % manager.paths.root]
    see(manager, RUNNING)
    assert _differences(manager, _wanted(), RUNNING, _record(_wanted())) == []


class NoNamespaceDaemon(types.SimpleNamespace):
    """A daemon that cannot get a mount namespace here (no CAP_SYS_ADMIN), and records any stop."""

    def check_shm_namespace(self):
        raise InvalidParameterError('shm', 'cannot give the daemon /x/shm as /dev/shm in a mount namespace of its own')

    def stop(self, pid):
        self.stopped.append(pid)


def test_a_daemon_that_cannot_get_its_namespace_is_refused_before_the_running_one_is_stopped(tmp_path, see):
    paths = resource_paths(str(tmp_path / 'root'), 'train')
    config = config_paths(str(tmp_path / 'etc'), 'train')
    daemon = NoNamespaceDaemon(binary='/bin/true', log_mode=0o700, start_timeout=30, stop_timeout=30, stopped=[])
    manager = DaemonManager(paths, config, daemon, nvml=None, supervisor='none', check_mode=False)
    wanted = _wanted(supervisor='none', shm=True)
    record = StartRecord.from_data(dict(_wanted(supervisor='none').record(), pid=RUNNING.pid))
    with pytest.raises(InvalidParameterError, match='^shm: cannot give the daemon'):
        see(manager, RUNNING, shm_namespace='shm: cannot give the daemon /x/shm as /dev/shm in a mount namespace of its own')
        manager._ensure_running('started', wanted, RUNNING, record, Outcome())
    assert daemon.stopped == []


def test_a_systemd_root_that_a_drop_in_cannot_carry_is_refused_before_anything_is_stopped(tmp_path, see):
    paths = resource_paths(str(tmp_path / 'a:b'), 'train')
    config = config_paths(str(tmp_path / 'etc'), 'train')
    daemon = NoNamespaceDaemon(binary='/bin/true', log_mode=0o700, start_timeout=30, stop_timeout=30, stopped=[])
    manager = DaemonManager(paths, config, daemon, nvml=None, supervisor='systemd', check_mode=False)
    wanted = _wanted(shm=True)
    with pytest.raises(InvalidParameterError, match='^root: .* cannot be written into a systemd unit'):
        see(manager, RUNNING)
        manager._ensure_running('started', wanted, RUNNING, _record(_wanted()), Outcome())
    assert daemon.stopped == []


def test_a_directory_planned_empty_that_is_not_any_more_is_kept(tmp_path):
    (tmp_path / 'd').mkdir()
    (tmp_path / 'd' / 'late').write_text('')
    assert not rmdir_if_empty(str(tmp_path / 'd'))
    assert (tmp_path / 'd' / 'late').exists()
    assert not rmdir_if_empty(str(tmp_path / 'gone'))  # already gone: nothing to do


def test_a_mount_point_is_never_removed_by_absent(manager, monkeypatch, see):
    os.makedirs(manager.paths.pipe_dir)
    monkeypatch.setattr(_paths, 'mount_points', lambda text: frozenset([manager.paths.pipe_dir]))
    see(manager)
    out = Outcome()
    assert manager.absent.plan_removal(manager.paths.pipe_dir, out) is False and out.actions == []


@pytest.mark.parametrize('busy', ['refuse', 'wait', 'terminate'])
def test_a_daemon_with_clients_is_refused_waited_for_or_ended_as_busy_says(manager, monkeypatch, busy, see, tmp_path):
    clients = [{'pid': 41, 'uid': 1000, 'server': 7}]
    manager = _make(tmp_path, busy=busy)
    out = _manager.DaemonOutcome()
    see(manager, RUNNING, clients=clients)
    if busy == 'refuse':
        with pytest.raises(_manager.MpsError, match=r'^busy: the stop .* would end its 1 connected client\(s\) - pid 41 '
                                                    r'\(uid 1000\) on server 7; nothing was done\. Set busy=wait'):
            manager.clients.plan(RUNNING, out, 'the stop')
        return
    manager.clients.plan(RUNNING, out, 'the stop')
    assert out.clients == clients
    if busy == 'wait':
        assert out.actions == ['wait up to 600s for 1 connected client(s) to leave - pid 41 (uid 1000) on server 7']
        assert len(out.steps) == 1
    else:
        assert out.actions == [] and out.warnings[0].endswith('(busy=terminate) - pid 41 (uid 1000) on server 7')


def test_a_daemon_without_clients_stops_whatever_busy_says(manager, see):
    out = _manager.DaemonOutcome()
    see(manager, RUNNING)
    manager.clients.plan(RUNNING, out, 'the stop')
    assert out.actions == [] and out.warnings == [] and not out.changed


def test_a_foreground_daemon_gets_its_dropin_and_no_pid_file_and_switching_restarts_it(manager, see):
    background, foreground = _wanted(), _wanted(foreground=True)
    files = manager.unit_files.render(foreground)
    assert 'Type=exec' in files[manager.unit_files.foreground_dropin_path] and files[manager.unit_files.pidfile_dropin_path] is None
    files = manager.unit_files.render(background)
    assert files[manager.unit_files.foreground_dropin_path] is None and 'PIDFile=' in files[manager.unit_files.pidfile_dropin_path]
    assert manager.unit_files.foreground_dropin_path in manager.absent.created_files()
    _write_env(manager, background)
    see(manager, RUNNING)
    assert _differences(manager, background, RUNNING, _record(background)) == []
    see(manager, RUNNING)
    assert _differences(manager, foreground, RUNNING, _record(foreground)) == [
        'environment file %s differs in MPS_FOREGROUND' % manager.run.config.env_file]


def test_foreground_without_systemd_is_refused_before_anything(tmp_path):
    paths = resource_paths(str(tmp_path / 'root'), 'train')
    daemon = types.SimpleNamespace(binary='/bin/true', log_mode=0o700, start_timeout=30, stop_timeout=30)
    manager = DaemonManager(paths, config_paths(str(tmp_path / 'etc'), 'train'), daemon, nvml=None, supervisor='none',
                            check_mode=True)
    with pytest.raises(InvalidParameterError, match='^foreground: needs supervisor=systemd'):
        manager.validate('started', 'exclusive_process', foreground=True)
    assert not os.path.exists(str(tmp_path / 'root'))


def test_a_unit_order_is_a_dropin_of_its_own_rewritten_without_a_restart(manager, see, tmp_path):
    wanted = _wanted()
    assert manager.unit_files.render(wanted)[manager.unit_files.order_dropin_path] is None
    manager = _make(tmp_path, unit_before=('slurmd.service',), unit_after=('nvidia-fabricmanager.service',))
    text = manager.unit_files.render(wanted)[manager.unit_files.order_dropin_path]
    assert 'Before=slurmd.service\nAfter=nvidia-fabricmanager.service\n' in text
    assert manager.unit_files.order_dropin_path.endswith('gpufleet-mps@train.service.d/gpufleet-order.conf')
    assert manager.unit_files.order_dropin_path in manager.unit_files.paths() and manager.unit_files.order_dropin_path in manager.absent.created_files()
    # ordering is read by systemd at boot, not by the running daemon: never a restart
    _write_env(manager, wanted)
    see(manager, RUNNING)
    assert _differences(manager, wanted, RUNNING, _record(wanted)) == []


@pytest.mark.parametrize('params, message', [
    ({'supervisor': 'none', 'unit_before': ['slurmd.service']}, '^unit_before: needs supervisor=systemd'),
    ({'supervisor': 'none', 'unit_after': ['x.target']}, '^unit_after: needs supervisor=systemd'),
    ({'supervisor': 'none', 'unit_before': ['a.service', 'b.service'], 'unit_after': ['b.service']},
     '^unit_after: b.service is in unit_before too'),
    ({'supervisor': 'none', 'unit_before': ['slurmd']}, "^unit_before: 'slurmd' is not a systemd unit name"),
])
def test_a_unit_order_is_refused_before_anything_where_it_cannot_apply(tmp_path, params, message):
    values = dict(root=str(tmp_path / 'root'), config_dir=str(tmp_path / 'etc'), control_binary=None, name='train', state='started',
                  devices='all', multiuser=False, compute_mode='exclusive_process', supervisor='none', start_timeout=30,
                  stop_timeout=30, busy='refuse', busy_timeout=600, log_mode='0700', shm=False, container_root='/mps',
                  selinux_type='')
    values.update(params)
    with pytest.raises(InvalidParameterError, match=message):
        DaemonSetup.from_params(values, lambda _binary: '/bin/true')
    assert not os.path.exists(str(tmp_path / 'root')) and not os.path.exists(str(tmp_path / 'etc'))


def test_a_daemon_run_shares_the_host_plans_removals_and_waits_as_long_as_busy_timeout_says(tmp_path):
    """What a DaemonRun holds before any plan: the host plan's one list of removals (a directory emptied by several
    resources counts as empty), and the documented busy_timeout - never 0, which would give up a busy=wait at once."""
    from ansible_collections.gpufleet.mps.plugins.module_utils._daemon.model import DaemonRun, HostContext  # pylint: disable=import-outside-toplevel
    from ansible_collections.gpufleet.mps.plugins.module_utils._options import DEFAULT_BUSY_TIMEOUT  # pylint: disable=import-outside-toplevel
    host = HostContext()
    runs = [DaemonRun(resource_paths(str(tmp_path / 'root'), name), config_paths(str(tmp_path / 'etc'), name), None, None, 'none',
                      False, host=host) for name in ('train', 'infer')]
    runs[0].planned.would_remove.append('/x')
    assert runs[1].planned.would_remove is host.would_remove and host.would_remove == ['/x']
    assert runs[0].busy_timeout == DEFAULT_BUSY_TIMEOUT > 0
