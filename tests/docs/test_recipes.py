# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every recipe of the recipes guide runs, as printed, on a simulated eight-GPU host (A100s) of its own.

Each ``.. code-block:: yaml`` of docs/docsite/rst/guide_recipes.rst is one of:

- role variables (a mapping of ``mps_*`` keys, as in ``group_vars``): the fleet role runs with them;
- tasks (a list of tasks): a play runs them, the modules pointed at the simulated host by module_defaults;
- a play (a list of plays): it runs as written, against an inventory group of its ``hosts``.

Each runs twice: the first run must not fail, the second must change nothing. Paths under ``/run`` and ``/etc``
in a recipe are taken under this test's own directory (``/run/nvidia/mps`` is ``<base>/run/nvidia/mps``); the
role's own settings that only say where the simulated host's tools are (``mps_control_binary``, ``mps_python``,
``mps_supervisor: none`` where systemd is not PID 1) come from the inventory, never from the recipe. Recipes run
in ORDER, on one host, from one state to the next, as a user would try them; the host is taken back to nothing
between two that would fight over its GPUs. Run by ``make docs-commands``.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Dict, Iterator, List, Tuple

import pytest
import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
sys.path.insert(0, os.path.join(REPO, 'tests', 'fakes'))
from private_host import PYTHON, private_host  # noqa: E402  pylint: disable=wrong-import-position

GUIDE = 'docs/docsite/rst/guide_recipes.rst'
RECAP = re.compile(r'^gpu01\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)', re.M)


def recipes() -> List[Tuple[int, str]]:
    """(line, text) of every YAML block of the guide."""
    with open(os.path.join(REPO, GUIDE), encoding='utf-8') as handle:
        lines = handle.read().split('\n')
    found = []
    for i, line in enumerate(lines):
        block = re.match(r'^(\s*)\.\. code-block:: yaml\s*$', line)
        if not block:
            continue
        body = []
        j = i + 1
        while j < len(lines) and (not lines[j].strip() or lines[j].startswith(block.group(1) + '   ')):
            body.append(lines[j][len(block.group(1)) + 3:])
            j += 1
        found.append((i + 1, '\n'.join(body).strip('\n') + '\n'))
    return found


RECIPES = recipes()
# The order they are tried in (by position in the guide), 'reset' taking the host back to nothing: the modules'
# recipe names GPU 7, which the subsets recipe gave another resource; stopping infer needs the modules' infer.
ORDER: List[object] = [0, 1, 'reset', 2, 3, 8, 4, 5, 6, 7]
CHECKS: Dict[int, Tuple[str, str]] = {
    # the mixed fleet's table: an A100 gets 4 replicas, 25.0 % of the threads
    0: ('nvidia.com/gpu', '25.0'),
    1: ('train', '50.0'),
    4: ('shared', '25.0'),
}


def test_every_recipe_is_in_the_order() -> None:
    assert len(RECIPES) == 9 and sorted(step for step in ORDER if step != 'reset') == list(range(len(RECIPES)))


@pytest.fixture(scope='module')
def host() -> Iterator[Dict[str, str]]:
    work, base, sim = private_host('recipes', 'docs-commands', 'a100x8.ini')
    os.makedirs(os.path.join(base, 'etc', 'profile.d'))  # as on any host
    inventory = {'all': {'children': {'gpu_nodes': {'hosts': {'gpu01': {
        'ansible_connection': 'local', 'ansible_python_interpreter': PYTHON,
        # the recipes' plays say become: true; this test already runs as root, and this machine has no sudo
        'ansible_become': False,
        'mps_root': base + '/run/nvidia/mps', 'mps_config_dir': base + '/etc/gpufleet-mps',
        'mps_control_binary': sim + '/bin/nvidia-cuda-mps-control', 'mps_python': PYTHON, 'mps_supervisor': 'none',
        'mps_stop_timeout': 5, 'mps_logrotate_dir': base + '/etc/logrotate.d', 'mps_local_facts_dir': base + '/etc/ansible/facts.d',
        'sim_env': {'FAKE_NVML_CONFIG': sim + '/nvml.ini', 'LD_LIBRARY_PATH': sim + '/lib'},
    }}}}}}
    with open(os.path.join(work, 'inventory.yml'), 'w', encoding='utf-8') as handle:
        yaml.safe_dump(inventory, handle)
    try:
        yield {'work': work, 'base': base, 'sim': sim}
    finally:
        run(work, 'reset.yml', reset_play(), check=False)
        subprocess.run([PYTHON, os.path.join(REPO, 'hacking', 'leftovers.py'), '--kill', work], check=False, capture_output=True)


def under(base: str, text: str) -> str:
    """The recipe with its /run and /etc paths under base."""
    return re.sub(r'(?<![\w./-])/(?=(?:run|etc)/)', base + '/', text)


def role_play(vars_file: str) -> list:
    return [{'name': 'A recipe\'s role variables', 'hosts': 'gpu_nodes', 'gather_facts': False, 'environment': '{{ sim_env }}',
             'vars_files': [vars_file], 'roles': [{'role': 'gpufleet.mps.fleet'}]}]


def tasks_play(tasks_file: str) -> list:
    defaults = {'root': '{{ mps_root }}', 'config_dir': '{{ mps_config_dir }}', 'control_binary': '{{ mps_control_binary }}'}
    return [{'name': 'A recipe\'s tasks', 'hosts': 'gpu_nodes', 'gather_facts': False, 'environment': '{{ sim_env }}',
             'module_defaults': {'gpufleet.mps.mps_limits': defaults, 'gpufleet.mps.mps_daemon': dict(defaults, supervisor='none'),
                                 'gpufleet.mps.mps_info': defaults},
             'tasks': [{'ansible.builtin.import_tasks': tasks_file}]}]


def reset_play() -> list:
    return [{'name': 'Back to a host without MPS', 'hosts': 'gpu_nodes', 'gather_facts': False, 'environment': '{{ sim_env }}',
             'roles': [{'role': 'gpufleet.mps.fleet', 'vars': {'mps_state': 'absent', 'mps_busy': 'terminate', 'mps_remove_logs': True}}]}]


def run(work: str, name: str, plays: list, check: bool = True) -> List[int]:
    path = os.path.join(work, name)
    with open(path, 'w', encoding='utf-8') as handle:
        yaml.safe_dump(plays, handle, sort_keys=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith(('CUDA_MPS_', 'FAKE_', 'NVML_'))}
    env.update(ANSIBLE_NOCOLOR='1', ANSIBLE_FORCE_COLOR='0', LD_LIBRARY_PATH='')
    proc = subprocess.run([os.path.join(REPO, '.venv', 'bin', 'ansible-playbook'), '-i', os.path.join(work, 'inventory.yml'), path],
                          cwd=work, env=env, capture_output=True, text=True, timeout=600, check=False)
    found = RECAP.search(proc.stdout)
    if check:
        assert proc.returncode == 0 and found, proc.stdout[-6000:] + proc.stderr[-2000:]
    return [int(value) for value in found.groups()] if found else []


def ask(host: Dict[str, str], resource: str, command: str) -> str:
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=os.path.join(host['base'], 'run', 'nvidia', 'mps', resource, 'pipe'))
    proc = subprocess.run([host['sim'] + '/bin/nvidia-cuda-mps-control'], input=command + '\n', capture_output=True, text=True,
                          env=env, timeout=60, check=False)
    return proc.stdout.strip()


def test_the_recipes_run_as_printed_and_a_second_run_changes_nothing(host: Dict[str, str]) -> None:
    for step in ORDER:
        if step == 'reset':
            run(host['work'], 'reset.yml', reset_play())
            continue
        line, text = RECIPES[int(str(step))]
        where = '%s:%d' % (GUIDE, line)
        name = 'recipe-%d.yml' % line
        with open(os.path.join(host['work'], name), 'w', encoding='utf-8') as handle:
            handle.write(under(host['base'], text))
        data = yaml.safe_load(text)
        if isinstance(data, dict):
            assert all(key.startswith('mps_') for key in data), '%s: role variables other than mps_*' % where
            plays = role_play(name)
        elif isinstance(data, list) and all('hosts' in item for item in data):
            # as written, given the simulated host's NVML (a real host has its driver's)
            plays = [dict(play, environment='{{ sim_env }}') for play in yaml.safe_load(under(host['base'], text))]
        else:
            plays = tasks_play(name)
        first = run(host['work'], 'play-%d.yml' % line, plays)
        assert first[2:] == [0, 0], '%s: unreachable or failed: %s' % (where, first)
        again = run(host['work'], 'play-%d.yml' % line, plays)
        assert again[1:] == [0, 0, 0], '%s: a second run changed something: %s' % (where, again)
        if int(str(step)) in CHECKS:
            resource, percentage = CHECKS[int(str(step))]
            assert ask(host, resource, 'get_default_active_thread_percentage') == percentage, where
