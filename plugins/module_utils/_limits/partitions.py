# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Static SM partitions (CUDA 13.1 and later): the option, ``lspart`` read, and the partitions a running daemon gets.

A daemon started with ``-S`` (static partitioning mode, fixed for its life) hands each client exactly the SMs of the
partition it names in ``CUDA_MPS_SM_PARTITION``; ``sm_partition add <uuid> <chunks>`` creates one (its id is the
daemon's, new at every start), ``sm_partition rm <uuid> <id>`` removes one without clients, ``lspart`` lists them.
A resource's ``sm_partitions`` is a list of chunk counts, the partitions each of its GPUs gets: persisted with its
limits, created again after every start, and its daemon started with ``-S``. No I/O here: :func:`decide_partitions`
is a pure function of what was read.

The output of ``lspart`` is known from NVIDIA's documentation and from client code written against real binaries,
which disagree on its columns: :func:`parse_lspart` takes both (a device row ``<uuid> [-] free used freeSM usedSM
[-]``, a partition row ``<uuid> <id> [-] chunks [-] SMs in-use``).
"""

from __future__ import annotations

import re
import typing as t
from dataclasses import dataclass, field

from .._errors import InvalidParameterError
from .._protocol.commands import sm_partition_add, sm_partition_rm

# Chunk counts a resource may list per GPU (a Hopper GPU has 16 to 18 chunks of 8 SMs, a GPU of 4-SM chunks at most 36)
MAX_PARTITIONS = 64
PARTITIONS_FORM = 'a list of partition sizes in chunks (positive integers, for example [8, 4, 4]), created on each GPU of the resource'
_NUMBER = re.compile(r'\d+')


def parse_partitions(value: t.Any, param: str = 'sm_partitions') -> t.Tuple[int, ...]:
    """``sm_partitions`` as a tuple of chunk counts; an empty list is none."""
    if value is None:
        return ()
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, '__iter__'):
        raise InvalidParameterError(param, 'must be %s, got %r' % (PARTITIONS_FORM, value))
    chunks = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int):
            if isinstance(item, str) and item.strip().isascii() and item.strip().isdigit():
                item = int(item.strip())
            else:
                raise InvalidParameterError(param, 'must be %s; %r is not a number of chunks' % (PARTITIONS_FORM, item))
        if item < 1:
            raise InvalidParameterError(param, 'must be %s; %d is not a positive number of chunks' % (PARTITIONS_FORM, item))
        chunks.append(item)
    if len(chunks) > MAX_PARTITIONS:
        raise InvalidParameterError(param, 'at most %d partitions per GPU, got %d' % (MAX_PARTITIONS, len(chunks)))
    return tuple(sorted(chunks, reverse=True))


def check_partition_gpus(chunks: t.Sequence[int], gpus: t.Sequence[t.Any], param: str = 'sm_partitions') -> None:
    """Static SM partitions are for "NVIDIA Ampere architecture and newer GPUs" (NVIDIA MPS documentation): refuse older ones."""
    if not chunks:
        return
    old = [gpu for gpu in gpus if tuple(gpu.compute_capability) < (8, 0)]
    if old:
        raise InvalidParameterError(param, 'static SM partitions need Ampere (compute capability 8.0) or newer; %s %s' % (
            ', '.join('%s (%s, %d.%d)' % ((gpu.label, gpu.name) + tuple(gpu.compute_capability)) for gpu in old),
            'is older' if len(old) == 1 else 'are older'))


@dataclass(frozen=True)
class SmPartition:
    """One partition as ``lspart`` listed it (``device``: the full UUID, resolved from its partial one)."""

    device: str
    ident: str
    chunks: t.Optional[int]
    sms: t.Optional[int]
    in_use: bool

    @property
    def value(self) -> str:
        """What a client sets as ``CUDA_MPS_SM_PARTITION``."""
        return '%s/%s' % (self.device, self.ident)

    def as_dict(self) -> t.Dict[str, t.Any]:
        return {'device': self.device, 'id': self.value, 'chunks': self.chunks, 'sms': self.sms, 'in_use': self.in_use}


@dataclass
class DeviceChunks:
    """A device row of ``lspart``: its free and used chunks and SMs."""

    device: str
    free_chunks: t.Optional[int] = None
    used_chunks: t.Optional[int] = None
    free_sms: t.Optional[int] = None
    used_sms: t.Optional[int] = None
    partitions: t.List[SmPartition] = field(default_factory=list)

    @property
    def total_chunks(self) -> t.Optional[int]:
        if self.free_chunks is None or self.used_chunks is None:
            return None
        return self.free_chunks + self.used_chunks

    def as_dict(self) -> t.Dict[str, t.Any]:
        return {'device': self.device, 'free_chunks': self.free_chunks, 'used_chunks': self.used_chunks,
                'free_sms': self.free_sms, 'used_sms': self.used_sms}


def _numbers(words: t.Sequence[str]) -> t.List[t.Optional[int]]:
    return [int(word) for word in words if _NUMBER.fullmatch(word)]


def parse_lspart(text: str, uuids: t.Sequence[str]) -> t.Optional[t.Dict[str, DeviceChunks]]:
    """``lspart``'s answer by the daemon's device UUIDs (each named there by a unique partial UUID); None when it is not a
    partition table (the error text of a binary or a daemon without static partitioning)."""
    lines = [line.split() for line in text.splitlines() if line.strip()]
    if not lines or lines[0][:2] != ['GPU', 'Partition']:
        return None
    found = {uuid: DeviceChunks(uuid) for uuid in uuids}
    for words in lines[1:]:
        device = next((uuid for uuid in uuids if words and uuid.startswith(words[0])), None)
        if device is None or len(words) < 2:
            continue  # the second header line, or a device that is not the daemon's
        if words[1] == '-' or _NUMBER.fullmatch(words[1]):
            numbers = _numbers(words[1:])
            if len(numbers) >= 4:
                row = found[device]
                row.free_chunks, row.used_chunks, row.free_sms, row.used_sms = numbers[:4]
            continue
        numbers = _numbers(words[2:])
        found[device].partitions.append(SmPartition(
            device, words[1], numbers[0] if numbers else None, numbers[1] if len(numbers) > 1 else None,
            words[-1].lower() in ('yes', 'y', 'true')))
    return found


@dataclass
class PartitionDecision:
    """The commands for a running static daemon, what is kept, and what cannot be done without ending clients."""

    commands: t.List[str] = field(default_factory=list)
    removed: t.List[SmPartition] = field(default_factory=list)
    busy: t.List[SmPartition] = field(default_factory=list)
    too_big: t.List[str] = field(default_factory=list)


def decide_partitions(wanted: t.Sequence[int], seen: t.Mapping[str, DeviceChunks], uuids: t.Sequence[str]) -> PartitionDecision:
    """The ``sm_partition`` commands that give each of ``uuids`` exactly the partitions ``wanted`` (chunk counts).

    A partition of a wanted size is kept (one with clients first); one no longer wanted is removed unless it has
    clients (``busy``: refused by the caller, nothing sent - the daemon refuses it too). Removals come before creations,
    so that their chunks are free; a GPU whose wanted chunks exceed its total (``free + used``) is ``too_big``.
    """
    out = PartitionDecision()
    adds = []
    for uuid in uuids:
        device = seen.get(uuid) or DeviceChunks(uuid)
        missing = list(wanted)
        existing = sorted(device.partitions, key=lambda part: not part.in_use)
        for part in existing:
            if part.chunks in missing:
                missing.remove(part.chunks)
            elif part.in_use:
                out.busy.append(part)
            else:
                out.removed.append(part)
                out.commands.append(sm_partition_rm(uuid, part.ident))
        total = device.total_chunks
        if total is not None and sum(wanted) > total:
            out.too_big.append('%s has %d chunks (%s SMs), %d wanted' % (
                uuid, total, (device.free_sms or 0) + (device.used_sms or 0), sum(wanted)))
        adds.extend(sm_partition_add(uuid, chunks) for chunks in missing)
    out.commands.extend(adds)
    return out


def partitions_view(seen: t.Optional[t.Mapping[str, DeviceChunks]]) -> t.Optional[t.List[t.Dict[str, t.Any]]]:
    """The partitions as facts report them (None: the daemon has no static partitioning, or it was not read)."""
    if seen is None:
        return None
    return [part.as_dict() for device in seen.values() for part in device.partitions]
