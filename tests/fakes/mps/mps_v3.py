# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""MPS v3 (protocol 3) of the simulated control daemon: named servers, namespaces and the TOML file of ``-a``.

INFERRED, not recorded: no real r615+ control binary has been run here. Everything follows NVIDIA's MPS v3 pages as
``shared/mps-v3-reference.md`` quotes them; the section of that reference each behaviour follows is named beside it
(``[ref 1.4]``). Where it says [U] (unknown) the simulator takes a ``FAKE_MPS_V3_*`` switch (README.md). Gated by the
simulated driver: a binary version (NVML's CUDA driver version) below 13040 (CUDA 13.4, r615) knows none of it, so
every recorded r580 answer stays as it is. Legacy (protocol 2) stays the default: ``-p 3``, ``--protocol 3`` or
``CUDA_MPS_PROTOCOL_VERSION=3`` at start selects v3, the variable winning over the option [ref 1.1].

Model. The daemon's ``<pipe>/control`` stays the main socket; every server gets ``<pipe>/<server>/control`` (its
``default`` namespace), ``<pipe>/<server>/default/control``, a ``log`` FIFO, and one ``<pipe>/<server>/<ns>/control``
per namespace [ref 1.9]. A client is routed by the socket it connects to; on the main socket to the automatic
``uid_<uid>`` server [ref 1.9, 4]. Each named server is one ``nvidia-cuda-mps-server`` process (mps_server.py) serving
only its allowed devices; a UUID the host lacks is accepted and that server exits with ``no CUDA-capable device is
detected``, dropping out of ``server list`` [ref 1.3, DYN]. A namespace's limits are its own: not inherited from the
server, not capped by it; without limits a client gets the whole GPU; a client's own
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` / ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` only lower them; an unset
``CUDA_MPS_CLIENT_PRIORITY`` takes the namespace's [ref 1.9, 1.11]. ``server set`` sets the ``default`` namespace
[ref 1.3]. ``namespace set`` (and ``server set``) fail while the namespace has an attached client; ``namespace delete``
and ``server delete`` refuse while clients are attached, unless ``--force`` [ref 1.3, 1.4]. Nothing made by the CLI
outlives the daemon; the ``-a`` file is read once at start [ref 1.8, 1.10].
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import threading
from typing import Any, Optional

# The first binary version with protocol 3: driver r615 = CUDA 13.4 [ref 0]
V3_BINARY_VERSION = 13040
NAME_RE = re.compile(r'[a-z0-9_]{1,64}')  # "lowercase letters, digits, and underscores only, up to 64 characters" [ref 1.2]
MODULES = ('server', 'namespace', 'client', 'device', 'sm-partition', 'feature', 'memacct', 'context-share')
SIMULATED = ('server', 'namespace', 'client')
MEM_RE = re.compile(r'(\d+)([KMG])')
SERVER_FIELDS = ('name', 'uid', 'pid', 'status', 'pipe-directory', 'allowed-devices')
NAMESPACE_FIELDS = ('name', 'server', 'server-status', 'pinned-memory-limit', 'active-thread-percentage', 'client-priority',
                    'pipe-directory')
CLIENT_FIELDS = ('pid', 'server', 'device', 'namespace', 'cmd')  # [I]: the columns are undocumented [ref 1.5]
SERVER_COLUMNS = SERVER_FIELDS + ('context-ids',)
# The 615 schema of the -a file [ref 1.8]: anything else is a configuration error
SERVER_KEYS = {'allowed_devices': str, 'pinned_memory_limit': str, 'active_thread_percentage': str, 'client_priority': str,
               'uid': int, 'locality_domains': bool, 'namespaces': dict, 'devices': list}
NAMESPACE_KEYS = {'pinned_memory_limit': str, 'active_thread_percentage': str, 'client_priority': str}
# The table format truncates (a pid 3165259 printed as 316...) [ref 1.2]: the simulator's column widths [I]
TABLE_WIDTH = 6

# -p 3 -h: the help of a v3 binary. That it lists the modules server and namespace is documented (DYN, [ref 1.1]); the
# option lines follow the documented options [ref 1.2], their layout r580's [I].
HELP_OPTIONS = (
    '  -m,--multiuser           Enable multi-user mode\n'
    '  -p,--protocol <2|3>      Select the MPS protocol version (2 is the default)\n'
    '  -a,--apply <file>        Apply a configuration file at startup (protocol 3)\n'
    '  -q,--quit                Quit and stop the control daemon and all running servers\n'
)
# r580's -q (--ready-devices) is v3's --quit [ref 1.2]: the line it replaces
R580_READY_LINE = '  -q,--ready-devices      Prepare the daemon to query devices on startup\n'
HELP_MODULES = (
    'MODULES (protocol 3): nvidia-cuda-mps-control <module> <verb> [args] [--key=value ...]\n'
    '  server      create | delete | list | set | get\n'
    '  namespace   create | delete | list | set | get\n'
    '  client      list | get | terminate\n'
    '  device      list\n'
    '  sm-partition create | delete | list\n'
    '  feature     enable | disable | describe\n'
    '  memacct     set | describe\n'
    '  context-share\n'
)


def supported(cuda_version: str) -> bool:
    """Whether the simulated binary (its version is NVML's CUDA driver version) speaks protocol 3."""
    return cuda_version.isdigit() and int(cuda_version) >= V3_BINARY_VERSION


def with_help(text: str) -> str:
    """The help text with v3's options and modules (binary 13040 and later)."""
    text = text.replace(R580_READY_LINE, HELP_OPTIONS, 1)
    return text.rstrip('\n') + '\n\n' + HELP_MODULES + '\n'


def parse_argv(words: list[str]) -> tuple[str, str, list[str], dict[str, str], set[str]]:
    """``<module> <verb> [positional-args] [--key=value ...] [--flag ...]`` [ref 1.2]: (module, verb, args, keys, flags).

    ``key=value`` without dashes is accepted as well. (``<module> help`` is documented [ref 1.2] and not simulated.)"""
    module, verb = words[0], (words[1] if len(words) > 1 else '')
    args: list[str] = []
    keys: dict[str, str] = {}
    flags: set[str] = set()
    for word in words[2:]:
        key, sep, value = word.lstrip('-').partition('=')
        if sep and (word.startswith('--') or re.fullmatch(r'[a-z-]+', key)):
            keys[key] = value
        elif word.startswith('--'):
            flags.add(key)
        else:
            args.append(word)
    return module, verb, args, keys, flags


def parse_limit(text: str) -> Optional[int]:
    """``4G`` / ``512M`` / ``1024K`` (binary: 1G = 1024 M) to MiB, rounded up [ref 1.2]; None when invalid."""
    match = MEM_RE.fullmatch(text.strip())
    if not match:
        return None
    value, unit = int(match.group(1)), match.group(2)
    return value * 1024 if unit == 'G' else value if unit == 'M' else -(-value // 1024)


def format_limit(mib: Optional[int]) -> str:
    """A limit as a list prints it (``20G`` [ref 1.4]); ``-`` when there is none [I]."""
    if mib is None:
        return '-'
    return f'{mib // 1024}G' if mib % 1024 == 0 else f'{mib}M'


def parse_pct(text: str) -> Optional[float]:
    """An active thread percentage, 1-100 [ref 1.3]; None when invalid."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 1 <= value <= 100 else None


class V3Error(Exception):
    """A refused v3 command: its message (printed as ``Error: <message>``, exit status 1 [I])."""


class Namespace:  # pylint: disable=too-few-public-methods
    """One namespace of a server: limits of its own (None: none set)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.pct: Optional[float] = None
        self.mem: Optional[int] = None
        self.priority: Optional[int] = None
        self.listeners: list[socket.socket] = []


class Server:  # pylint: disable=too-many-instance-attributes,too-few-public-methods
    """One named server: owner, allowed devices (as given), namespaces and its process (a ServerRec)."""

    def __init__(self, name: str, uid: int, devices: list[str], gpus: list[Any]) -> None:
        self.name = name
        self.uid = uid
        self.devices = devices
        self.gpus = gpus  # the host's GPUs it was allowed and found
        self.namespaces: dict[str, Namespace] = {'default': Namespace('default')}
        self.listeners: list[socket.socket] = []
        self.rec: Any = None
        self.gone = False


class ProtocolThree:
    """The v3 part of the daemon (mixed into mps_daemon.Daemon; uses its lock, log, server processes and clients)."""

    cfg: Any
    lock: Any
    cond: Any
    multiuser: bool
    pending: list

    def v3_init(self) -> None:
        """Called by the daemon's constructor."""
        self.v3: dict[str, Server] = {}

    # ---------------------------------------------------------------- paths and sockets

    def v3_dir(self, *parts: str) -> str:
        return os.path.join(self.cfg.pipe_dir, *parts)

    def _listen(self, path: str, route: tuple[str, str]) -> socket.socket:
        if len(os.fsencode(path)) > 107:  # sun_path [ref 1.9, I]: nothing made
            raise V3Error(f'Failed to bind socket {path}: File name too long')
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.bind(path)
        os.chmod(path, 0o666)
        sock.listen(128)
        threading.Thread(target=self._accept_loop, args=(sock, route), daemon=True).start()
        return sock

    def _accept_loop(self, sock: socket.socket, route: tuple[str, str]) -> None:
        while True:
            try:
                conn = sock.accept()[0]
            except OSError:
                return
            threading.Thread(target=self.handle_conn, args=(conn,), kwargs={'route': route}, daemon=True).start()  # type: ignore[attr-defined]

    @staticmethod
    def _close(socks: list[socket.socket]) -> None:
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        socks.clear()

    # ---------------------------------------------------------------- servers and namespaces

    def _resolve(self, devices: list[str]) -> list[Any]:
        """The host's GPUs among ``devices`` (ordinals or UUIDs); a UUID the host lacks is accepted and matches nothing."""
        found = []
        for token in devices:
            for ordinal, gpu in enumerate(self.cfg.gpus):
                if token == str(ordinal) or token.lower() == gpu.uuid.lower():
                    if gpu not in found:
                        found.append(gpu)
        return found

    def v3_create_server(self, name: str, uid: int, devices: Optional[list[str]]) -> Server:
        """``server create`` (or the -a file): sockets, then the server process (lock held)."""
        if not NAME_RE.fullmatch(name):
            raise V3Error(f"Invalid server name '{name}': use lowercase letters, digits and underscores, at most 64")
        if name in self.v3:
            raise V3Error(f"Server '{name}' already exists")
        if self.multiuser and uid != 0:
            raise V3Error('In multiuser mode, only --uid=0 is allowed')
        given = devices if devices else [gpu.uuid for gpu in self.cfg.gpus]
        server = Server(name, uid, given, self._resolve(given))
        try:
            server.listeners.append(self._listen(self.v3_dir(name, 'control'), (name, 'default')))
            server.listeners.append(self._listen(self.v3_dir(name, 'default', 'control'), (name, 'default')))
            if not os.path.exists(self.v3_dir(name, 'log')):
                os.mkfifo(self.v3_dir(name, 'log'), 0o777)
        except (OSError, V3Error) as exc:  # nothing of it stays: sockets closed, its directory gone
            self._close(server.listeners)
            shutil.rmtree(self.v3_dir(name), ignore_errors=True)
            raise exc if isinstance(exc, V3Error) else V3Error(f'Failed to set up server {name}: {exc.strerror or exc}')
        self.v3[name] = server
        rec = self._spawn_server(uid)  # type: ignore[attr-defined]
        rec.v3 = server
        server.rec = rec
        self.log(f"Server '{name}' created for user {uid}")  # type: ignore[attr-defined]
        return server

    def v3_server_exited(self, rec: Any) -> None:
        """A named server's process ended: it drops out of the lists, its sockets go (lock held) [ref 1.3, DYN]."""
        server = rec.v3
        if self.v3.get(server.name) is server:
            self._remove_server(server)

    def _remove_server(self, server: Server) -> None:
        server.gone = True
        self.v3.pop(server.name, None)
        for namespace in server.namespaces.values():
            self._close(namespace.listeners)
        self._close(server.listeners)
        shutil.rmtree(self.v3_dir(server.name), ignore_errors=True)

    def _server_named(self, name: str) -> Server:
        server = self.v3.get(name)
        if server is None:
            raise V3Error(f"Server '{name}' not found")
        return server

    def _owner(self, server: Server, uid: int, verb: str) -> None:
        if uid not in (0, server.uid):  # [ref 1.4, O]
            raise V3Error(f"Insufficient privileges for UID {uid}. '{verb}' requires server owner.")

    def v3_create_namespace(self, server: Server, name: str) -> Namespace:
        if not NAME_RE.fullmatch(name):
            raise V3Error(f"Invalid namespace name '{name}': use lowercase letters, digits and underscores, at most 64")
        if name in server.namespaces:
            raise V3Error(f"Namespace '{name}' already exists on server '{server.name}'")
        namespace = Namespace(name)
        namespace.listeners.append(self._listen(self.v3_dir(server.name, name, 'control'), (server.name, name)))
        server.namespaces[name] = namespace
        return namespace

    def _attached(self, server: Server, namespace: Optional[str] = None, *, pending: bool = False) -> list[Any]:
        """The clients attached to the server (of ``namespace``); with ``pending`` those still waiting for it too, which
        a set or delete must count as well (a server still starting has only those)."""
        rec = server.rec
        clients = list(rec.clients) if rec is not None and not rec.exited else []
        if pending and rec is not None:
            clients += [c for c in self.pending if c.server is rec]
        return [c for c in clients if namespace is None or c.v3_route[1] == namespace]

    @staticmethod
    def _set_limits(namespace: Namespace, keys: dict[str, str]) -> None:
        """The limits of ``--key=value`` (or the file's keys with underscores), checked before any is set."""
        wanted: dict[str, Any] = {}
        for key, value in keys.items():
            key = key.replace('_', '-')
            if key == 'active-thread-percentage':
                wanted['pct'] = parse_pct(value)
            elif key == 'pinned-memory-limit':
                wanted['mem'] = parse_limit(value)
            elif key == 'client-priority':
                wanted['priority'] = int(value) if value in ('0', '1') else None
            else:
                raise V3Error(f"Unknown option '--{key}'")
            if wanted[list(wanted)[-1]] is None:
                raise V3Error(f"Invalid value '{value}' for {key}")
        for attr, value in wanted.items():
            setattr(namespace, attr, value)

    # ---------------------------------------------------------------- the -a file [ref 1.8]

    def v3_apply(self, path: str) -> Optional[str]:
        """Read the TOML file once; None, or why the start ends (FAKE_MPS_V3_CONFIG_ERROR=abort) [I].

        Under ``skip`` a server table with any error is left out whole (logged), so that no server runs with part of
        its limits; the other servers are made."""
        import tomllib  # pylint: disable=import-outside-toplevel
        try:
            with open(path, 'rb') as handle:
                data = tomllib.load(handle)
        except OSError as exc:
            return f'Failed to read configuration file {path}: {exc.strerror}'
        except tomllib.TOMLDecodeError as exc:
            return f'Failed to parse configuration file {path}: {exc}'
        errors = list(self._check_top(data))
        servers = data.get('servers') if isinstance(data.get('servers'), dict) else {}
        bad = {}
        for name, table in servers.items():
            found = self._check_server(name, table)
            if found:
                bad[name] = found
                errors += found
        if errors and self.cfg.v3_config_error == 'abort':
            return f'Configuration error in {path}: ' + '; '.join(errors)
        for message in errors:
            self.log(f'Configuration error in {path}: {message} (skipped)')  # type: ignore[attr-defined]
        for name, table in servers.items():
            if name in bad:
                continue
            try:
                devices = [d.strip() for d in str(table.get('allowed_devices', '')).split(',') if d.strip()]
                server = self.v3_create_server(name, int(table.get('uid', os.geteuid())), devices or None)
                self._set_limits(server.namespaces['default'], {k: str(v) for k, v in table.items() if k in NAMESPACE_KEYS})
                for ns_name, ns_table in (table.get('namespaces') or {}).items():
                    namespace = server.namespaces.get(ns_name) or self.v3_create_namespace(server, ns_name)
                    self._set_limits(namespace, {k: str(v) for k, v in ns_table.items()})
            except V3Error as exc:
                if self.cfg.v3_config_error == 'abort':
                    return f'Configuration error in {path}: servers.{name}: {exc}'
                self.log(f'Configuration error in {path}: servers.{name}: {exc} (skipped)')  # type: ignore[attr-defined]
        return None

    @staticmethod
    def _check_top(data: dict) -> list[str]:
        errors = [f'unknown key {key!r}' for key in data if key not in ('schema_version', 'servers', 'features')]
        if not isinstance(data.get('schema_version', '1.0'), str):
            errors.append('schema_version: expected a string')
        if not isinstance(data.get('servers', {}), dict):
            errors.append('servers: expected a table')
        features = data.get('features', {})
        allowed = {'memacct': {'enabled': bool, 'audit_log': bool}, 'context-share': {'enabled': bool, 'default_socket': str}}
        if not isinstance(features, dict):
            errors.append('features: expected a table')
            features = {}
        for feature, table in features.items():
            keys = allowed.get(feature)
            if keys is None or not isinstance(table, dict):
                errors.append(f'features.{feature}: ' + ('unknown feature' if keys is None else 'expected a table'))
                continue
            errors += [f'features.{feature}.{key}: ' + ('unknown key' if key not in keys else f'expected {keys[key].__name__}')
                       for key, value in table.items() if key not in keys or not isinstance(value, keys[key])]
        return errors

    def _check_value(self, where: str, key: str, value: Any) -> Optional[str]:
        """A limit key's value: a string as documented (an int where a string is quoted: FAKE_MPS_V3_CONFIG_INTS) [ref 1.8]."""
        if isinstance(value, int) and not isinstance(value, bool) and self.cfg.v3_config_ints == 'accept':
            value = str(value)
        if not isinstance(value, str):
            return f'{where}.{key}: expected a string'
        try:
            self._set_limits(Namespace('check'), {key: value})
        except V3Error as exc:
            return f'{where}.{key}: {exc}'
        return None

    def _check_server(self, name: str, table: Any) -> list[str]:
        """What is wrong with one ``[servers.<name>]`` table (the 615 schema: "any other key is a configuration error")."""
        where = f'servers.{name}'
        if not isinstance(table, dict):
            return [f'{where}: expected a table']
        errors = [] if NAME_RE.fullmatch(name) else [f'{where}: a name of lowercase letters, digits and underscores, at most 64']
        for key, value in table.items():
            kind = SERVER_KEYS.get(key)
            if kind is None:
                errors.append(f'{where}.{key}: unknown key')
            elif key in NAMESPACE_KEYS:
                errors += [e for e in [self._check_value(where, key, value)] if e]
            elif not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                errors.append(f'{where}.{key}: expected {kind.__name__}')
        namespaces = table.get('namespaces', {})
        for ns_name, ns_table in (namespaces.items() if isinstance(namespaces, dict) else ()):
            if not isinstance(ns_table, dict):
                errors.append(f'{where}.namespaces.{ns_name}: expected a table')
                continue
            if not NAME_RE.fullmatch(ns_name):
                errors.append(f'{where}.namespaces.{ns_name}: a name of lowercase letters, digits and underscores, at most 64')
            for key, value in ns_table.items():
                if key not in NAMESPACE_KEYS:
                    errors.append(f'{where}.namespaces.{ns_name}.{key}: unknown key')
                else:
                    errors += [e for e in [self._check_value(f'{where}.namespaces.{ns_name}', key, value)] if e]
        for index, device in enumerate(table.get('devices', []) if isinstance(table.get('devices'), list) else []):
            if not isinstance(device, dict) or not isinstance(device.get('uuid'), str):
                errors.append(f'{where}.devices[{index}]: a table with a uuid is required')
                continue
            for part in device.get('sm_partitions', []) if isinstance(device.get('sm_partitions'), list) else [None]:
                if not (isinstance(part, dict) and isinstance(part.get('name'), str) and isinstance(part.get('chunks'), int)
                        and isinstance(part.get('include_remainder', False), bool)):
                    errors.append(f'{where}.devices[{index}].sm_partitions: each needs a name and chunks (int)')
        return errors

    # ---------------------------------------------------------------- commands

    def v3_execute(self, words: list[str], uid: int) -> tuple[int, str]:
        """One argv command (lock held): (exit status, stdout)."""
        if not words:
            return 1, 'Error: no module given'
        module, verb, args, keys, flags = parse_argv(words)
        if module not in MODULES:
            return 1, f"Error: unknown module '{module}'"
        if module not in SIMULATED:
            return 1, f"Error: the simulator does not simulate the module '{module}'"
        try:
            handler = getattr(self, f'_v3_{module}_{verb}', None)
            if handler is None:
                raise V3Error(f"unknown verb '{verb}' for module '{module}'")
            return 0, handler(args, keys, flags, uid) or ''
        except V3Error as exc:
            return 1, f'Error: {exc}'

    def _format(self, keys: dict[str, str], header: tuple[str, ...], rows: list[list[str]]) -> str:
        fmt = keys.get('format', 'table').split(',')
        if fmt[0] not in ('table', 'csv') or any(f != 'noheader' for f in fmt[1:]):
            raise V3Error(f"Invalid format '{keys.get('format')}': expected table or csv, with ,noheader")
        lines = []
        if fmt[0] == 'csv':
            quote = self.cfg.v3_list_quote
            if 'noheader' not in fmt:
                lines.append(','.join(header))
            for row in rows:
                lines.append(','.join(f'"{cell}"' if ',' in cell and quote == 'quoted' else cell.replace(',', ';') if ',' in cell else cell
                                      for cell in row))
        else:  # the table truncates [ref 1.2]: never parsed by the collection
            if 'noheader' not in fmt:
                lines.append(' '.join(h.upper().replace('-', ' ') for h in header))
            for row in rows:
                lines.append(' '.join(cell if len(cell) <= TABLE_WIDTH or not cell.isdigit() else cell[:3] + '...' for cell in row))
        return '\n'.join(lines)

    def _server_row(self, server: Server) -> list[str]:
        rec = server.rec
        status = 'Ready' if rec is not None and rec.state == 'ACTIVE' else 'Starting'
        contexts = ';'.join(str(c.context_id) for c in self._attached(server)) or '-'
        return [server.name, str(server.uid), str(rec.pid if rec is not None else '-'), status, self.v3_dir(server.name),
                ','.join(server.devices), contexts]

    def _v3_server_create(self, args: list[str], keys: dict[str, str], _flags: set[str], uid: int) -> str:
        if len(args) > 1 or (not args and 'uid' not in keys):
            raise V3Error('usage: server create <name> [--uid=<n>] [--allowed-devices=<devices>]')
        owner = uid
        if 'uid' in keys:
            if not keys['uid'].isdigit():
                raise V3Error(f"Invalid uid '{keys['uid']}'")
            owner = int(keys['uid'])
        name = args[0] if args else f'uid_{owner}'
        devices = [d.strip() for d in keys.get('allowed-devices', '').split(',') if d.strip()]
        server = self.v3_create_server(name, owner, devices or None)
        return f"Server '{server.name}' created"  # [I]

    def _v3_server_delete(self, args: list[str], _keys: dict[str, str], flags: set[str], uid: int) -> str:
        if len(args) != 1:
            raise V3Error('usage: server delete <name> [--force]')
        server = self._server_named(args[0])
        self._owner(server, uid, 'SERVER DELETE')
        attached = self._attached(server, pending=True)
        if attached and 'force' not in flags:
            raise V3Error(f"Server '{server.name}' has {len(attached)} active client(s); use --force")
        for client in attached:
            self._drop_client(client, 'CUDA_ERROR_MPS_CLIENT_TERMINATED', 'the MPS server was deleted')  # type: ignore[attr-defined]
        rec = server.rec
        self._remove_server(server)
        if rec is not None and not rec.exited:
            rec.draining = True
            self._send_shutdown(rec)  # type: ignore[attr-defined]
        return f"Server '{server.name}' deleted"  # [I]

    def _v3_server_list(self, args: list[str], keys: dict[str, str], _flags: set[str], _uid: int) -> str:
        servers = [s for s in self.v3.values() if not args or s.name == args[0]]
        if args and not servers:
            raise V3Error(f"Server '{args[0]}' not found")
        return self._format(keys, SERVER_COLUMNS, [self._server_row(s) for s in servers])

    def _v3_server_get(self, args: list[str], _keys: dict[str, str], _flags: set[str], _uid: int) -> str:
        if len(args) != 2:
            raise V3Error('usage: server get <name> <field>')
        server = self._server_named(args[0])
        field = self._field(args[1], SERVER_FIELDS)
        return self._server_row(server)[SERVER_FIELDS.index(field)]

    def _v3_server_set(self, args: list[str], keys: dict[str, str], _flags: set[str], uid: int) -> str:
        if len(args) != 1 or not keys:
            raise V3Error('usage: server set <name> --key=value ... (at least one)')
        server = self._server_named(args[0])
        self._owner(server, uid, 'SERVER SET')
        unknown = sorted(set(keys) - {'pinned-memory-limit', 'active-thread-percentage', 'client-priority', 'uid', 'locality-domains'})
        if unknown:
            raise V3Error(f"Unknown option '--{unknown[0]}' for server set")
        if keys.get('locality-domains', 'false') not in ('true', 'false') or not keys.get('uid', '0').isdigit():
            raise V3Error('Invalid value for --uid or --locality-domains')
        if 'uid' in keys:
            if self.multiuser and keys['uid'] != '0':
                raise V3Error('In multiuser mode, only --uid=0 is allowed')
            server.uid = int(keys['uid'])
        keys = {k: v for k, v in keys.items() if k not in ('uid', 'locality-domains')}
        if not keys:
            return ''
        if self._attached(server, 'default', pending=True):
            raise V3Error(f"Namespace 'default' of server '{server.name}' has active clients")
        self._set_limits(server.namespaces['default'], keys)
        return ''

    def _field(self, text: str, fields: tuple[str, ...]) -> str:
        """A field name in the spelling the binary takes (FAKE_MPS_V3_FIELD_SPELLING) [ref 1.4: pipe-directory or pipe_directory, U]."""
        spelling = self.cfg.v3_field_spelling
        wanted = text if spelling == 'dash' else text.replace('_', '-') if '-' not in text else ''
        if wanted not in fields:
            raise V3Error(f"Unknown field '{text}'")
        return wanted

    def _ns_args(self, args: list[str], keys: dict[str, str], usage: str) -> tuple[Server, str]:
        if len(args) != 1 or 'server' not in keys:
            raise V3Error(f'usage: {usage}')
        return self._server_named(keys['server']), args[0]

    def _v3_namespace_create(self, args: list[str], keys: dict[str, str], _flags: set[str], uid: int) -> str:
        server, name = self._ns_args(args, keys, 'namespace create <name> --server=<s>')
        self._owner(server, uid, 'NAMESPACE CREATE')
        self.v3_create_namespace(server, name)
        return f"Namespace '{name}' created on server '{server.name}'"  # [I]

    def _v3_namespace_delete(self, args: list[str], keys: dict[str, str], flags: set[str], uid: int) -> str:
        server, name = self._ns_args(args, keys, 'namespace delete <name> --server=<s> [--force]')
        self._owner(server, uid, 'NAMESPACE DELETE')
        namespace = server.namespaces.get(name)
        if namespace is None or name == 'default':
            raise V3Error(f"Namespace '{name}' not found on server '{server.name}'" if namespace is None else
                          "The default namespace cannot be deleted")
        attached = self._attached(server, name, pending=True)
        if attached and 'force' not in flags:
            raise V3Error(f"Namespace '{name}' has {len(attached)} active client(s); use --force")
        for client in attached:
            self._drop_client(client, 'CUDA_ERROR_MPS_CLIENT_TERMINATED', 'its MPS namespace was deleted')  # type: ignore[attr-defined]
        self._close(namespace.listeners)
        server.namespaces.pop(name)
        shutil.rmtree(self.v3_dir(server.name, name), ignore_errors=True)
        return f"Namespace '{name}' deleted from server '{server.name}'"  # [I]

    def _v3_namespace_set(self, args: list[str], keys: dict[str, str], _flags: set[str], uid: int) -> str:
        server, name = self._ns_args(args, keys, 'namespace set <name> --server=<s> --key=value ...')
        self._owner(server, uid, 'NAMESPACE SET')
        namespace = server.namespaces.get(name)
        if namespace is None:
            raise V3Error(f"Namespace '{name}' not found on server '{server.name}'")
        limits = {k: v for k, v in keys.items() if k != 'server'}
        if not limits:
            raise V3Error('namespace set needs at least one of --pinned-memory-limit, --active-thread-percentage, --client-priority')
        if self._attached(server, name, pending=True):  # "fails while the namespace has an active client" [ref 1.4, O]
            raise V3Error(f"Namespace '{name}' has active clients: set its limits before clients start")
        self._set_limits(namespace, limits)
        return ''

    def _namespace_row(self, server: Server, namespace: Namespace) -> list[str]:
        rec = server.rec
        return [namespace.name, server.name, 'Ready' if rec is not None and rec.state == 'ACTIVE' else 'Starting',
                format_limit(namespace.mem), '-' if namespace.pct is None else f'{namespace.pct:.2f}',
                '-' if namespace.priority is None else str(namespace.priority), self.v3_dir(server.name, namespace.name)]

    def _v3_namespace_list(self, args: list[str], keys: dict[str, str], _flags: set[str], _uid: int) -> str:
        servers = [self._server_named(keys['server'])] if 'server' in keys else list(self.v3.values())
        rows = [self._namespace_row(s, n) for s in servers for n in s.namespaces.values() if not args or n.name == args[0]]
        return self._format(keys, NAMESPACE_FIELDS, rows)

    def _v3_namespace_get(self, args: list[str], _keys: dict[str, str], _flags: set[str], _uid: int) -> str:
        if len(args) != 3:  # the server is positional here [ref 1.4]
            raise V3Error('usage: namespace get <name> <server> <field>')
        server = self._server_named(args[1])
        namespace = server.namespaces.get(args[0])
        if namespace is None:
            raise V3Error(f"Namespace '{args[0]}' not found on server '{server.name}'")
        return self._namespace_row(server, namespace)[NAMESPACE_FIELDS.index(self._field(args[2], NAMESPACE_FIELDS))]

    def _v3_client_list(self, _args: list[str], keys: dict[str, str], _flags: set[str], _uid: int) -> str:
        servers = [self._server_named(keys['server'])] if 'server' in keys else list(self.v3.values())
        rows = [[str(c.pid), s.name, ';'.join(str(d) for d in c.devices), c.v3_route[1], c.cmdline]
                for s in servers for c in self._attached(s)]
        return self._format(keys, CLIENT_FIELDS, rows)

    def _v3_client_terminate(self, args: list[str], _keys: dict[str, str], _flags: set[str], uid: int) -> str:
        if len(args) != 1:
            raise V3Error('usage: client terminate <pid>')
        for server in self.v3.values():
            for client in self._attached(server):
                if str(client.pid) == args[0]:
                    self._owner(server, uid, 'CLIENT TERMINATE')
                    self._drop_client(client, 'CUDA_ERROR_MPS_CLIENT_TERMINATED', 'terminated', scope='client')  # type: ignore[attr-defined]
                    return ''
        raise V3Error(f"Client '{args[0]}' not found")

    # ---------------------------------------------------------------- clients [ref 1.9, 1.11]

    def v3_route(self, route: Optional[tuple[str, str]], uid: int) -> tuple[Optional[Server], str, Optional[str]]:
        """(server, namespace, why not) for a client on ``route`` (None: the main socket, routed by uid)."""
        if route is None:
            name = f'uid_{uid}'
            server = self.v3.get(name)
            if server is None:
                try:
                    server = self.v3_create_server(name, 0 if self.multiuser else uid, None)
                except V3Error as exc:
                    return None, 'default', str(exc)
            return server, 'default', None
        server = self.v3.get(route[0])
        if server is None or route[1] not in server.namespaces:
            return None, route[1], 'its MPS server or namespace is gone'
        if not self.multiuser and uid not in (server.uid,):
            return None, route[1], 'operation not permitted'  # CUDA_ERROR_NOT_PERMITTED [ref 1.11, DYN]
        return server, route[1], None

    @staticmethod
    def v3_limits(server: Server, namespace: str, client: Any, env_priority: Optional[str]) -> None:
        """The client's effective limits: its namespace's, lowered by its own variables."""
        ns = server.namespaces[namespace]
        ceiling = 100.0 if ns.pct is None else ns.pct
        client.pct = ceiling if client.env_pct is None else min(ceiling, client.env_pct)
        client.mem = {}
        for ordinal in client.devices:
            limits = [v for v in (ns.mem, client.env_mem.get(ordinal)) if v]
            client.mem[ordinal] = min(limits) if limits else None
        client.priority = int(env_priority) if env_priority in ('0', '1') else (ns.priority or 0)

    def v3_state(self) -> list[dict]:
        """The sim_state view of the named servers."""
        return [{'name': s.name, 'uid': s.uid, 'pid': s.rec.pid if s.rec is not None else None, 'devices': s.devices,
                 'gpus': [g.uuid for g in s.gpus],
                 'namespaces': {n.name: {'active_thread_percentage': n.pct, 'pinned_mem_limit_mib': n.mem, 'client_priority': n.priority}
                                for n in s.namespaces.values()},
                 'clients': [{'pid': c.pid, 'namespace': c.v3_route[1], 'active_thread_percentage': c.pct,
                              'pinned_mem_limit_mib': {str(k): v for k, v in c.mem.items()}, 'client_priority': c.priority}
                             for c in self._attached(s)]}
                for s in self.v3.values()]
