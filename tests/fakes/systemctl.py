# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A stand-in ``systemctl`` for unit tests of ``supervisor=systemd`` without systemd as PID 1.

It runs the collection's own unit files, not a copy of their logic: ``start`` reads the instance's unit (the template
in ``$FAKE_SYSTEMD_UNIT_DIR``, its drop-ins), its ``EnvironmentFile=`` lines, then runs ``ExecStartPre=``, ``ExecStart=``
and ``ExecStartPost=`` as systemd does for this subset (systemd.service(5), systemd.exec(5)): ``$$`` is a literal ``$``,
``${NAME}`` is expanded from the environment, ``%i``/``%I`` are the instance, a leading ``-`` ignores a failure, the
last ``ExecStart=`` of a drop-in wins after an empty one resets it. ``Type=forking`` is the unit's: the main pid comes
from ``PIDFile=``. ``BindPaths=SRC:/dev/shm`` runs the daemon in a mount namespace of its own with SRC bound on
/dev/shm (``unshare``, root only). ``stop`` runs ``ExecStop=`` and ``ExecStopPost=`` and then ends what is left of the
main process. ``enable``/``disable``, ``is-active``/``is-enabled`` and ``show --property=ActiveState,UnitFileState`` keep
and report their state in ``$FAKE_SYSTEMD_DIR``; a unit that is not an instance (the health timer) is only recorded
active or not; ``daemon-reload`` is recorded. Every call is appended to
``$FAKE_SYSTEMD_DIR/calls``. Real systemd is exercised by the molecule scenario under systemd-nspawn.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

STATE = os.environ.get('FAKE_SYSTEMD_DIR', '/tmp/fake-systemd')
UNIT_DIR = os.environ.get('FAKE_SYSTEMD_UNIT_DIR', '/etc/systemd/system')


def _state() -> dict:
    try:
        with open(os.path.join(STATE, 'state.json'), encoding='utf-8') as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {'enabled': [], 'active': {}}


def _save(state: dict) -> None:
    os.makedirs(STATE, exist_ok=True)
    with open(os.path.join(STATE, 'state.json.tmp'), 'w', encoding='utf-8') as handle:
        json.dump(state, handle)
    os.replace(os.path.join(STATE, 'state.json.tmp'), os.path.join(STATE, 'state.json'))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        with open('/proc/%d/stat' % pid, encoding='ascii') as handle:
            return handle.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except (OSError, IndexError):
        return False


def _unescape(instance: str) -> str:
    return re.sub(r'\\x([0-9a-f]{2})', lambda match: chr(int(match.group(1), 16)), instance.replace('-', '/'))


def _unit_settings(unit: str) -> dict:
    """The [Service]/[Unit] settings of an instance: the template, then its drop-ins in name order."""
    template = '%s@.%s' % (unit.split('@', 1)[0], unit.rsplit('.', 1)[1])
    files = [os.path.join(UNIT_DIR, template)]
    dropins = os.path.join(UNIT_DIR, unit + '.d')
    if os.path.isdir(dropins):
        files += [os.path.join(dropins, name) for name in sorted(os.listdir(dropins)) if name.endswith('.conf')]
    settings: dict = {}
    for path in files:
        with open(path, encoding='utf-8') as handle:
            for line in handle:
                line = line.strip()
                if not line or line.startswith(('#', '[')) or '=' not in line:
                    continue
                key, value = line.split('=', 1)
                if value == '' and key.startswith('Exec'):
                    settings[key] = []  # an empty assignment resets the list
                else:
                    settings.setdefault(key, []).append(value)
    return settings


def _environment(settings: dict, instance: str) -> dict:
    env = {'PATH': os.environ.get('PATH', '/usr/bin:/bin')}
    if os.environ.get('LD_LIBRARY_PATH'):
        env['LD_LIBRARY_PATH'] = os.environ['LD_LIBRARY_PATH']
    for value in settings.get('EnvironmentFile', []):
        optional = value.startswith('-')
        path = value.lstrip('-').replace('%i', instance)
        if not os.path.exists(path):
            if optional:
                continue
            raise SystemExit('fake systemctl: %s: EnvironmentFile %s is missing' % (instance, path))
        with open(path, encoding='utf-8') as handle:
            for line in handle:
                line = line.rstrip('\n')
                if line and not line.startswith('#') and '=' in line:
                    key, val = line.split('=', 1)
                    env[key] = val
    return env


def _argv(command: str, env: dict, instance: str) -> tuple:
    ignore = command.startswith('-')
    command = command.lstrip('-').replace('%i', instance).replace('%I', _unescape(instance)).replace('%%', '%')
    argv = []
    for word in shlex.split(command.replace('$$', '\0')):
        word = re.sub(r'\$\{(\w+)\}', lambda match: env.get(match.group(1), ''), word)
        argv.append(word.replace('\0', '$'))
    return argv, ignore


def _run(settings: dict, key: str, env: dict, instance: str, prefix: tuple = ()) -> None:
    for command in settings.get(key, []):
        argv, ignore = _argv(command, env, instance)
        proc = subprocess.run(list(prefix) + argv, env=env, capture_output=True, text=True, check=False)
        with open(os.path.join(STATE, 'journal-%s' % instance), 'a', encoding='utf-8') as handle:
            handle.write(proc.stdout + proc.stderr)
        if proc.returncode != 0 and not ignore:
            raise SystemExit('Job for gpufleet-mps@%s.service failed because the control process exited with error code.\n%s'
                             % (instance, (proc.stderr or proc.stdout).strip()))


def _bind_prefix(settings: dict) -> tuple:
    for value in settings.get('BindPaths', []):
        source, _sep, target = value.partition(':')
        if target == '/dev/shm':
            return ('unshare', '--mount', '--propagation', 'slave', '--', '/bin/sh', '-c',
                    'mount --bind "$0" /dev/shm && exec "$@"', source)
    return ()


def _main_pid(settings: dict, env: dict, instance: str) -> int:
    for value in settings.get('PIDFile', []):
        path = _argv(value, env, instance)[0][0]
        for _attempt in range(100):
            try:
                with open(path, encoding='ascii') as handle:
                    return int(handle.read().strip())
            except (OSError, ValueError):
                time.sleep(0.05)
    return 0


def start(unit: str) -> None:
    state = _state()
    if _active(state, unit):
        return
    if '@' not in unit:  # the health timer: recorded active, its service never run (tests run the script themselves)
        state['active'][unit] = 0
        _save(state)
        return
    instance = unit.split('@', 1)[1].rsplit('.', 1)[0]
    settings = _unit_settings(unit)
    env = _environment(settings, instance)
    _run(settings, 'ExecStartPre', env, instance)
    _run(settings, 'ExecStart', env, instance, _bind_prefix(settings))
    pid = _main_pid(settings, env, instance)
    state['active'][unit] = pid
    _save(state)
    try:
        _run(settings, 'ExecStartPost', env, instance)
    except SystemExit:
        stop(unit)
        raise


def stop(unit: str) -> None:
    state = _state()
    pid = state['active'].pop(unit, None)
    _save(state)
    if pid is None or '@' not in unit:
        return
    instance = unit.split('@', 1)[1].rsplit('.', 1)[0]
    settings = _unit_settings(unit)
    env = _environment(settings, instance)
    if _alive(pid):
        _run(settings, 'ExecStop', env, instance)
        for _attempt in range(200):
            if not _alive(pid):
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
    _run(settings, 'ExecStopPost', env, instance)


def _active(state: dict, unit: str) -> bool:
    pid = state['active'].get(unit)
    return pid is not None and (pid == 0 or _alive(pid))


def main(argv: list) -> int:
    os.makedirs(STATE, exist_ok=True)
    with open(os.path.join(STATE, 'calls'), 'a', encoding='utf-8') as handle:
        handle.write(' '.join(argv) + '\n')
    args = [arg for arg in argv if not arg.startswith('--') or arg.startswith('--property')]
    verb, units = args[0], [arg for arg in args[1:] if not arg.startswith('--')]
    state = _state()
    if verb == 'show' and '--property=MainPID' in argv:
        sys.stdout.write('%s\n' % (state['active'].get(units[0]) or 0))
        return 0
    if verb == 'show':
        blocks = []
        for unit in units:
            active = 'active' if _active(state, unit) else 'inactive'
            blocks.append('ActiveState=%s\nUnitFileState=%s\n' % (active, 'enabled' if unit in state['enabled'] else 'disabled'))
        sys.stdout.write('\n'.join(blocks))
        return 0
    if verb == 'is-active':
        return 0 if _active(state, units[0]) else 3
    if verb == 'is-enabled':
        return 0 if units[0] in state['enabled'] else 1
    if verb in ('enable', 'disable'):
        state['enabled'] = sorted(set(state['enabled']) | set(units)) if verb == 'enable' else [
            unit for unit in state['enabled'] if unit not in units]
        _save(state)
        return 0
    if verb == 'daemon-reload':
        return 0
    for unit in units:
        if verb in ('stop', 'restart'):
            stop(unit)
        if verb in ('start', 'restart'):
            start(unit)
    if verb not in ('start', 'stop', 'restart'):
        sys.stderr.write('fake systemctl: %s is not simulated\n' % verb)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
