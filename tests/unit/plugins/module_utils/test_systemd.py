# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from ansible_collections.gpufleet.mps.plugins.module_utils._observe.paths import ViewMiss
from ansible_collections.gpufleet.mps.plugins.module_utils._observe.reader import read_units
from ansible_collections.gpufleet.mps.plugins.module_utils._observe.view import HostView
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor import unit as _systemd
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.v3_variants import DROPIN_V3
from ansible_collections.gpufleet.mps.plugins.module_utils._errors import InvalidParameterError, MpsError


def test_unit_reads_the_instance_environment_and_replays_limits_after_start():
    unit = _systemd.render_unit('/etc/gpufleet-mps', 30, 20)
    assert 'EnvironmentFile=/etc/gpufleet-mps/%i.env' in unit
    assert 'Type=forking' in unit
    assert 'Restart=on-failure' in unit
    # quit's UI exit status is undocumented: systemd judges the stop by the daemon's exit ("-" ignores the status)
    assert "ExecStop=-/bin/sh -c 'echo \"quit -t $$MPS_STOP_TIMEOUT\" | \"$$MPS_CONTROL\"'" in unit
    assert 'ExecStartPost=' in unit and '$$MPS_LIMITS_FILE' in unit
    # systemd kills only after quit -t had its chance
    assert 'TimeoutStopSec=30' in unit


def test_env_file_is_sorted_and_refuses_values_that_could_break_out():
    text = _systemd.render_env('train', {'B': '2', 'A': '1'})
    assert text.splitlines()[1:] == ['A=1', 'B=2']
    for bad in ('x\ny=1', 'a"b', "a'b", 'a\\b', 'a\0b'):
        with pytest.raises(MpsError):
            _systemd.render_env('train', {'A': bad})


def test_the_pidfile_dropin_names_the_daemons_pid_file_and_refuses_what_a_unit_file_would_misread():
    dropin = _systemd.render_pidfile_dropin('/run/nvidia/mps/train/pipe/nvidia-cuda-mps-control.pid')
    assert '[Service]\nPIDFile=/run/nvidia/mps/train/pipe/nvidia-cuda-mps-control.pid\n' in dropin
    # A root that worked before the drop-in keeps working: spaces are one path, "%" is doubled (not a specifier).
    assert 'PIDFile=/a b/50%%/pipe/x.pid\n' in _systemd.render_pidfile_dropin('/a b/50%/pipe/x.pid')
    for bad in ('/a"b/x.pid', '/a\\b/x.pid', '/a\nb/x.pid'):
        with pytest.raises(MpsError, match='refusing to write'):
            _systemd.render_pidfile_dropin(bad)
    with pytest.raises(MpsError, match='without spaces'):
        _systemd.render_shm_dropin('/a b/shm')  # BindPaths= is a space-separated list


@pytest.mark.parametrize('with_pidfile', [False, True, 'a b%', 'foreground', 'order', 'v3'])
@pytest.mark.skipif(shutil.which('systemd-analyze') is None, reason='systemd-analyze not installed')
def test_rendered_unit_passes_systemd_analyze_verify_without_any_message(tmp_path, with_pidfile):
    config_dir = tmp_path / 'etc'
    config_dir.mkdir()
    (config_dir / 'train.env').write_text(_systemd.render_env('train', {
        'CUDA_MPS_PIPE_DIRECTORY': str(tmp_path / 'pipe'), 'CUDA_MPS_LOG_DIRECTORY': str(tmp_path / 'log'),
        'CUDA_VISIBLE_DEVICES': 'GPU-a', 'MPS_CONTROL': '/bin/true', 'MPS_DAEMON_ARGS': '', 'MPS_COMPUTE_MODE': '',
        'MPS_NVIDIA_SMI': '/bin/true', 'MPS_STOP_TIMEOUT': '5', 'MPS_LIMITS_FILE': str(tmp_path / 'limits'),
        'MPS_LOG_MODE': '0700'}))
    unit_dir = tmp_path / 'units'
    unit_dir.mkdir()
    (unit_dir / _systemd.UNIT_NAME).write_text(_systemd.render_unit(str(config_dir), 30, 30))
    os.symlink(_systemd.UNIT_NAME, unit_dir / 'gpufleet-mps@train.service')
    if with_pidfile in ('foreground', 'v3'):
        dropin_dir = unit_dir / 'gpufleet-mps@train.service.d'
        dropin_dir.mkdir()
        (dropin_dir / _systemd.FOREGROUND_DROPIN).write_text(_systemd.render_foreground_dropin(30, v3=with_pidfile == 'v3'))
        if with_pidfile == 'v3':  # an MPS v3 resource's: in the foreground, stopped with -q
            (dropin_dir / _systemd.V3_DROPIN).write_text(DROPIN_V3)
    elif with_pidfile == 'order':
        dropin_dir = unit_dir / 'gpufleet-mps@train.service.d'
        dropin_dir.mkdir()
        (dropin_dir / _systemd.ORDER_DROPIN).write_text(_systemd.render_order_dropin(
            ['slurmd.service', 'kubelet.service'], ['nvidia-fabricmanager.service', 'remote-fs.target']))
    elif with_pidfile:
        dropin_dir = unit_dir / 'gpufleet-mps@train.service.d'
        dropin_dir.mkdir()
        pipe = tmp_path / (with_pidfile if isinstance(with_pidfile, str) else 'pipe')
        (dropin_dir / _systemd.PIDFILE_DROPIN).write_text(_systemd.render_pidfile_dropin(str(pipe / 'nvidia-cuda-mps-control.pid')))
    proc = subprocess.run(['systemd-analyze', 'verify', '--man=no', str(unit_dir / 'gpufleet-mps@train.service')],
                          capture_output=True, text=True, check=False,
                          env=dict(os.environ, SYSTEMD_UNIT_PATH='%s:' % unit_dir, SYSTEMD_LOG_LEVEL='notice'))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ''


def test_instance_unit_name():
    assert _systemd.instance_unit('nvidia.com-gpu') == 'gpufleet-mps@nvidia.com-gpu.service'


def _exec_start_pre_shell(unit: str, needle: str) -> str:
    """The ``sh -c`` script of the ExecStartPre line containing ``needle``, as systemd hands it to sh."""
    line = next(line for line in unit.splitlines() if line.startswith('ExecStartPre=/bin/sh -c') and needle in line)
    return line.split("-c '", 1)[1].rsplit("'", 1)[0].replace('$$', '$')


@pytest.mark.parametrize('mode, existing', [('0700', None), ('0750', None), ('0755', 0o700), ('0700', 0o755), (None, 0o755)])
def test_unit_gives_the_log_directory_the_wanted_mode_new_or_existing(tmp_path, mode, existing):
    log_dir = tmp_path / 'res' / 'log'
    if existing is not None:
        log_dir.mkdir(parents=True)
        os.chmod(log_dir, existing)
    env = {'PATH': os.environ['PATH'], 'CUDA_MPS_LOG_DIRECTORY': str(log_dir)}
    if mode is not None:
        env['MPS_LOG_MODE'] = mode
    script = _exec_start_pre_shell(_systemd.render_unit('/etc/gpufleet-mps', 30, 30), 'MPS_LOG_MODE')
    subprocess.run(['/bin/sh', '-c', script], env=env, check=True)
    assert oct(os.stat(log_dir).st_mode & 0o7777) == oct(int(mode or '0700', 8))


def test_parse_env_reads_back_what_render_env_wrote():
    values = {'CUDA_VISIBLE_DEVICES': 'GPU-a,GPU-b', 'MPS_DAEMON_ARGS': '', 'MPS_LOG_MODE': '0700'}
    assert _systemd.parse_env(_systemd.render_env('nvidia.com/gpu', values)) == values


def _exec_start_post_shell(unit: str) -> str:
    line = next(line for line in unit.splitlines() if line.startswith('ExecStartPost=/bin/sh -c'))
    return line.split("-c '", 1)[1].rsplit("'", 1)[0].replace('$$', '$')


@pytest.mark.parametrize('reply, ok', [
    ('\n25.0\n', True),
    ('\n\n', False),  # no echo of the percentage sent: not taken
    ('Invalid value: 200\n25.0\n', False),
    ('\nError: unknown command\n', False),
    ('\n100.0\n', False),  # r580: a refused percentage answers the value in force, no error text
    ('\n25.0\n\n', True),
    # an SM partition created (binary 13010 and later): what client code parses, and NVIDIA's example's bare id
    ('\n25.0\nPartition GPU-a8aa752d-52a7-47f6-ab1d-d3295872ad6b/D/79e/Dgw+YMDAAAA= created\n', True),
    ('\n25.0\nGPU-a8aa752d-52a7-47f6-ab1d-d3295872ad6b/Dx4AAAAAAAAAAAAAAA\n', True),
    ('\n25.0\nFailed to fulfill the requested SM partition of 40 chunks, error CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION\n', False),
    ('\n25.0\nStatic partitioning is not enabled. Start the control daemon with -S\n', False),
])
def test_the_units_limit_replay_fails_with_the_daemons_text_when_a_command_is_rejected(tmp_path, reply, ok):
    limits = tmp_path / 'train.limits'
    limits.write_text('set_default_device_pinned_mem_limit 0 2048M\nset_default_active_thread_percentage 25\n')
    control = tmp_path / 'control'
    control.write_text('#!/bin/sh\ncat > /dev/null\nprintf %%s "%s"\n' % reply.replace('\n', '\\n'))
    control.chmod(0o755)
    script = _exec_start_post_shell(_systemd.render_unit('/etc/gpufleet-mps', 30, 30))
    proc = subprocess.run(['/bin/sh', '-c', script], capture_output=True, text=True, check=False,
                          env={'PATH': os.environ['PATH'], 'MPS_LIMITS_FILE': str(limits), 'MPS_CONTROL': str(control)})
    assert (proc.returncode == 0) is ok, proc.stderr
    if not ok:
        assert 'the daemon rejected a limit of %s' % limits in proc.stderr
        rejected = [line for line in reply.strip().splitlines() if not line.replace('.', '', 1).isdigit()] or reply.strip().splitlines()
        assert rejected[0] in proc.stderr if reply.strip() else 'answered , the value it keeps' in proc.stderr
        if reply.strip() == '100.0':
            assert 'set_default_active_thread_percentage 25 answered 100.0, the value it keeps' in proc.stderr


def test_the_units_limit_replay_fails_when_the_ui_cannot_reach_the_daemon(tmp_path):
    limits = tmp_path / 'train.limits'
    limits.write_text('set_default_active_thread_percentage 25\n')
    control = tmp_path / 'control'
    control.write_text('#!/bin/sh\necho "Cannot find MPS control daemon process"\nexit 1\n')
    control.chmod(0o755)
    script = _exec_start_post_shell(_systemd.render_unit('/etc/gpufleet-mps', 30, 30))
    proc = subprocess.run(['/bin/sh', '-c', script], capture_output=True, text=True, check=False,
                          env={'PATH': os.environ['PATH'], 'MPS_LIMITS_FILE': str(limits), 'MPS_CONTROL': str(control)})
    assert proc.returncode == 1 and 'Cannot find MPS control daemon process' in proc.stderr


def test_a_unit_that_fails_to_start_says_what_its_journal_ends_with(tmp_path):
    systemctl = tmp_path / 'systemctl'
    systemctl.write_text('#!/bin/sh\necho "Job for $2 failed because the control process exited with error code." >&2\nexit 1\n')
    journalctl = tmp_path / 'journalctl'
    journalctl.write_text('#!/bin/sh\necho "Starting NVIDIA CUDA MPS control daemon..."\n'
                          'echo "gpufleet-mps: the daemon rejected a limit of /etc/gpufleet-mps/train.limits: Invalid value: 250"\n')
    for script in (systemctl, journalctl):
        script.chmod(0o755)
    with pytest.raises(MpsError) as excinfo:
        _systemd.Systemctl(str(systemctl), journalctl=str(journalctl)).start('gpufleet-mps@train.service')
    assert 'control process exited with error code' in excinfo.value.msg
    assert 'the journal of gpufleet-mps@train.service ends with: ' in excinfo.value.msg
    assert 'rejected a limit of /etc/gpufleet-mps/train.limits: Invalid value: 250' in excinfo.value.msg


def test_the_foreground_dropin_runs_the_daemon_with_f_under_type_exec_and_replays_once_it_answers(tmp_path):
    text = _systemd.render_foreground_dropin(2)
    assert 'Type=exec' in text and '\nExecStart=\n' in text and '\nExecStartPost=\n' in text
    assert 'ExecStart=/bin/sh -c \'exec "$$MPS_CONTROL" -f $$MPS_DAEMON_ARGS $$MPS_STATIC_ARGS\'' in text
    limits = tmp_path / 'train.limits'
    limits.write_text('set_default_active_thread_percentage 25\n')
    answers = tmp_path / 'answers'
    control = tmp_path / 'control'
    # A daemon that answers from the third question on, as a foreground daemon does once its socket is up.
    control.write_text('#!/bin/sh\ncat > /dev/null\necho x >> %s\n[ "$(wc -l < %s)" -ge 3 ] || exit 1\necho 25.0\n' % (answers, answers))
    control.chmod(0o755)
    script = _exec_start_post_shell(text)
    env = {'PATH': os.environ['PATH'], 'MPS_LIMITS_FILE': str(limits), 'MPS_CONTROL': str(control)}
    proc = subprocess.run(['/bin/sh', '-c', script], capture_output=True, text=True, check=False, env=env)
    assert proc.returncode == 0, proc.stderr
    assert len(answers.read_text().splitlines()) == 4  # two refusals, the answer, the replay
    control.write_text('#!/bin/sh\nexit 1\n')
    proc = subprocess.run(['/bin/sh', '-c', script], capture_output=True, text=True, check=False, env=env)
    assert proc.returncode == 1 and 'did not answer within 2 s' in proc.stderr


def test_the_foreground_flag_is_in_the_environment_only_when_set():
    from ansible_collections.gpufleet.mps.plugins.module_utils._resource.layout import config_paths, resource_paths
    paths, config = resource_paths('/run/nvidia/mps', 'train'), config_paths('/etc/gpufleet-mps', 'train')
    plain = _systemd.unit_environment(paths, config, ['GPU-a'], multiuser=False, compute_mode='default', control_binary='/bin/c',
                                      nvidia_smi=None, stop_timeout=5, log_mode=0o700)
    assert 'MPS_FOREGROUND' not in plain  # environment files written before the option stay as they are: no restart
    assert _systemd.unit_environment(paths, config, ['GPU-a'], multiuser=False, compute_mode='default', control_binary='/bin/c',
                                     nvidia_smi=None, stop_timeout=5, log_mode=0o700, foreground=True)['MPS_FOREGROUND'] == '1'
    assert 'MPS_FOREGROUND' in _systemd.RESTART_ENV


def _fake_systemctl(tmp_path, stdout, rc=0):
    script = tmp_path / 'systemctl'
    (tmp_path / 'show.out').write_text(stdout)
    script.write_text('#!/bin/sh\necho "$@" >> %s/calls\ncat %s/show.out\nexit %d\n' % (tmp_path, tmp_path, rc))
    script.chmod(0o755)
    return _systemd.Systemctl(str(script))


def test_one_systemctl_show_says_whether_each_unit_is_active_and_enabled(tmp_path):
    """The answers of is-active --quiet and is-enabled --quiet for several units, from one process (systemctl(1): show
    prints one block per unit, in the order asked, a blank line between them; a unit not found has no UnitFileState)."""
    systemctl = _fake_systemctl(tmp_path, 'ActiveState=active\nUnitFileState=enabled\n\nActiveState=reloading\nUnitFileState=static\n\n'
                                          'ActiveState=inactive\nUnitFileState=disabled\n\nActiveState=failed\nUnitFileState=\n')
    units = ['gpufleet-mps@train.service', 'gpufleet-mps@infer.service', 'gpufleet-mps-health.timer', 'gpufleet-mps@gone.service']
    assert systemctl.states(units) == {units[0]: (True, True), units[1]: (True, True), units[2]: (False, False), units[3]: (False, False)}
    assert (tmp_path / 'calls').read_text().splitlines() == ['show --property=ActiveState,UnitFileState -- ' + ' '.join(units)]


@pytest.mark.parametrize('stdout, rc', [('ActiveState=active\nUnitFileState=enabled\n', 0), ('', 1)])
def test_a_systemctl_show_that_does_not_answer_for_every_unit_answers_for_none(tmp_path, stdout, rc):
    systemctl = _fake_systemctl(tmp_path, stdout, rc)
    assert systemctl.states(['a.service', 'b.service']) == {}


def test_unit_states_are_read_once_and_a_unit_systemctl_show_left_out_is_asked_alone(tmp_path):
    """The view's unit states: one systemctl show for them all; where it could not say, is-active/is-enabled once each.
    The decision then reads the view (a unit it was not read for is an internal error, never a systemctl run)."""
    real = _fake_systemctl(tmp_path, '')
    view = HostView()
    read_units(view, real, ['a.service', 'b.service'])
    calls = (tmp_path / 'calls').read_text().splitlines()
    assert calls[0].startswith('show') and len(calls) == 5, calls
    assert view.unit('a.service') == (True, True)
    with pytest.raises(ViewMiss):
        view.unit('c.service')


def test_the_order_dropin_says_before_and_after_and_is_absent_without_an_order():
    text = _systemd.render_order_dropin(['slurmd.service', 'kubelet.service'], ['nvidia-fabricmanager.service'])
    assert '[Unit]\nBefore=slurmd.service kubelet.service\nAfter=nvidia-fabricmanager.service\n' in text
    assert text.startswith('# Managed by the gpufleet.mps Ansible collection')
    assert '\nBefore=' not in _systemd.render_order_dropin([], ['a.target'])
    assert _systemd.render_order_dropin([], []) is None


@pytest.mark.parametrize('value, message', [
    (['slurmd'], "'slurmd' is not a systemd unit name: give the whole name with its type, for example slurmd.service"),
    (['slurmd.service\nExecStart=/bin/sh'], 'is not a systemd unit name'),
    (['a b.service'], 'is not a systemd unit name'),
    (['gpufleet-mps-health.timer'], 'gpufleet-mps-health.timer is a unit of this collection'),
    ('slurmd.service', 'must be a list of systemd unit names'),
])
def test_unit_order_names_are_whole_systemd_unit_names(value, message):
    with pytest.raises(InvalidParameterError, match='^unit_before: .*' + message.replace('(', r'\(').replace(')', r'\)')[:60]):
        _systemd.validate_units(value, 'unit_before')


def test_unit_order_names_are_kept_in_order_each_once():
    assert _systemd.validate_units(['slurmd.service', 'getty@tty1.service', 'slurmd.service', 'multi-user.target'], 'unit_before') == (
        'slurmd.service', 'getty@tty1.service', 'multi-user.target')
    assert _systemd.validate_units(None, 'unit_after') == () and _systemd.validate_units([], 'unit_after') == ()


def _unit_shell(unit: str, key: str) -> str:
    line = next(line for line in unit.splitlines() if line.startswith(key + '=') and "/bin/sh -c '" in line)
    return line.split("-c '", 1)[1].rsplit("'", 1)[0].replace('$$', '$')


@pytest.mark.parametrize('v3', [False, True])
def test_the_units_start_and_stop_speak_the_daemons_protocol(simhost, r615, v3):
    """ExecStart and ExecStop as systemd runs them, from the environment file, against the simulated r615 binary: a v3
    resource starts with -p 3 -a <file> and stops with -q; a legacy one as always (issue 43)."""
    import re  # pylint: disable=import-outside-toplevel
    from ansible_collections.gpufleet.mps.plugins.module_utils._resource.layout import config_paths, resource_paths
    from ansible_collections.gpufleet.mps.plugins.module_utils._v3.spec import NamespaceLimits, V3Spec
    r615()
    with open(os.environ['FAKE_NVML_CONFIG'], encoding='utf-8') as handle:
        text = handle.read()
    uuid = re.search(r'(?m)^uuid = (\S+)$', text).group(1)
    binary = str(simhost / 'host' / 'bin' / 'nvidia-cuda-mps-control')
    paths = resource_paths(str(simhost / 'root'), 'train')  # short: the sockets' paths must fit
    config = config_paths(str(simhost / 'etc'), 'train')
    spec = V3Spec('train', (uuid,), os.geteuid(), False, NamespaceLimits(40.0), (('small', NamespaceLimits(10.0)),)) if v3 else None
    os.makedirs(config.config_dir)
    if spec is not None:
        with open(config.v3_config, 'w', encoding='utf-8') as handle:
            handle.write(spec.toml())
    values = _systemd.unit_environment(paths, config, [uuid], multiuser=False, compute_mode='unchanged', control_binary=binary,
                                       nvidia_smi=None, stop_timeout=5, log_mode=0o700, v3=spec)
    assert ('MPS_V3_SERVER' in values) is v3 and ('-p 3 -a %s' % config.v3_config in values['MPS_DAEMON_ARGS']) is v3
    env = {key: value for key, value in os.environ.items() if not key.startswith('CUDA_MPS_')}
    env.update(values, MPS_STATIC_ARGS='')
    os.makedirs(paths.pipe_dir)
    os.makedirs(paths.log_dir)
    unit = _systemd.render_unit(config.config_dir, 30, 5)
    started = subprocess.run(['/bin/sh', '-c', _unit_shell(unit, 'ExecStart')], env=env, capture_output=True, text=True, timeout=30,
                             check=False)
    assert started.returncode == 0, started.stdout + started.stderr
    with open(os.path.join(paths.pipe_dir, 'nvidia-cuda-mps-control.pid'), encoding='utf-8') as handle:
        pid = int(handle.read())
    try:
        listed = subprocess.run([binary, 'namespace', 'list', '--server=train', '--format=csv,noheader'], env=env,
                                capture_output=True, text=True, timeout=30, check=False)
        assert (listed.returncode == 0 and 'small,train' in listed.stdout) is v3, listed.stdout
        # the foreground drop-in's wait (Type=exec: ExecStartPost runs as soon as the process does) asks in its protocol
        dropin = _systemd.render_foreground_dropin(2, v3=v3)
        waited = subprocess.run(['/bin/sh', '-c', _unit_shell(dropin, 'ExecStartPost').replace('$$', '$')], env=env,
                                capture_output=True, text=True, timeout=30, check=False)
        assert waited.returncode == 0, waited.stderr
        # the stop of the unit, or of a v3 resource's drop-in, which replaces it
        stop_from = DROPIN_V3 if v3 else unit
        stopped = subprocess.run(['/bin/sh', '-c', _unit_shell(stop_from, 'ExecStop')], env=env, capture_output=True, text=True,
                                 timeout=30, check=False)
        for _attempt in range(200):
            if not os.path.exists('/proc/%d' % pid) or open('/proc/%d/stat' % pid, encoding='utf-8').read().split(') ')[1][0] == 'Z':
                break
            subprocess.run(['sleep', '0.05'], check=False)
        else:
            raise AssertionError('ExecStop left the daemon running: %s' % (stopped.stdout + stopped.stderr))
    finally:
        if os.path.exists('/proc/%d' % pid):
            os.kill(pid, 9)
