# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The faults issue 40 found at the seams of mps_host and the per-resource modules, each a test named by the behaviour a
user expects.

Every test runs the modules the way Ansible does (the ``host`` fixture, conftest.py) and imports nothing of the
collection: each fails on 4e9c7f4, the main branch before one view, one record and one executor.
"""
from __future__ import annotations

import json
import os
import shutil

import pynvml
import pytest

EXCLUSIVE = pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
DEFAULT = pynvml.NVML_COMPUTEMODE_DEFAULT


def _read(path):
    with open(path, encoding='utf-8') as handle:
        return handle.read()


# --- 1. an orphan is stopped as any resource is: its GPUs get their compute mode back ------------------------------
def test_a_teardown_that_ends_orphaned_daemons_gives_their_gpus_their_compute_mode_back(host):
    host.ok([{'name': 'train', 'devices': [0, 1]}, {'name': 'infer', 'devices': [2, 3]}])
    assert host.compute_modes() == [EXCLUSIVE] * 4
    shutil.rmtree(host.root)
    result = host.ok([], state='absent', orphans='stop', busy='terminate')
    assert result['changed'] and host.daemons() == {}
    assert host.compute_modes() == [DEFAULT] * 4
    assert not host.ok([], state='absent')['changed']


def test_ending_the_orphan_of_a_resource_no_longer_listed_gives_its_gpu_back(host):
    host.ok([{'name': 'a', 'devices': [0]}, {'name': 'b', 'devices': [1]}])
    shutil.rmtree(os.path.join(host.root, 'b'))
    host.ok([{'name': 'a', 'devices': [0]}], orphans='stop')
    assert sorted(host.daemons().values()) == ['a']
    assert host.compute_modes() == [EXCLUSIVE, DEFAULT, DEFAULT, DEFAULT]
    assert not host.ok([{'name': 'a', 'devices': [0]}])['changed']


# --- 2. and 5. every orphan of the root is found, named, and refused unless orphans=stop ---------------------------
def test_an_orphan_that_no_listed_resource_needs_is_refused_naming_it_and_the_option(host):
    resources = [{'name': 'a', 'devices': [0]}, {'name': 'b', 'devices': [1]}]
    host.ok(resources + [{'name': 'c', 'devices': [2, 3]}])
    orphan = next(pid for pid, name in host.daemons().items() if name == 'c')
    shutil.rmtree(os.path.join(host.root, 'c'))
    for check in (True, False):
        result = host.run(resources, check=check)
        assert result.get('failed'), result
        assert 'pid %d' % orphan in result['msg'] and host.pipe('c') in result['msg'] and 'orphans=stop' in result['msg'], result['msg']
    assert orphan in host.daemons()
    stopped = host.ok(resources, orphans='stop')
    assert stopped['changed'] and orphan not in host.daemons() and host.ready
    assert host.compute_modes() == [EXCLUSIVE, EXCLUSIVE, DEFAULT, DEFAULT]
    assert not host.ok(resources)['changed']


def test_a_listed_resource_whose_daemon_was_orphaned_withdraws_the_ready_mark_and_names_every_orphan(host):
    resources = [{'name': 'a', 'devices': [0]}, {'name': 'b', 'devices': [1]}]
    host.ok(resources)
    assert host.ready
    orphans = sorted(host.daemons())
    shutil.rmtree(os.path.join(host.root, 'a'))
    shutil.rmtree(os.path.join(host.root, 'b'))
    os.makedirs(host.root, exist_ok=True)
    open(os.path.join(host.root, '.ready'), 'w', encoding='utf-8').close()
    result = host.run(resources)
    assert result.get('failed')
    for pid in orphans:
        assert 'pid %d' % pid in result['msg'], result['msg']
    assert 'orphans=stop' in result['msg'] and 'quit' not in result['msg'], result['msg']
    assert not host.ready, 'a and b no longer answer: the ready mark over them must go'


# --- 3. one record per resource: every derived file rendered from it ------------------------------------------------
def test_limits_changed_while_the_daemon_is_stopped_leave_no_stale_replay(host):
    host.module('mps_daemon', name='train', devices=[0, 1])
    assert not host.module('mps_limits', name='train', replicas=2).get('failed')
    replay = os.path.join(host.etc, 'train.limits')
    assert '50.0' in _read(replay)
    assert not host.module('mps_daemon', name='train', state='stopped').get('failed')
    changed = host.module('mps_limits', name='train', replicas=4)
    assert changed['changed'] and not changed.get('failed'), changed
    text = _read(replay) if os.path.exists(replay) else ''
    assert '50.0' not in text and '40779M' not in text, text
    assert 'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25.0' in _read(os.path.join(host.etc, 'train.limits-env'))
    started = host.module('mps_daemon', name='train', devices=[0, 1])
    assert not started.get('failed'), started
    facts = host.module('mps_info', name='train')
    [daemon] = facts['daemons']
    assert daemon['limits']['reported']['active_thread_percentage'] == 25.0 and not daemon['limits']['differences']


def test_the_persisted_record_of_a_resource_holds_only_its_own_gpus(host):
    resources = [{'name': 'train', 'devices': [0, 1], 'replicas': 2}]
    planned = host.run(resources, check=True, diff=True)
    host.ok(resources)
    with open(os.path.join(host.etc, 'train.limits.json'), encoding='utf-8') as handle:
        record = json.load(handle)
    own = [device['uuid'] for device in planned['resources'][0]['devices']]
    assert sorted(record['pinned_device_mem_limit_mib']) == sorted(own)
    [daemon] = host.module('mps_info', name='train')['daemons']
    assert sorted(daemon['limits']['persisted']['pinned_device_mem_limit_mib']) == sorted(own)
    assert sorted(planned['resources'][0]['limits']['persisted']['pinned_device_mem_limit_mib']) == sorted(own)


def test_a_replica_count_persisted_before_the_first_start_keeps_only_the_daemons_gpus_once_it_starts(host):
    """mps_limits before the first start cannot know the resource's GPUs (the role's order): it persists a share for every
    GPU; the start that knows them keeps those of its daemon."""
    assert not host.module('mps_limits', name='train', replicas=2, create=True).get('failed')
    record = os.path.join(host.etc, 'train.limits.json')
    assert len(json.loads(_read(record))['pinned_device_mem_limit_mib']) == 4
    started = host.module('mps_daemon', name='train', devices=[1, 2])
    assert not started.get('failed'), started
    assert sorted(json.loads(_read(record))['pinned_device_mem_limit_mib']) == sorted(device['uuid'] for device in started['devices'])


# --- 4. nested names go in one run -----------------------------------------------------------------------------------
@pytest.mark.parametrize('removal', [{'state': 'absent'}, {}])
def test_nested_resources_are_removed_in_one_run(host, warnings, removal):
    host.ok([{'name': 'nv.com', 'devices': [1]}, {'name': 'nv.com/gpu', 'devices': [2]}])
    result = host.ok([], **removal)
    assert sorted(result['removed']) == ['nv.com', 'nv.com/gpu'] and host.daemons() == {}
    assert host.compute_modes() == [DEFAULT] * 4
    assert not [warning for warning in warnings(result) if 'did not create' in warning], warnings(result)
    assert not host.ok([], **removal)['changed']


# --- 6. a refused run changes nothing --------------------------------------------------------------------------------
def test_a_refused_run_does_not_create_the_root_again(host):
    host.ok([{'name': 'train', 'devices': [0]}])
    shutil.rmtree(host.root)
    result = host.run([{'name': 'train', 'devices': [0]}])
    assert result.get('failed')
    assert not os.path.exists(host.root)


# --- 7. a state path of the wrong type, or a corrupt record, is named ------------------------------------------------
@pytest.mark.parametrize('where', ['etc/train.limits.json', 'etc/train.limits', 'etc/train.limits-env', 'root/train/.started',
                                   'facts.d/gpufleet_mps.fact'])
def test_a_directory_where_a_state_file_belongs_is_refused_naming_it_and_the_repair(host, where):
    resources = [{'name': 'train', 'devices': [0], 'active_thread_percentage': 50}]
    host.ok(resources)
    path = str(host.base / where)
    os.remove(path)
    os.makedirs(path)
    for check in (True, False):
        result = host.run(resources, check=check)
        assert result.get('failed'), result
        assert path in result['msg'] and 'directory' in result['msg'] and 'Errno' not in result['msg'], result['msg']
        assert 'remove' in result['msg'], result['msg']


def test_a_directory_where_the_slurm_gres_conf_belongs_is_refused_naming_it(host):
    gres = str(host.base / 'slurm' / 'gres.conf')
    os.makedirs(gres)
    result = host.run([{'name': 'train', 'devices': [0]}], slurm_hook=True, slurm_gres_conf=gres,
                      slurm_task_prolog=str(host.base / 'slurm' / 'prolog.sh'))
    assert result.get('failed') and gres in result['msg'] and 'Errno' not in result['msg'], result['msg']
    assert host.daemons() == {}


def test_a_ready_mark_that_is_a_directory_is_refused_naming_it(host):
    host.ok([{'name': 'train', 'devices': [0]}])
    ready = os.path.join(host.root, '.ready')
    os.remove(ready)
    os.makedirs(ready)
    result = host.run([{'name': 'train', 'devices': [1]}])
    assert result.get('failed') and ready in result['msg'] and 'Errno' not in result['msg'], result['msg']
    assert list(host.daemons().values()) == ['train']


def test_a_corrupt_start_record_is_named_as_corrupt(host, warnings):
    host.ok([{'name': 'train', 'devices': [0]}])
    started = os.path.join(host.root, 'train', '.started')
    with open(started, 'w', encoding='utf-8') as handle:
        handle.write('{"devices": ["GPU-')
    result = host.run([{'name': 'train', 'devices': [0]}], check=True)
    said = ' '.join([result.get('msg', '')] + warnings(result) + result.get('actions', []))
    assert 'corrupt' in said and 'no .started record' not in said, said


# --- 8. check mode's result is the plan's ------------------------------------------------------------------------------
def test_check_mode_shows_a_resource_about_to_start_as_running(host):
    result = host.run([{'name': 'train', 'devices': [0]}], check=True)
    [item] = result['resources']
    assert item['running'] is True and item['healthy'] is True, item


def test_check_mode_says_a_restart_would_end_clients(host, warnings):
    host.ok([{'name': 'train', 'devices': [0]}])
    host.client('train')
    result = host.run([{'name': 'train', 'devices': [1]}], check=True, busy='terminate')
    said = [warning for warning in warnings(result) if 'client' in warning]
    assert said and all('would end' in warning for warning in said), said


# --- one executor: a failed change puts back what the run did -------------------------------------------------------
def _read_only_over(path):
    """``path`` made unwritable for the run (a read-only bind mount of a copy over it: renaming onto it fails, EBUSY),
    undone by the returned function. Root only, in the tests' own mount namespace (hacking/own-host.py)."""
    import subprocess  # pylint: disable=import-outside-toplevel
    shadow = path + '.shadow'
    shutil.copyfile(path, shadow)
    subprocess.run(['mount', '--bind', '-o', 'ro', shadow, path], check=True)
    return lambda: (subprocess.run(['umount', path], check=True), os.remove(shadow))


def _needs_mounts():
    if os.geteuid() != 0:
        pytest.skip('needs root to mount')


def test_a_failed_daemon_start_gives_back_the_compute_mode_and_the_files_it_wrote(host):
    assert not host.module('mps_limits', name='train', replicas=2, create=True).get('failed')
    before = {name: _read(os.path.join(host.etc, name)) for name in sorted(os.listdir(host.etc))}
    (host.base / 'host' / 'mps.env').write_text('export FAKE_MPS_PIPE_DIR_MAX=10\n')  # the simulated daemon will not start
    failed = host.module('mps_daemon', name='train', devices=[0, 1])
    assert failed.get('failed') and 'undone: ' in failed['msg'] and 'set compute mode' in failed['msg'], failed['msg']
    assert [change['action'] for change in failed['undone']], failed
    assert host.compute_modes() == [DEFAULT] * 4
    assert {name: _read(os.path.join(host.etc, name)) for name in sorted(os.listdir(host.etc))} == before
    assert not os.path.exists(os.path.join(host.root, 'train', '.started')) and host.daemons() == {}


def test_a_failed_limits_write_puts_the_record_back(host):
    _needs_mounts()
    host.module('mps_daemon', name='train', devices=[0])
    assert not host.module('mps_limits', name='train', active_thread_percentage=50).get('failed')
    record = os.path.join(host.etc, 'train.limits.json')
    before = _read(record)
    release = _read_only_over(os.path.join(host.etc, 'train.limits'))
    try:
        failed = host.module('mps_limits', name='train', active_thread_percentage=25)
    finally:
        release()
    assert failed.get('failed') and 'undone: ' in failed['msg'], failed
    assert _read(record) == before, 'the record of 50% is back: the commands file still replays 50%'


def test_a_failed_shm_persistence_takes_the_mount_back(host):
    _needs_mounts()
    fstab = str(host.base / 'fstab')
    with open(fstab, 'w', encoding='utf-8') as handle:
        handle.write('# the test host\'s fstab\n')
    release = _read_only_over(fstab)
    try:
        failed = host.module('mps_shm', size='64m', persist='fstab', fstab=fstab)
    finally:
        release()
    assert failed.get('failed') and 'undone: ' in failed['msg'], failed
    shm = os.path.join(host.root, 'shm')
    with open('/proc/self/mountinfo', encoding='utf-8') as handle:
        assert ' %s ' % shm not in handle.read()
    assert not os.path.exists(shm)


def test_the_per_resource_modules_name_an_orphan_of_another_resource_and_leave_it_alone(host, warnings):
    host.module('mps_daemon', name='a', devices=[0])
    host.module('mps_daemon', name='b', devices=[1])
    orphan = next(pid for pid, name in host.daemons().items() if name == 'b')
    shutil.rmtree(os.path.join(host.root, 'b'))
    for module, args in (('mps_daemon', {'name': 'a', 'devices': [0]}), ('mps_limits', {'name': 'a', 'replicas': 2}),
                         ('mps_shm', {'state': 'absent'})):
        result = host.module(module, **args)
        assert not result.get('failed'), result
        assert any('pid %d' % orphan in warning and 'orphans=stop' in warning for warning in warnings(result)), (module, warnings(result))
    assert orphan in host.daemons()
