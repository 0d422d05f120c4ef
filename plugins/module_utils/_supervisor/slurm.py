# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Slurm's view of this collection's MPS daemons: a ``TaskProlog`` script and a ``gres.conf``, rendered (pure).

Slurm schedules MPS as the generic resource ``mps`` on top of ``gpu`` (``--gres=mps:25``: 25 shares of one GPU), but
it does not know where this collection's daemons listen. The ``TaskProlog`` (:func:`render_task_prolog`) closes that
gap: before each task of an MPS job it prints ``export`` lines that point the task at the daemon of the GPU Slurm gave
it. What it relies on was observed on Slurm 22.05.8 (Debian 12) with ``tests/engines/test_slurm.py``:

- Slurm runs the TaskProlog as the job's user, once per task, and reads its stdout: ``export NAME=value`` sets the
  task's variable (the value is taken as written up to the end of the line: quotes would become part of it),
  ``print text`` writes ``text`` to the task's stdout, other lines are ignored, stderr is discarded.
- A TaskProlog that exits non-zero fails the task before it starts: the task's exit code is the script's, srun
  reports ``TaskProlog failed status=N``; the ``print`` lines still reach the job's output.
- ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` is set only for ``--gres=mps`` jobs (to the requested shares * 100 / the
  GPU's count): it tells an MPS job from any other.
- The GPU is NVML's index in ``SLURM_STEP_GPUS`` (a step: srun) or ``SLURM_JOB_GPUS`` (a batch script), never both.
  ``CUDA_VISIBLE_DEVICES`` is that global index without device constraint, but ``0`` (relative to the job's devices)
  with ``ConstrainDevices=yes``: it never says which GPU, so the prolog ignores it and replaces it with the GPU's
  ordinal among the daemon's own GPUs (a daemon sees only its GPUs, numbered from 0).

A job on a GPU that no daemon serves, or whose daemon is not running, gets a ``print`` line naming the GPU and the
root, a pipe directory that cannot exist (for a Slurm that would ignore the exit status) and exit status 1: it fails
instead of running on a GPU without MPS (or, in ``EXCLUSIVE_PROCESS``, failing later with a CUDA error). The daemon
runs when a process holds a lock on its ``control_lock`` (``/proc/locks``, which every user may read) or its pid file
names a live control daemon, as ``_supervisor/liveness.py`` decides it (without the pid file's ownership checks a job
user cannot make): its sockets outlive it.

:func:`render_gres_conf` describes the GPUs the daemons serve, each with ``Count`` MPS shares.
"""

from __future__ import annotations

import os
import typing as t

from .._errors import MpsError
from .._resource.layout import validate_name
from .liveness import LOCK_FILE, PID_FILE
from .unit import MANAGED_HEADER

MANAGED = MANAGED_HEADER
# Where a job that must not reach any daemon is pointed: nothing can exist under /dev/null (connect: ENOTDIR).
NO_DAEMON_PIPE_DIR = '/dev/null/gpufleet-mps-no-daemon'
# nvidia-cuda-mps-control as /proc/<pid>/comm shows it (truncated to 15 characters).
DAEMON_COMM = 'nvidia-cuda-mps-control'[:15]
DEFAULT_COUNT = 100
# What gres.conf's device directory may not hold besides what _text refuses: whitespace (gres.conf splits a line on
# it) and '#' (starts a comment).
_GRES_FORBIDDEN = frozenset(' \t#')


def _text(value: object, what: str) -> str:
    """A string safe in single quotes and on one line of a Slurm ``export`` or ``print``."""
    if not isinstance(value, str) or not value:
        raise MpsError('%s must be a non-empty string, got %r' % (what, value))
    bad = sorted({char for char in value if char in '\'"\\`' or ord(char) < 32 or ord(char) == 127})
    if bad:
        raise MpsError('%s %r holds %s: quotes, backslashes, backquotes and control characters (newlines) cannot be '
                       'written safely into a TaskProlog or gres.conf' % (what, value, ', '.join(repr(char) for char in bad)))
    return value


def _path(value: object, what: str) -> str:
    path = _text(value, what)
    if not os.path.isabs(path):
        raise MpsError('%s %r is not an absolute path: a TaskProlog runs in the job\'s working directory' % (what, path))
    return path


def _index(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MpsError('%s must be a GPU index (an integer >= 0), got %r' % (what, value))
    return value


class _Gpu(t.NamedTuple):
    index: int
    resource: str
    ordinal: int
    memory_mib: t.Optional[int]


class _Resource(t.NamedTuple):
    name: str
    pipe_dir: str
    log_dir: str
    gpus: t.List[_Gpu]
    # What a job sets CUDA_MPS_PIPE_DIRECTORY to: the pipe directory, or an MPS v3 resource's server directory.
    client_pipe_dir: str = ''


def _resources(resources: object, *, memory: bool, dirs: bool = True) -> t.List[_Resource]:
    """The validated resources; every GPU index served by at most one of them. ``dirs``: check the directories."""
    if not isinstance(resources, (list, tuple)):
        raise MpsError('resources must be a list of resources, got %r' % (resources,))
    found: t.List[_Resource] = []
    owner: t.Dict[int, str] = {}
    for number, item in enumerate(resources):
        if not isinstance(item, dict):
            raise MpsError('resources[%d] must be a mapping with name, pipe_dir, log_dir and devices, got %r' % (number, item))
        name = validate_name(item.get('name'), 'resources[%d].name' % number)
        where = 'resource %s' % name
        pipe_dir = _path(item.get('pipe_dir'), '%s: pipe_dir' % where) if dirs else ''
        log_dir = _path(item.get('log_dir'), '%s: log_dir' % where) if dirs else ''
        devices = item.get('devices')
        if not isinstance(devices, (list, tuple)) or not devices:
            raise MpsError('%s: devices must be a non-empty list of GPUs (index, uuid, memory_total_mib), got %r' % (where, devices))
        gpus = []
        for ordinal, device in enumerate(devices):
            if not isinstance(device, dict):
                raise MpsError('%s: devices[%d] must be a mapping with index, uuid and memory_total_mib, got %r' % (where, ordinal, device))
            if 'mig' in device:
                raise MpsError('%s: devices[%d] is the MIG device %s: Slurm describes MIG devices itself (gres.conf '
                               'AutoDetect=nvml), leave this resource out' % (where, ordinal, device.get('mig')))
            index = _index(device.get('index'), '%s: devices[%d].index' % (where, ordinal))
            _text(device.get('uuid'), '%s: devices[%d].uuid' % (where, ordinal))
            mib = device.get('memory_total_mib')
            if memory or mib is not None:
                if isinstance(mib, bool) or not isinstance(mib, int) or mib <= 0:
                    raise MpsError('%s: devices[%d].memory_total_mib must be a positive integer (MiB), got %r' % (where, ordinal, mib))
            if owner.get(index) == name:
                raise MpsError('%s lists GPU %d twice' % (where, index))
            if index in owner:
                raise MpsError('GPU %d is served by resource %s and by %s: one MPS daemon per GPU' % (index, owner[index], where))
            owner[index] = name
            gpus.append(_Gpu(index, name, ordinal, mib))
        client = item.get('client_pipe_dir')
        client_pipe = _path(client, '%s: client_pipe_dir' % where) if dirs and client is not None else pipe_dir
        found.append(_Resource(name, pipe_dir, log_dir, gpus, client_pipe))
    return found


# The TaskProlog. Placeholders @ROOT@, @MEMORY_SHARE@, @CASES@, @SERVED@ (the shell needs its braces). printf, never
# echo: dash's echo would expand backslashes.
TASK_PROLOG_TEMPLATE = r"""#!/bin/sh
# @MANAGED@ (Slurm TaskProlog). Local changes are overwritten.
# Points each task of an MPS job (--gres=mps:N) at the MPS control daemon of the GPU that Slurm gave it:
@SERVED@
# Slurm reads stdout: "export NAME=value" sets a variable of the task (the value as written, to the end of the line),
# "print text" writes text to the task's stdout. A non-zero exit fails the task before it starts.
root='@ROOT@'
memory_share=@MEMORY_SHARE@

# Slurm sets CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for --gres=mps jobs only: any other job is left alone.
[ -n "${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE:-}" ] || exit 0
# NVML indices: SLURM_STEP_GPUS in a step (srun), SLURM_JOB_GPUS in a batch script. Never CUDA_VISIBLE_DEVICES:
# with ConstrainDevices=yes it is relative to the job's devices, so it does not say which GPU.
gpus=${SLURM_STEP_GPUS:-${SLURM_JOB_GPUS:-}}
[ -n "$gpus" ] || exit 0

refuse() {
  printf 'print gpufleet.mps: %s\n' "$1"
  printf 'export CUDA_MPS_PIPE_DIRECTORY=%s\n' '@NO_DAEMON@'
  exit 1
}

# $1: a GPU index -> resource, pipe, log, ordinal (its number among the daemon's GPUs), mib (its memory)
serve() {
  case $1 in
@CASES@
    *) return 1 ;;
  esac
}

# The daemon of pipe directory $1 runs: a process holds a lock on its control_lock (the kernel drops it when the
# daemon dies; /proc/locks prints the inode after the device), or its pid file names a live control daemon (not a zombie).
# Its sockets and pid file outlive it; a lock shown with another device number (overlay, btrfs) still counts.
running() {
  [ -S "$1/control" ] || return 1
  inode=$(stat -L -c %i "$1/@LOCK_FILE@" 2>/dev/null) && grep -q ":$inode " /proc/locks 2>/dev/null && return 0
  pid=$(cat "$1/@PID_FILE@" 2>/dev/null) || return 1
  case $pid in ''|*[!0-9]*) return 1 ;; esac
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = '@DAEMON_COMM@' ] || return 1
  # a killed daemon stays a zombie (state Z) until its parent reaps it: dead, though /proc still shows it
  state=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
  state=${state##*) }
  case $state in Z*|X*) return 1 ;; esac
}

pct=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
case $pct in
  *[!0-9.]*|.*) share=0 ;;
  *) share=${pct%%.*} ;;
esac
[ "$share" -le 100 ] || share=100

set -f
old_ifs=$IFS
IFS=,
served_by='' served_pipe='' served_log='' ordinals='' limits=''
for gpu in $gpus; do
  case $gpu in
    ''|*[!0-9]*) refuse "Slurm gave this job the GPUs '$gpus': not a list of GPU indices" ;;
  esac
  serve "$gpu" || refuse "no MPS daemon under $root serves GPU $gpu, which Slurm gave this job"
  if [ -n "$served_by" ] && [ "$served_by" != "$resource" ]; then
    refuse "GPUs $gpus of this job are served by different MPS daemons under $root ($served_by, $resource): an MPS client reaches one"
  fi
  served_by=$resource served_pipe=$pipe served_log=$log
  ordinals=${ordinals:+$ordinals,}$ordinal
  limits=${limits:+$limits,}$ordinal=$((mib * share / 100))M
done
IFS=$old_ifs
set +f

running "$served_pipe" || refuse "the MPS daemon of GPU $gpus (resource $served_by, $served_pipe) under $root is not running"
if [ "$memory_share" = 1 ] && [ "$share" -lt 1 ]; then
  refuse "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$pct is not a percentage of at least 1: no GPU memory share to pin"
fi

printf 'export CUDA_MPS_PIPE_DIRECTORY=%s\n' "$served_pipe"
printf 'export CUDA_MPS_LOG_DIRECTORY=%s\n' "$served_log"
printf 'export CUDA_VISIBLE_DEVICES=%s\n' "$ordinals"
if [ "$memory_share" = 1 ]; then
  printf 'export CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=%s\n' "$limits"
fi
exit 0
"""

# Where a resource runs MPS v3 (its entry has protocol: 3) a job is given its server's directory, not the pipe
# directory (whose main socket routes a client to an automatic uid_<uid> server): these replace their legacy lines in that
# host's TaskProlog only; the others stay byte for byte.
V3_REPLACEMENTS = (
    (r"""# $1: a GPU index -> resource, pipe, log, ordinal (its number among the daemon's GPUs), mib (its memory)""",
     r"""# $1: a GPU index -> resource, pipe, client (the directory a job is given: pipe, or an MPS v3 resource's server
# directory), log, ordinal (its number among the daemon's GPUs), mib (its memory)"""),
    (r"""served_by='' served_pipe='' served_log='' ordinals='' limits=''""",
     r"""served_by='' served_pipe='' served_client='' served_log='' ordinals='' limits=''"""),
    (r"""  served_by=$resource served_pipe=$pipe served_log=$log""",
     r"""  served_by=$resource served_pipe=$pipe served_client=$client served_log=$log"""),
    (r"""running "$served_pipe" || refuse "the MPS daemon of GPU $gpus (resource $served_by, $served_pipe) under $root is not running"
""",
     r"""running "$served_pipe" || refuse "the MPS daemon of GPU $gpus (resource $served_by, $served_pipe) under $root is not running"
[ -S "$served_client/control" ] || refuse "the MPS v3 server of GPU $gpus (resource $served_by, $served_client) under $root is not there"
"""),
    (r"""printf 'export CUDA_MPS_PIPE_DIRECTORY=%s\n' "$served_pipe" """[:-1],
     r"""printf 'export CUDA_MPS_PIPE_DIRECTORY=%s\n' "$served_client" """[:-1]),
)


def render_task_prolog(root: str, resources: t.Sequence[t.Mapping[str, t.Any]], *, memory_share: bool = False) -> str:
    """A POSIX ``sh`` Slurm ``TaskProlog`` that points each MPS job at the daemon of its GPU.

    ``root`` is the daemons' root (named in the messages a failing job prints). ``resources``: one mapping per
    daemon, ``{'name', 'pipe_dir', 'log_dir', 'devices': [{'index', 'uuid', 'memory_total_mib'}, ...]}`` with the
    devices in the daemon's own order (what ``ansible_local.gpufleet_mps`` holds: ``env`` gives the directories).
    For an MPS job (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` set) on GPUs that one daemon serves and that runs, the
    script exports ``CUDA_MPS_PIPE_DIRECTORY``, ``CUDA_MPS_LOG_DIRECTORY`` and ``CUDA_VISIBLE_DEVICES`` (the GPUs'
    ordinals in that daemon) and keeps Slurm's percentage; with ``memory_share`` also
    ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=<ordinal>=<percentage of the GPU's memory>M``. Any other MPS job fails with a
    line that says why. Raises :class:`MpsError` naming the bad value before anything is rendered.
    """
    root = _path(root, 'root')
    if not isinstance(memory_share, bool):
        raise MpsError('memory_share must be true or false, got %r' % (memory_share,))
    parsed = _resources(resources, memory=memory_share)
    cases = []
    served = []
    v3 = any(resource.client_pipe_dir != resource.pipe_dir for resource in parsed)
    for resource in parsed:
        indices = ', '.join(str(gpu.index) for gpu in resource.gpus)
        served.append('#   %s: GPU%s %s (%s)' % (resource.name, 's' if len(resource.gpus) > 1 else '', indices, resource.client_pipe_dir))
        for gpu in resource.gpus:
            client = " client='%s'" % resource.client_pipe_dir if v3 else ''
            cases.append("    %d) resource='%s' pipe='%s'%s log='%s' ordinal=%d mib=%d ;;" % (
                gpu.index, resource.name, resource.pipe_dir, client, resource.log_dir, gpu.ordinal, gpu.memory_mib or 0))
    cases.sort(key=lambda line: int(line.split(')', 1)[0]))
    replacements = {
        '@MANAGED@': MANAGED,
        '@SERVED@': '\n'.join(served) if served else '#   (no daemon: every MPS job fails)',
        '@ROOT@': root,
        '@MEMORY_SHARE@': '1' if memory_share else '0',
        '@NO_DAEMON@': NO_DAEMON_PIPE_DIR,
        '@CASES@': '\n'.join(cases),
        '@LOCK_FILE@': LOCK_FILE,
        '@PID_FILE@': PID_FILE,
        '@DAEMON_COMM@': DAEMON_COMM,
    }
    text = TASK_PROLOG_TEMPLATE
    if v3:
        from .v3_variants import replaced  # pylint: disable=import-outside-toplevel
        text = replaced(text, V3_REPLACEMENTS, 'the TaskProlog')
    for key, value in replacements.items():
        text = text.replace(key, value)
    return text


def render_gres_conf(resources: t.Sequence[t.Mapping[str, t.Any]], device_dir: str = '/dev', count: int = DEFAULT_COUNT) -> str:
    """Slurm's ``gres.conf`` for the GPUs the daemons serve: ``Name=gpu`` and ``Name=mps Count=<count>`` per GPU.

    The GPUs are sorted by index; ``<device_dir>/nvidia<index>`` is each one's device file (NVML's index is usually,
    not always, the device's minor number: ``nvidia-smi -q`` shows the *Minor Number*). The file says
    ``AutoDetect=off``: its lines are the whole truth of what the node offers, and NVML autodetection (a Slurm built
    with NVML and a global ``AutoDetect=nvml``) would add GPUs, and MIG devices, that no daemon serves, where MPS jobs
    would be placed and fail. The header gives the ``slurm.conf`` line that must match. ``resources`` as for
    :func:`render_task_prolog` (only ``name`` and ``devices`` matter).
    """
    device_dir = _path(device_dir, 'device_dir')
    bad = sorted(_GRES_FORBIDDEN.intersection(device_dir))
    if bad:
        raise MpsError('device_dir %r holds %s: gres.conf splits File= at whitespace and starts a comment at "#"' % (
            device_dir, ', '.join(repr(char) for char in bad)))
    device_dir = device_dir.rstrip('/')
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise MpsError('count must be a positive integer (the MPS shares of each GPU, normally 100), got %r' % (count,))
    parsed = _resources(resources, memory=False, dirs=False)
    gpus = sorted((gpu for resource in parsed for gpu in resource.gpus), key=lambda gpu: gpu.index)
    lines = ['# %s (Slurm gres.conf). Local changes are overwritten.' % MANAGED]
    if gpus:
        lines.append('# slurm.conf: GresTypes=gpu,mps, SelectType=select/cons_tres and for this node Gres=gpu:%d,mps:%d'
                     % (len(gpus), len(gpus) * count))
        lines.append('# Each GPU below has %d MPS shares: --gres=mps:S gets S * 100 / %d %% of one GPU\'s threads.' % (count, count))
    else:
        lines.append('# No GPU is served by an MPS daemon of this collection: this node offers no gpu or mps resource.')
    for resource in sorted(parsed, key=lambda item: item.name):
        if len(resource.gpus) > 1:
            indices = ', '.join(str(gpu.index) for gpu in resource.gpus)
            ordinals = ', '.join('%d -> %d' % (gpu.index, gpu.ordinal) for gpu in resource.gpus)
            lines.append('# %s: one MPS daemon for GPUs %s; the TaskProlog sets a job\'s CUDA_VISIBLE_DEVICES to its GPU\'s '
                         'ordinal in that daemon (%s).' % (resource.name, indices, ordinals))
    lines.append('AutoDetect=off')
    for gpu in gpus:
        device = '%s/nvidia%d' % (device_dir, gpu.index)
        lines.append('Name=gpu File=%s' % device)
        lines.append('Name=mps Count=%d File=%s' % (count, device))
    return '\n'.join(lines) + '\n'
