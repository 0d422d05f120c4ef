# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Devices: FAKE_NVML_CONFIG, CUDA_VISIBLE_DEVICES remapping, DEV arguments, by-UUID limits."""
from __future__ import annotations

import os
from typing import Callable

import pytest

from conftest import GPUS, SimHost, write_ini
import mps_daemon

UUIDS = [g[1] for g in GPUS]


def gpus() -> list[mps_daemon.Gpu]:
    return [mps_daemon.Gpu(index=i, uuid=u, name=n, memory_total_mib=m, cc_major=int(cc[0]), cc_minor=int(cc[2]))
            for i, (n, u, m, cc) in enumerate(GPUS)]


@pytest.mark.parametrize('cvd,expected', [
    (None, [0, 1, 2, 3]),
    ('', []),
    ('0', [0]),
    ('2,0', [2, 0]),
    ('3,2,1,0', [3, 2, 1, 0]),
    (' 1 , 2 ', [1, 2]),
    ('1,7,2', [1]),          # out of range: the list stops there
    ('1,x,2', [1]),          # garbage stops it too
    ('1,1,2', [1]),          # a duplicate is invalid
    ('-1,0', []),
    ('01', [1]),
    (UUIDS[2], [2]),
    (f'{UUIDS[3]},{UUIDS[0]}', [3, 0]),
    ('GPU-9f00', [2]),       # unique prefix
    ('gpu-9F00AA01', [2]),   # case does not matter
    ('GPU-6a2b5c1e', []),    # ambiguous prefix (gpu0 and gpu1)
    ('GPU-6a2b5c1e-1111,0', [1, 0]),
    ('2,GPU-1234', [2, 3]),
    ('GPU-ffff', []),
    ('MIG-6a2b5c1e-0000-4000-8000-000000000000', []),
    ('6a2b5c1e-0000-4000-8000-000000000000', []),  # a UUID needs its GPU- prefix
])
def test_cuda_visible_devices_is_applied_as_cuda_does(cvd: str, expected: list[int]) -> None:
    assert [g.index for g in mps_daemon.visible_gpus(gpus(), cvd)] == expected


def test_load_gpus_reads_the_gpu_sections_in_order(tmp_path: os.PathLike) -> None:
    path = os.path.join(tmp_path, 'x.ini')
    write_ini(path)
    loaded = mps_daemon.load_gpus(path)
    assert [(g.index, g.uuid, g.name, g.memory_total_mib, g.compute_capability, g.max_clients) for g in loaded] == [
        (i, u, n, m, cc, 16 if cc == '6.0' else 48) for i, (n, u, m, cc) in enumerate(GPUS)]


def test_unset_or_unreadable_config_means_no_gpus(tmp_path: os.PathLike) -> None:
    assert not mps_daemon.load_gpus(None)
    assert not mps_daemon.load_gpus(os.path.join(tmp_path, 'missing.ini'))


def test_shipped_nvml_configs_parse_when_present() -> None:
    configs = os.path.join(os.path.dirname(__file__), '..', 'nvml', 'configs')
    if not os.path.isdir(configs):
        pytest.skip('no tests/fakes/nvml/configs yet')
    for name in sorted(os.listdir(configs)):
        if name.endswith('.ini'):
            loaded = mps_daemon.load_gpus(os.path.join(configs, name))
            assert loaded, name
            assert all(g.uuid.startswith('GPU-') for g in loaded), name


def test_daemon_sees_its_visible_devices_in_cuda_order(host: SimHost) -> None:
    host.start(env={'CUDA_VISIBLE_DEVICES': f'2,{UUIDS[0][:17]}'})
    assert host.out(['sim_devices']).splitlines() == [
        f'0 {UUIDS[2]} 7.0 48 Tesla V100-SXM2-16GB',
        f'1 {UUIDS[0]} 9.0 48 NVIDIA H100 80GB HBM3',
    ]


def test_ordinals_are_relative_to_cuda_visible_devices(host: SimHost) -> None:
    host.start(env={'CUDA_VISIBLE_DEVICES': '3,1'})
    host.out(['set_default_device_pinned_mem_limit 0 512M', 'set_default_device_pinned_mem_limit 1 2G'])
    assert host.out(['set_default_device_pinned_mem_limit 2 1G']) == 'Invalid device: 2\n'
    info = host.client().info()
    assert [(d['ordinal'], d['uuid']) for d in info['devices']] == [(0, UUIDS[3]), (1, UUIDS[1])]
    assert info['pinned_mem_limit_mib'] == {'0': 512, '1': 2048}
    host.wait_log('Server has started', 'server')
    messages = host.log_messages('server')
    assert 'Creating server context on device 0 (Tesla P100-PCIE-16GB)' in messages
    assert 'Creating server context on device 1 (NVIDIA H100 80GB HBM3)' in messages


def test_two_daemons_side_by_side_each_see_only_their_gpus(make_host: Callable[..., SimHost]) -> None:
    first, second = make_host(), make_host()
    write_ini(second.ini)
    second.ini = first.ini  # one host, one config: two daemons on disjoint GPU sets
    first.start(env={'CUDA_VISIBLE_DEVICES': UUIDS[0]})
    second.start(env={'CUDA_VISIBLE_DEVICES': f'{UUIDS[1]},{UUIDS[2]}', 'FAKE_NVML_CONFIG': first.ini})
    assert [line.split()[1] for line in first.out(['sim_devices']).splitlines()] == [UUIDS[0]]
    assert [line.split()[1] for line in second.out(['sim_devices']).splitlines()] == [UUIDS[1], UUIDS[2]]
    one, two = first.client().info(), second.client().info()
    assert one['server_pid'] != two['server_pid']
    assert [d['uuid'] for d in two['devices']] == [UUIDS[1], UUIDS[2]]


def test_dev_argument_accepts_a_visible_uuid(host: SimHost) -> None:
    host.start(env={'CUDA_VISIBLE_DEVICES': '1'})
    assert host.out([f'set_default_device_pinned_mem_limit {UUIDS[1]} 1G']) == ''
    assert host.out([f'set_default_device_pinned_mem_limit {UUIDS[0]} 1G']) == f'Invalid device: {UUIDS[0]}\n'
    assert host.out([f'set_default_device_pinned_mem_limit {UUIDS[1][:12]} 1G']) == f'Invalid device: {UUIDS[1][:12]}\n'


def test_limit_set_by_uuid_is_accepted_but_not_applied(running: SimHost) -> None:
    assert running.out([f'set_default_device_pinned_mem_limit {UUIDS[1]} 2G']) == ''
    assert running.out([f'get_default_device_pinned_mem_limit {UUIDS[1]}', 'get_default_device_pinned_mem_limit 1']) == '2G\n0M\n'
    info = running.client('--device', '1').info()
    assert info['pinned_mem_limit_mib'] == {'1': None}
    spid = info['server_pid']
    assert running.out([f'set_device_pinned_mem_limit {spid} {UUIDS[1]} 1G', f'get_device_pinned_mem_limit {spid} 1']) == '0M\n'
    assert running.client('--device', '1').info()['pinned_mem_limit_mib'] == {'1': None}


def test_limit_set_by_uuid_is_applied_with_the_switch(host: SimHost) -> None:
    host.start(env={'FAKE_MPS_UUID_LIMITS': 'applied'})
    host.out([f'set_default_device_pinned_mem_limit {UUIDS[1]} 2G'])
    assert host.out([f'get_default_device_pinned_mem_limit {UUIDS[1]}', 'get_default_device_pinned_mem_limit 1']) == '2G\n2G\n'
    assert host.client('--device', '1').info()['pinned_mem_limit_mib'] == {'1': 2048}


def test_daemon_without_gpus_starts_but_clients_and_device_commands_fail(host: SimHost) -> None:
    host.start(env={'FAKE_NVML_CONFIG': None})
    assert host.out(['sim_devices', 'set_default_device_pinned_mem_limit 0 1G']) == 'Invalid device: 0\n'
    rc, out, _err = host.client().rest()
    assert rc == 1 and '"CUDA_ERROR_NO_DEVICE"' in out


def test_empty_cuda_visible_devices_hides_every_gpu(host: SimHost) -> None:
    host.start(env={'CUDA_VISIBLE_DEVICES': ''})
    assert host.out(['sim_devices']) == ''


def test_env_pinned_limit_keys_follow_the_remapping(host: SimHost) -> None:
    host.start(env={'CUDA_VISIBLE_DEVICES': '2,0', 'CUDA_MPS_PINNED_DEVICE_MEM_LIMIT': f'1=3G,{UUIDS[2]}=1G'})
    assert host.out(['get_default_device_pinned_mem_limit 0', 'get_default_device_pinned_mem_limit 1']) == '1G\n3G\n'


@pytest.mark.parametrize('cc,limit', [('3.5', 16), ('6.1', 16), ('7.0', 48), ('7.5', 48), ('9.0', 48), ('10.0', 48)])
def test_clients_per_gpu_limit_is_48_from_volta_and_16_before(cc: str, limit: int) -> None:
    major, minor = cc.split('.')
    gpu = mps_daemon.Gpu(index=0, uuid='GPU-x', name='x', memory_total_mib=1, cc_major=int(major), cc_minor=int(minor))
    assert gpu.max_clients == limit
