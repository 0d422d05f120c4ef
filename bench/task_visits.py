# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What one task visit costs per host, by kind of task: the price of every task a role adds to its one module task.

A play of N inventory hosts (local connection, no facts) runs one ``ping`` per host (the floor), then the same play
with K more tasks of one kind per host, in alternation, ``--reps`` times. The CPU time of the whole process tree of
``ansible-playbook`` (controller, its worker processes, the modules; ``os.wait4``) of the K-task play less that of the
floor, divided by N*K, is the CPU one visit of that kind costs per host. Kinds, each as the fleet role would have it:

  skipped_include  an ``include_tasks`` whose ``when`` is false (the role's interpreter include on a no-op)
  assert           an ``assert`` of a filter over a host variable (the role's old pre-flight task)
  argspec          ``validate_argument_spec`` with a 40-option spec of role variables (what a role's
                   ``meta/argument_specs.yml`` prepends to its tasks)
  end_role         a ``meta: end_role`` whose ``when`` is false (ansible-core >= 2.18; no worker process, but a task
                   banner per host)
  args_plain       a ``set_fact`` of 45 literal values
  args_templated   the same 45 as the fleet role passes its variables to its task: each ``"{{ mps_... }}"``, 12 of
                   them through ``| bool`` - less args_plain, what templating a role's arguments costs per host

A report, never a pass/fail on time (a shared machine's speed drifts): medians over the repetitions. Needs only
ansible-core, no collection and no simulated host.

usage: task_visits.py --out DIR [--hosts 16] [--tasks 8] [--reps 3] [--kinds skipped_include,assert,argspec,end_role]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import typing as t

KINDS = ('skipped_include', 'assert', 'argspec', 'end_role', 'args_plain', 'args_templated')
ARGS = 45  # the fleet role's mps_host task passes 45 arguments
BOOLS = 12  # of which 12 through the bool filter
OPTIONS = 40


def _task(kind: str, number: int) -> t.List[str]:
    """The lines of one task of ``kind``, unindented."""
    if kind == 'skipped_include':
        return ['- name: Include %d, skipped' % number, '  ansible.builtin.include_tasks: nothing.yml',
                '  when: never_true | default(false)']
    if kind == 'assert':
        return ['- name: Assert %d' % number, '  ansible.builtin.assert:', '    that: items_var | map("int") | list | length >= 0',
                '    quiet: true']
    if kind == 'argspec':
        return ['- name: Argument spec %d' % number, '  ansible.builtin.validate_argument_spec:', '    argument_spec: "{{ spec }}"']
    if kind == 'end_role':
        return ['- name: End role %d, not taken' % number, '  ansible.builtin.meta: end_role', '  when: never_true | default(false)']
    if kind in ('args_plain', 'args_templated'):
        lines = ['- name: %s %d' % (kind, number), '  ansible.builtin.set_fact:']
        for arg in range(ARGS):
            if kind == 'args_plain':
                value = "'value %d'" % arg
            elif arg < BOOLS:
                value = '"{{ mps_var_%02d | bool }}"' % arg
            else:
                value = '"{{ mps_var_%02d }}"' % arg
            lines.append('    arg_%02d_%d: %s' % (arg, number, value))
        return lines
    raise ValueError('unknown kind %r; the kinds are %s' % (kind, ', '.join(KINDS)))


def _tasks(kind: str, count: int, indent: str) -> str:
    return ''.join(''.join('%s%s\n' % (indent, line) for line in _task(kind, number)) for number in range(count))


def write_files(out: str, hosts: int, tasks: int, kinds: t.Sequence[str]) -> t.Dict[str, str]:
    """The inventory, the floor play and one play per kind; returns {name: playbook path}."""
    os.makedirs(out, exist_ok=True)
    spec = {'opt_%02d' % n: {'type': 'str', 'default': 'value %d' % n, 'description': ['Option %d of a role.' % n] * 3}
            for n in range(OPTIONS)}
    inventory = {'all': {'vars': {'ansible_connection': 'local', 'ansible_python_interpreter': sys.executable,
                                  'items_var': list(range(8)), 'spec': spec,
                                  **{'mps_var_%02d' % n: (n % 2 == 0) if n < BOOLS else 'value %d' % n for n in range(ARGS)}},
                         'hosts': {'h%03d' % n: {} for n in range(hosts)}}}
    with open(os.path.join(out, 'inventory.json'), 'w', encoding='utf-8') as handle:
        json.dump(inventory, handle)
    with open(os.path.join(out, 'nothing.yml'), 'w', encoding='utf-8') as handle:
        handle.write('---\n- name: Never reached\n  ansible.builtin.ping:\n')
    with open(os.path.join(out, 'ansible.cfg'), 'w', encoding='utf-8') as handle:
        handle.write('[defaults]\nforks = 5\nhost_key_checking = False\nretry_files_enabled = False\n')
    plays = {}
    for name in ('floor',) + tuple(kinds):
        tasks_text = '' if name == 'floor' else _tasks(name, tasks, '    ')
        roles = ''
        if name == 'end_role':
            # meta: end_role is refused outside a role: its K tasks are a role of this directory, run before the ping
            role = os.path.join(out, 'roles', 'visits', 'tasks')
            os.makedirs(role, exist_ok=True)
            with open(os.path.join(role, 'main.yml'), 'w', encoding='utf-8') as handle:
                handle.write('---\n' + _tasks(name, tasks, ''))
            tasks_text, roles = '', '  roles: [visits]\n'
        path = os.path.join(out, '%s.yml' % name)
        with open(path, 'w', encoding='utf-8') as handle:
            handle.write('---\n- name: %s\n  hosts: all\n  gather_facts: false\n%s  tasks:\n'
                         '    - name: Ping\n      ansible.builtin.ping:\n%s' % (name, roles, tasks_text))
        plays[name] = path
    return plays


def run_play(playbook: str, out: str, ansible_playbook: str) -> float:
    """CPU seconds of the whole process tree of one ansible-playbook run (raises on a failed run)."""
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(out, 'ansible.cfg'), ANSIBLE_ROLES_PATH=os.path.join(out, 'roles'))
    with open(playbook + '.log', 'w', encoding='utf-8') as log:
        proc = subprocess.Popen([ansible_playbook, '-i', os.path.join(out, 'inventory.json'), playbook], cwd=out, env=env,
                                stdout=log, stderr=subprocess.STDOUT)
        _pid, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError('%s failed: see %s.log' % (playbook, playbook))
    return usage.ru_utime + usage.ru_stime


def measure(plays: t.Mapping[str, str], out: str, hosts: int, tasks: int, reps: int,
            ansible_playbook: str) -> t.Dict[str, t.Dict[str, float]]:
    """Per kind: the median CPU per host of the floor and of its play, and per visit per host (play - floor) / (N*K)."""
    cpu: t.Dict[str, t.List[float]] = {name: [] for name in plays}
    kinds = [name for name in plays if name != 'floor']
    for rep in range(reps):
        for kind in kinds[rep % len(kinds):] + kinds[:rep % len(kinds)]:
            cpu['floor'].append(run_play(plays['floor'], out, ansible_playbook))
            cpu[kind].append(run_play(plays[kind], out, ansible_playbook))
    floor = statistics.median(cpu['floor'])
    return {kind: {'floor_per_host_s': floor / hosts, 'play_per_host_s': statistics.median(cpu[kind]) / hosts,
                   'per_visit_per_host_s': (statistics.median(cpu[kind]) - floor) / (hosts * tasks)} for kind in kinds}


def report(table: t.Mapping[str, t.Mapping[str, float]], hosts: int, tasks: int, reps: int) -> str:
    lines = ['CPU per host of one task visit, N=%d hosts, K=%d tasks of each kind, medians of %d run(s):' % (hosts, tasks, reps),
             '  kind              visit/host   play/host  floor/host (one ping)']
    for kind, row in table.items():
        lines.append('  %-16s %8.1f ms  %8.3f s  %8.3f s' % (
            kind, row['per_visit_per_host_s'] * 1000, row['play_per_host_s'], row['floor_per_host_s']))
    return '\n'.join(lines)


def main(argv: t.Optional[t.List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n', maxsplit=1)[0])
    parser.add_argument('--out', required=True, help='directory for the playbooks and their logs (created)')
    parser.add_argument('--hosts', type=int, default=16, help='inventory hosts (default 16)')
    parser.add_argument('--tasks', type=int, default=8, help='tasks of each kind per play (default 8)')
    parser.add_argument('--reps', type=int, default=3, help='runs of each play (default 3; medians)')
    parser.add_argument('--kinds', default=','.join(KINDS), help='which kinds (default all: %s)' % ','.join(KINDS))
    parser.add_argument('--json', help='also write the table here')
    args = parser.parse_args(argv)
    kinds = [kind for kind in args.kinds.split(',') if kind]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or args.hosts < 1 or args.tasks < 1 or args.reps < 1:
        parser.error('--kinds takes %s; --hosts, --tasks and --reps at least 1' % ', '.join(KINDS))
    ansible_playbook = os.path.join(os.path.dirname(sys.executable), 'ansible-playbook')
    if not os.access(ansible_playbook, os.X_OK):
        ansible_playbook = shutil.which('ansible-playbook') or parser.error('ansible-playbook not found')
    started = time.monotonic()
    try:
        plays = write_files(args.out, args.hosts, args.tasks, kinds)
        table = measure(plays, args.out, args.hosts, args.tasks, args.reps, ansible_playbook)
    except RuntimeError as exc:
        print('task_visits.py: %s' % exc, file=sys.stderr)
        return 1
    print(report(table, args.hosts, args.tasks, args.reps))
    print('(%.1f min; playbooks and logs in %s)' % ((time.monotonic() - started) / 60, args.out))
    if args.json:
        with open(args.json, 'w', encoding='utf-8') as handle:
            json.dump({'what': 'task_visits.py --hosts %d --tasks %d --reps %d --kinds %s' % (
                args.hosts, args.tasks, args.reps, ','.join(kinds)), 'table': table}, handle, indent=1, sort_keys=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
