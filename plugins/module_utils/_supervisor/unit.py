# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``gpufleet-mps@.service`` template unit, its per-instance environment files, and systemctl.

The daemon is ``Type=forking`` (``-d`` returns once it listens) with its pid file named in a
per-instance drop-in, since the pipe directory is per resource. ``quit -t`` is synchronous: it returns
once the servers and clients are gone and the daemon exits. Its UI exit status is undocumented (a session
the daemon drops as it exits may end non-zero), so ``ExecStop=-`` keeps that status from marking the unit
failed; what is still running after it, systemd ends as for any service.

Every reply of the limit replay (``ExecStartPost=``) is checked, since the UI exits 0 even when the
daemon rejects a command: a percentage setter must echo the value, a memory setter print nothing, an SM partition's
creation print the partition; anything else fails the start with the daemon's own text in the journal.

The unit runs nothing of this collection: the compute mode is set with ``nvidia-smi``, the daemon is
``nvidia-cuda-mps-control -d``, the persisted limits are replayed by feeding their command file to the
control UI, so a host boots into a working MPS even when Python or the collection is broken.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import typing as t

from .._errors import InvalidParameterError, MpsError
from .._protocol.commands import QUIT
from .._resource.layout import ConfigPaths, ResourcePaths

UNIT_NAME = 'gpufleet-mps@.service'
# The first words of every file this collection writes for another program (a unit, a Slurm file): what says it is ours.
MANAGED_HEADER = 'Managed by the gpufleet.mps Ansible collection'
UNIT_DIR = '/etc/systemd/system'
SYSTEMCTL = 'systemctl'

# The limit replay after every start, its replies checked (a percentage setter echoes %.1f, a memory setter
# prints nothing; anything else is the daemon's refusal, sent to the journal). The percentage echoed must be the one
# sent: a real r580 daemon refuses a value by printing the one it keeps, with no error text. Braces doubled for format().
_REPLAY = (
    'if [ -s "$$MPS_LIMITS_FILE" ]; then '
    'out=$$("$$MPS_CONTROL" < "$$MPS_LIMITS_FILE") || {{ echo "gpufleet-mps: replaying $$MPS_LIMITS_FILE failed: $$out" >&2; exit 1; }}; '
    'bad=$$(echo "$$out" | grep -Ev "^([0-9]+[.][0-9]+|(Partition )?(GPU|MIG)-[^ ]+/[^ ]+( created)?)?$$"); '
    'if [ -n "$$bad" ]; then echo "gpufleet-mps: the daemon rejected a limit of $$MPS_LIMITS_FILE: $$bad" >&2; exit 1; fi; '
    'want=$$(sed -n "s/^set_default_active_thread_percentage[[:space:]]*//p" "$$MPS_LIMITS_FILE" | tail -n 1); '
    'got=$$(echo "$$out" | grep -E "^[0-9]+[.][0-9]+$$" | tail -n 1); '
    'if [ -n "$$want" ] && ! {{ [ -n "$$got" ] && awk -v a="$$want" -v b="$$got" "BEGIN {{ d = a - b; exit !(d < 0.06 && d > -0.06) }}"; }}; '
    'then echo "gpufleet-mps: the daemon rejected a limit of $$MPS_LIMITS_FILE: set_default_active_thread_percentage $$want '
    'answered $$got, the value it keeps" >&2; exit 1; fi; fi'
)

# The pipe directory's SELinux type (mps_daemon selinux_type), set where SELinux is enabled, each time the
# directory may have been made anew (at boot /run is empty).
_LABEL = (
    'if [ -n "$$MPS_SELINUX_TYPE" ] && command -v selinuxenabled > /dev/null && selinuxenabled; then '
    'exec chcon -t "$$MPS_SELINUX_TYPE" "$$CUDA_MPS_PIPE_DIRECTORY"; fi'
)

# "$$" is a literal "$" for systemd, so the shell, not systemd, expands the variables that the
# EnvironmentFile exported to it.
UNIT_TEMPLATE = """\
# Managed by the gpufleet.mps Ansible collection. Local changes are overwritten.
[Unit]
Description=NVIDIA CUDA MPS control daemon for resource %I (gpufleet.mps)
Documentation=https://github.com/gpufleet/mps
After=nvidia-persistenced.service
Wants=nvidia-persistenced.service
ConditionPathExists={config_dir}/%i.env
# A daemon that keeps failing to start (a limit its driver rejects, a broken binary) stops being restarted
# after five tries in a minute, instead of flapping the GPUs' compute mode for ever.
StartLimitIntervalSec=60
StartLimitBurst=5

[Service]
Type=forking
EnvironmentFile={config_dir}/%i.env
# The default thread percentage (mps_limits), in force from the first client, and -S where the limits hold static SM
# partitions (MPS_STATIC_ARGS); optional.
EnvironmentFile=-{config_dir}/%i.limits-env
ExecStartPre=/bin/mkdir -p -m 0755 ${{CUDA_MPS_PIPE_DIRECTORY}}
ExecStartPre=/bin/sh -c '""" + _LABEL + """'
ExecStartPre=/bin/sh -c 'mkdir -p -m "$${{MPS_LOG_MODE:-0700}}" "$$CUDA_MPS_LOG_DIRECTORY" && chmod "$${{MPS_LOG_MODE:-0700}}" "$$CUDA_MPS_LOG_DIRECTORY"'
ExecStartPre=/bin/sh -c 'if [ -n "$$MPS_COMPUTE_MODE" ]; then exec "$$MPS_NVIDIA_SMI" -i "$$CUDA_VISIBLE_DEVICES" -c "$$MPS_COMPUTE_MODE"; fi'
ExecStart=/bin/sh -c 'exec "$$MPS_CONTROL" -d $$MPS_DAEMON_ARGS $$MPS_STATIC_ARGS'
ExecStartPost=/bin/sh -c '""" + _REPLAY + """'
ExecStop=-/bin/sh -c 'echo "{quit} -t $$MPS_STOP_TIMEOUT" | "$$MPS_CONTROL"'
ExecStopPost=/bin/sh -c 'if [ -n "$$MPS_COMPUTE_MODE" ]; then "$$MPS_NVIDIA_SMI" -i "$$CUDA_VISIBLE_DEVICES" -c DEFAULT > /dev/null; fi'
Restart=on-failure
RestartSec=2s
TimeoutStartSec={start_timeout}
TimeoutStopSec={stop_timeout}

[Install]
WantedBy=multi-user.target
"""


SHM_DROPIN = 'gpufleet-shm.conf'
SHM_DROPIN_TEMPLATE = """\
# Managed by the gpufleet.mps Ansible collection (mps_daemon shm=true). Local changes are overwritten.
# The daemon, and every MPS server it starts, sees the shared tmpfs as /dev/shm, as container clients do.
[Unit]
RequiresMountsFor={shm_dir}

[Service]
BindPaths={shm_dir}:/dev/shm
# The tmpfs root's SELinux type (mps_daemon selinux_type), set where SELinux is enabled: at boot it is mounted unlabelled.
ExecStartPre=/bin/sh -c '""" + _LABEL.replace('"$$CUDA_MPS_PIPE_DIRECTORY"', '{shm_dir}') + """'
"""


FOREGROUND_DROPIN = 'gpufleet-foreground.conf'
# Type=exec starts ExecStartPost= as soon as the daemon process runs, before its control socket answers: wait for
# the answer (what -d does before it returns), then replay. Braces doubled for format().
_WAIT = (
    'n=0; until echo get_default_active_thread_percentage | "$$MPS_CONTROL" > /dev/null 2>&1; do n=$$((n+1)); '
    'if [ "$$n" -ge {tries} ]; then echo "gpufleet-mps: the control daemon did not answer within {seconds} s" >&2; exit 1; fi; '
    'sleep 0.2; done; '
)
FOREGROUND_DROPIN_TEMPLATE = """\
# Managed by the gpufleet.mps Ansible collection (mps_daemon foreground=true). Local changes are overwritten.
# The control daemon stays in the foreground (-f): what it logs goes to stdout, which systemd sends to the journal
# (journalctl -u gpufleet-mps@<instance>). systemd watches the process itself (Type=exec), without a pid file.
[Service]
Type=exec
ExecStart=
ExecStart=/bin/sh -c 'exec "$$MPS_CONTROL" -f $$MPS_DAEMON_ARGS $$MPS_STATIC_ARGS'
ExecStartPost=
ExecStartPost=/bin/sh -c '""" + _WAIT + _REPLAY + """'
"""


V3_DROPIN = 'gpufleet-v3.conf'
ORDER_DROPIN = 'gpufleet-order.conf'
ORDER_DROPIN_TEMPLATE = """\
# Managed by the gpufleet.mps Ansible collection (mps_daemon unit_before, unit_after). Local changes are overwritten.
# Ordering only: when both are started, systemd starts the units of Before= after this daemon and the units of After=
# before it. It pulls none of them in, and a unit that is not installed is ignored.
[Unit]
{lines}"""
# A unit name as systemd takes it: a name (an instance after @), and its type.
_UNIT_NAME = re.compile(r'[A-Za-z0-9:_.\\-]+(@[A-Za-z0-9:_.\\-]*)?[.](service|socket|target|device|mount|automount|swap|path|timer|slice|scope)')

PIDFILE_DROPIN = 'gpufleet-pidfile.conf'
PIDFILE_DROPIN_TEMPLATE = """\
# Managed by the gpufleet.mps Ansible collection (mps_daemon). Local changes are overwritten.
# The pid file the control daemon writes in its pipe directory: systemd then knows the main process for sure.
[Service]
PIDFile={pid_file}
"""


def _unit_path(path: str, *, in_list: bool = False) -> str:
    """A path as a unit file carries it (``%`` doubled: a specifier otherwise), or a refusal for what it cannot carry.

    Settings that take a space-separated list (``BindPaths=``, ``RequiresMountsFor=``) carry neither a space nor,
    to stay on the safe side of their own escaping, a ``%``.
    """
    if any(char in path for char in '\n\r\0"\'\\') or (in_list and any(char.isspace() or char == '%' for char in path)):
        raise MpsError('refusing to write %r into a systemd drop-in: use a root without %squotes or "\\"' % (
            path, 'spaces, "%", ' if in_list else 'newlines, '))
    return path.replace('%', '%%')


def render_shm_dropin(shm_dir: str) -> str:
    """The per-instance drop-in that gives the daemon ``shm_dir`` as /dev/shm."""
    return SHM_DROPIN_TEMPLATE.format(shm_dir=_unit_path(shm_dir, in_list=True))


def render_foreground_dropin(start_timeout: int, *, v3: bool = False) -> str:
    """The per-instance drop-in that keeps the daemon in the foreground, its log in the journal; ``v3``: an MPS v3
    resource's, which waits until the daemon lists its server (MPS_V3_SERVER) - the legacy question is not a v3 word."""
    seconds = max(1, int(start_timeout))
    text = FOREGROUND_DROPIN_TEMPLATE.format(tries=seconds * 5, seconds=seconds)
    if v3:
        from .v3_variants import FOREGROUND_V3, replaced  # pylint: disable=import-outside-toplevel
        text = replaced(text, FOREGROUND_V3, 'the foreground drop-in')
    return text


def render_pidfile_dropin(pid_file: str) -> str:
    """The per-instance drop-in that names the daemon's pid file (``<pipe>/nvidia-cuda-mps-control.pid``)."""
    return PIDFILE_DROPIN_TEMPLATE.format(pid_file=_unit_path(pid_file))


def validate_units(value: t.Any, param: str) -> t.Tuple[str, ...]:
    """``unit_before`` / ``unit_after``: systemd unit names, each once, never one of this collection's own units."""
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise InvalidParameterError(param, 'must be a list of systemd unit names, for example [slurmd.service, kubelet.service]')
    names: t.List[str] = []
    for item in value:
        name = str(item)
        if len(name) > 255 or not _UNIT_NAME.fullmatch(name):
            raise InvalidParameterError(param, '%r is not a systemd unit name: give the whole name with its type, for example '
                                        'slurmd.service or kubelet.service' % name)
        if name.startswith('gpufleet-mps'):
            raise InvalidParameterError(param, '%s is a unit of this collection: the daemons are not ordered against each other '
                                        'or their health check' % name)
        if name not in names:
            names.append(name)
    return tuple(names)


def check_unit_order(value: t.Any, param: str) -> t.Tuple[str, ...]:
    """A unit order as a controller receives it, checked before the module is sent: a string is a comma-separated list,
    split exactly as the module's list type splits it (no stripping: a space after a comma is refused here as it would
    be on the host); then :func:`validate_units`."""
    return validate_units(value.split(',') if isinstance(value, str) else value, param)


def render_order_dropin(before: t.Sequence[str], after: t.Sequence[str]) -> t.Optional[str]:
    """The per-instance drop-in that orders the daemon before and after other units; None when there is no order."""
    if not before and not after:
        return None
    lines = ''.join('%s=%s\n' % (key, ' '.join(names)) for key, names in (('Before', before), ('After', after)) if names)
    return ORDER_DROPIN_TEMPLATE.format(lines=lines)


def render_unit(config_dir: str, start_timeout: int, stop_timeout: int) -> str:
    """The template unit's content."""
    # systemd must give the daemon longer than quit -t does before it kills it.
    return UNIT_TEMPLATE.format(config_dir=config_dir, quit=QUIT, start_timeout=int(start_timeout) + 10,
                                stop_timeout=int(stop_timeout) + 10)


def render_env(resource: str, values: t.Mapping[str, str]) -> str:
    """An EnvironmentFile: one ``NAME=value`` per line, values without quotes or newlines."""
    lines = ['# Managed by gpufleet.mps (mps_daemon) for MPS resource %s. Local changes are overwritten.' % resource]
    for name in sorted(values):
        value = values[name]
        if any(char in value for char in '\n\r\0"\'\\'):
            raise MpsError('refusing to write %s=%r to a systemd environment file' % (name, value))
        lines.append('%s=%s' % (name, value))
    return '\n'.join(lines) + '\n'


# nvidia-smi's names for the compute modes the unit sets before start (and resets after stop).
SMI_MODE = {'exclusive_process': 'EXCLUSIVE_PROCESS', 'default': 'DEFAULT'}


def unit_environment(paths: ResourcePaths, config: ConfigPaths, uuids: t.Sequence[str], *, multiuser: bool, compute_mode: str,
                     control_binary: str, nvidia_smi: t.Optional[str], stop_timeout: int, log_mode: int,
                     selinux_type: str = '', foreground: bool = False, v3: t.Optional[t.Any] = None) -> t.Dict[str, str]:
    """The instance's environment file: the contract between this collection and the unit template above.

    ``v3``: a v3 resource's record (_v3.spec.V3Spec): the daemon starts with ``-p 3 -a <its file>`` (``-m`` for
    multi-user), and the health check asks its server (MPS_V3_SERVER); neither is in a legacy resource's file (its
    stop, ``-q``, is :data:`V3_DROPIN`'s)."""
    values = dict(paths.client_env())
    values.update({
        'CUDA_VISIBLE_DEVICES': ','.join(uuids),
        'MPS_CONTROL': control_binary,
        'MPS_DAEMON_ARGS': '-multiuser-server' if multiuser else '',
        'MPS_COMPUTE_MODE': SMI_MODE.get(compute_mode, ''),
        'MPS_NVIDIA_SMI': nvidia_smi or 'nvidia-smi',
        'MPS_STOP_TIMEOUT': str(stop_timeout),
        'MPS_LIMITS_FILE': config.limits_file,
        'MPS_LOG_MODE': format(log_mode, '04o'),
        'MPS_SELINUX_TYPE': selinux_type,
    })
    if foreground:
        # Only when set: the environment files of daemons started before the option existed stay as they are.
        values['MPS_FOREGROUND'] = '1'
    if v3 is not None:
        if any(char.isspace() for char in config.v3_config):
            raise InvalidParameterError('config_dir', '%s holds white space: the unit passes the MPS v3 file %s to the daemon '
                                        'as one word' % (config.config_dir, config.v3_config))
        values['MPS_DAEMON_ARGS'] = '-p 3 -a %s%s' % (config.v3_config, ' -m' if multiuser else '')
        values['MPS_V3_SERVER'] = v3.server
    return values


# The environment values the running daemon was started with: a change means a restart.
RESTART_ENV = ('CUDA_MPS_PIPE_DIRECTORY', 'CUDA_MPS_LOG_DIRECTORY', 'CUDA_VISIBLE_DEVICES', 'MPS_CONTROL', 'MPS_DAEMON_ARGS',
               'MPS_FOREGROUND')


def parse_env(text: str) -> t.Dict[str, str]:
    """The ``NAME=value`` lines of an environment file written by :func:`render_env`."""
    values = {}
    for line in text.splitlines():
        if line.startswith('#') or '=' not in line:
            continue
        name, value = line.split('=', 1)
        values[name.strip()] = value
    return values


def systemd_is_pid1() -> bool:
    """True when systemd runs the host (what ``sd_booted()`` checks)."""
    return os.path.isdir('/run/systemd/system')


# The states for which systemctl is-active --quiet and is-enabled --quiet exit 0 (systemctl(1), "is-enabled" table).
ACTIVE_STATES = frozenset(('active', 'reloading'))
ENABLED_STATES = frozenset(('enabled', 'enabled-runtime', 'alias', 'static', 'indirect', 'generated', 'transient'))


class Systemctl:
    """``systemctl`` for the template unit's instances."""

    def __init__(self, binary: str = SYSTEMCTL, timeout: float = 120, journalctl: t.Optional[str] = None) -> None:
        self.binary = binary
        self.timeout = timeout
        self.journalctl = journalctl

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        try:
            proc = subprocess.run([self.binary] + list(args), capture_output=True, text=True, timeout=self.timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MpsError('systemctl %s failed: %s' % (' '.join(args), exc)) from exc
        if check and proc.returncode != 0:
            raise MpsError('systemctl %s failed with status %d: %s' % (' '.join(args), proc.returncode, (proc.stderr or proc.stdout).strip()),
                           rc=proc.returncode)
        return proc

    def daemon_reload(self) -> None:
        self._run('daemon-reload')

    def is_active(self, unit: str) -> bool:
        return self._run('is-active', '--quiet', unit, check=False).returncode == 0

    def is_enabled(self, unit: str) -> bool:
        return self._run('is-enabled', '--quiet', unit, check=False).returncode == 0

    def states(self, units: t.Sequence[str]) -> t.Dict[str, t.Tuple[bool, bool]]:
        """unit -> (is_active, is_enabled) for every unit of ``units``, from ONE ``systemctl show`` (empty when it fails).

        The answers of ``is-active --quiet`` and ``is-enabled --quiet`` (systemctl(1)): active means ActiveState active
        or reloading; enabled means an UnitFileState whose is-enabled exit status is 0.
        """
        if not units:
            return {}
        proc = self._run('show', '--property=ActiveState,UnitFileState', '--', *units, check=False)
        blocks = [block for block in proc.stdout.split('\n\n') if block.strip()]
        if proc.returncode != 0 or len(blocks) != len(units):
            return {}
        found = {}
        for unit, block in zip(units, blocks):
            values = dict(line.split('=', 1) for line in block.splitlines() if '=' in line)
            found[unit] = (values.get('ActiveState') in ACTIVE_STATES, values.get('UnitFileState') in ENABLED_STATES)
        return found

    def main_pid(self, unit: str) -> t.Optional[int]:
        out = self._run('show', '--property=MainPID', '--value', unit, check=False).stdout.strip()
        return int(out) if out.isdigit() and int(out) > 0 else None

    def start(self, unit: str) -> None:
        self._starting('start', unit)

    def stop(self, unit: str) -> None:
        self._run('stop', unit)

    def restart(self, unit: str) -> None:
        self._starting('restart', unit)

    def _starting(self, verb: str, unit: str) -> None:
        """Start or restart; a failure carries the unit's last journal lines (the daemon's refusal is there)."""
        try:
            self._run(verb, unit)
        except MpsError as exc:
            tail = self.journal_tail(unit)
            if not tail:
                raise
            raise MpsError('%s; the journal of %s ends with: %s' % (exc.msg, unit, ' | '.join(tail)), **exc.details) from exc

    def journal_tail(self, unit: str, lines: int = 5) -> t.List[str]:
        """The last lines the unit logged; empty when journalctl is missing or says nothing."""
        journalctl = self.journalctl or shutil.which('journalctl')
        if not journalctl:
            return []
        try:
            proc = subprocess.run([journalctl, '--unit=%s' % unit, '--lines=%d' % lines, '--output=cat', '--no-pager'],
                                  capture_output=True, text=True, timeout=self.timeout, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return []
        return [line.strip() for line in proc.stdout.splitlines() if line.strip()][-lines:]

    def enable(self, unit: str) -> None:
        self._run('enable', unit)

    def disable(self, unit: str) -> None:
        self._run('disable', unit)


def instance_unit(instance: str) -> str:
    return 'gpufleet-mps@%s.service' % instance
