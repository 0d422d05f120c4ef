# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Other MPS control daemons of the host: found in /proc, their GPUs never taken nor reset."""
from __future__ import annotations

import types

import pytest

from ansible_collections.gpufleet.mps.plugins.module_utils._daemon.manager import DaemonManager
from ansible_collections.gpufleet.mps.plugins.module_utils._errors import DeviceSelectionError, InvalidParameterError
from ansible_collections.gpufleet.mps.plugins.module_utils._gpus import Gpu
from ansible_collections.gpufleet.mps.plugins.module_utils._observe.scan import ForeignDaemon, foreign_daemons
from ansible_collections.gpufleet.mps.plugins.module_utils._outcome import Outcome
from ansible_collections.gpufleet.mps.plugins.module_utils._proc import control_daemons
from ansible_collections.gpufleet.mps.plugins.module_utils._resource.layout import config_paths, resource_paths
from ansible_collections.gpufleet.mps.plugins.module_utils._selectors import visible_gpus


def _gpu(index, uuid, cc=(9, 0), mode='default'):
    return Gpu(index, uuid, 'NVIDIA H100', 81559, cc, mode, False, False, True)


GPUS = [_gpu(0, 'GPU-aaaa1111-0000'), _gpu(1, 'GPU-bbbb2222-0000'), _gpu(2, 'GPU-bbbb3333-0000')]


def _process(proc, pid, comm, argv, environ=None, uid=0):
    base = proc / str(pid)
    base.mkdir(parents=True)
    (base / 'comm').write_text(comm + '\n')
    (base / 'cmdline').write_bytes(b'\0'.join(arg.encode() for arg in argv) + b'\0')
    (base / 'status').write_text('Name:\t%s\nUid:\t%d\t%d\t%d\t%d\n' % (comm, uid, uid, uid, uid))
    if environ is not None:
        (base / 'environ').write_bytes(b''.join(('%s=%s' % item).encode() + b'\0' for item in environ.items()))


@pytest.mark.parametrize('value, indices', [
    (None, [0, 1, 2]),                           # unset: every GPU
    ('', []),
    ('1', [1]),
    ('GPU-bbbb3333-0000,0', [2, 0]),
    ('GPU-aaaa', [0]),                           # a unique prefix
    ('0,7,1', [0]),                              # CUDA stops at the first item that names no GPU
    ('GPU-bbbb,0', []),                          # an ambiguous prefix names none
    ('MIG-GPU-aaaa1111-0000/1/0,2', []),         # a MIG device this host lacks names nothing: CUDA stops there
    (' 2 , 1 ', [2, 1]),
])
def test_visible_devices_are_read_as_cuda_reads_them(value, indices):
    assert [gpu.index for gpu in visible_gpus(value, GPUS)] == indices


def test_control_daemons_are_told_from_servers_and_the_control_ui(tmp_path):
    proc = tmp_path / 'proc'
    _process(proc, 10, 'nvidia-cuda-mps', ['nvidia-cuda-mps-control', '-d'], {'CUDA_MPS_PIPE_DIRECTORY': '/a/pipe'})
    _process(proc, 11, 'nvidia-cuda-mps', ['/usr/bin/nvidia-cuda-mps-control', '-f', '-multiuser-server'], {}, uid=1000)
    _process(proc, 12, 'nvidia-cuda-mps', ['nvidia-cuda-mps-server'], {'CUDA_MPS_PIPE_DIRECTORY': '/a/pipe'})
    _process(proc, 13, 'nvidia-cuda-mps', ['nvidia-cuda-mps-control'], {'CUDA_MPS_PIPE_DIRECTORY': '/a/pipe'})  # the UI
    _process(proc, 14, 'python3', ['python3', 'x.py', '-d'], {})
    _process(proc, 15, 'nvidia-cuda-mps', ['nvidia-cuda-mps-control', '-d'])  # another user's: environ unreadable
    (proc / 'self').mkdir()
    found = control_daemons(str(proc))
    assert [(daemon.pid, daemon.uid) for daemon in found] == [(10, 0), (11, 1000), (15, 0)]
    assert found[0].pipe_dir('/tmp/nvidia-mps') == '/a/pipe' and found[1].pipe_dir('/tmp/nvidia-mps') == '/tmp/nvidia-mps'
    assert found[1].visible_devices is None and found[2].environ is None


def test_a_daemon_exiting_while_it_is_read_is_not_taken_for_one_on_the_default_pipe_serving_every_gpu(tmp_path, monkeypatch):
    """The parent of ``-d`` exits once its daemon is forked: read after its memory is gone, its environment and its
    arguments are empty. Its empty environment must not make it a daemon of /tmp/nvidia-mps serving every GPU (the
    refusal seen in a 16-host benchmark and in the unit tests under two workers)."""
    from ansible_collections.gpufleet.mps.plugins.module_utils import _proc  # pylint: disable=import-outside-toplevel
    proc = tmp_path / 'proc'
    _process(proc, 30, 'nvidia-cuda-mps', ['nvidia-cuda-mps-control', '-d'], {'CUDA_MPS_PIPE_DIRECTORY': '/a/pipe'})
    _process(proc, 31, 'nvidia-cuda-mps', ['nvidia-cuda-mps-control', '-d'], {})  # alive, started with env -i
    read = _proc._environ_at

    def exits_while_read(base):
        if base.endswith('/30'):
            (proc / '30' / 'environ').write_bytes(b'')
            (proc / '30' / 'cmdline').write_bytes(b'')  # the process is gone: both read empty from now on
        return read(base)

    monkeypatch.setattr(_proc, '_environ_at', exits_while_read)
    assert [(daemon.pid, daemon.environ) for daemon in control_daemons(str(proc))] == [(31, {})]
    assert foreign_daemons(None, GPUS, proc=str(proc))[0][0].uuids == [gpu.uuid for gpu in GPUS]  # the live one: every GPU


def test_foreign_daemons_leave_out_the_own_one_by_pid_and_by_pipe_directory(tmp_path):
    proc = tmp_path / 'proc'
    _process(proc, 20, 'nvidia-cuda-mps', ['nvidia-cuda-mps-control', '-d'],
             {'CUDA_MPS_PIPE_DIRECTORY': '/own/pipe', 'CUDA_VISIBLE_DEVICES': '0'})
    _process(proc, 21, 'nvidia-cuda-mps', ['nvidia-cuda-mps-control', '-d'],
             {'CUDA_MPS_PIPE_DIRECTORY': '/other/pipe/', 'CUDA_VISIBLE_DEVICES': 'GPU-bbbb2222-0000'})
    _process(proc, 22, 'nvidia-cuda-mps', ['nvidia-cuda-mps-control', '-d'], {})  # default pipe dir, every GPU
    _process(proc, 23, 'nvidia-cuda-mps', ['nvidia-cuda-mps-control', '-d'])
    known, unreadable = foreign_daemons('/own/pipe', GPUS, own_pid=None, proc=str(proc))
    assert [(daemon.pid, daemon.pipe_dir, daemon.uuids) for daemon in known] == [
        (21, '/other/pipe', ['GPU-bbbb2222-0000']),
        (22, '/tmp/nvidia-mps', [gpu.uuid for gpu in GPUS]),
    ]
    assert [daemon.pid for daemon in unreadable] == [23]
    known, unreadable = foreign_daemons('/else/pipe', GPUS, own_pid=21, proc=str(proc))
    assert [daemon.pid for daemon in known] == [20, 22]
    known, unreadable = foreign_daemons('/else/pipe', GPUS, proc=str(proc), outside='/other')  # a root's own daemons
    # ... are left to their records while their pipe directory leads to them; pid 21's has no pid file naming it: an orphan.
    assert [(daemon.pid, daemon.orphan) for daemon in known] == [(20, False), (21, True), (22, False)]
    assert 'an orphaned daemon of this root' in known[1].describe() and 'kill 21' in known[1].describe()


def test_a_root_daemon_whose_pipe_directory_names_it_is_not_an_orphan(tmp_path):
    proc = tmp_path / 'proc'
    pipe = tmp_path / 'root' / 'train' / 'pipe'
    pipe.mkdir(parents=True)
    _process(proc, 21, 'nvidia-cuda-mps', ['nvidia-cuda-mps-control', '-d'],
             {'CUDA_MPS_PIPE_DIRECTORY': str(pipe), 'CUDA_VISIBLE_DEVICES': 'GPU-bbbb2222-0000'})
    (pipe / 'nvidia-cuda-mps-control.pid').write_text('21')
    assert foreign_daemons(None, GPUS, proc=str(proc), outside=str(tmp_path / 'root')) == ([], [])
    (pipe / 'nvidia-cuda-mps-control.pid').write_text('99')  # the directory now belongs to another daemon
    known = foreign_daemons(None, GPUS, proc=str(proc), outside=str(tmp_path / 'root'))[0]
    assert [(daemon.pid, daemon.orphan, daemon.uuids) for daemon in known] == [(21, True, ['GPU-bbbb2222-0000'])]


@pytest.fixture
def manager(tmp_path):
    paths = resource_paths(str(tmp_path / 'root'), 'train')
    config = config_paths(str(tmp_path / 'etc'), 'train')
    nvml = types.SimpleNamespace(gpus=lambda: [_gpu(0, 'GPU-a', mode='exclusive_process'), _gpu(1, 'GPU-b', mode='exclusive_process')])
    daemon = types.SimpleNamespace(binary='/usr/bin/nvidia-cuda-mps-control', log_mode=0o700, start_timeout=30, stop_timeout=30)
    return DaemonManager(paths, config, daemon, nvml=nvml, supervisor='none', check_mode=True)


def _foreign(see, manager, known, unreadable=()):
    """The view's /proc scan as foreign_daemons(None, ..., outside=root) gives it: the root's own daemons left out."""
    outside = manager.paths.root
    known = [daemon for daemon in known if not daemon.pipe_dir.startswith(outside + '/')]
    see(manager, gpus=manager.run.nvml.gpus(), daemons=(known, list(unreadable)))


def test_a_gpu_another_daemon_serves_is_refused_naming_its_pid_and_pipe_directory(manager, see):
    _foreign(see, manager, [ForeignDaemon(4242, '/elsewhere/pipe', 0, ['GPU-b'])])
    with pytest.raises(DeviceSelectionError, match=r"^devices: GPU 1 \(GPU-b\) is served by another MPS control daemon: "
                                                   r"pid 4242 \(pipe directory /elsewhere/pipe, uid 0\);.*nothing was done"):
        manager.devices.refuse_foreign(manager.run.nvml.gpus(), Outcome())
    out = Outcome()
    manager.devices.refuse_foreign(manager.run.nvml.gpus()[:1], out)
    assert out.warnings == [] and out.actions == []


def test_a_daemon_of_the_same_root_is_left_to_the_start_records(manager, see):
    _foreign(see, manager, [ForeignDaemon(4242, manager.paths.root + '/infer/pipe', 0, ['GPU-b'])])
    manager.devices.refuse_foreign(manager.run.nvml.gpus(), Outcome())


def test_a_daemon_whose_environment_cannot_be_read_is_named_in_a_warning(manager, see):
    _foreign(see, manager, [], [ForeignDaemon(77, None, 1000, [])])
    out = Outcome()
    manager.devices.refuse_foreign(manager.run.nvml.gpus(), out)
    assert out.warnings and 'pid 77' in out.warnings[0] and 'run as root' in out.warnings[0]


def test_stopping_never_resets_a_gpu_another_daemon_serves(manager, see):
    _foreign(see, manager, [ForeignDaemon(4242, '/elsewhere/pipe', 0, ['GPU-b'])])
    out = Outcome()
    assert [gpu.uuid for gpu in manager.devices.releasable_gpus({'GPU-a', 'GPU-b'}, out)] == ['GPU-a']
    assert out.warnings == ['GPU 1 (GPU-b) keeps compute mode EXCLUSIVE_PROCESS: another MPS control daemon serves it, '
                            'pid 4242 (pipe directory /elsewhere/pipe, uid 0)']


def test_multiuser_is_refused_below_volta_naming_the_gpus(manager, see):
    see(manager, gpus=[_gpu(0, 'GPU-p', cc=(6, 0)), _gpu(1, 'GPU-v', cc=(7, 0))])
    with pytest.raises(InvalidParameterError, match=r'multiuser.*GPU 0 \(GPU-p, NVIDIA H100, 6\.0\) is older'):
        manager.devices.wanted('all', multiuser=True, compute_mode='exclusive_process', enabled=True)
    assert [gpu.index for gpu in manager.devices.wanted([1], multiuser=True, compute_mode='exclusive_process', enabled=True).devices] == [1]
    assert [gpu.index for gpu in manager.devices.wanted('all', multiuser=False, compute_mode='exclusive_process', enabled=True).devices] == [0, 1]


def test_a_resource_entry_is_refused_multiuser_below_volta_in_the_same_words_naming_the_entry(manager, see):
    from ansible_collections.gpufleet.mps.plugins.module_utils._host.entries import resolve_entries  # pylint: disable=import-outside-toplevel
    gpus = [_gpu(0, 'GPU-p', cc=(6, 0)), _gpu(1, 'GPU-v', cc=(7, 0))]
    see(manager, gpus=gpus)
    with pytest.raises(InvalidParameterError) as daemon:
        manager.devices.wanted('all', multiuser=True, compute_mode='exclusive_process', enabled=True)
    with pytest.raises(InvalidParameterError) as entry:
        resolve_entries([{'name': 'train', 'multiuser': True}], gpus)
    assert (daemon.value.param, entry.value.param) == ('multiuser', 'resources[train].multiuser')
    assert entry.value.msg == 'resources[train].' + daemon.value.msg
