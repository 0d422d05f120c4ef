# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A real node_exporter serves what the health check wrote for it (``render_health(metrics_dir=...)``).

The fleet role provisions a simulated four-GPU host of this test's own (``mps_supervisor: none``): ``train`` on GPUs
0-1 with 25 % of the threads and a pinned memory limit on its first GPU, ``infer`` on GPU 2 with ``replicas: 4``,
``spare`` on GPU 3 without limits; two simulated CUDA clients hold ``train``'s server. The test then lays down what
``supervisor: systemd`` would have (each resource's environment file, the template unit and its enabled instances)
and the health check's files from ``render_health``, runs the script with ``sh`` in a bare environment as the timer
would, and scrapes ``/metrics`` of a real ``prometheus-node-exporter`` reading the textfile directory: every series
with its value, ``node_textfile_scrape_error 0``. Then one daemon is killed and the check runs again: that resource
is down, not answering, ``reason="not_running"``, the ready mark gone, the last success kept. Teardown: node_exporter
and the clients by pid, the role's ``mps_state: absent``, ``hacking/leftovers.py --kill``; nothing of the test may run
afterwards. The scraped lines are printed (and written to ``quotes.txt``) for the docs. Run by ``make engines``.
"""
from __future__ import annotations

import configparser
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any, Dict, FrozenSet, Iterator, List, NamedTuple, Optional, Tuple

import pytest
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, 'tests', 'fakes'))
from private_host import PYTHON, private_host  # noqa: E402  pylint: disable=wrong-import-position

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quoted import check_quoted  # noqa: E402  pylint: disable=wrong-import-position

NODE_EXPORTER = os.environ.get('NODE_EXPORTER', '/usr/bin/prometheus-node-exporter')
RECAP = re.compile(r'^gpu01\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)', re.M)
RESOURCES = [
    {'name': 'train', 'devices': [0, 1], 'active_thread_percentage': 25, 'pinned_device_mem_limit': {0: '3840M'}},
    {'name': 'infer', 'devices': [2], 'replicas': 4},
    {'name': 'spare', 'devices': [3]},
]
# What systemd gives a oneshot service: no FAKE_*, no CUDA_*; the simulator's wrapper finds its own GPU set.
BARE_ENV = {'PATH': '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', 'LANG': 'C.UTF-8'}
Series = Dict[Tuple[str, FrozenSet[Tuple[str, str]]], float]


class Lab(NamedTuple):
    work: str
    base: str
    sim: str
    tree: str
    root: str
    config_dir: str
    unit_dir: str
    metrics_dir: str
    script: str
    quotes: List[str]
    procs: Dict[str, subprocess.Popen]
    state: Dict[str, str]


# --- the collection, as this checkout has it ----------------------------------------------------------------------------
RENDER = r'''
import json, sys
from ansible_collections.gpufleet.mps.plugins.module_utils._resource.layout import config_paths, resource_paths
from ansible_collections.gpufleet.mps.plugins.module_utils._resource.record import StartRecord
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.health import render_health
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.unit import UNIT_NAME, render_env, render_unit, unit_environment
args = json.loads(sys.argv[1])
files, enabled = {}, []
for name in args['resources']:
    paths, config = resource_paths(args['root'], name), config_paths(args['config_dir'], name)
    with open(paths.started_file, encoding='utf-8') as handle:
        record = StartRecord.from_data(json.load(handle))
    values = unit_environment(paths, config, record.devices, multiuser=record.multiuser, compute_mode=record.compute_mode,
                              control_binary=args['control'], nvidia_smi=None, stop_timeout=5, log_mode=0o700)
    files[config.env_file] = render_env(name, values)
    enabled.append('gpufleet-mps@%s.service' % config.instance)
files[args['unit_dir'] + '/' + UNIT_NAME] = render_unit(args['config_dir'], 30, 5)
files.update(render_health(args['root'], args['config_dir'], args['unit_dir'], interval=30, timeout=5, script=args['script'],
                           metrics_dir=args['metrics_dir']))
print(json.dumps({'files': files, 'enabled': enabled, 'template': UNIT_NAME}))
'''


def lay_out_as_systemd_would(lab: Lab) -> None:
    """Each resource's environment file (as mps_daemon writes it under supervisor=systemd), the template unit, the
    enabled instances' links, and the health check's script, service and timer with the metrics directory."""
    args = {'root': lab.root, 'config_dir': lab.config_dir, 'unit_dir': lab.unit_dir, 'metrics_dir': lab.metrics_dir,
            'script': lab.script, 'control': lab.sim + '/bin/nvidia-cuda-mps-control',
            'resources': [resource['name'] for resource in RESOURCES]}
    proc = subprocess.run([PYTHON, '-c', RENDER, json.dumps(args)], env=dict(os.environ, PYTHONPATH=lab.tree),
                          capture_output=True, text=True, check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for path, content in out['files'].items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, 'w', encoding='utf-8') as handle:
            handle.write(content)
    os.chmod(lab.script, 0o755)
    wants = os.path.join(lab.unit_dir, 'multi-user.target.wants')
    os.makedirs(wants, exist_ok=True)
    for unit in out['enabled']:  # systemctl enable: a link to the template
        os.symlink(os.path.join(lab.unit_dir, out['template']), os.path.join(wants, unit))
    os.makedirs(lab.metrics_dir, exist_ok=True)


def health_check(lab: Lab) -> subprocess.CompletedProcess:
    started = time.monotonic()
    proc = subprocess.run(['sh', lab.script], env=BARE_ENV, capture_output=True, text=True, timeout=120, check=False)
    lab.quotes.append('$ sh %s   # exit %d, %.2f s' % (lab.script, proc.returncode, time.monotonic() - started))
    lab.quotes.extend(proc.stdout.splitlines() + proc.stderr.splitlines())
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(lab.metrics_dir)) == ['gpufleet_mps.prom']  # no temp file left behind
    return proc


# --- node_exporter ------------------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def start_node_exporter(lab: Lab) -> str:
    """node_exporter with only its textfile collector, on a free local port; its URL once it answers."""
    for _attempt in range(5):
        port = free_port()
        log = open(os.path.join(lab.work, 'node_exporter.log'), 'a', encoding='utf-8')  # pylint: disable=consider-using-with
        proc = subprocess.Popen([  # pylint: disable=consider-using-with
            NODE_EXPORTER, '--web.listen-address=127.0.0.1:%d' % port, '--collector.disable-defaults',
            '--collector.textfile', '--collector.textfile.directory=%s' % lab.metrics_dir, '--no-collector.systemd',
            '--web.disable-exporter-metrics'], stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=BARE_ENV)
        log.close()
        lab.procs['node_exporter'] = proc
        url = 'http://127.0.0.1:%d/metrics' % port
        deadline = time.monotonic() + 15
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=2):
                    lab.quotes.append('$ %s --web.listen-address=127.0.0.1:%d --collector.disable-defaults --collector.textfile '
                                      '--collector.textfile.directory=%s --no-collector.systemd --web.disable-exporter-metrics'
                                      % (NODE_EXPORTER, port, lab.metrics_dir))
                    lab.state['url'] = url
                    return url
            except OSError:
                time.sleep(0.1)
        stop(proc)  # the port was taken meanwhile, or it did not come up: another port
    with open(os.path.join(lab.work, 'node_exporter.log'), encoding='utf-8') as handle:
        pytest.fail('node_exporter did not serve /metrics: %s' % handle.read()[-3000:])
    return ''


def stop(proc: Optional[subprocess.Popen]) -> None:
    """End a process the test started, by its pid: TERM, then KILL."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


_SAMPLE = re.compile(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?')


def scrape(url: str) -> Tuple[List[str], Series]:
    """The served lines, and every sample: (name, labels) -> value."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode('utf-8')
    lines = text.splitlines()
    found: Series = {}
    for line in lines:
        if not line or line.startswith('#'):
            continue
        match = _SAMPLE.fullmatch(line)
        assert match, 'not an exposition-format sample: %r' % line
        labels_text = match.group(2) or ''
        pairs = _LABEL.findall(labels_text)
        assert ''.join('%s="%s",' % pair for pair in pairs).rstrip(',') == labels_text.rstrip(','), line
        labels = frozenset((key, re.sub(r'\\(.)', lambda m: '\n' if m.group(1) == 'n' else m.group(1), value)) for key, value in pairs)
        assert (match.group(1), labels) not in found, 'served twice: %r' % line
        found[(match.group(1), labels)] = float(match.group(3))
    return lines, found


def of(found: Series, name: str, **labels: str) -> Dict[str, float]:
    """resource (or the root-wide value under '') -> value of ``name`` among the samples that have ``labels``."""
    out = {}
    for (sample, pairs), value in found.items():
        if sample == name and set(labels.items()) <= pairs:
            out[dict(pairs).get('resource', '')] = value
    return out


def show(capsys: pytest.CaptureFixture, lab: Lab, lines: List[str], title: str) -> None:
    """The lines the docs quote, on the terminal even under pytest -q."""
    quoted = [line for line in lines if 'gpufleet_mps' in line or line.startswith(('node_textfile', '# HELP node_textfile', '# TYPE node_textfile'))]
    lab.quotes.append('--- %s: curl -s %s' % (title, 'http://127.0.0.1:<port>/metrics'))
    lab.quotes.extend(quoted)
    with capsys.disabled():
        print('\n%s\n%s' % (title, '\n'.join('    ' + line for line in quoted)))


# --- the lab --------------------------------------------------------------------------------------------------------------
def playbook(lab_work: str, tree: str, name: str, plays: list) -> str:
    path = os.path.join(lab_work, name)
    with open(path, 'w', encoding='utf-8') as handle:
        yaml.safe_dump(plays, handle, sort_keys=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith(('CUDA_MPS_', 'FAKE_', 'NVML_'))}
    env.update(ANSIBLE_NOCOLOR='1', ANSIBLE_FORCE_COLOR='0', LD_LIBRARY_PATH='', ANSIBLE_COLLECTIONS_PATH=tree)
    proc = subprocess.run([os.path.join(REPO, '.venv', 'bin', 'ansible-playbook'), '-i', os.path.join(lab_work, 'inventory.yml'), path],
                          cwd=lab_work, env=env, capture_output=True, text=True, timeout=600, check=False)
    recap = RECAP.search(proc.stdout)
    assert proc.returncode == 0 and recap and recap.group(4) == '0', '%s failed:\n%s\n%s' % (name, proc.stdout[-6000:], proc.stderr[-2000:])
    return proc.stdout


def role(lab: Lab, name: str, **role_vars: Any) -> str:
    return playbook(lab.work, lab.tree, name, [{
        'name': 'MPS for the metrics test', 'hosts': 'gpu_nodes', 'gather_facts': False, 'environment': '{{ sim_env }}',
        'roles': [{'role': 'gpufleet.mps.fleet', 'vars': role_vars}]}])


def leftovers(lab: Lab, kill: bool) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, os.path.join(REPO, 'hacking', 'leftovers.py')] + (['--kill'] if kill else []) + [lab.work],
                          capture_output=True, text=True, check=False, timeout=120)


def teardown(lab: Lab) -> None:
    """node_exporter and the clients by pid, the role's teardown, then whatever the simulator left (a second call: no-op)."""
    for proc in lab.procs.values():
        if proc.stdin and not proc.stdin.closed:
            proc.stdin.close()  # a client leaves when its stdin closes
        stop(proc)
    if os.path.isdir(lab.root) and os.listdir(lab.root):
        role(lab, 'down.yml', mps_state='absent', mps_busy='terminate', mps_remove_logs=True)
    leftovers(lab, kill=True)


def grid_memory(sim: str, gpu: int) -> int:
    parser = configparser.ConfigParser()
    parser.read(os.path.join(sim, 'nvml.ini'))
    return parser.getint('gpu%d' % gpu, 'memory_total_mib')


@pytest.fixture(scope='module')
def lab() -> Iterator[Lab]:
    if not os.access(NODE_EXPORTER, os.X_OK):
        pytest.fail('%s missing: make engines installs it (hacking/install-deps.sh, prometheus-node-exporter)' % NODE_EXPORTER)
    work, base, sim = private_host('engines-metrics', 'engines', None)
    tree = os.path.join(work, 'tree')
    # this checkout's collection, whatever TEST_ROOT's copy holds
    subprocess.run([os.path.join(REPO, 'hacking', 'collection-tree.sh'), tree], cwd=REPO, check=True, capture_output=True)
    root = os.path.join(base, 'mps')  # short: the pipe directories must stay within 87 bytes
    the_lab = Lab(work, base, sim, tree, root, base + '/etc/gpufleet-mps', base + '/etc/systemd/system',
                  base + '/var/lib/prometheus/node-exporter', base + '/usr/local/sbin/gpufleet-mps-health', [], {}, {})
    inventory = {'all': {'children': {'gpu_nodes': {'hosts': {'gpu01': {
        'ansible_connection': 'local', 'ansible_python_interpreter': PYTHON, 'ansible_become': False,
        'mps_root': root, 'mps_config_dir': the_lab.config_dir,
        'mps_control_binary': sim + '/bin/nvidia-cuda-mps-control', 'mps_python': PYTHON, 'mps_supervisor': 'none',
        'mps_stop_timeout': 5, 'mps_logrotate_dir': base + '/etc/logrotate.d', 'mps_local_facts_dir': base + '/etc/ansible/facts.d',
        'mps_resources': RESOURCES,
        'sim_env': {'FAKE_NVML_CONFIG': sim + '/nvml.ini', 'LD_LIBRARY_PATH': sim + '/lib'},
    }}}}}}
    with open(os.path.join(work, 'inventory.yml'), 'w', encoding='utf-8') as handle:
        yaml.safe_dump(inventory, handle)
    try:
        started = time.monotonic()
        role(the_lab, 'up.yml')
        the_lab.quotes.append('fleet role: 3 daemons up in %.1f s' % (time.monotonic() - started))
        for _client in range(2):
            client = subprocess.Popen(  # pylint: disable=consider-using-with
                [sim + '/bin/mps-sim-client'], env=dict(BARE_ENV, CUDA_MPS_PIPE_DIRECTORY=root + '/train/pipe'),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            the_lab.procs['client-%d' % client.pid] = client
            reply = json.loads(client.stdout.readline())
            assert reply['ok'] and reply['active_thread_percentage'] == 25.0 and reply['pinned_mem_limit_mib']['0'] == 3840, reply
        lay_out_as_systemd_would(the_lab)
        yield the_lab
    finally:
        try:
            teardown(the_lab)
        finally:
            with open(os.path.join(work, 'quotes.txt'), 'w', encoding='utf-8') as handle:
                handle.write('\n'.join(the_lab.quotes) + '\n')


def test_node_exporter_serves_every_daemons_health_servers_clients_and_limits(lab: Lab, capsys: pytest.CaptureFixture) -> None:
    before = time.time()
    result = health_check(lab)
    assert not result.stderr and os.path.exists(os.path.join(lab.root, '.ready'))  # the role wrote it; the check keeps it
    textfile = os.path.join(lab.metrics_dir, 'gpufleet_mps.prom')
    with open(textfile, encoding='utf-8') as handle:
        lab.quotes.extend(['--- %s, as the check wrote it' % textfile] + handle.read().splitlines())
    url = start_node_exporter(lab)
    lines, found = scrape(url)
    show(capsys, lab, lines, 'every daemon answering')
    assert found[('node_textfile_scrape_error', frozenset())] == 0
    assert of(found, 'node_textfile_mtime_seconds', file=os.path.join(lab.metrics_dir, 'gpufleet_mps.prom')) == {'': pytest.approx(time.time(), abs=60)}
    root = {'root': lab.root}
    every = {'train': 1.0, 'infer': 1.0, 'spare': 1.0}
    assert of(found, 'gpufleet_mps_daemon_up', **root) == every
    assert of(found, 'gpufleet_mps_daemon_answering', **root) == every
    for reason in ('not_running', 'unreachable', 'timeout', 'control_binary', 'ui_failed', 'bad_answer'):
        assert of(found, 'gpufleet_mps_daemon_error', reason=reason, **root) == {'train': 0.0, 'infer': 0.0, 'spare': 0.0}, reason
    assert of(found, 'gpufleet_mps_servers', **root) == {'train': 1.0, 'infer': 0.0, 'spare': 0.0}
    assert of(found, 'gpufleet_mps_clients', **root) == {'train': 2.0, 'infer': 0.0, 'spare': 0.0}
    assert of(found, 'gpufleet_mps_default_active_thread_ratio', **root) == {'train': 0.25, 'infer': 0.25, 'spare': 1.0}
    # 3840M reads back as 3G; replicas 4 on GPU 2: total/4 MiB, read back in whole GiB (rounded down)
    infer_mib = grid_memory(lab.sim, 2) // 4
    assert of(found, 'gpufleet_mps_default_device_pinned_memory_limit_bytes', device='0', **root) == {
        'train': 3 * 2 ** 30, 'infer': (infer_mib // 1024) * 2 ** 30 if infer_mib >= 1024 else infer_mib * 2 ** 20}
    assert of(found, 'gpufleet_mps_default_device_pinned_memory_limit_bytes', device='1', **root) == {}  # no limit set there
    devices = {dict(pairs)['resource'] + '/' + dict(pairs)['device']: dict(pairs)['uuid']
               for (name, pairs), _value in found.items() if name == 'gpufleet_mps_device_info'}
    with open(os.path.join(lab.root, 'train', '.started'), encoding='utf-8') as handle:
        assert [devices['train/0'], devices['train/1']] == json.load(handle)['devices']
    assert sorted(devices) == ['infer/0', 'spare/0', 'train/0', 'train/1']
    assert of(found, 'gpufleet_mps_ready', **root) == {'': 1.0}
    stamp = of(found, 'gpufleet_mps_health_check_timestamp_seconds', **root)['']
    assert int(before) <= stamp <= time.time()
    assert of(found, 'gpufleet_mps_health_check_last_success_timestamp_seconds', **root) == {'': stamp}
    assert 0 <= of(found, 'gpufleet_mps_health_check_duration_seconds', **root)[''] < 5
    assert 'gpufleet_mps_clients{resource="train",root="%s"} 2' % lab.root in lines
    assert '# TYPE gpufleet_mps_daemon_up gauge' in lines


def test_a_killed_daemon_is_served_as_down_with_its_reason(lab: Lab, capsys: pytest.CaptureFixture) -> None:
    running = 'node_exporter' in lab.procs and lab.procs['node_exporter'].poll() is None
    url = lab.state['url'] if running else start_node_exporter(lab)
    _lines, found = scrape(url)
    success = of(found, 'gpufleet_mps_health_check_last_success_timestamp_seconds', root=lab.root)['']
    with open(os.path.join(lab.root, 'infer', 'pipe', 'nvidia-cuda-mps-control.pid'), encoding='ascii') as handle:
        pid = int(handle.read())
    time.sleep(1.1)  # a later second than the last success
    os.kill(pid, signal.SIGKILL)
    result = health_check(lab)
    assert 'infer/pipe did not answer within 5s (not_running)' in result.stderr
    assert '.ready withdrawn (1 not answering, 2 healthy)' in result.stderr
    lines, found = scrape(url)
    show(capsys, lab, lines, 'infer\'s daemon killed')
    assert found[('node_textfile_scrape_error', frozenset())] == 0
    root = {'root': lab.root}
    assert of(found, 'gpufleet_mps_daemon_up', **root) == {'train': 1.0, 'infer': 0.0, 'spare': 1.0}
    assert of(found, 'gpufleet_mps_daemon_answering', **root) == {'train': 1.0, 'infer': 0.0, 'spare': 1.0}
    assert of(found, 'gpufleet_mps_daemon_error', reason='not_running', **root) == {'train': 0.0, 'infer': 1.0, 'spare': 0.0}
    assert sum(value for (name, pairs), value in found.items() if name == 'gpufleet_mps_daemon_error' and dict(pairs)['resource'] == 'infer') == 1
    # what a dead daemon cannot say is absent, not stale
    assert of(found, 'gpufleet_mps_servers', **root) == {'train': 1.0, 'spare': 0.0}
    assert of(found, 'gpufleet_mps_default_active_thread_ratio', **root) == {'train': 0.25, 'spare': 1.0}
    assert 'infer' not in of(found, 'gpufleet_mps_default_device_pinned_memory_limit_bytes', **root)
    assert 'infer' in {dict(pairs)['resource'] for (name, pairs), _v in found.items() if name == 'gpufleet_mps_device_info'}
    assert of(found, 'gpufleet_mps_ready', **root) == {'': 0.0} and not os.path.exists(os.path.join(lab.root, '.ready'))
    assert of(found, 'gpufleet_mps_health_check_last_success_timestamp_seconds', **root) == {'': success}
    assert of(found, 'gpufleet_mps_health_check_timestamp_seconds', **root)[''] > success


def test_the_monitoring_guide_quotes_what_node_exporter_served(lab: Lab) -> None:
    assert check_quoted('docs/docsite/rst/guide_monitoring.rst', 'metrics', '\n'.join(lab.quotes)) == 4


def test_the_teardown_leaves_nothing_of_the_test_running(lab: Lab) -> None:
    pids = {name: proc.pid for name, proc in lab.procs.items()}
    assert 'node_exporter' in pids and len(pids) == 3
    teardown(lab)
    for name, proc in lab.procs.items():
        assert proc.poll() is not None, '%s (pid %d) still runs' % (name, proc.pid)
    found = leftovers(lab, kill=False)
    assert found.returncode == 0 and not found.stdout.strip(), found.stdout + found.stderr
    running = subprocess.run(['ps', '-eo', 'pid=,args='], capture_output=True, text=True, check=True).stdout
    assert not [line for line in running.splitlines() if lab.work in line and NODE_EXPORTER in line], running
    assert not os.path.exists(lab.root) or not [name for name in os.listdir(lab.root) if name in ('train', 'infer', 'spare')]
