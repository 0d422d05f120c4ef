# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import json
import re

import pytest

from ansible_collections.gpufleet.mps.plugins.module_utils._container import SHM_MODES, engine_args
from ansible_collections.gpufleet.mps.plugins.module_utils._errors import InvalidParameterError
from ansible_collections.gpufleet.mps.plugins.module_utils._resource.layout import container_view, resource_paths

RFC1123_LABEL = re.compile(r'[a-z0-9]([-a-z0-9]*[a-z0-9])?')
PIPE = '/run/nvidia/mps/nvidia.com/gpu/pipe'


def view(name: str = 'nvidia.com/gpu', root: str = '/run/nvidia/mps', shm: bool = True, croot: str = '/mps') -> dict:
    """The view exactly as mps_info and mps_daemon return it (through JSON, as a playbook hands it on)."""
    return json.loads(json.dumps(container_view(resource_paths(root, name), croot, shm=shm)))


def test_the_shared_tmpfs_becomes_dev_shm_and_the_pipe_directory_is_mounted_read_only():
    args = engine_args(view())
    assert args['podman'] == [
        '--volume', PIPE + ':/mps/nvidia.com/gpu/pipe:ro',
        '--volume', '/run/nvidia/mps/shm:/dev/shm',
        '--env', 'CUDA_MPS_PIPE_DIRECTORY=/mps/nvidia.com/gpu/pipe',
    ]
    assert args['docker'] == args['podman']
    args['docker'].append('--rm')
    assert '--rm' not in args['podman'], 'the two lists must not be one object: a caller extends one of them'


def test_a_daemon_without_the_tmpfs_gives_the_hosts_dev_shm():
    assert engine_args(view(shm=False))['podman'][2:4] == ['--volume', '/dev/shm:/dev/shm']


def test_the_kubernetes_fragment_mounts_the_same_paths_with_the_same_modes():
    kube = engine_args(view())['kubernetes']
    volumes = {v['name']: v for v in kube['volumes']}
    mounts = {m['mountPath']: m for m in kube['volumeMounts']}
    assert set(mounts) == {'/mps/nvidia.com/gpu/pipe', '/dev/shm'}
    pipe, shm = mounts['/mps/nvidia.com/gpu/pipe'], mounts['/dev/shm']
    assert volumes[pipe['name']]['hostPath'] == {'path': PIPE, 'type': 'Directory'} and pipe['readOnly'] is True
    assert volumes[shm['name']]['hostPath'] == {'path': '/run/nvidia/mps/shm', 'type': 'Directory'} and shm['readOnly'] is False
    assert kube['env'] == [{'name': 'CUDA_MPS_PIPE_DIRECTORY', 'value': '/mps/nvidia.com/gpu/pipe'}]
    assert 'hostIPC' not in kube
    assert all(RFC1123_LABEL.fullmatch(v['name']) and len(v['name']) <= 63 for v in kube['volumes'])


def test_extra_env_is_merged_sorted_and_numbers_become_their_text():
    args = engine_args(view(), extra_env={'CUDA_MPS_PINNED_DEVICE_MEM_LIMIT': '0=20G,1=20G', 'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE': 12.5,
                                          'CUDA_MPS_CLIENT_PRIORITY': 1})
    assert args['podman'][4:] == [
        '--env', 'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=12.5',
        '--env', 'CUDA_MPS_CLIENT_PRIORITY=1',
        '--env', 'CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20G,1=20G',
        '--env', 'CUDA_MPS_PIPE_DIRECTORY=/mps/nvidia.com/gpu/pipe',
    ]
    assert [e['name'] for e in args['kubernetes']['env']] == [
        'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE', 'CUDA_MPS_CLIENT_PRIORITY', 'CUDA_MPS_PINNED_DEVICE_MEM_LIMIT', 'CUDA_MPS_PIPE_DIRECTORY']
    assert args['kubernetes']['env'][0]['value'] == '12.5'


def test_extra_env_cannot_point_the_client_at_another_pipe_directory_but_may_repeat_it():
    with pytest.raises(InvalidParameterError, match='^extra_env: CUDA_MPS_PIPE_DIRECTORY comes from the container view'):
        engine_args(view(), extra_env={'CUDA_MPS_PIPE_DIRECTORY': '/tmp/nvidia-mps'})
    same = engine_args(view(), extra_env={'CUDA_MPS_PIPE_DIRECTORY': '/mps/nvidia.com/gpu/pipe'})
    assert same == engine_args(view())


@pytest.mark.parametrize('extra, says', [
    ({'1X': '1'}, 'is not an environment variable name'),
    ({'A=B': '1'}, 'is not an environment variable name'),
    ({'A B': '1'}, 'is not an environment variable name'),
    ({'': '1'}, 'is not an environment variable name'),
    ({'A': True}, 'A: the value must be a string or a number'),
    ({'A': None}, 'A: the value must be a string or a number'),
    ({'A': ['1']}, 'A: the value must be a string or a number'),
    ({'A': 'x\ny'}, 'A: the value must not contain NUL or newline'),
    ({'A': 'x\0y'}, 'A: the value must not contain NUL or newline'),
])
def test_extra_env_refuses_what_an_engine_would_misread(extra, says):
    with pytest.raises(InvalidParameterError, match='^extra_env: .*' + re.escape(says)):
        engine_args(view(), extra_env=extra)


def test_extra_env_must_be_a_mapping():
    with pytest.raises(InvalidParameterError, match='^extra_env: must be a mapping'):
        engine_args(view(), extra_env=['CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=10'])  # type: ignore[arg-type]


def test_shm_none_leaves_dev_shm_to_the_caller():
    args = engine_args(view(), shm='none')
    assert args['podman'] == ['--volume', PIPE + ':/mps/nvidia.com/gpu/pipe:ro', '--env', 'CUDA_MPS_PIPE_DIRECTORY=/mps/nvidia.com/gpu/pipe']
    assert [m['mountPath'] for m in args['kubernetes']['volumeMounts']] == ['/mps/nvidia.com/gpu/pipe']
    assert len(args['kubernetes']['volumes']) == 1


def test_ipc_host_shares_the_hosts_dev_shm_for_a_daemon_without_the_tmpfs():
    args = engine_args(view(shm=False), shm='ipc-host')
    assert args['docker'] == ['--ipc=host', '--volume', PIPE + ':/mps/nvidia.com/gpu/pipe:ro',
                              '--env', 'CUDA_MPS_PIPE_DIRECTORY=/mps/nvidia.com/gpu/pipe']
    assert args['kubernetes']['hostIPC'] is True
    assert '/dev/shm' not in [m['mountPath'] for m in args['kubernetes']['volumeMounts']]


def test_ipc_host_is_refused_where_the_servers_use_the_shared_tmpfs():
    with pytest.raises(InvalidParameterError, match=r'^shm: "ipc-host" gives the container the host.s /dev/shm, but the servers of the '
                                                    r'daemon of /mps/nvidia.com/gpu/pipe use /run/nvidia/mps/shm'):
        engine_args(view(shm=True), shm='ipc-host')
    without = view(shm=False)
    without['mounts'] = without['mounts'][:1]
    with pytest.raises(InvalidParameterError, match='names no /dev/shm mount'):
        engine_args(without, shm='ipc-host')


@pytest.mark.parametrize('mode', [None, '', 'host', 'MOUNT', True])
def test_an_unknown_shm_mode_is_refused(mode):
    with pytest.raises(InvalidParameterError, match='^shm: must be one of ' + ', '.join(SHM_MODES)):
        engine_args(view(), shm=mode)  # type: ignore[arg-type]


def test_a_path_with_a_colon_is_refused_for_the_volume_syntax():
    with pytest.raises(InvalidParameterError, match='^view: the mount source /run/a:b/train/pipe holds ":"'):
        engine_args(view('train', root='/run/a:b'))
    with pytest.raises(InvalidParameterError, match='^view: the mount target /c:d/train/pipe holds ":"'):
        engine_args(view('train', croot='/c:d'))


@pytest.mark.parametrize('names', [
    ('nvidia.com/gpu', 'nvidia-com/gpu'),  # the same letters once "." and "/" are gone
    ('a-b/c', 'a/b-c'),
    ('Train', 'train'),
    ('x' * 60, 'x' * 60 + 'y'),  # the same once cut to a label's length
])
def test_volume_names_are_labels_and_differ_between_resources(names):
    fragments = [engine_args(view(name, root='/r'))['kubernetes'] for name in names]
    pipe_names = [f['volumeMounts'][0]['name'] for f in fragments]
    assert pipe_names[0] != pipe_names[1]
    for name in pipe_names:
        assert RFC1123_LABEL.fullmatch(name) and len(name) <= 63, name
        assert name.startswith('mps-pipe-')
    # one tmpfs for every resource of the root: one volume when the fragments of two resources are merged
    assert fragments[0]['volumes'][1] == fragments[1]['volumes'][1] == {'name': 'mps-shm', 'hostPath': {'path': '/r/shm', 'type': 'Directory'}}


def test_a_volume_name_says_which_resource():
    assert engine_args(view('train'))['kubernetes']['volumes'][0]['name'].startswith('mps-pipe-train-')
    assert engine_args(view())['kubernetes']['volumes'][0]['name'].startswith('mps-pipe-nvidia-com-gpu-')


def test_a_mount_the_view_adds_is_passed_on_writable_with_a_name_of_its_own():
    extended = view()
    extended['mounts'].append({'source': '/run/nvidia/mps/.ready', 'target': '/mps/.ready'})
    args = engine_args(extended)
    assert args['podman'][4:6] == ['--volume', '/run/nvidia/mps/.ready:/mps/.ready']
    names = [v['name'] for v in args['kubernetes']['volumes']]
    assert len(set(names)) == 3 and names[2].startswith('mps-mount-mps-ready-')


@pytest.mark.parametrize('change, says', [
    (lambda v: None, 'must be a container view'),
    (lambda v: dict(v, pipe_dir='mps/x/pipe'), 'pipe_dir must be an absolute path'),
    (lambda v: {k: x for k, x in v.items() if k != 'root'}, 'root must be an absolute path'),
    (lambda v: dict(v, env=['CUDA_MPS_PIPE_DIRECTORY=/x']), 'env must be a mapping'),
    (lambda v: dict(v, env={'CUDA_MPS_PIPE_DIRECTORY': None}), 'the value must be a string or a number'),
    (lambda v: dict(v, mounts=None), 'mounts must be a list'),
    (lambda v: dict(v, mounts=['/a:/b']), r'mounts\[0\] must be a mapping'),
    (lambda v: dict(v, mounts=[{'source': '/a'}]), r'mounts\[0\]\.target must be an absolute path'),
    (lambda v: dict(v, mounts=v['mounts'] + [{'source': '/b', 'target': '/dev/shm/'}]), r'mounts\[2\]: a second mount at /dev/shm'),
])
def test_a_malformed_view_is_refused_naming_what_is_wrong(change, says):
    with pytest.raises(InvalidParameterError, match='^view: .*' + says):
        engine_args(change(view()))
