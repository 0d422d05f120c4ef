# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import fcntl
import json
import os
import types

import pytest

from ansible_collections.gpufleet.mps.plugins.module_utils._limits import manager as _limits_manager, model as _limits, observe as _limits_observe
from ansible_collections.gpufleet.mps.plugins.module_utils._limits import store as _store, writes as _limits_writes
from ansible_collections.gpufleet.mps.plugins.module_utils._protocol import readback as _readback
from ansible_collections.gpufleet.mps.plugins.module_utils._errors import InvalidParameterError, MpsError
from ansible_collections.gpufleet.mps.plugins.module_utils._gpus import Gpu
from ansible_collections.gpufleet.mps.plugins.module_utils._limits.manager import LimitsManager
from ansible_collections.gpufleet.mps.plugins.module_utils._resource.layout import config_paths, resource_paths
from ansible_collections.gpufleet.mps.plugins.module_utils._resource.record import StartRecord, write_record


@pytest.mark.parametrize('value, mib', [
    ('20G', 20480), ('20480M', 20480), ('20GiB', 20480), ('20480MiB', 20480), ('1.5G', 1536), ('1.5GiB', 1536), ('512MiB', 512),
    ('3840m', 3840), ('1gib', 1024), ('20GIB', 20480), ('1M', 1), ('0.5G', 512),
])
def test_sizes_are_normalised_to_whole_mib(value, mib):
    assert _limits.parse_size(value, 'p') == mib


@pytest.mark.parametrize('value, message', [
    # Both readings, each in forms MPS takes; the decimal one rounded down (never more than meant).
    ('20GB', r"^pinned_device_mem_limit: '20GB' is ambiguous: GB is 10\^9 bytes to some and 2\^30 to others, and MPS only takes "
             r"binary sizes \(M = MiB, G = GiB\); write 20G, 20GiB, 20480M or 20480MiB for 20 x 2\^30 bytes, or 19073M for "
             r"20 x 10\^9 bytes \(rounded down to whole MiB\)$"),
    ('512MB', r"'512MB' is ambiguous: MB is 10\^6 bytes .*; write 512M or 512MiB for 512 x 2\^20 bytes, or 488M for 512 x 10\^6"),
    ('1gb', r"'1gb' is ambiguous: GB .*write 1G, 1GiB, 1024M or 1024MiB .* or 953M for 1 x 10\^9 bytes"),
    ('2Gb', r"'2Gb' is ambiguous"),
    ('1.5GB', r'write 1\.5G, 1\.5GiB, 1536M or 1536MiB for 1\.5 x 2\^30 bytes, or 1430M for 1\.5 x 10\^9 bytes'),
    ('1.3GB', r'write 1331M for 1\.3 x 2\^30 bytes \(rounded down to whole MiB\), or 1239M for 1\.3 x 10\^9 bytes'),
    ('1MB', r'write 1M or 1MiB for 1 x 2\^20 bytes$'),  # 10^6 bytes is less than 1 MiB: no decimal form offered
    ('0.5MB', r"'0\.5MB' is ambiguous .* and less than the smallest limit, 1M"),
    ('0GB', r"'0GB' is ambiguous .* and less than the smallest limit, 1M"),
])
def test_decimal_units_are_refused_not_guessed_with_both_readings(value, message):
    with pytest.raises(InvalidParameterError, match=message) as excinfo:
        _limits.parse_size(value, 'pinned_device_mem_limit')
    assert excinfo.value.param == 'pinned_device_mem_limit'


@pytest.mark.parametrize('value', ['20Gi', '20T', '20TiB', '20K', '20KiB', '20 GiB', '20GiBB', '20GIBB', '20iB', '20B', '20g b', 'GB'])
def test_other_units_are_refused_naming_the_valid_forms(value):
    with pytest.raises(InvalidParameterError, match=r'^p: .* is not a size: a number and the unit M, MiB, G or GiB, such as 20G, 20GiB, '
                                                    r'20480M, 20480MiB or 1\.5G \(M and MiB are 2\^20 bytes, G and GiB 2\^30'):
        _limits.parse_size(value, 'p')


def test_a_limit_over_a_gpus_memory_is_refused_naming_the_gpu_and_its_size(manager):
    gpus = [gpu(0, 'Tesla T4', 15360), gpu(1, 'Tesla T4', 15360)]
    with pytest.raises(InvalidParameterError, match=r'^pinned_device_mem_limit: 16384 MiB \(16 GiB\) is more than GPU 0 '
                                                    r'\(GPU-00000000-0000-0000-0000-000000000000, Tesla T4\) has: 15360 MiB '
                                                    r'\(15 GiB\); give at most 15360M$'):
        manager(gpus).wanted(gpus, None, '16G', None, **FIRST_START)
    with pytest.raises(InvalidParameterError, match='more than GPU 1'):
        manager(gpus).wanted(gpus, None, {1: '20G'}, None, **FIRST_START)
    with pytest.raises(InvalidParameterError, match='15361 MiB'):
        manager(gpus).wanted(gpus, None, '15361M', None, **FIRST_START)
    assert manager(gpus).wanted(gpus, None, '15G', None, **FIRST_START).mem_for(gpus[0].uuid) == 15360  # all of it is allowed
    assert manager(gpus).wanted(gpus, None, '15360MiB', None, **FIRST_START).mem_for(gpus[1].uuid) == 15360


def test_check_fits_names_the_gpu_with_an_odd_size_in_gib():
    h100 = gpu(3, 'NVIDIA H100 80GB HBM3', 81559, (9, 0))
    with pytest.raises(InvalidParameterError, match=r'^p: 81920 MiB \(80 GiB\) is more than GPU 3 \(GPU-00000003-0000-0000-0000-000000000000, '
                                                    r'NVIDIA H100 80GB HBM3\) has: 81559 MiB \(79\.65 GiB\); give at most 81559M$'):
        _limits.check_fits({_limits.EVERY_GPU: 81920}, [h100], 'p')
    _limits.check_fits({_limits.EVERY_GPU: 81559}, [h100], 'p')
    _limits.check_fits({'GPU-other': 99999}, [h100], 'p')  # a size for another GPU is not this one's


@pytest.mark.parametrize('value', ['0M', '-1G', '12X', '1e3M', '', '5G\nquit', ' 5G', '5 G', '5G ', '1.3G', '1000', 1000, True, None, 'G'])
def test_bad_sizes_name_the_parameter(value):
    with pytest.raises(InvalidParameterError) as excinfo:
        _limits.parse_size(value, 'pinned_device_mem_limit')
    assert excinfo.value.param == 'pinned_device_mem_limit'


@pytest.mark.parametrize('value', [0, -5, 101, 'abc', 'nan', float('nan'), True, None, '100.01'])
def test_bad_percentages_are_refused(value):
    with pytest.raises(InvalidParameterError):
        _limits.parse_percentage(value)


@pytest.mark.parametrize('value, expected', [(25, 25.0), ('25.0', 25.0), (100, 100.0), (0.5, 0.5), ('33.3', 33.3)])
def test_percentages_compare_as_numbers(value, expected):
    assert _limits.parse_percentage(value) == expected
    assert _limits.percentage_matches(float(expected), _limits.parse_percentage(value))


@pytest.mark.parametrize('text, mib, matches', [
    ('3G', 3840, True),    # the lossy read-back of 3840M
    ('1G', 1044, True),
    ('3G', 3072, True),
    ('3G', 4096, False),
    ('512M', 512, True),
    ('512M', 513, False),
    ('0M', 512, False),    # unset, however the daemon prints it
    ('0', 512, False),
    ('', 512, False),
])
def test_readback_is_compared_at_the_granularity_the_daemon_reports(text, mib, matches):
    assert _limits.readback_matches(_readback.parse_readback(text), mib) is matches


@pytest.mark.parametrize('text', ['N/A', 'No limit', 'unlimited', 'Invalid device', '3.5G', '-1M'])
def test_a_readback_that_is_no_size_is_unknown_and_matches_no_wanted_limit(text):
    assert _readback.parse_readback(text) is None
    assert not _readback.readback_readable(text)
    assert not _limits.readback_matches(_readback.parse_readback(text), 2048)


@pytest.mark.parametrize('text', ['', '0', '0M', '3G', '512M'])
def test_sizes_and_the_plain_unset_forms_are_readable(text):
    assert _readback.readback_readable(text)


def gpu(index, name, mib, cc=(7, 5)):
    return Gpu(index, 'GPU-%08d-0000-0000-0000-000000000000' % index, name, mib, cc, 'default', None, None, True)


@pytest.fixture
def manager(tmp_path):
    def make(gpus, **options):
        return LimitsManager(resource_paths(str(tmp_path / 'root'), 'r'), config_paths(str(tmp_path / 'etc'), 'r'), None, gpus,
                             check_mode=False, **options)
    return make


# What a run reads of a new resource before its first start: nothing persisted, its daemon's GPUs not known yet.
FIRST_START = {'previous': None, 'scope_known': False}


def test_device_plugin_example_t4_replicas_4(manager):
    t4s = [gpu(i, 'Tesla T4', 15360) for i in range(4)]
    limits = manager(t4s).wanted(t4s, None, None, 4, **FIRST_START)
    assert limits.commands([g.uuid for g in t4s]) == [
        'set_default_device_pinned_mem_limit 0 3840M', 'set_default_device_pinned_mem_limit 1 3840M',
        'set_default_device_pinned_mem_limit 2 3840M', 'set_default_device_pinned_mem_limit 3 3840M',
        'set_default_active_thread_percentage 25.0']


def test_device_plugin_example_l40s_replicas_10(manager):
    l40s = [gpu(0, 'NVIDIA L40S', 46068, (8, 9))]
    limits = manager(l40s).wanted(l40s, None, None, 10, **FIRST_START)
    assert limits.commands([l40s[0].uuid]) == ['set_default_device_pinned_mem_limit 0 4606M', 'set_default_active_thread_percentage 10.0']


def test_explicit_values_override_the_computed_ones(manager):
    t4s = [gpu(i, 'Tesla T4', 15360) for i in range(2)]
    limits = manager(t4s).wanted(t4s, 30, {1: '1G'}, 4, **FIRST_START)
    assert limits.active_thread_percentage == 30.0
    assert limits.pinned_device_mem_limit == {t4s[1].uuid: 1024}
    assert limits.replicas == 4


def test_replicas_times_an_explicit_pinned_limit_may_not_exceed_the_gpu_unless_oversubscribed(manager):
    t4s = [gpu(i, 'Tesla T4', 15360) for i in range(2)]
    # 3840M x 4 = 15360M: exactly the GPU, allowed; one MiB more for each of the 4 replicas is not
    assert manager(t4s).wanted(t4s, None, '3840M', 4, **FIRST_START).pinned_device_mem_limit == {'*': 3840}
    with pytest.raises(InvalidParameterError, match=r'^pinned_device_mem_limit: 4096 MiB for each of 4 replicas is 16384 MiB \(16 GiB\), '
                                                    r'more than GPU 0 \(GPU-00000000-0000-0000-0000-000000000000, Tesla T4\) has: '
                                                    r'15360 MiB; give at most 3840M, or set oversubscribe=true'):
        manager(t4s).wanted(t4s, None, '4G', 4, **FIRST_START)
    # a mapping is checked GPU by GPU: GPU 1 oversubscribed, GPU 0 not
    with pytest.raises(InvalidParameterError, match='more than GPU 1 '):
        manager(t4s).wanted(t4s, None, {0: '1G', 1: '8G'}, 4, **FIRST_START)
    assert manager(t4s, oversubscribe=True).wanted(t4s, None, '4G', 4, **FIRST_START).pinned_device_mem_limit == {'*': 4096}
    # without replicas there is nothing to oversubscribe
    assert manager(t4s).wanted(t4s, None, '15G', None, **FIRST_START).pinned_device_mem_limit == {'*': 15360}


@pytest.mark.parametrize('replicas, cc, ok', [(48, (7, 0), True), (49, (7, 0), False), (16, (6, 1), True), (17, (6, 1), False),
                                              (48, (7, 5), True), (0, (9, 0), False)])
def test_replicas_are_checked_against_the_client_limit_volta_from_7_0(manager, replicas, cc, ok):
    gpus = [gpu(0, 'x', 16000, cc)]
    if ok:
        assert manager(gpus).wanted(gpus, None, None, replicas, **FIRST_START).replicas == replicas
    else:
        with pytest.raises(InvalidParameterError) as excinfo:
            manager(gpus).wanted(gpus, None, None, replicas, **FIRST_START)
        assert excinfo.value.param == 'replicas'


@pytest.mark.parametrize('replicas, driver, ok', [(60, '590.44.01', True), (61, '590.44.01', False), (49, '580.95.05', False),
                                                  (48, '580.95.05', True), (49, None, False), (17, '590.44.01', False)])
def test_the_client_limit_follows_the_driver_60_from_r590(manager, replicas, driver, ok):
    cc = (6, 0) if replicas == 17 else (9, 0)
    gpus = [Gpu(0, 'GPU-%08d-0000-0000-0000-000000000000' % 0, 'x', 141000, cc, 'default', None, None, True, driver)]
    if ok:
        assert manager(gpus).wanted(gpus, None, None, replicas, **FIRST_START).replicas == replicas
    else:
        with pytest.raises(InvalidParameterError, match='exceeds the %d MPS clients' % gpus[0].max_mps_clients):
            manager(gpus).wanted(gpus, None, None, replicas, **FIRST_START)


def test_memory_keys_must_be_the_daemons_gpus_and_given_once(manager):
    gpus = [gpu(i, 'x', 16000) for i in range(3)]
    mgr = manager(gpus)
    with pytest.raises(InvalidParameterError, match='not one of the daemon'):
        mgr.wanted(gpus[:2], None, {2: '1G'}, None, **FIRST_START)
    with pytest.raises(InvalidParameterError, match='given twice'):
        mgr.wanted(gpus, None, {0: '1G', gpus[0].uuid: '2G'}, None, **FIRST_START)


def test_one_size_means_every_gpu_of_the_daemon_in_its_order(manager):
    gpus = [gpu(i, 'x', 16000) for i in range(3)]
    limits = manager(gpus).wanted(gpus, None, '2G', None, **FIRST_START)
    assert limits.commands([gpus[2].uuid, gpus[0].uuid]) == [
        'set_default_device_pinned_mem_limit 0 2048M', 'set_default_device_pinned_mem_limit 1 2048M']


def test_persisted_record_round_trips_and_unknown_formats_are_ignored(tmp_path):
    config = config_paths(str(tmp_path), 'nvidia.com/gpu')
    limits = _limits.Limits(25.0, {'GPU-a': 3840}, 4)
    assert _store.persist(config, limits, check_mode=False)
    assert not _store.persist(config, limits, check_mode=False)
    assert _store.read_persisted(config) == limits
    assert config.limits_json.endswith('/nvidia.com-gpu.limits.json')
    with open(config.limits_json, 'w') as handle:
        json.dump({'format': 99}, handle)
    assert _store.read_persisted(config) is None


def test_check_mode_persists_nothing(tmp_path):
    config = config_paths(str(tmp_path), 'r')
    assert _store.persist(config, _limits.Limits(50.0), check_mode=True)
    assert not (tmp_path / 'r.limits.json').exists()


def test_replay_file_refuses_anything_but_limit_commands(tmp_path):
    config = config_paths(str(tmp_path), 'r')
    (tmp_path / 'r.limits').write_text('set_default_active_thread_percentage 25\nquit\n')
    with pytest.raises(MpsError, match='not a limit command'):
        _store.read_replay(config)
    (tmp_path / 'r.limits').write_text('set_default_active_thread_percentage 25;quit\n')
    with pytest.raises(InvalidParameterError):
        _store.read_replay(config)


class RecordingLock:
    """A resource lock that records whether it is held."""

    def __init__(self):
        self.held = False

    def __enter__(self):
        self.held = True
        return self

    def __exit__(self, *exc_info):
        self.held = False


def test_the_state_acted_on_is_read_under_the_resource_lock(tmp_path, monkeypatch):
    # The resource is read once, under the lock, and everything is judged from that read - the refusals too (a refused run
    # removes the lock it made): a concurrent mps_daemon or mps_limits run on the resource is seen whole or not at all.
    lock = RecordingLock()
    monkeypatch.setattr(_limits_manager, 'resource_lock', lambda paths: lock)
    daemon = types.SimpleNamespace(client=types.SimpleNamespace(processes=0))
    limits = LimitsManager(resource_paths(str(tmp_path / 'root'), 'train'), config_paths(str(tmp_path / 'etc'), 'train'),
                           daemon, [gpu(0, 'Tesla T4', 15360)], check_mode=False)
    seen = []
    original = _limits_manager.daemon_scope

    def daemon_scope(*args, **kwargs):
        seen.append(lock.held)
        return original(*args, **kwargs)

    monkeypatch.setattr(_limits_manager, 'daemon_scope', daemon_scope)
    out = limits.ensure(None, None, 4, 'ignore', persist_limits=True, create=True)
    assert seen and all(seen)
    assert out.persisted and not lock.held


def test_the_resource_lock_is_held_while_limits_are_written_with_no_daemon_running(tmp_path, monkeypatch):
    paths = resource_paths(str(tmp_path / 'root'), 'train')
    limits = LimitsManager(paths, config_paths(str(tmp_path / 'etc'), 'train'), None, [gpu(0, 'Tesla T4', 15360)],
                           check_mode=False)
    held = []
    original = _limits_writes.persist

    def persist(*args, **kwargs):
        # Another writer (an mps_daemon start of this resource) tries the same lock while the record is written.
        probe = os.open(os.path.join(paths.resource_dir, '.lock'), os.O_RDWR)
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held.append(False)
        except BlockingIOError:
            held.append(True)
        finally:
            os.close(probe)
        return original(*args, **kwargs)

    monkeypatch.setattr(_limits_writes, 'persist', persist)
    out = limits.ensure(None, None, 4, 'ignore', persist_limits=True, create=True)
    assert out.persisted and not out.running
    assert held and all(held)  # planning and applying, both under the lock


def test_with_the_daemon_down_the_commands_file_follows_the_environment_files_device_order(tmp_path):
    gpus = [gpu(0, 'Tesla T4', 15360), gpu(1, 'Tesla T4', 15360)]
    config = config_paths(str(tmp_path / 'etc'), 'train')
    os.makedirs(config.config_dir)
    with open(config.env_file, 'w') as handle:
        handle.write('CUDA_VISIBLE_DEVICES=%s,%s\n' % (gpus[1].uuid, gpus[0].uuid))
    limits = LimitsManager(resource_paths(str(tmp_path / 'root'), 'train'), config, None, gpus, check_mode=False)
    out = limits.ensure(None, {gpus[1].uuid: '1G'}, None, 'ignore', persist_limits=True, create=True)
    assert out.persisted
    with open(config.limits_file) as handle:
        assert handle.read() == 'set_default_device_pinned_mem_limit 0 1024M\n'  # GPU 1 is the daemon's device 0


# --- sizes against the daemon's GPUs, known or not yet known -------------------------------------------------------

H100 = gpu(0, 'NVIDIA H100 80GB HBM3', 81559, (9, 0))
T4 = gpu(1, 'Tesla T4', 15360)


def limits_manager(tmp_path, gpus, check_mode=False, name='big'):
    return LimitsManager(resource_paths(str(tmp_path / 'root'), name), config_paths(str(tmp_path / 'etc'), name), None, gpus,
                         check_mode=check_mode)


def started(tmp_path, devices, name='big', started_at='2026-12-03T18:00:00+00:00'):
    """A start record of a daemon that is not running now, as a crash leaves it."""
    paths = resource_paths(str(tmp_path / 'root'), name)
    os.makedirs(paths.resource_dir, exist_ok=True)
    write_record(paths, StartRecord(devices=[g.uuid for g in devices], supervisor='none', pid=4194303, started_at=started_at))
    return paths


def test_before_the_first_start_one_size_is_refused_only_when_no_gpu_of_the_host_takes_it(tmp_path):
    # A mixed host: this resource will run on the H100, another one on the T4. Its daemon's GPUs are not known before
    # its first start (the fleet role's order), so 40G is not refused for the T4; the role's pre-flight checks it
    # against the resource's own GPUs.
    out = limits_manager(tmp_path, [H100, T4]).ensure(None, '40G', None, 'ignore', persist_limits=True, create=True)
    assert out.persisted and not out.applied and out.warnings == []
    with pytest.raises(InvalidParameterError, match=r'^pinned_device_mem_limit: 81920 MiB \(80 GiB\) is more than GPU 0 \(%s, '
                                                    r'NVIDIA H100 80GB HBM3\) has: 81559 MiB' % H100.uuid):
        limits_manager(tmp_path, [H100, T4]).ensure(None, '80G', None, 'ignore', persist_limits=True, create=True)


def test_before_the_first_start_a_size_for_a_named_gpu_is_checked_against_that_gpu(tmp_path):
    with pytest.raises(InvalidParameterError, match=r'16384 MiB \(16 GiB\) is more than GPU 1 \(%s, Tesla T4\) has: 15360 MiB' % T4.uuid):
        limits_manager(tmp_path, [H100, T4]).ensure(None, {1: '16G'}, None, 'ignore', persist_limits=True, create=True)
    assert not (tmp_path / 'etc').exists()  # refused before anything was written


@pytest.mark.parametrize('how', ['record', 'environment'])
def test_once_the_daemons_gpus_are_known_one_size_is_checked_against_each_of_them(tmp_path, how):
    if how == 'record':
        started(tmp_path, [T4])
    else:
        os.makedirs(str(tmp_path / 'etc'))
        (tmp_path / 'etc' / 'big.env').write_text('CUDA_VISIBLE_DEVICES=%s\n' % T4.uuid)
        assert config_paths(str(tmp_path / 'etc'), 'big').env_file == str(tmp_path / 'etc' / 'big.env')
    with pytest.raises(InvalidParameterError, match=r'40960 MiB \(40 GiB\) is more than GPU 1 \(%s, Tesla T4\) has: 15360 MiB '
                                                    r'\(15 GiB\); give at most 15360M' % T4.uuid):
        limits_manager(tmp_path, [H100, T4]).ensure(None, '40G', None, 'ignore', persist_limits=True, create=True)
    assert not os.path.exists(config_paths(str(tmp_path / 'etc'), 'big').limits_json)


def test_before_the_first_start_replicas_are_refused_only_when_no_gpu_of_the_host_takes_them(tmp_path):
    v100, p100 = gpu(0, 'Tesla V100', 16000, (7, 0)), gpu(1, 'Tesla P100', 16000, (6, 0))
    out = limits_manager(tmp_path, [v100, p100]).ensure(None, None, 40, 'ignore', persist_limits=True, create=True)
    assert out.limits['replicas'] == 40
    with pytest.raises(InvalidParameterError, match='exceeds the 48 MPS clients of GPU 0'):
        limits_manager(tmp_path, [v100, p100]).ensure(None, None, 49, 'ignore', persist_limits=True, create=True)
    started(tmp_path, [p100])
    with pytest.raises(InvalidParameterError, match='exceeds the 16 MPS clients of GPU 1'):
        limits_manager(tmp_path, [v100, p100]).ensure(None, None, 40, 'ignore', persist_limits=True, create=True)


# --- a daemon that is not running: a warning only when it was expected to run --------------------------------------

@pytest.mark.parametrize('check_mode', [False, True])
def test_persisting_before_the_first_start_does_not_warn_and_says_why_nothing_was_applied(tmp_path, check_mode):
    out = limits_manager(tmp_path, [T4], check_mode=check_mode).ensure(None, None, 4, 'ignore', persist_limits=True, create=True)
    assert out.warnings == []
    assert not out.applied and not out.running and out.persisted and out.commands == []
    assert out.msg == ("the MPS control daemon of 'big' is not running (not started yet, or stopped): the limits %s persisted, "
                       "not applied now; its next start applies them" % ('would be' if check_mode else 'are'))


def test_a_stopped_daemon_does_not_warn(tmp_path):
    # mps_daemon state=stopped removes the start record and the pipe-dir files: nobody expects it to run.
    paths = resource_paths(str(tmp_path / 'root'), 'big')
    os.makedirs(paths.pipe_dir)
    limits_manager(tmp_path, [T4]).ensure(None, None, 4, 'ignore', persist_limits=True, create=True)
    out = limits_manager(tmp_path, [T4]).ensure(50, None, None, 'ignore', persist_limits=True, create=False)
    assert out.warnings == [] and out.persisted and not out.applied
    assert 'not started yet, or stopped' in out.msg


def test_a_daemon_that_was_started_and_is_not_running_warns(tmp_path):
    started(tmp_path, [T4])
    out = limits_manager(tmp_path, [T4]).ensure(None, '8G', None, 'ignore', persist_limits=True, create=False)
    assert out.persisted and not out.applied and not out.running
    assert out.warnings == [out.msg]
    assert out.msg == ("the MPS control daemon of 'big' was started (2026-12-03T18:00:00+00:00) but is not running now (crashed "
                       "or killed?): the limits are persisted, not applied now; they will be applied when it starts again")


def test_files_a_dead_daemon_left_in_its_pipe_directory_warn_without_a_record(tmp_path):
    paths = resource_paths(str(tmp_path / 'root'), 'big')
    os.makedirs(paths.pipe_dir)
    with open(os.path.join(paths.pipe_dir, 'nvidia-cuda-mps-control.pid'), 'w') as handle:
        handle.write('not a pid\n')
    out = limits_manager(tmp_path, [T4]).ensure(None, None, 4, 'ignore', persist_limits=True, create=True)
    assert len(out.warnings) == 1 and out.warnings[0] == out.msg
    assert "left nvidia-cuda-mps-control.pid in %s but is not running now" % paths.pipe_dir in out.msg


def test_persist_false_with_no_daemon_says_nothing_was_done(tmp_path):
    started(tmp_path, [T4])
    out = limits_manager(tmp_path, [T4]).ensure(None, '8G', None, 'ignore', persist_limits=False, create=True)
    assert not out.persisted and not out.applied and not out.changed
    assert out.warnings == ['record=false and no daemon is running: nothing was done']
    assert out.msg == "the MPS control daemon of 'big' is not running and record=false: nothing was done"


@pytest.mark.parametrize('value, expected', [('normal', 0), ('below_normal', 1), ('BELOW_NORMAL', 1), (0, 0), (1, 1), ('1', 1)])
def test_client_priorities_by_name_or_number(value, expected):
    assert _limits.parse_priority(value) == expected


@pytest.mark.parametrize('value', ['high', 2, -1, True, 0.5, '', None])
def test_other_client_priorities_are_refused_naming_the_forms(value):
    with pytest.raises(InvalidParameterError, match='client_priority.*normal or below_normal'):
        _limits.parse_priority(value)


def test_a_record_without_client_priority_reads_and_writes_as_before():
    """Hosts provisioned before client priority keep their record byte for byte: the key only appears when managed."""
    before = _limits.Limits(25.0, {'*': 1024}, 4)
    assert 'client_priority' not in before.to_json()
    assert _limits.Limits.from_data(json.loads(before.to_json())) == before
    with_priority = _limits.Limits(25.0, {'*': 1024}, 4, 1)
    assert json.loads(with_priority.to_json())['client_priority'] == 1
    assert _limits.Limits.from_data(json.loads(with_priority.to_json())) == with_priority
    assert with_priority.commands(['GPU-a']) == ['set_default_device_pinned_mem_limit 0 1024M',
                                                 'set_default_active_thread_percentage 25.0', 'set_default_client_priority 1']
    assert not _limits.Limits(client_priority=0).empty


def test_a_slice_is_an_equal_share_of_each_gpu_capped_by_what_the_daemon_hands_out():
    assert _limits.slice_env(4, [81559, 40960]) == {'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE': '25.0',
                                                    'CUDA_MPS_PINNED_DEVICE_MEM_LIMIT': '0=20389M,1=10240M'}
    assert _limits.slice_env(3, [])['CUDA_MPS_ACTIVE_THREAD_PERCENTAGE'] == '33.3'
    # a daemon at 20 % with a 10G limit on ordinal 0: its clients cannot take more, whatever the slice
    capped = _limits.slice_env(2, [81559, 81559], 20.0, [10240, None], priority=1)
    assert capped == {'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE': '20.0', 'CUDA_MPS_PINNED_DEVICE_MEM_LIMIT': '0=10240M,1=40779M',
                      'CUDA_MPS_CLIENT_PRIORITY': '1'}


@pytest.mark.parametrize('slices', [0, 101, True, '4', None])
def test_a_slice_count_out_of_range_is_refused_naming_slices(slices):
    with pytest.raises(InvalidParameterError, match='slices.*from 1 to 100'):
        _limits.slice_env(slices, [])


def _named(name, clients=48):
    return types.SimpleNamespace(name=name, max_mps_clients=clients, is_mig=False, index=0, uuid='GPU-x', label='GPU 0')


@pytest.mark.parametrize('name, replicas, warns', [
    ('NVIDIA A16', 5, None), ('NVIDIA A16', 6, 'above 5 replicas on NVIDIA A16'),
    ('Tesla T4', 21, None), ('Tesla T4', 22, 'above 21 replicas'),
    ('NVIDIA A30', 31, 'above 30 replicas'),
    ('NVIDIA H100 80GB HBM3', 24, None), ('NVIDIA H100 80GB HBM3', 25, 'more than half of its 48 MPS clients'),
])
def test_replica_counts_near_what_a_gpu_sustains_warn_citing_the_source(name, replicas, warns):
    found = _limits.replica_warnings(replicas, [_named(name)])
    if warns is None:
        assert found == []
    else:
        (text,) = found
        assert warns in text and 'CUDA_DEVICE_MAX_CONNECTIONS' in text, text
        assert ('k8s-device-plugin#1118' in text) == ('above' in warns and 'half' not in warns)


def test_what_mps_limits_is_not_given_keeps_its_persisted_value(manager, tmp_path):
    """A run that sets only the percentage keeps the persisted client priority and SM partitions (it dropped the priority)."""
    h100 = [gpu(0, 'NVIDIA H100 80GB HBM3', 81559, (9, 0))]
    made = manager(h100)
    os.makedirs(made.config.config_dir)
    _store.persist(made.config, _limits.Limits(50.0, {}, None, 1, (8, 4)), check_mode=False)
    persisted = _store.read_persisted(made.config, _limits_observe.file_reader(made.observe_own(), made.config, 'r'))
    kept = made.wanted(h100, 25, None, None, previous=persisted, scope_known=False)
    assert (kept.active_thread_percentage, kept.client_priority, kept.sm_partitions) == (25.0, 1, (8, 4))
    assert manager(h100, sm_partitions=[]).wanted(h100, None, None, None, previous=persisted, scope_known=False).sm_partitions == ()


def test_mps_limits_warns_when_a_share_is_less_than_one_sm_of_its_mig_device(tmp_path):
    from ansible_collections.gpufleet.mps.plugins.module_utils._gpus import MigDevice  # pylint: disable=import-outside-toplevel
    small = MigDevice(0, 'MIG-small', 'NVIDIA H100 80GB HBM3 MIG 1g.10gb', 9984, (9, 0), 'unsupported', None, None, None,
                      mig_index=0, profile='1g.10gb', multiprocessor_count=16, compute_instance_slices=1)
    started(tmp_path, [small])
    out = limits_manager(tmp_path, [small]).ensure(5, None, None, 'ignore', persist_limits=True, create=False)
    assert [w for w in out.warnings if 'SMs' in w] == [
        'active_thread_percentage: 5.0%% of the 16 SMs of %s is less than one SM; the smallest percentage that gives one is 6.3'
        % small.label]
    out = limits_manager(tmp_path, [small]).ensure(6.3, None, None, 'ignore', persist_limits=True, create=False)
    assert [w for w in out.warnings if 'SMs' in w] == []
