# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet role as AWX / Automation Platform runs it: ``ansible-runner run`` on a private data dir.

Lays out WORK/ the way AWX hands a job to ansible-runner - ``project/`` (tests/runner/project),
``inventory/`` (tests/runner/inventory: four simulated GPU hosts on this machine), ``env/envvars``,
``env/extravars``, ``env/cmdline`` and ``env/settings`` - with each host's simulated GPU host under
WORK/sims/<host>, then runs these jobs and checks their artifacts (``artifacts/<ident>/``: ``rc``,
``status``, ``stdout``, ``command``, ``job_events/*.json``):

  converge   site.yml: successful, a runner_on_ok per host, every host changed
  again      site.yml again: successful, a runner_on_ok per host, the play recap changed=0
  preview    site.yml with a new replica count for the fleet, --check --diff (a Check job with Show
             Changes): successful, every host would change and shows a diff, no file changes
  roll-bad   roll.yml (serial 2, max_fail_percentage 0) with a new replica count for the fleet and
             an invalid value in one batch-1 host's host_vars: failed, the bad host alone, with none of
             its files changed; the roll ends with batch 1 - batch 2 gets no event and not one of its
             files changes (the other host of batch 1 runs the same task beside the bad one)
  roll       roll.yml with the host_vars fixed: successful, two batches in inventory order, every host
             changed (but one that roll-bad changed already: changed=0), and a client of each daemon gets
             the new limits
  roll-busy  roll.yml (mps_busy: wait) with multi-user servers for the fleet - a restart of every daemon -
             while a client holds BUSY_HOST's daemon for a few seconds: successful, BUSY_HOST's restart
             waited for that client, which left by itself (not ended), and every daemon was restarted
  teardown   site.yml with mps_state=absent (always, also after a failure): successful

Finally no simulated MPS process of this run may be left (found by this checkout's simulator path
in the command line and WORK in the environment); any that is left is killed and fails the test.

usage: python hacking/test-runner.py --work DIR --simhost-lib DIR --python PYTHON
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = os.path.join(REPO, 'tests', 'runner')
SIMULATOR = os.path.join(REPO, 'tests', 'fakes', 'mps') + os.sep
# inventory host -> GPU set of its simulated host (tests/fakes/nvml/configs), in inventory order
HOSTS = {'h100': 'h100x4.ini', 'a100': 'a100x8.ini', 't4': 't4x4.ini', 'v100': 'v100x2.ini'}
BATCHES = [['h100', 'a100'], ['t4', 'v100']]
BAD_HOST = 'a100'
# ansible-runner of this interpreter's environment (it runs the ansible-playbook found on PATH)
RUNNER = shutil.which('ansible-runner', path=os.path.dirname(sys.executable)) or 'ansible-runner'
# The roll gives every host this many clients per GPU: 100 / 2 = 50 % of the threads each.
ROLL_REPLICAS = 2
# The host of batch 1 whose daemon a job holds while the busy roll restarts it, and for how long.
BUSY_HOST = 'h100'
BUSY_SECONDS = 12


class CheckFailed(Exception):
    """A job or its artifacts are not what AWX would need to see."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


class Job:
    """One finished ``ansible-runner run``: its artifacts, read back."""

    def __init__(self, work: str, ident: str, seconds: float) -> None:
        self.ident = ident
        self.seconds = seconds
        self.dir = os.path.join(work, 'artifacts', ident)
        for name in ('rc', 'status', 'stdout', 'command', 'job_events'):
            check(os.path.exists(os.path.join(self.dir, name)), f'{ident}: artifacts/{ident}/{name} is missing')
        with open(os.path.join(self.dir, 'rc'), encoding='utf-8') as handle:
            self.rc = int(handle.read().strip())
        with open(os.path.join(self.dir, 'status'), encoding='utf-8') as handle:
            self.status = handle.read().strip()
        paths = glob.glob(os.path.join(self.dir, 'job_events', '*.json'))
        self.events = []
        for path in paths:
            with open(path, encoding='utf-8') as handle:
                self.events.append(json.load(handle))
        self.events.sort(key=lambda event: event['counter'])
        check(bool(self.events), f'{ident}: no job events')
        check(all(event.get('runner_ident') == ident for event in self.events),
              f'{ident}: events of another job in artifacts/{ident}/job_events')
        stats = self.of('playbook_on_stats')
        check(len(stats) == 1, f'{ident}: {len(stats)} playbook_on_stats events, expected 1')
        self.stats = stats[0]['event_data']

    def of(self, kind: str, host: str | None = None) -> list[dict]:
        return [event for event in self.events
                if event['event'] == kind and (host is None or event['event_data'].get('host') == host)]

    def host_events(self, host: str) -> list[dict]:
        return [event for event in self.events
                if event['event'].startswith('runner_') and event['event_data'].get('host') == host]

    def expect_successful(self) -> None:
        check(self.status == 'successful' and self.rc == 0,
              f'{self.ident}: status {self.status!r}, rc {self.rc} (see {self.dir}/stdout)')
        check(not self.stats['failures'] and not self.stats['dark'],
              f'{self.ident}: failures {self.stats["failures"]}, unreachable {self.stats["dark"]}')
        for host in HOSTS:
            check(bool(self.of('runner_on_ok', host)), f'{self.ident}: no runner_on_ok for {host}')
            check(host in self.stats['processed'], f'{self.ident}: {host} is not in the play recap')
        with open(os.path.join(self.dir, 'stdout'), encoding='utf-8') as handle:
            check('PLAY RECAP' in handle.read(), f'{self.ident}: artifacts/{self.ident}/stdout holds no play recap')


def runner(work: str, playbook: str, ident: str) -> Job:
    """Run one job the way AWX does: ansible-runner on the private data dir, artifacts under it."""
    started = time.monotonic()
    with open(os.path.join(work, f'{ident}.log'), 'w', encoding='utf-8') as log:
        subprocess.run([RUNNER, 'run', work, '-p', playbook, '--ident', ident],
                       stdout=log, stderr=subprocess.STDOUT, check=False)
    job = Job(work, ident, time.monotonic() - started)
    print(f'test-runner: {ident}: {job.status} (rc {job.rc}) in {job.seconds:.1f}s, {len(job.events)} events')
    return job


def write_json(path: str, data: dict | list) -> None:
    # ansible-runner reads env/* as YAML, of which JSON is a subset.
    with open(path, 'w', encoding='utf-8') as handle:
        json.dump(data, handle, indent=2)
        handle.write('\n')


def lay_out(work: str, simhost_lib: str, python: str) -> None:
    shutil.copytree(os.path.join(SOURCES, 'project'), os.path.join(work, 'project'))
    shutil.copytree(os.path.join(SOURCES, 'inventory'), os.path.join(work, 'inventory'))
    os.makedirs(os.path.join(work, 'env'))
    # What an execution environment sets: where the collection is installed. AWX adds its own
    # variables here (JOB_ID, INVENTORY_ID, ...); none of them matter to the role.
    write_json(os.path.join(work, 'env', 'envvars'), {
        'ANSIBLE_COLLECTIONS_PATH': os.environ['ANSIBLE_COLLECTIONS_PATH'],
        'ANSIBLE_NOCOLOR': '1',
    })
    set_extravars(work)
    set_cmdline(work)
    write_json(os.path.join(work, 'env', 'settings'), {'job_timeout': 600, 'idle_timeout': 300})
    for host, config in HOSTS.items():
        subprocess.run([os.path.join(REPO, 'tests', 'fakes', 'make-simhost.sh'),
                        os.path.join(work, 'sims', host, 'host'), simhost_lib, python,
                        os.path.join(REPO, 'tests', 'fakes', 'nvml', 'configs', config)],
                       check=True, stdout=subprocess.DEVNULL)


def set_cmdline(work: str, *options: str) -> None:
    """Options AWX puts on the ansible-playbook command line: the job template's forks, and --check
    --diff for a job of type Check with Show Changes on."""
    with open(os.path.join(work, 'env', 'cmdline'), 'w', encoding='utf-8') as handle:
        handle.write(' '.join(('--forks', '4') + options) + '\n')


def set_extravars(work: str, **extra: object) -> None:
    """The job's extra variables (the survey's answers in AWX)."""
    write_json(os.path.join(work, 'env', 'extravars'), {'sim_base': os.path.join(work, 'sims'), **extra})


def snapshot(work: str, host: str, *, skip_logs: bool) -> dict[str, str]:
    """Every regular file of a simulated host (its GPUs' state, root, config dir) by content."""
    files = {}
    top = os.path.join(work, 'sims', host)
    for directory, _dirs, names in os.walk(top):
        if skip_logs and f'{os.sep}log' in directory[len(top):]:
            continue
        for name in names:
            path = os.path.join(directory, name)
            if os.path.isfile(path) and not os.path.islink(path):
                with open(path, 'rb') as handle:
                    files[os.path.relpath(path, top)] = hashlib.sha256(handle.read()).hexdigest()
    return files


def hold_client(work: str, host: str, seconds: float) -> subprocess.Popen:
    """A client of the host's daemon that stays connected for ``seconds``, then leaves by itself."""
    proc = subprocess.Popen(  # pylint: disable=consider-using-with
        [os.path.join(work, 'sims', host, 'host', 'bin', 'mps-sim-client')], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        env={**os.environ, 'CUDA_MPS_PIPE_DIRECTORY': os.path.join(work, 'sims', host, 'root', 'nvidia.com', 'gpu', 'pipe')})
    first = json.loads(proc.stdout.readline() or '{}')
    check(first.get('ok') is True, f'{host}: the held client did not connect: {first}')
    threading.Timer(seconds, proc.stdin.close).start()
    return proc


def client_limits(work: str, host: str) -> dict:
    """What a CUDA client of the host's daemon is given (the simulator's client helper)."""
    result = subprocess.run(
        [os.path.join(work, 'sims', host, 'host', 'bin', 'mps-sim-client'), '--once'],
        env={**os.environ, 'CUDA_MPS_PIPE_DIRECTORY': os.path.join(work, 'sims', host, 'root', 'nvidia.com', 'gpu', 'pipe')},
        capture_output=True, text=True, check=False, timeout=60)
    check(result.returncode == 0, f'{host}: the client helper failed: {result.stderr.strip()}')
    return json.loads(result.stdout)


def simulated_processes(work: str) -> list[int]:
    """Simulated MPS daemons, servers and clients of this run: this checkout's simulator in the
    command line and this run's directory in the environment (other checkouts' and other tests'
    simulated hosts run on the same machine)."""
    found = []
    for entry in os.listdir('/proc'):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f'/proc/{entry}/cmdline', 'rb') as handle:
                cmdline = handle.read().decode('utf-8', 'replace')
            if SIMULATOR not in cmdline:
                continue
            with open(f'/proc/{entry}/environ', 'rb') as handle:
                environ = handle.read().decode('utf-8', 'replace').split('\0')
        except OSError:
            continue  # gone, or not ours to read
        if any('=' in item and item.split('=', 1)[1].startswith(work + os.sep) for item in environ):
            found.append(int(entry))
    return found


def kill_left_over(work: str) -> list[int]:
    pids = simulated_processes(work)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def test_jobs(work: str) -> list[Job]:
    jobs = []

    converge = runner(work, 'site.yml', 'converge')
    jobs.append(converge)
    converge.expect_successful()
    for host in HOSTS:
        check(converge.stats['changed'].get(host, 0) > 0, f'converge: {host} was not changed on a fresh host')

    again = runner(work, 'site.yml', 'again')
    jobs.append(again)
    again.expect_successful()
    check(not again.stats['changed'], f'again: the second run changed {again.stats["changed"]} (recap changed=0 expected)')
    check(not any(event['event_data'].get('changed') for event in again.of('runner_on_ok')),
          'again: a runner_on_ok event of the second run says changed')

    # The preview of a change: check mode and diff say what each host would change, and change nothing.
    before = {host: snapshot(work, host, skip_logs=True) for host in HOSTS}
    set_extravars(work, fleet_replicas=ROLL_REPLICAS)
    set_cmdline(work, '--check', '--diff')
    preview = runner(work, 'site.yml', 'preview')
    jobs.append(preview)
    set_cmdline(work)
    preview.expect_successful()
    for host in HOSTS:
        check(preview.stats['changed'].get(host, 0) > 0, f'preview: {host} would not change with the new replica count')
        results = [event['event_data'].get('res', {}) for event in preview.of('runner_on_ok', host)]
        # a loop's diffs are in its items' results
        results += [item for res in results for item in res.get('results', [])]
        check(any(res.get('changed') and res.get('diff') for res in results),
              f'preview: no diff for {host} (Show Changes would show nothing)')
        check(snapshot(work, host, skip_logs=True) == before[host], f'preview: check mode changed files of {host}')

    # A roll whose batch 1 holds a host with a bad value: the bad host is refused with nothing of it changed, and nothing
    # of batch 2 is touched. The other host of batch 1 runs the role's one task beside it, so it may change.
    before = {host: snapshot(work, host, skip_logs=host in BATCHES[0]) for host in HOSTS}
    host_vars = os.path.join(work, 'inventory', 'host_vars')
    os.makedirs(host_vars)
    with open(os.path.join(host_vars, f'{BAD_HOST}.yml'), 'w', encoding='utf-8') as handle:
        handle.write('---\n# more clients than any GPU and driver take: refused before anything is touched\n'
                     'mps_resources:\n  - name: nvidia.com/gpu\n    replicas: 64\n')
    set_extravars(work, fleet_replicas=ROLL_REPLICAS)
    bad = runner(work, 'roll.yml', 'roll-bad')
    jobs.append(bad)
    check(bad.status == 'failed' and bad.rc != 0, f'roll-bad: status {bad.status!r}, rc {bad.rc}: the roll did not fail')
    check(bad.stats['failures'] == {BAD_HOST: 1}, f'roll-bad: failures {bad.stats["failures"]}, expected only {BAD_HOST}')
    check(len(bad.of('playbook_on_play_start')) == 1, 'roll-bad: a second batch was started')
    check(BAD_HOST not in bad.stats['changed'] and not set(bad.stats['changed']) & set(BATCHES[1]),
          f'roll-bad: hosts were changed: {bad.stats["changed"]}')
    for host in BATCHES[1]:
        check(not bad.host_events(host), f'roll-bad: {host} of batch 2 ran tasks after batch 1 failed')
        check(host not in bad.stats['processed'], f'roll-bad: {host} of batch 2 is in the play recap')
    for host in [BAD_HOST] + BATCHES[1]:
        check(snapshot(work, host, skip_logs=host in BATCHES[0]) == before[host],
              f'roll-bad: files of {host} changed although the roll failed')

    # The value fixed: the same roll goes through both batches, in order.
    os.unlink(os.path.join(host_vars, f'{BAD_HOST}.yml'))
    roll = runner(work, 'roll.yml', 'roll')
    jobs.append(roll)
    roll.expect_successful()
    check(len(roll.of('playbook_on_play_start')) == len(BATCHES),
          f'roll: {len(roll.of("playbook_on_play_start"))} batches, expected {len(BATCHES)}')
    last_of_batch1 = max(event['counter'] for host in BATCHES[0] for event in roll.host_events(host))
    first_of_batch2 = min(event['counter'] for host in BATCHES[1] for event in roll.host_events(host))
    check(last_of_batch1 < first_of_batch2, 'roll: batch 2 started before batch 1 had finished')
    for host in HOSTS:
        # a host that already took the change beside the bad one in roll-bad reports changed=0: the roll goes on from
        # where it stopped (docs/docsite/rst/guide_awx.rst)
        if bad.stats['changed'].get(host, 0):
            check(not roll.stats['changed'].get(host, 0), f'roll: {host} changed again although roll-bad had changed it')
        else:
            check(roll.stats['changed'].get(host, 0) > 0, f'roll: {host} was not changed by the new replica count')
        got = client_limits(work, host)
        check(got['active_thread_percentage'] == 100.0 / ROLL_REPLICAS,
              f'roll: a client on {host} got {got["active_thread_percentage"]}% of the threads, '
              f'expected {100.0 / ROLL_REPLICAS}%')

    # A change that restarts every daemon, rolled while a job holds one of them: that host's batch waits.
    set_extravars(work, fleet_replicas=ROLL_REPLICAS, fleet_multiuser=True)
    held = hold_client(work, BUSY_HOST, BUSY_SECONDS)
    try:
        busy = runner(work, 'roll.yml', 'roll-busy')
    finally:
        held.wait(timeout=60)  # its stdin is the timer's to close
        rest, errors = held.stdout.read(), held.stderr.read()
    jobs.append(busy)
    busy.expect_successful()
    check(held.returncode == 0 and not rest.strip(),
          f'roll-busy: the held client was ended (exit {held.returncode}): {rest.strip()} {errors.strip()}')
    waited = [action for event in busy.of('runner_on_ok', BUSY_HOST)
              for res in [event['event_data'].get('res', {})] + event['event_data'].get('res', {}).get('results', [])
              # mps_host names the resource first ("nvidia.com/gpu: wait up to ...")
              for action in res.get('actions', []) if action.startswith('wait up to') or ': wait up to' in action]
    check(len(waited) == 1 and '1 connected client' in waited[0],
          f'roll-busy: {BUSY_HOST} did not wait for its client: {waited}')
    check(busy.seconds >= BUSY_SECONDS - 1, f'roll-busy: the roll took {busy.seconds:.1f}s, less than the client held it')
    for host in HOSTS:
        check(busy.stats['changed'].get(host, 0) > 0, f'roll-busy: the daemon of {host} was not restarted')
    return jobs


GUIDE = os.path.join(REPO, 'docs', 'docsite', 'rst', 'guide_awx.rst')


def guide_blocks() -> dict[str, str]:
    """The blocks of the AWX guide marked ``.. runner: NAME`` (env files, the command), by name."""
    with open(GUIDE, encoding='utf-8') as handle:
        lines = handle.read().split('\n')
    found = {}
    for index, line in enumerate(lines):
        if not line.startswith('.. runner: '):
            continue
        start = next(i for i in range(index + 1, len(lines)) if lines[i].startswith('.. code-block::'))
        body = []
        for text in lines[start + 1:]:
            if text and not text.startswith('   '):
                break
            body.append(text[3:])
        found[line[len('.. runner: '):].strip()] = '\n'.join(body).strip() + '\n'
    return found


def check_guide(work: str) -> None:
    """The env files and the command line the AWX guide shows are those this test runs with (the collections
    path aside: the guide's is an EE's)."""
    shown = guide_blocks()
    check(set(shown) == {'env/envvars', 'env/cmdline', 'env/settings', 'command'}, f'{GUIDE}: runner blocks {sorted(shown)}')
    for name in ('env/envvars', 'env/settings'):
        with open(os.path.join(work, name), encoding='utf-8') as handle:
            used = json.load(handle)
        guide = json.loads(shown[name])
        if name == 'env/envvars':
            used = dict(used, ANSIBLE_COLLECTIONS_PATH=guide.get('ANSIBLE_COLLECTIONS_PATH'))
        check(guide == used, f'{GUIDE}: {name} shows {guide}, the jobs run with {used}')
    with open(os.path.join(work, 'env', 'cmdline'), encoding='utf-8') as handle:
        check(handle.read() == shown['env/cmdline'], f'{GUIDE}: env/cmdline differs from the jobs\' {work}/env/cmdline')
    command = shlex.split(shown['command'].strip().lstrip('$ '))
    check(len(command) == 7 and command[:2] == ['ansible-runner', 'run'] and command[3] == '-p' and command[5] == '--ident',
          f'{GUIDE}: the command {command} is not ansible-runner run DIR -p PLAYBOOK --ident IDENT, as the jobs here run')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
    parser.add_argument('--work', required=True, help='the private data dir (replaced)')
    parser.add_argument('--simhost-lib', required=True, help='directory of the built fake libnvidia-ml.so.1')
    parser.add_argument('--python', required=True, help='interpreter with nvidia-ml-py (.venv/bin/python)')
    args = parser.parse_args()
    work = os.path.abspath(args.work)
    if 'ANSIBLE_COLLECTIONS_PATH' not in os.environ:
        parser.error('ANSIBLE_COLLECTIONS_PATH must name the collection tree (make runner sets it)')

    stale = kill_left_over(work)
    if stale:
        print(f'test-runner: killed simulated MPS processes left by an earlier run: {stale}')
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    lay_out(work, os.path.abspath(args.simhost_lib), os.path.abspath(args.python))
    try:
        check_guide(work)
    except CheckFailed as exc:
        print(f'test-runner: FAILED: {exc}', file=sys.stderr)
        return 1

    started = time.monotonic()
    failure = None
    jobs: list[Job] = []
    try:
        jobs = test_jobs(work)
    except CheckFailed as exc:
        failure = str(exc)
    finally:
        if os.path.isdir(os.path.join(work, 'inventory', 'host_vars')):
            shutil.rmtree(os.path.join(work, 'inventory', 'host_vars'))
        set_extravars(work, mps_state='absent')
        try:
            teardown = runner(work, 'site.yml', 'teardown')
            teardown.expect_successful()
        except CheckFailed as exc:
            failure = failure or f'teardown: {exc}'
        left = kill_left_over(work)
        if left:
            failure = failure or f'simulated MPS processes left after the teardown (killed now): {left}'
        shutil.rmtree(os.path.join(work, 'sims'), ignore_errors=True)

    if failure:
        print(f'test-runner: FAILED: {failure}\n  job output: {work}/<ident>.log, artifacts: {work}/artifacts/',
              file=sys.stderr)
        return 1
    print(f'test-runner: {len(jobs) + 1} ansible-runner jobs passed in {time.monotonic() - started:.0f}s '
          f'(artifacts in {work}/artifacts); no simulated daemon left')
    return 0


if __name__ == '__main__':
    sys.exit(main())
