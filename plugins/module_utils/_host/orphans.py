# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The orphans of a root: control daemons this collection started whose pipe directory no longer leads to them.

An orphan still serves its GPUs (the real r580 daemon lives on when its pipe directory is deleted, and a second ``-d``
in a re-created one starts a second daemon on the same GPU: ``../shared/mps-reference.md`` section 8), and no control
UI can reach it. Every orphan the view found is refused by default, whether or not a listed resource needs its GPUs,
naming each one; with ``orphans=stop`` it is stopped like any other resource is: its clients decided by ``busy``, then
the daemon ended (TERM, then KILL: ``quit`` cannot reach it), then its GPUs given back their compute mode - the GPUs in
its ``CUDA_VISIBLE_DEVICES`` (every GPU when it had none) that no other live daemon serves and no listed resource keeps -
and the ready mark withdrawn first. Decided from the view alone.
"""

from __future__ import annotations

import os
import typing as t

from .._daemon.decide import compute_mode_changes, releasable
from .._errors import MpsError
from .._observe.scan import gpu_claims
from .._supervisor.process import end_orphan


def refuse_orphans(orphans: t.Sequence[t.Any], root: str) -> None:
    """orphans=refuse: every orphan of the root named, with what to do; nothing is done."""
    raise MpsError('%d orphaned MPS control daemon(s) of %s still serve GPUs, and no pipe directory leads to them any more '
                   '(their directories were deleted under them), so a new daemon on those GPUs would break both: %s. Set '
                   'orphans=stop to end them (their GPUs get their compute mode back), or end them yourself; nothing was '
                   'done' % (len(orphans), root, '; '.join(
                       'pid %d, pipe directory %s (kill %d)' % (daemon.pid, daemon.pipe_dir, daemon.pid) for daemon in orphans)),
                   orphans=[{'pid': daemon.pid, 'pipe_dir': daemon.pipe_dir, 'devices': list(daemon.uuids)} for daemon in orphans])


def resource_of(daemon: t.Any, root: str) -> str:
    """The resource an orphan served, as its pipe directory names it (``<root>/<name>/pipe``)."""
    return os.path.relpath(os.path.dirname(daemon.pipe_dir), root)


def end_orphans(out: t.Any, orphans: t.Sequence[t.Any], view: t.Any, params: t.Mapping[str, t.Any], kept: t.AbstractSet[str],
                planned: t.AbstractSet[str], nvml: t.Any) -> None:
    """orphans=stop: each orphan stopped first, as any resource is, so that the resources can take its GPUs.

    ``kept``: GPUs the listed resources keep in MPS use (their compute mode stays); ``planned``: the resources this plan
    decides itself (their records do not count as other users of a GPU).
    """
    ending = {daemon.pid for daemon in orphans}
    root = params['root']
    # Every other daemon that serves a GPU: the root's live resources the plan does not stop, and foreign daemons.
    still_used = set(gpu_claims({name: found[1] for name, found in view.live(planned).items()}))
    claims = {}
    for daemon in view.daemons[0]:
        if daemon.pid not in ending:
            for uuid in daemon.uuids:
                claims.setdefault(uuid, daemon)
    for daemon in orphans:
        servers = view.orphan_servers.get(daemon.pid, [])
        if servers and params['busy'] != 'terminate':
            raise MpsError('orphans=stop: the orphaned MPS control daemon pid %d still has MPS server(s) %s, whose clients '
                           'cannot be listed (quit cannot reach it); ending it ends them: set busy=terminate to go on, '
                           'or end it yourself (kill %d); nothing was done' % (
                               daemon.pid, ', '.join(str(pid) for pid in servers), daemon.pid), pid=daemon.pid)
        name = resource_of(daemon, root)
        change = out.act('end the orphaned MPS control daemon (pid %d)' % daemon.pid,
                         lambda pid=daemon.pid: end_orphan(pid, params['stop_timeout']),
                         'its pipe directory %s no longer leads to it (orphans=stop)' % daemon.pipe_dir, kind='stop',
                         ends_clients=bool(servers))
        change.resource = name
        if params['compute_mode'] == 'unchanged':
            continue
        gpus, warnings = releasable(view.gpus, set(daemon.uuids), still_used, kept, claims)
        out.warnings.extend(warnings)
        for gpu in compute_mode_changes(gpus, 'default'):
            change = out.act('set compute mode DEFAULT on GPU %d (%s)' % (gpu.index, gpu.uuid),
                             lambda gpu=gpu: nvml.set_compute_mode(gpu, 'default'),
                             'the orphaned daemon pid %d that served it was ended' % daemon.pid)
            change.resource = name
