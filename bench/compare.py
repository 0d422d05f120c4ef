# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The no-op of this tree against an earlier commit's, measured in the same run: alternated old, new, old, new.

A shared machine's speed drifts by more than most changes cost, so a number measured yesterday says little about a
change made today. This builds the collection of ``--baseline`` (a commit of this repository) and of the working tree
(tracked files and new ones git does not ignore), then runs ``fleetbench.py`` on each in turn, ``--pairs`` times per
fleet size, each run in a PID namespace of its own (``hacking/own-host.py``). The simulated host, the playbooks and
the timing are this tree's for both: only the collection differs.

It reports, per fleet size, the median over the pairs of each run's median CPU per host of the role's no-op (b), its one
``mps_host`` task alone (h) and one ``ping`` (e), and new/old of each; and the same against each run's own ping
(b/e, h/e), which the machine's drift between two slots moves less. A report, never a pass/fail on time: ``make
bench-quick`` prints it in every run. Exits non-zero only when a run fails (a no-op that changes something, a broken
playbook) - or 0 with a line saying why nothing was compared when the baseline is not in this clone (a shallow one).

usage: compare.py --baseline COMMIT --out DIR [--hosts 4,16] [--pairs 3] [--reps 3] [--json FILE] [--sim-base DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import typing as t

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = ('b', 'h', 'e')


def _git(*args: str, cwd: str = REPO) -> str:
    return subprocess.run(['git', *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def build_trees(baseline: str, work: str) -> t.Dict[str, t.Tuple[str, str]]:
    """{'old': (label, collections path), 'new': ...}: the baseline's tree from a detached worktree, the working tree's."""
    trees = {}
    source = os.path.join(work, 'src-old')
    subprocess.run(['git', 'worktree', 'add', '--detach', '--force', source, baseline], cwd=REPO, check=True,
                   capture_output=True)
    try:
        subprocess.run([os.path.join(source, 'hacking', 'collection-tree.sh'), os.path.join(work, 'old')], cwd=source,
                       check=True, capture_output=True)
    finally:
        subprocess.run(['git', 'worktree', 'remove', '--force', source], cwd=REPO, check=False, capture_output=True)
    trees['old'] = (_git('rev-parse', '--short', baseline), os.path.join(work, 'old'))
    subprocess.run([os.path.join(REPO, 'hacking', 'collection-tree.sh'), os.path.join(work, 'new')], cwd=REPO, check=True,
                   capture_output=True)
    dirty = _git('status', '--porcelain', '--untracked-files=no')
    trees['new'] = (_git('rev-parse', '--short', 'HEAD') + ('+changes' if dirty else ''), os.path.join(work, 'new'))
    return trees


def run_one(tree: str, hosts: int, reps: int, out: str, sim_base: str, lib: str) -> t.Dict[str, t.Any]:
    """One fleetbench run of variants b, h, e on ``tree``: its fleet entry (results.json), or an exception."""
    command = [sys.executable, os.path.join(REPO, 'hacking', 'own-host.py'), '--', sys.executable,
               os.path.join(REPO, 'bench', 'fleetbench.py'), '--hosts', str(hosts), '--reps', str(reps),
               '--variants', ','.join(VARIANTS), '--module-reps', '0', '--collections-path', tree, '--sim-base', sim_base,
               '--lib', lib, '--out', out]
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=tree)
    with open(os.path.join(out + '.log'), 'w', encoding='utf-8') as log:
        done = subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    results = os.path.join(out, 'results.json')
    if not os.path.exists(results):
        raise RuntimeError('fleetbench on %s (N=%d) wrote no results (exit %d): see %s.log' % (tree, hosts, done.returncode, out))
    with open(results, encoding='utf-8') as handle:
        fleet = json.load(handle)['fleet']
    entry = next(item for item in fleet if item['hosts'] == hosts)
    if entry['variants']['b']['changed_per_host'] != 0:
        raise RuntimeError('the no-op changed something on %s (N=%d): see %s.log' % (tree, hosts, out))
    return entry


def summarise(runs: t.List[t.Dict[str, t.Any]]) -> t.Dict[int, t.Dict[str, t.Any]]:
    """Per fleet size: the median over the runs of each tree's CPU per host of b, h, e and of b/e, h/e; new/old."""
    table: t.Dict[int, t.Dict[str, t.Any]] = {}
    for hosts in sorted({run['hosts'] for run in runs}):
        row: t.Dict[str, t.Any] = {}
        for side in ('old', 'new'):
            mine = [run for run in runs if run['hosts'] == hosts and run['tree'] == side]
            cpu = {v: statistics.median(run['fleet']['variants'][v]['cpu_per_host_s'] for run in mine) for v in VARIANTS}
            cpu['b/e'] = statistics.median(run['fleet']['cpu_ratios']['b/e'] for run in mine)
            cpu['h/e'] = statistics.median(run['fleet']['cpu_ratios']['h/e'] for run in mine)
            cpu['b/h'] = statistics.median(run['fleet']['cpu_ratios']['b/h'] for run in mine)
            row[side] = cpu
        row['new/old'] = {key: row['new'][key] / row['old'][key] for key in row['new']}
        table[hosts] = row
    return table


def report(table: t.Dict[int, t.Dict[str, t.Any]], trees: t.Mapping[str, t.Tuple[str, str]], pairs: int) -> str:
    lines = ['no-op CPU per host, %s (old) against %s (new), %d alternated pair(s) per N, medians:' % (
        trees['old'][0], trees['new'][0], pairs),
        '  N   tree     b (role)  h (task)  e (ping)   b/e    h/e    b/h']
    for hosts, row in table.items():
        for side in ('old', 'new'):
            cpu = row[side]
            lines.append('  %-3d %-8s %7.3fs  %7.3fs  %7.3fs  %5.2f  %5.2f  %5.2f' % (
                hosts, side, cpu['b'], cpu['h'], cpu['e'], cpu['b/e'], cpu['h/e'], cpu['b/h']))
        ratio = row['new/old']
        lines.append('  %-3d new/old  %7.2f   %7.2f   %7.2f    %5.2f  %5.2f  %5.2f' % (
            hosts, ratio['b'], ratio['h'], ratio['e'], ratio['b/e'], ratio['h/e'], ratio['b/h']))
    lines.append('(e is the same ping in both trees: its new/old is the machine\'s drift between slots; b/e and h/e new/old '
                 'discount it)')
    return '\n'.join(lines)


def main(argv: t.Optional[t.List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n', maxsplit=1)[0])
    parser.add_argument('--baseline', required=True, help='the earlier commit to measure against (any git revision)')
    parser.add_argument('--out', required=True, help='directory for the runs (created)')
    parser.add_argument('--hosts', default='4', help='fleet size(s), comma separated (default 4)')
    parser.add_argument('--pairs', type=int, default=3, help='old/new pairs per fleet size (default 3)')
    parser.add_argument('--reps', type=int, default=3, help='repetitions inside each fleetbench run (default 3)')
    parser.add_argument('--lib', default=os.path.join(REPO, '.simhost', 'lib'), help='the built fake libnvidia-ml.so.1')
    parser.add_argument('--json', help='also write the runs and the table here')
    parser.add_argument('--sim-base', help='where fleetbench lays out its simulated hosts (default: under --out; unix socket '
                                           'paths under it must stay short, so make bench-quick gives its TEST_ROOT)')
    args = parser.parse_args(argv)
    try:
        _git('cat-file', '-e', args.baseline + '^{commit}')
    except subprocess.CalledProcessError:
        print('compare.py: %s is not in this clone (shallow?): nothing compared' % args.baseline)
        return 0
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix='compare-', dir=args.out)
    sim_base = args.sim_base or os.path.join(work, 'sim')
    os.makedirs(sim_base, exist_ok=True)
    started = time.monotonic()
    try:
        trees = build_trees(args.baseline, work)
        runs = []
        for hosts in [int(item) for item in args.hosts.split(',')]:
            for pair in range(1, args.pairs + 1):
                for side in ('old', 'new'):
                    out = os.path.join(work, '%s-n%d-p%d' % (side, hosts, pair))
                    fleet = run_one(trees[side][1], hosts, args.reps, out, sim_base, args.lib)
                    runs.append({'tree': side, 'commit': trees[side][0], 'hosts': hosts, 'pair': pair, 'fleet': fleet})
        table = summarise(runs)
        print(report(table, trees, args.pairs))
        print('(%.1f min; runs in %s)' % ((time.monotonic() - started) / 60, work))
        if args.json:
            with open(args.json, 'w', encoding='utf-8') as handle:
                json.dump({'what': 'compare.py --baseline %s --hosts %s --pairs %d --reps %d' % (
                    args.baseline, args.hosts, args.pairs, args.reps), 'trees': {side: tree[0] for side, tree in trees.items()},
                    'table': {str(hosts): row for hosts, row in table.items()}, 'runs': runs}, handle, indent=1, sort_keys=True)
        return 0
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        print('compare.py: %s' % exc, file=sys.stderr)
        return 1
    finally:
        for side in ('old', 'new'):
            shutil.rmtree(os.path.join(work, side), ignore_errors=True)


if __name__ == '__main__':
    sys.exit(main())
