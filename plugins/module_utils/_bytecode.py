# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's module_utils compiled once per host, not on every module execution (issue 42).

AnsiballZ ships a module's code as source in a zip that it writes anew for every run, and Python 3.11's zipimporter
compiles each file as soon as its spec is asked for: on a no-op of mps_host, compiling the collection's module_utils
was about a quarter of the module's process (``bench/payload_phases.py``). :func:`install`, called by a module before
it imports its module_utils, puts a finder in front of the payload's zip for them: each module's code object is taken
from ``<root>/.bytecode/``, keyed by the SHA-256 of its source and the interpreter's magic number, and compiled (and
stored) only on a miss.

What keeps it safe and invisible:

- the directory must be a real directory (not a link) owned by root with mode 0700, an entry a regular file owned by
  root that no one else may read or write; anything else is not used (the module runs its shipped source, and says
  why in a warning);
- an entry holds the SHA-256 of its marshalled code: a truncated or altered one is a miss, compiled from the source and
  written anew;
- an entry of another source (an upgraded collection) is another key; storing one removes the module's older entries,
  so the cache holds one entry per module;
- nothing is written in check mode or by ``state=absent`` (which removes the directory), nor when the root does not
  exist yet (the first converge makes it; the next run fills the cache); a run that is not root's neither reads nor
  writes it (a directory it made would be refused by every later run as root, with a warning each time);
- any failure of the cache itself (an unreadable zip, a full disk) is a miss: the module imports its source as it
  would without it. It never changes what a module does, and writing it is no change of the host (``changed``).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import marshal
import os
import re
import stat
import sys
import typing as t
import zipimport

CACHE_DIR = '.bytecode'
PACKAGE = 'ansible_collections.gpufleet.mps.plugins.module_utils.'
HEADER = b'gpufleet-mps-bytecode-1\n'
# The default of the modules' root option (_resource.layout.DEFAULT_ROOT, checked equal by a unit test): the cache is
# set up before any of the collection's modules may be imported.
DEFAULT_ROOT = '/run/nvidia/mps'
# The modules that use the cache (AnsiballZ's name of the running module): mps_host, the fleet's one task per host.
USERS = ('gpufleet.mps.mps_host',)
# Why the cache was not used, for the module's warnings ('' when it was, or when there was nothing to use).
STATUS: t.Dict[str, str] = {'refused': ''}


def _module_args() -> t.Dict[str, t.Any]:
    """The module's arguments as AnsiballZ handed them to ansible-core (before AnsibleModule parses them)."""
    basic = sys.modules.get('ansible.module_utils.basic')
    raw = getattr(basic, '_ANSIBLE_ARGS', None)
    if not raw:
        return {}
    args = json.loads(raw).get('ANSIBLE_MODULE_ARGS', {})
    return args if isinstance(args, dict) else {}


def install() -> None:
    """Put the cache's finder in front of the payload's zip, for the collection's module_utils; a no-op where the
    module does not run from an AnsiballZ payload, or its root is not an absolute path, or it is in place already.
    Importing this module calls it (see the end): a module imports it before its other module_utils."""
    if any(isinstance(finder, Finder) for finder in sys.meta_path):
        return
    try:
        payload = next((entry for entry in sys.path if entry.endswith('_payload.zip') and os.path.isfile(entry)), None)
        if payload is None:
            return
        args = _module_args()
        if args.get('_ansible_module_name') not in USERS:
            return  # another module that imports this one for its names (mps_daemon's removal): no cache there
        root = args.get('root') or DEFAULT_ROOT
        if not isinstance(root, str) or not os.path.isabs(root):
            return
        if args.get('state', 'present') == 'absent':
            return  # a teardown removes the cache: it neither reads nor writes it
        if os.geteuid() != 0:
            return  # only root's: a directory another user made would be refused by every later run as root
        cache = Cache(os.path.join(os.path.normpath(root), CACHE_DIR), write=not args.get('_ansible_check_mode', False))
        sys.meta_path.insert(0, Finder(payload, cache))
    except Exception:  # pylint: disable=broad-except
        return  # the shipped source, as without a cache


# An entry's name: the module's name under module_utils, '-', the key; a write in progress ends .<pid>.tmp.
ENTRY = re.compile(r'[A-Za-z0-9_.]+-[0-9a-f]{64}(\.[0-9]+\.tmp)?')


def remove_bytecode(path: str) -> None:
    """The cache's entries, then its directory - nothing else: a link or a file of that name is not opened, an entry
    not of the cache's form is left (and the directory with it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        for name in os.listdir(fd):
            if ENTRY.fullmatch(name):
                os.unlink(name, dir_fd=fd)
    finally:
        os.close(fd)
    try:
        os.rmdir(path)
    except OSError:
        pass


class Cache:
    """``<root>/.bytecode``: code objects by key, read and written through one file descriptor of the checked directory."""

    def __init__(self, path: str, *, write: bool) -> None:
        self.path = path
        self.write = write
        self._fd: t.Optional[int] = None
        self._opened = False

    def _dir(self) -> t.Optional[int]:
        if self._opened:
            return self._fd
        self._opened = True
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except FileNotFoundError:
            if not self.write or not os.path.isdir(os.path.dirname(self.path)):
                return None
            try:
                os.mkdir(self.path, 0o700)
                fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            except OSError:
                return None
        except OSError as exc:
            STATUS['refused'] = '%s cannot be opened as a directory (%s)' % (self.path, exc.strerror)
            return None
        info = os.fstat(fd)
        if info.st_uid != 0 or stat.S_IMODE(info.st_mode) != 0o700:  # install() runs it for root only
            os.close(fd)
            STATUS['refused'] = '%s is not a directory of root with mode 0700 (owner uid %d, mode %04o)' % (
                self.path, info.st_uid, stat.S_IMODE(info.st_mode))
            return None
        self._fd = fd
        return fd

    def load(self, name: str, key: str) -> t.Optional[t.Any]:
        """The code object stored for ``name`` under ``key``; None for a miss (absent, not ours, truncated, altered)."""
        fd = self._dir()
        if fd is None:
            return None
        try:
            entry = os.open('%s-%s' % (name, key), os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
        except OSError:
            return None
        try:
            info = os.fstat(entry)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != 0 or stat.S_IMODE(info.st_mode) & 0o077:
                return None
            with os.fdopen(entry, 'rb', closefd=False) as handle:
                blob = handle.read()
        finally:
            os.close(entry)
        head = len(HEADER) + 32
        if not blob.startswith(HEADER) or hashlib.sha256(blob[head:]).digest() != blob[len(HEADER):head]:
            return None
        try:
            return marshal.loads(blob[head:])
        except (EOFError, ValueError, TypeError):
            return None

    def store(self, name: str, key: str, code: t.Any) -> None:
        """Write ``code`` for ``name`` under ``key`` (atomically, mode 0600) and remove the module's other entries."""
        if not self.write:
            return
        fd = self._dir()
        if fd is None:
            return
        data = marshal.dumps(code)
        final = '%s-%s' % (name, key)
        temp = '%s.%d.tmp' % (final, os.getpid())
        try:
            entry = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=fd)
            with os.fdopen(entry, 'wb') as handle:
                handle.write(HEADER + hashlib.sha256(data).digest() + data)
            os.replace(temp, final, src_dir_fd=fd, dst_dir_fd=fd)
            for other in os.listdir(fd):
                if other.startswith(name + '-') and other != final and len(other) == len(final):
                    os.unlink(other, dir_fd=fd)
        except OSError:
            try:
                os.unlink(temp, dir_fd=fd)
            except OSError:
                pass


class Loader:
    """A payload module's loader: its code from the cache, else compiled from the zip's source (and stored)."""

    def __init__(self, real: zipimport.zipimporter, fullname: str, cache: Cache) -> None:
        self.real = real
        self.fullname = fullname
        self.cache = cache

    def create_module(self, spec: t.Any) -> None:  # pylint: disable=unused-argument
        return None

    def exec_module(self, module: t.Any) -> None:
        source = self.real.get_source(self.fullname)
        name = self.fullname[len(PACKAGE):]
        key = hashlib.sha256(importlib.util.MAGIC_NUMBER + source.encode('utf-8')).hexdigest()
        code = self.cache.load(name, key)
        if code is None:
            code = compile(source, module.__file__, 'exec', dont_inherit=True)
            self.cache.store(name, key, code)
        exec(code, module.__dict__)  # pylint: disable=exec-used

    def __getattr__(self, name: str) -> t.Any:
        # get_source, get_data, is_package, ...: the zip's own answers (tracebacks read the source through them)
        return getattr(self.real, name)


class Finder:
    """The collection's module_utils in the payload's zip, with specs built from the zip's listing: asking Python
    3.11's zipimporter for a spec compiles the module."""

    def __init__(self, payload: str, cache: Cache) -> None:
        self.payload = payload
        self.cache = cache
        self._importers: t.Dict[str, zipimport.zipimporter] = {}

    def find_spec(self, fullname: str, path: t.Any = None, target: t.Any = None) -> t.Optional[t.Any]:  # pylint: disable=unused-argument
        if not fullname.startswith(PACKAGE):
            return None
        try:
            # a zipimporter answers for one directory of the zip, by a name's last component
            where = os.path.join(self.payload, fullname.rpartition('.')[0].replace('.', '/'))
            if where not in self._importers:
                self._importers[where] = zipimport.zipimporter(where)
            real = self._importers[where]
            package = real.is_package(fullname)
        except (zipimport.ZipImportError, OSError):
            return None  # not a file of the payload: the normal machinery answers
        relative = fullname.replace('.', '/') + ('/__init__.py' if package else '.py')
        spec = importlib.machinery.ModuleSpec(fullname, Loader(real, fullname, self.cache),
                                              origin=os.path.join(self.payload, relative), is_package=package)
        if package:
            spec.submodule_search_locations = [os.path.join(self.payload, fullname.replace('.', '/'))]
        spec.has_location = True
        return spec


# A module imports this first of its module_utils: the others are then imported through the cache.
install()
