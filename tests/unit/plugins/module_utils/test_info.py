# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from ansible_collections.gpufleet.mps.plugins.module_utils import _gpus, _info, _proc
from ansible_collections.gpufleet.mps.plugins.module_utils._protocol import batch as _batch, framing as _control
from ansible_collections.gpufleet.mps.plugins.module_utils._protocol.framing import Reply, SENTINEL
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.process import daemon_env
from ansible_collections.gpufleet.mps.plugins.module_utils._errors import ControlBinaryError, InvalidParameterError
from ansible_collections.gpufleet.mps.plugins.module_utils._limits.model import Limits
from ansible_collections.gpufleet.mps.plugins.module_utils._resource.layout import resource_paths
from ansible_collections.gpufleet.mps.plugins.module_utils._observe.readout import limit_differences
from ansible_collections.gpufleet.mps.plugins.module_utils._observe import reader as _reader
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.liveness import inspect

UUID0 = 'GPU-6a2b5c1e-0000-4000-8000-000000000000'
UUID1 = 'GPU-6a2b5c1e-1111-4000-8000-000000000001'


# --- framing ------------------------------------------------------------------------------------
def test_batch_text_fences_only_pid_percentage_queries_that_are_not_last():
    cmds = [SENTINEL, 'get_server_list', 'get_active_thread_percentage 7', 'get_server_status 8',
            'get_active_thread_percentage 8']
    assert _control.batch_text(cmds).splitlines() == [
        SENTINEL,
        'get_server_list', SENTINEL,
        'get_active_thread_percentage 7', 'ps', SENTINEL,
        'get_server_status 8', SENTINEL,
        'get_active_thread_percentage 8',
    ]


PS = ['PID ID SERVER DEVICE NAMESPACE COMMAND', '41 0 7 %s 4026531836 python train.py' % UUID0]


@pytest.mark.parametrize('failure', [['Server with PID 7 not found'], ['Error: invalid server PID'], []],
                         ids=['text', 'alt', 'silent'])
def test_a_failed_pid_percentage_query_never_shifts_the_replies_after_it(failure):
    cmds = ['get_active_thread_percentage 7', 'get_server_status 8', 'get_active_thread_percentage 8']
    lines = failure + PS + ['100.0', 'ACTIVE', '100.0', '25.0']
    replies = _control.split_replies(cmds, lines)
    assert [reply.command for reply in replies] == cmds
    assert _batch.optional_percentage(replies[0]) is None
    assert replies[1].lines == ('ACTIVE',)
    assert replies[2].lines == ('25.0',)


def test_a_successful_pid_percentage_query_equal_to_the_sentinel_is_still_its_own_reply():
    cmds = ['get_active_thread_percentage 7', 'get_client_list 7']
    replies = _control.split_replies(cmds, ['100.0'] + PS[:1] + ['100.0', '41'])
    assert replies[0].lines == ('100.0',)
    assert replies[1].lines == ('41',)


@pytest.mark.parametrize('last', [[], ['Server with PID 8 not found'], ['50.0']])
def test_the_last_command_takes_whatever_is_left(last):
    replies = _control.split_replies(['get_server_list', 'get_active_thread_percentage 8'], ['8', '100.0'] + last)
    assert replies[0].lines == ('8',) and replies[1].lines == tuple(last)


def test_output_without_the_expected_delimiter_is_an_error():
    with pytest.raises(ControlBinaryError, match='no delimiter'):
        _control.split_replies(['get_server_list', 'get_server_status 8'], ['8', '9'])


# --- parsing one daemon's replies ---------------------------------------------------------------
def _replies(cmds, texts):
    return [Reply(cmd, tuple(text.split('\n')) if text else ()) for cmd, text in zip(cmds, texts)]


def test_only_listed_servers_are_reported_with_status_uid_clients_and_limits():
    cmds = _batch.batch_commands(2, [31, 32])
    replies = _replies(cmds, [
        '25.0', '32', '3G', '0M', '1',                                  # defaults, server list, client priority
        'Server with PID 31 not found', 'Server with PID 31 not found',  # 31: not a server
        'Server with PID 31 not found', 'Server with PID 31 not found', 'Server with PID 31 not found PID ID SERVER',
        'ACTIVE', '41\n42', '3G', '512M', '25.0',                       # 32
    ])
    readout = _batch.parse_batch(replies, 2, [31, 32])
    assert readout.default_percentage == 25.0
    assert readout.default_mem == ['3G', None]
    assert readout.default_priority == 1
    assert readout.servers == [_batch.ServerReadout(32, 'ACTIVE', [41, 42], 25.0, ['3G', '512M'])]


def test_a_listed_server_that_is_not_a_child_is_still_listed():
    cmds = _batch.batch_commands(1, [])
    readout = _batch.parse_batch(_replies(cmds, ['100.0', '77', '', 'Unrecognized command: get_default_client_priority']), 1, [])
    assert readout.default_mem == [None]
    assert readout.default_priority is None  # a binary without client priority
    assert readout.servers == [_batch.ServerReadout(77)]


def test_process_uid_reads_the_real_uid(tmp_path):
    (tmp_path / '12').mkdir()
    (tmp_path / '12' / 'status').write_text('Name:\tnvidia-cuda-mps\nUid:\t1000\t1000\t1000\t1000\n')
    assert _proc.process_uid(12, str(tmp_path)) == 1000
    assert _proc.process_uid(13, str(tmp_path)) is None
    assert _proc.process_uid(os.getpid()) == os.getuid()


# --- limits -------------------------------------------------------------------------------------
def test_lossy_readback_of_the_persisted_limits_is_no_difference():
    persisted = Limits(active_thread_percentage=25, pinned_device_mem_limit={UUID0: 3840, '*': 512})
    assert limit_differences(persisted, 25.0, {UUID0: '3G', UUID1: '512M'}, [UUID0, UUID1]) == []


def test_limits_that_differ_from_the_persisted_ones_are_named():
    persisted = Limits(active_thread_percentage=25, pinned_device_mem_limit={UUID0: 3840, UUID1: 1024})
    found = limit_differences(persisted, 50.0, {UUID0: '2G', UUID1: None}, [UUID0, UUID1])
    assert found == [
        'active thread percentage 25 persisted, 50.0 reported',
        'pinned memory limit of device 0 (%s) 3840M persisted, 2G reported' % UUID0,
        'pinned memory limit of device 1 (%s) 1024M persisted, none reported' % UUID1,
    ]


def test_nothing_persisted_or_unmanaged_never_differs():
    assert limit_differences(None, 50.0, {UUID0: '2G'}, [UUID0]) == []
    assert limit_differences(Limits(), 50.0, {UUID0: '2G'}, [UUID0]) == []


# --- validation ---------------------------------------------------------------------------------
@pytest.mark.parametrize('overrides, param', [
    ({'gather': []}, 'gather'),
    ({'gather': ['gpus', 'clients']}, 'gather'),
    ({'timeout': 0}, 'timeout'),
    ({'root': 'relative'}, 'root'),
    ({'name': '../etc'}, 'name'),
    ({'config_dir': 'etc'}, 'config_dir'),
])
def test_bad_options_are_refused_naming_the_option(overrides, param):
    args = dict(root='/run/nvidia/mps', config_dir='/etc/gpufleet-mps', name=None, gather=['gpus'],
                control_binary=None, timeout=10)
    args.update(overrides)
    with pytest.raises(InvalidParameterError) as caught:
        _info.InfoRequest.validate(**args)
    assert caught.value.param == param


def test_servers_imply_daemons():
    request = _info.InfoRequest.validate('/run/nvidia/mps/', '/etc/x', None, ['servers'], None, 5)
    assert request.gather == {'servers', 'daemons'} and request.root == '/run/nvidia/mps'


# --- NVML ---------------------------------------------------------------------------------------
def test_nvml_facts_on_a_gpu_host(gpu_host):
    gpu_host()
    facts, gpus, enumeration = _info.nvml_facts(_gpus.Nvml)
    assert facts == {'available': True, 'error': None, 'driver_version': '560.35.03', 'cuda_driver_version': '12.6',
                     'python_binding': True, 'driver_upgrade_pending': False}
    assert len(gpus) == 4 and not enumeration


def test_a_host_without_nvidia_ml_py_reports_why_instead_of_failing(gpu_host, monkeypatch):
    gpu_host()
    monkeypatch.setattr(_gpus, 'pynvml', None)
    facts, gpus = _info.nvml_facts(_gpus.Nvml)[:2]
    assert not facts['available'] and gpus == [] and not facts['python_binding']
    assert 'nvidia-ml-py' in facts['error']


def test_a_host_whose_driver_is_not_loaded_reports_why_instead_of_failing(nvml_lib, monkeypatch):
    monkeypatch.delenv('FAKE_NVML_CONFIG', raising=False)
    facts, gpus = _info.nvml_facts(_gpus.Nvml)[:2]
    assert not facts['available'] and gpus == [] and 'not loaded' in facts['error'] and facts['python_binding']


def test_the_enumeration_variable_is_noticed(gpu_host, monkeypatch):
    gpu_host()
    monkeypatch.setenv('NVML_MPS_DEVICE_ENUMERATION', '1')
    facts, gpus, enumeration = _info.nvml_facts(_gpus.Nvml)
    assert enumeration and facts['available'] and len(gpus) == 4


# --- a whole simulated host ---------------------------------------------------------------------
class Host:
    """Daemons and clients on the simhost fixture, each started and stopped by pid."""

    def __init__(self, base, clients):
        self.base = base
        self._clients = clients
        self.root = str(base / 'root')
        self.etc = str(base / 'etc')
        self.binary = str(base / 'host' / 'bin' / 'nvidia-cuda-mps-control')

    def switches(self, **values):
        text = ''.join('export %s=%s\n' % item for item in values.items())
        (self.base / 'host' / 'mps.env').write_text(text)

    def start(self, name, uuids, record=True):
        """``-d`` without waiting for answers (a hung daemon never answers)."""
        paths = resource_paths(self.root, name)
        for directory in (paths.pipe_dir, paths.log_dir):  # as the modules do: a real -d creates neither
            os.makedirs(directory, exist_ok=True)
        subprocess.run([self.binary, '-d'], env=daemon_env(paths, uuids), check=True, capture_output=True)
        for attempt in range(200):
            state = inspect(paths)
            if state.running and state.pid:
                break
            time.sleep(0.05)
        pid = state.pid
        if record:
            with open(paths.started_file, 'w', encoding='utf-8') as handle:
                json.dump({'devices': list(uuids), 'multiuser': False, 'supervisor': 'none', 'pid': pid,
                           'started_at': '2026-12-02T13:04:59Z'}, handle)
        return pid

    def client(self, name):
        return self._clients(resource_paths(self.root, name).pipe_dir)[1]

    def collect(self, name=None, gather=('gpus', 'daemons', 'servers'), timeout=10):
        request = _info.InfoRequest.validate(self.root, self.etc, name, list(gather), self.binary, timeout)
        return _info.Collector(request).collect()

    def ui_sessions(self, name):
        log = resource_paths(self.root, name).log_dir + '/control.log'
        with open(log, encoding='utf-8') as handle:
            return handle.read().count('NEW UI')


@pytest.fixture
def host(simhost, sim_clients):
    os.chmod(simhost, 0o755)  # mkdtemp's 0700 would warn about every daemon
    return Host(simhost, sim_clients)


def uuids(count):
    with _gpus.Nvml() as nvml:
        return [gpu.uuid for gpu in nvml.gpus()[:count]]


def test_an_empty_root_reports_no_daemons_and_no_warnings(host):
    report = host.collect()
    assert report.facts['daemons'] == [] and report.warnings == [] and report.ui_processes == 0
    assert report.facts['nvml']['available'] and len(report.facts['gpus']) == 4


def test_a_daemon_with_a_server_and_clients_costs_one_ui_process(host):
    gpus = uuids(2)
    pid = host.start('train', gpus)
    first = host.client('train')
    second = host.client('train')
    before = host.ui_sessions('train')
    report = host.collect()
    assert host.ui_sessions('train') == before + 1 and report.ui_processes == 1
    (daemon,) = report.facts['daemons']
    assert daemon['healthy'] and daemon['pid'] == pid and daemon['state'] == 'running'
    assert daemon['devices'] == [{'ordinal': 0, 'uuid': gpus[0], 'index': 0}, {'ordinal': 1, 'uuid': gpus[1], 'index': 1}]
    assert daemon['limits']['reported'] == {'active_thread_percentage': 100.0,
                                            'pinned_device_mem_limit': {gpus[0]: None, gpus[1]: None}, 'client_priority': 'normal'}
    (server,) = daemon['servers']
    assert server['pid'] == first['server_pid'] and server['status'] == 'ACTIVE' and server['uid'] == os.getuid()
    assert sorted(server['clients']) == sorted([first['client_pid'], second['client_pid']])


@pytest.mark.parametrize('style', ['text', 'alt', 'silent'])
def test_a_child_that_is_not_a_server_is_ignored_whatever_its_error_text(host, monkeypatch, style):
    host.switches(FAKE_MPS_ERROR_STYLE=style)
    gpus = uuids(1)
    daemon_pid = host.start('train', gpus)
    subprocess.run([host.binary], input='set_default_active_thread_percentage 40\nset_default_device_pinned_mem_limit 0 3840M',
                   env=dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=resource_paths(host.root, 'train').pipe_dir),
                   check=True, capture_output=True, text=True)
    server = host.client('train')['server_pid']
    real = _proc.child_pids(daemon_pid)
    # Not a server, asked about before and after the real one.
    monkeypatch.setattr(_reader, 'child_pids', lambda pid: [os.getpid()] + real + [os.getppid()])
    report = host.collect()
    (daemon,) = report.facts['daemons']
    assert daemon['healthy'], daemon['error']
    assert daemon['limits']['reported'] == {'active_thread_percentage': 40.0, 'pinned_device_mem_limit': {gpus[0]: '3G'},
                                            'client_priority': 'normal'}
    assert [s['pid'] for s in daemon['servers']] == [server]
    assert daemon['servers'][0]['limits'] == {'active_thread_percentage': 40.0, 'pinned_device_mem_limit': {gpus[0]: '3G'}}


def test_gather_without_servers_asks_nothing_about_them(host):
    host.start('train', uuids(1))
    host.client('train')
    report = host.collect(gather=['daemons'])
    (daemon,) = report.facts['daemons']
    assert 'servers' not in daemon and 'gpus' not in report.facts and daemon['healthy']
    with open(resource_paths(host.root, 'train').log_dir + '/control.log', encoding='utf-8') as handle:
        assert 'Cmd:get_server_status' not in handle.read()


def test_gather_gpus_only_never_talks_to_a_daemon(host):
    host.start('train', uuids(1))
    before = host.ui_sessions('train')
    report = host.collect(gather=['gpus'])
    assert 'daemons' not in report.facts and report.ui_processes == 0 and host.ui_sessions('train') == before


def test_a_stale_daemon_is_reported_with_its_leftovers_and_a_warning(host):
    pid = host.start('crashed', uuids(1))
    os.kill(pid, signal.SIGKILL)
    for attempt in range(100):
        if not inspect(resource_paths(host.root, 'crashed')).running:
            break
        time.sleep(0.05)
    report = host.collect()
    (daemon,) = report.facts['daemons']
    assert daemon['state'] == 'stale' and not daemon['running'] and not daemon['healthy'] and daemon['pid'] is None
    assert '.started' in daemon['leftovers'] and 'nvidia-cuda-mps-control.pid' in daemon['leftovers']
    assert report.ui_processes == 0
    assert [w for w in report.warnings if 'crashed (pid %d) is not running but left files behind' % pid in w]


def test_a_hung_daemon_is_unhealthy_not_a_failure(host):
    host.switches(FAKE_MPS_FAULT_HANG='1')
    pid = host.start('hung', uuids(1))
    started = time.monotonic()
    report = host.collect(timeout=1)
    assert time.monotonic() - started < 5
    (daemon,) = report.facts['daemons']
    assert daemon['running'] and not daemon['healthy'] and daemon['limits']['reported'] is None
    assert 'did not answer within 1s' in daemon['error'] and 'control.log' in daemon['error']
    assert [w for w in report.warnings if 'hung (pid %d) runs but could not be asked' % pid in w]
    os.kill(pid, 0)  # left running


def test_a_ui_that_prints_garbage_makes_the_daemon_unhealthy(host):
    host.start('noisy', uuids(1))
    host.switches(FAKE_MPS_FAULT_UI='garbage')
    (daemon,) = host.collect().facts['daemons']
    assert not daemon['healthy'] and daemon['error']


def test_each_warning(host, monkeypatch):
    gpus = uuids(3)
    host.start('a', gpus[:2])
    host.start('b', gpus[1:3])  # GPU 1 in both records
    with _gpus.Nvml() as nvml:
        nvml.set_compute_mode(nvml.gpus()[0], 'exclusive_process')
    os.makedirs(host.etc)
    with open(os.path.join(host.etc, 'a.limits.json'), 'w', encoding='utf-8') as handle:
        handle.write(Limits(active_thread_percentage=25).to_json())
    os.chmod(os.path.join(host.root, 'b'), 0o700)
    monkeypatch.setenv('NVML_MPS_DEVICE_ENUMERATION', '1')
    report = host.collect()
    text = '\n'.join(report.warnings)
    assert 'GPU 1 (%s) is claimed by more than one MPS control daemon under %s: a, b' % (gpus[1], host.root) in text
    assert 'GPU 0 (%s) of' not in text  # EXCLUSIVE_PROCESS
    assert 'GPU 1 (%s) of the MPS control daemon of a is in compute mode DEFAULT' % gpus[1] in text
    assert 'GPU 2 (%s) of the MPS control daemon of b is in compute mode DEFAULT' % gpus[2] in text
    assert '%s/b cannot be traversed by other users' % host.root in text
    assert 'the limits of the MPS control daemon of a differ from the persisted ones: active thread percentage 25.0 persisted, 100.0 reported' in text
    assert 'NVML_MPS_DEVICE_ENUMERATION was set' in text
    (a, b) = report.facts['daemons']
    assert a['limits']['persisted'] == {'active_thread_percentage': 25.0, 'pinned_device_mem_limit_mib': {}, 'replicas': None,
                                        'client_priority': None, 'sm_partitions': []}
    assert a['limits']['differences'] == ['active thread percentage 25.0 persisted, 100.0 reported']
    assert b['limits']['persisted'] is None and b['limits']['differences'] == []


def test_name_reports_one_daemon_but_still_sees_gpus_shared_with_others(host):
    gpus = uuids(2)
    host.start('a', gpus[:1])
    host.start('b', gpus)
    report = host.collect(name='b')
    assert [d['name'] for d in report.facts['daemons']] == ['b'] and report.ui_processes == 1
    assert [w for w in report.warnings if 'claimed by more than one' in w]
    assert host.collect(name='nothing').facts['daemons'] == []


def test_a_daemon_without_a_record_is_reported_without_devices(host):
    host.start('bare', [], record=False)
    (daemon,) = host.collect().facts['daemons']
    assert daemon['healthy'] and daemon['devices'] == [] and daemon['supervisor'] is None
    assert daemon['limits']['reported'] == {'active_thread_percentage': 100.0, 'pinned_device_mem_limit': {}, 'client_priority': 'normal'}


def test_without_the_control_binary_running_daemons_are_listed_not_asked(host):
    host.start('train', uuids(1))
    request = _info.InfoRequest.validate(host.root, host.etc, None, ['daemons'], None, 5)
    report = _info.Collector(request).collect()
    (daemon,) = report.facts['daemons']
    assert daemon['running'] and not daemon['healthy'] and 'not found' in daemon['error']
    assert report.facts['control_binary'] is None


@pytest.mark.parametrize('failure', [['Server with PID 7 not found'], ['Error: invalid server PID'], []],
                         ids=['text', 'alt', 'silent'])
def test_a_failed_percentage_query_replies_with_the_daemons_text_only_not_the_fence(failure):
    cmds = ['set_default_active_thread_percentage 250', 'get_server_status 8']
    replies = _control.split_replies(cmds, failure + PS + ['100.0', 'ACTIVE'])
    assert replies[0].lines == tuple(failure)


# --- the facts are a rendering of the view ------------------------------------------------------
def test_the_facts_are_rendered_from_a_hand_built_view_alone(monkeypatch):
    """No host at all: a view written by hand (a root with one running resource and its record, a persisted limit, one
    server with a client, an orphan of the root), rendered into mps_info's facts - while open, stat and listdir raise."""
    # pylint: disable=import-outside-toplevel
    from ansible_collections.gpufleet.mps.plugins.module_utils._info_facts import render
    from ansible_collections.gpufleet.mps.plugins.module_utils._observe.paths import DIRECTORY, FILE, MISSING, Entry, PathView
    from ansible_collections.gpufleet.mps.plugins.module_utils._observe.scan import ForeignDaemon
    from ansible_collections.gpufleet.mps.plugins.module_utils._observe.view import HostView, ResourceView
    from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.liveness import Liveness
    root, etc = '/nowhere/root', '/nowhere/etc'
    paths = resource_paths(root, 'train')
    record = json.dumps({'devices': [UUID0], 'multiuser': False, 'supervisor': 'none', 'pid': 4100, 'started_at': 'then',
                         'compute_mode': 'exclusive_process', 'driver_version': '580.95.05'})
    entries = {
        root: Entry(DIRECTORY, 0o755, 0, entries=('train',)), root + '/train': Entry(DIRECTORY, 0o755, 0, entries=('.started', 'log', 'pipe')),
        root + '/train/pipe': Entry(DIRECTORY, 0o755, 0, entries=('control', 'nvidia-cuda-mps-control.pid')),
        root + '/train/.started': Entry(FILE, 0o644, 0, text=record), root + '/train/log': Entry(DIRECTORY, 0o700, 0, entries=()),
        root + '/shm': Entry(MISSING), root + '/.ready': Entry(FILE, 0o644, 0, text=''),
        etc: Entry(DIRECTORY, 0o755, 0, entries=('train.limits.json',)),
        etc + '/train.limits.json': Entry(FILE, 0o644, 0, text=Limits(active_thread_percentage=50.0).to_json()),
        etc + '/train.env': Entry(MISSING), etc + '/train.limits': Entry(MISSING), etc + '/train.limits-env': Entry(MISSING),
    }
    for path in ('/', '/nowhere', root + '/train/pipe/log'):
        entries.setdefault(path, Entry(DIRECTORY if path != root + '/train/pipe/log' else MISSING, 0o755, 0))
    for mark in ('pipe', '.started', 'log'):
        entries.setdefault(root + '/train/' + mark, Entry(MISSING))
    view = HostView([_gpus.Gpu(0, UUID0, 'NVIDIA H100', 81559, (9, 0), 'exclusive_process', False, False, True, '580.95.05')],
                    PathView(entries, mounts_read=True))
    view.mountinfo, view.realpaths[root + '/shm'] = '', root + '/shm'
    view.resources['train'] = ResourceView(paths, Liveness(True, 4100, 4100), None, _info_facts_record(record))
    view.readouts['train'] = ((1, 4100), _batch.DaemonReadout(25.0, ['3G'], [_batch.ServerReadout(4200, 'ACTIVE', [4300], 25.0, ['3G'])], 0))
    view.uids[4200], view.dev_shm[4100] = 1000, '/dev/shm'
    owner = {'pid': 4300, 'uid': 1000, 'owner': 'slurm_job', 'engine': None, 'container': None, 'pod': None, 'job': '77',
             'claimed_job': '77'}
    view.owners[4300], view.protocols[4100], view.replaced[4100] = owner, 2, ''
    view.daemons = ([ForeignDaemon(4400, root + '/gone/pipe', 0, [UUID0], orphan=True)], [])
    view.seal()
    monkeypatch.setattr(os, 'stat', _refuse)
    monkeypatch.setattr(os, 'listdir', _refuse)
    monkeypatch.setattr('builtins.open', _refuse)
    request = _info.InfoRequest(root, etc, None, frozenset(_info.GATHER_CHOICES), '/bin/nvidia-cuda-mps-control', 10)
    facts, warnings = render(request, view, {'available': True}, enumeration_set=False)
    (daemon,) = facts['daemons']
    assert (daemon['name'], daemon['pid'], daemon['healthy'], daemon['started_at']) == ('train', 4100, True, 'then')
    assert daemon['limits']['reported']['active_thread_percentage'] == 25.0
    assert daemon['limits']['persisted']['active_thread_percentage'] == 50.0
    assert daemon['limits']['differences'] == ['active thread percentage 50.0 persisted, 25.0 reported']
    assert daemon['servers'] == [{'pid': 4200, 'status': 'ACTIVE', 'uid': 1000, 'clients': [4300], 'client_owners': [owner],
                                  'limits': {'active_thread_percentage': 25.0, 'pinned_device_mem_limit': {UUID0: '3G'}}}]
    assert daemon['clients_by_owner'] == {'container': 0, 'slurm_job': 1, 'host': 0, 'unknown': 0}
    assert (daemon['protocol'], daemon['binary_replaced']) == (2, False)
    assert [other['pid'] for other in facts['other_daemons'] if other['orphan']] == [4400]
    assert facts['resources'] == ['train'] and facts['shm']['mounted'] is False
    assert any('differ from the persisted ones' in warning for warning in warnings)
    assert any('pid 4400, an orphaned daemon of this root' in warning for warning in warnings)


def _refuse(*args, **kwargs):
    raise AssertionError('the facts read %r: they must be rendered from the view alone' % (args[:1],))


def _info_facts_record(text):
    from ansible_collections.gpufleet.mps.plugins.module_utils._resource.record import StartRecord  # pylint: disable=import-outside-toplevel
    return StartRecord.from_data(json.loads(text))
