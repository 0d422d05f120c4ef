# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The eleven faults that issue 26 found in mps_host, each a test named by the behaviour a user expects.

Every test runs the module the way Ansible does (the ``host`` fixture, conftest.py) and imports nothing of the
collection, so this file also runs against an older version of the module (see the issue's closing note: every test
here fails on the main branch before the host plan).
"""
from __future__ import annotations

import json
import os
import shutil
import signal

import pytest
import pynvml


def test_a_limits_change_says_which_running_servers_keep_their_limits_and_can_update_them(host, warnings):
    """Case 1: an idle MPS server keeps the limits it started with; a run that changes them says so, and
    running_servers=update sets them on the server too."""
    host.ok([{'name': 'train', 'devices': [0], 'active_thread_percentage': 50}])
    host.leave(host.client('train'))
    changed = host.ok([{'name': 'train', 'devices': [0], 'active_thread_percentage': 25}])
    assert any('keep the limits they started with' in warning for warning in warnings(changed)), warnings(changed)
    updated = host.ok([{'name': 'train', 'devices': [0], 'active_thread_percentage': 25}], running_servers='update')
    assert updated['changed'] and not updated['resources'][0]['limits']['pending']


@pytest.mark.parametrize('name', ['.ready', 'train/log'])
def test_a_name_whose_directories_collide_with_ours_is_refused_before_anything_changes(host, name):
    """Case 2."""
    result = host.run([{'name': 'train', 'devices': [0]}, {'name': name, 'devices': [1]}])
    assert result.get('failed') and 'resources[1].name' in result['msg'], result.get('msg')
    assert not os.path.exists(host.root) and host.daemons() == {}


def test_a_daemon_whose_root_was_deleted_is_named_and_never_started_twice(host):
    """Case 3: the daemon still serves its GPU when its pipe directory is gone; a second one on it breaks both."""
    host.ok([{'name': 'train', 'devices': [0]}])
    [orphan] = host.daemons()
    shutil.rmtree(host.root)
    result = host.run([{'name': 'train', 'devices': [0]}])
    assert result.get('failed') and str(orphan) in result['msg'], result.get('msg')
    assert list(host.daemons()) == [orphan]


def test_a_run_killed_while_it_moves_gpus_leaves_no_ready_mark_over_a_down_resource(host):
    """Case 4: the run is sent SIGKILL when it starts its first daemon, after it stopped the ones it moves."""
    first = [{'name': 'train', 'devices': [0, 1]}, {'name': 'infer', 'devices': [2]}]
    second = [{'name': 'train', 'devices': [0]}, {'name': 'tune', 'devices': [1]}, {'name': 'infer', 'devices': [2, 3]}]
    host.ok(first)
    assert host.ready
    dying = host.base / 'dying-control'
    dying.write_text('#!/bin/sh\nif [ "$1" = "-d" ]; then kill -9 "$PPID"; exit 1; fi\nexec %s "$@"\n' % host.binary)
    dying.chmod(0o755)
    killed = host.start(second, control_binary=str(dying))
    killed.communicate(timeout=120)
    assert killed.returncode == -signal.SIGKILL
    assert sorted(host.daemons().values()) != ['infer', 'train', 'tune']
    assert not host.ready
    host.ok(second)
    assert host.ready and sorted(host.daemons().values()) == ['infer', 'train', 'tune']


def test_two_runs_at_once_both_succeed(host):
    """Case 5: the second waits for the first, then finds nothing to do."""
    resources = [{'name': 'train', 'devices': [0, 1]}, {'name': 'infer', 'devices': [2]}]
    procs = [host.start(resources) for _run in range(2)]
    results = [host.result(proc) for proc in procs]
    assert [result.get('msg') for result in results if result.get('failed')] == []
    assert sorted(result['changed'] for result in results) == [False, True]
    assert sorted(host.daemons().values()) == ['infer', 'train']


def test_check_and_diff_show_a_limit_the_daemon_reads_back_otherwise_as_unchanged(host):
    """Case 6: 10G is set as 10240M, and the daemon answers 10G."""
    resources = [{'name': 'train', 'devices': [0], 'pinned_device_mem_limit': '10G', 'active_thread_percentage': 30}]
    host.ok(resources)
    result = host.run(resources, check=True, diff=True)
    assert not result.get('failed') and not result['changed'], result
    for diff in [result.get('diff')] + [item.get('diff') for item in result['resources']]:
        if diff:
            assert diff['before'] == diff['after'], diff


def test_the_warning_for_a_re_created_mig_device_says_the_daemon_restarts(host, warnings):
    """Case 7: the recorded device is gone; the run restarts the daemon on the one listed, and says that."""
    host.ok([{'name': 'train', 'devices': [0]}])
    started = os.path.join(host.root, 'train', '.started')
    with open(started, encoding='utf-8') as handle:
        record = json.load(handle)
    record['devices'] = ['MIG-00000000-0000-0000-0000-000000000000']
    with open(started, 'w', encoding='utf-8') as handle:
        json.dump(record, handle)
    result = host.ok([{'name': 'train', 'devices': [0]}])
    warning = [w for w in warnings(result) if 'no longer exists' in w]
    assert warning and 'restarts on GPU 0' in warning[0] and 'To serve the new instance' not in warning[0], warnings(result)


def test_a_busy_wait_that_times_out_changes_nothing_and_says_restart(host):
    """Case 8."""
    host.ok([{'name': 'train', 'devices': [0]}])
    host.client('train')
    result = host.run([{'name': 'train', 'devices': [1]}], busy='wait', busy_timeout=1)
    assert result.get('failed')
    assert 'restart' in result['msg'] and 'the the' not in result['msg'], result['msg']
    assert host.ready and list(host.daemons().values()) == ['train']


def test_a_control_binary_that_fails_is_an_error_that_keeps_the_ready_mark(host):
    """Case 9: a bad binary is bad input, not a sign that the running daemons are down."""
    host.ok([{'name': 'train', 'devices': [0]}])
    result = host.run([{'name': 'train', 'devices': [0]}], control_binary='/bin/false')
    assert result.get('failed') and host.ready


def test_an_empty_list_is_not_ready_in_the_file_and_in_the_facts(host):
    """Case 10."""
    host.ok([{'name': 'train', 'devices': [0]}])
    result = host.ok([])
    with open(os.path.join(host.facts, 'gpufleet_mps.fact'), encoding='utf-8') as handle:
        facts = json.load(handle)
    assert not host.ready and result['ready'] is False and facts['ready'] is False


def test_a_failed_start_gives_back_compute_modes_and_limits_and_names_files_that_exist(host):
    """Case 11: the simulator refuses to start (a pipe directory beyond what it accepts)."""
    (host.base / 'host' / 'mps.env').write_text('export FAKE_MPS_PIPE_DIR_MAX=10\n')
    result = host.run([{'name': 'train', 'devices': [0], 'active_thread_percentage': 50}])
    assert result.get('failed')
    assert host.compute_modes() == [pynvml.NVML_COMPUTEMODE_DEFAULT] * 4
    assert not os.path.exists(os.path.join(host.etc, 'train.limits.json'))
    assert not host.ready
    for word in result['msg'].replace(')', ' ').replace(',', ' ').split():
        if word.endswith('control.log'):
            assert os.path.exists(word) or 'does not exist' in result['msg'], result['msg']
