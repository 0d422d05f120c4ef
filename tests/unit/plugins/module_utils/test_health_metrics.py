# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The health check's Prometheus textfile (``render_health(metrics_dir=...)``).

Rendered with and without a metrics directory (without one, byte for byte the script hosts already run), checked
by shellcheck, and run with ``sh`` as the timer runs it: against simulated daemons (servers, a connected client,
limits, a hung and a killed daemon) and against a fake control binary written here for what a simulator does not
do on demand (garbage, a dropped session, a missing binary, servers that are not the daemon's children). Every
textfile is read back with a strict parser of the text exposition format (prometheus_client is not in the venv).
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import signal
import stat
import string
import subprocess
import sys
import time
import typing as t

import pytest

from ansible_collections.gpufleet.mps.plugins.module_utils import _gpus
from ansible_collections.gpufleet.mps.plugins.module_utils._proc import pid_alive
from ansible_collections.gpufleet.mps.plugins.module_utils._errors import MpsError
from ansible_collections.gpufleet.mps.plugins.module_utils._resource.layout import config_paths, resource_paths
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.health import render_health
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.metrics import (
    ERROR_REASONS, METRICS, METRICS_FILE, label_value, render_metrics_script)
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.liveness import inspect
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.process import daemon_env
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.unit import render_env, unit_environment

SCRIPT = '/usr/local/sbin/gpufleet-mps-health'


# --- a strict reader of Prometheus' text exposition format (0.0.4) ----------------------------------------------------
_NAME = re.compile(r'[a-zA-Z_:][a-zA-Z0-9_:]*')
_LABEL_NAME = re.compile(r'[a-zA-Z_][a-zA-Z0-9_]*')
_FLOAT = re.compile(r'[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|Inf|inf)|NaN')
_TYPES = ('counter', 'gauge', 'histogram', 'summary', 'untyped')
_SUFFIXES = {'histogram': ('_bucket', '_sum', '_count'), 'summary': ('_sum', '_count'), 'counter': ('_total',)}


class Family(t.NamedTuple):
    kind: str
    help: str
    samples: t.Dict[t.Tuple[str, t.Tuple[t.Tuple[str, str], ...]], float]


def _unescape(text: str, allowed: str, where: str) -> str:
    out, i = [], 0
    while i < len(text):
        char = text[i]
        if char == '\\':
            nxt = text[i + 1:i + 2]
            if not nxt or nxt not in allowed:
                raise ValueError('%s: bad escape \\%s in %r' % (where, nxt, text))
            out.append('\n' if nxt == 'n' else nxt)
            i += 2
            continue
        out.append(char)
        i += 1
    return ''.join(out)


def _labels(text: str, where: str) -> t.Tuple[t.Tuple[str, str], ...]:
    """``name="value",...`` (an optional trailing comma) -> sorted pairs; refuses anything else."""
    pairs: t.Dict[str, str] = {}
    pos = 0
    while pos < len(text):
        match = _LABEL_NAME.match(text, pos)
        if not match or text[match.end():match.end() + 2] != '="':
            raise ValueError('%s: bad label at %r' % (where, text[pos:]))
        name = match.group()
        pos = match.end() + 2
        end = pos
        while end < len(text) and text[end] != '"':
            end += 2 if text[end] == '\\' else 1
        if end >= len(text):
            raise ValueError('%s: unterminated label value' % where)
        if name in pairs:
            raise ValueError('%s: label %s twice' % (where, name))
        pairs[name] = _unescape(text[pos:end], '\\"n', where)
        pos = end + 1
        if pos < len(text):
            if text[pos] != ',':
                raise ValueError('%s: expected "," after label %s' % (where, name))
            pos += 1
    return tuple(sorted(pairs.items()))


def _split_sample(line: str, where: str) -> t.Tuple[str, t.Tuple[t.Tuple[str, str], ...], float]:
    match = _NAME.match(line)
    if not match:
        raise ValueError('%s: no metric name: %r' % (where, line))
    name, rest = match.group(), line[match.end():]
    labels: t.Tuple[t.Tuple[str, str], ...] = ()
    if rest.startswith('{'):
        end, quoted = 1, False
        while end < len(rest) and (quoted or rest[end] != '}'):
            if quoted and rest[end] == '\\':
                end += 1
            elif rest[end] == '"':
                quoted = not quoted
            end += 1
        if end >= len(rest):
            raise ValueError('%s: unterminated label set: %r' % (where, line))
        labels = _labels(rest[1:end], where)
        rest = rest[end + 1:]
    fields = rest.split(' ')
    if fields[0] != '' or len(fields) not in (2, 3) or not _FLOAT.fullmatch(fields[1]):
        raise ValueError('%s: bad value or timestamp: %r' % (where, line))
    if len(fields) == 3 and not re.fullmatch(r'-?\d+', fields[2]):
        raise ValueError('%s: bad timestamp: %r' % (where, line))
    return name, labels, float(fields[1].replace('Inf', 'inf'))


def parse_exposition(text: str) -> t.Dict[str, Family]:
    """Every family of a textfile; raises ValueError on anything Prometheus' own parser would refuse (and on a family
    met again after another one, on HELP or TYPE twice or after the family's samples, on a series twice)."""
    if text and not text.endswith('\n'):
        raise ValueError('the last line has no newline')
    families: t.Dict[str, Family] = {}
    current = None
    closed: t.Set[str] = set()

    def enter(name: str, where: str) -> None:
        nonlocal current
        if name != current:
            if name in closed:
                raise ValueError('%s: family %s continues after another family' % (where, name))
            if current is not None:
                closed.add(current)
            current = name

    for number, line in enumerate(text.split('\n')[:-1] if text else [], 1):
        where = 'line %d' % number
        if not line.strip():
            continue
        if line.startswith('#'):
            words = line.split(' ', 3)
            if len(words) >= 3 and words[1] in ('HELP', 'TYPE'):
                name = words[2]
                if not _NAME.fullmatch(name):
                    raise ValueError('%s: bad metric name %r' % (where, name))
                enter(name, where)
                family = families.get(name) or Family('untyped', '', {})
                if family.samples:
                    raise ValueError('%s: %s after the samples of %s' % (where, words[1], name))
                if words[1] == 'HELP':
                    if family.help:
                        raise ValueError('%s: second HELP for %s' % (where, name))
                    family = family._replace(help=_unescape(words[3] if len(words) > 3 else '', '\\n', where) or ' ')
                else:
                    kind = words[3] if len(words) > 3 else ''
                    if kind not in _TYPES or name in families and families[name].kind != 'untyped':
                        raise ValueError('%s: bad or second TYPE %r for %s' % (where, kind, name))
                    family = family._replace(kind=kind)
                families[name] = family
            continue
        name, labels, value = _split_sample(line, where)
        owner = name
        for kind, suffixes in _SUFFIXES.items():
            for suffix in suffixes:
                base = name[:-len(suffix)]
                if name.endswith(suffix) and base in families and families[base].kind == kind:
                    owner = base
        enter(owner, where)
        family = families.setdefault(owner, Family('untyped', '', {}))
        if (name, labels) in family.samples:
            raise ValueError('%s: series %s%s twice' % (where, name, dict(labels)))
        family.samples[(name, labels)] = value
    return families


def series(families: t.Dict[str, Family], name: str) -> t.Dict[t.Tuple[t.Tuple[str, str], ...], float]:
    """labels -> value of every sample of the metric ``name``."""
    family = families.get(name)
    return {labels: value for (sample, labels), value in (family.samples.items() if family else ()) if sample == name}


def lbl(**labels: str) -> t.Tuple[t.Tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def test_the_strict_reader_refuses_what_prometheus_refuses() -> None:
    good = '# HELP a_b x \\\\ y\\n z\n# TYPE a_b gauge\na_b{l="q\\"\\\\\\n",m="2",} 1.5e3\na_b 2\n# HELP c d\nc +Inf 123\n'
    families = parse_exposition(good)
    assert families['a_b'].help == 'x \\ y\n z' and series(families, 'a_b') == {lbl(l='q"\\\n', m='2'): 1500.0, (): 2.0}
    assert math.isinf(series(families, 'c')[()])
    for bad in ('a 1', 'a{l="x"} 1\nb 1\na{l="y"} 2\n', 'a 1\na 2\n', '# TYPE a gauge\n# TYPE a gauge\n', 'a 1\n# HELP a x\n',
                'a{l="x} 1\n', 'a{l="\\x"} 1\n', 'a{1l="x"} 1\n', 'a{l="x"} one\n', 'a{l="x" m="y"} 1\n', '1a 1\n',
                '# TYPE a gaugez\n', 'a{l="x",l="y"} 1\n', 'a  1\n', 'a 1 2 3\n', '# HELP a bad \\q\n'):
        with pytest.raises(ValueError):
            parse_exposition(bad)


# --- rendering ----------------------------------------------------------------------------------------------------------
# sha256 of the three files as render_health wrote them before metrics existed (commit c47f4a0): a host that upgrades
# the collection without metrics gets the very same files, so nothing is rewritten, no daemon-reload, no "changed".
LEGACY = {
    ('/run/nvidia/mps', '/etc/gpufleet-mps', (), ()): {
        '/usr/local/sbin/gpufleet-mps-health': 'b736d3ea251a1dada5dca946f367f876a8907b583022c0a586f5cc015b9da083',
        '/etc/systemd/system/gpufleet-mps-health.service': 'a6d4c2cb3b0283b56616d7b21cdbd4b36efd6ee42782c8f5c4b3e1863450f3ad',
        '/etc/systemd/system/gpufleet-mps-health.timer': '0fae6a2989a71baa25e2504121ce292edf2caaff55d7cce1eff835b3af6711a8',
    },
    ('/run/mps/', '/etc/g', ('unit_dir', '/u'), ('interval', 45, 'timeout', 5, 'script', '/opt/x/health')): {
        '/opt/x/health': '11e3608abbedd3c713317955200243c2a880bf6f6788228f11c0f1a18fdf5ff8',
        '/u/gpufleet-mps-health.service': '00e3b796b5ce84c671e30580b8e83a5d64a7c281b31a2cffd829d52d1d2d9038',
        '/u/gpufleet-mps-health.timer': 'e6be0595df20427fb2526fa804d44c18435176b3304a4ba0f6bbbc99426289c7',
    },
}


def _kwargs(key: tuple) -> t.Dict[str, t.Any]:
    flat = key[2] + key[3]
    return dict(zip(flat[::2], flat[1::2]))


@pytest.mark.parametrize('key', list(LEGACY), ids=['defaults', 'every-option'])
def test_without_metrics_dir_every_file_is_byte_for_byte_the_one_hosts_run(key: tuple) -> None:
    files = render_health(key[0], key[1], **_kwargs(key))
    assert {path: hashlib.sha256(text.encode()).hexdigest() for path, text in files.items()} == LEGACY[key]
    assert render_health(key[0], key[1], metrics_dir=None, **_kwargs(key)) == files
    assert 'prom' not in files[next(iter(LEGACY[key]))]


def test_with_metrics_dir_only_the_script_changes_and_bad_directories_are_refused() -> None:
    plain = render_health('/run/nvidia/mps', '/etc/gpufleet-mps')
    files = render_health('/run/nvidia/mps', '/etc/gpufleet-mps', metrics_dir='/var/lib/prometheus/node-exporter/')
    assert {path: text for path, text in files.items() if path != SCRIPT} == {path: text for path, text in plain.items() if path != SCRIPT}
    script = files[SCRIPT]
    assert script.startswith('#!/bin/sh\n') and "metrics_dir='/var/lib/prometheus/node-exporter'\n" in script
    assert '@' not in script.replace('gpufleet-mps@$instance', ''), 'a placeholder was left unreplaced'
    for name, (kind, _labels, text) in METRICS.items():
        assert "family %s %s '%s'" % (name, kind, text) in script, name
    for bad in ('relative/dir', "/var/it's", '/var/back\\slash', '/var/new\nline', '/var/50%'):
        with pytest.raises(MpsError, match='metrics_dir'):
            render_health('/run/nvidia/mps', '/etc/gpufleet-mps', metrics_dir=bad)


def test_the_metric_names_help_and_labels_follow_prometheus_conventions() -> None:
    units = ('_seconds', '_bytes', '_ratio', '_info')
    for name, (kind, labels, text) in METRICS.items():
        assert _NAME.fullmatch(name) and name.startswith('gpufleet_mps_') and kind == 'gauge', name
        assert not name.endswith('_total') and ('timestamp' not in name or name.endswith('_timestamp_seconds')), name
        assert all(_LABEL_NAME.fullmatch(label) and not label.startswith('__') for label in labels), name
        assert labels[0] == 'root' and (len(labels) == 1 or labels[1] == 'resource'), name
        # HELP goes between single quotes in the script and is not escaped there
        assert text and not any(char in text for char in '\'\\\n') and text.endswith('.'), name
        assert not any(unit in name for unit in units) or name.endswith(units), name
    assert len(set(ERROR_REASONS)) == len(ERROR_REASONS) and all(re.fullmatch('[a-z_]+', reason) for reason in ERROR_REASONS)
    assert label_value('a"b\\c\nd') == 'a\\"b\\\\c\\nd'


@pytest.mark.parametrize('metrics_dir', [None, '/var/lib/prometheus/node-exporter'], ids=['plain', 'metrics'])
def test_the_script_passes_shellcheck_as_posix_sh(tmp_path, metrics_dir: t.Optional[str]) -> None:
    shellcheck = shutil.which('shellcheck')
    if not shellcheck:
        pytest.skip('shellcheck is not installed')
    path = tmp_path / 'health'
    path.write_text(render_health('/run/nvidia/mps', '/etc/gpufleet-mps', metrics_dir=metrics_dir)[SCRIPT])
    proc = subprocess.run([shellcheck, '-s', 'sh', '-f', 'gcc', str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and not proc.stdout, proc.stdout
    assert subprocess.run(['sh', '-n', str(path)], capture_output=True, check=False).returncode == 0


# --- a host laid out as the collection lays it out ----------------------------------------------------------------------
class Host:
    """A root, a config dir with the environment files the unit reads, the enabled units' links, both scripts."""

    def __init__(self, base, binary: str, root: t.Optional[str] = None) -> None:
        self.base = base
        self.root = root or str(base / 'root')
        self.etc = str(base / 'etc')
        self.units = str(base / 'units')
        self.metrics = str(base / 'metrics')
        self.binary = binary
        for directory in (os.path.join(self.units, 'multi-user.target.wants'), self.etc, self.metrics, self.root):
            os.makedirs(directory, exist_ok=True)
        self.script = str(base / 'health-metrics')
        self.plain = str(base / 'health-plain')
        self.render(10)  # generous: the simulator and the fake are Python programs, slow to start on a busy machine
        self.pids: t.List[int] = []
        self.extra_env: t.Dict[str, str] = {}

    def render(self, timeout: int, v3: bool = False) -> None:
        """Both scripts, with and without metrics, asking each daemon within ``timeout`` seconds (``v3``: as on a host with
        an MPS v3 resource)."""
        self.timeout = timeout
        for path, metrics in ((self.script, self.metrics), (self.plain, None)):
            with open(path, 'w', encoding='utf-8') as handle:
                handle.write(render_health(self.root, self.etc, self.units, timeout=timeout, script=path, metrics_dir=metrics,
                                           v3=v3)[path])
            os.chmod(path, 0o755)

    @property
    def prom(self) -> str:
        return os.path.join(self.metrics, METRICS_FILE)

    def resource(self, name: str, uuids: t.Sequence[str], enabled: bool = True, binary: t.Optional[str] = None):
        """The resource's directories and its environment file as mps_daemon writes it (supervisor=systemd)."""
        paths = resource_paths(self.root, name)
        config = config_paths(self.etc, name)
        for directory in (paths.pipe_dir, paths.log_dir):
            os.makedirs(directory, exist_ok=True)
        values = unit_environment(paths, config, uuids, multiuser=False, compute_mode='exclusive_process',
                                  control_binary=binary or self.binary, nvidia_smi=None, stop_timeout=10, log_mode=0o700)
        try:
            text = render_env(name, values)
        except MpsError:  # a value the collection never writes (a quote in the root): as a hand-edited file has it
            text = ''.join('%s=%s\n' % item for item in sorted(values.items()))
        with open(config.env_file, 'w', encoding='utf-8') as handle:
            handle.write(text)
        if enabled:
            os.symlink('/dev/null', os.path.join(self.units, 'multi-user.target.wants', 'gpufleet-mps@%s.service' % config.instance))
        return paths

    def start(self, name: str, uuids: t.Sequence[str], enabled: bool = True, env: t.Optional[t.Dict[str, str]] = None) -> int:
        """A simulated daemon started as the unit starts it."""
        paths = self.resource(name, uuids, enabled)
        subprocess.run([self.binary, '-d'], env=dict(daemon_env(paths, uuids), **(env or {})), check=True, capture_output=True)
        for _attempt in range(200):
            if inspect(paths).running:
                break
            time.sleep(0.05)
        self.pids.append(inspect(paths).pid)
        return self.pids[-1]

    def ask(self, name: str, commands: str) -> str:
        env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=resource_paths(self.root, name).pipe_dir)
        return subprocess.run([self.binary], input=commands, env=env, capture_output=True, text=True, check=True, timeout=30).stdout

    def run(self, script: t.Optional[str] = None, rc: int = 0) -> subprocess.CompletedProcess:
        proc = subprocess.run(['sh', script or self.script], capture_output=True, text=True, timeout=120, check=False,
                              env=dict(os.environ, **self.extra_env))
        assert set(proc.stderr) <= set(string.printable), proc.stderr  # the journal shows a line with other bytes as a blob
        assert proc.returncode == rc, proc.stderr
        return proc

    def read(self) -> t.Dict[str, Family]:
        with open(self.prom, encoding='utf-8') as handle:
            text = handle.read()
        families = parse_exposition(text)
        for name, family in families.items():  # every family is declared, none is left empty
            assert name in METRICS and family.kind == METRICS[name][0] and family.help == METRICS[name][2], name
            assert family.samples, name
            for (_sample, labels) in family.samples:
                assert [key for key, _value in labels] == sorted(METRICS[name][1]), (name, labels)
        return families

    @property
    def ready(self) -> bool:
        return os.path.exists(os.path.join(self.root, '.ready'))


def _kill(pids: t.Iterable[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _killed(pid: int) -> None:
    """SIGKILL ``pid`` and wait until it has exited (a zombie or gone): the signal is delivered asynchronously, and on
    a busy machine a script started at once can still find the daemon alive, its lock held, and call it unreachable."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not pid_alive(pid):  # a zombie is dead to it
            return
        time.sleep(0.01)
    raise AssertionError('process %d still runs 10s after SIGKILL' % pid)


@pytest.fixture
def sim(simhost):
    host = Host(simhost, str(simhost / 'host' / 'bin' / 'nvidia-cuda-mps-control'))
    yield host
    _kill(host.pids)


def _uuids() -> t.List[str]:
    with _gpus.Nvml() as nvml:
        return [gpu.uuid for gpu in nvml.gpus()]


def _new_uis(host: Host, name: str) -> int:
    path = os.path.join(resource_paths(host.root, name).log_dir, 'control.log')
    with open(path, encoding='utf-8', errors='replace') as handle:
        return handle.read().count('NEW UI')


def _per_resource(families, name: str) -> t.Dict[str, float]:
    return {dict(labels)['resource']: value for labels, value in series(families, name).items()}


def _errors(families) -> t.Dict[str, str]:
    """resource -> the reason whose gauge is 1 ('' when none); every reason exported for every resource."""
    found: t.Dict[str, t.List[str]] = {}
    for labels, value in series(families, 'gpufleet_mps_daemon_error').items():
        found.setdefault(dict(labels)['resource'], []).append((dict(labels)['reason'], value))
    for resource, pairs in found.items():
        assert sorted(reason for reason, _value in pairs) == sorted(ERROR_REASONS) and all(v in (0, 1) for _r, v in pairs), resource
    return {resource: ''.join(reason for reason, value in pairs if value == 1) for resource, pairs in found.items()}


def test_a_healthy_root_with_servers_clients_and_limits_in_one_ui_process_per_daemon(sim, sim_clients) -> None:
    gpus = _uuids()
    sim.start('train', gpus[:2])
    sim.start('example.com/infer', gpus[2:3])
    pruned = sim.start('pruned', gpus[3:4], enabled=False)
    assert sim.ask('train', 'set_default_active_thread_percentage 33.3\nset_default_device_pinned_mem_limit 0 3840M\n').split() == ['33.3']
    train_pipe = resource_paths(sim.root, 'train').pipe_dir
    _client, first = sim_clients(train_pipe)
    sim_clients(train_pipe)
    assert first['pinned_mem_limit_mib'] == {'0': 3840, '1': None}
    before = {name: _new_uis(sim, name) for name in ('train', 'example.com/infer', 'pruned')}
    started = time.time()
    result = sim.run()
    assert '2 daemon(s) healthy' in result.stdout and not result.stderr and sim.ready
    # one control UI process per enabled daemon, none for the disabled one
    assert {name: _new_uis(sim, name) - count for name, count in before.items()} == {'train': 1, 'example.com/infer': 1, 'pruned': 0}

    families = sim.read()
    root = sim.root
    both = {'train': 1.0, 'example.com/infer': 1.0}
    assert _per_resource(families, 'gpufleet_mps_daemon_up') == both
    assert _per_resource(families, 'gpufleet_mps_daemon_answering') == both
    assert _errors(families) == {'train': '', 'example.com/infer': ''}
    assert _per_resource(families, 'gpufleet_mps_servers') == {'train': 1.0, 'example.com/infer': 0.0}
    assert _per_resource(families, 'gpufleet_mps_clients') == {'train': 2.0, 'example.com/infer': 0.0}
    assert _per_resource(families, 'gpufleet_mps_default_active_thread_ratio') == {'train': 0.333, 'example.com/infer': 1.0}
    # 3840M reads back as 3G (lossy): 3 GiB; device 1 has no limit, so no sample
    assert series(families, 'gpufleet_mps_default_device_pinned_memory_limit_bytes') == {
        lbl(root=root, resource='train', device='0', uuid=gpus[0]): 3 * 1024 ** 3}
    assert series(families, 'gpufleet_mps_device_info') == {
        lbl(root=root, resource='train', device='0', uuid=gpus[0]): 1.0,
        lbl(root=root, resource='train', device='1', uuid=gpus[1]): 1.0,
        lbl(root=root, resource='example.com/infer', device='0', uuid=gpus[2]): 1.0}
    assert series(families, 'gpufleet_mps_ready') == {lbl(root=root): 1.0}
    stamp = series(families, 'gpufleet_mps_health_check_timestamp_seconds')[lbl(root=root)]
    assert int(started) <= stamp <= time.time() and stamp == int(stamp)
    assert series(families, 'gpufleet_mps_health_check_last_success_timestamp_seconds') == {lbl(root=root): stamp}
    assert 0 <= series(families, 'gpufleet_mps_health_check_duration_seconds')[lbl(root=root)] <= time.time() - started + 0.01
    # written atomically: world-readable for node_exporter, no temp file left behind
    assert stat.S_IMODE(os.stat(sim.prom).st_mode) == 0o644 and os.listdir(sim.metrics) == [METRICS_FILE]
    with open(sim.prom, encoding='utf-8') as handle:
        lines = handle.read().splitlines()
    assert 'gpufleet_mps_clients{root="%s",resource="train"} 2' % root in lines
    assert 'gpufleet_mps_default_active_thread_ratio{root="%s",resource="train"} 0.333' % root in lines
    assert not any('pruned' in line for line in lines)
    os.kill(pruned, signal.SIGKILL)


def test_a_hung_and_a_killed_daemon_their_reasons_and_the_last_success_kept(sim) -> None:
    gpus = _uuids()
    hung = sim.start('train', gpus[:1])
    killed = sim.start('infer', gpus[1:2])
    sim.run()
    success = series(sim.read(), 'gpufleet_mps_health_check_last_success_timestamp_seconds')[lbl(root=sim.root)]
    inode = os.stat(sim.prom).st_ino
    time.sleep(1.1)  # a later second
    sim.render(2)
    os.kill(hung, signal.SIGSTOP)  # it accepts, never answers
    _killed(killed)  # a zombie here: nothing reaps the simulator's double-forked daemons
    try:
        result = sim.run()
        assert sim.run(sim.plain).returncode == 0 and not sim.ready  # the plain script agrees
    finally:
        os.kill(hung, signal.SIGCONT)
    assert 'train/pipe did not answer within 2s (timeout)' in result.stderr
    assert 'infer/pipe did not answer within 2s (not_running)' in result.stderr
    assert 'withdrawn (2 not answering, 0 healthy)' in result.stderr
    families = sim.read()
    assert os.stat(sim.prom).st_ino != inode  # replaced by a rename, never rewritten in place
    assert _per_resource(families, 'gpufleet_mps_daemon_up') == {'train': 1.0, 'infer': 0.0}
    assert _per_resource(families, 'gpufleet_mps_daemon_answering') == {'train': 0.0, 'infer': 0.0}
    assert _errors(families) == {'train': 'timeout', 'infer': 'not_running'}
    for name in ('gpufleet_mps_servers', 'gpufleet_mps_clients', 'gpufleet_mps_default_active_thread_ratio'):
        assert name not in families  # unknown, so absent: never a stale or made-up value
    assert series(families, 'gpufleet_mps_ready') == {lbl(root=sim.root): 0.0}
    stamp = series(families, 'gpufleet_mps_health_check_timestamp_seconds')[lbl(root=sim.root)]
    assert stamp > success and series(families, 'gpufleet_mps_health_check_last_success_timestamp_seconds') == {lbl(root=sim.root): success}
    assert series(families, 'gpufleet_mps_health_check_duration_seconds')[lbl(root=sim.root)] >= 2  # the hung one's timeout
    # the hung daemon answers again: healthy again in the next run, the killed one still down
    result = sim.run()
    assert _errors(sim.read()) == {'train': '', 'infer': 'not_running'}


def test_a_live_daemon_whose_socket_is_gone_is_up_but_unreachable(sim) -> None:
    pid = sim.start('train', _uuids()[:1])
    os.unlink(resource_paths(sim.root, 'train').control_socket)
    sim.run()
    families = sim.read()
    assert _per_resource(families, 'gpufleet_mps_daemon_up') == {'train': 1.0} and _errors(families) == {'train': 'unreachable'}
    assert os.path.exists('/proc/%d' % pid)


@pytest.mark.parametrize('switch, value', [('FAKE_MPS_UNSET_MEM_LIMIT', 'N/A'), ('FAKE_MPS_UNSET_MEM_LIMIT', '0M'),
                                           ('FAKE_MPS_MEM_READBACK', 'exact'), ('FAKE_MPS_CLIENT_LIST_SEP', 'space'),
                                           ('FAKE_MPS_LOCK_KIND', 'hidden'), ('FAKE_MPS_LOCK_KIND', 'ofd')])
def test_what_other_drivers_may_answer(sim, sim_clients, switch: str, value: str) -> None:
    gpus = _uuids()
    sim.start('train', gpus[:2], env={switch: value})
    sim.ask('train', 'set_default_device_pinned_mem_limit 1 1536M\n')
    pipe = resource_paths(sim.root, 'train').pipe_dir
    sim_clients(pipe)
    sim_clients(pipe)
    sim.run()
    families = sim.read()
    assert _errors(families) == {'train': ''} and _per_resource(families, 'gpufleet_mps_clients') == {'train': 2.0}
    # unset on device 0 whatever the driver prints for it; 1536M is 1G lossy, 1536 MiB exact
    expected = 1536 * 1024 ** 2 if value == 'exact' else 1024 ** 3
    assert series(families, 'gpufleet_mps_default_device_pinned_memory_limit_bytes') == {
        lbl(root=sim.root, resource='train', device='1', uuid=gpus[1]): expected}


def test_a_garbage_answer_is_a_bad_answer(sim) -> None:
    sim.start('train', _uuids()[:1])
    sim.extra_env = {'FAKE_MPS_FAULT_UI': 'garbage'}  # read by each UI process: the check's
    sim.run()
    families = sim.read()
    assert _errors(families) == {'train': 'bad_answer'} and _per_resource(families, 'gpufleet_mps_daemon_up') == {'train': 1.0}
    assert _per_resource(families, 'gpufleet_mps_daemon_answering') == {'train': 0.0} and not sim.ready


# --- a fake control binary, for what the simulator does not do on demand ------------------------------------------------
FAKE = '''#!%s
"""A control UI: answers from <pipe>/fake.json, logs each batch it was sent to <pipe>/fake.log."""
import json, os, sys, time
pipe = os.environ['CUDA_MPS_PIPE_DIRECTORY']
with open(os.path.join(pipe, 'fake.json')) as handle:
    spec = json.load(handle)
commands = [line.strip() for line in sys.stdin.read().splitlines() if line.strip()]
with open(os.path.join(pipe, 'fake.log'), 'a') as handle:
    handle.write(json.dumps(commands) + '\\n')
mode = spec.get('mode')
if mode == 'hang':
    time.sleep(60)
if mode == 'garbage':
    sys.stdout.buffer.write(b'\\xff\\xfe\\x00 25.0x\\n\\x9c\\n')
    sys.exit(0)
if mode == 'no_daemon':
    sys.stderr.write('Cannot find MPS control daemon process\\n')
    sys.exit(1)
servers = [str(pid) for pid in spec.get('servers', [])]
out = []
for number, cmd in enumerate(commands):
    if number == spec.get('drop_after'):
        print('\\n'.join(out))
        sys.exit(1)
    words = cmd.split()
    if cmd in spec.get('replies', {}):
        out.append(spec['replies'][cmd])
    elif words[0] == 'get_default_active_thread_percentage':
        out.append(spec.get('percentage', '100.0'))
    elif words[0] == 'get_server_list':
        out.extend(servers)
    elif words[0] == 'get_default_device_pinned_mem_limit':
        out.append(spec.get('mem', {}).get(words[1], ''))
    elif words[0] == 'get_client_list':
        if words[1] in servers or words[1] in spec.get('clients', {}):
            out.append(spec.get('sep', '\\n').join(str(pid) for pid in spec.get('clients', {}).get(words[1], [])))
        else:
            out.append('Server with PID %%s not found' %% words[1])
    else:
        out.append('Unknown command "%%s"' %% words[0])
print('\\n'.join(out))
'''


class Fakes(Host):
    """A host whose control binary is the fake above, and whose daemons are processes named like one."""

    def __init__(self, base, root: t.Optional[str] = None) -> None:
        binary = str(base / 'bin' / 'nvidia-cuda-mps-control')
        os.makedirs(os.path.dirname(binary))
        with open(binary, 'w', encoding='utf-8') as handle:
            handle.write(FAKE % sys.executable)
        os.chmod(binary, 0o755)
        # A "daemon": a shell under the daemon's name (comm nvidia-cuda-mps), with the pipe directory in its environment,
        # and as many children (its "servers") as asked for.
        self.shell = str(base / 'sbin' / 'nvidia-cuda-mps-control')
        os.makedirs(os.path.dirname(self.shell))
        shutil.copy(os.path.realpath(shutil.which('sh')), self.shell)
        super().__init__(base, binary, root)
        self.procs: t.List[subprocess.Popen] = []

    def fake(self, name: str, spec: t.Dict[str, t.Any], daemon: bool = True, uuids: t.Sequence[str] = ('GPU-a', 'GPU-b'),
             binary: t.Optional[str] = None, children: int = 0) -> t.Optional[subprocess.Popen]:
        paths = self.resource(name, uuids, binary=binary)
        with open(os.path.join(paths.pipe_dir, 'fake.json'), 'w', encoding='utf-8') as handle:
            json.dump(spec, handle)
        if not daemon:
            return None
        # read blocks on a pipe kept open, without a child of its own
        proc = subprocess.Popen([self.shell, '-c', 'sleep 600 & ' * children + 'read -r line'], stdin=subprocess.PIPE,  # pylint: disable=consider-using-with
                                env={'CUDA_MPS_PIPE_DIRECTORY': paths.pipe_dir, 'PATH': os.environ['PATH']}, start_new_session=True)
        self.procs.append(proc)
        with open(os.path.join(paths.pipe_dir, 'nvidia-cuda-mps-control.pid'), 'w', encoding='ascii') as handle:
            handle.write(str(proc.pid))  # no newline, as the real daemon writes it
        for _attempt in range(200):
            if len(self.children(proc.pid)) == children:
                break
            time.sleep(0.01)
        return proc

    @staticmethod
    def children(pid: int) -> t.List[int]:
        with open('/proc/%d/task/%d/children' % (pid, pid), encoding='ascii') as handle:
            return [int(word) for word in handle.read().split()]

    def stop(self) -> None:
        """End every process this host started, and its children: each leads a session of its own."""
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(30)
            for stream in (proc.stdin, proc.stdout):
                if stream:
                    stream.close()

    def batches(self, name: str) -> t.List[t.List[str]]:
        try:
            with open(os.path.join(resource_paths(self.root, name).pipe_dir, 'fake.log'), encoding='utf-8') as handle:
                return [json.loads(line) for line in handle]
        except FileNotFoundError:
            return []


@pytest.fixture
def fakes(tmp_path):
    host = Fakes(tmp_path)
    yield host
    host.stop()


def test_the_batch_is_framed_as_the_modules_frame_theirs(fakes) -> None:
    fakes.fake('train', {'percentage': '25.0', 'mem': {'0': '3G', '1': '512M'}})
    fakes.run()
    assert fakes.batches('train') == [[
        'get_default_active_thread_percentage', 'get_server_list', 'get_default_active_thread_percentage',
        'get_default_device_pinned_mem_limit 0', 'get_default_active_thread_percentage',
        'get_default_device_pinned_mem_limit 1', 'get_default_active_thread_percentage']]
    families = fakes.read()
    assert _errors(families) == {'train': ''} and _per_resource(families, 'gpufleet_mps_default_active_thread_ratio') == {'train': 0.25}
    assert {dict(labels)['device']: value for labels, value in
            series(families, 'gpufleet_mps_default_device_pinned_memory_limit_bytes').items()} == {'0': 3 * 2 ** 30, '1': 512 * 2 ** 20}


def test_the_daemons_children_are_asked_in_the_same_batch_and_only_listed_servers_count(fakes) -> None:
    daemon = fakes.fake('train', {}, uuids=('GPU-a',), children=2)
    server, other = Fakes.children(daemon.pid)
    with open(os.path.join(resource_paths(fakes.root, 'train').pipe_dir, 'fake.json'), 'w', encoding='utf-8') as handle:
        # a child that is no server gets a client list here too: only get_server_list says which children are servers
        json.dump({'servers': [server], 'clients': {str(server): [7], str(other): [8, 9]}}, handle)
    fakes.run()
    batches = fakes.batches('train')
    assert len(batches) == 1 and {'get_client_list %d' % server, 'get_client_list %d' % other} <= set(batches[0])
    families = fakes.read()
    assert _per_resource(families, 'gpufleet_mps_servers') == {'train': 1.0} and _per_resource(families, 'gpufleet_mps_clients') == {'train': 1.0}


def test_servers_that_are_not_the_daemons_children_are_asked_about_in_a_second_batch(fakes) -> None:
    fakes.fake('train', {'servers': [4242, 4343], 'clients': {'4242': [1, 2, 3], '4343': [4]}, 'sep': ' '}, uuids=())
    fakes.run()
    batches = fakes.batches('train')
    assert len(batches) == 2 and 'get_client_list 4242' in batches[1] and 'get_client_list 4343' in batches[1]
    families = fakes.read()
    assert _per_resource(families, 'gpufleet_mps_servers') == {'train': 2.0}
    assert _per_resource(families, 'gpufleet_mps_clients') == {'train': 4.0}
    assert 'gpufleet_mps_device_info' not in families and 'gpufleet_mps_default_device_pinned_memory_limit_bytes' not in families


@pytest.mark.parametrize('spec, daemon, reason, answering', [
    ({'mode': 'hang'}, True, 'timeout', 0),
    ({'mode': 'garbage'}, True, 'bad_answer', 0),
    ({'mode': 'no_daemon'}, True, 'unreachable', 0),
    ({'mode': 'no_daemon'}, False, 'not_running', 0),
    ({'drop_after': 2}, True, 'ui_failed', 0),  # answered the health question, then the session dropped
    ({'replies': {'get_server_list': 'Unknown command "get_server_list"'}}, True, 'bad_answer', 1),
    ({'percentage': '25.00'}, True, 'bad_answer', 0),  # the health answer is one %.1f line, nothing else
], ids=['hang', 'garbage', 'unreachable', 'not-running', 'dropped', 'unreadable-reply', 'odd-percentage'])
def test_each_failure_has_its_reason(fakes, spec, daemon: bool, reason: str, answering: int) -> None:
    fakes.fake('train', spec, daemon=daemon)
    if reason == 'timeout':
        fakes.render(1)
    result = fakes.run()
    families = fakes.read()
    assert _errors(families) == {'train': reason}
    assert _per_resource(families, 'gpufleet_mps_daemon_answering') == {'train': answering}
    assert _per_resource(families, 'gpufleet_mps_daemon_up') == {'train': 1.0 if daemon or answering else 0.0}
    assert fakes.ready == bool(answering)
    assert '/train/pipe %s (%s)' % ('answered, but not every answer could be read' if answering else 'did not answer within %ds' % fakes.timeout,
                                    reason) in result.stderr
    if answering:  # what it answered is kept; what it did not is absent
        assert 'gpufleet_mps_default_active_thread_ratio' in families and 'gpufleet_mps_servers' not in families


@pytest.mark.parametrize('binary, mode', [('/nonexistent/nvidia-cuda-mps-control', None), ('not-executable', 0o644)])
def test_a_missing_or_broken_control_binary(fakes, binary: str, mode: t.Optional[int]) -> None:
    if mode is not None:
        binary = str(fakes.base / binary)
        shutil.copy(fakes.binary, binary)
        os.chmod(binary, mode)
    fakes.fake('train', {}, binary=binary)
    fakes.run()
    assert _errors(fakes.read()) == {'train': 'control_binary'} and not fakes.ready


def test_a_stale_pid_file_a_zombie_and_a_lock_holder(fakes) -> None:
    # the pid file names a live process that is no control daemon (pid reuse): down
    fakes.fake('reused', {'mode': 'no_daemon'}, daemon=False)
    with open(os.path.join(resource_paths(fakes.root, 'reused').pipe_dir, 'nvidia-cuda-mps-control.pid'), 'w', encoding='ascii') as handle:
        handle.write(str(os.getpid()))
    # the pid file names a live control daemon, but of another pipe directory
    other = fakes.fake('other', {})
    fakes.fake('foreign', {'mode': 'no_daemon'}, daemon=False)
    with open(os.path.join(resource_paths(fakes.root, 'foreign').pipe_dir, 'nvidia-cuda-mps-control.pid'), 'w', encoding='ascii') as handle:
        handle.write(str(other.pid))
    # a daemon killed, never reaped: its pid file names a zombie
    zombie = fakes.fake('zombie', {'mode': 'no_daemon'})
    zombie.kill()
    for _attempt in range(100):
        with open('/proc/%d/stat' % zombie.pid, encoding='ascii') as handle:
            if handle.read().rsplit(')', 1)[1].split()[0] == 'Z':
                break
        time.sleep(0.02)
    # no pid file, but a live process holds the POSIX lock on control_lock, as the real daemon does
    fakes.fake('locked', {'mode': 'no_daemon'}, daemon=False)
    lock = os.path.join(resource_paths(fakes.root, 'locked').pipe_dir, 'control_lock')
    holder = subprocess.Popen([sys.executable, '-c', 'import fcntl, sys, time\nh = open(sys.argv[1], "w")\n'  # pylint: disable=consider-using-with
                               'fcntl.lockf(h, fcntl.LOCK_EX)\nprint("locked", flush=True)\ntime.sleep(600)', lock],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    fakes.procs.append(holder)
    assert holder.stdout.readline().strip() == 'locked'
    fakes.run()
    families = fakes.read()
    assert _per_resource(families, 'gpufleet_mps_daemon_up') == {'reused': 0.0, 'foreign': 0.0, 'zombie': 0.0, 'locked': 1.0, 'other': 1.0}
    assert _errors(families) == {'reused': 'not_running', 'foreign': 'not_running', 'zombie': 'not_running', 'locked': 'unreachable',
                                 'other': ''}
    with open(lock, 'w', encoding='ascii') as handle:  # the same lock is free once its holder is gone
        holder.kill()
        holder.wait()
        fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_label_values_are_escaped_and_a_resource_is_reported_once(tmp_path) -> None:
    root = str(tmp_path / 'ro"ot')
    host = Fakes(tmp_path, root)
    try:
        host.fake('train', {'mem': {'0': '2G'}})
        # a hand-edited environment file: a device entry with a backslash and a quote, and a second file naming the same pipe
        env_file = config_paths(host.etc, 'train').env_file
        with open(env_file, encoding='utf-8') as handle:
            text = handle.read()
        with open(env_file, 'w', encoding='utf-8') as handle:
            handle.write(re.sub('(?m)^CUDA_VISIBLE_DEVICES=.*$', 'CUDA_VISIBLE_DEVICES=GPU-\\\\x"y', text))
        with open(os.path.join(host.etc, 'zz.env'), 'w', encoding='utf-8') as handle:  # read after train.env
            handle.write(text)
        os.symlink('/dev/null', os.path.join(host.units, 'multi-user.target.wants', 'gpufleet-mps@zz.service'))
        result = host.run()
        assert 'zz.env names the pipe directory of another resource' in result.stderr
        with open(host.prom, encoding='utf-8') as handle:
            lines = handle.read().splitlines()
        escaped_root = root.replace('"', '\\"')
        assert 'gpufleet_mps_device_info{root="%s",resource="train",device="0",uuid="GPU-\\\\x\\"y"} 1' % escaped_root in lines
        assert 'gpufleet_mps_default_device_pinned_memory_limit_bytes{root="%s",resource="train",device="0",uuid="GPU-\\\\x\\"y"} %d' % (
            escaped_root, 2 * 2 ** 30) in lines
        families = host.read()
        assert series(families, 'gpufleet_mps_device_info') == {lbl(root=root, resource='train', device='0', uuid='GPU-\\x"y'): 1.0}
        assert _per_resource(families, 'gpufleet_mps_daemon_up') == {'train': 1.0}
    finally:
        host.stop()


def test_the_textfile_is_renamed_into_place_world_readable_from_a_name_node_exporter_skips(fakes) -> None:
    shims = fakes.base / 'shims'
    os.makedirs(shims)
    log = fakes.base / 'mv.log'
    with open(shims / 'mv', 'w', encoding='utf-8') as handle:  # what is renamed, and its mode at that moment
        handle.write('#!/bin/sh\nfor arg; do [ -e "$arg" ] && stat -c "%%a %%n" "$arg" >> %s; done\necho "mv $*" >> %s\nexec %s "$@"\n' % (
            log, log, shutil.which('mv')))
    os.chmod(shims / 'mv', 0o755)
    fakes.fake('train', {})
    fakes.extra_env = {'PATH': '%s:%s' % (shims, os.environ['PATH'])}
    proc = subprocess.run(['sh', '-c', 'umask 077 && exec sh "$0"', fakes.script], capture_output=True, text=True, check=False, timeout=60,
                          env=dict(os.environ, **fakes.extra_env))
    assert proc.returncode == 0, proc.stderr
    with open(log, encoding='utf-8') as handle:
        renamed, move = handle.read().splitlines()  # the first run: no textfile yet to replace
    mode, temp = renamed.split(' ', 1)
    assert move == 'mv -f %s %s' % (temp, fakes.prom) and mode == '644'
    assert os.path.dirname(temp) == fakes.metrics and not temp.endswith('.prom')  # same file system; never read half-written
    assert stat.S_IMODE(os.stat(fakes.prom).st_mode) == 0o644 and os.listdir(fakes.metrics) == [METRICS_FILE]


def test_a_root_without_daemons_and_a_metrics_dir_that_cannot_be_written(fakes) -> None:
    fakes.run()
    families = fakes.read()
    assert set(families) == {'gpufleet_mps_ready', 'gpufleet_mps_health_check_timestamp_seconds',
                             'gpufleet_mps_health_check_duration_seconds'}  # never succeeded: no last success
    fakes.fake('train', {})
    shutil.rmtree(fakes.metrics)
    result = fakes.run(rc=1)
    assert fakes.ready and 'cannot write the metrics for node_exporter to %s' % fakes.prom in result.stderr
    os.makedirs(fakes.metrics)
    fakes.run()
    assert fakes.ready and _errors(fakes.read()) == {'train': ''} and os.listdir(fakes.metrics) == [METRICS_FILE]


def test_a_v3_daemon_is_asked_with_v3_words_and_reports_its_server(sim, sim_clients, r615) -> None:
    """A v3 resource (MPS_V3_SERVER in its environment file): its namespace and client lists, never the legacy batch
    a v3 daemon refuses; its default namespace's limits as the default ones; gone from the lists is a bad answer (issue 43)."""
    from ansible_collections.gpufleet.mps.plugins.module_utils._v3.spec import NamespaceLimits, V3Spec
    r615()
    gpus = _uuids()
    sim.render(10, v3=True)
    sim.start('train', gpus[:1])
    spec = V3Spec('shared', tuple(gpus[1:3]), os.geteuid(), False, NamespaceLimits(25.0, 2048), (('small', NamespaceLimits(10.0)),))
    paths = resource_paths(sim.root, 'shared')
    config = config_paths(sim.etc, 'shared')
    for directory in (paths.pipe_dir, paths.log_dir):
        os.makedirs(directory, exist_ok=True)
    with open(config.v3_config, 'w', encoding='utf-8') as handle:
        handle.write(spec.toml())
    values = unit_environment(paths, config, list(spec.devices), multiuser=False, compute_mode='exclusive_process',
                              control_binary=sim.binary, nvidia_smi=None, stop_timeout=10, log_mode=0o700, v3=spec)
    with open(config.env_file, 'w', encoding='utf-8') as handle:
        handle.write(render_env('shared', values))
    os.symlink('/dev/null', os.path.join(sim.units, 'multi-user.target.wants', 'gpufleet-mps@shared.service'))
    subprocess.run([sim.binary, '-d', '-p', '3', '-a', config.v3_config], env=daemon_env(paths, list(spec.devices)), check=True,
                   capture_output=True)
    for _attempt in range(200):
        if inspect(paths).running:
            break
        time.sleep(0.05)
    sim.pids.append(inspect(paths).pid)
    sim_clients(os.path.join(paths.pipe_dir, 'shared', 'small'))
    result = sim.run()
    assert '2 daemon(s) healthy' in result.stdout and not result.stderr and sim.ready, result.stderr
    families = sim.read()
    assert _errors(families) == {'train': '', 'shared': ''}
    assert _per_resource(families, 'gpufleet_mps_servers') == {'train': 0.0, 'shared': 1.0}
    assert _per_resource(families, 'gpufleet_mps_clients') == {'train': 0.0, 'shared': 1.0}
    assert _per_resource(families, 'gpufleet_mps_default_active_thread_ratio') == {'train': 1.0, 'shared': 0.25}
    assert {labels: value for labels, value in series(families, 'gpufleet_mps_default_device_pinned_memory_limit_bytes').items()
            if dict(labels)['resource'] == 'shared'} == {
        lbl(root=sim.root, resource='shared', device='0', uuid=gpus[1]): 2 * 1024 ** 3,
        lbl(root=sim.root, resource='shared', device='1', uuid=gpus[2]): 2 * 1024 ** 3}
    # the server deleted under the daemon: it answers, without it - not healthy, a bad answer
    subprocess.run([sim.binary, 'server', 'delete', 'shared', '--force'], env=dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=paths.pipe_dir),
                   check=True, capture_output=True)
    result = sim.run()
    families = sim.read()
    assert _errors(families) == {'train': '', 'shared': 'bad_answer'} and not sim.ready, result.stderr


def test_the_scripts_owner_kinds_are_the_modules_over_every_cited_real_cgroup_file(tmp_path) -> None:
    """The metrics script classifies each client as mps_info does (_attribution.owner_kind), over the fixtures' real
    /proc/<pid>/cgroup files (issue 44: counts per resource by owner kind, never a series per pid)."""
    import json  # pylint: disable=import-outside-toplevel
    from ansible_collections.gpufleet.mps.plugins.module_utils._attribution import owner_kind, parse_cgroup
    script = render_metrics_script('/r', '/e', '/w', 3, '/m')
    start = script.index("container_re='")
    function = script[start:script.index('\n}\n', start) + 3]
    fixtures = os.path.join(os.path.dirname(__file__), 'fixtures', 'cgroups.json')
    with open(fixtures, encoding='utf-8') as handle:
        cases = json.load(handle)
    texts = [case['content'] for case in cases] + ['', '0::/\n', '0::/user.slice/user-1000.slice/session-3.scope\n',
                                                   '0::/system.slice/' + 'a' * 64 + '.scope\n']
    files = []
    for number, text in enumerate(texts):
        path = tmp_path / ('cgroup%d' % number)
        path.write_text(text)
        files.append(str(path))
    files.append(str(tmp_path / 'missing'))  # unreadable: the process is gone
    texts.append('')
    proc = subprocess.run(['sh', '-c', function + 'for f in "$@"; do owner_of "$f"; echo "$owner"; done', 'sh'] + files,
                          capture_output=True, text=True, check=True, timeout=60)
    expected = [owner_kind(text, parse_cgroup(text)) for text in texts]
    assert proc.stdout.split() == expected
    assert set(expected) == {'container', 'slurm_job', 'host', 'unknown'}  # every kind is among the cases


def test_the_clients_are_counted_by_owner(sim, sim_clients) -> None:
    from ansible_collections.gpufleet.mps.plugins.module_utils._attribution import attribute
    gpus = _uuids()
    sim.start('train', gpus[:1])
    pipe = resource_paths(sim.root, 'train').pipe_dir
    clients = [sim_clients(pipe)[0] for _number in range(2)]
    sim.run()
    families = sim.read()
    counts = {dict(labels)['owner']: value for labels, value in series(families, 'gpufleet_mps_clients_by_owner').items()
              if dict(labels)['resource'] == 'train'}
    expected = dict.fromkeys(('container', 'slurm_job', 'host', 'unknown'), 0.0)
    for client in clients:
        expected[attribute(client.pid)['owner']] += 1
    assert counts == expected and sum(counts.values()) == 2


@pytest.mark.parametrize('row, said', [
    # Ready in any case, spaces after the commas, unset limits in any form the module reads as unset: answering
    ('default,shared,Ready,4G,25.00,-,/p', '1 1 0.25 1 2 4294967296,4294967296 11,12'),
    ('default, shared, READY, -, n/a, normal, /p', '1 1 1 1 2 -,- 11,12'),
    ('default,shared,Ready,4GiB,unset,0,/p', '1 1 1 1 2 4294967296,4294967296 11,12'),
    ('default,shared,Ready,0M,-,0,/p', '1 1 1 1 2 -,- 11,12'),
    # a percentage in a form not understood: answering, but no ratio sample (never "-" as a value)
    ('default,shared,Ready,-,lots,0,/p', '1 1 - 1 2 -,- 11,12'),
    # Starting, or not listed: not answering (the plain check and the module agree: _v3.readout.V3Readout.ready)
    ('default,shared,Starting,-,-,-,/p', '0 0 - - - - -'),
    ('default,other,Ready,-,-,-,/p', '0 0 - - - - -'),
])
def test_a_v3_daemons_answer_read_as_the_module_reads_it(tmp_path, row: str, said: str) -> None:
    """Found by review: every printed form the module tolerates reads the same in the metrics script, and nothing it
    cannot read becomes a sample value node_exporter would refuse (the whole file with it)."""
    control = tmp_path / 'control'
    control.write_text('#!/bin/sh\ncase "$1" in\n  namespace) printf "%%s\\n" "%s" ;;\n'
                       '  client) printf "11,shared,0,default,a\\n12, shared,1,small,b\\n" ;;\nesac\n' % row)
    control.chmod(0o755)
    script = render_metrics_script('/r', '/e', '/w', 3, '/m', v3=True)
    start = script.index('ask_v3() {')
    function = script[start:script.index('\n}\n', start) + 3]
    proc = subprocess.run(['sh', '-c', 'timeout_s=5; errors=/dev/null\n' + function + 'ask_v3 /p "$1" 2 shared; '
                           'echo "$answered $complete $ratio $servers $clients $limits $cpids"', 'sh', str(control)],
                          capture_output=True, text=True, check=True, timeout=30)
    assert proc.stdout.split() == said.split(), proc.stdout
