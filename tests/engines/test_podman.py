# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A client in a real podman container reaches a daemon the fleet role started, through the container view.

The fleet role provisions a simulated four-GPU host of this test's own (``mps_shm: true``, ``mps_supervisor: none``):
``infer`` on GPUs 0-1 with ``replicas: 2`` (50 % of the threads) and ``train`` on GPUs 2-3 with 75 %.
``gpufleet.mps.mps_info`` gives each daemon's container view, ``engine_args`` (plugins/module_utils/_container.py)
turns it into podman arguments, and the simulator's CUDA client stand-in runs in a podman container as uid 65534
(``tests/engines/podman_env.py``: a podman whose state lies under this test's directory, its run root aside). The client must get
``infer``'s GPUs and limits; without the daemon's /dev/shm it must find the daemon but fail on its server; its own
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE must lower what it gets, never raise it. Then the daemons move to the host's
/dev/shm and ``shm="ipc-host"`` must reach them too. Teardown: the role's ``mps_state: absent``, podman's cleanup,
``hacking/leftovers.py --kill``; nothing of the test may run afterwards. Run by ``make engines``.
"""
from __future__ import annotations

import importlib
import json
import os
import select
import shlex
import subprocess
import sys
import time
from typing import Any, Dict, Iterator, List, NamedTuple, Sequence

import pytest
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, 'tests', 'fakes'))
sys.path.insert(0, HERE)
from private_host import PYTHON, collections_path, private_host  # noqa: E402  pylint: disable=wrong-import-position
from podman_env import Podman, rootfs, which  # noqa: E402  pylint: disable=wrong-import-position
from quoted import check_quoted  # noqa: E402  pylint: disable=wrong-import-position

CLIENT = os.path.join(REPO, 'tests', 'fakes', 'mps', 'mps_client.py')
CLIENT_IN = '/client/mps_client.py'
# --timeout: a client that is never given a server fails instead of hanging the test
CLIENT_CMD = ['python3', CLIENT_IN, '--once', '--timeout', '30']
UID = '65534:65534'
RESOURCES = [
    {'name': 'infer', 'devices': [0, 1], 'replicas': 2},
    {'name': 'train', 'devices': [2, 3], 'active_thread_percentage': 75},
]


class Lab(NamedTuple):
    work: str
    base: str
    sim: str
    root: str
    podman: Podman
    engine_args: Any
    collections: str
    quotes: List[str]


def import_engine_args(collections: str) -> Any:
    if not os.path.isfile(os.path.join(collections, 'ansible_collections', 'gpufleet', 'mps', 'plugins', 'module_utils', '_container.py')):
        pytest.fail('the collection tree in %s has no plugins/module_utils/_container.py: make collection copies the checkout '
                    'there anew' % collections)
    sys.path.insert(0, collections)
    return importlib.import_module('ansible_collections.gpufleet.mps.plugins.module_utils._container').engine_args


def playbook(lab_work: str, collections: str, name: str, plays: list) -> str:
    path = os.path.join(lab_work, name)
    with open(path, 'w', encoding='utf-8') as handle:
        yaml.safe_dump(plays, handle, sort_keys=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith(('CUDA_MPS_', 'FAKE_', 'NVML_', 'CONTAINERS_'))}
    env.update(ANSIBLE_NOCOLOR='1', ANSIBLE_FORCE_COLOR='0', LD_LIBRARY_PATH='', ANSIBLE_COLLECTIONS_PATH=collections)
    proc = subprocess.run([os.path.join(REPO, '.venv', 'bin', 'ansible-playbook'), '-i', os.path.join(lab_work, 'inventory.yml'), path],
                          cwd=lab_work, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, '%s failed:\n%s\n%s' % (name, proc.stdout[-6000:], proc.stderr[-2000:])
    return proc.stdout


def role(lab: Lab, name: str, **role_vars: Any) -> str:
    return playbook(lab.work, lab.collections, name, [{
        'name': 'MPS for container clients', 'hosts': 'gpu_nodes', 'gather_facts': False, 'environment': '{{ sim_env }}',
        'roles': [{'role': 'gpufleet.mps.fleet', 'vars': role_vars}]}])


def info(lab: Lab, gather: Sequence[str] = ('daemons',)) -> Dict[str, Dict[str, Any]]:
    """mps_info's daemons by name, as a play registers them and writes them to a file."""
    out = os.path.join(lab.work, 'info.json')
    playbook(lab.work, lab.collections, 'info.yml', [{
        'name': 'The container views', 'hosts': 'gpu_nodes', 'gather_facts': False, 'environment': '{{ sim_env }}',
        'tasks': [
            {'name': 'Gather the daemons', 'gpufleet.mps.mps_info': {
                'root': '{{ mps_root }}', 'config_dir': '{{ mps_config_dir }}', 'control_binary': '{{ mps_control_binary }}',
                'gather': list(gather)}, 'register': 'info'},
            {'name': 'Write them for the container runner', 'ansible.builtin.copy': {
                'dest': out, 'content': '{{ info.daemons | to_json }}', 'mode': '0644'}},
        ]}])
    with open(out, encoding='utf-8') as handle:
        return {daemon['name']: daemon for daemon in json.load(handle)}


def client(lab: Lab, args: List[str]) -> subprocess.CompletedProcess:
    """The client stand-in in a container as uid 65534, with ``args`` from engine_args; its script bind-mounted read-only."""
    argv = ['--user', UID, '--volume', CLIENT + ':' + CLIENT_IN + ':ro'] + args
    started = time.monotonic()
    proc = lab.podman.run(argv, CLIENT_CMD, timeout=120)
    lab.quotes.append('$ %s   # %.2f s' % (shlex.join(lab.podman.run_argv(argv, CLIENT_CMD)), time.monotonic() - started))
    lab.quotes.extend(proc.stdout.splitlines() + proc.stderr.splitlines())
    return proc


def reply(proc: subprocess.CompletedProcess) -> Dict[str, Any]:
    lines = proc.stdout.strip().splitlines()
    assert lines, 'the client printed nothing (exit %d): %s' % (proc.returncode, proc.stderr[-3000:])
    return json.loads(lines[-1])


def control_log(lab: Lab, resource: str) -> List[str]:
    with open(os.path.join(lab.root, resource, 'log', 'control.log'), encoding='utf-8') as handle:
        return handle.read().splitlines()


def teardown(lab: Lab) -> List[str]:
    """Containers first (they hold the shared tmpfs), then the role's teardown, then whatever the simulator left - that
    last one even when the role fails. Returns what podman's cleanup had to end or remove."""
    done = lab.podman.cleanup()
    try:
        role(lab, 'down.yml', mps_state='absent', mps_busy='terminate', mps_remove_logs=True)
    finally:
        subprocess.run([PYTHON, os.path.join(REPO, 'hacking', 'leftovers.py'), '--kill', lab.work], check=False, capture_output=True)
    return done


def mounts_under(directory: str) -> List[str]:
    with open('/proc/self/mountinfo', encoding='utf-8', errors='replace') as handle:
        points = {line.split()[4].replace('\\040', ' ') for line in handle}
    return sorted((p for p in points if p.startswith(directory + '/')), key=lambda p: (-p.count('/'), p))


def forget_killed_run(work: str, tree: str) -> None:
    """End what a run of this test that was killed left behind, before private_host removes its directory: its
    containers, its daemons (they would hold the GPUs of the same UUIDs), the tmpfs the role mounted."""
    if not os.path.isdir(work):
        return
    Podman(os.path.join(work, 'podman'), tree).cleanup()
    subprocess.run([PYTHON, os.path.join(REPO, 'hacking', 'leftovers.py'), '--kill', work], check=False, capture_output=True)
    for point in mounts_under(work):
        subprocess.run(['umount', point], check=False, capture_output=True)


@pytest.fixture(scope='module')
def lab() -> Iterator[Lab]:
    test_root = os.environ.get('TEST_ROOT')
    if not test_root:
        pytest.fail('TEST_ROOT is not set: run this through make engines, which sets it as every make target does')
    missing = [tool for tool in ('podman', 'runc', 'conmon', 'debootstrap') if not which(tool)]
    if missing:
        pytest.fail('%s missing: make engines installs them (hacking/install-deps.sh)' % ', '.join(missing))
    started = time.monotonic()
    tree = rootfs(os.path.join(test_root, 'engines-cache'))
    quotes = ['container root %s ready in %.1f s' % (tree, time.monotonic() - started)]
    forget_killed_run(os.path.join(test_root, 'engines-podman'), tree)
    work, base, sim = private_host('engines-podman', 'engines', None)
    collections = collections_path(work)
    engine_args = import_engine_args(collections)
    # a short root: the pipe directory must stay within 87 bytes
    root = os.path.join(base, 'mps')
    inventory = {'all': {'children': {'gpu_nodes': {'hosts': {'gpu01': {
        'ansible_connection': 'local', 'ansible_python_interpreter': PYTHON, 'ansible_become': False,
        'mps_root': root, 'mps_config_dir': base + '/etc/gpufleet-mps',
        'mps_control_binary': sim + '/bin/nvidia-cuda-mps-control', 'mps_python': PYTHON, 'mps_supervisor': 'none',
        'mps_stop_timeout': 5, 'mps_logrotate_dir': base + '/etc/logrotate.d', 'mps_local_facts_dir': base + '/etc/ansible/facts.d',
        # the tmpfs only for this run: never an fstab line on this machine
        'mps_shm': True, 'mps_shm_size': '64m', 'mps_shm_persist': 'none', 'mps_resources': RESOURCES,
        'sim_env': {'FAKE_NVML_CONFIG': sim + '/nvml.ini', 'LD_LIBRARY_PATH': sim + '/lib'},
    }}}}}}
    with open(os.path.join(work, 'inventory.yml'), 'w', encoding='utf-8') as handle:
        yaml.safe_dump(inventory, handle)
    the_lab = Lab(work, base, sim, root, Podman(os.path.join(work, 'podman'), tree), engine_args, collections, quotes)
    try:
        role(the_lab, 'up.yml')
        yield the_lab
    finally:
        with open(os.path.join(work, 'quotes.txt'), 'w', encoding='utf-8') as handle:
            handle.write('\n'.join(quotes) + '\n')
        try:
            teardown(the_lab)
        finally:
            the_lab.podman.cleanup()


def show(capsys: pytest.CaptureFixture, lab: Lab, since: int) -> None:
    """The lines the guide quotes, on the terminal even under pytest -q."""
    with capsys.disabled():
        print('\n' + '\n'.join('    ' + line for line in lab.quotes[since:]))


def test_podman_keeps_its_state_under_the_test_directory(lab: Lab) -> None:
    proc = lab.podman.podman(['info', '--format', '{{.Store.GraphRoot}} {{.Store.RunRoot}} {{.Host.OCIRuntime.Path}} {{.Host.CgroupManager}}'])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [lab.podman.dir + '/graph', lab.podman.runroot, lab.podman.dir + '/bin/runc', 'cgroupfs']


def test_a_client_in_a_container_reaches_its_daemon_through_the_view(lab: Lab, capsys: pytest.CaptureFixture) -> None:
    since = len(lab.quotes)
    daemons = info(lab)
    view = daemons['infer']['container']
    assert view['mounts'][1] == {'source': lab.root + '/shm', 'target': '/dev/shm'}, view
    args = lab.engine_args(view)['podman']
    # mps_info returns the same arguments in the view (daemons[].container.engine), for a play to use directly
    assert view['engine']['podman'] == args, view
    lab.quotes.append('engine_args(view)["podman"] = %s' % json.dumps(args))
    proc = client(lab, args)
    got = reply(proc)
    assert proc.returncode == 0 and got['ok'], proc.stdout + proc.stderr
    # infer's daemon, not train's: its GPUs and its limit
    assert [d['uuid'] for d in got['devices']] == [d['uuid'] for d in daemons['infer']['devices']]
    assert got['active_thread_percentage'] == daemons['infer']['limits']['reported']['active_thread_percentage'] == 50.0
    assert got['client_uid'] == got['uid'] == 65534
    # the daemon saw a client in another pid namespace: a container's, logged as pid 0 (as real logs show it)
    assert any('NEW CLIENT 0 from user 65534: ' in line for line in control_log(lab, 'infer'))
    assert not any('from user 65534' in line for line in control_log(lab, 'train'))
    lab.quotes.extend(line for line in control_log(lab, 'infer') if 'user 65534' in line)
    show(capsys, lab, since)


def test_mps_info_names_the_container_of_each_client(lab: Lab, capsys: pytest.CaptureFixture) -> None:
    """Whose client is it (issue 44): a client held in a container; mps_info attributes it to that container's id, from
    the cgroup podman put it in."""
    since = len(lab.quotes)
    view = info(lab)['infer']['container']
    name = 'attributed-%d' % os.getpid()
    argv = lab.podman.run_argv(['-i', '--name', name, '--user', UID, '--volume', CLIENT + ':' + CLIENT_IN + ':ro']
                               + lab.engine_args(view)['podman'], ['python3', CLIENT_IN, '--timeout', '30'])
    held = subprocess.Popen(argv, env=lab.podman.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,  # pylint: disable=consider-using-with
                            stderr=subprocess.PIPE, text=True)
    try:
        ready = select.select([held.stdout], [], [], 90)[0]
        line = held.stdout.readline() if ready else ''
        assert line and json.loads(line)['ok'], 'the held client printed %r' % line
        found = lab.podman.podman(['inspect', '--format', '{{.Id}} {{.State.Pid}}', name])
        assert found.returncode == 0, found.stderr
        container, pid = found.stdout.split()
        daemon = info(lab, ('daemons', 'servers'))['infer']
        owners = [owner for server in daemon['servers'] for owner in server['client_owners']]
        assert [(o['owner'], o['engine'], o['container'], o['uid']) for o in owners] == [('container', 'podman', container, 65534)], owners
        assert owners[0]['pid'] == int(pid)  # the client is the container's own process
        assert daemon['clients_by_owner'] == {'container': 1, 'slurm_job': 0, 'host': 0, 'unknown': 0}
        # the metrics script's own classifier (gpufleet_mps_clients_by_owner), on the real container's client
        from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.metrics import render_metrics_script
        script = render_metrics_script('/r', '/e', '/w', 3, '/m')
        start = script.index("container_re='")
        classify = script[start:script.index('\n}\n', start) + 3] + 'owner_of "$1"; echo "$owner"'
        said = subprocess.run(['sh', '-c', classify, 'sh', '/proc/%d/cgroup' % owners[0]['pid']], capture_output=True, text=True,
                              check=True, timeout=30)
        assert said.stdout.split() == ['container'], said
        with open('/proc/%d/cgroup' % owners[0]['pid'], encoding='utf-8') as handle:
            lab.quotes.extend(['$ cat /proc/%d/cgroup   # the client, as mps_info read it' % owners[0]['pid']] + handle.read().splitlines())
        lab.quotes.append('client_owners: %s' % json.dumps(owners))
    finally:
        held.stdin.close()
        try:
            held.wait(60)
        except subprocess.TimeoutExpired:
            held.kill()
            held.wait(10)
        lab.podman.podman(['rm', '-f', name])  # gone with --rm already, unless the client hung
    show(capsys, lab, since)


def test_the_pipe_directory_is_read_only_in_the_container_and_dev_shm_is_the_daemons(lab: Lab) -> None:
    view = info(lab)['infer']['container']
    probe = ('import os, sys\n'
             'try:\n    open(sys.argv[1] + "/x", "w")\nexcept OSError as exc:\n    print("pipe", exc.strerror)\n'
             'print("shm", sorted(n for n in os.listdir("/dev/shm") if n.startswith("mps-sim-server.")) != [])\n'
             'open("/dev/shm/written-by-the-container", "w").close()\n')
    proc = lab.podman.run(['--user', UID] + lab.engine_args(view)['podman'], ['python3', '-c', probe, view['pipe_dir']])
    assert proc.returncode == 0, proc.stderr
    # the client needs no more than that: the test above ran with this read-only mount
    assert proc.stdout.splitlines() == ['pipe Read-only file system', 'shm True']
    written = os.path.join(lab.root, 'shm', 'written-by-the-container')
    assert os.path.exists(written)
    os.unlink(written)


def test_without_the_daemons_dev_shm_the_client_finds_the_daemon_but_not_its_server(lab: Lab, capsys: pytest.CaptureFixture) -> None:
    since = len(lab.quotes)
    view = info(lab)['infer']['container']
    proc = client(lab, lab.engine_args(view, shm='none')['podman'])
    got = reply(proc)
    assert proc.returncode == 1 and got['error'] == 'CUDA_ERROR_MPS_CONNECTION_FAILED', proc.stdout + proc.stderr
    # it reached the daemon, which named a server: only the shared memory was missing
    assert got['detail'].startswith('/dev/shm/mps-sim-server.') and "this client's /dev/shm is not the MPS server's" in got['detail']
    show(capsys, lab, since)


@pytest.mark.parametrize('asked, gets', [(10, 10.0), (90, 50.0)])
def test_the_clients_own_limit_lowers_what_it_gets_and_never_raises_it(lab: Lab, capsys: pytest.CaptureFixture, asked: int, gets: float) -> None:
    since = len(lab.quotes)
    view = info(lab)['infer']['container']
    args = lab.engine_args(view, extra_env={'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE': asked})['podman']
    assert '--env' in args and 'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%d' % asked in args
    proc = client(lab, args)
    got = reply(proc)
    assert proc.returncode == 0 and got['ok'], proc.stdout + proc.stderr
    assert got['active_thread_percentage'] == gets
    show(capsys, lab, since)


def test_a_daemon_on_the_hosts_dev_shm_is_reached_with_the_hosts_ipc_namespace(lab: Lab, capsys: pytest.CaptureFixture) -> None:
    since = len(lab.quotes)
    role(lab, 'host-shm.yml', mps_shm=False, mps_busy='terminate')
    daemons = info(lab)
    view = daemons['infer']['container']
    assert view['mounts'][1] == {'source': '/dev/shm', 'target': '/dev/shm'}, view
    for mode in ('ipc-host', 'mount'):
        args = lab.engine_args(view, shm=mode)['podman']
        assert ('--ipc=host' in args) == (mode == 'ipc-host')
        got = reply(client(lab, args))
        assert got['ok'] and got['active_thread_percentage'] == 50.0, got
    show(capsys, lab, since)


def test_the_containers_guide_quotes_what_podman_printed(lab: Lab) -> None:
    assert check_quoted('docs/docsite/rst/guide_containers.rst', 'podman', '\n'.join(lab.quotes)) == 3


def test_teardown_leaves_nothing_of_the_test_running(lab: Lab, capsys: pytest.CaptureFixture) -> None:
    done = teardown(lab)
    # podman removed its own containers (run --rm) and ended its own processes: nothing for cleanup to end
    assert done == [], done
    assert lab.podman.leftovers() == []
    left = subprocess.run([PYTHON, os.path.join(REPO, 'hacking', 'leftovers.py'), lab.work], capture_output=True, text=True, check=False)
    assert left.returncode == 0, left.stdout
    assert mounts_under(lab.work) == []
    assert not os.path.exists(os.path.join(lab.root, 'infer'))
    with capsys.disabled():
        print('\n    teardown: nothing left running; cleanup had nothing to end')
