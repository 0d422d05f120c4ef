# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""mps_host's one plan on the simulated host: check mode lists exactly what a real run executes, and the invariants."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from ansible_collections.gpufleet.mps.plugins.module_utils import _gpus
from ansible_collections.gpufleet.mps.plugins.module_utils._errors import InvalidParameterError, MpsError
from ansible_collections.gpufleet.mps.plugins.module_utils._host.manager import HostManager
from ansible_collections.gpufleet.mps.plugins.module_utils._module import control_binary
from ansible_collections.gpufleet.mps.plugins.module_utils._resource.layout import resource_paths
from ansible_collections.gpufleet.mps.plugins.module_utils._resource.record import StartRecord
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.liveness import inspect
from ansible_collections.gpufleet.mps.plugins.modules.mps_host import argument_spec


def _defaults():
    return {key: spec.get('default') for key, spec in argument_spec().items()}


class Host:
    """mps_host's manager on the simhost fixture: one run is one NVML session, as in the module."""

    def __init__(self, base, clients):
        self.base = base
        self._clients = clients
        self.root = str(base / 'root')
        self.binary = str(base / 'host' / 'bin' / 'nvidia-cuda-mps-control')
        self.params = dict(_defaults(), root=self.root, config_dir=str(base / 'etc'), control_binary=self.binary,
                           supervisor='none', local_facts_dir=str(base / 'facts.d'), logrotate_dir=str(base / 'logrotate.d'),
                           start_timeout=10, stop_timeout=5, shm_persist='none', shm_size='64m')
        self.unit_dir = str(base / 'units')

    def run(self, resources, check=False, **options):
        params = dict(self.params, resources=resources, **options)
        with _gpus.Nvml() as nvml:
            return HostManager(params, nvml, control_binary, check_mode=check, unit_dir=self.unit_dir).ensure(nvml.gpus())

    def uuids(self):
        with _gpus.Nvml() as nvml:
            return [gpu.uuid for gpu in nvml.gpus()]

    def compute_modes(self):
        with _gpus.Nvml() as nvml:
            return [gpu.compute_mode for gpu in nvml.gpus()]

    @property
    def ready(self):
        return os.path.exists(os.path.join(self.root, '.ready'))

    def client(self, name):
        return self._clients(resource_paths(self.root, name).pipe_dir)[0]

    def leave(self, proc):
        proc.stdin.close()
        proc.wait(10)

    def close(self):
        for pid in _daemon_pids(self.root):
            _kill(pid)


def _daemon_pids(root):
    pids = []
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        try:
            with open('/proc/%s/environ' % entry, 'rb') as handle:
                env = handle.read().split(b'\0')
            with open('/proc/%s/cmdline' % entry, 'rb') as handle:
                argv = handle.read().split(b'\0')
        except OSError:
            continue
        if b'-d' in argv and any(item.startswith(b'CUDA_MPS_PIPE_DIRECTORY=' + root.encode()) for item in env):
            pids.append(int(entry))
    return pids


def _kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


@pytest.fixture
def host(simhost, sim_clients):
    os.chmod(simhost, 0o755)  # mkdtemp's 0700 would warn about every daemon
    made = Host(simhost, sim_clients)
    yield made
    made.close()


def _record(root, name):
    """The start record as the file says."""
    with open(resource_paths(root, name).started_file, encoding='utf-8') as handle:
        return StartRecord.from_data(json.load(handle))


def _listed(out):
    return [change.as_dict() for change in out.changes]


def _assert_order(changes, ready_before):
    """The plan's order invariants: waits first; the ready mark withdrawn before anything goes down; the mark last."""
    kinds = [change['kind'] for change in changes]
    waits = [index for index, kind in enumerate(kinds) if kind == 'wait']
    assert waits == list(range(len(waits))), kinds
    down = [index for index, kind in enumerate(kinds) if kind in ('stop', 'restart')]
    withdraw = [index for index, change in enumerate(changes)
                if change['resource'] == 'host' and change['kind'] == 'remove' and change['action'].endswith('/.ready')]
    if down and ready_before:
        assert withdraw and withdraw[0] < down[0], changes
    if 'ready' in kinds:
        assert kinds.index('ready') == len(kinds) - 1, kinds


def _check_then_apply(host, resources, **options):
    """The check-mode plan, then the real run: the same changes, change by change; then nothing is left to do."""
    planned = host.run(resources, check=True, **options)
    _assert_order(_listed(planned), host.ready)
    applied = host.run(resources, **options)
    assert [change.as_dict() for change in applied.executed] == _listed(planned)
    assert _listed(applied) == _listed(planned)
    again = host.run(resources, check=True, **options)
    assert _listed(again) == [], _listed(again)
    return applied


SCENARIOS = {
    'new resources': [[{'name': 'train', 'devices': [0, 1]}, {'name': 'infer', 'devices': [2], 'replicas': 4}]],
    'devices moved between resources, a rename': [
        [{'name': 'train', 'devices': [0, 1]}, {'name': 'infer', 'devices': [2, 3]}],
        [{'name': 'train', 'devices': [0]}, {'name': 'tune', 'devices': [1]}, {'name': 'serve', 'devices': [2, 3]}],
    ],
    'two resources swap their GPUs': [
        [{'name': 'train', 'devices': [0]}, {'name': 'tune', 'devices': [1]}],
        [{'name': 'train', 'devices': [1]}, {'name': 'tune', 'devices': [0]}],
    ],
    'limits change, a pinned limit dropped (restart)': [
        [{'name': 'train', 'devices': [0, 1], 'active_thread_percentage': 50, 'pinned_device_mem_limit': '10G'}],
        [{'name': 'train', 'devices': [0, 1], 'active_thread_percentage': 25, 'pinned_device_mem_limit': '20G'}],
        [{'name': 'train', 'devices': [0, 1]}],
    ],
    'removal': [
        [{'name': 'train', 'devices': [0]}, {'name': 'infer', 'devices': [1]}],
        [{'name': 'train', 'devices': [0]}],
    ],
}


@pytest.mark.parametrize('steps', SCENARIOS.values(), ids=list(SCENARIOS))
def test_check_mode_lists_exactly_what_the_real_run_executes(host, steps):
    for resources in steps:
        out = _check_then_apply(host, resources)
        assert host.ready and out.ready
    teardown = _check_then_apply(host, [], state='absent')
    assert not host.ready and teardown.changes[0].action.startswith('remove ') and teardown.changes[0].resource == 'host'
    assert host.compute_modes() == ['default'] * 4


def test_limits_change_with_an_idle_and_a_busy_server_plans_what_it_does(host):
    host.run([{'name': 'train', 'devices': [0], 'active_thread_percentage': 50}])
    client = host.client('train')
    busy = _check_then_apply(host, [{'name': 'train', 'devices': [0], 'active_thread_percentage': 25}], running_servers='update')
    assert {change.kind for change in busy.changes} == {'limits', 'write'}  # no stop, no start: the client keeps running
    assert client.poll() is None
    host.leave(client)  # the server stays, idle
    idle = _check_then_apply(host, [{'name': 'train', 'devices': [0], 'active_thread_percentage': 40}], running_servers='update')
    assert 'set_active_thread_percentage' in idle.changes[0].action


def test_a_limits_change_never_silently_skips_a_running_server(host):
    """Case 1: with running_servers=ignore the idle server keeps its limits, and the run says so."""
    host.run([{'name': 'train', 'devices': [0], 'active_thread_percentage': 50}])
    host.leave(host.client('train'))
    out = host.run([{'name': 'train', 'devices': [0], 'active_thread_percentage': 25}])
    assert out.resources[0]['limits']['pending'] and any('keep the limits they started with' in w for w in out.warnings)
    updated = host.run([{'name': 'train', 'devices': [0], 'active_thread_percentage': 25}], running_servers='update')
    assert updated.changed and not updated.resources[0]['limits']['pending']


def test_servers_that_keep_their_limits_on_several_resources_are_one_warning_naming_each(host):
    resources = [{'name': 'train', 'devices': [0], 'active_thread_percentage': 50}, {'name': 'infer', 'devices': [1], 'active_thread_percentage': 50}]
    host.run(resources)
    for name in ('train', 'infer'):
        host.leave(host.client(name))
    out = host.run([dict(res, active_thread_percentage=25) for res in resources])
    pending = [w for w in out.warnings if 'keep the limits they started with' in w]
    assert len(pending) == 1, out.warnings
    assert re.search(r' - train: 1 server\(s\) \(pid \d+\); infer: 1 server\(s\) \(pid \d+\); running_servers=update', pending[0]), pending


def test_a_daemon_killed_with_limits_is_recovered_with_one_warning_that_says_so(host):
    """The same run starts it again with its limits: no second warning that they wait for a later start."""
    host.run([{'name': 'train', 'devices': [0], 'active_thread_percentage': 50}])
    with open(os.path.join(host.root, 'train', 'pipe', 'nvidia-cuda-mps-control.pid')) as handle:
        os.kill(int(handle.read()), signal.SIGKILL)
    time.sleep(0.3)
    out = host.run([{'name': 'train', 'devices': [0], 'active_thread_percentage': 50}])
    assert out.changed and [w for w in out.warnings if 'recovered the MPS control daemon for train' in w], out.warnings
    assert not [w for w in out.warnings if 'crashed or killed' in w], out.warnings
    assert host.run([{'name': 'train', 'devices': [0], 'active_thread_percentage': 50}]).changed is False


@pytest.mark.parametrize('name, message', [
    ('.ready', 'would collide with the files this collection keeps'),
    ('train/log', "would be the log directory of a resource named 'train'"),
    ('train/pipe', 'would be the pipe directory'),
    ('x/.lock', 'would collide'),
    ('shm', 'the shared tmpfs'),
])
def test_names_that_collide_with_our_own_files_are_refused_before_anything_changes(host, name, message):
    """Case 2."""
    with pytest.raises(InvalidParameterError, match=r'^resources\[1\]\.name: .*%s' % message):
        host.run([{'name': 'train', 'devices': [0]}, {'name': name, 'devices': [1]}])
    assert not os.path.exists(host.root) and host.compute_modes() == ['default'] * 4


def test_nested_names_of_the_device_plugin_stay_valid(host):
    out = host.run([{'name': 'nvidia.com/gpu', 'devices': [0]}, {'name': 'nvidia.com/mig', 'devices': [1]}])
    assert out.ready


def test_a_daemon_whose_root_was_deleted_is_refused_not_started_twice(host):
    """Case 3: the orphan still serves the GPU; a second daemon on it would break both."""
    host.run([{'name': 'train', 'devices': [0]}])
    orphan = inspect(resource_paths(host.root, 'train')).pid
    shutil.rmtree(host.root)
    with pytest.raises(MpsError, match=r'orphaned MPS control daemon.*pid %d, pipe directory .*orphans=stop' % orphan):
        host.run([{'name': 'train', 'devices': [0]}])
    assert _daemon_pids(host.root) == [orphan]
    _kill(orphan)
    for _attempt in range(100):
        if not _daemon_pids(host.root):
            break
        time.sleep(0.05)
    assert host.run([{'name': 'train', 'devices': [0]}]).ready


# A child process runs the host's plan and is sent SIGKILL by itself once the first ``kill_at`` changes have had their side
# effects: no ``finally``, no undo, no lock release but the kernel's - what kill -9 leaves.
_DYING_RUN = r"""
import ctypes, json, os, signal, sys
import pynvml
pynvml.nvmlLib = ctypes.CDLL(sys.argv[1])
from ansible_collections.gpufleet.mps.plugins.module_utils import _gpus
from ansible_collections.gpufleet.mps.plugins.module_utils import _execute
from ansible_collections.gpufleet.mps.plugins.module_utils._host.manager import HostManager
from ansible_collections.gpufleet.mps.plugins.module_utils._module import control_binary
params, kill_at = json.loads(sys.argv[2]), int(sys.argv[3])
real_execute = _execute.execute
def dying(out):
    steps = out.steps
    changes = [index for index, (change, _run) in enumerate(steps) if change is not None]
    out.steps = steps[:changes[kill_at]]
    real_execute(out)
    os.kill(os.getpid(), signal.SIGKILL)
_execute.execute = dying
with _gpus.Nvml() as nvml:
    HostManager(params, nvml, control_binary, check_mode=False).ensure(nvml.gpus())
"""


def test_a_run_sent_sigkill_at_each_change_is_converged_by_the_next_run(host, nvml_lib):
    """Case 4 and the fault test, with kill -9 for real: a child process applies a multi-resource change and is sent
    SIGKILL after each change of it in turn; no ready mark stands over a down resource, no daemon is duplicated, and the
    next run converges."""
    first = [{'name': 'train', 'devices': [0, 1]}, {'name': 'infer', 'devices': [2]}]
    second = [{'name': 'train', 'devices': [0]}, {'name': 'tune', 'devices': [1]}, {'name': 'infer', 'devices': [2, 3]}]
    host.run(first)
    count = len(host.run(second, check=True).changes)
    assert count > 8
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    for kill_at in range(count):
        host.run(first)
        params = dict(host.params, resources=second)
        child = subprocess.run([sys.executable, '-c', _DYING_RUN, str(nvml_lib), json.dumps(params), str(kill_at)],
                               env=env, capture_output=True, text=True, timeout=120, check=False)
        assert child.returncode == -signal.SIGKILL, (kill_at, child.stderr[-2000:])
        down = [name for name in ('train', 'tune', 'infer') if os.path.isdir(resource_paths(host.root, name).resource_dir)
                and not inspect(resource_paths(host.root, name)).running]
        assert not (host.ready and down), 'killed after %d change(s): ready over %s' % (kill_at, down)
        converged = host.run(second)
        assert converged.ready and host.ready
        assert host.run(second, check=True).changes == []
        assert len(_daemon_pids(host.root)) == 3, 'killed after %d change(s): %s' % (kill_at, _daemon_pids(host.root))


def test_two_runs_at_once_both_succeed_and_the_second_finds_nothing_to_do(host):
    """Case 5."""
    resources = [{'name': 'train', 'devices': [0, 1]}, {'name': 'infer', 'devices': [2]}]
    results, errors = [], []

    def one():
        try:
            results.append(host.run(resources))
        except MpsError as exc:  # pragma: no cover - the failure the test is about
            errors.append(exc.msg)
    threads = [threading.Thread(target=one) for _run in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == [] and len(results) == 2
    assert sorted(out.changed for out in results) == [False, True]
    assert len(_daemon_pids(host.root)) == 2


def test_a_size_the_daemon_reads_back_otherwise_is_no_change_in_the_diff(host):
    """Case 6: 10G is set as 10240M and read back as 10G."""
    resources = [{'name': 'train', 'devices': [0], 'pinned_device_mem_limit': '10G', 'active_thread_percentage': 30}]
    host.run(resources)
    out = host.run(resources, check=True)
    diff = out.resources[0]['diff']
    assert not out.changed and diff['before'] == diff['after'], diff


def test_busy_wait_timing_out_changes_nothing_and_says_restart(host):
    """Case 8."""
    host.run([{'name': 'train', 'devices': [0]}])
    host.client('train')
    with pytest.raises(MpsError) as caught:
        host.run([{'name': 'train', 'devices': [1]}], busy='wait', busy_timeout=1)
    message = caught.value.msg
    assert 'the restart (devices:' in message and 'the the' not in message and 'not done' in message
    assert host.ready and inspect(resource_paths(host.root, 'train')).running


def test_a_control_binary_that_fails_keeps_the_ready_mark(host):
    """Case 9: a bad binary is bad input, not an unhealthy daemon."""
    host.run([{'name': 'train', 'devices': [0]}])
    with pytest.raises(MpsError):
        host.run([{'name': 'train', 'devices': [0]}], control_binary='/bin/false')
    assert host.ready


def test_an_empty_list_is_not_ready_in_the_file_and_the_facts(host):
    """Case 10."""
    host.run([{'name': 'train', 'devices': [0]}])
    out = host.run([])
    assert not host.ready and out.ready is False and out.facts['ready'] is False
    assert [change.resource for change in out.changes][0] == 'host'


def test_a_failed_start_puts_compute_modes_and_limits_back_and_names_files_that_exist(host):
    """Case 11: the simulator refuses to start (a pipe directory beyond what it accepts)."""
    (host.base / 'host' / 'mps.env').write_text('export FAKE_MPS_PIPE_DIR_MAX=10\n')
    with pytest.raises(MpsError) as caught:
        host.run([{'name': 'train', 'devices': [0], 'active_thread_percentage': 50}])
    assert host.compute_modes() == ['default'] * 4
    assert not os.path.exists(str(host.base / 'etc' / 'train.limits.json'))
    assert 'undone:' in caught.value.msg and not host.ready
    for word in caught.value.msg.split():
        if word.endswith('control.log'):
            assert os.path.exists(word) or word + ' - which does not exist' in caught.value.msg, caught.value.msg


def test_the_mig_re_create_warning_says_the_daemon_restarts_on_the_new_instance(host):
    """Case 7: the stop of a restart onto a new MIG instance is no plain stop."""
    with _gpus.Nvml() as nvml:
        gpus = nvml.gpus()
    host.run([{'name': 'train', 'devices': [0]}])
    paths = resource_paths(host.root, 'train')
    record = json.loads(open(paths.started_file, encoding='utf-8').read())
    record['devices'] = ['MIG-00000000-0000-0000-0000-000000000000']
    with open(paths.started_file, 'w', encoding='utf-8') as handle:
        json.dump(record, handle)
    out = host.run([{'name': 'train', 'devices': [0]}])
    warning = [w for w in out.warnings if 'no longer exists' in w]
    assert warning and 'The daemon restarts on GPU 0' in warning[0] and 'To serve the new instance' not in warning[0], out.warnings
    assert gpus[0].uuid in [device['uuid'] for device in out.resources[0]['devices']]


def test_check_mode_creates_nothing_not_even_a_lock(host):
    out = host.run([{'name': 'train', 'devices': [0]}], check=True)
    assert out.changed and not os.path.exists(host.root) and not os.path.exists(str(host.base / 'etc'))
    assert not os.path.exists(str(host.base / 'facts.d'))
    assert sys.executable  # the run used this interpreter's NVML session only


def test_two_runs_with_different_requests_both_apply_one_after_the_other(host):
    """The second waits for the host lock, observes what the first left, and applies its own request."""
    first = [{'name': 'train', 'devices': [0, 1]}]
    second = [{'name': 'train', 'devices': [0]}, {'name': 'infer', 'devices': [1, 2]}]
    results, errors = {}, []

    def one(key, resources):
        try:
            results[key] = host.run(resources)
        except MpsError as exc:  # pragma: no cover - the failure the test is about
            errors.append(exc.msg)
    threads = [threading.Thread(target=one, args=item) for item in (('first', first), ('second', second))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == [] and results['first'].changed and results['second'].changed
    last = host.run(first, check=True).changes == [] and 'first' or host.run(second, check=True).changes == [] and 'second'
    assert last in ('first', 'second') and host.ready


def test_orphans_stop_ends_the_orphan_first_then_provisions(host, decide_guard):
    """The explicit option: the orphan is ended as the plan's own change, and the resource starts on its GPU."""
    host.run([{'name': 'train', 'devices': [0]}])
    orphan = inspect(resource_paths(host.root, 'train')).pid
    shutil.rmtree(host.root)
    planned = host.run([{'name': 'train', 'devices': [0]}], check=True, orphans='stop')
    assert planned.changes[0].action == 'end the orphaned MPS control daemon (pid %d)' % orphan
    assert planned.changes[0].resource == 'train' and planned.changes[0].kind == 'stop'
    out = host.run([{'name': 'train', 'devices': [0]}], orphans='stop')
    assert [change.as_dict() for change in out.executed] == _listed(planned)
    assert out.ready and _daemon_pids(host.root) == [inspect(resource_paths(host.root, 'train')).pid] != [orphan]
    assert decide_guard['decisions']


def test_orphans_stop_refuses_an_orphan_with_servers_unless_busy_terminate(host, decide_guard):
    host.run([{'name': 'train', 'devices': [0]}])
    host.leave(host.client('train'))  # an idle MPS server stays, a child of the daemon
    orphan = inspect(resource_paths(host.root, 'train')).pid
    shutil.rmtree(host.root)
    with pytest.raises(MpsError, match=r'^orphans=stop: the orphaned MPS control daemon pid %d still has MPS server' % orphan):
        host.run([{'name': 'train', 'devices': [0]}], orphans='stop')
    assert _daemon_pids(host.root) == [orphan]
    out = host.run([{'name': 'train', 'devices': [0]}], orphans='stop', busy='terminate')
    assert out.ready and out.executed[0].ends_clients
    assert decide_guard['decisions']


# --- property: whatever the request, apply does what check mode showed, and deciding again finds nothing ------------
def _random_request(rng, gpus):
    """A valid request for a 4-GPU host: the GPUs dealt to up to three resources, each with limits or replicas or none."""
    names = rng.sample(['train', 'infer', 'tune', 'nvidia.com/gpu'], rng.randint(0, 3))
    owner = {index: rng.choice(names + [None]) for index in range(len(gpus))} if names else {}
    resources = []
    for name in names:
        devices = [index for index, who in owner.items() if who == name]
        if not devices:
            continue
        entry = {'name': name, 'devices': rng.sample(devices, len(devices))}
        kind = rng.choice(['none', 'limits', 'replicas'])
        if kind == 'limits':
            entry['active_thread_percentage'] = rng.choice([10, 25, 50, 100])
            entry['pinned_device_mem_limit'] = rng.choice(['2G', '10G', '7000M'])
        elif kind == 'replicas':
            entry['replicas'] = rng.choice([2, 4])
        if rng.random() < 0.3:
            entry['client_priority'] = rng.choice(['normal', 'below_normal'])
        resources.append(entry)
    return resources


def _daemon_view(root, name):
    """What the host itself shows of a resource's daemon: its pid, the GPUs in its environment, its default percentage."""
    paths = resource_paths(root, name)
    state = inspect(paths)
    if not state.running:
        return None
    with open('/proc/%d/environ' % state.pid, 'rb') as handle:
        env = dict(item.split(b'=', 1) for item in handle.read().split(b'\0') if b'=' in item)
    return env.get(b'CUDA_VISIBLE_DEVICES', b'').decode().split(',')


SETTINGS = [('none', False), ('none', True), ('systemd', False), ('systemd', True)]


@pytest.mark.parametrize('supervisor, shm', SETTINGS, ids=['%s%s' % (sup, ', shm' if shm else '') for sup, shm in SETTINGS])
@pytest.mark.parametrize('seed', [1, 2, 3])
def test_any_sequence_of_requests_applies_as_planned_and_leaves_nothing_to_decide(host, seed, decide_guard, supervisor, shm, request):
    """A property over seeded random requests, for every supervisor and with the shared tmpfs or without: check mode lists
    what the real run executes, change by change; the host observed afterwards has exactly the listed daemons on exactly
    their GPUs; deciding again yields no change; and no decision opened, listed, stat-ed, started or connected to
    anything (decide_guard makes that raise)."""
    import random  # pylint: disable=import-outside-toplevel
    _settings(host, request, supervisor, shm)
    rng = random.Random(seed)
    uuids = host.uuids()
    for _step in range(4):
        resources = _random_request(rng, uuids)
        applied = _check_then_apply(host, resources)
        listed = {res['name'] for res in resources}
        for res in resources:
            assert _daemon_view(host.root, res['name']) == [uuids[index] for index in res['devices']], (seed, resources)
        # A removed resource keeps its logs, nothing else: no pipe directory, no start record.
        leftovers = [name for name in ('train', 'infer', 'tune', 'nvidia.com/gpu') if name not in listed and (
            os.path.exists(resource_paths(host.root, name).pipe_dir) or os.path.exists(resource_paths(host.root, name).started_file))]
        assert leftovers == [], (seed, resources, leftovers)
        assert len(_daemon_pids(host.root)) == len(resources)
        assert applied.ready == bool(resources) == host.ready
    assert decide_guard['decisions']


def _settings(host, request, supervisor, shm):
    """The host's runs under ``supervisor`` (systemd: the fake systemctl runs the collection's units), with the shared tmpfs
    (mounted by the runs themselves, persisted nowhere) or without."""
    if supervisor == 'systemd':
        request.getfixturevalue('fake_systemd')
    if shm and os.geteuid() != 0:
        pytest.skip('the shared tmpfs needs root (mount, and a mount namespace per daemon)')
    host.params.update(supervisor=supervisor, shm=shm)


@pytest.mark.parametrize('supervisor, shm', SETTINGS, ids=['%s%s' % (sup, ', shm' if shm else '') for sup, shm in SETTINGS])
def test_a_decision_is_the_same_when_the_host_is_torn_down_after_the_view_was_read(host, supervisor, shm, request):
    """Decide is a function of the view: with every daemon killed, every file and directory of the root and the config
    directory removed after the view was read, the same view gives the same changes, reasons and warnings."""
    _settings(host, request, supervisor, shm)
    host.run([{'name': 'train', 'devices': [0, 1], 'replicas': 2}, {'name': 'infer', 'devices': [2]}])
    wanted = [{'name': 'train', 'devices': [0]}, {'name': 'tune', 'devices': [1], 'active_thread_percentage': 40}]
    params = dict(host.params, resources=wanted)
    with _gpus.Nvml() as nvml:
        manager = HostManager(params, nvml, control_binary, check_mode=True, unit_dir=host.unit_dir)
        listed = manager.validate(nvml.gpus())
        removed = manager.observe(listed)
        view = manager.view
        first = manager.decide(manager.validate(nvml.gpus()), manager.removed_setups(view, listed), view)
        for pid in _daemon_pids(host.root):
            _kill(pid)
        subprocess.run(['umount', '-l', os.path.join(host.root, 'shm')], capture_output=True, check=False)
        shutil.rmtree(host.root)
        shutil.rmtree(host.params['config_dir'])
        again = HostManager(params, nvml, control_binary, check_mode=True, unit_dir=host.unit_dir)
        second = again.decide(again.validate(nvml.gpus()), again.removed_setups(view, listed), view)
    assert removed and [change.as_dict() for change in second.changes] == [change.as_dict() for change in first.changes]
    assert second.warnings == first.warnings and first.changes


def test_a_no_op_observes_each_resource_once(host, monkeypatch):
    """Observe once: a run that changes nothing inspects each resource's daemon once and reads its start record once
    (the result included), whatever the plan's parts (limits, daemon, result) ask of it, and scans /proc for control
    daemons once for the whole host (it was once per resource: on a node with thousands of processes, that adds up)."""
    resources = [{'name': 'train', 'devices': [0, 1], 'replicas': 2}, {'name': 'infer', 'devices': [2]}]
    host.run(resources)
    from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor import liveness  # pylint: disable=import-outside-toplevel
    from ansible_collections.gpufleet.mps.plugins.module_utils._observe import reader  # pylint: disable=import-outside-toplevel
    calls = {'inspect': [], '_resource_view': []}

    def counted(module, name):
        real = getattr(module, name)

        def wrapper(*args, **kwargs):
            calls[name].append(getattr(args[-2 if name == '_resource_view' else 0], 'name', 'host') if args else 'host')
            return real(*args, **kwargs)
        return wrapper
    from ansible_collections.gpufleet.mps.plugins.module_utils import _proc  # pylint: disable=import-outside-toplevel
    calls['control_daemons'] = []
    for module, name in ((liveness, 'inspect'), (reader, '_resource_view'), (_proc, 'control_daemons')):
        real, wrapper = getattr(module, name), counted(module, name)
        for loaded in list(sys.modules.values()):
            if getattr(loaded, '__name__', '').startswith('ansible_collections.gpufleet.mps') and getattr(loaded, name, None) is real:
                monkeypatch.setattr(loaded, name, wrapper)
    for check in (True, False):
        for found in calls.values():
            found.clear()
        out = host.run(resources, check=check)
        assert not out.changed
        assert sorted(calls['inspect']) == ['infer', 'train'], (check, calls)
        assert sorted(calls['_resource_view']) == ['infer', 'train'], (check, calls)  # the start record parsed once
        assert len(calls['control_daemons']) == 1, (check, calls)  # one /proc scan for the whole host


def test_a_teardown_says_once_what_it_kept(host):
    """Each removed resource finds the same foreign file in the root: the host's run says it once."""
    host.run([{'name': 'train', 'devices': [0]}, {'name': 'infer', 'devices': [1]}])
    with open(os.path.join(host.root, 'other-tool.state'), 'w') as handle:
        handle.write('theirs\n')
    out = host.run([], state='absent')
    kept = [warning for warning in out.warnings if warning.startswith('state=absent kept %s:' % host.root)]
    assert len(kept) == 1, out.warnings
    assert os.path.exists(os.path.join(host.root, 'other-tool.state'))


@pytest.mark.parametrize('steps', SCENARIOS.values(), ids=list(SCENARIOS))
def test_deciding_reads_starts_and_changes_nothing_beyond_what_was_observed(host, decide_guard, steps):
    """Observe, then decide: every file, process and daemon answer the plan needs is read by HostManager.observe; the
    decision itself - check mode and real run, every scenario and the teardown - opens, lists, starts and changes
    nothing."""
    for resources in steps:
        _check_then_apply(host, resources)
    _check_then_apply(host, [], state='absent')
    assert decide_guard['decisions'] >= 3 * (len(steps) + 1)


def test_deciding_about_busy_clients_uses_what_was_observed(host, decide_guard):
    """A restart with a client connected: the clients come from the observed control batch, the wait runs live."""
    host.run([{'name': 'train', 'devices': [0]}])
    client = host.client('train')
    planned = host.run([{'name': 'train', 'devices': [1]}], check=True, busy='wait', busy_timeout=1)
    assert planned.changes[0].kind == 'wait' and str(client.pid) in planned.changes[0].action
    assert decide_guard['decisions']


# --- client priority (issue 29) ------------------------------------------------------------------------------------
def _ask(host, name, command):
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=resource_paths(host.root, name).pipe_dir)
    return subprocess.run([host.binary], input=command + '\n', capture_output=True, text=True, env=env, timeout=30,
                          check=True).stdout.strip()


def test_a_client_priority_is_set_replayed_reported_and_taken_back_declaratively(host, sim_clients):
    entry = {'name': 'train', 'devices': [0], 'client_priority': 'below_normal'}
    _check_then_apply(host, [entry])
    assert _ask(host, 'train', 'get_default_client_priority') == '1'
    # the start replayed it (the commands file): a client gets below-normal priority from the first server on
    _proc, reply = sim_clients(resource_paths(host.root, 'train').pipe_dir)
    assert reply['client_priority'] == 1
    facts = json.loads((host.base / 'facts.d' / 'gpufleet_mps.fact').read_text())
    assert facts['resources'][0]['client_priority'] == 'below_normal'
    # the daemon forgot it (set by hand): the next run sets it again, under the same plan check mode showed
    _ask(host, 'train', 'set_default_client_priority 0')
    again = _check_then_apply(host, [entry])
    assert [change.action for change in again.executed] == ['apply set_default_client_priority 1'], _listed(again)
    # no longer given: back to normal (MPS's default), as a percentage not given goes back to 100
    _check_then_apply(host, [{'name': 'train', 'devices': [0]}])
    assert _ask(host, 'train', 'get_default_client_priority') == '0'
    assert json.loads((host.base / 'facts.d' / 'gpufleet_mps.fact').read_text())['resources'][0]['client_priority'] is None


@pytest.mark.parametrize('running', [True, False], ids=['daemon running', 'first start'])
def test_a_binary_without_client_priority_is_refused_before_anything_changes(host, running):
    (host.base / 'host' / 'mps.env').write_text('export FAKE_MPS_CLIENT_PRIORITY=missing\n')
    if running:
        host.run([{'name': 'train', 'devices': [0]}])
    before = sorted(_daemon_pids(host.root))
    with pytest.raises(InvalidParameterError) as caught:
        host.run([{'name': 'train', 'devices': [0], 'client_priority': 'below_normal'}])
    assert 'client_priority' in str(caught.value), caught.value
    assert 'has no client priority' in str(caught.value)
    assert ('answered' if running else 'help text') in str(caught.value)
    assert sorted(_daemon_pids(host.root)) == before


# --- driver upgrades (issue 29) -------------------------------------------------------------------------------------
def _set_driver(version):
    path = os.environ['FAKE_NVML_CONFIG']
    with open(path, encoding='utf-8') as handle:
        text = handle.read()
    with open(path, 'w', encoding='utf-8') as handle:
        handle.write(re.sub(r'(?m)^driver_version\s*=.*$', 'driver_version = %s' % version, text))


def test_a_driver_upgrade_restarts_the_daemon_under_the_busy_policy_with_the_reason(host, sim_clients):
    resources = [{'name': 'train', 'devices': [0]}, {'name': 'infer', 'devices': [1]}]
    host.run(resources)
    old = _record(host.root, 'train').driver_version
    assert old
    _set_driver('590.44.01')
    client, _reply = sim_clients(resource_paths(host.root, 'infer').pipe_dir)
    # a client on infer: refused (busy=refuse), nothing changed, the reason named
    with pytest.raises(MpsError) as caught:
        host.run(resources)
    assert 'infer' in str(caught.value) and str(client.pid) in str(caught.value), caught.value
    assert _record(host.root, 'infer').driver_version == old  # not restarted
    host.leave(client)
    planned = host.run(resources, check=True)
    restarts = [change for change in _listed(planned) if change['kind'] == 'restart']
    assert sorted(change['resource'] for change in restarts) == ['infer', 'train'], _listed(planned)
    assert all('started under driver %s and NVML now reports 590.44.01' % old in change['action'] for change in restarts), restarts
    _check_then_apply(host, resources)
    assert _record(host.root, 'train').driver_version == '590.44.01'


# --- the Slurm hook (issue 28) ----------------------------------------------------------------------------------------
def test_the_slurm_hook_writes_its_files_and_never_touches_a_site_s_own(host):
    prolog, gres = str(host.base / 'slurm' / 'prolog.sh'), str(host.base / 'slurm' / 'gres.conf')
    options = dict(slurm_task_prolog=prolog, slurm_gres_conf=gres, slurm_device_dir='/dev')
    resources = [{'name': 'gpu0', 'devices': [0]}, {'name': 'pair', 'devices': [2, 1]}]
    applied = _check_then_apply(host, resources, slurm_hook=True, **options)
    assert {change.action for change in applied.executed} >= {'write %s' % prolog, 'write %s' % gres}
    text = open(gres, encoding='utf-8').read()
    assert 'Name=mps Count=100 File=/dev/nvidia2' in text and 'Name=gpu File=/dev/nvidia3' not in text
    assert os.stat(prolog).st_mode & 0o777 == 0o755
    # no longer wanted: both go (they are ours)
    _check_then_apply(host, resources, slurm_hook=False, **options)
    assert not os.path.exists(prolog) and not os.path.exists(gres)
    # a gres.conf of the site's own is neither overwritten nor removed
    with open(gres, 'w', encoding='utf-8') as handle:
        handle.write('Name=gpu File=/dev/nvidia0\n')
    with pytest.raises(InvalidParameterError, match='slurm_gres_conf.*not written by this collection'):
        host.run(resources, slurm_hook=True, **options)
    assert not os.path.exists(prolog)  # refused before anything was written
    _check_then_apply(host, resources, slurm_hook=False, **options)
    assert open(gres, encoding='utf-8').read() == 'Name=gpu File=/dev/nvidia0\n'


# --- per-client slices (issue 29) ---------------------------------------------------------------------------------
def test_a_client_that_sets_its_slice_gets_it_from_a_daemon_that_hands_out_more(host):
    from ansible_collections.gpufleet.mps.plugins.module_utils._info import Collector, InfoRequest  # pylint: disable=import-outside-toplevel
    host.run([{'name': 'train', 'devices': [0], 'replicas': 2}])
    request = InfoRequest.validate(host.root, host.params['config_dir'], None, ['daemons'], host.binary, 10, '/mps', 4)
    (daemon,) = Collector(request).collect().facts['daemons']
    total = [gpu['memory_total_mib'] for gpu in _gpu_facts() if gpu['uuid'] == daemon['devices'][0]['uuid']][0]
    assert daemon['container']['slice'] == {'slices': 4, 'env': {
        'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE': '25.0', 'CUDA_MPS_PINNED_DEVICE_MEM_LIMIT': '0=%dM' % (total // 4)}}
    # a client (a container, a pod) with that environment gets a quarter of the GPU from the daemon's half
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=daemon['pipe_dir'], **daemon['container']['slice']['env'])
    proc = subprocess.run([str(host.base / 'host' / 'bin' / 'mps-sim-client'), '--once'], env=env, capture_output=True, text=True,
                          timeout=60, check=True)
    reply = json.loads(proc.stdout.splitlines()[0])
    assert reply['active_thread_percentage'] == 25.0 and reply['pinned_mem_limit_mib'] == {'0': total // 4}, reply


def _gpu_facts():
    with _gpus.Nvml() as nvml:
        return [gpu.facts() for gpu in nvml.gpus()]


# --- static SM partitions (issue 29; the simulator's, inferred from NVIDIA's documentation) ---------------------------
def _set_cuda(version):
    path = os.environ['FAKE_NVML_CONFIG']
    with open(path, encoding='utf-8') as handle:
        text = handle.read()
    with open(path, 'w', encoding='utf-8') as handle:
        handle.write(re.sub(r'(?m)^cuda_driver_version\s*=.*$', 'cuda_driver_version = %s' % version, text))


def _partitions(host, name):
    """lspart's partition rows of the resource's daemon: (partial UUID, id, chunks)."""
    rows = [line.split() for line in _ask(host, name, 'lspart').splitlines()[2:]]
    return sorted((row[0], row[1], int(row[2])) for row in rows if len(row) == 5 and not row[1].isdigit())


def _partition_client(host, name, value):
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=resource_paths(host.root, name).pipe_dir)
    if value is not None:
        env['CUDA_MPS_SM_PARTITION'] = value
    proc = subprocess.Popen([str(host.base / 'host' / 'bin' / 'mps-sim-client')], env=env,  # pylint: disable=consider-using-with
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return proc, json.loads(proc.stdout.readline())


def test_sm_partitions_are_created_at_the_start_resized_in_place_and_left_with_a_restart(host, decide_guard):
    _set_cuda('13010')
    entry = {'name': 'train', 'devices': [0], 'sm_partitions': [8, 4]}
    _check_then_apply(host, [entry])
    assert _record(host.root, 'train').static_partitioning is True
    assert sorted(chunks for _gpu, _id, chunks in _partitions(host, 'train')) == [4, 8]
    facts = json.loads((host.base / 'facts.d' / 'gpufleet_mps.fact').read_text())
    assert facts['resources'][0]['sm_partitions'] == [8, 4]
    # a client names its partition; one that names none cannot create its context on a -S daemon
    value = next('%s/%s' % (host.uuids()[0], ident) for _gpu, ident, chunks in _partitions(host, 'train') if chunks == 4)
    client, reply = _partition_client(host, 'train', value)
    assert reply['ok'] and reply['sms'] == 32, reply
    _bare, refused = _partition_client(host, 'train', None)
    assert refused['error'] == 'CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION'
    # resized in place: one more partition is one sm_partition add, the daemon and its client untouched
    pid = _record(host.root, 'train').pid
    grown = _check_then_apply(host, [dict(entry, sm_partitions=[8, 4, 2])])
    assert [change.action for change in grown.executed if change.kind == 'limits'] == [
        'apply sm_partition add %s 2' % host.uuids()[0]], _listed(grown)
    assert _record(host.root, 'train').pid == pid and client.poll() is None
    # the partition with the client is no longer listed: refused before anything changes
    with pytest.raises(MpsError, match=r'sm_partitions: %s \(4 chunks\) of train has clients' % re.escape(value)):
        host.run([dict(entry, sm_partitions=[8, 2])])
    assert len(_partitions(host, 'train')) == 3
    host.leave(client)
    shrunk = _check_then_apply(host, [dict(entry, sm_partitions=[8, 2])])
    assert [change.action for change in shrunk.executed if change.kind == 'limits'] == [
        'apply sm_partition rm %s %s' % (host.uuids()[0], value.split('/', 1)[1])], _listed(shrunk)
    # none wanted: the daemon leaves static partitioning, which only a restart does
    plain = _check_then_apply(host, [{'name': 'train', 'devices': [0]}])
    assert [change.kind for change in plain.executed if change.resource == 'train'].count('restart') == 1, _listed(plain)
    assert _record(host.root, 'train').static_partitioning is False
    assert 'not enabled' in _ask(host, 'train', 'lspart')
    # every decision read only what its observe stage had (lspart in the daemon's one batch)
    assert decide_guard['decisions']


def test_sm_partitions_for_a_daemon_started_without_s_restart_it_with_the_reason(host):
    _set_cuda('13010')
    host.run([{'name': 'train', 'devices': [0]}])
    planned = host.run([{'name': 'train', 'devices': [0], 'sm_partitions': [6]}], check=True)
    restarts = [change for change in _listed(planned) if change['kind'] == 'restart']
    assert len(restarts) == 1 and 'static SM partitioning (-S): off -> on' in restarts[0]['action'], _listed(planned)
    _check_then_apply(host, [{'name': 'train', 'devices': [0], 'sm_partitions': [6]}])
    assert [chunks for _gpu, _id, chunks in _partitions(host, 'train')] == [6]


def test_a_static_daemon_whose_start_record_is_gone_is_known_by_its_arguments(host):
    """/run is empty after a boot while the daemon runs again with -S (systemd, from the limits environment file): its
    limits are read from its arguments - its partitions as they are, no restart asked for them, nothing sent."""
    from ansible_collections.gpufleet.mps.plugins.module_utils._limits.manager import LimitsManager  # pylint: disable=import-outside-toplevel
    from ansible_collections.gpufleet.mps.plugins.module_utils._resource.layout import config_paths  # pylint: disable=import-outside-toplevel
    from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.process import Daemon  # pylint: disable=import-outside-toplevel
    _set_cuda('13010')
    host.run([{'name': 'train', 'devices': [0], 'sm_partitions': [4]}])
    paths = resource_paths(host.root, 'train')
    os.remove(paths.started_file)
    with _gpus.Nvml() as nvml:
        daemon = Daemon(paths, host.binary, start_timeout=10, stop_timeout=0)
        manager = LimitsManager(paths, config_paths(host.params['config_dir'], 'train'), daemon, nvml.gpus(), check_mode=True, sm_partitions=[4])
        out = manager.ensure(None, None, None, 'ignore', persist_limits=True, create=False)
    assert out.restart_needed == '' and out.commands == [] and not out.changed, out
    assert [part['chunks'] for part in out.sm_partitions] == [4]


@pytest.mark.parametrize('running', [True, False], ids=['daemon running', 'first start'])
def test_a_binary_without_static_partitioning_is_refused_before_anything_changes(host, running, decide_guard):
    _set_cuda('13000')  # r580: no -S, no sm_partition (gpu-evidence probe2.txt)
    if running:
        host.run([{'name': 'train', 'devices': [0]}])
    before = sorted(_daemon_pids(host.root))
    with pytest.raises(InvalidParameterError) as caught:
        host.run([{'name': 'train', 'devices': [0], 'sm_partitions': [4]}])
    assert caught.value.param == 'resources[train].sm_partitions' and 'lists no sm_partition' in str(caught.value), caught.value
    assert sorted(_daemon_pids(host.root)) == before
    assert decide_guard['decisions']  # the help text was read in the observe stage: the decision raised no I/O


def test_sm_partitions_on_a_gpu_older_than_ampere_or_over_its_chunks_are_refused(host):
    _set_cuda('13010')
    host.run([{'name': 'train', 'devices': [0], 'sm_partitions': [8]}])
    # a running -S daemon says how many chunks each GPU has (lspart): H100, 132 SMs in chunks of 8
    with pytest.raises(InvalidParameterError, match=r'more chunks than the GPU has: GPU-\S+ has 16 chunks \(128 SMs\), 17 wanted'):
        host.run([{'name': 'train', 'devices': [0], 'sm_partitions': [8, 8, 1]}])
    assert [chunks for _gpu, _id, chunks in _partitions(host, 'train')] == [8]
    old = host.uuids()[0]
    with open(os.environ['FAKE_NVML_CONFIG'], encoding='utf-8') as handle:
        text = handle.read()
    with open(os.environ['FAKE_NVML_CONFIG'], 'w', encoding='utf-8') as handle:
        handle.write(text.replace('compute_capability = 9.0', 'compute_capability = 7.0'))
    with pytest.raises(InvalidParameterError, match=r'sm_partitions: static SM partitions need Ampere .* is older'):
        host.run([{'name': 'infer', 'devices': [1], 'sm_partitions': [2]}])
    assert old == host.uuids()[0]


def test_the_health_timer_is_paused_while_a_run_brings_daemons_down_and_stopped_first_at_teardown(host, request, monkeypatch):
    """Where systemd runs the daemons, a check the timer started before a restart (or a teardown) would write the ready
    mark back after the run withdrew it: the run stops the timer and its check first and starts the timer after the
    daemons answer again; check mode lists the same changes."""
    from ansible_collections.gpufleet.mps.plugins.module_utils._host import around, manager
    from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.health import render_health
    _settings(host, request, 'systemd', False)
    monkeypatch.setattr(manager, 'systemd_is_pid1', lambda: True)
    script = str(host.base / 'sbin' / 'gpufleet-mps-health')  # never the host's /usr/local/sbin
    monkeypatch.setattr(around.Around, '_health_files', lambda self: render_health(
        self.root, self.config_dir, self.unit_dir, self.params['health_interval'], self.params['health_timeout'], script=script))
    timer = 'gpufleet-mps-health.timer'
    host.run([{'name': 'train', 'devices': [0]}])
    assert host.ready
    calls = host.base / 'systemd' / 'calls'
    calls.write_text('')
    planned = _listed(host.run([{'name': 'train', 'devices': [0, 1]}], check=True))
    done = _listed(host.run([{'name': 'train', 'devices': [0, 1]}]))
    assert planned == done
    actions = [change['action'] for change in done]
    pause, withdraw = actions.index('stop %s' % timer), actions.index('remove %s/.ready' % host.root)
    down = next(index for index, change in enumerate(done) if change['kind'] in ('stop', 'restart'))
    assert pause < withdraw < down < actions.index('start %s' % timer) < actions.index('write %s/.ready' % host.root), actions
    assert 'stop gpufleet-mps-health.timer\nstop gpufleet-mps-health.service\n' in calls.read_text()
    assert host.ready
    # a run that brings nothing down leaves the timer alone
    calls.write_text('')
    assert not host.run([{'name': 'train', 'devices': [0, 1]}]).changes
    assert [line for line in calls.read_text().splitlines() if line.split(' ')[0] != 'show'] == []  # read, nothing else
    done = _listed(host.run([], state='absent'))
    assert done[0]['action'] == 'stop and disable %s' % timer, done
    assert 'stop gpufleet-mps-health.timer\nstop gpufleet-mps-health.service\ndisable gpufleet-mps-health.timer\n' in calls.read_text()
    assert not host.ready and not os.path.exists(script)
