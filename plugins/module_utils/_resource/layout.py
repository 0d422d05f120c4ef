# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Resource names and the Root directory layout (pure: no I/O).

The layout is the one NVIDIA's Kubernetes device plugin uses, so anything written for it finds the
daemons this collection starts::

    <root>/<resource>/pipe       CUDA_MPS_PIPE_DIRECTORY
    <root>/<resource>/log        CUDA_MPS_LOG_DIRECTORY
    <root>/<resource>/.started   JSON record of what the running daemon was started with
    <root>/shm                   optional tmpfs for container clients
    <root>/.ready                exists when every managed daemon is healthy
"""

from __future__ import annotations

import os
import re
import string
import typing as t
from dataclasses import dataclass

from .._errors import InvalidParameterError

DEFAULT_ROOT = '/run/nvidia/mps'
DEFAULT_CONFIG_DIR = '/etc/gpufleet-mps'
# A unix socket address holds 107 bytes of path; stricter in practice: on driver 535 a daemon with a pipe directory over 87 bytes failed silently (no log
# line; only control_lock and log left behind). The longest socket name it binds is longer than "control".
MAX_PIPE_DIR_BYTES = 87
PIPE_DIR_WHY = ('NVIDIA\'s control daemon fails silently with a longer pipe directory (no log line, no socket: only '
                'control_lock and log are left), because the names of the sockets it binds there must fit in a unix '
                'socket address (107 bytes)')
CONTROL_SOCKET = 'control'
SHM_DIR = 'shm'
# The daemon's log directory: control.log names every client's pid and uid and every command; root
# only unless asked. Servers never write there themselves (they log through the <pipe>/log FIFO).
DEFAULT_LOG_MODE = 0o700
LOG_MODE_FORM = ('an octal mode string such as "0700" (root only, the default), "0750" (and the directory\'s group) '
                 'or "0755" (everyone): all owner bits, no write or special bits for group and others')
NAME_FORM = ('one or two segments separated by "/", each of letters, digits, ".", "_" and "-", not starting with "."; '
             'not "shm", and no second segment "pipe" or "log"; e.g. "nvidia.com/gpu" or "train"')
# A resource's own entries: a nested name ending in one of them would be another resource's directory.
OWN_ENTRIES = ('pipe', 'log')

_SEGMENT = re.compile(r'[A-Za-z0-9._-]+')
_SYSTEMD_PLAIN = frozenset(string.ascii_letters + string.digits + ':_.')


@dataclass(frozen=True)
class ResourcePaths:
    """Every path that belongs to one resource under a root."""

    root: str
    name: str
    resource_dir: str
    pipe_dir: str
    log_dir: str
    started_file: str
    control_socket: str

    @property
    def shm_dir(self) -> str:
        """``<root>/shm``, the tmpfs daemons with ``shm=true`` and their container clients use as /dev/shm."""
        return os.path.join(self.root, SHM_DIR)

    def client_env(self) -> dict[str, str]:
        """The environment a CUDA client needs to reach this resource's daemon."""
        return {
            'CUDA_MPS_PIPE_DIRECTORY': self.pipe_dir,
            'CUDA_MPS_LOG_DIRECTORY': self.log_dir,
        }


def validate_name(name: object, param: str = 'name') -> str:
    """Return ``name`` if it is a valid resource name, else raise naming ``param``."""
    if not isinstance(name, str) or not name:
        raise InvalidParameterError(param, 'must be a non-empty string: %s' % NAME_FORM)
    segments = name.split('/')
    if len(segments) > 2:
        raise InvalidParameterError(param, '%r has more than one "/": %s' % (name, NAME_FORM))
    for segment in segments:
        if segment in ('', '.', '..') or not _SEGMENT.fullmatch(segment):
            raise InvalidParameterError(param, '%r is not a valid resource name: %s' % (name, NAME_FORM))
        if segment.startswith('.'):
            # <root>/.ready, <root>/<name>/.lock, .started: the collection's own files start with a dot.
            raise InvalidParameterError(param, '%r would collide with the files this collection keeps under the root (.ready, '
                                        '.lock, .started start with "."): %s' % (name, NAME_FORM))
    if segments[0] == SHM_DIR:
        raise InvalidParameterError(param, '%r would put a daemon inside <root>/%s, the shared tmpfs: %s' % (name, SHM_DIR, NAME_FORM))
    if len(segments) == 2 and segments[1] in OWN_ENTRIES:
        raise InvalidParameterError(param, '%r would be the %s directory of a resource named %r (two daemons would share '
                                    'it): %s' % (name, segments[1], segments[0], NAME_FORM))
    return name


def validate_log_mode(value: object, param: str = 'log_mode') -> int:
    """The log directory's mode from an octal string (or the int YAML makes of an unquoted 0750)."""
    if isinstance(value, bool):
        raise InvalidParameterError(param, 'must be %s, got %r' % (LOG_MODE_FORM, value))
    if isinstance(value, int):
        mode = value
    elif isinstance(value, str) and re.fullmatch(r'0?o?[0-7]{3,4}', value):
        mode = int(value.replace('o', ''), 8)
    else:
        raise InvalidParameterError(param, 'must be %s, got %r' % (LOG_MODE_FORM, value))
    if mode & ~0o755 or mode & 0o700 != 0o700:
        raise InvalidParameterError(param, 'must be %s, got %r (%s)' % (LOG_MODE_FORM, value, format(mode, '04o') if mode >= 0 else mode))
    return mode


def validate_root(root: object, param: str = 'root') -> str:
    """Return the normalised absolute root directory, or raise naming ``param``."""
    if not isinstance(root, str) or not root:
        raise InvalidParameterError(param, 'must be a non-empty absolute path')
    if '\0' in root or '\n' in root:
        raise InvalidParameterError(param, 'must not contain NUL or newline characters')
    if not os.path.isabs(root):
        raise InvalidParameterError(param, '%r is not an absolute path' % root)
    normalised = os.path.normpath(root)
    if normalised == '/':
        raise InvalidParameterError(param, 'must not be "/"')
    return normalised


def resource_paths(root: str, name: str, *, check_length: bool = True) -> ResourcePaths:
    """Validate ``root`` and ``name`` and return the resource's paths.

    Fails when the pipe directory is longer than :data:`MAX_PIPE_DIR_BYTES`: the daemon could not bind
    its sockets there, says nothing about it, and every later call would report that no daemon exists.
    ``check_length=False`` is for taking down what an older version accepted (up to 99 bytes).
    """
    root = validate_root(root)
    name = validate_name(name)
    resource_dir = os.path.join(root, name)
    pipe_dir = os.path.join(resource_dir, 'pipe')
    control_socket = os.path.join(pipe_dir, CONTROL_SOCKET)
    if check_length:
        # Blamed on the name where the root alone leaves room for a name of one character, else on the root.
        fits = len(os.path.join(root, 'x', 'pipe').encode('utf-8')) <= MAX_PIPE_DIR_BYTES
        check_pipe_dir_length(pipe_dir, 'name' if fits else 'root')
    return ResourcePaths(
        root=root,
        name=name,
        resource_dir=resource_dir,
        pipe_dir=pipe_dir,
        log_dir=os.path.join(resource_dir, 'log'),
        started_file=os.path.join(resource_dir, '.started'),
        control_socket=control_socket,
    )


def check_pipe_dir_length(pipe_dir: str, param: str, where: str = '') -> None:
    """Refuse a pipe directory longer than :data:`MAX_PIPE_DIR_BYTES`, saying why."""
    length = len(pipe_dir.encode('utf-8'))
    if length > MAX_PIPE_DIR_BYTES:
        raise InvalidParameterError(
            param, 'the pipe directory %s would be %d bytes long%s; it must be at most %d bytes: %s. Use a shorter root '
            'or resource name' % (pipe_dir, length, where, MAX_PIPE_DIR_BYTES, PIPE_DIR_WHY))


DEFAULT_CONTAINER_ROOT = '/mps'
HOST_DEV_SHM = '/dev/shm'


def container_view(paths: ResourcePaths, container_root: object = DEFAULT_CONTAINER_ROOT, *, shm: bool = False,
                   param: str = 'container_root') -> t.Dict[str, t.Any]:
    """What a container client of this resource mounts and sets: the device plugin's ``ContainerRoot`` layout.

    The pipe directory appears at ``<container_root>/<name>/pipe``; ``/dev/shm`` must be the daemon's,
    ``<root>/shm`` when it runs with the shared tmpfs, else the host's own ``/dev/shm``.
    """
    croot = validate_root(container_root, param)
    pipe_dir = os.path.join(croot, paths.name, 'pipe')
    # Clients in the container connect to the sockets the daemon binds in its pipe directory, by their path there.
    check_pipe_dir_length(pipe_dir, param, ' inside the container')
    shm_source = paths.shm_dir if shm else HOST_DEV_SHM
    return {
        'root': croot,
        'pipe_dir': pipe_dir,
        'env': {'CUDA_MPS_PIPE_DIRECTORY': pipe_dir},
        'mounts': [
            {'source': paths.pipe_dir, 'target': pipe_dir},
            {'source': shm_source, 'target': HOST_DEV_SHM},
        ],
    }


def systemd_instance(name: str) -> str:
    """Escape a resource name into a systemd instance name, as ``systemd-escape NAME`` does."""
    out = []
    for index, char in enumerate(name):
        if char == '/':
            out.append('-')
        elif char in _SYSTEMD_PLAIN and not (index == 0 and char == '.'):
            out.append(char)
        else:
            out.extend('\\x%02x' % byte for byte in char.encode('utf-8'))
    return ''.join(out)


@dataclass(frozen=True)
class ConfigPaths:
    """Per-resource files under the persistent config directory (they survive reboots, /run does not)."""

    config_dir: str
    instance: str
    env_file: str
    limits_file: str
    limits_json: str
    # The defaults the daemon is started with (an EnvironmentFile): not named *.env, which is a resource's own.
    limits_env: str
    # A v3 resource's configuration, applied by its daemon once at start (-a), rendered from the resource's entry.
    v3_config: str = ''


def config_paths(config_dir: object, name: str, param: str = 'config_dir') -> ConfigPaths:
    """Validate ``config_dir`` and return the resource's files in it."""
    config_dir = validate_root(config_dir, param)
    instance = systemd_instance(validate_name(name))
    base = os.path.join(config_dir, instance)
    return ConfigPaths(
        config_dir=config_dir,
        instance=instance,
        env_file=base + '.env',
        limits_file=base + '.limits',
        limits_json=base + '.limits.json',
        limits_env=base + '.limits-env',
        v3_config=base + '.mps.toml',
    )


def is_valid_name(name: str) -> bool:
    try:
        validate_name(name)
    except InvalidParameterError:
        return False
    return True


def managed_dirs(paths: ResourcePaths, config_dir: t.Optional[str] = None) -> t.List[t.Tuple[str, str]]:
    """The directories this collection creates or writes for a resource, with the parameter naming each."""
    dirs = [(paths.root, 'root')]
    parent = os.path.dirname(paths.resource_dir)
    if parent != paths.root:
        dirs.append((parent, 'name'))
    dirs += [(paths.resource_dir, 'name'), (paths.pipe_dir, 'name'), (paths.log_dir, 'name')]
    if config_dir:
        dirs.append((config_dir, 'config_dir'))
    return dirs
