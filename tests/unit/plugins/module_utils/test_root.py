# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import shutil
import subprocess

import pytest

from ansible_collections.gpufleet.mps.plugins.module_utils._errors import InvalidParameterError
from ansible_collections.gpufleet.mps.plugins.module_utils._resource.layout import (
    MAX_PIPE_DIR_BYTES,
    container_view,
    resource_paths,
    systemd_instance,
    validate_log_mode,
    validate_name,
    validate_root,
)


@pytest.mark.parametrize('name', ['train', 'nvidia.com/gpu', 'a_b-c.d', 'x/y', 'a..b', 'shm2', 'logs/pipes', 'pipe/x'])
def test_valid_resource_names_are_accepted(name):
    assert validate_name(name) == name


@pytest.mark.parametrize('name', [
    '', '/abs', 'a/', '/', 'a//b', 'a/b/c', '.', '..', 'a/..', '../../etc', 'a/../../b', './a',
    'with space', 'new\nline', 'nul\0byte', 'semi;colon', '$(id)', 'back`tick`', 'ünï', None, 3,
    # names whose directories collide with the collection's own files or with another resource's
    '...', '.ready', '.lock', 'train/.started', 'shm', 'shm/x', 'train/log', 'train/pipe',
])
def test_invalid_resource_names_fail_naming_the_parameter(name):
    with pytest.raises(InvalidParameterError) as excinfo:
        validate_name(name)
    assert excinfo.value.param == 'name'
    assert excinfo.value.msg.startswith('name: ')
    assert '"nvidia.com/gpu"' in excinfo.value.msg


@pytest.mark.parametrize('root', ['relative/dir', '', '/', '/a\nb', '/a\0b', None])
def test_invalid_roots_fail_naming_root(root):
    with pytest.raises(InvalidParameterError) as excinfo:
        validate_root(root)
    assert excinfo.value.param == 'root'


def test_root_is_normalised():
    assert validate_root('/run//nvidia/mps/') == '/run/nvidia/mps'


def test_resource_paths_follow_the_device_plugin_layout():
    paths = resource_paths('/run/nvidia/mps', 'nvidia.com/gpu')
    assert paths.resource_dir == '/run/nvidia/mps/nvidia.com/gpu'
    assert paths.pipe_dir == '/run/nvidia/mps/nvidia.com/gpu/pipe'
    assert paths.log_dir == '/run/nvidia/mps/nvidia.com/gpu/log'
    assert paths.started_file == '/run/nvidia/mps/nvidia.com/gpu/.started'
    assert paths.control_socket == '/run/nvidia/mps/nvidia.com/gpu/pipe/control'
    assert paths.client_env() == {
        'CUDA_MPS_PIPE_DIRECTORY': '/run/nvidia/mps/nvidia.com/gpu/pipe',
        'CUDA_MPS_LOG_DIRECTORY': '/run/nvidia/mps/nvidia.com/gpu/log',
    }


def test_a_pipe_dir_of_exactly_87_bytes_is_accepted_and_88_refused_saying_why():
    suffix = '/r/pipe'
    fits = '/' + 'x' * (MAX_PIPE_DIR_BYTES - len(suffix) - 1)
    assert len(resource_paths(fits, 'r').pipe_dir) == MAX_PIPE_DIR_BYTES == 87
    with pytest.raises(InvalidParameterError) as excinfo:
        resource_paths(fits + 'y', 'r')
    assert excinfo.value.param == 'root'
    assert '88 bytes long' in excinfo.value.msg and 'at most 87 bytes' in excinfo.value.msg
    assert 'fails silently' in excinfo.value.msg


def test_a_container_pipe_dir_over_87_bytes_is_refused_naming_container_root():
    paths = resource_paths('/run/nvidia/mps', 'train')
    croot = '/' + 'c' * (MAX_PIPE_DIR_BYTES - len('/train/pipe') - 1)
    assert len(container_view(paths, croot)['pipe_dir']) == 87
    with pytest.raises(InvalidParameterError) as excinfo:
        container_view(paths, croot + 'c')
    assert excinfo.value.param == 'container_root' and 'inside the container' in excinfo.value.msg


@pytest.mark.parametrize('name, escaped', [
    ('train', 'train'),
    ('nvidia.com/gpu', 'nvidia.com-gpu'),
    ('my-res', 'my\\x2dres'),
    ('.hidden', '\\x2ehidden'),
    ('a_b:c', 'a_b:c'),
])
def test_systemd_instance_names_escape_like_systemd_escape(name, escaped):
    assert systemd_instance(name) == escaped


@pytest.mark.skipif(shutil.which('systemd-escape') is None, reason='systemd-escape not installed')
@pytest.mark.parametrize('name', ['nvidia.com/gpu', 'a-b/c_d', '.x', 'A.B-9/z'])
def test_systemd_instance_matches_the_real_systemd_escape(name):
    real = subprocess.run(['systemd-escape', name], check=True, capture_output=True, text=True).stdout.strip()
    assert systemd_instance(name) == real


@pytest.mark.parametrize('value, mode', [
    ('0700', 0o700), ('700', 0o700), ('0o750', 0o750), ('0755', 0o755), ('0711', 0o711), (0o750, 0o750),
])
def test_log_modes_with_all_owner_bits_and_no_write_for_others_are_accepted(value, mode):
    assert validate_log_mode(value) == mode


@pytest.mark.parametrize('value', [
    '0777', '0775', '0757', '0600', '0500', '4755', '1755', '0700\n', 'u=rwx', '', '07000', 750, -1, True, None, 0o7777,
])
def test_bad_log_modes_fail_naming_the_parameter_and_the_valid_form(value):
    with pytest.raises(InvalidParameterError, match=r'^log_mode: must be an octal mode string such as "0700"'):
        validate_log_mode(value)


def test_a_pipe_dir_an_older_version_accepted_can_still_be_addressed_to_take_it_down():
    root = '/' + 'x' * (95 - len('/r/pipe') - 1)
    with pytest.raises(InvalidParameterError):
        resource_paths(root, 'r')
    assert len(resource_paths(root, 'r', check_length=False).pipe_dir) == 95
