# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A daemon's container view as container engines take it (pure: no I/O).

:func:`engine_args` turns one container view (``_resource.layout.container_view``: ``root``, ``pipe_dir``,
``env``, ``mounts``) into the arguments ``podman run`` and ``docker run`` take and the parts of a Kubernetes
pod spec that make a container a client of that daemon.

What a client needs of each mount:

- the pipe directory: read-only. A client only connects to the ``control`` socket there; connecting to a
  socket, like opening a FIFO, needs the file's own permission, not a writable mount. A real client of
  another uid works against the root-owned 0755 directory, so it creates nothing in it.
- ``/dev/shm``: writable. A client maps its server's shared memory there.

No SELinux relabelling (``:z``): where SELinux is enabled the collection gives the pipe directories and the tmpfs
the type containers may use (``selinux_type``), and relabelling the host's own /dev/shm would be wrong.
"""

from __future__ import annotations

import hashlib
import os
import re
import typing as t

from ._errors import InvalidParameterError

DEV_SHM = '/dev/shm'
# How the client gets the daemon's /dev/shm: "mount" binds the view's source there; "ipc-host" shares the
# host's IPC namespace, whose /dev/shm is the host's (for a daemon without the shared tmpfs only); "none"
# leaves it to the caller - without it the client finds the daemon but cannot use its server.
SHM_MODES = ('mount', 'ipc-host', 'none')
# An environment variable name every engine takes (Kubernetes' rule is looser, the shell's is this one).
_ENV_NAME = re.compile(r'[A-Za-z_][A-Za-z0-9_]*')
# A Kubernetes volume name is an RFC 1123 label: at most 63 characters of [a-z0-9-], alphanumeric at both ends.
_LABEL_MAX = 63
_HASH_LEN = 8


def engine_args(view: t.Mapping[str, t.Any], shm: str = 'mount',
                extra_env: t.Optional[t.Mapping[str, t.Any]] = None) -> t.Dict[str, t.Any]:
    """What a container engine needs to make a container a client of the daemon ``view`` describes.

    ``extra_env`` adds variables to the view's environment (a client's own limits, such as
    ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, which can only lower what its server hands out); it may not
    replace one of the view's own. Returns::

        podman, docker  argument lists for "run": --volume SOURCE:TARGET[:ro] and --env NAME=VALUE
                        (and --ipc=host with shm="ipc-host"), in a stable order
        kubernetes      volumes (hostPath) [and hostIPC] for the pod's spec; volumeMounts and env for the container's

    Raises InvalidParameterError for a malformed view, an unknown ``shm`` mode, a path the engines'
    ``--volume`` syntax cannot carry, an invalid ``extra_env`` entry, or ``shm="ipc-host"`` on a daemon
    whose /dev/shm is not the host's.
    """
    if shm not in SHM_MODES:
        raise InvalidParameterError('shm', 'must be one of %s, got %r' % (', '.join(SHM_MODES), shm))
    pipe_dir, root, view_env, mounts = _read_view(view)
    env = _merge_env(view_env, extra_env)

    ipc_host = False
    kept: t.List[t.Tuple[str, str, bool]] = []  # source, target, read-only
    for source, target in mounts:
        if target == DEV_SHM:
            if shm == 'none':
                continue
            if shm == 'ipc-host':
                if source != DEV_SHM:
                    raise InvalidParameterError(
                        'shm', '"ipc-host" gives the container the host\'s /dev/shm, but the servers of the daemon of %s use %s '
                        'as theirs (the daemon runs with the shared tmpfs): mount it instead (shm="mount")' % (pipe_dir, source))
                ipc_host = True
                continue
        kept.append((source, target, target == pipe_dir))
    if shm == 'ipc-host' and not ipc_host:
        raise InvalidParameterError('shm', '"ipc-host" needs a view that names the host\'s /dev/shm as the daemon\'s; this one '
                                    'names no /dev/shm mount')

    cli: t.List[str] = ['--ipc=host'] if ipc_host else []
    for source, target, read_only in kept:
        for label, path in (('source', source), ('target', target)):
            if ':' in path:
                raise InvalidParameterError(
                    'view', 'the mount %s %s holds ":", which podman\'s and docker\'s --volume take for a separator' % (label, path))
        cli += ['--volume', '%s:%s%s' % (source, target, ':ro' if read_only else '')]
    for name, value in env:
        cli += ['--env', '%s=%s' % (name, value)]

    kubernetes: t.Dict[str, t.Any] = {'volumes': [], 'volumeMounts': [], 'env': [{'name': k, 'value': v} for k, v in env]}
    if ipc_host:
        kubernetes['hostIPC'] = True
    for source, target, read_only in kept:
        name = _volume_name(root, pipe_dir, target)
        kubernetes['volumes'].append({'name': name, 'hostPath': {'path': source, 'type': 'Directory'}})
        kubernetes['volumeMounts'].append({'name': name, 'mountPath': target, 'readOnly': read_only})
    return {'podman': list(cli), 'docker': list(cli), 'kubernetes': kubernetes}


def _read_view(view: t.Any) -> t.Tuple[str, str, t.Dict[str, str], t.List[t.Tuple[str, str]]]:
    """(pipe_dir, root, env, [(source, target)]) of a container view, checked for the shape container_view gives."""
    if not isinstance(view, t.Mapping):
        raise InvalidParameterError('view', 'must be a container view (a mapping with root, pipe_dir, env and mounts), got %r' % (view,))
    pipe_dir = _abs_path(view.get('pipe_dir'), 'pipe_dir')
    root = _abs_path(view.get('root'), 'root')
    env = view.get('env')
    if not isinstance(env, t.Mapping):
        raise InvalidParameterError('view', 'env must be a mapping of variable names to values, got %r' % (env,))
    checked = {name: _env_value(name, value, 'view') for name, value in env.items()}
    mounts = view.get('mounts')
    if not isinstance(mounts, (list, tuple)):
        raise InvalidParameterError('view', 'mounts must be a list of {source, target}, got %r' % (mounts,))
    pairs: t.List[t.Tuple[str, str]] = []
    targets: t.Set[str] = set()
    for index, mount in enumerate(mounts):
        if not isinstance(mount, t.Mapping):
            raise InvalidParameterError('view', 'mounts[%d] must be a mapping with source and target, got %r' % (index, mount))
        source = _abs_path(mount.get('source'), 'mounts[%d].source' % index)
        target = _abs_path(mount.get('target'), 'mounts[%d].target' % index)
        if target in targets:
            raise InvalidParameterError('view', 'mounts[%d]: a second mount at %s' % (index, target))
        targets.add(target)
        pairs.append((source, target))
    return pipe_dir, root, checked, pairs


def _abs_path(value: object, what: str) -> str:
    if not isinstance(value, str) or not os.path.isabs(value) or '\0' in value or '\n' in value:
        raise InvalidParameterError('view', '%s must be an absolute path without NUL or newline, got %r' % (what, value))
    return os.path.normpath(value)


def _env_value(name: object, value: object, param: str) -> str:
    """The value as the string an engine sets, after checking the name and the value."""
    if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
        raise InvalidParameterError(param, '%r is not an environment variable name (letters, digits and "_", not starting with a '
                                    'digit)' % (name,))
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise InvalidParameterError(param, '%s: the value must be a string or a number, got %r' % (name, value))
    text = str(value)
    if '\0' in text or '\n' in text:
        raise InvalidParameterError(param, '%s: the value must not contain NUL or newline characters' % name)
    return text


def _merge_env(env: t.Dict[str, str], extra_env: t.Optional[t.Mapping[str, t.Any]]) -> t.List[t.Tuple[str, str]]:
    """The view's variables and ``extra_env``'s, sorted by name; the view's own may not be replaced."""
    merged = dict(env)
    if extra_env is not None:
        if not isinstance(extra_env, t.Mapping):
            raise InvalidParameterError('extra_env', 'must be a mapping of variable names to values, got %r' % (extra_env,))
        for name, value in extra_env.items():
            text = _env_value(name, value, 'extra_env')
            if name in env and env[name] != text:
                raise InvalidParameterError('extra_env', '%s comes from the container view (%s): it is what leads the client to its '
                                            'daemon and cannot be replaced' % (name, env[name]))
            merged[name] = text
    return sorted(merged.items())


def _volume_name(root: str, pipe_dir: str, target: str) -> str:
    """A Kubernetes volume name for the mount at ``target``: readable, and distinct for distinct targets."""
    if target == DEV_SHM:
        # The same for every resource of a root, so that the views of two resources in one pod merge into one volume.
        return 'mps-shm'
    if target == pipe_dir:
        # <root>/<resource>/pipe: named after the resource
        kind, text = 'pipe', os.path.relpath(os.path.dirname(pipe_dir), root)
    else:
        kind, text = 'mount', target
    digest = hashlib.sha256(target.encode('utf-8')).hexdigest()[:_HASH_LEN]
    slug = re.sub(r'[^a-z0-9]+', '-', text.lower()).strip('-')
    room = _LABEL_MAX - len('mps-%s--' % kind) - _HASH_LEN
    slug = slug[:room].strip('-')
    return 'mps-%s-%s%s' % (kind, slug + '-' if slug else '', digest)


def with_engine(view: t.Dict[str, t.Any], extra_env: t.Optional[t.Mapping[str, t.Any]] = None) -> t.Dict[str, t.Any]:
    """``view`` with ``engine``: :func:`engine_args` of it (the daemon's ``/dev/shm`` bind-mounted), as mps_daemon and
    mps_info return a container view."""
    view['engine'] = engine_args(view, 'mount', extra_env)
    return view
