# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The persisted limits' derived files: the replay commands and the daemon's start environment."""
from __future__ import annotations

import os

from ansible_collections.gpufleet.mps.plugins.module_utils._limits.model import Limits
from ansible_collections.gpufleet.mps.plugins.module_utils._limits import store
from ansible_collections.gpufleet.mps.plugins.module_utils._observe.paths import read_paths
from ansible_collections.gpufleet.mps.plugins.module_utils._observe.scan import scan_config
from ansible_collections.gpufleet.mps.plugins.module_utils._resource.layout import config_paths
from ansible_collections.gpufleet.mps.plugins.module_utils._resource.store import start_environment
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.unit import render_unit


def test_only_the_thread_percentage_goes_into_the_start_environment():
    commands = ['set_default_active_thread_percentage 25.0', 'set_default_device_pinned_mem_limit 0 20480M']
    assert start_environment(commands) == {'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE': '25.0'}
    assert start_environment(commands[1:]) == {}


def test_the_start_environment_file_follows_the_limits_and_goes_with_the_percentage(tmp_path):
    config = config_paths(str(tmp_path), 'example.com/infer')
    both = Limits(active_thread_percentage=25.0, pinned_device_mem_limit={'*': 20480})
    assert store.write_replay(config, both, ['GPU-a'], check_mode=True)
    assert not os.path.exists(config.limits_env)  # check mode writes nothing
    assert store.write_replay(config, both, ['GPU-a'], check_mode=False)
    with open(config.limits_env, encoding='utf-8') as handle:
        assert handle.read().splitlines()[1:] == ['CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25.0']
    assert not store.write_replay(config, both, ['GPU-a'], check_mode=False)  # idempotent
    memory_only = Limits(pinned_device_mem_limit={'*': 20480})
    assert store.write_replay(config, memory_only, ['GPU-a'], check_mode=False)
    assert not os.path.exists(config.limits_env) and os.path.exists(config.limits_file)
    assert store.write_replay(config, None, ['GPU-a'], check_mode=False)
    assert os.listdir(str(tmp_path)) == []


def test_the_start_environment_file_is_a_resources_file_but_never_a_resource_of_its_own(tmp_path):
    config = config_paths(str(tmp_path), 'train')
    store.write_replay(config, Limits(active_thread_percentage=50.0), ['GPU-a'], check_mode=False)
    assert sorted(os.listdir(str(tmp_path))) == ['train.limits', 'train.limits-env']
    assert scan_config(read_paths(dirs=[str(tmp_path)]), str(tmp_path)) == ['train']


def test_the_unit_reads_the_start_environment_when_there_is_one():
    unit = render_unit('/etc/gpufleet-mps', 30, 30)
    assert 'EnvironmentFile=/etc/gpufleet-mps/%i.env\n' in unit
    assert 'EnvironmentFile=-/etc/gpufleet-mps/%i.limits-env\n' in unit
