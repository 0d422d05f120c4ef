# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Whose process is this: the container or Slurm job an MPS client (or server) belongs to, from ``/proc``.

A process's cgroup says where it runs, as the engine that started it placed it; its environment says what it claims
(``SLURM_JOB_ID``: any process can set it). :func:`parse_cgroup` reads a ``/proc/<pid>/cgroup`` text - cgroup v1
(``<id>:<controllers>:<path>`` lines), v2 (``0::<path>``) or both - and names the engine and the id the path holds:

- docker: ``/docker/<id>`` (cgroupfs driver) or ``docker-<id>.scope`` (systemd driver); in docker the innermost one;
- podman: ``libpod-<id>.scope`` (systemd) or ``libpod-<id>`` (cgroupfs), never its ``libpod-conmon-<id>`` monitor;
- containerd: ``cri-containerd-<id>.scope`` (systemd driver) or ``...slice:cri-containerd:<id>`` (older containerd);
- CRI-O: ``crio-<id>.scope``, never its ``crio-conmon-<id>`` monitor;
- Kubernetes with the cgroupfs driver: ``/kubepods/<qos>/pod<uid>/<id>`` names the pod and the container but not the
  runtime (engine ``kubernetes``);
- Slurm: ``/slurm/uid_<uid>/job_<id>/...`` (v1) or ``/system.slice/slurmstepd.scope/job_<id>/...`` (v2; slurmstepd's
  own cgroup): a job id the process cannot choose.

Every line is read, not only the v2 one: hybrid hosts give a container's v2 line as its engine's service
(``0::/system.slice/docker.service``), and a Slurm v1 job may show only in its freezer line. The layouts are held to
real files, each cited, in ``tests/unit/plugins/module_utils/fixtures/cgroups.json``. A path the reader cannot place -
a private cgroup namespace (``0::/``), an engine not listed - is ``unknown``, never guessed.
"""

from __future__ import annotations

import re
import typing as t

from ._proc import environ_of

_ID = r'([0-9a-f]{64})'
_KUBE_ID = r'([0-9a-f]{64}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})'
# (engine, pattern), in precedence order: a named engine before the bare-id fallback (see parse_cgroup).
PATTERNS: t.Tuple[t.Tuple[str, t.Pattern[str]], ...] = (
    ('podman', re.compile(r'libpod-(?!conmon-)' + _ID + r'(?:\.scope)?(?=/|$)')),
    ('crio', re.compile(r'crio-(?!conmon-)' + _ID + r'(?:\.scope)?(?=/|$)')),
    ('containerd', re.compile(r'cri-containerd[-:]' + _ID)),
    ('docker', re.compile(r'docker-' + _ID + r'\.scope')),
    ('docker', re.compile(r'/docker/' + _ID + r'(?=/|$)')),
    ('kubernetes', re.compile(r'/kubepods(?:/[a-z]+)*/pod[0-9a-f-]+/' + _KUBE_ID + r'(?=/|$)')),
    # a 64-hex container id in a layout none of the above names (docker under a cgroup parent of its own, ...): a
    # container, its engine unknown
    ('', re.compile(r'/' + _ID + r'(?:\.scope)?(?=/|$)')),
)
# Where a host's own processes live (systemd's slices and scopes; a reader in a child cgroup namespace sees them as
# /../...): a path elsewhere that names no engine is unknown, not the host's.
HOST_PATHS = re.compile(r'^(?:/\.\.)*/(?:user\.slice|system\.slice|init\.scope|user-[0-9]+\.slice|session-[0-9]+\.scope)(?:/|$)')
_POD = re.compile(r'pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32})(?:\.slice|/)')
# /slurm/uid_N/job_N (v1; /slurm_<node>/... where several slurmd share a host), <node>_slurmstepd.scope/job_N (v2)
_SLURM_JOB = re.compile(r'(?:/slurm(?:_[^/]+)?/uid_[0-9]+|slurmstepd\.scope)/job_([0-9]+)(?=/|$)')
_HEX64 = re.compile(r'[0-9a-f]{64}')
_CLAIMED_JOB = re.compile(r'\d+(?:_\d+)?')
OWNER_KINDS = ('container', 'slurm_job', 'host', 'unknown')


def cgroup_paths(text: str) -> t.List[str]:
    """The paths of a ``/proc/<pid>/cgroup`` text, one per line (split on the first two colons: older containerd puts
    colons in the path)."""
    paths = []
    for line in text.splitlines():
        parts = line.split(':', 2)
        if len(parts) == 3 and parts[2].strip():
            paths.append(parts[2].strip())
    return paths


def parse_cgroup(text: str) -> t.Dict[str, t.Optional[str]]:
    """``{engine, container, pod, job}`` of a ``/proc/<pid>/cgroup`` text; each None where the paths do not say.

    The innermost container wins: of every match of every layout in a path, the one that ends furthest to the right (a
    container in a container - docker in docker, kind's nodes - is its innermost engine's); a named engine before the
    bare-id fallback where both end at the same place; the deepest over the lines."""
    found: t.Dict[str, t.Optional[str]] = {'engine': None, 'container': None, 'pod': None, 'job': None}
    paths = cgroup_paths(text)
    best: t.Optional[t.Tuple[int, int, str, str]] = None  # (end, -precedence, engine, id)
    for path in paths:
        for rank, (engine, pattern) in enumerate(PATTERNS):
            for match in pattern.finditer(path):
                candidate = (match.end(1), -rank, engine, match.group(1))
                if best is None or candidate[:2] > best[:2]:
                    best = candidate
    if best is not None:
        found['engine'], found['container'] = best[2] or None, best[3]
    for path in paths:
        pod = _POD.search(path)
        if pod and found['container'] and found['pod'] is None:
            found['pod'] = pod.group(1).replace('_', '-')
        job = _SLURM_JOB.search(path)
        if job and found['job'] is None:
            found['job'] = job.group(1)
    return found


def owner_kind(text: str, found: t.Mapping[str, t.Optional[str]]) -> str:
    """What owns the process of a ``/proc/<pid>/cgroup`` text (empty: unreadable): a ``container``, a ``slurm_job``, the
    ``host`` (every path in systemd's slices or scopes), or ``unknown`` - unreadable, the root of a cgroup namespace of
    its own (``0::/``: a container whose engine hides its path), or a place no layout here names."""
    if found.get('container'):
        return 'container'
    if found.get('job'):
        return 'slurm_job'
    paths = [path for path in cgroup_paths(text) if path != '/']
    # a 64-hex id in a path is some engine's container (nerdctl-<id>.scope under system.slice...): never the host's
    if paths and all(HOST_PATHS.match(path) and not _HEX64.search(path) for path in paths):
        return 'host'
    return 'unknown'


def attribute(pid: int, uid: t.Optional[int] = None) -> t.Dict[str, t.Any]:
    """Whose process ``pid`` is: its owner kind, engine, container id, pod, Slurm job (from its cgroup: where the engine
    put it) and the job it claims (``SLURM_JOB_ID`` of its environment: said by the process, not proven)."""
    try:
        with open('/proc/%d/cgroup' % pid, encoding='utf-8', errors='replace') as handle:
            text = handle.read()
    except OSError:
        text = ''
    found = parse_cgroup(text)
    kind = owner_kind(text, found)
    claimed = (environ_of(pid) or {}).get('SLURM_JOB_ID', '').strip()
    claimed = claimed if _CLAIMED_JOB.fullmatch(claimed) else None  # a job id (an array's 123_4), never free text
    return {'pid': pid, 'uid': uid, 'owner': kind, 'engine': found['engine'], 'container': found['container'],
            'pod': found['pod'], 'job': found['job'], 'claimed_job': claimed}


def owner_counts(owners: t.Iterable[t.Mapping[str, t.Any]]) -> t.Dict[str, int]:
    """Clients per owner kind (every kind present, zero included): a bounded set, never one entry per process."""
    counts = dict.fromkeys(OWNER_KINDS, 0)
    for owner in owners:
        counts[owner.get('owner') or 'unknown'] = counts.get(owner.get('owner') or 'unknown', 0) + 1
    return counts
